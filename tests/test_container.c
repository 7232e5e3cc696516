/* container: writer alignment and digests, reader round trip, tar
 * compatibility, writer misuse and ENOSPC, and a corruption matrix
 * (truncation, flipped header bytes, lying fields, duplicates, fuzz). */
#include "tests/testutil.h"

#include "formats/container.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/vfs.h>
#include <unistd.h>

static const size_t k_sizes[] = {0, 1, 511, 512, 3072, 3584, 4095, 4096, 4097, 8191, 1u << 20};
#define NSIZES (sizeof k_sizes / sizeof k_sizes[0])

static uint8_t pattern_byte(size_t i, unsigned seed) { return (uint8_t)((i * 131 + seed * 7 + (i >> 9)) ^ (i >> 13)); }

static uint8_t *pattern(size_t n, unsigned seed)
{
    uint8_t *p = malloc(n ? n : 1);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++)
        p[i] = pattern_byte(i, seed);
    return p;
}

static uint8_t *slurp(const char *path, size_t *len)
{
    pi2_map m;
    assert_int_equal(pi2_map_open(&m, path, NULL), 0);
    uint8_t *p = malloc(m.size ? m.size : 1);
    assert_non_null(p);
    if (m.size)
        memcpy(p, m.data, m.size);
    *len = m.size;
    pi2_map_close(&m);
    return p;
}

/* Write members "m<size>" for the given sizes; stream each in uneven chunks. */
static void write_members(const char *path, const size_t *sizes, size_t n)
{
    pi2_ctr_writer *w;
    pi2_err err = {0};
    assert_int_equal(pi2_ctr_writer_create(&w, path, &err), 0);
    for (size_t i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "m%zu", sizes[i]);
        uint8_t *p = pattern(sizes[i], (unsigned)i);
        assert_int_equal(pi2_ctr_writer_begin(w, name, sizes[i], &err), 0);
        size_t off = 0, step = 1;
        while (off < sizes[i]) {
            size_t c = step < sizes[i] - off ? step : sizes[i] - off;
            assert_int_equal(pi2_ctr_writer_data(w, p + off, c, &err), 0);
            off += c;
            step = step * 2 + 3;
        }
        assert_int_equal(pi2_ctr_writer_end(w, &err), 0);
        free(p);
    }
    assert_int_equal(pi2_ctr_writer_finish(w, &err), 0);
    pi2_ctr_writer_free(w);
}

