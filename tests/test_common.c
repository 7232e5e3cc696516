/* common: half conversions, cursor, number parsing, atomic writer. */
#include "tests/testutil.h"

#include "formats/common.h"

#include <linux/magic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <sys/vfs.h>

static void test_f16_roundtrip(void **state)
{
    (void)state;
    /* every finite half converts to f32 and back unchanged */
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7c00) == 0x7c00)
            continue;
        float f = pi2_f16_to_f32((uint16_t)h);
        assert_int_equal(pi2_f32_to_f16(f), h);
    }
    assert_true(pi2_f16_to_f32(0x3c00) == 1.0f);
    assert_true(pi2_f16_to_f32(0xc000) == -2.0f);
    assert_true(pi2_f16_to_f32(0x0001) == 5.9604644775390625e-8f);
    assert_true(isinf(pi2_f16_to_f32(0x7c00)));
    assert_true(isnan(pi2_f16_to_f32(0x7e00)));
    assert_int_equal(pi2_f32_to_f16(1e6f), 0x7c00);     /* overflow -> inf */
    assert_int_equal(pi2_f32_to_f16(65519.0f), 0x7bff); /* largest below the rounding edge */
    assert_int_equal(pi2_f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(pi2_f32_to_f16(1.0f + 1.0f / 2048), 0x3c00); /* tie to even */
    assert_int_equal(pi2_f32_to_f16(1.0f + 3.0f / 2048), 0x3c02);
}

static void test_bf16(void **state)
{
    (void)state;
    assert_int_equal(pi2_f32_to_bf16(1.0f), 0x3f80);
    assert_true(pi2_bf16_to_f32(0x3f80) == 1.0f);
    /* 1 + 2^-8 is a tie: rounds to even (1.0); 1 + 3*2^-8 rounds up */
    assert_int_equal(pi2_f32_to_bf16(1.0f + 1.0f / 256), 0x3f80);
    assert_int_equal(pi2_f32_to_bf16(1.0f + 3.0f / 256), 0x3f82);
    assert_true(isnan(pi2_bf16_to_f32(pi2_f32_to_bf16(NAN))));
    for (uint32_t b = 0; b < 65536; b++) {
        if ((b & 0x7f80) == 0x7f80)
            continue;
        assert_int_equal(pi2_f32_to_bf16(pi2_bf16_to_f32((uint16_t)b)), b);
    }
}

static void test_cursor(void **state)
{
    (void)state;
    uint8_t buf[12] = {1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0};
    pi2_cursor c = {buf, sizeof buf};
    uint32_t a;
    uint64_t b;
    assert_true(pi2_cursor_u32le(&c, &a));
    assert_int_equal(a, 1);
    assert_true(pi2_cursor_u64le(&c, &b));
    assert_int_equal(b, 2);
    assert_false(pi2_cursor_u32le(&c, &a)); /* empty */
    pi2_cursor d = {buf, 6};
    assert_true(pi2_cursor_u32le(&d, &a));
    assert_false(pi2_cursor_u64le(&d, &b)); /* short: unchanged */
    assert_int_equal(d.left, 2);
    const uint8_t *p;
    assert_false(pi2_cursor_take(&d, SIZE_MAX, &p));
}

static void test_parse(void **state)
{
    (void)state;
    pi2_err err = {0};
    long long v;
    double dv;
    uint64_t sz;
    assert_int_equal(pi2_parse_int("-n", "42", 0, 100, &v, &err), 0);
    assert_int_equal(v, 42);
    assert_int_equal(pi2_parse_int("-n", "42x", 0, 100, &v, &err), PI2_EINVAL);
    assert_non_null(strstr(err.msg, "-n '42x'"));
    pi2_err_clear(&err);
    assert_int_equal(pi2_parse_int("-n", "101", 0, 100, &v, &err), PI2_EINVAL);
    assert_int_equal(pi2_parse_int("-n", "", 0, 100, &v, NULL), PI2_EINVAL);
    assert_int_equal(pi2_parse_int("-n", "99999999999999999999999", 0, 100, &v, NULL), PI2_EINVAL);
    assert_int_equal(pi2_parse_double("--t", "0.5", 0, 1, &dv, NULL), 0);
    assert_true(dv == 0.5);
    assert_int_equal(pi2_parse_double("--t", "nan", 0, 1, &dv, NULL), PI2_EINVAL);
    assert_int_equal(pi2_parse_size("--m", "4G", &sz, NULL), 0);
    assert_int_equal(sz, 4ull << 30);
    assert_int_equal(pi2_parse_size("--m", "512MiB", &sz, NULL), 0);
    assert_int_equal(sz, 512ull << 20);
    assert_int_equal(pi2_parse_size("--m", "1.5k", &sz, NULL), 0);
    assert_int_equal(sz, 1536);
    assert_int_equal(pi2_parse_size("--m", "-1G", &sz, NULL), PI2_EINVAL);
    assert_int_equal(pi2_parse_size("--m", "12Q", &sz, NULL), PI2_EINVAL);
    assert_int_equal(pi2_parse_size("--m", "99999999T", &sz, NULL), PI2_EINVAL);
}

