/* Tests for formats/torchzip: writer -> reader round trips of every dtype
 * through pi2_st_open (views inside the file's mapping, 64-aligned),
 * ReluLLaMA-style .bin shards with an index, PowerInfer-style predictor
 * files, a sparse 9 GiB zip64 shard opened without reading its data, the
 * pickle shapes torch really writes (plain dict, state_dict with _metadata,
 * parameters, protocol 4, shared storages), and hostile files, each failing
 * with its exact code and a one-line message naming the file. Python's own
 * zipfile and pickle check the writer's output when /usr/bin/python3 exists. */
#include "formats/safetensors.h"
#include "formats/torchzip.h"
#include "tests/testst.h"
#include "tests/testutil.h"

#include <fcntl.h>

/* ---- a pickle builder for hand-made data.pkl ---- */

typedef struct tp {
    uint8_t *b;
    size_t n, cap;
} tp;

static tp *tp_new(void)
{
    tp *p = calloc(1, sizeof *p);
    assert_non_null(p);
    return p;
}

static void tp_free(tp *p)
{
    free(p->b);
    free(p);
}

static void tp_raw(tp *p, const void *s, size_t n)
{
    if (p->n + n > p->cap) {
        p->cap = (p->n + n) * 2 + 64;
        p->b = realloc(p->b, p->cap);
        assert_non_null(p->b);
    }
    memcpy(p->b + p->n, s, n);
    p->n += n;
}

static void tp_op(tp *p, uint8_t op) { tp_raw(p, &op, 1); }

/* a string literal's bytes, embedded NULs included */
#define TPS(p, lit) tp_raw((p), (lit), sizeof(lit) - 1)

static void tp_u32(tp *p, uint32_t v)
{
    uint8_t b[4] = { (uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24) };
    tp_raw(p, b, 4);
}

static void tp_int(tp *p, int64_t v)
{
    if (v >= 0 && v < 256) {
        tp_op(p, 'K');
        tp_op(p, (uint8_t)v);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
        tp_op(p, 'J');
        tp_u32(p, (uint32_t)v);
    } else {
        tp_op(p, 0x8a);
        tp_op(p, 8);
        for (int i = 0; i < 8; i++)
            tp_op(p, (uint8_t)((uint64_t)v >> (8 * i)));
    }
}

static void tp_str(tp *p, const char *s)
{
    tp_op(p, 'X');
    tp_u32(p, (uint32_t)strlen(s));
    tp_raw(p, s, strlen(s));
}

static void tp_global(tp *p, const char *mod, const char *name)
{
    tp_op(p, 'c');
    tp_raw(p, mod, strlen(mod));
    tp_op(p, '\n');
    tp_raw(p, name, strlen(name));
    tp_op(p, '\n');
}

static void tp_ints(tp *p, int n, const int64_t *v)
{
    tp_op(p, '(');
    for (int i = 0; i < n; i++)
        tp_int(p, v[i]);
    tp_op(p, 't');
}

static void tp_hooks(tp *p)
{
    tp_global(p, "collections", "OrderedDict");
    tp_op(p, ')');
    tp_op(p, 'R');
}

/* ('storage', torch.<type>, key, 'cpu', numel) BINPERSID */
static void tp_storage(tp *p, const char *type, const char *key, int64_t numel)
{
    tp_op(p, '(');
    tp_str(p, "storage");
    tp_global(p, "torch", type);
    tp_str(p, key);
    tp_str(p, "cpu");
    tp_int(p, numel);
    tp_op(p, 't');
    tp_op(p, 'Q');
}

/* _rebuild_tensor_v2(storage, off, size, stride, False, OrderedDict()) */
static void tp_tensor(tp *p, const char *type, const char *key, int64_t numel, int64_t off, int nd,
                      const int64_t *size, const int64_t *stride)
{
    tp_global(p, "torch._utils", "_rebuild_tensor_v2");
    tp_op(p, '(');
    tp_storage(p, type, key, numel);
    tp_int(p, off);
    tp_ints(p, nd, size);
    tp_ints(p, nd, stride);
    tp_op(p, 0x89);
    tp_hooks(p);
    tp_op(p, 't');
    tp_op(p, 'R');
}

/* A 2x3 F32 tensor over storage "0" (6 elements). */
static void tp_t23(tp *p)
{
    static const int64_t size[2] = { 2, 3 }, stride[2] = { 3, 1 };
    tp_tensor(p, "FloatStorage", "0", 6, 0, 2, size, stride);
}

/* {name: 2x3 tensor} as a whole pickle */
static tp *tp_simple(const char *name)
{
    tp *p = tp_new();
    TPS(p, "\x80\x02}");
    tp_str(p, name);
    tp_t23(p);
    tp_op(p, 's');
    tp_op(p, '.');
    return p;
}

/* ---- files ---- */

static uint8_t pat(size_t k, size_t i) { return (uint8_t)(k * 37 + i * 11 + 3); }

/* "<dir>/<file>": members A/data.pkl (pkl), A/data/<i> for the sizes given
 * (pattern bytes), A/version "3\n"; through pi2_tz_write_members. */
static void write_ckpt(char *out, size_t cap, const char *dir, const char *file, const tp *pkl, size_t nst,
                       const size_t *st_sizes)
{
    snprintf(out, cap, "%s/%s", dir, file);
    const char *names[16];
    const void *data[16];
    size_t sizes[16];
    char nb[16][64];
    uint8_t *bufs[16] = { 0 };
    assert_true(nst + 2 <= 16);
    size_t n = 0;
    names[n] = "A/data.pkl", data[n] = pkl->b, sizes[n++] = pkl->n;
    for (size_t i = 0; i < nst; i++) {
        snprintf(nb[i], sizeof nb[i], "A/data/%zu", i);
        bufs[i] = malloc(st_sizes[i] ? st_sizes[i] : 1);
        for (size_t j = 0; j < st_sizes[i]; j++)
            bufs[i][j] = pat(i, j);
        names[n] = nb[i], data[n] = bufs[i], sizes[n++] = st_sizes[i];
    }
    names[n] = "A/version", data[n] = "3\n", sizes[n++] = 2;
    pi2_err e = { 0 };
    int rc = pi2_tz_write_members(out, n, names, data, sizes, &e);
    if (rc != 0)
        fprintf(stderr, "write_ckpt: %s\n", e.msg);
    assert_int_equal(rc, 0);
    for (size_t i = 0; i < nst; i++)
        free(bufs[i]);
}

static void expect_fail_path(const char *path, int code, const char *substr)
{
    pi2_st *st = (pi2_st *)1;
    pi2_err e = { 0 };
    int rc = pi2_st_open(&st, path, &e);
    if (rc != code || !strstr(e.msg, substr))
        fprintf(stderr, "expected %d '%s', got %d '%s'\n", code, substr, rc, e.msg);
    assert_int_equal(rc, code);
    assert_int_equal(e.code, code);
    assert_null(st);
    assert_non_null(strstr(e.msg, substr));
    assert_int_equal(strncmp(e.msg, path, strlen(path)), 0);
    assert_int_equal(strncmp(e.msg + strlen(path), ": ", 2), 0);
    assert_null(strchr(e.msg, '\n'));
}

/* A hand-made pickle (and storages) must fail with code and substr. */
static void expect_pkl_fail(const char *dir, tp *p, size_t nst, const size_t *sizes, int code, const char *substr)
{
    char path[256];
    write_ckpt(path, sizeof path, dir, "bad.pt", p, nst, sizes);
    expect_fail_path(path, code, substr);
    tp_free(p);
}

static uint8_t *read_all(const char *path, size_t *len)
{
    char *b = NULL;
    pi2_err e = { 0 };
    assert_int_equal(pi2_read_file(path, 1u << 26, &b, len, &e), 0);
    uint8_t *exact = malloc(*len ? *len : 1); /* exact size: ASan sees overreads */
    memcpy(exact, b, *len);
    free(b);
    return exact;
}

/* Whether [p, p+n) lies inside one mapping of `file` (from /proc/self/maps). */
static bool in_file_mapping(const void *p, size_t n, const char *file)
{
    char real[4096];
    if (!realpath(file, real))
        return false;
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    char line[4600];
    bool ok = false;
    while (!ok && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        int off = 0;
        if (sscanf(line, "%lx-%lx %*s %*s %*s %*s %n", &lo, &hi, &off) < 2 || off == 0)
            continue;
        char *path = line + off;
        path[strcspn(path, "\n")] = 0;
        ok = strcmp(path, real) == 0 && (uintptr_t)p >= lo && (uintptr_t)p + n <= hi;
    }
    fclose(f);
    return ok;
}

static uint64_t vm_rss(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    assert_non_null(f);
    char line[256];
    uint64_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "VmRSS:", 6) == 0)
            kb = strtoull(line + 6, NULL, 10);
    fclose(f);
    return kb * 1024;
}

/* ---- round trips ---- */

static const pi2t_spec all_specs[] = {
    { "model.embed_tokens.weight", PI2_DT_F32, 2, { 5, 3 } },
    { "model.layers.0.mlp.gate_proj.weight", PI2_DT_F16, 2, { 4, 6 } },
    { "model.layers.0.mlp.up_proj.weight", PI2_DT_BF16, 3, { 2, 3, 4 } },
    { "i8", PI2_DT_I8, 1, { 7 } },
    { "u8", PI2_DT_U8, 1, { 1 } },
    { "i32", PI2_DT_I32, 4, { 1, 2, 1, 3 } },
    { "i64.scalar", PI2_DT_I64, 0, { 0 } },
    { "empty.rows", PI2_DT_F32, 2, { 0, 4 } },
    { "empty.1d", PI2_DT_BF16, 1, { 0 } },
    { "wide", PI2_DT_F16, 8, { 1, 2, 1, 1, 2, 1, 1, 3 } },
    { "utf8.név", PI2_DT_F32, 1, { 2 } },
};
#define NSPECS (sizeof all_specs / sizeof all_specs[0])