static void test_roundtrip_sizes(void **state)
{
    (void)state;
    char dir[64], path[256];
    pi2t_tmpdir(dir, sizeof dir);
    assert_true(pi2_path_join(path, sizeof path, dir, "model.pi2"));

    pi2_ctr_writer *w;
    pi2_err err = {0};
    assert_int_equal(pi2_ctr_writer_create(&w, path, &err), 0);
    size_t n0;
    pi2_ctr_writer_sections(w, &n0);
    assert_int_equal(n0, 0);
    for (size_t i = 0; i < NSIZES; i++) {
        char name[32];
        snprintf(name, sizeof name, "layers/%zu/w%zu", i, k_sizes[i]);
        uint8_t *p = pattern(k_sizes[i], (unsigned)i);
        if (i % 2) {
            assert_int_equal(pi2_ctr_writer_add(w, name, p, k_sizes[i], &err), 0);
        } else {
            assert_int_equal(pi2_ctr_writer_begin(w, name, k_sizes[i], &err), 0);
            for (size_t off = 0; off < k_sizes[i]; off += 1000)
                assert_int_equal(
                    pi2_ctr_writer_data(w, p + off, k_sizes[i] - off < 1000 ? k_sizes[i] - off : 1000, &err), 0);
            assert_int_equal(pi2_ctr_writer_data(w, NULL, 0, &err), 0);
            assert_int_equal(pi2_ctr_writer_end(w, &err), 0);
        }
        free(p);
    }
    /* a name of exactly 99 bytes is the longest allowed */
    char longest[PI2_CTR_NAME_MAX];
    memset(longest, 'n', PI2_CTR_NAME_MAX - 1);
    longest[PI2_CTR_NAME_MAX - 1] = 0;
    assert_int_equal(pi2_ctr_writer_add(w, longest, "xyz", 3, &err), 0);
    /* the manifest comes last and lists the sections written so far */
    size_t ns;
    const pi2_ctr_section *secs = pi2_ctr_writer_sections(w, &ns);
    assert_int_equal(ns, NSIZES + 1);
    char manifest[8192];
    size_t ml = 0;
    for (size_t i = 0; i < ns; i++) {
        char hex[PI2_SHA256_HEX_LEN];
        pi2_sha256_hex(secs[i].sha256, hex);
        ml += (size_t)snprintf(manifest + ml, sizeof manifest - ml, "%s %llu %llu %s\n", secs[i].name,
                               (unsigned long long)secs[i].offset, (unsigned long long)secs[i].size, hex);
    }
    assert_true(ml < sizeof manifest);
    assert_int_equal(pi2_ctr_writer_add(w, "manifest.json", manifest, ml, &err), 0);
    assert_null(pi2_ctr_writer_section(w, "nope"));
    assert_non_null(pi2_ctr_writer_section(w, "manifest.json"));
    assert_false(pi2t_exists(path)); /* nothing at path before finish */
    assert_int_equal(pi2_ctr_writer_finish(w, &err), 0);
    assert_true(pi2t_exists(path));
    assert_int_equal(pi2t_count_entries(dir), 1); /* temp file renamed away */

    secs = pi2_ctr_writer_sections(w, &ns); /* still readable after finish */
    assert_int_equal(ns, NSIZES + 2);
    for (size_t i = 0; i < NSIZES; i++) {
        assert_int_equal(secs[i].offset % PI2_CTR_ALIGN, 0);
        assert_int_equal(secs[i].size, k_sizes[i]);
        uint8_t *p = pattern(k_sizes[i], (unsigned)i);
        uint8_t d[PI2_SHA256_LEN];
        assert_int_equal(pi2_sha256(p, k_sizes[i], d, NULL), 0);
        assert_memory_equal(d, secs[i].sha256, sizeof d);
        free(p);
        if (i > 0)
            assert_true(secs[i].offset >= secs[i - 1].offset + secs[i - 1].size);
    }

    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_size % PI2_CTR_ALIGN, 0);

    pi2_ctr *c;
    assert_int_equal(pi2_ctr_open(&c, path, &err), 0);
    assert_string_equal(pi2_ctr_path(c), path);
    assert_int_equal(pi2_ctr_count(c), ns);
    for (size_t i = 0; i < ns; i++) {
        const pi2_ctr_member *m = pi2_ctr_at(c, i);
        assert_non_null(m);
        assert_string_equal(m->name, secs[i].name);
        assert_int_equal(m->offset, secs[i].offset);
        assert_int_equal(m->size, secs[i].size);
        assert_int_equal(m->offset % PI2_CTR_ALIGN, 0);
        assert_int_equal((uintptr_t)m->data % PI2_CTR_ALIGN, 0); /* mapping is page aligned */
        assert_ptr_equal(pi2_ctr_find(c, secs[i].name), m);
        assert_int_equal(pi2_ctr_verify_member(c, m, secs[i].sha256, &err), 0);
        if (i < NSIZES) {
            uint8_t *p = pattern(k_sizes[i], (unsigned)i);
            if (k_sizes[i])
                assert_memory_equal(m->data, p, k_sizes[i]);
            free(p);
        }
    }
    assert_null(pi2_ctr_at(c, ns));
    assert_null(pi2_ctr_find(c, "nope"));
    assert_null(pi2_ctr_find(c, ".pad/000001")); /* padding is not listed */
    const pi2_ctr_member *mf = pi2_ctr_find(c, "manifest.json");
    assert_non_null(mf);
    assert_int_equal(mf->size, ml);
    assert_memory_equal(mf->data, manifest, ml);

    /* opened for in-place use: the same members, the mapping advised huge */
    pi2_ctr *ch;
    assert_int_equal(pi2_ctr_open_huge(&ch, path, &err), 0);
    assert_int_equal(pi2_ctr_count(ch), ns);
    for (size_t i = 0; i < ns; i++) {
        const pi2_ctr_member *a = pi2_ctr_at(c, i), *b = pi2_ctr_at(ch, i);
        assert_string_equal(a->name, b->name);
        assert_int_equal(a->offset, b->offset);
        assert_int_equal(a->size, b->size);
        assert_memory_equal(a->data, b->data, a->size);
    }
    if (pi2t_have_thp()) {
        assert_int_equal(pi2t_vma_flag(pi2_ctr_at(ch, 0)->data, "hg"), 1);
        assert_int_equal(pi2t_vma_flag(pi2_ctr_at(c, 0)->data, "hg"), 0);
    }
    pi2_ctr_close(ch);

    /* wrong digest: PI2_ESIG naming file and member */
    uint8_t bad[PI2_SHA256_LEN];
    memcpy(bad, secs[3].sha256, sizeof bad);
    bad[0] ^= 1;
    pi2_err_clear(&err);
    assert_int_equal(pi2_ctr_verify_member(c, pi2_ctr_at(c, 3), bad, &err), PI2_ESIG);
    assert_non_null(strstr(err.msg, path));
    assert_non_null(strstr(err.msg, secs[3].name));
    pi2_ctr_close(c);
    pi2_ctr_close(NULL);
    pi2_ctr_writer_free(w);
    pi2_ctr_writer_free(NULL);
    pi2t_rmtree(dir);
}

static bool have_tar(void) { return system("command -v tar >/dev/null 2>&1") == 0; }