static void test_afile(void **state)
{
    (void)state;
    char dir[64], path[128];
    pi2t_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/out.bin", dir);
    pi2_err err = {0};
    pi2_afile *f;
    assert_int_equal(pi2_afile_open(&f, path, &err), 0);
    assert_int_equal(pi2_afile_write(f, "hello", 5, &err), 0);
    assert_false(pi2t_exists(path)); /* not visible before commit */
    assert_int_equal(pi2_afile_commit(f, &err), 0);
    char *text;
    size_t len;
    assert_int_equal(pi2_read_file(path, 100, &text, &len, &err), 0);
    assert_int_equal(len, 5);
    assert_string_equal(text, "hello");
    free(text);
    assert_int_equal(pi2_read_file(path, 3, &text, &len, &err), PI2_ERANGE);
    /* simulated full disk */
    snprintf(path, sizeof path, "%s/full.bin", dir);
    assert_int_equal(pi2_afile_open(&f, path, &err), 0);
    pi2_afile_fail_after(3);
    pi2_err_clear(&err);
    assert_int_equal(pi2_afile_write(f, "hello", 5, &err), PI2_ENOSPC);
    pi2_afile_fail_after(-1);
    assert_non_null(strstr(err.msg, "full.bin"));
    pi2_afile_abort(f);
    pi2_afile_abort(NULL);
    assert_false(pi2t_exists(path));
    /* missing directory */
    pi2_err_clear(&err);
    assert_int_equal(pi2_afile_open(&f, "/nonexistent/dir/x", &err), PI2_EIO);
    pi2_map m;
    pi2_err_clear(&err);
    assert_int_equal(pi2_map_open(&m, "/nonexistent/file", &err), PI2_ENOTFOUND);
    assert_int_equal(pi2_map_open(&m, dir, NULL), PI2_EIO); /* a directory */
    pi2t_rmtree(dir);
}

/* A large output is written behind: once two more windows (64 MiB each)
 * follow the first, it has left the page cache before the commit (not on
 * tmpfs, where the cache is the file); every byte is there after it. */
static void test_afile_behind(void **state)
{
    (void)state;
    enum { MB = 1 << 20, TOTAL = 144, WIN = 64 };
    char dir[64], path[128];
    pi2t_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/big.bin", dir);
    uint32_t *buf = malloc(MB);
    assert_non_null(buf);
    pi2_err err = {0};
    pi2_afile *f;
    assert_int_equal(pi2_afile_open(&f, path, &err), 0);
    for (uint32_t k = 0; k < TOTAL; k++) {
        for (uint32_t i = 0; i < MB / 4; i++)
            buf[i] = k * (MB / 4) + i;
        assert_int_equal(pi2_afile_write(f, buf, MB, &err), 0);
    }
    struct statfs fs;
    bool tmpfs = statfs(dir, &fs) == 0 && fs.f_type == TMPFS_MAGIC;
    void *m = mmap(NULL, (size_t)WIN * MB, PROT_READ, MAP_SHARED, pi2_afile_fd(f), 0);
    assert_true(m != MAP_FAILED);
    static unsigned char vec[WIN * (MB / 4096)];
    assert_int_equal(mincore(m, (size_t)WIN * MB, vec), 0);
    size_t cached = 0;
    for (size_t i = 0; i < sizeof vec; i++)
        cached += vec[i] & 1;
    munmap(m, (size_t)WIN * MB);
    if (!tmpfs)
        assert_true(cached < sizeof vec / 8);
    assert_int_equal(pi2_afile_commit(f, &err), 0);
    FILE *in = fopen(path, "rb");
    assert_non_null(in);
    for (uint32_t k = 0; k < TOTAL; k++) {
        assert_int_equal(fread(buf, 1, MB, in), MB);
        for (uint32_t i = 0; i < MB / 4; i += 997)
            assert_int_equal(buf[i], k * (MB / 4) + i);
    }
    assert_int_equal(fgetc(in), EOF);
    fclose(in);
    free(buf);
    pi2t_rmtree(dir);
}