static void check_specs(const pi2_st *st, const pi2t_spec *s, size_t n, const char *file)
{
    assert_int_equal(pi2_st_count(st), n);
    for (size_t k = 0; k < n; k++) {
        const pi2_st_tensor *t = pi2_st_at(st, k);
        assert_string_equal(t->name, s[k].name); /* the state dict's order */
        assert_ptr_equal(pi2_st_find(st, s[k].name), t);
        assert_int_equal(t->dtype, s[k].dt);
        assert_int_equal(t->ndim, s[k].ndim);
        for (int d = 0; d < s[k].ndim; d++)
            assert_int_equal(t->shape[d], s[k].shape[d]);
        assert_int_equal(t->nbytes, pi2t_spec_bytes(&s[k]));
        assert_int_equal(t->nelem * pi2_dtype_size(t->dtype), t->nbytes);
        assert_string_equal(t->file, file);
        /* in the mapping, where torch aligns storages */
        assert_true(in_file_mapping(t->data, t->nbytes, file));
        assert_int_equal((uintptr_t)t->data % PI2_TZ_ALIGN, 0);
        const uint8_t *d = t->data;
        for (size_t i = 0; i < t->nbytes; i++)
            assert_int_equal(d[i], pat(k, i));
    }
}

static void test_roundtrip_all_dtypes(void **state)
{
    (void)state;
    char dir[64], path[160];
    pi2t_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/pytorch_model.bin", dir);
    pi2_tz_writer *w;
    pi2_err e = { 0 };
    assert_int_equal(pi2_tz_writer_create(&w, path, &e), 0);
    for (size_t k = 0; k < NSPECS; k++)
        assert_int_equal(pi2_tz_writer_add(w, all_specs[k].name, all_specs[k].dt, all_specs[k].ndim,
                                           all_specs[k].shape, &e), 0);
    /* one stream of all the data, in uneven chunks across tensor boundaries */
    size_t total = 0;
    for (size_t k = 0; k < NSPECS; k++)
        total += pi2t_spec_bytes(&all_specs[k]);
    uint8_t *all = malloc(total);
    size_t o = 0;
    for (size_t k = 0; k < NSPECS; k++)
        for (size_t i = 0; i < pi2t_spec_bytes(&all_specs[k]); i++)
            all[o++] = pat(k, i);
    for (size_t at = 0, step = 1; at < total; at += step, step = step % 7 + 3) {
        size_t n = total - at < step ? total - at : step;
        assert_int_equal(pi2_tz_writer_write(w, all + at, n, &e), 0);
    }
    assert_false(pi2t_exists(path)); /* only after finish */
    assert_int_equal(pi2_tz_writer_finish(w, &e), 0);
    free(all);

    pi2_st *st = pi2t_st_open_ok(path);
    check_specs(st, all_specs, NSPECS, path);
    /* the consumers work unchanged */
    const pi2_st_tensor *t = pi2_st_find(st, "model.embed_tokens.weight");
    float f[15];
    assert_int_equal(pi2_st_to_f32(t, f, 15, &e), 0);
    assert_memory_equal(f, t->data, sizeof f);
    assert_true(pi2_st_get_f32(pi2_st_find(st, "u8"), 0) == (float)pat(4, 0));
    pi2_st_release(t);
    assert_null(pi2_st_metadata(st, "format"));
    assert_null(pi2_st_find(st, "missing"));
    pi2_st_close(st);

    /* the directory form finds pytorch_model.bin */
    st = pi2t_st_open_ok(dir);
    assert_int_equal(pi2_st_count(st), NSPECS);
    pi2_st_close(st);
    /* and an in-memory image */
    size_t len;
    uint8_t *img = read_all(path, &len);
    assert_int_equal(pi2_st_open_buffer(&st, img, len, "img", &e), 0);
    assert_int_equal(pi2_st_count(st), NSPECS);
    assert_string_equal(pi2_st_at(st, 0)->file, "img");
    pi2_st_close(st);
    free(img);
    pi2t_rmtree(dir);
}

/* pi2_tz_write from memory; the archive folder is the file name's stem. */
static void test_write_from_memory(void **state)
{
    (void)state;
    char dir[64], path[160];
    pi2t_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/model_7.pt", dir);
    uint16_t fc1[3 * 8], fc2[5 * 3];
    for (size_t i = 0; i < 24; i++)
        fc1[i] = pi2_f32_to_f16((float)i * 0.25f);
    for (size_t i = 0; i < 15; i++)
        fc2[i] = pi2_f32_to_f16(-(float)i);
    pi2_tz_item it[2] = { { "fc1.weight", PI2_DT_F16, 2, { 3, 8 }, fc1 },
                          { "fc2.weight", PI2_DT_F16, 2, { 5, 3 }, fc2 } };
    pi2_err e = { 0 };
    assert_int_equal(pi2_tz_write(path, 2, it, &e), 0);
    size_t len;
    uint8_t *img = read_all(path, &len);
    assert_non_null(memmem(img, len, "model_7/data.pkl", 16));
    assert_non_null(memmem(img, len, "model_7/data/1", 14));
    assert_non_null(memmem(img, len, "model_7/version", 15));
    /* the module's own entry point: views into the buffer, names apart */
    pi2_st_tensor *tv;
    size_t nt;
    char *names;
    assert_true(pi2_tz_is_zip(img, len));
    assert_int_equal(pi2_tz_parse(img, len, "m7", &tv, &nt, &names, &e), 0);
    assert_int_equal(nt, 2);
    assert_string_equal(tv[1].name, "fc2.weight");
    assert_string_equal(tv[1].file, "m7");
    assert_true((const uint8_t *)tv[1].data > img && (const uint8_t *)tv[1].data + tv[1].nbytes <= img + len);
    free(tv);
    free(names);
    pi2_err_clear(&e);
    assert_int_equal(pi2_tz_parse(img, len, "m7", NULL, &nt, &names, &e), PI2_EINVAL);
    assert_int_equal(pi2_tz_parse(NULL, 0, "m7", &tv, &nt, &names, NULL), PI2_EFORMAT);
    assert_null(tv);
    assert_null(names);
    assert_int_equal(nt, 0);
    assert_false(pi2_tz_is_zip(img, 3));
    assert_false(pi2_tz_is_zip("PK\1\2", 4));
    free(img);
    pi2_st *st = pi2t_st_open_ok(path);
    const pi2_st_tensor *t = pi2_st_find(st, "fc1.weight");
    assert_non_null(t);
    assert_int_equal(t->shape[0], 3);
    assert_int_equal(t->shape[1], 8);
    assert_true(pi2_st_get_f32(t, 5) == 1.25f);
    t = pi2_st_find(st, "fc2.weight");
    float f[15];
    assert_int_equal(pi2_st_to_f32(t, f, 15, &e), 0);
    assert_true(f[14] == -14.0f);
    pi2_st_close(st);
    /* no tensors at all is a valid state dict */
    snprintf(path, sizeof path, "%s/empty.pt", dir);
    assert_int_equal(pi2_tz_write(path, 0, NULL, &e), 0);
    st = pi2t_st_open_ok(path);
    assert_int_equal(pi2_st_count(st), 0);
    pi2_st_close(st);
    pi2t_rmtree(dir);
}