static void test_tar_lists_members(void **state)
{
    (void)state;
    if (!have_tar()) {
        fprintf(stderr, "skip: tar not found\n");
        skip();
    }
    char dir[64], path[256], out[256], cmd[1024];
    pi2t_tmpdir(dir, sizeof dir);
    assert_true(pi2_path_join(path, sizeof path, dir, "model.pi2"));
    assert_true(pi2_path_join(out, sizeof out, dir, "list.txt"));
    write_members(path, k_sizes, NSIZES);
    snprintf(cmd, sizeof cmd, "tar tvf '%s' > '%s' 2>&1", path, out);
    assert_int_equal(system(cmd), 0);
    size_t n;
    uint8_t *text = slurp(out, &n);
    text = realloc(text, n + 1);
    text[n] = 0;
    for (size_t i = 0; i < NSIZES; i++) {
        char want[64];
        snprintf(want, sizeof want, " m%zu\n", k_sizes[i]);
        if (!strstr((char *)text, want))
            fail_msg("tar tvf output lacks '%s':\n%s", want, (char *)text);
    }
    free(text);

    /* tar extracts exactly the bytes the reader sees */
    char xdir[300];
    assert_true(pi2_path_join(xdir, sizeof xdir, dir, "x"));
    assert_int_equal(mkdir(xdir, 0755), 0);
    snprintf(cmd, sizeof cmd, "tar xf '%s' -C '%s' 2>&1", path, xdir);
    assert_int_equal(system(cmd), 0);
    pi2_ctr *c;
    assert_int_equal(pi2_ctr_open(&c, path, NULL), 0);
    for (size_t i = 0; i < pi2_ctr_count(c); i++) {
        const pi2_ctr_member *m = pi2_ctr_at(c, i);
        char f[400];
        assert_true(pi2_path_join(f, sizeof f, xdir, m->name));
        uint8_t *got = slurp(f, &n);
        assert_int_equal(n, m->size);
        if (n)
            assert_memory_equal(got, m->data, n);
        free(got);
    }
    pi2_ctr_close(c);

    /* an ordinary tar archive is refused: its data is not 4 KiB aligned */
    char plain[300];
    assert_true(pi2_path_join(plain, sizeof plain, dir, "plain.tar"));
    snprintf(cmd, sizeof cmd, "cd '%s' && tar --format=ustar -cf plain.tar list.txt 2>&1", dir);
    assert_int_equal(system(cmd), 0);
    pi2_err err = {0};
    assert_int_equal(pi2_ctr_open(&c, plain, &err), PI2_EFORMAT);
    assert_null(c);
    assert_non_null(strstr(err.msg, "aligned"));
    pi2t_rmtree(dir);
}