/* The output rule: inputs, inside an input directory, directories,
 * existing files and --force, a missing directory. */
static void test_out_check(void **state)
{
    (void)state;
    char dir[64], in[128], file[128], p[256];
    pi2t_tmpdir(dir, sizeof dir);
    snprintf(in, sizeof in, "%s/model", dir);
    snprintf(file, sizeof file, "%s/model/config.json", dir);
    assert_int_equal(mkdir(in, 0755), 0);
    pi2t_write(file, "{}", 2);
    const char *inputs[] = {NULL, in};
    pi2_err err = {0};
    assert_int_equal(pi2_out_check(file, inputs, 2, PI2_OUT_FORCE, 0, &err), PI2_EINVAL);
    assert_non_null(strstr(err.msg, "inside the input directory"));
    snprintf(p, sizeof p, "%s/model/../model/new.bin", dir);
    assert_int_equal(pi2_out_check(p, inputs, 2, 0, 0, NULL), PI2_EINVAL);
    pi2_err_clear(&err);
    assert_int_equal(pi2_out_check(in, inputs, 2, 0, 0, &err), PI2_EINVAL);
    assert_non_null(strstr(err.msg, "is the input"));
    const char *files[] = {file};
    snprintf(p, sizeof p, "%s/link.json", dir);
    assert_int_equal(symlink(file, p), 0);
    assert_int_equal(pi2_out_check(p, files, 1, PI2_OUT_FORCE, 0, NULL), PI2_EINVAL); /* the same inode */
    pi2_err_clear(&err);
    assert_int_equal(pi2_out_check(in, NULL, 0, 0, 0, &err), PI2_EINVAL);
    assert_non_null(strstr(err.msg, "is a directory"));
    pi2_err_clear(&err);
    assert_int_equal(pi2_out_check(file, NULL, 0, 0, 0, &err), PI2_EEXIST);
    assert_null(strstr(err.msg, "--force")); /* the library names no flag */
    pi2_cli_force_hint(&err);                 /* a tool that has one does */
    assert_non_null(strstr(err.msg, "already exists: choose another name (--force replaces it)"));
    assert_int_equal(pi2_out_check(file, NULL, 0, PI2_OUT_FORCE, 0, NULL), 0);
    assert_int_equal(pi2_out_check(file, NULL, 0, PI2_OUT_DIR, 0, NULL), PI2_EINVAL);
    snprintf(p, sizeof p, "%s/new.bin", dir);
    assert_int_equal(pi2_out_check(p, inputs, 2, 0, 0, NULL), 0);
    assert_int_equal(pi2_out_check(p, inputs, 2, 0, UINT64_MAX / 2, NULL), PI2_ENOSPC);
    snprintf(p, sizeof p, "%s/nodir/new.bin", dir);
    assert_int_equal(pi2_out_check(p, NULL, 0, 0, 0, NULL), PI2_ENOTFOUND);
    pi2t_rmtree(dir);
}

/* Temporaries: a live one (locked) survives the sweep, one whose writer
 * is gone (unlocked) is removed, and so is an abandoned directory; names
 * that only look alike stay. */