/* ReluLLaMA-7B's layout: pytorch_model-0000N-of-00003.bin + index. */
static void test_sharded_bin_index(void **state)
{
    (void)state;
    char dir[64], path[200];
    pi2t_tmpdir(dir, sizeof dir);
    const char *shard[3] = { "pytorch_model-00001-of-00003.bin", "pytorch_model-00002-of-00003.bin",
                             "pytorch_model-00003-of-00003.bin" };
    const char *names[6] = { "model.embed_tokens.weight", "model.layers.0.mlp.down_proj.weight",
                             "model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.up_proj.weight",
                             "model.norm.weight", "lm_head.weight" };
    const char *files[6];
    float data[6][8];
    for (int s = 0; s < 3; s++) {
        pi2_tz_item it[2];
        for (int j = 0; j < 2; j++) {
            int k = s * 2 + j;
            for (int i = 0; i < 8; i++)
                data[k][i] = (float)(k * 100 + i);
            it[j] = (pi2_tz_item){ names[k], PI2_DT_F32, 2, { 2, 4 }, data[k] };
            files[k] = shard[s];
        }
        snprintf(path, sizeof path, "%s/%s", dir, shard[s]);
        pi2_err e = { 0 };
        assert_int_equal(pi2_tz_write(path, 2, it, &e), 0);
    }
    snprintf(path, sizeof path, "%s/pytorch_model.bin.index.json", dir);
    pi2_err e = { 0 };
    assert_int_equal(pi2_st_write_index(path, 6, names, files, 6 * 32, &e), 0);
    pi2_st *st = pi2t_st_open_ok(dir);
    assert_int_equal(pi2_st_count(st), 6);
    for (int k = 0; k < 6; k++) {
        const pi2_st_tensor *t = pi2_st_find(st, names[k]);
        assert_non_null(t);
        assert_non_null(strstr(t->file, files[k]));
        assert_true(in_file_mapping(t->data, t->nbytes, t->file));
        assert_true(pi2_st_get_f32(t, 7) == (float)(k * 100 + 7));
    }
    pi2_st_close(st);
    st = pi2t_st_open_ok(path); /* the index itself */
    assert_int_equal(pi2_st_count(st), 6);
    pi2_st_close(st);

    /* an index whose map lies about a shard is refused as for safetensors */
    const char *lying[6];
    memcpy(lying, files, sizeof lying);
    lying[0] = shard[1];
    assert_int_equal(pi2_st_write_index(path, 6, names, lying, 0, &e), 0);
    expect_fail_path(path, PI2_EFORMAT, "is mapped to shard 'pytorch_model-00002-of-00003.bin' but stored in");
    /* a missing shard */
    assert_int_equal(pi2_st_write_index(path, 6, names, files, 0, &e), 0);
    snprintf(path, sizeof path, "%s/%s", dir, shard[2]);
    assert_int_equal(unlink(path), 0);
    pi2_st *s2 = (pi2_st *)1;
    pi2_err_clear(&e);
    assert_int_equal(pi2_st_open(&s2, dir, &e), PI2_ENOTFOUND);
    assert_non_null(strstr(e.msg, shard[2]));

    /* lookup order: safetensors before pytorch_model.bin */
    char d2[64];
    pi2t_tmpdir(d2, sizeof d2);
    snprintf(path, sizeof path, "%s/pytorch_model.bin", d2);
    pi2_tz_item one = { "from.bin", PI2_DT_F32, 1, { 2 }, data[0] };
    assert_int_equal(pi2_tz_write(path, 1, &one, &e), 0);
    st = pi2t_st_open_ok(d2);
    assert_non_null(pi2_st_find(st, "from.bin"));
    pi2_st_close(st);
    snprintf(path, sizeof path, "%s/model.safetensors", d2);
    pi2_st_writer *sw;
    int64_t sh = 2;
    assert_int_equal(pi2_st_writer_create(&sw, path, &e), 0);
    assert_int_equal(pi2_st_writer_add(sw, "from.st", PI2_DT_F32, 1, &sh, &e), 0);
    assert_int_equal(pi2_st_writer_write(sw, data[1], 8, &e), 0);
    assert_int_equal(pi2_st_writer_finish(sw, &e), 0);
    st = pi2t_st_open_ok(d2);
    assert_non_null(pi2_st_find(st, "from.st"));
    assert_null(pi2_st_find(st, "from.bin"));
    pi2_st_close(st);
    /* an index mixing both formats */
    const char *mixed_names[2] = { "from.bin", "from.st" };
    const char *mixed_files[2] = { "pytorch_model.bin", "model.safetensors" };
    snprintf(path, sizeof path, "%s/mixed.index.json", d2);
    assert_int_equal(pi2_st_write_index(path, 2, mixed_names, mixed_files, 16, &e), 0);
    st = pi2t_st_open_ok(path);
    assert_int_equal(pi2_st_count(st), 2);
    assert_true(pi2_st_get_f32(pi2_st_find(st, "from.st"), 1) == 101.0f);
    pi2_st_close(st);
    pi2t_rmtree(d2);
    pi2t_rmtree(dir);
}

/* A PowerInfer predictor repo: model_{L}.pt with fc1 [rank, hidden] and
 * fc2 [n_ff, rank], each opened as its own file. */
static void test_predictor_repo(void **state)
{
    (void)state;
    char dir[64], path[160];
    pi2t_tmpdir(dir, sizeof dir);
    enum { HIDDEN = 16, RANK = 8, NFF = 40, LAYERS = 3 };
    uint16_t fc1[RANK * HIDDEN], fc2[NFF * RANK];
    for (int l = 0; l < LAYERS; l++) {
        for (int i = 0; i < RANK * HIDDEN; i++)
            fc1[i] = pi2_f32_to_f16((float)(l + i % 7));
        for (int i = 0; i < NFF * RANK; i++)
            fc2[i] = pi2_f32_to_f16((float)(l - i % 5));
        pi2_tz_item it[2] = { { "fc1.weight", PI2_DT_F16, 2, { RANK, HIDDEN }, fc1 },
                              { "fc2.weight", PI2_DT_F16, 2, { NFF, RANK }, fc2 } };
        snprintf(path, sizeof path, "%s/model_%d.pt", dir, l);
        pi2_err e = { 0 };
        assert_int_equal(pi2_tz_write(path, 2, it, &e), 0);
    }
    for (int l = 0; l < LAYERS; l++) {
        snprintf(path, sizeof path, "%s/model_%d.pt", dir, l);
        pi2_st *st = pi2t_st_open_ok(path);
        int64_t s1[2] = { RANK, HIDDEN }, s2[2] = { NFF, RANK };
        pi2_err e = { 0 };
        assert_int_equal(pi2_st_expect_shape(pi2_st_find(st, "fc1.weight"), 2, s1, &e), 0);
        assert_int_equal(pi2_st_expect_shape(pi2_st_find(st, "fc2.weight"), 2, s2, &e), 0);
        assert_true(pi2_st_get_f32(pi2_st_find(st, "fc1.weight"), 9) == (float)(l + 2));
        assert_true(pi2_st_get_f32(pi2_st_find(st, "fc2.weight"), 7) == (float)(l - 2));
        pi2_st_close(st);
    }
    pi2t_rmtree(dir);
}

/* ---- an independent zip writer: flags 0 (sizes in the local header, no
 * descriptors, as Python's zipfile writes to a seekable file), zip64 where
 * needed, members with NULL data left as holes of a sparse file ---- */

typedef struct zm {
    const char *name;
    const void *data;
    uint64_t size;
} zm;

static void put16(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void put32(uint8_t *p, uint32_t v)
{
    put16(p, v & 0xffff);
    put16(p + 2, v >> 16);
}
static void put64(uint8_t *p, uint64_t v)
{
    put32(p, (uint32_t)v);
    put32(p + 4, (uint32_t)(v >> 32));
}

static void pwrite_all(int fd, const void *b, size_t n, uint64_t at)
{
    assert_int_equal(pwrite(fd, b, n, (off_t)at), (ssize_t)n);
}

/* CRC-32 of the zip format (reflected, polynomial 0xedb88320), bit by bit. */
static uint32_t crc32_of(const void *p, size_t n)
{
    const uint8_t *b = p;
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= b[i];
        for (int k = 0; k < 8; k++)
            c = c >> 1 ^ (0xedb88320u & (0u - (c & 1u)));
    }
    return ~c;
}

/* Members stored with their CRC-32 (a hole, data NULL, says 0). */
static void write_zip_raw(const char *path, const zm *m, size_t n)
{
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    assert_true(fd >= 0);
    uint64_t pos = 0, lho[8];
    assert_true(n <= 8);
    for (size_t i = 0; i < n; i++) {
        uint8_t h[30 + 64 + 20] = { 0 };
        size_t nl = strlen(m[i].name);
        bool big = m[i].size >= 0xffffffffu;
        lho[i] = pos;
        put32(h, 0x04034b50);
        put16(h + 4, 45);
        put32(h + 14, m[i].data ? crc32_of(m[i].data, (size_t)m[i].size) : 0);
        put32(h + 18, big ? 0xffffffffu : (uint32_t)m[i].size);
        put32(h + 22, big ? 0xffffffffu : (uint32_t)m[i].size);
        put16(h + 26, (uint32_t)nl);
        put16(h + 28, big ? 20 : 0);
        memcpy(h + 30, m[i].name, nl);
        if (big) {
            put16(h + 30 + nl, 1);
            put16(h + 32 + nl, 16);
            put64(h + 34 + nl, m[i].size);
            put64(h + 42 + nl, m[i].size);
        }
        size_t hl = 30 + nl + (big ? 20 : 0);
        pwrite_all(fd, h, hl, pos);
        pos += hl;
        if (m[i].data)
            pwrite_all(fd, m[i].data, (size_t)m[i].size, pos);
        pos += m[i].size; /* a hole when data is NULL */
    }
    uint64_t cd = pos;
    for (size_t i = 0; i < n; i++) {
        uint8_t h[46 + 64 + 28] = { 0 };
        size_t nl = strlen(m[i].name);
        bool big = m[i].size >= 0xffffffffu;
        put32(h, 0x02014b50);
        put16(h + 4, 45);
        put16(h + 6, 45);
        put32(h + 16, m[i].data ? crc32_of(m[i].data, (size_t)m[i].size) : 0);
        put32(h + 20, big ? 0xffffffffu : (uint32_t)m[i].size);
        put32(h + 24, big ? 0xffffffffu : (uint32_t)m[i].size);
        put16(h + 28, (uint32_t)nl);
        put16(h + 30, big ? 20 : 0);
        put32(h + 42, (uint32_t)lho[i]);
        memcpy(h + 46, m[i].name, nl);
        if (big) {
            put16(h + 46 + nl, 1);
            put16(h + 48 + nl, 16);
            put64(h + 50 + nl, m[i].size);
            put64(h + 58 + nl, m[i].size);
        }
        size_t hl = 46 + nl + (big ? 20 : 0);
        pwrite_all(fd, h, hl, pos);
        pos += hl;
    }
    uint8_t e[56 + 20 + 22] = { 0 };
    put32(e, 0x06064b50);
    put64(e + 4, 44);
    put64(e + 24, n);
    put64(e + 32, n);
    put64(e + 40, pos - cd);
    put64(e + 48, cd);
    put32(e + 56, 0x07064b50);
    put64(e + 64, pos);
    put32(e + 72, 1);
    put32(e + 76, 0x06054b50);
    put16(e + 84, (uint32_t)n);
    put16(e + 86, (uint32_t)n);
    put32(e + 88, (uint32_t)(pos - cd));
    put32(e + 92, cd >= 0xffffffffu ? 0xffffffffu : (uint32_t)cd);
    pwrite_all(fd, e, sizeof e, pos);
    assert_int_equal(close(fd), 0);
}