static void test_empty_and_deterministic(void **state)
{
    (void)state;
    char dir[64], a[256], b[256];
    pi2t_tmpdir(dir, sizeof dir);
    assert_true(pi2_path_join(a, sizeof a, dir, "a.pi2"));
    assert_true(pi2_path_join(b, sizeof b, dir, "b.pi2"));

    write_members(a, NULL, 0);
    size_t n;
    uint8_t *p = slurp(a, &n);
    assert_int_equal(n, PI2_CTR_ALIGN);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(p[i], 0);
    free(p);
    pi2_ctr *c;
    assert_int_equal(pi2_ctr_open(&c, a, NULL), 0);
    assert_int_equal(pi2_ctr_count(c), 0);
    pi2_ctr_close(c);
    assert_int_equal(unlink(a), 0);

    static const size_t sz[] = {5, 0, 9000};
    write_members(a, sz, 3);
    write_members(b, sz, 3);
    size_t na, nb;
    uint8_t *pa = slurp(a, &na), *pb = slurp(b, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(pa, pb, na);
    free(pa);
    free(pb);
    pi2t_rmtree(dir);
}

/* ---- writer misuse: error, sticky, and no file at path ---- */

typedef enum {
    MIS_TOO_MUCH,
    MIS_TOO_LITTLE_END,
    MIS_TOO_LITTLE_FINISH,
    MIS_DATA_NO_MEMBER,
    MIS_END_NO_MEMBER,
    MIS_BEGIN_TWICE,
    MIS_DUPLICATE,
    MIS_TOO_BIG,
    MIS_ABANDON_MID_MEMBER,
} misuse;

static void check_misuse(const char *dir, misuse kind, int want)
{
    char path[256];
    assert_true(pi2_path_join(path, sizeof path, dir, "model.pi2"));
    pi2_ctr_writer *w;
    pi2_err err = {0};
    assert_int_equal(pi2_ctr_writer_create(&w, path, &err), 0);
    assert_int_equal(pi2_ctr_writer_add(w, "first", "hello", 5, &err), 0);
    uint8_t buf[64] = {0};
    int rc = 0;
    switch (kind) {
    case MIS_TOO_MUCH:
        assert_int_equal(pi2_ctr_writer_begin(w, "x", 10, &err), 0);
        assert_int_equal(pi2_ctr_writer_data(w, buf, 6, &err), 0);
        rc = pi2_ctr_writer_data(w, buf, 5, &err);
        assert_non_null(strstr(err.msg, "more data than the 10 bytes declared"));
        break;
    case MIS_TOO_LITTLE_END:
        assert_int_equal(pi2_ctr_writer_begin(w, "x", 10, &err), 0);
        assert_int_equal(pi2_ctr_writer_data(w, buf, 9, &err), 0);
        rc = pi2_ctr_writer_end(w, &err);
        assert_non_null(strstr(err.msg, "9 bytes written but 10 declared"));
        break;
    case MIS_TOO_LITTLE_FINISH:
        assert_int_equal(pi2_ctr_writer_begin(w, "x", 10, &err), 0);
        rc = pi2_ctr_writer_finish(w, &err);
        assert_non_null(strstr(err.msg, "still open"));
        break;
    case MIS_DATA_NO_MEMBER:
        rc = pi2_ctr_writer_data(w, buf, 1, &err);
        break;
    case MIS_END_NO_MEMBER:
        rc = pi2_ctr_writer_end(w, &err);
        break;
    case MIS_BEGIN_TWICE:
        assert_int_equal(pi2_ctr_writer_begin(w, "x", 1, &err), 0);
        rc = pi2_ctr_writer_begin(w, "y", 1, &err);
        break;
    case MIS_DUPLICATE:
        rc = pi2_ctr_writer_add(w, "first", "again", 5, &err);
        assert_non_null(strstr(err.msg, "twice"));
        break;
    case MIS_TOO_BIG:
        rc = pi2_ctr_writer_begin(w, "huge", PI2_CTR_MAX_SIZE + 1, &err);
        break;
    case MIS_ABANDON_MID_MEMBER:
        /* a large declared size must not make free() write it out */
        assert_int_equal(pi2_ctr_writer_begin(w, "big", PI2_CTR_MAX_SIZE, &err), 0);
        assert_int_equal(pi2_ctr_writer_data(w, buf, sizeof buf, &err), 0);
        pi2_ctr_writer_free(w);
        assert_false(pi2t_exists(path));
        assert_int_equal(pi2t_count_entries(dir), 0);
        return;
    }
    assert_int_equal(rc, want);
    assert_int_equal(err.code, want);
    assert_non_null(strstr(err.msg, path));
    /* sticky: later calls fail the same way, and nothing is published */
    pi2_err e2 = {0};
    assert_int_equal(pi2_ctr_writer_add(w, "later", "z", 1, &e2), want);
    pi2_err_clear(&e2);
    assert_int_equal(pi2_ctr_writer_finish(w, &e2), want);
    assert_string_equal(e2.msg, err.msg);
    assert_false(pi2t_exists(path));
    pi2_ctr_writer_free(w);
    assert_false(pi2t_exists(path));
    assert_int_equal(pi2t_count_entries(dir), 0);
}

static void test_writer_misuse(void **state)
{
    (void)state;
    char dir[64];
    pi2t_tmpdir(dir, sizeof dir);
    check_misuse(dir, MIS_TOO_MUCH, PI2_EINVAL);
    check_misuse(dir, MIS_TOO_LITTLE_END, PI2_EINVAL);
    check_misuse(dir, MIS_TOO_LITTLE_FINISH, PI2_EINVAL);
    check_misuse(dir, MIS_DATA_NO_MEMBER, PI2_EINVAL);
    check_misuse(dir, MIS_END_NO_MEMBER, PI2_EINVAL);
    check_misuse(dir, MIS_BEGIN_TWICE, PI2_EINVAL);
    check_misuse(dir, MIS_DUPLICATE, PI2_EINVAL);
    check_misuse(dir, MIS_TOO_BIG, PI2_ERANGE);
    check_misuse(dir, MIS_ABANDON_MID_MEMBER, 0);

    /* bad names */
    char name100[PI2_CTR_NAME_MAX + 1], name300[301];
    memset(name100, 'a', PI2_CTR_NAME_MAX);
    name100[PI2_CTR_NAME_MAX] = 0;
    memset(name300, 'b', 300);
    name300[300] = 0;
    const char *bad[] = {name100, name300, "", "/abs", "a//b", "../up", "a/../b", "./a", "a/.", "dir/",
                         "has space", "tab\tx", "nl\nx", "\x80utf", ".pad/000001", ".pad/x"};
    char path[256];
    assert_true(pi2_path_join(path, sizeof path, dir, "model.pi2"));
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        pi2_ctr_writer *w;
        pi2_err err = {0};
        assert_int_equal(pi2_ctr_writer_create(&w, path, &err), 0);
        assert_int_equal(pi2_ctr_writer_begin(w, bad[i], 1, &err), PI2_EINVAL);
        assert_non_null(strstr(err.msg, "member '"));
        assert_int_equal(pi2_ctr_writer_finish(w, NULL), PI2_EINVAL);
        pi2_ctr_writer_free(w);
        assert_false(pi2t_exists(path));
    }
    assert_int_equal(pi2t_count_entries(dir), 0);

    /* calls after a successful finish are refused; the file stays */
    pi2_ctr_writer *w;
    pi2_err err = {0};
    assert_int_equal(pi2_ctr_writer_create(&w, path, &err), 0);
    assert_int_equal(pi2_ctr_writer_finish(w, &err), 0);
    assert_int_equal(pi2_ctr_writer_add(w, "late", "x", 1, &err), PI2_EINVAL);
    assert_int_equal(pi2_ctr_writer_finish(w, NULL), PI2_EINVAL);
    pi2_ctr_writer_free(w);
    assert_true(pi2t_exists(path));

    /* an unwritable location */
    char nowhere[300];
    assert_true(pi2_path_join(nowhere, sizeof nowhere, dir, "missing/model.pi2"));
    pi2_err_clear(&err);
    w = (pi2_ctr_writer *)1;
    assert_int_equal(pi2_ctr_writer_create(&w, nowhere, &err), PI2_EIO);
    assert_null(w);
    assert_non_null(strstr(err.msg, nowhere));
    pi2t_rmtree(dir);
}

/* Simulated full disk at many points: PI2_ENOSPC from the first failing call
 * and from finish, never a file at path. */
/* Sum of every 4 KiB of the member: touches (maps) each page. */
static uint64_t touch_member(const pi2_ctr_member *m)
{
    uint64_t acc = 0;
    for (uint64_t o = 0; o < m->size; o += 4096)
        acc += m->data[o];
    return acc;
}