static void test_tmp_sweep(void **state)
{
    (void)state;
    char dir[64], out[128], p[256];
    pi2t_tmpdir(dir, sizeof dir);
    snprintf(out, sizeof out, "%s/out.bin", dir);
    pi2_afile *f;
    assert_int_equal(pi2_afile_open(&f, out, NULL), 0);
    assert_int_equal(pi2_tmp_sweep(out), 0); /* live: locked */
    snprintf(p, sizeof p, "%s/out.bin.tmp.AbC123", dir);
    pi2t_write(p, "x", 1);
    snprintf(p, sizeof p, "%s/out.bin.tmp.AbC1234", dir);
    pi2t_write(p, "x", 1);
    snprintf(p, sizeof p, "%s/out.bin.tmp.dir999", dir);
    assert_int_equal(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/out.bin.tmp.dir999/a", dir);
    pi2t_write(p, "x", 1);
    assert_int_equal(pi2_tmp_sweep(out), 2);
    assert_false(pi2t_exists(p));
    snprintf(p, sizeof p, "%s/out.bin.tmp.AbC1234", dir);
    assert_true(pi2t_exists(p)); /* not the pattern */
    assert_int_equal(pi2_afile_write(f, "hi", 2, NULL), 0);
    assert_int_equal(pi2_afile_commit(f, NULL), 0);
    assert_true(pi2t_exists(out));
    char tmp[160];
    snprintf(p, sizeof p, "%s/d", dir);
    assert_int_equal(pi2_dir_begin(p, tmp, sizeof tmp, NULL), 0);
    assert_int_equal(pi2_tmp_sweep(p), 0); /* live */
    pi2_dir_abort(tmp);
    assert_false(pi2t_exists(tmp));
    pi2t_rmtree(dir);
}

/* A mapped file cut short: with the guard, reads past the new end give
 * zeros and mark the mapping; reads before it keep the file's bytes. */
static void test_map_guard(void **state)
{
    (void)state;
    char dir[64], p[128];
    pi2t_tmpdir(dir, sizeof dir);
    snprintf(p, sizeof p, "%s/m.bin", dir);
    size_t page = (size_t)sysconf(_SC_PAGESIZE), n = 4 * page;
    uint8_t *buf = malloc(n);
    assert_non_null(buf);
    memset(buf, 7, n);
    pi2t_write(p, buf, n);
    free(buf);
    assert_int_equal(pi2_map_guard_install(NULL), 0);
    assert_int_equal(pi2_map_guard_install(NULL), 0); /* once is enough */
    pi2_map m, m2;
    assert_int_equal(pi2_map_open(&m, p, NULL), 0);
    assert_int_equal(pi2_map_open(&m2, p, NULL), 0);
    assert_int_equal(m.data[3 * page + 5], 7);
    assert_false(pi2_map_changed(&m));
    assert_int_equal(truncate(p, (off_t)page), 0);
    volatile const uint8_t *d = m.data;
    assert_int_equal(d[5], 7);
    assert_int_equal(d[3 * page + 5], 0); /* past the end: zeros, no SIGBUS */
    assert_true(pi2_map_changed(&m));
    assert_false(pi2_map_changed(&m2)); /* marked per mapping */
    pi2_map_close(&m);
    pi2_map_close(&m2);
    pi2t_rmtree(dir);
}

static void test_err_first_wins(void **state)
{
    (void)state;
    pi2_err err = {0};
    assert_int_equal(pi2_err_set(&err, PI2_EFORMAT, "first %d", 1), PI2_EFORMAT);
    assert_int_equal(pi2_err_set(&err, PI2_EIO, "second"), PI2_EIO);
    assert_string_equal(err.msg, "first 1");
    assert_int_equal(err.code, PI2_EFORMAT);
    assert_string_equal(pi2_strerror(PI2_ENOSPC), "no space left on device");
}

static void test_grow(void **state)
{
    (void)state;
    int *a = NULL;
    size_t cap = 0;
    for (size_t n = 0; n < 1000; n++) {
        assert_int_equal(pi2_grow(&a, &cap, n, sizeof *a, 4), 0);
        assert_true(cap > n);
        a[n] = (int)n;
    }
    for (size_t n = 0; n < 1000; n++)
        assert_int_equal(a[n], (int)n);
    size_t big = SIZE_MAX / 2 + 1;
    assert_int_equal(pi2_grow(&a, &big, big, 1, 4), PI2_ENOMEM); /* doubling overflows */
    assert_int_equal(pi2_grow(&a, &cap, cap, SIZE_MAX / 4, 4), PI2_ENOMEM);
    free(a);
}

static void test_rng(void **state)
{
    (void)state;
    pi2_rng a, b;
    pi2_rng_seed(&a, 9);
    pi2_rng_seed(&b, 9);
    double s = 0, s2 = 0;
    for (int i = 0; i < 20000; i++) {
        assert_true(pi2_rng_u64(&a) == pi2_rng_u64(&b));
        double x = pi2_rng_normal(&a);
        pi2_rng_normal(&b);
        s += x;
        s2 += x * x;
    }
    assert_true(fabs(s / 20000) < 0.05);
    assert_true(fabs(s2 / 20000 - 1) < 0.05);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_roundtrip), cmocka_unit_test(test_bf16), cmocka_unit_test(test_cursor),
        cmocka_unit_test(test_parse),         cmocka_unit_test(test_afile), cmocka_unit_test(test_afile_behind), cmocka_unit_test(test_err_first_wins),
        cmocka_unit_test(test_rng),           cmocka_unit_test(test_grow),
        cmocka_unit_test(test_out_check),     cmocka_unit_test(test_tmp_sweep), cmocka_unit_test(test_map_guard),
    };
    return cmocka_run_group_tests_name("common", tests, NULL, NULL);
}