/* A 9 GiB shard (zip64, sparse) opens without its data being read. */
/* libarchive reads the same image beside the walker: data.pkl's CRC-32 is
 * checked there, and a pickle whose bytes no longer match is refused
 * before it is interpreted. */
static void test_read_through_libarchive(void **state)
{
    (void)state;
    char dir[64], path[160];
    pi2t_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/model_0.pt", dir);
    tp *p = tp_new();
    TPS(p, "\x80\x02}");
    tp_str(p, "fc1.weight");
    int64_t size[2] = { 2, 4 }, stride[2] = { 4, 1 };
    tp_tensor(p, "FloatStorage", "0", 8, 0, 2, size, stride);
    tp_op(p, 's');
    tp_op(p, '.');
    float w[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
    zm m[3] = { { "A/data.pkl", p->b, p->n }, { "A/version", "3\n", 2 }, { "A/data/0", w, sizeof w } };
    write_zip_raw(path, m, 3);
    pi2_st *st = pi2t_st_open_ok(path);
    assert_true(pi2_st_get_f32(pi2_st_at(st, 0), 7) == 8.0f);
    pi2_st_close(st);
    /* one byte of data.pkl changed where it lies (the CRC says otherwise) */
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    uint8_t b = 0x03; /* protocol 3 instead of 2: still a pickle the walker takes */
    pwrite_all(fd, &b, 1, 30 + strlen("A/data.pkl") + 1);
    close(fd);
    expect_fail_path(path, PI2_EFORMAT, "libarchive reading data.pkl: ZIP bad CRC");
    tp_free(p);
    pi2t_rmtree(dir);
}

static void test_big_sparse_shard(void **state)
{
    (void)state;
    char dir[64], path[160];
    pi2t_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/pytorch_model-00001-of-00003.bin", dir);
    const uint64_t big = 9ull << 30;
    tp *p = tp_new();
    TPS(p, "\x80\x02}");
    tp_str(p, "model.layers.0.mlp.up_proj.weight");
    int64_t size[2] = { (int64_t)(big / 4 / 4096), 4096 }, stride[2] = { 4096, 1 };
    tp_tensor(p, "FloatStorage", "0", (int64_t)(big / 4), 0, 2, size, stride);
    tp_op(p, 's');
    tp_op(p, '.');
    zm m[3] = { { "A/data.pkl", p->b, p->n }, { "A/version", "3\n", 2 }, { "A/data/0", NULL, big } };
    write_zip_raw(path, m, 3);
    tp_free(p);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    if ((uint64_t)sb.st_blocks * 512 > (64u << 20)) {
        fprintf(stderr, "skip: %s is not sparse on this filesystem\n", dir);
        pi2t_rmtree(dir);
        skip();
    }
    uint64_t before = vm_rss();
    pi2_st *st = pi2t_st_open_ok(path);
    uint64_t after = vm_rss();
    if (getenv("PI2_EMULATED")) /* qemu-user's own code cache counts in the RSS */
        fprintf(stderr, "skip: the RSS bound under emulation\n");
    else
        assert_true(after < before + (32u << 20)); /* nothing of the 9 GiB was read */
    const pi2_st_tensor *t = pi2_st_at(st, 0);
    assert_int_equal(t->nbytes, big);
    assert_int_equal(t->shape[0], size[0]);
    assert_true(in_file_mapping(t->data, t->nbytes, path));
    assert_true(pi2_st_get_f32(t, t->nelem - 1) == 0.0f); /* one page of the hole */
    pi2_st_close(st);

    /* a data.pkl above the cap is refused before it is read */
    zm m2[2] = { { "A/data.pkl", NULL, PI2_TZ_MAX_PICKLE + 1ull }, { "A/version", "3\n", 2 } };
    write_zip_raw(path, m2, 2);
    expect_fail_path(path, PI2_ERANGE, "A/data.pkl' is 67108865 bytes (limit 67108864)");
    pi2t_rmtree(dir);
}

/* ---- what torch really writes, beyond the writer's shape ---- */

static void test_torch_pickle_variants(void **state)
{
    (void)state;
    char dir[64], path[160];
    pi2t_tmpdir(dir, sizeof dir);
    size_t s24 = 24;

    /* module.state_dict(): an OrderedDict with _metadata set by BUILD,
     * memoized values fetched again, a Parameter */
    tp *p = tp_new();
    TPS(p, "\x80\x02");
    tp_global(p, "collections", "OrderedDict");
    TPS(p, "q\x00)Rq\x01(");
    tp_str(p, "fc1.weight");
    TPS(p, "q\x02");
    tp_t23(p);
    TPS(p, "q\x03");
    tp_str(p, "fc2.weight");
    tp_global(p, "torch._utils", "_rebuild_parameter");
    tp_op(p, '(');
    tp_t23(p); /* the same storage "0" again: shared */
    tp_op(p, 0x88);
    tp_hooks(p);
    tp_op(p, 't');
    tp_op(p, 'R');
    tp_op(p, 'u');
    /* state: {'_metadata': OrderedDict({'': {'version': 1}, 'fc1': {'version': 1}})} */
    tp_op(p, '}');
    tp_str(p, "_metadata");
    TPS(p, "h\x00)R(");
    tp_str(p, "");
    tp_op(p, '}');
    tp_str(p, "version");
    TPS(p, "K\x01s");
    tp_str(p, "fc1");
    tp_op(p, '}');
    tp_str(p, "version");
    TPS(p, "K\x01su");
    tp_op(p, 's');
    tp_op(p, 'b');
    tp_op(p, '.');
    write_ckpt(path, sizeof path, dir, "sd.pt", p, 1, &s24);
    tp_free(p);
    pi2_st *st = pi2t_st_open_ok(path);
    assert_int_equal(pi2_st_count(st), 2);
    assert_ptr_equal(pi2_st_find(st, "fc1.weight")->data, pi2_st_find(st, "fc2.weight")->data);
    pi2_st_close(st);

    /* protocol 4: FRAME, SHORT_BINUNICODE, MEMOIZE, STACK_GLOBAL; a view at
     * storage_offset 2 with size-1 dims of any stride; LONG1; metadata None
     * and {}; location cuda:0 */
    p = tp_new();
    TPS(p, "\x80\x04\x95");
    uint8_t fl[8] = { 0 };
    tp_raw(p, fl, 8); /* patched below */
    size_t frame_at = p->n;
    TPS(p, "}\x94");
    TPS(p, "\x8c\x01v\x94");
    TPS(p, "\x8c\x0ctorch._utils\x94\x8c\x12_rebuild_tensor_v2\x94\x93\x94");
    tp_op(p, '(');
    tp_op(p, '(');
    TPS(p, "\x8c\x07storage\x94");
    TPS(p, "\x8c\x05torch\x94\x8c\x0c" "FloatStorage\x94\x93\x94");
    TPS(p, "\x8c\x01" "0\x94\x8c\x06" "cuda:0\x94");
    TPS(p, "\x8a\x01\x06t\x94Q"); /* numel 6 as LONG1 */
    TPS(p, "K\x02(K\x01K\x02K\x01t(K\x07K\x01K\x63t\x89");
    tp_op(p, '}'); /* backward_hooks: an empty plain dict */
    tp_op(p, 'N');
    TPS(p, "t\x94R\x94s.");
    uint64_t flen = p->n - frame_at;
    for (int i = 0; i < 8; i++)
        p->b[frame_at - 8 + i] = (uint8_t)(flen >> (8 * i));
    write_ckpt(path, sizeof path, dir, "p4.pt", p, 1, &s24);
    tp_free(p);
    st = pi2t_st_open_ok(path);
    const pi2_st_tensor *t = pi2_st_find(st, "v");
    assert_non_null(t);
    assert_int_equal(t->ndim, 3);
    assert_int_equal(t->nelem, 2);
    assert_int_equal(t->shape[1], 2);
    assert_int_equal(((const uint8_t *)t->data)[0], pat(0, 8)); /* 2 floats in */
    pi2_st_close(st);
    pi2t_rmtree(dir);
}

/* ---- writer errors ---- */

static void test_writer_errors(void **state)
{
    (void)state;
    char dir[64], path[160];
    pi2t_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/w.pt", dir);
    pi2_tz_writer *w;
    pi2_err e = { 0 };
    int64_t sh[2] = { 2, 2 }, neg = -1;
    assert_int_equal(pi2_tz_writer_create(&w, path, &e), 0);
    assert_int_equal(pi2_tz_writer_add(w, "a", PI2_DT_F32, 2, sh, &e), 0);
    pi2_err_clear(&e);
    assert_int_equal(pi2_tz_writer_add(w, "a", PI2_DT_F32, 2, sh, &e), PI2_EINVAL);
    assert_non_null(strstr(e.msg, "duplicate tensor 'a'"));
    pi2_err_clear(&e);
    assert_int_equal(pi2_tz_writer_add(w, "", PI2_DT_F32, 2, sh, &e), PI2_EINVAL);
    pi2_err_clear(&e);
    assert_int_equal(pi2_tz_writer_add(w, "bad\xff", PI2_DT_F32, 2, sh, &e), PI2_EINVAL);
    pi2_err_clear(&e);
    assert_int_equal(pi2_tz_writer_add(w, "b", (pi2_dtype)42, 2, sh, &e), PI2_EINVAL);
    pi2_err_clear(&e);
    assert_int_equal(pi2_tz_writer_add(w, "b", PI2_DT_F32, 1, &neg, &e), PI2_EINVAL);
    pi2_err_clear(&e);
    assert_int_equal(pi2_tz_writer_add(w, "b", PI2_DT_F32, 9, sh, &e), PI2_EINVAL);
    int64_t huge[2] = { INT64_MAX, 4 };
    pi2_err_clear(&e);
    assert_int_equal(pi2_tz_writer_add(w, "b", PI2_DT_F32, 2, huge, &e), PI2_ERANGE);
    float f[4] = { 0 };
    assert_int_equal(pi2_tz_writer_write(w, f, 8, &e), 0);
    pi2_err_clear(&e);
    assert_int_equal(pi2_tz_writer_add(w, "c", PI2_DT_F32, 2, sh, &e), PI2_EINVAL);
    pi2_err_clear(&e);
    assert_int_equal(pi2_tz_writer_finish(w, &e), PI2_EINVAL); /* 8 of 16 bytes */
    assert_non_null(strstr(e.msg, "8 of 16"));
    assert_false(pi2t_exists(path));

    assert_int_equal(pi2_tz_writer_create(&w, path, &e), 0);
    assert_int_equal(pi2_tz_writer_add(w, "a", PI2_DT_F32, 2, sh, &e), 0);
    pi2_err_clear(&e);
    assert_int_equal(pi2_tz_writer_write(w, f, 20, &e), PI2_EINVAL);
    pi2_err_clear(&e);
    assert_int_equal(pi2_tz_writer_write(w, f, 4, &e), PI2_EINVAL); /* poisoned */
    pi2_tz_writer_free(w);
    assert_false(pi2t_exists(path));

    /* a full disk leaves nothing behind */
    pi2_afile_fail_after(100);
    pi2_tz_item it = { "a", PI2_DT_F32, 2, { 2, 2 }, f };
    pi2_err_clear(&e);
    assert_int_equal(pi2_tz_write(path, 1, &it, &e), PI2_ENOSPC);
    pi2_afile_fail_after(-1);
    assert_int_equal(pi2t_count_entries(dir), 0); /* no temp file either */

    const char *names[2] = { "x/a", "x/a" };
    const void *data[2] = { "1", "2" };
    size_t sizes[2] = { 1, 1 };
    pi2_err_clear(&e);
    assert_int_equal(pi2_tz_write_members(path, 2, names, data, sizes, &e), PI2_EINVAL);
    assert_false(pi2t_exists(path));
    pi2t_rmtree(dir);
}

/* ---- hostile pickles ---- */

static void test_refused_globals_and_opcodes(void **state)
{
    (void)state;
    char dir[64];
    pi2t_tmpdir(dir, sizeof dir);
    size_t s24 = 24;

    /* os.system("ls") */
    tp *p = tp_new();
    TPS(p, "\x80\x02");
    tp_global(p, "os", "system");
    tp_str(p, "ls");
    TPS(p, "\x85R.");
    expect_pkl_fail(dir, p, 0, NULL, PI2_EUNSUPPORTED, "A/data.pkl byte 2: refused global 'os.system'");
    p = tp_new();
    TPS(p, "\x80\x04");
    TPS(p, "\x8c\x08" "builtins\x8c\x04" "eval\x93");
    expect_pkl_fail(dir, p, 0, NULL, PI2_EUNSUPPORTED, "byte 18: refused global 'builtins.eval'");
    p = tp_new();
    TPS(p, "\x80\x02");
    tp_global(p, "torch", "DoubleStorage");
    expect_pkl_fail(dir, p, 0, NULL, PI2_EUNSUPPORTED, "storage type torch.DoubleStorage has no pi2 dtype");
    p = tp_new();
    TPS(p, "\x80\x02");
    tp_global(p, "torch\x01", "x\x7f");
    expect_pkl_fail(dir, p, 0, NULL, PI2_EUNSUPPORTED, "refused global 'torch?.x?'");

    /* REDUCE of an allowed global that is not a callable we run */
    p = tp_new();
    TPS(p, "\x80\x02");
    tp_global(p, "torch", "FloatStorage");
    TPS(p, "K\x05\x85R.");
    expect_pkl_fail(dir, p, 0, NULL, PI2_EUNSUPPORTED, "REDUCE of torch.FloatStorage");
    p = tp_new();
    TPS(p, "\x80\x02");
    tp_str(p, "f");
    TPS(p, ")R.");
    expect_pkl_fail(dir, p, 0, NULL, PI2_EUNSUPPORTED, "REDUCE of a str");
    p = tp_new();
    TPS(p, "\x80\x02");
    tp_global(p, "collections", "OrderedDict");
    TPS(p, "]\x85R.");
    expect_pkl_fail(dir, p, 0, NULL, PI2_EUNSUPPORTED, "OrderedDict called with 1 arguments");

    /* unknown opcodes */
    p = tp_new();
    TPS(p, "\x80\x02(ios\nsystem\n.");
    expect_pkl_fail(dir, p, 0, NULL, PI2_EUNSUPPORTED, "byte 3: refused opcode INST (0x69)");
    p = tp_new();
    TPS(p, "\x80\x02}\xff.");
    expect_pkl_fail(dir, p, 0, NULL, PI2_EUNSUPPORTED, "byte 3: refused opcode 0xff (not a pickle opcode)");
    p = tp_new();
    TPS(p, "\x80\x02G\x3f\xf0\0\0\0\0\0\0.");
    expect_pkl_fail(dir, p, 0, NULL, PI2_EUNSUPPORTED, "refused opcode BINFLOAT");
    p = tp_new();
    TPS(p, "\x80\x02}\x81.");
    expect_pkl_fail(dir, p, 0, NULL, PI2_EUNSUPPORTED, "refused opcode NEWOBJ");
    p = tp_new();
    TPS(p, "\x80\x06}.");
    expect_pkl_fail(dir, p, 0, NULL, PI2_EUNSUPPORTED, "pickle protocol 6");

    /* BUILD anywhere but an OrderedDict's attributes */
    p = tp_new();
    TPS(p, "\x80\x02}}b.");
    expect_pkl_fail(dir, p, 0, NULL, PI2_EUNSUPPORTED, "BUILD on a plain dict");
    p = tp_new();
    TPS(p, "\x80\x02");
    tp_global(p, "collections", "OrderedDict");
    TPS(p, ")R]b.");
    expect_pkl_fail(dir, p, 0, NULL, PI2_EUNSUPPORTED, "BUILD of an OrderedDict with a list state");

    /* persistent ids that are not storages */
    p = tp_new();
    TPS(p, "\x80\x02");
    tp_str(p, "file:///etc/passwd");
    TPS(p, "Q.");
    expect_pkl_fail(dir, p, 0, NULL, PI2_EUNSUPPORTED, "persistent id is a str, not a storage tuple");
    p = tp_new();
    TPS(p, "\x80\x02(");
    tp_str(p, "module");
    TPS(p, "tQ.");
    expect_pkl_fail(dir, p, 0, NULL, PI2_EUNSUPPORTED, "persistent id of type 'module'");

    /* tensors pi2 will not take */
    p = tp_new();
    TPS(p, "\x80\x02}");
    tp_str(p, "t");
    {
        int64_t size[2] = { 2, 3 }, stride[2] = { 1, 2 };
        tp_tensor(p, "FloatStorage", "0", 6, 0, 2, size, stride);
    }
    TPS(p, "s.");
    expect_pkl_fail(dir, p, 1, &s24, PI2_EUNSUPPORTED, "tensor of size [2, 3] is not contiguous (stride [1, 2])");
    p = tp_new();
    TPS(p, "\x80\x02}");
    tp_str(p, "t");
    tp_global(p, "torch._utils", "_rebuild_tensor_v2");
    tp_op(p, '(');
    tp_storage(p, "FloatStorage", "0", 6);
    TPS(p, "K\x00(K\x06t(K\x01t\x89}");
    tp_str(p, "hook");
    TPS(p, "NstR");
    TPS(p, "s.");
    expect_pkl_fail(dir, p, 1, &s24, PI2_EUNSUPPORTED, "tensor has backward hooks");
    p = tp_new();
    TPS(p, "\x80\x02}");
    tp_str(p, "t");
    tp_global(p, "torch._utils", "_rebuild_tensor_v2");
    tp_op(p, '(');
    tp_storage(p, "FloatStorage", "0", 6);
    TPS(p, "K\x00(K\x06t(K\x01t\x89}}");
    tp_str(p, "conj_bit");
    TPS(p, "\x88stR");
    TPS(p, "s.");
    expect_pkl_fail(dir, p, 1, &s24, PI2_EUNSUPPORTED, "metadata (conjugate or negative bit)");

    /* big-endian storages */
    {
        tp *q = tp_simple("w");
        char path[256];
        snprintf(path, sizeof path, "%s/be.pt", dir);
        uint8_t st0[24] = { 0 };
        const char *names[4] = { "A/data.pkl", "A/byteorder", "A/data/0", "A/version" };
        const void *data[4] = { q->b, "big", st0, "3\n" };
        size_t sizes[4] = { q->n, 3, 24, 2 };
        pi2_err e = { 0 };
        assert_int_equal(pi2_tz_write_members(path, 4, names, data, sizes, &e), 0);
        expect_fail_path(path, PI2_EUNSUPPORTED, "big-endian");
        data[1] = "middle";
        sizes[1] = 6;
        assert_int_equal(pi2_tz_write_members(path, 4, names, data, sizes, &e), 0);
        expect_fail_path(path, PI2_EFORMAT, "byteorder member holds 'middle'");
        tp_free(q);
    }
    pi2t_rmtree(dir);
}

static void test_lying_pickles(void **state)
{
    (void)state;
    char dir[64];
    pi2t_tmpdir(dir, sizeof dir);
    size_t s24 = 24;
    tp *p;

    /* storages */
    p = tp_new();
    TPS(p, "\x80\x02}");
    tp_str(p, "t");
    {
        static const int64_t size[2] = { 2, 3 }, stride[2] = { 3, 1 };
        tp_tensor(p, "FloatStorage", "7", 6, 0, 2, size, stride);
    }
    TPS(p, "s.");
    expect_pkl_fail(dir, p, 1, &s24, PI2_EFORMAT, "storage '7': member 'A/data/7' is missing");
    p = tp_new();
    TPS(p, "\x80\x02}");
    tp_str(p, "t");
    {
        static const int64_t size[1] = { 4 }, stride[1] = { 1 };
        tp_tensor(p, "FloatStorage", "0", (int64_t)1 << 62, 0, 1, size, stride);
    }
    TPS(p, "s.");
    expect_pkl_fail(dir, p, 1, &s24, PI2_ERANGE, "storage '0': 4611686018427387904 elements of FloatStorage overflow");
    p = tp_new();
    TPS(p, "\x80\x02}");
    tp_str(p, "t");
    {
        static const int64_t size[1] = { 4 }, stride[1] = { 1 };
        tp_tensor(p, "FloatStorage", "0", 1000000, 0, 1, size, stride);
    }
    TPS(p, "s.");
    expect_pkl_fail(dir, p, 1, &s24, PI2_EFORMAT,
                    "FloatStorage of 1000000 elements needs 4000000 bytes but member 'A/data/0' holds 24");
    p = tp_new();
    TPS(p, "\x80\x02}(");
    tp_str(p, "a");
    tp_t23(p);
    tp_str(p, "b");
    {
        static const int64_t size[1] = { 12 }, stride[1] = { 1 };
        tp_tensor(p, "HalfStorage", "0", 12, 0, 1, size, stride);
    }
    TPS(p, "u.");
    expect_pkl_fail(dir, p, 1, &s24, PI2_EFORMAT, "storage '0' declared again as HalfStorage of 12 elements");

    /* tensors against their storage */
    p = tp_new();
    TPS(p, "\x80\x02}");
    tp_str(p, "t");
    {
        static const int64_t size[2] = { 2, 3 }, stride[2] = { 3, 1 };
        tp_tensor(p, "FloatStorage", "0", 6, 1, 2, size, stride);
    }
    TPS(p, "s.");
    expect_pkl_fail(dir, p, 1, &s24, PI2_EFORMAT,
                    "tensor of 6 elements at storage_offset 1 runs past the end of its storage 'A/data/0'");
    p = tp_new();
    TPS(p, "\x80\x02}");
    tp_str(p, "t");
    {
        static const int64_t size[2] = { -1, 3 }, stride[2] = { 3, 1 };
        tp_tensor(p, "FloatStorage", "0", 6, 0, 2, size, stride);
    }
    TPS(p, "s.");
    expect_pkl_fail(dir, p, 1, &s24, PI2_EFORMAT, "negative tensor size -1 in dim 0");
    p = tp_new();
    TPS(p, "\x80\x02}");
    tp_str(p, "t");
    {
        static const int64_t size[3] = { (int64_t)1 << 40, (int64_t)1 << 40, 0 }, stride[3] = { 0, 0, 1 };
        tp_tensor(p, "FloatStorage", "0", 6, 0, 3, size, stride);
    }
    TPS(p, "s.");
    expect_pkl_fail(dir, p, 1, &s24, PI2_ERANGE, "tensor element count overflows");
    p = tp_new();
    TPS(p, "\x80\x02}");
    tp_str(p, "t");
    {
        static const int64_t size[2] = { 2, 3 }, stride[2] = { 3, 1 };
        tp_tensor(p, "FloatStorage", "0", 6, -2, 2, size, stride);
    }
    TPS(p, "s.");
    expect_pkl_fail(dir, p, 1, &s24, PI2_EFORMAT, "tensor storage_offset is negative");
    p = tp_new();
    TPS(p, "\x80\x02}");
    tp_str(p, "t");
    {
        static const int64_t size[9] = { 1, 1, 1, 1, 1, 1, 1, 1, 6 }, stride[9] = { 6, 6, 6, 6, 6, 6, 6, 6, 1 };
        tp_tensor(p, "FloatStorage", "0", 6, 0, 9, size, stride);
    }
    TPS(p, "s.");
    expect_pkl_fail(dir, p, 1, &s24, PI2_ERANGE, "tensor has 9 dims (limit 8)");
    p = tp_new();
    TPS(p, "\x80\x02}");
    tp_str(p, "t");
    {
        static const int64_t size[2] = { 2, 3 }, stride[1] = { 1 };
        tp_global(p, "torch._utils", "_rebuild_tensor_v2");
        tp_op(p, '(');
        tp_storage(p, "FloatStorage", "0", 6);
        tp_int(p, 0);
        tp_ints(p, 2, size);
        tp_ints(p, 1, stride);
        tp_op(p, 0x89);
        tp_hooks(p);
        TPS(p, "tR");
    }
    TPS(p, "s.");
    expect_pkl_fail(dir, p, 1, &s24, PI2_EFORMAT, "tensor size has 2 dims but its stride 1");

    /* the machine itself */
    p = tp_new();
    TPS(p, "\x80\x02}h\x32.");
    expect_pkl_fail(dir, p, 0, NULL, PI2_EFORMAT, "byte 3: memo index 50 out of range (0 entries)");
    p = tp_new();
    TPS(p, "\x80\x02}r\x05\0\0\0.");
    expect_pkl_fail(dir, p, 0, NULL, PI2_EFORMAT, "memo index 5 skips past the memo's 0 entries");
    p = tp_new();
    TPS(p, "\x80\x02s.");
    expect_pkl_fail(dir, p, 0, NULL, PI2_EFORMAT, "byte 2: stack underflow: SETITEM needs 3 values, 0 above");
    p = tp_new();
    TPS(p, "\x80\x02}N(\x86.");
    expect_pkl_fail(dir, p, 0, NULL, PI2_EFORMAT, "stack underflow: TUPLE2 needs 2 values, 0 above the last MARK");
    p = tp_new();
    TPS(p, "\x80\x02}(K\x01u.");
    expect_pkl_fail(dir, p, 0, NULL, PI2_EFORMAT, "SETITEMS with an odd number (1) of values");
    p = tp_new();
    TPS(p, "\x80\x02(K\x01u.");
    expect_pkl_fail(dir, p, 0, NULL, PI2_EFORMAT, "SETITEMS has no dict under its MARK");
    p = tp_new();
    TPS(p, "\x80\x02t.");
    expect_pkl_fail(dir, p, 0, NULL, PI2_EFORMAT, "stack underflow: TUPLE without a MARK");
    p = tp_new();
    TPS(p, "\x80\x02");
    for (int i = 0; i < PI2_TZ_MAX_MARKS + 1; i++)
        tp_op(p, '(');
    tp_op(p, '.');
    expect_pkl_fail(dir, p, 0, NULL, PI2_ERANGE, "more than 64 nested MARKs");
    p = tp_new();
    TPS(p, "\x80\x02");
    for (unsigned i = 0; i < PI2_TZ_MAX_STACK + 1; i++)
        tp_op(p, 'N');
    tp_op(p, '.');
    expect_pkl_fail(dir, p, 0, NULL, PI2_ERANGE, "more than 65536 values on the stack");
    p = tp_new();
    TPS(p, "\x80\x02]((((tttta(]]]e.");
    expect_pkl_fail(dir, p, 0, NULL, PI2_EUNSUPPORTED, "the pickle holds a list, not a dict of name -> tensor");
    /* a tuple far larger than the item store so far, inside the top level */
    p = tp_new();
    TPS(p, "\x80\x02}");
    tp_str(p, "t");
    tp_op(p, '(');
    for (int i = 0; i < 5000; i++)
        tp_op(p, 'N');
    TPS(p, "ts.");
    expect_pkl_fail(dir, p, 0, NULL, PI2_EUNSUPPORTED, "entry 't' is a tuple, not a tensor");
    /* the budgets: dict items, memo entries */
    p = tp_new();
    TPS(p, "\x80\x02}");
    for (unsigned i = 0; i < PI2_TZ_MAX_OBJECTS; i++)
        TPS(p, "NNs");
    tp_op(p, '.');
    expect_pkl_fail(dir, p, 0, NULL, PI2_ERANGE, "more than 4194304 pickle objects");
    p = tp_new();
    TPS(p, "\x80\x04}");
    for (unsigned i = 0; i <= PI2_TZ_MAX_MEMO; i++)
        tp_op(p, 0x94);
    tp_op(p, '.');
    expect_pkl_fail(dir, p, 0, NULL, PI2_ERANGE, "more than 4194304 memo entries");
    p = tp_new();
    TPS(p, "\x80\x02}N.");
    expect_pkl_fail(dir, p, 0, NULL, PI2_EFORMAT, "STOP with 2 values on the stack, not 1");
    p = tp_new();
    TPS(p, "\x80\x02(}.");
    expect_pkl_fail(dir, p, 0, NULL, PI2_EFORMAT, "STOP with 1 open MARKs");
    p = tp_new();
    TPS(p, "\x80\x02}.junk");
    expect_pkl_fail(dir, p, 0, NULL, PI2_EFORMAT, "4 bytes after STOP");
    p = tp_new();
    TPS(p, "\x80\x02}");
    expect_pkl_fail(dir, p, 0, NULL, PI2_EFORMAT, "byte 3: data.pkl ends without STOP");
    p = tp_new();
    TPS(p, "\x80\x02X\x10\0\0\0abc");
    expect_pkl_fail(dir, p, 0, NULL, PI2_EFORMAT, "BINUNICODE operand runs past the end of data.pkl");
    p = tp_new();
    TPS(p, "\x80\x02X\x01\0\x01\0");
    expect_pkl_fail(dir, p, 0, NULL, PI2_ERANGE, "string of 65537 bytes (limit 65536)");
    p = tp_new();
    TPS(p, "\x80\x02X\x02\0\0\0\xc3\x28.");
    expect_pkl_fail(dir, p, 0, NULL, PI2_EFORMAT, "string is not valid UTF-8");
    p = tp_new();
    TPS(p, "\x80\x02\x8a\x09\0\0\0\0\0\0\0\0\x01.");
    expect_pkl_fail(dir, p, 0, NULL, PI2_ERANGE, "integer of 9 bytes (limit 8)");
    p = tp_new();
    TPS(p, "\x80\x04\x95\x00\x10\0\0\0\0\0\0}.");
    expect_pkl_fail(dir, p, 0, NULL, PI2_EFORMAT, "FRAME of 4096 bytes runs past the end");
    p = tp_new();
    TPS(p, "\x80\x02}}}s.");
    expect_pkl_fail(dir, p, 0, NULL, PI2_EFORMAT, "unhashable dict key (a dict)");
    p = tp_new();
    TPS(p, "\x80\x02]K\x01K\x02s.");
    expect_pkl_fail(dir, p, 0, NULL, PI2_EFORMAT, "SETITEM on a list");

    /* the top level */
    p = tp_new();
    TPS(p, "\x80\x02}(");
    tp_str(p, "w");
    tp_t23(p);
    tp_str(p, "w");
    tp_t23(p);
    TPS(p, "u.");
    expect_pkl_fail(dir, p, 1, &s24, PI2_EFORMAT, "duplicate key 'w'");
    p = tp_new();
    TPS(p, "\x80\x02");
    tp_t23(p);
    tp_op(p, '.');
    expect_pkl_fail(dir, p, 1, &s24, PI2_EUNSUPPORTED, "the pickle holds a tensor, not a dict");
    p = tp_new();
    TPS(p, "\x80\x02}");
    tp_str(p, "state_dict");
    tp_op(p, '}');
    tp_str(p, "w");
    tp_t23(p);
    TPS(p, "ss.");
    expect_pkl_fail(dir, p, 1, &s24, PI2_EUNSUPPORTED, "entry 'state_dict' is a dict, not a tensor");
    p = tp_new();
    TPS(p, "\x80\x02}K\x01");
    tp_t23(p);
    TPS(p, "s.");
    expect_pkl_fail(dir, p, 1, &s24, PI2_EUNSUPPORTED, "top-level key is a int, not a name");
    p = tp_new();
    TPS(p, "\x80\x02}X\x03\0\0\0a\0b");
    tp_t23(p);
    TPS(p, "s.");
    expect_pkl_fail(dir, p, 1, &s24, PI2_EFORMAT, "top-level key 'a?b' holds a NUL");
    pi2t_rmtree(dir);
}

/* ---- hostile zips ---- */

static uint8_t *good_image(const char *dir, size_t *len, char *path, size_t cap)
{
    snprintf(path, cap, "%s/good.pt", dir);
    float d[6] = { 1, 2, 3, 4, 5, 6 };
    pi2_tz_item it[2] = { { "a", PI2_DT_F32, 2, { 2, 3 }, d }, { "b", PI2_DT_F32, 1, { 4 }, d } };
    pi2_err e = { 0 };
    assert_int_equal(pi2_tz_write(path, 2, it, &e), 0);
    return read_all(path, len);
}

static void expect_img_fail(const uint8_t *b, size_t len, int code, const char *substr)
{
    uint8_t *exact = malloc(len ? len : 1);
    memcpy(exact, b, len);
    pi2_st *st = (pi2_st *)1;
    pi2_err e = { 0 };
    int rc = pi2_st_open_buffer(&st, exact, len, "img", &e);
    if (rc != code || !strstr(e.msg, substr))
        fprintf(stderr, "expected %d '%s', got %d '%s'\n", code, substr, rc, e.msg);
    assert_int_equal(rc, code);
    assert_null(st);
    assert_non_null(strstr(e.msg, substr));
    assert_int_equal(strncmp(e.msg, "img: ", 5), 0);
    assert_null(strchr(e.msg, '\n'));
    free(exact);
}

/* Offset of the central (sig "PK\1\2") or local ("PK\3\4") header naming `name`. */
static size_t find_hdr(const uint8_t *b, size_t len, uint8_t kind, const char *name)
{
    size_t nl = strlen(name), name_at = kind == 1 ? 46 : 30, len_at = kind == 1 ? 28 : 26;
    for (size_t i = 0; i + name_at + nl <= len; i++)
        if (b[i] == 'P' && b[i + 1] == 'K' && b[i + 2] == kind && b[i + 3] == kind + 1 &&
            (size_t)(b[i + len_at] | b[i + len_at + 1] << 8) == nl && memcmp(b + i + name_at, name, nl) == 0)
            return i;
    fail_msg("no header for %s", name);
    return 0;
}

static void test_truncated_and_corrupt_zip(void **state)
{
    (void)state;
    char dir[64], path[160];
    pi2t_tmpdir(dir, sizeof dir);
    size_t len;
    uint8_t *g = good_image(dir, &len, path, sizeof path);
    pi2_st *st;
    pi2_err e = { 0 };
    assert_int_equal(pi2_st_open_buffer(&st, g, len, "img", &e), 0);
    pi2_st_close(st);

    /* every cut point: refused, never a crash */
    for (size_t cut = 0; cut < len; cut++) {
        uint8_t *b = malloc(cut ? cut : 1);
        memcpy(b, g, cut);
        st = (pi2_st *)1;
        pi2_err_clear(&e);
        int rc = pi2_st_open_buffer(&st, b, cut, "img", &e);
        assert_int_equal(rc, PI2_EFORMAT);
        assert_null(st);
        assert_int_equal(strncmp(e.msg, "img: ", 5), 0);
        free(b);
    }
    expect_img_fail(g, 4, PI2_EFORMAT, "4 bytes, too short for a zip");
    expect_img_fail(g, len - 1, PI2_EFORMAT, "no zip end of central directory record");
    expect_img_fail(g, len / 2, PI2_EFORMAT, "no zip end of central directory record");
    expect_img_fail(g, 200, PI2_EFORMAT, "no zip end of central directory record");

    uint8_t *b = malloc(len);
    size_t eocd = len - 22, loc = eocd - 20, z64 = loc - 56;
    size_t cd_pkl = find_hdr(g, len, 1, "good/data.pkl"), cd_d0 = find_hdr(g, len, 1, "good/data/0");
    size_t lh_d0 = find_hdr(g, len, 3, "good/data/0");
#define MUT(stmt, code, substr)                 \
    do {                                        \
        memcpy(b, g, len);                      \
        stmt;                                   \
        expect_img_fail(b, len, code, substr);  \
    } while (0)
    MUT(b[cd_pkl] = 'X', PI2_EFORMAT, "central directory entry 0 (byte");
    MUT(b[cd_d0 + 1] = 'X', PI2_EFORMAT, "has a bad signature");
    MUT(b[eocd + 16]++, PI2_EFORMAT, "zip64 end record disagrees with the end of central directory");
    MUT((b[z64 + 48]++, b[eocd + 16]++), PI2_EFORMAT, "does not end where the end records start");
    MUT((b[z64 + 32]++, b[eocd + 10]++), PI2_EFORMAT, "members on this disk but");
    MUT((b[z64 + 24] = b[z64 + 32] = b[eocd + 8] = b[eocd + 10] = 200), PI2_EFORMAT, "cannot hold 200 entries");
    MUT(b[loc + 8] = 0xff, PI2_EFORMAT, "zip64 locator points at byte");
    MUT(b[loc + 16] = 2, PI2_EUNSUPPORTED, "multi-disk zip");
    MUT((b[loc] = 0, b[eocd + 16] = 0xff, b[eocd + 17] = 0xff, b[eocd + 18] = 0xff, b[eocd + 19] = 0xff),
        PI2_EFORMAT, "zip64 markers but no zip64 locator");
    MUT(b[cd_d0 + 42] += 4, PI2_EFORMAT, "member 'good/data/0': no local header at byte");
    MUT(b[cd_d0 + 46 + 10] = '9', PI2_EFORMAT, "disagrees with the central directory on its name");
    MUT(b[lh_d0 + 30 + 10] = '9', PI2_EFORMAT, "disagrees with the central directory on its name");
    MUT(b[lh_d0 + 6] ^= 8, PI2_EFORMAT, "disagrees with the central directory on its flags");
    MUT(b[cd_d0 + 24]++, PI2_EFORMAT, "stored member 'good/data/0' has 24 bytes in the file but a size of 25");
    MUT((b[cd_d0 + 21] += 0x10, b[cd_d0 + 25] += 0x10), PI2_EFORMAT, "run past the central directory");
    MUT((b[cd_d0 + 20] += 90, b[cd_d0 + 24] += 90), PI2_EFORMAT, "overlap");
    MUT(b[lh_d0 + 18] = 7, PI2_EFORMAT, "disagrees with the central directory on its CRC or sizes");
    MUT((b[cd_d0 + 8] |= 1, b[lh_d0 + 6] |= 1), PI2_EUNSUPPORTED, "member 'good/data/0' is encrypted");
    MUT(b[cd_d0 + 30] = 3, PI2_EFORMAT, "malformed extra field in the central directory");
    MUT((b[cd_d0 + 28] = 0, b[cd_d0 + 29] = 0x20), PI2_EFORMAT, "runs past the directory");
    /* compressed members: a storage, data.pkl */
    MUT((b[cd_d0 + 10] = 8, b[lh_d0 + 8] = 8), PI2_EUNSUPPORTED,
        "storage '0': member 'good/data/0' is compressed (method 8");
    size_t lh_pkl = find_hdr(g, len, 3, "good/data.pkl");
    MUT((b[cd_pkl + 10] = 8, b[lh_pkl + 8] = 8), PI2_EUNSUPPORTED, "member 'good/data.pkl' is compressed");
    /* names: a second data/0, members outside the folder, missing members */
    MUT((b[cd_d0 + 46 + 10] = '1', b[lh_d0 + 30 + 10] = '1'), PI2_EFORMAT, "two members named 'good/data/1'");
    MUT((b[cd_d0 + 46 + 3] = 'x', b[lh_d0 + 30 + 3] = 'x'), PI2_EFORMAT, "is outside the archive folder 'good'");
    MUT((b[cd_pkl + 46 + 5] = 'x', b[lh_pkl + 30 + 5] = 'x'), PI2_EFORMAT, "no member 'good/data.pkl'");
    MUT((b[cd_d0 + 46 + 10] = '7', b[lh_d0 + 30 + 10] = '7'), PI2_EFORMAT, "member 'good/data/0' is missing");
    size_t cd_v = find_hdr(g, len, 1, "good/version"), lh_v = find_hdr(g, len, 3, "good/version");
    MUT((b[cd_v + 46 + 5] = 'x', b[lh_v + 30 + 5] = 'x'), PI2_EFORMAT, "no member 'good/version'");
    size_t v_data = lh_v + 30 + 12 + (size_t)(g[lh_v + 28] | g[lh_v + 29] << 8);
    MUT(b[v_data] = 'x', PI2_EFORMAT, "member 'good/version' does not hold a version number");
    /* a storage whose size disagrees with the pickle */
    MUT((b[cd_d0 + 20] -= 4, b[cd_d0 + 24] -= 4), PI2_EFORMAT, "needs 24 bytes but member 'good/data/0' holds 20");
#undef MUT
    free(b);
    free(g);

    /* flips anywhere: any outcome but a crash */
    g = good_image(dir, &len, path, sizeof path);
    b = malloc(len);
    for (size_t i = 0; i < len; i++) {
        memcpy(b, g, len);
        b[i] ^= (uint8_t)(1u << (i % 8));
        st = NULL;
        pi2_err_clear(&e);
        if (pi2_st_open_buffer(&st, b, len, "img", &e) == 0) {
            for (size_t k = 0; k < pi2_st_count(st); k++) {
                const pi2_st_tensor *t = pi2_st_at(st, k);
                assert_true((const uint8_t *)t->data >= b && (const uint8_t *)t->data + t->nbytes <= b + len);
            }
            pi2_st_close(st);
        } else {
            assert_int_equal(strncmp(e.msg, "img: ", 5), 0);
            assert_null(strchr(e.msg, '\n'));
        }
    }
    free(b);
    free(g);

    /* a legacy torch.save file */
    static const uint8_t legacy[] = { 0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46,
                                      0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, '.' };
    expect_img_fail(legacy, sizeof legacy, PI2_EUNSUPPORTED, "legacy PyTorch file");
    pi2t_rmtree(dir);
}

/* ---- Python's own zipfile and pickle read the writer's output ---- */

static const char oracle_py[] =
    "import sys, zipfile, pickle, collections, io, struct\n"
    "path = sys.argv[1]\n"
    "z = zipfile.ZipFile(path)\n"
    "assert z.testzip() is None\n"
    "raw = open(path, 'rb').read()\n"
    "prefix = z.namelist()[0].split('/')[0]\n"
    "for info in z.infolist():\n"
    "    assert info.compress_type == 0, info.filename\n"
    "    h = info.header_offset\n"
    "    nlen, xlen = struct.unpack('<HH', raw[h + 26:h + 30])\n"
    "    if info.filename.startswith(prefix + '/data/'):\n"
    "        assert (h + 30 + nlen + xlen) % 64 == 0, info.filename\n"
    "class U(pickle.Unpickler):\n"
    "    def find_class(self, mod, name):\n"
    "        if (mod, name) == ('collections', 'OrderedDict'):\n"
    "            return collections.OrderedDict\n"
    "        if (mod, name) == ('torch._utils', '_rebuild_tensor_v2'):\n"
    "            return lambda st, off, size, stride, rg, hooks: (st, off, size, stride, rg, hooks)\n"
    "        if mod == 'torch' and name.endswith('Storage'):\n"
    "            return name\n"
    "        raise pickle.UnpicklingError('refused ' + mod + '.' + name)\n"
    "    def persistent_load(self, pid):\n"
    "        return pid\n"
    "d = U(io.BytesIO(z.read(prefix + '/data.pkl'))).load()\n"
    "assert type(d) is collections.OrderedDict\n"
    "for k, (st, off, size, stride, rg, hooks) in d.items():\n"
    "    kind, typ, key, loc, numel = st\n"
    "    data = z.read(prefix + '/data/' + key)\n"
    "    print(k, kind, typ, key, loc, numel, off, list(size), list(stride), rg, dict(hooks), len(data),\n"
    "          data[:4].hex())\n"
    "print(prefix, repr(z.read(prefix + '/version')), repr(z.read(prefix + '/byteorder')))\n";

static void test_python_oracle(void **state)
{
    (void)state;
    if (access("/usr/bin/python3", X_OK) != 0) {
        fprintf(stderr, "skip: /usr/bin/python3 not found (Python's zipfile and pickle check the writer)\n");
        skip();
    }
    char dir[64], path[160], py[160], out[160], cmd[600];
    pi2t_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/pytorch_model-00001-of-00002.bin", dir);
    snprintf(py, sizeof py, "%s/oracle.py", dir);
    snprintf(out, sizeof out, "%s/out.txt", dir);
    pi2t_write(py, oracle_py, strlen(oracle_py));
    uint8_t d[400];
    for (size_t i = 0; i < sizeof d; i++)
        d[i] = (uint8_t)i;
    pi2_tz_item it[6] = {
        { "model.norm.weight", PI2_DT_F32, 1, { 5 }, d },
        { "big.numel", PI2_DT_U8, 2, { 300, 1 }, d },
        { "four.dims", PI2_DT_BF16, 4, { 1, 2, 3, 4 }, d },
        { "scalar", PI2_DT_I64, 0, { 0 }, d },
        { "empty", PI2_DT_I8, 2, { 3, 0 }, d },
        { "ints", PI2_DT_I32, 1, { 3 }, d },
    };
    pi2_err e = { 0 };
    assert_int_equal(pi2_tz_write(path, 6, it, &e), 0);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s' '%s' > '%s' 2>&1", py, path, out);
    int rc = system(cmd);
    char *text = NULL;
    size_t tl;
    assert_int_equal(pi2_read_file(out, 1 << 20, &text, &tl, &e), 0);
    if (rc != 0)
        fprintf(stderr, "python oracle failed:\n%s\n", text);
    assert_int_equal(rc, 0);
    const char *want =
        "model.norm.weight storage FloatStorage 0 cpu 5 0 [5] [1] False {} 20 00010203\n"
        "big.numel storage ByteStorage 1 cpu 300 0 [300, 1] [1, 1] False {} 300 00010203\n"
        "four.dims storage BFloat16Storage 2 cpu 24 0 [1, 2, 3, 4] [24, 12, 4, 1] False {} 48 00010203\n"
        "scalar storage LongStorage 3 cpu 1 0 [] [] False {} 8 00010203\n"
        "empty storage CharStorage 4 cpu 0 0 [3, 0] [1, 1] False {} 0 \n"
        "ints storage IntStorage 5 cpu 3 0 [3] [1] False {} 12 00010203\n"
        "pytorch_model-00001-of-00002 b'3\\n' b'little'\n";
    if (strcmp(text, want) != 0)
        fprintf(stderr, "python read:\n%s\nexpected:\n%s\n", text, want);
    assert_string_equal(text, want);
    free(text);
    pi2t_rmtree(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_all_dtypes),
        cmocka_unit_test(test_write_from_memory),
        cmocka_unit_test(test_sharded_bin_index),
        cmocka_unit_test(test_predictor_repo),
        cmocka_unit_test(test_read_through_libarchive),
        cmocka_unit_test(test_big_sparse_shard),
        cmocka_unit_test(test_torch_pickle_variants),
        cmocka_unit_test(test_writer_errors),
        cmocka_unit_test(test_refused_globals_and_opcodes),
        cmocka_unit_test(test_lying_pickles),
        cmocka_unit_test(test_truncated_and_corrupt_zip),
        cmocka_unit_test(test_python_oracle),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