/* The writer's pages leave the page cache; the mapping's pages are counted;
 * pi2_ctr_rehuge drops 4 KiB pages only when 2 MiB ones come back, and the
 * data read again is the same. */
static void test_pages(void **state)
{
    (void)state;
    char dir[64], path[256], copy[256];
    pi2t_tmpdir(dir, sizeof dir);
    assert_true(pi2_path_join(path, sizeof path, dir, "pages.pi2"));
    assert_true(pi2_path_join(copy, sizeof copy, dir, "copy.pi2"));
    const size_t sizes[] = {24u << 20};
    write_members(path, sizes, 1);
    struct statfs fs;
    bool tmpfs = statfs(dir, &fs) == 0 && fs.f_type == TMPFS_MAGIC; /* the cache is the file there */
    pi2_err err = {0};
    pi2_ctr *c;
    assert_int_equal(pi2_ctr_open(&c, path, &err), 0);
    if (!tmpfs) /* the open read headers only */
        assert_true(pi2_ctr_cached_bytes(c) < sizes[0] / 2);
    pi2_ctr_close(c);

    /* a copy written with write() and synced, its pages left cached as a
     * writer leaves them */
    size_t len;
    uint8_t *bytes = slurp(path, &len);
    int fd = open(copy, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    for (size_t o = 0; o < len;) { /* 4 KiB at a time: the cache keeps 4 KiB pages */
        ssize_t w = write(fd, bytes + o, len - o < 4096 ? len - o : 4096);
        assert_true(w > 0);
        o += (size_t)w;
    }
    assert_int_equal(fsync(fd), 0);
    close(fd);
    free(bytes);

    assert_int_equal(pi2_ctr_open_huge(&c, copy, &err), 0);
    const pi2_ctr_member *m = pi2_ctr_at(c, 0);
    uint64_t sum = touch_member(m), rss, huge;
    assert_int_equal(pi2_ctr_mapped_bytes(c, &rss, &huge, &err), 0);
    assert_true(rss >= m->size && rss <= len);
    assert_true(huge <= rss);
    /* less present than asked for: nothing dropped */
    assert_false(pi2_ctr_rehuge(c, rss + 1));
    uint64_t rss2, huge2;
    assert_int_equal(pi2_ctr_mapped_bytes(c, &rss2, &huge2, &err), 0);
    assert_true(rss2 >= m->size);
    bool redone = pi2_ctr_rehuge(c, 1);
    if (huge >= rss / 2)
        assert_false(redone); /* already in 2 MiB pages */
    assert_int_equal(touch_member(m), sum);
    assert_int_equal(pi2_ctr_mapped_bytes(c, &rss2, &huge2, &err), 0);
    if (redone)
        assert_true(huge2 >= rss2 / 2);
    else if (huge < rss / 2)
        print_message("note: this kernel or file system does not cache %s in 2 MiB pages; rehuge left it\n", dir);
    const uint8_t *want = pattern(m->size, 0);
    assert_memory_equal(m->data, want, m->size);
    free((void *)want);
    pi2_ctr_close(c);
    pi2t_rmtree(dir);
}

static void test_enospc(void **state)
{
    (void)state;
    char dir[64], path[256];
    pi2t_tmpdir(dir, sizeof dir);
    assert_true(pi2_path_join(path, sizeof path, dir, "model.pi2"));
    static const size_t sz[] = {0, 1, 4097, 20000, 511};
    write_members(path, sz, 5);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    const int64_t total = st.st_size;
    assert_int_equal(unlink(path), 0);

    int failures = 0;
    for (int64_t budget = 0; budget < total; budget += (budget < 9000 ? 257 : 1531)) {
        for (int edge = 0; edge < 2; edge++) {
            int64_t b = edge ? total - 1 - budget % 97 : budget;
            pi2_afile_fail_after(b);
            pi2_ctr_writer *w;
            pi2_err err = {0};
            int rc = pi2_ctr_writer_create(&w, path, &err);
            assert_int_equal(rc, 0);
            for (size_t i = 0; i < 5 && rc == 0; i++) {
                char name[32];
                snprintf(name, sizeof name, "s%zu", i);
                uint8_t *p = pattern(sz[i], 1);
                rc = pi2_ctr_writer_add(w, name, p, sz[i], &err);
                free(p);
            }
            if (rc == 0)
                rc = pi2_ctr_writer_finish(w, &err);
            pi2_afile_fail_after(-1);
            if (rc != PI2_ENOSPC)
                fail_msg("budget %lld: rc %d (%s)", (long long)b, rc, err.msg);
            assert_non_null(strstr(err.msg, path));
            assert_int_equal(pi2_ctr_writer_finish(w, NULL), PI2_ENOSPC);
            pi2_ctr_writer_free(w);
            assert_false(pi2t_exists(path));
            assert_int_equal(pi2t_count_entries(dir), 0);
            failures++;
        }
    }
    assert_true(failures > 20);
    /* with exactly enough room it succeeds */
    pi2_afile_fail_after(total);
    write_members(path, sz, 5);
    pi2_afile_fail_after(-1);
    assert_true(pi2t_exists(path));
    pi2t_rmtree(dir);
}

/* ---- corruption matrix ---- */

typedef struct fixture {
    char dir[64];
    char good[256]; /* valid container */
    char bad[256];  /* scratch for damaged copies */
    uint8_t *bytes;
    size_t n;
    size_t hdr[64]; /* offsets of every header block (padding included) */
    size_t nhdr;
} fixture;

static void fixture_make(fixture *f)
{
    memset(f, 0, sizeof *f);
    pi2t_tmpdir(f->dir, sizeof f->dir);
    assert_true(pi2_path_join(f->good, sizeof f->good, f->dir, "good.pi2"));
    assert_true(pi2_path_join(f->bad, sizeof f->bad, f->dir, "bad.pi2"));
    static const size_t sz[] = {0, 1, 700, 4097};
    write_members(f->good, sz, 4);
    f->bytes = slurp(f->good, &f->n);
    /* headers: blocks carrying the ustar magic, walked by size */
    size_t pos = 0;
    while (pos + 512 <= f->n && memcmp(f->bytes + pos + 257, "ustar", 5) == 0) {
        assert_true(f->nhdr < 64);
        f->hdr[f->nhdr++] = pos;
        size_t size = strtoull((char *)f->bytes + pos + 124, NULL, 8);
        pos += 512 + (size + 511) / 512 * 512;
    }
    assert_int_equal(f->nhdr, 8); /* 4 members, each after a padding member */
}

static void fixture_free(fixture *f)
{
    free(f->bytes);
    pi2t_rmtree(f->dir);
}

/* Open buf (n bytes) as a container; return the status (container closed). */
static int try_open(fixture *f, const uint8_t *buf, size_t n, pi2_err *err)
{
    pi2t_write(f->bad, buf, n);
    pi2_ctr *c = (pi2_ctr *)1;
    int rc = pi2_ctr_open(&c, f->bad, err);
    if (rc == 0) {
        /* touch everything the reader hands out */
        uint64_t sum = 0;
        for (size_t i = 0; i < pi2_ctr_count(c); i++) {
            const pi2_ctr_member *m = pi2_ctr_at(c, i);
            assert_ptr_equal(pi2_ctr_find(c, m->name), m);
            for (uint64_t j = 0; j < m->size; j++)
                sum += m->data[j];
        }
        (void)sum;
        pi2_ctr_close(c);
    } else {
        assert_null(c);
    }
    return rc;
}

static void expect_format(fixture *f, const uint8_t *buf, size_t n, const char *needle, const char *what)
{
    pi2_err err = {0};
    int rc = try_open(f, buf, n, &err);
    if (rc != PI2_EFORMAT)
        fail_msg("%s: expected PI2_EFORMAT, got %d (%s)", what, rc, err.msg);
    if (!strstr(err.msg, f->bad))
        fail_msg("%s: message does not name the file: %s", what, err.msg);
    if (needle && !strstr(err.msg, needle))
        fail_msg("%s: message '%s' lacks '%s'", what, err.msg, needle);
}

static void test_corrupt_truncation(void **state)
{
    (void)state;
    fixture f;
    fixture_make(&f);
    pi2_err err = {0};
    assert_int_equal(try_open(&f, f.bytes, f.n, &err), 0);
    for (size_t len = 0; len < f.n; len++) {
        bool boundary = len % 512 == 0 || len % 512 == 1 || len % 512 == 511;
        if (!boundary && len % 61 != 0)
            continue;
        char what[64];
        snprintf(what, sizeof what, "truncated to %zu", len);
        expect_format(&f, f.bytes, len, NULL, what);
    }
    expect_format(&f, f.bytes, 0, "empty", "empty");
    /* appended garbage and appended zeros */
    uint8_t *more = calloc(1, f.n + 4096);
    memcpy(more, f.bytes, f.n);
    expect_format(&f, more, f.n + 512, "multiple of 4096", "extra zero block");
    assert_int_equal(try_open(&f, more, f.n + 4096, &err), 0); /* zeros to 4 KiB: still fine */
    more[f.n + 100] = 1;
    expect_format(&f, more, f.n + 4096, "after the end-of-archive", "trailing garbage");
    free(more);
    fixture_free(&f);
}

static void test_corrupt_header_bytes(void **state)
{
    (void)state;
    fixture f;
    fixture_make(&f);
    uint8_t *buf = malloc(f.n);
    /* every byte of every header, two kinds of damage */
    for (size_t h = 0; h < f.nhdr; h++) {
        for (size_t i = 0; i < 512; i++) {
            for (int k = 0; k < 2; k++) {
                memcpy(buf, f.bytes, f.n);
                buf[f.hdr[h] + i] ^= k ? 0x01 : 0xff;
                char what[96];
                snprintf(what, sizeof what, "header %zu byte %zu xor %s", h, i, k ? "01" : "ff");
                expect_format(&f, buf, f.n, NULL, what);
            }
        }
    }
    /* end-of-archive blocks and the tail */
    size_t last = f.hdr[f.nhdr - 1];
    size_t lsize = strtoull((char *)f.bytes + last + 124, NULL, 8);
    size_t eoa = last + 512 + (lsize + 511) / 512 * 512;
    for (size_t i = eoa; i < f.n; i += 7) {
        memcpy(buf, f.bytes, f.n);
        buf[i] = 0x20;
        expect_format(&f, buf, f.n, NULL, "end marker / tail byte");
    }
    /* fill after a member's data, and padding data */
    memcpy(buf, f.bytes, f.n);
    buf[f.hdr[5] + 512 + 700] = 1; /* member m700 at header 5; fill follows its data */
    expect_format(&f, buf, f.n, "fill", "member fill");
    memcpy(buf, f.bytes, f.n);
    buf[f.hdr[0] + 512 + 10] = 1;
    expect_format(&f, buf, f.n, "padding", "padding data");
    free(buf);
    fixture_free(&f);
}

/* Set a header field to s (NUL-filled) and recompute the checksum, so the
 * parser's own checks, not the checksum, must catch the lie. */
static void set_field(uint8_t *h, size_t off, size_t len, const char *s, size_t slen)
{
    memset(h + off, 0, len);
    memcpy(h + off, s, slen);
}

static void fix_checksum(uint8_t *h)
{
    memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (size_t i = 0; i < 512; i++)
        sum += h[i];
    char c[8];
    snprintf(c, sizeof c, "%06o", sum);
    memcpy(h + 148, c, 7); /* 6 digits + NUL, then the space stays */
}

static void test_lying_headers(void **state)
{
    (void)state;
    fixture f;
    fixture_make(&f);
    uint8_t *buf = malloc(f.n);
    pi2_err err = {0};

    /* a no-op rewrite with our checksum helper is accepted */
    memcpy(buf, f.bytes, f.n);
    fix_checksum(buf + f.hdr[3]);
    assert_int_equal(try_open(&f, buf, f.n, &err), 0);

    const size_t h = f.hdr[3]; /* member "m1" (1 byte) */
    const size_t data_off = h + 512;
    struct {
        size_t off, len;
        const char *val;
        size_t vlen;
        const char *needle;
    } lies[] = {
        {124, 12, "77777777777", 11, "past the end"},          /* 8 GiB - 1 */
        {124, 12, "777777777777", 12, "exceeds"},              /* 12 digits, no terminator */
        {124, 12, "00000000009", 11, "size field is not octal"},
        {124, 12, "0000000001x", 11, "size field is not octal"},
        {124, 12, "", 0, "size field is not octal"},           /* all NUL */
        {124, 12, "           ", 11, "size field is not octal"},
        {124, 12, "\x80\0\0\0\0\0\0\0\0\0\0\x01", 12, "size field is not octal"}, /* base-256 */
        {124, 12, "-0000000001", 11, "size field is not octal"},
        {124, 12, " 1 2", 4, "size field is not octal"},
        {100, 8, "00006x4", 7, "mode field is not octal"},
        {108, 8, "", 0, "uid field is not octal"},
        {136, 12, "zzz", 3, "mtime field is not octal"},
        {148, 8, "", 0, "checksum field is not octal"},
        {0, 100, "", 0, "empty name"},
        {0, 100, "../m1", 5, "'..'"},
        {0, 100, "/m1", 3, "absolute"},
        {0, 100, "a b", 3, "printable"},
        {0, 100, "m0", 2, "duplicate member name 'm0'"},
        {156, 1, "5", 1, "type '5'"},
        {156, 1, "2", 1, "type '2'"},
        {156, 1, "x", 1, "type 'x'"},
        {156, 1, "L", 1, "type 'L'"},
        {345, 155, "dir", 3, "prefix"},
        {257, 6, "ustar ", 6, "magic"},
        {263, 2, " \0", 2, "magic"},
    };
    for (size_t i = 0; i < sizeof lies / sizeof lies[0]; i++) {
        memcpy(buf, f.bytes, f.n);
        set_field(buf + h, lies[i].off, lies[i].len, lies[i].val, lies[i].vlen);
        if (lies[i].off != 148)
            fix_checksum(buf + h);
        char what[64];
        snprintf(what, sizeof what, "lie %zu", i);
        expect_format(&f, buf, f.n, lies[i].needle, what);
    }

    /* name filling all 100 bytes (no NUL) */
    memcpy(buf, f.bytes, f.n);
    memset(buf + h, 'a', 100);
    fix_checksum(buf + h);
    expect_format(&f, buf, f.n, "NUL", "unterminated name");

    /* size exactly one past the file, and as large as the rest of the file */
    char num[16];
    memcpy(buf, f.bytes, f.n);
    snprintf(num, sizeof num, "%011zo", f.n - data_off + 1);
    set_field(buf + h, 124, 12, num, 11);
    fix_checksum(buf + h);
    expect_format(&f, buf, f.n, "past the end", "size beyond file");
    memcpy(buf, f.bytes, f.n);
    snprintf(num, sizeof num, "%011zo", f.n - data_off);
    set_field(buf + h, 124, 12, num, 11);
    fix_checksum(buf + h);
    expect_format(&f, buf, f.n, NULL, "size swallows the end marker");
    /* size growing into the next padding header and shrinking to 0 */
    for (size_t s = 0; s < 8192; s += 123) {
        memcpy(buf, f.bytes, f.n);
        snprintf(num, sizeof num, "%011zo", s);
        set_field(buf + h, 124, 12, num, 11);
        fix_checksum(buf + h);
        int rc = try_open(&f, buf, f.n, &err);
        /* 1..512 keeps the block structure (the fill is zero anyway); a size
         * that happens to land on a later real header swallows the members
         * between (only the manifest digests can tell); the rest is refused */
        if (s == 0)
            assert_int_equal(rc, PI2_EFORMAT); /* the data byte now sits in the fill */
        else if (s <= 512)
            assert_int_equal(rc, 0);
        else
            assert_true(rc == 0 || rc == PI2_EFORMAT);
    }

    /* a padding member renamed to a real name: its data is not aligned */
    memcpy(buf, f.bytes, f.n);
    set_field(buf + f.hdr[0], 0, 100, "pp", 2);
    fix_checksum(buf + f.hdr[0]);
    expect_format(&f, buf, f.n, "aligned", "misaligned member");
    /* a real member renamed into the padding namespace: nonzero data */
    memcpy(buf, f.bytes, f.n);
    set_field(buf + f.hdr[5], 0, 100, ".pad/zz", 7);
    fix_checksum(buf + f.hdr[5]);
    expect_format(&f, buf, f.n, "padding", "member posing as padding");

    /* duplicate of a later member */
    memcpy(buf, f.bytes, f.n);
    set_field(buf + f.hdr[7], 0, 100, "m700", 4);
    fix_checksum(buf + f.hdr[7]);
    expect_format(&f, buf, f.n, "duplicate member name 'm700'", "duplicate");

    /* not a container at all */
    expect_format(&f, (const uint8_t *)"{\"a\":1}", 7, NULL, "json");
    uint8_t junk[8192];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (uint8_t)(i * 97 + 13);
    expect_format(&f, junk, sizeof junk, "not a pi2 container", "junk");
    pi2_ctr *c = (pi2_ctr *)1;
    char missing[300];
    assert_true(pi2_path_join(missing, sizeof missing, f.dir, "missing.pi2"));
    assert_int_equal(pi2_ctr_open(&c, missing, NULL), PI2_ENOTFOUND);
    assert_null(c);
    assert_int_equal(pi2_ctr_open(&c, f.dir, NULL), PI2_EIO);

    /* damaged member data: open succeeds, the digest catches it */
    memcpy(buf, f.bytes, f.n);
    buf[f.hdr[5] + 512 + 123] ^= 0x10;
    pi2t_write(f.bad, buf, f.n);
    assert_int_equal(pi2_ctr_open(&c, f.bad, &err), 0);
    pi2_ctr *g;
    assert_int_equal(pi2_ctr_open(&g, f.good, &err), 0);
    const pi2_ctr_member *mg = pi2_ctr_find(g, "m700");
    uint8_t d[PI2_SHA256_LEN];
    assert_int_equal(pi2_sha256(mg->data, mg->size, d, NULL), 0);
    assert_int_equal(pi2_ctr_verify_member(g, mg, d, NULL), 0);
    pi2_err_clear(&err);
    assert_int_equal(pi2_ctr_verify_member(c, pi2_ctr_find(c, "m700"), d, &err), PI2_ESIG);
    assert_non_null(strstr(err.msg, "m700"));
    assert_non_null(strstr(err.msg, "mismatch"));
    pi2_ctr_close(c);
    pi2_ctr_close(g);
    free(buf);
    fixture_free(&f);
}

/* Random damage, sometimes with a repaired checksum: never a crash, only 0
 * or a clean error. Run under ASan/UBSan. */
static void test_fuzz(void **state)
{
    (void)state;
    fixture f;
    fixture_make(&f);
    uint8_t *buf = malloc(f.n);
    pi2_rng r;
    pi2_rng_seed(&r, 2024);
    int ok = 0, bad = 0;
    for (int it = 0; it < 1500; it++) {
        memcpy(buf, f.bytes, f.n);
        size_t h = f.hdr[pi2_rng_u64(&r) % f.nhdr];
        int flips = 1 + (int)(pi2_rng_u64(&r) % 6);
        for (int k = 0; k < flips; k++) {
            uint64_t v = pi2_rng_u64(&r);
            size_t at = (v & 1) ? h + (v >> 8) % 512 : (size_t)((v >> 8) % f.n);
            buf[at] = (uint8_t)(v >> 40);
        }
        if (pi2_rng_u64(&r) & 1)
            fix_checksum(buf + h);
        size_t n = (pi2_rng_u64(&r) % 8 == 0) ? (size_t)(pi2_rng_u64(&r) % f.n) : f.n;
        pi2_err err = {0};
        int rc = try_open(&f, buf, n, &err);
        if (rc == 0)
            ok++;
        else {
            assert_true(rc == PI2_EFORMAT || rc == PI2_ERANGE);
            assert_true(strlen(err.msg) > 0);
            bad++;
        }
    }
    assert_true(bad > 1000);
    free(buf);
    fixture_free(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_sizes),
        cmocka_unit_test(test_tar_lists_members),
        cmocka_unit_test(test_empty_and_deterministic),
        cmocka_unit_test(test_writer_misuse),
        cmocka_unit_test(test_pages),
        cmocka_unit_test(test_enospc),
        cmocka_unit_test(test_corrupt_truncation),
        cmocka_unit_test(test_corrupt_header_bytes),
        cmocka_unit_test(test_lying_headers),
        cmocka_unit_test(test_fuzz),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
