/* Tests for formats/safetensors: writer -> reader round trips (all dtypes,
 * metadata, zero-size tensors, shards), writer refusals and a simulated full
 * disk, and a corruption matrix (truncation, byte flips, handcrafted lying
 * headers) that must fail cleanly with the exact code and a message naming
 * the problem. */
#include "formats/safetensors.h"
#include "tests/testst.h"
#include "tests/testutil.h"

#include <math.h>

/* ---- helpers ---- */

/* A safetensors image: 8-byte length, `hdr` verbatim, then `dlen` data
 * bytes (0, 1, 2, ...). Exactly sized so ASan sees any overread. */
static uint8_t *mk_image_n(uint64_t hlen_field, const char *hdr, size_t dlen, size_t *len)
{
    size_t hl = strlen(hdr);
    *len = 8 + hl + dlen;
    uint8_t *b = malloc(*len ? *len : 1);
    assert_non_null(b);
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(hlen_field >> (8 * i));
    memcpy(b + 8, hdr, hl);
    for (size_t i = 0; i < dlen; i++)
        b[8 + hl + i] = (uint8_t)i;
    return b;
}

static uint8_t *mk_image(const char *hdr, size_t dlen, size_t *len)
{
    return mk_image_n(strlen(hdr), hdr, dlen, len);
}

/* Open must fail with `code` and a one-line message "img: ...substr...". */
static void expect_fail_buf(const uint8_t *b, size_t len, int code, const char *substr)
{
    pi2_st *st = (pi2_st *)1;
    pi2_err e = { 0 };
    int rc = pi2_st_open_buffer(&st, b, len, "img", &e);
    if (rc != code || !strstr(e.msg, substr))
        fprintf(stderr, "expected %d '%s', got %d '%s'\n", code, substr, rc, e.msg);
    assert_int_equal(rc, code);
    assert_int_equal(e.code, code);
    assert_null(st);
    assert_non_null(strstr(e.msg, substr));
    assert_int_equal(strncmp(e.msg, "img: ", 5), 0);
    assert_null(strchr(e.msg, '\n'));
}

static void expect_fail(const char *hdr, size_t dlen, int code, const char *substr)
{
    size_t len;
    uint8_t *b = mk_image(hdr, dlen, &len);
    expect_fail_buf(b, len, code, substr);
    free(b);
}

static pi2_st *open_ok_buf(const void *b, size_t len)
{
    pi2_st *st = NULL;
    pi2_err e = { 0 };
    int rc = pi2_st_open_buffer(&st, b, len, "img", &e);
    if (rc != 0)
        fprintf(stderr, "unexpected failure: %s\n", e.msg);
    assert_int_equal(rc, 0);
    assert_non_null(st);
    return st;
}

static void expect_open_fail(const char *path, int code, const char *substr)
{
    pi2_st *st = (pi2_st *)1;
    pi2_err e = { 0 };
    int rc = pi2_st_open(&st, path, &e);
    if (rc != code || !strstr(e.msg, substr))
        fprintf(stderr, "expected %d '%s', got %d '%s'\n", code, substr, rc, e.msg);
    assert_int_equal(rc, code);
    assert_null(st);
    assert_non_null(strstr(e.msg, substr));
}

/* Byte pattern for tensor k, byte i. */
static uint8_t pat(size_t k, size_t i) { return (uint8_t)(k * 31 + i * 7 + 1); }

/* Write tensors with pat() data, streamed in `chunk`-byte pieces. */
static void write_file(const char *path, size_t n, const pi2t_spec *specs, size_t chunk, const char *meta_k,
                       const char *meta_v)
{
    pi2_st_writer *w;
    pi2_err e = { 0 };
    assert_int_equal(pi2_st_writer_create(&w, path, &e), 0);
    for (size_t k = 0; k < n; k++)
        assert_int_equal(pi2_st_writer_add(w, specs[k].name, specs[k].dt, specs[k].ndim, specs[k].shape, &e), 0);
    if (meta_k)
        assert_int_equal(pi2_st_writer_meta(w, meta_k, meta_v, &e), 0);
    for (size_t k = 0; k < n; k++) {
        size_t nb = pi2t_spec_bytes(&specs[k]);
        uint8_t *buf = malloc(nb + 1);
        assert_non_null(buf);
        for (size_t i = 0; i < nb; i++)
            buf[i] = pat(k, i);
        for (size_t off = 0; off < nb; off += chunk) {
            size_t c = nb - off < chunk ? nb - off : chunk;
            assert_int_equal(pi2_st_writer_write(w, buf + off, c, &e), 0);
        }
        free(buf);
    }
    int rc = pi2_st_writer_finish(w, &e);
    if (rc)
        fprintf(stderr, "%s\n", e.msg);
    assert_int_equal(rc, 0);
}

static void check_tensor(const pi2_st *st, size_t k, const pi2t_spec *s)
{
    const pi2_st_tensor *t = pi2_st_find(st, s->name);
    assert_non_null(t);
    assert_string_equal(t->name, s->name);
    assert_int_equal(t->dtype, s->dt);
    assert_int_equal(t->ndim, s->ndim);
    size_t nelem = 1;
    for (int i = 0; i < s->ndim; i++) {
        assert_int_equal(t->shape[i], s->shape[i]);
        nelem *= (size_t)s->shape[i];
    }
    assert_int_equal(t->nelem, nelem);
    assert_int_equal(t->nbytes, pi2t_spec_bytes(s));
    const uint8_t *d = t->data;
    for (size_t i = 0; i < t->nbytes; i++)
        assert_int_equal(d[i], pat(k, i));
    assert_int_equal(pi2_st_expect_shape(t, s->ndim, s->shape, NULL), 0);
}

/* ---- dtypes ---- */

static void test_dtype_helpers(void **state)
{
    (void)state;
    static const char *names[] = { "F32", "F16", "BF16", "I8", "U8", "I32", "I64" };
    static const size_t sizes[] = { 4, 2, 2, 1, 1, 4, 8 };
    for (int i = 0; i < 7; i++) {
        pi2_dtype dt;
        assert_string_equal(pi2_dtype_name((pi2_dtype)i), names[i]);
        assert_int_equal(pi2_dtype_size((pi2_dtype)i), sizes[i]);
        assert_int_equal(pi2_dtype_parse(names[i], &dt), 0);
        assert_int_equal(dt, i);
    }
    pi2_dtype dt;
    assert_null(pi2_dtype_name((pi2_dtype)7));
    assert_null(pi2_dtype_name((pi2_dtype)-1));
    assert_int_equal(pi2_dtype_size((pi2_dtype)99), 0);
    assert_int_equal(pi2_dtype_parse("F64", &dt), PI2_EUNSUPPORTED);
    assert_int_equal(pi2_dtype_parse("f32", &dt), PI2_EUNSUPPORTED);
    assert_int_equal(pi2_dtype_parse("", &dt), PI2_EUNSUPPORTED);
    assert_int_equal(pi2_dtype_parse(NULL, &dt), PI2_EUNSUPPORTED);
}

/* ---- round trips ---- */

static const pi2t_spec all_dtypes[] = {
    { "f32.w", PI2_DT_F32, 3, { 2, 3, 4 } },
    { "f16.w", PI2_DT_F16, 2, { 5, 3 } },
    { "zero.w", PI2_DT_F32, 2, { 0, 7 } }, /* zero-size in the middle */
    { "bf16.w", PI2_DT_BF16, 1, { 9 } },
    { "i8.w", PI2_DT_I8, 4, { 1, 2, 3, 1 } },
    { "scalar.u8", PI2_DT_U8, 0, { 0 } }, /* 0-dim: one element */
    { "u8.w", PI2_DT_U8, 2, { 3, 3 } },
    { "i32.w", PI2_DT_I32, 8, { 1, 1, 2, 1, 1, 1, 3, 1 } },
    { "i64.w", PI2_DT_I64, 2, { 2, 2 } },
    { "zero.end", PI2_DT_I64, 1, { 0 } }, /* zero-size at the end */
};
#define NALL (sizeof all_dtypes / sizeof all_dtypes[0])

static void test_roundtrip_all_dtypes(void **state)
{
    (void)state;
    char dir[64], path[128];
    pi2t_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_file(path, NALL, all_dtypes, 7, "format", "pt");
    assert_int_equal(pi2t_count_entries(dir), 1); /* no temp file left behind */

    /* open the file, then the directory holding it */
    for (int pass = 0; pass < 2; pass++) {
        pi2_st *st = pi2t_st_open_ok(pass ? dir : path);
        assert_int_equal(pi2_st_count(st), NALL);
        for (size_t k = 0; k < NALL; k++) {
            check_tensor(st, k, &all_dtypes[k]);
            assert_string_equal(pi2_st_at(st, k)->name, all_dtypes[k].name); /* data order kept */
            assert_string_equal(pi2_st_at(st, k)->file, path);
        }
        assert_null(pi2_st_at(st, NALL));
        assert_null(pi2_st_find(st, "missing"));
        assert_null(pi2_st_find(st, "__metadata__"));
        assert_string_equal(pi2_st_metadata(st, "format"), "pt");
        assert_null(pi2_st_metadata(st, "nope"));
        /* the writer pads the header so the data starts 8-aligned */
        const pi2_st_tensor *t = pi2_st_at(st, 0);
        assert_int_equal(((uintptr_t)t->data) % 8, 0);
        pi2_st_close(st);
    }
    pi2_st_close(NULL);
    pi2t_rmtree(dir);
}

static void test_roundtrip_metadata_and_empty(void **state)
{
    (void)state;
    char dir[64], path[128];
    pi2t_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/empty.safetensors", dir);
    pi2_st_writer *w;
    pi2_err e = { 0 };
    assert_int_equal(pi2_st_writer_create(&w, path, &e), 0);
    assert_int_equal(pi2_st_writer_meta(w, "format", "pt", &e), 0);
    assert_int_equal(pi2_st_writer_meta(w, "note", "ünïcode \"quoted\" \\ /", &e), 0);
    assert_int_equal(pi2_st_writer_meta(w, "empty", "", &e), 0);
    assert_int_equal(pi2_st_writer_finish(w, &e), 0); /* no tensors, no data: still a valid file */
    pi2_st *st = pi2t_st_open_ok(path);
    assert_int_equal(pi2_st_count(st), 0);
    assert_null(pi2_st_at(st, 0));
    assert_null(pi2_st_find(st, "x"));
    assert_string_equal(pi2_st_metadata(st, "format"), "pt");
    assert_string_equal(pi2_st_metadata(st, "note"), "ünïcode \"quoted\" \\ /");
    assert_string_equal(pi2_st_metadata(st, "empty"), "");
    pi2_st_close(st);

    /* only zero-size tensors */
    static const pi2t_spec zs[] = { { "a", PI2_DT_F32, 1, { 0 } }, { "b", PI2_DT_BF16, 3, { 4, 0, 2 } } };
    snprintf(path, sizeof path, "%s/zero.safetensors", dir);
    write_file(path, 2, zs, 1, NULL, NULL);
    st = pi2t_st_open_ok(path);
    assert_int_equal(pi2_st_count(st), 2);
    check_tensor(st, 0, &zs[0]);
    check_tensor(st, 1, &zs[1]);
    pi2_st_close(st);
    pi2t_rmtree(dir);
}

static void test_sharded_roundtrip(void **state)
{
    (void)state;
    char dir[64], p1[128], p2[128], idx[160];
    pi2t_tmpdir(dir, sizeof dir);
    static const pi2t_spec s1[] = { { "model.embed.weight", PI2_DT_BF16, 2, { 16, 8 } },
                               { "model.layers.0.w", PI2_DT_F32, 2, { 8, 8 } } };
    static const pi2t_spec s2[] = { { "model.layers.1.w", PI2_DT_F16, 2, { 8, 8 } },
                               { "lm_head.weight", PI2_DT_F32, 2, { 16, 8 } } };
    /* shard 2 written first: order must come from the file names */
    snprintf(p2, sizeof p2, "%s/model-00002-of-00002.safetensors", dir);
    write_file(p2, 2, s2, 100, "format", "second");
    snprintf(p1, sizeof p1, "%s/model-00001-of-00002.safetensors", dir);
    write_file(p1, 2, s1, 3, "format", "first");
    const char *names[] = { "lm_head.weight", "model.embed.weight", "model.layers.0.w", "model.layers.1.w" };
    const char *files[] = { "model-00002-of-00002.safetensors", "model-00001-of-00002.safetensors",
                            "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors" };
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    pi2_err e = { 0 };
    assert_int_equal(pi2_st_write_index(idx, 4, names, files, 1234, &e), 0);
    assert_int_equal(pi2t_count_entries(dir), 3);

    for (int pass = 0; pass < 2; pass++) {
        pi2_st *st = pi2t_st_open_ok(pass ? idx : dir);
        assert_int_equal(pi2_st_count(st), 4);
        check_tensor(st, 0, &s1[0]);
        check_tensor(st, 1, &s1[1]);
        check_tensor(st, 0, &s2[0]);
        check_tensor(st, 1, &s2[1]);
        /* by shard, then by offset */
        assert_string_equal(pi2_st_at(st, 0)->name, "model.embed.weight");
        assert_string_equal(pi2_st_at(st, 1)->name, "model.layers.0.w");
        assert_string_equal(pi2_st_at(st, 2)->name, "model.layers.1.w");
        assert_string_equal(pi2_st_at(st, 3)->name, "lm_head.weight");
        assert_string_equal(pi2_st_find(st, "lm_head.weight")->file, p2);
        assert_string_equal(pi2_st_find(st, "model.embed.weight")->file, p1);
        assert_string_equal(pi2_st_metadata(st, "format"), "first"); /* first file wins */
        pi2_st_close(st);
    }

    /* the index wins over a model.safetensors in the same directory */
    char one[160];
    snprintf(one, sizeof one, "%s/model.safetensors", dir);
    write_file(one, 1, s1, 64, NULL, NULL);
    pi2_st *st = pi2t_st_open_ok(dir);
    assert_int_equal(pi2_st_count(st), 4);
    pi2_st_close(st);
    pi2t_rmtree(dir);
}

/* ---- sharded-index errors ---- */

static void write_text(const char *path, const char *text) { pi2t_write(path, text, strlen(text)); }

static void test_index_errors(void **state)
{
    (void)state;
    char dir[64], p[160], idx[160];
    pi2t_tmpdir(dir, sizeof dir);
    static const pi2t_spec a[] = { { "x", PI2_DT_F32, 1, { 2 } }, { "y", PI2_DT_F32, 1, { 3 } } };
    static const pi2t_spec b[] = { { "z", PI2_DT_F32, 1, { 4 } }, { "x", PI2_DT_F32, 1, { 2 } } };
    snprintf(p, sizeof p, "%s/a.safetensors", dir);
    write_file(p, 2, a, 8, NULL, NULL);
    snprintf(p, sizeof p, "%s/b.safetensors", dir);
    write_file(p, 2, b, 8, NULL, NULL);
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);

    static const struct {
        const char *json;
        int code;
        const char *msg;
    } cases[] = {
        { "{\"weight_map\": {\"x\": \"a.safetensors\"", PI2_EFORMAT, "not valid JSON" },
        { "[1, 2]", PI2_EFORMAT, "not a JSON object" },
        { "{\"metadata\": {}}", PI2_EFORMAT, "missing weight_map" },
        { "{\"weight_map\": []}", PI2_EFORMAT, "weight_map is not a JSON object" },
        { "{\"weight_map\": {}}", PI2_EFORMAT, "weight_map has 0 entries" },
        { "{\"metadata\": 3, \"weight_map\": {\"x\": \"a.safetensors\"}}", PI2_EFORMAT, "metadata is not" },
        { "{\"weight_map\": {\"x\": 1}}", PI2_EFORMAT, "entry 'x' is not a string" },
        { "{\"weight_map\": {\"x\": \"a.safetensors\", \"x\": \"a.safetensors\"}}", PI2_EFORMAT, "duplicate" },
        { "{\"weight_map\": {\"x\": \"../a.safetensors\"}}", PI2_EFORMAT, "not a plain file name" },
        { "{\"weight_map\": {\"x\": \"sub/a.safetensors\"}}", PI2_EFORMAT, "not a plain file name" },
        { "{\"weight_map\": {\"x\": \"/etc/passwd\"}}", PI2_EFORMAT, "not a plain file name" },
        { "{\"weight_map\": {\"x\": \"..\"}}", PI2_EFORMAT, "not a plain file name" },
        { "{\"weight_map\": {\"x\": \"\"}}", PI2_EFORMAT, "not a plain file name" },
        { "{\"weight_map\": {\"x\": \"missing.safetensors\"}}", PI2_ENOTFOUND, "missing.safetensors: cannot open" },
        { "{\"weight_map\": {\"x\": \"a.safetensors\", \"w\": \"a.safetensors\"}}", PI2_EFORMAT,
          "tensor 'w' is listed in weight_map but absent from shard 'a.safetensors'" },
        { "{\"weight_map\": {\"y\": \"b.safetensors\", \"z\": \"b.safetensors\", \"x\": \"a.safetensors\"}}",
          PI2_EFORMAT, "is also stored in" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_text(idx, cases[i].json);
        expect_open_fail(dir, cases[i].code, cases[i].msg);
        expect_open_fail(idx, cases[i].code, cases[i].msg);
    }
    /* a tensor mapped to one shard but stored in another */
    snprintf(p, sizeof p, "%s/b.safetensors", dir);
    write_file(p, 1, b, 8, NULL, NULL); /* now b holds only z */
    write_text(idx, "{\"weight_map\": {\"x\": \"a.safetensors\", \"y\": \"b.safetensors\", \"z\": \"b.safetensors\"}}");
    expect_open_fail(dir, PI2_EFORMAT, "tensor 'y' is mapped to shard 'b.safetensors' but stored in 'a.safetensors'");
    /* a corrupt shard reports the shard's path */
    snprintf(p, sizeof p, "%s/b.safetensors", dir);
    write_text(p, "short");
    expect_open_fail(dir, PI2_EFORMAT, "b.safetensors: file is 5 bytes, shorter than");
    /* ...and a valid index opens */
    write_text(idx, "{\"metadata\": {\"total_size\": 20}, \"weight_map\": {\"x\": \"a.safetensors\"}}");
    pi2_st *st = pi2t_st_open_ok(idx);
    assert_int_equal(pi2_st_count(st), 2); /* y is in shard a but not in the map: still loaded */
    pi2_st_close(st);

    /* the index writer refuses what the reader would refuse */
    pi2_err e = { 0 };
    const char *n2[] = { "x", "x" }, *f2[] = { "a.safetensors", "a.safetensors" }, *bad[] = { "../a" };
    char out[160];
    snprintf(out, sizeof out, "%s/out.index.json", dir);
    assert_int_equal(pi2_st_write_index(out, 2, n2, f2, 0, &e), PI2_EINVAL);
    assert_non_null(strstr(e.msg, "duplicate tensor 'x'"));
    pi2_err_clear(&e);
    assert_int_equal(pi2_st_write_index(out, 1, n2, bad, 0, &e), PI2_EINVAL);
    assert_non_null(strstr(e.msg, "not a plain file name"));
    assert_int_equal(pi2_st_write_index(out, 0, n2, f2, 0, NULL), PI2_EINVAL);
    assert_false(pi2t_exists(out));
    pi2t_rmtree(dir);
}

static void test_open_errors(void **state)
{
    (void)state;
    char dir[64], p[160];
    pi2t_tmpdir(dir, sizeof dir);
    snprintf(p, sizeof p, "%s/nope.safetensors", dir);
    expect_open_fail(p, PI2_ENOTFOUND, "nope.safetensors: cannot open");
    expect_open_fail(dir, PI2_ENOTFOUND, "none of model.safetensors.index.json, model.safetensors, "
                                         "pytorch_model.bin.index.json, pytorch_model.bin");
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    pi2t_write(p, "", 0);
    expect_open_fail(dir, PI2_EFORMAT, "file is 0 bytes, shorter than the 8-byte header length");
    pi2_st *st = (pi2_st *)1;
    assert_int_equal(pi2_st_open(&st, NULL, NULL), PI2_EINVAL);
    assert_null(st);
    assert_int_equal(pi2_st_open_buffer(&st, NULL, 0, NULL, NULL), PI2_EFORMAT);
    assert_int_equal(pi2_st_open_buffer(&st, NULL, 10, NULL, NULL), PI2_EINVAL);
    pi2t_rmtree(dir);
}

/* ---- writer refusals ---- */

static void test_writer_overrun_and_short(void **state)
{
    (void)state;
    char dir[64], path[128];
    pi2t_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    int64_t sh[1] = { 4 };
    uint8_t buf[32] = { 0 };
    pi2_err e = { 0 };
    pi2_st_writer *w;

    /* past the declared size: refused, writer poisoned, no file */
    assert_int_equal(pi2_st_writer_create(&w, path, &e), 0);
    assert_int_equal(pi2_st_writer_add(w, "a", PI2_DT_F32, 1, sh, &e), 0);
    assert_int_equal(pi2_st_writer_write(w, buf, 10, &e), 0);
    assert_int_equal(pi2_st_writer_write(w, buf, 7, &e), PI2_EINVAL);
    assert_non_null(strstr(e.msg, "passes the declared total 16"));
    pi2_err_clear(&e);
    assert_int_equal(pi2_st_writer_write(w, buf, 1, &e), PI2_EINVAL);
    pi2_err_clear(&e);
    assert_int_equal(pi2_st_writer_finish(w, &e), PI2_EINVAL);
    assert_non_null(strstr(e.msg, "w.safetensors: writer already failed"));
    assert_false(pi2t_exists(path));
    assert_int_equal(pi2t_count_entries(dir), 0);

    /* finish with missing bytes */
    pi2_err_clear(&e);
    assert_int_equal(pi2_st_writer_create(&w, path, &e), 0);
    assert_int_equal(pi2_st_writer_add(w, "a", PI2_DT_F32, 1, sh, &e), 0);
    assert_int_equal(pi2_st_writer_write(w, buf, 15, &e), 0);
    assert_int_equal(pi2_st_writer_finish(w, &e), PI2_EINVAL);
    assert_non_null(strstr(e.msg, "finished after 15 of 16 declared data bytes"));
    assert_false(pi2t_exists(path));
    assert_int_equal(pi2t_count_entries(dir), 0);

    /* finish with no data at all when some was declared */
    pi2_err_clear(&e);
    assert_int_equal(pi2_st_writer_create(&w, path, &e), 0);
    assert_int_equal(pi2_st_writer_add(w, "a", PI2_DT_F32, 1, sh, &e), 0);
    assert_int_equal(pi2_st_writer_finish(w, &e), PI2_EINVAL);
    assert_false(pi2t_exists(path));

    /* abandoning removes the temporary file and leaves an existing file alone */
    pi2t_write(path, "old", 3);
    assert_int_equal(pi2_st_writer_create(&w, path, &e), 0);
    assert_int_equal(pi2_st_writer_add(w, "a", PI2_DT_F32, 1, sh, &e), 0);
    assert_int_equal(pi2_st_writer_write(w, buf, 16, &e), 0);
    assert_int_equal(pi2t_count_entries(dir), 2);
    pi2_st_writer_free(w);
    pi2_st_writer_free(NULL);
    assert_int_equal(pi2t_count_entries(dir), 1);
    char *text;
    size_t len;
    assert_int_equal(pi2_read_file(path, 100, &text, &len, NULL), 0);
    assert_string_equal(text, "old");
    free(text);

    /* a directory that does not exist */
    snprintf(path, sizeof path, "%s/no/such/dir.safetensors", dir);
    pi2_err_clear(&e);
    assert_int_equal(pi2_st_writer_create(&w, path, &e), PI2_EIO);
    assert_non_null(strstr(e.msg, "cannot create temporary file"));
    pi2t_rmtree(dir);
}

static void test_writer_argument_errors(void **state)
{
    (void)state;
    char dir[64], path[128];
    pi2t_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    pi2_st_writer *w;
    pi2_err e = { 0 };
    int64_t sh[9] = { 2, 2, 1, 1, 1, 1, 1, 1, 1 };
    assert_int_equal(pi2_st_writer_create(&w, path, &e), 0);
    assert_int_equal(pi2_st_writer_add(w, "a", PI2_DT_F32, 2, sh, &e), 0);
#define EXPECT_ADD(code, needle, ...)                                      \
    do {                                                                   \
        pi2_err_clear(&e);                                                 \
        assert_int_equal(pi2_st_writer_add(w, __VA_ARGS__, &e), (code));   \
        assert_non_null(strstr(e.msg, (needle)));                          \
    } while (0)
    EXPECT_ADD(PI2_EINVAL, "duplicate tensor 'a'", "a", PI2_DT_F32, 2, sh);
    EXPECT_ADD(PI2_EINVAL, "invalid dtype", "b", (pi2_dtype)42, 2, sh);
    EXPECT_ADD(PI2_EINVAL, "9 dims", "b", PI2_DT_F32, 9, sh);
    EXPECT_ADD(PI2_EINVAL, "-1 dims", "b", PI2_DT_F32, -1, sh);
    EXPECT_ADD(PI2_EINVAL, "invalid tensor name", "__metadata__", PI2_DT_F32, 1, sh);
    EXPECT_ADD(PI2_EINVAL, "invalid tensor name", "", PI2_DT_F32, 1, sh);
    EXPECT_ADD(PI2_EINVAL, "not valid UTF-8", "bad\xff", PI2_DT_F32, 1, sh);
    int64_t neg[2] = { 2, -3 }, big[3] = { INT64_C(1) << 40, INT64_C(1) << 40, 1 << 20 }, big1[1] = { INT64_MAX };
    EXPECT_ADD(PI2_EINVAL, "negative dim -3", "b", PI2_DT_F32, 2, neg);
    EXPECT_ADD(PI2_ERANGE, "element count overflows", "b", PI2_DT_F32, 3, big);
    EXPECT_ADD(PI2_ERANGE, "size overflows", "b", PI2_DT_I64, 1, big1);
    pi2_err_clear(&e);
    assert_int_equal(pi2_st_writer_meta(w, "k", "bad\xff", &e), PI2_EINVAL);
    /* the failed adds left the writer usable */
    pi2_err_clear(&e);
    float data[4] = { 1, 2, 3, 4 };
    assert_int_equal(pi2_st_writer_write(w, data, sizeof data, &e), 0);
    EXPECT_ADD(PI2_EINVAL, "after data was written", "c", PI2_DT_F32, 1, sh);
    pi2_err_clear(&e);
    assert_int_equal(pi2_st_writer_meta(w, "k", "v", &e), PI2_EINVAL);
    assert_int_equal(pi2_st_writer_write(w, NULL, 1, NULL), PI2_EINVAL);
    assert_int_equal(pi2_st_writer_finish(w, &e), 0);
    pi2_st *st = pi2t_st_open_ok(path);
    assert_int_equal(pi2_st_count(st), 1);
    assert_true(pi2_st_get_f32(pi2_st_find(st, "a"), 3) == 4.0f);
    pi2_st_close(st);
    assert_int_equal(pi2_st_writer_finish(NULL, NULL), PI2_EINVAL);
#undef EXPECT_ADD
    pi2t_rmtree(dir);
}

/* Simulated full disk at every point: in the length, header and data. */
static void test_writer_enospc(void **state)
{
    (void)state;
    char dir[64], path[128], idx[160];
    pi2t_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/full.safetensors", dir);
    static const pi2t_spec sp[] = { { "a", PI2_DT_F32, 2, { 4, 4 } }, { "b", PI2_DT_BF16, 1, { 10 } } };
    /* size of the complete file */
    write_file(path, 2, sp, 5, NULL, NULL);
    char *text;
    size_t full;
    assert_int_equal(pi2_read_file(path, 1 << 20, &text, &full, NULL), 0);
    free(text);
    unlink(path);
    for (size_t budget = 0; budget < full; budget += (budget < 16 ? 1 : 13)) {
        pi2_st_writer *w;
        pi2_err e = { 0 };
        assert_int_equal(pi2_st_writer_create(&w, path, &e), 0);
        pi2_afile_fail_after((int64_t)budget);
        int rc = 0;
        for (size_t k = 0; k < 2 && rc == 0; k++)
            rc = pi2_st_writer_add(w, sp[k].name, sp[k].dt, sp[k].ndim, sp[k].shape, &e);
        assert_int_equal(rc, 0);
        uint8_t data[64] = { 0 };
        rc = pi2_st_writer_write(w, data, 64, &e);
        if (rc == 0)
            rc = pi2_st_writer_write(w, data, 20, &e);
        assert_int_equal(rc, PI2_ENOSPC);
        assert_non_null(strstr(e.msg, "full.safetensors: write failed"));
        pi2_err_clear(&e);
        assert_int_equal(pi2_st_writer_write(w, data, 1, &e), PI2_ENOSPC); /* poisoned */
        pi2_err_clear(&e);
        assert_int_equal(pi2_st_writer_finish(w, &e), PI2_ENOSPC);
        pi2_afile_fail_after(-1);
        assert_false(pi2t_exists(path));
        assert_int_equal(pi2t_count_entries(dir), 0);
    }
    /* header-only file on a full disk, and the index writer */
    pi2_st_writer *w;
    pi2_err e = { 0 };
    assert_int_equal(pi2_st_writer_create(&w, path, &e), 0);
    pi2_afile_fail_after(3);
    assert_int_equal(pi2_st_writer_finish(w, &e), PI2_ENOSPC);
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    const char *n1[] = { "a" }, *f1[] = { "x.safetensors" };
    pi2_afile_fail_after(10);
    pi2_err_clear(&e);
    assert_int_equal(pi2_st_write_index(idx, 1, n1, f1, 64, &e), PI2_ENOSPC);
    pi2_afile_fail_after(-1);
    assert_false(pi2t_exists(path));
    assert_false(pi2t_exists(idx));
    assert_int_equal(pi2t_count_entries(dir), 0);
    pi2t_rmtree(dir);
}

/* ---- corruption matrix ---- */

/* A valid image from the writer (read back into memory). */
static uint8_t *valid_image(size_t *len, uint64_t *hlen)
{
    char dir[64], path[128];
    pi2t_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/v.safetensors", dir);
    write_file(path, NALL, all_dtypes, 64, "format", "pt");
    char *text;
    assert_int_equal(pi2_read_file(path, 1 << 20, &text, len, NULL), 0);
    pi2t_rmtree(dir);
    pi2_cursor c = { (const uint8_t *)text, *len };
    assert_true(pi2_cursor_u64le(&c, hlen));
    return (uint8_t *)text;
}

static void test_truncation(void **state)
{
    (void)state;
    size_t len;
    uint64_t hlen;
    uint8_t *img = valid_image(&len, &hlen);
    pi2_st_close(open_ok_buf(img, len));
    size_t hend = 8 + (size_t)hlen, tried = 0;
    for (size_t cut = 0; cut < len; cut += cut < hend ? 1 : 5) {
        uint8_t *b = malloc(cut ? cut : 1); /* exact size: ASan catches overreads */
        assert_non_null(b);
        memcpy(b, img, cut);
        const char *why = cut < 8 ? "shorter than the 8-byte header length"
                          : cut < hend ? "runs past the end of the file"
                                       : "data size";
        expect_fail_buf(b, cut, PI2_EFORMAT, why);
        free(b);
        tried++;
    }
    assert_true(tried > hend);
    /* extra bytes at the end are trailing garbage, not silently ignored */
    uint8_t *b = malloc(len + 3);
    assert_non_null(b);
    memcpy(b, img, len);
    memset(b + len, 0, 3);
    expect_fail_buf(b, len + 3, PI2_EFORMAT, "3 trailing bytes after the last tensor");
    free(b);
    free(img);
}

static void test_header_byte_flips(void **state)
{
    (void)state;
    size_t len;
    uint64_t hlen;
    uint8_t *img = valid_image(&len, &hlen);
    size_t hend = 8 + (size_t)hlen;
    static const uint8_t masks[] = { 0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80, 0xff };
    size_t ok = 0, bad = 0;
    uint8_t *b = malloc(len);
    assert_non_null(b);
    for (size_t pos = 0; pos < hend; pos++) {
        for (size_t m = 0; m < sizeof masks; m++) {
            memcpy(b, img, len);
            b[pos] ^= masks[m];
            pi2_st *st = NULL;
            pi2_err e = { 0 };
            int rc = pi2_st_open_buffer(&st, b, len, "img", &e);
            if (rc == 0) {
                /* whatever parsed must be self-consistent and inside the buffer */
                size_t total = 0;
                for (size_t i = 0; i < pi2_st_count(st); i++) {
                    const pi2_st_tensor *t = pi2_st_at(st, i);
                    const uint8_t *d = t->data;
                    assert_true(d >= b + 8 && d + t->nbytes <= b + len);
                    assert_int_equal(t->nbytes, t->nelem * pi2_dtype_size(t->dtype));
                    assert_ptr_equal(pi2_st_find(st, t->name), t);
                    total += t->nbytes;
                }
                pi2_cursor c = { b, len };
                uint64_t hl;
                assert_true(pi2_cursor_u64le(&c, &hl));
                assert_int_equal(total, len - 8 - (size_t)hl);
                pi2_st_close(st);
                ok++;
            } else {
                assert_true(rc < 0);
                assert_int_equal(e.code, rc);
                assert_int_equal(strncmp(e.msg, "img: ", 5), 0);
                assert_null(st);
                bad++;
            }
        }
    }
    free(b);
    free(img);
    assert_true(bad > 0 && ok > 0); /* e.g. flips inside a name or a metadata value still parse */
}

static void test_header_length_lies(void **state)
{
    (void)state;
    static const char hdr[] = "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}";
    size_t len;
    static const uint64_t huge[] = { UINT64_C(1) << 63, UINT64_MAX, (uint64_t)PI2_ST_MAX_HEADER + 1,
                                     UINT64_C(1) << 32 };
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
        uint8_t *b = mk_image_n(huge[i], hdr, 4, &len);
        expect_fail_buf(b, len, PI2_ERANGE, "exceeds the limit");
        free(b);
    }
    /* within the limit but one byte past the end of the file */
    uint8_t *b = mk_image_n(strlen(hdr) + 5, hdr, 4, &len);
    char want[128];
    snprintf(want, sizeof want, "header length %zu runs past the end of the file (%zu bytes left)", strlen(hdr) + 5,
             strlen(hdr) + 4);
    expect_fail_buf(b, len, PI2_EFORMAT, want);
    free(b);
    /* consuming the data as header: the JSON then has trailing garbage */
    b = mk_image_n(strlen(hdr) + 4, hdr, 4, &len);
    expect_fail_buf(b, len, PI2_EFORMAT, "header is not valid JSON");
    free(b);
    /* shorter than the JSON */
    b = mk_image_n(strlen(hdr) - 1, hdr, 4, &len);
    expect_fail_buf(b, len, PI2_EFORMAT, "header is not valid JSON");
    free(b);
    /* short files */
    for (size_t n = 0; n < 8; n++) {
        uint8_t *s = malloc(n ? n : 1);
        memset(s, 0, n ? n : 1);
        snprintf(want, sizeof want, "file is %zu bytes, shorter than the 8-byte", n);
        expect_fail_buf(n ? s : NULL, n, PI2_EFORMAT, want);
        free(s);
    }
}

#define T(dt, shape, off) "{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":" off "}"

static void test_lying_headers(void **state)
{
    (void)state;
    static const struct {
        const char *hdr;
        size_t dlen;
        int code;
        const char *msg;
    } cases[] = {
        /* JSON level */
        { "", 0, PI2_EFORMAT, "header is not valid JSON" },
        { "{\"a\":", 0, PI2_EFORMAT, "header is not valid JSON" },
        { "{} x", 0, PI2_EFORMAT, "header is not valid JSON" },
        { "[1,2]", 0, PI2_EFORMAT, "header is not a JSON object" },
        { "3", 0, PI2_EFORMAT, "header is not valid JSON" },
        { "{\"a\":" T("U8", "[4]", "[0,4]") ",\"a\":" T("U8", "[4]", "[4,8]") "}", 8, PI2_EFORMAT, "duplicate" },
        { "{\"a\\u0000b\":" T("U8", "[4]", "[0,4]") "}", 4, PI2_EFORMAT, "header is not valid JSON" },
        /* entry level */
        { "{\"a\":3}", 0, PI2_EFORMAT, "tensor 'a': entry is not a JSON object" },
        { "{\"a\":[]}", 0, PI2_EFORMAT, "tensor 'a': entry is not a JSON object" },
        { "{\"a\":{\"shape\":[4],\"data_offsets\":[0,4]}}", 4, PI2_EFORMAT, "tensor 'a': missing dtype" },
        { "{\"a\":{\"dtype\":4,\"shape\":[4],\"data_offsets\":[0,4]}}", 4, PI2_EFORMAT, "dtype is not a string" },
        { "{\"a\":" T("F64", "[4]", "[0,32]") "}", 32, PI2_EUNSUPPORTED, "tensor 'a': unsupported dtype 'F64'" },
        { "{\"a\":" T("f32", "[4]", "[0,16]") "}", 16, PI2_EUNSUPPORTED, "unsupported dtype 'f32'" },
        { "{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,4]}}", 4, PI2_EFORMAT, "tensor 'a': missing shape" },
        { "{\"a\":" T("U8", "4", "[0,4]") "}", 4, PI2_EFORMAT, "shape is not an array" },
        { "{\"a\":" T("U8", "[-4]", "[0,4]") "}", 4, PI2_ERANGE,
          "tensor 'a': shape[0]: -4 is out of range (must be >= 0)" },
        { "{\"a\":" T("U8", "[2,2.0]", "[0,4]") "}", 4, PI2_EFORMAT, "shape[1]: expected an integer, got a real" },
        { "{\"a\":" T("U8", "[\"4\"]", "[0,4]") "}", 4, PI2_EFORMAT, "shape[0]: expected an integer, got a string" },
        { "{\"a\":" T("U8", "[null]", "[0,4]") "}", 4, PI2_EFORMAT, "shape[0]: expected an integer, got null" },
        { "{\"a\":" T("U8", "[1,1,1,1,1,1,1,1,4]", "[0,4]") "}", 4, PI2_ERANGE, "too many dims (9 > 8)" },
        { "{\"a\":" T("U8", "[99999999999999999999]", "[0,4]") "}", 4, PI2_EFORMAT, "header is not valid JSON" },
        { "{\"a\":" T("U8", "[4294967296,4294967296,16]", "[0,4]") "}", 4, PI2_ERANGE, "element count overflows" },
        { "{\"a\":" T("F32", "[4611686018427387904]", "[0,4]") "}", 4, PI2_ERANGE, "byte size overflows" },
        { "{\"a\":{\"dtype\":\"U8\",\"shape\":[4]}}", 4, PI2_EFORMAT, "tensor 'a': missing data_offsets" },
        { "{\"a\":" T("U8", "[4]", "[0]") "}", 4, PI2_EFORMAT, "data_offsets is not [begin, end]" },
        { "{\"a\":" T("U8", "[4]", "[0,4,8]") "}", 4, PI2_EFORMAT, "data_offsets is not [begin, end]" },
        { "{\"a\":" T("U8", "[4]", "[-1,3]") "}", 4, PI2_ERANGE,
          "data_offsets[0]: -1 is out of range (must be >= 0)" },
        { "{\"a\":" T("U8", "[4]", "[\"0\",4]") "}", 4, PI2_EFORMAT,
          "data_offsets[0]: expected an integer, got a string" },
        { "{\"a\":" T("U8", "[4]", "{}") "}", 4, PI2_EFORMAT, "data_offsets is not [begin, end]" },
        { "{\"a\":" T("U8", "[4]", "[8,4]") "}", 8, PI2_EFORMAT, "tensor 'a': data_offsets begin 8 > end 4" },
        { "{\"a\":" T("U8", "[32]", "[0,32]") "}", 16, PI2_EFORMAT, "end 32 is past the data size 16" },
        { "{\"a\":" T("U8", "[4]", "[0,18446744073709551615]") "}", 4, PI2_EFORMAT, "header is not valid JSON" },
        { "{\"a\":" T("F32", "[3]", "[0,16]") "}", 16, PI2_EFORMAT,
          "tensor 'a': data_offsets span 16 bytes but F32 [3] needs 12 bytes" },
        { "{\"a\":" T("F32", "[0]", "[0,4]") "}", 4, PI2_EFORMAT, "span 4 bytes but F32 [0] needs 0 bytes" },
        { "{\"a\":" T("BF16", "[2,3]", "[0,6]") "}", 6, PI2_EFORMAT, "BF16 [2, 3] needs 12 bytes" },
        /* tiling */
        { "{\"a\":" T("U8", "[8]", "[0,8]") ",\"b\":" T("U8", "[8]", "[4,12]") "}", 12, PI2_EFORMAT,
          "tensor 'b' (bytes 4..12) overlaps tensor 'a' (ends at 8)" },
        { "{\"a\":" T("U8", "[8]", "[0,8]") ",\"b\":" T("U8", "[8]", "[0,8]") "}", 8, PI2_EFORMAT, "overlaps" },
        { "{\"a\":" T("U8", "[4]", "[0,4]") ",\"b\":" T("U8", "[4]", "[8,12]") "}", 12, PI2_EFORMAT,
          "gap of unused data bytes 4..8 before tensor 'b'" },
        { "{\"a\":" T("U8", "[4]", "[4,8]") "}", 8, PI2_EFORMAT, "gap of unused data bytes 0..4 before tensor 'a'" },
        { "{\"a\":" T("U8", "[8]", "[0,8]") "}", 16, PI2_EFORMAT, "8 trailing bytes after the last tensor" },
        { "{}", 4, PI2_EFORMAT, "4 trailing bytes after the last tensor" },
        { "{\"__metadata__\":{}}", 1, PI2_EFORMAT, "1 trailing bytes" },
        /* metadata */
        { "{\"__metadata__\":[],\"a\":" T("U8", "[4]", "[0,4]") "}", 4, PI2_EFORMAT,
          "__metadata__ is not a JSON object" },
        { "{\"__metadata__\":\"x\"}", 0, PI2_EFORMAT, "__metadata__ is not a JSON object" },
        { "{\"__metadata__\":{\"k\":1}}", 0, PI2_EFORMAT, "__metadata__ value of 'k' is not a string" },
        { "{\"__metadata__\":{\"k\":{\"x\":\"y\"}}}", 0, PI2_EFORMAT, "value of 'k' is not a string" },
        { "{\"__metadata__\":{\"k\":\"v\"},\"__metadata__\":{}}", 0, PI2_EFORMAT, "duplicate" },
        /* hostile names are shown on one line */
        { "{\"a\\nb\":" T("X", "[4]", "[0,4]") "}", 4, PI2_EUNSUPPORTED, "tensor 'a?b': unsupported dtype 'X'" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_fail(cases[i].hdr, cases[i].dlen, cases[i].code, cases[i].msg);

    /* a very long name is cut in the message */
    char big[600];
    snprintf(big, sizeof big, "{\"%0300d\":" T("X", "[4]", "[0,4]") "}", 7);
    expect_fail(big, 4, PI2_EUNSUPPORTED, "000...': unsupported dtype");
}

static void test_legal_oddities(void **state)
{
    (void)state;
    static const struct {
        const char *hdr;
        size_t dlen, count;
    } cases[] = {
        { "{}", 0, 0 },
        { "{}        ", 0, 0 },             /* space padding (spec) */
        { "  {}\n\t ", 0, 0 },              /* other JSON whitespace, as jansson allows */
        { "{\"__metadata__\":{}}", 0, 0 },
        { "{\"z\":" T("F32", "[0,4]", "[0,0]") "}", 0, 1 },
        { "{\"z\":" T("F32", "[0]", "[0,0]") ",\"y\":" T("U8", "[0]", "[0,0]") "}", 0, 2 },
        /* out-of-order entries, zero-size tensors at both ends and in between, extra keys ignored */
        { "{\"c\":" T("U8", "[0]", "[6,6]") ",\"b\":" T("U8", "[2]", "[4,6]") ",\"a\":" T("I32", "[1]", "[0,4]")
          ",\"z\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0],\"extra\":[1]},\"m\":" T("U8", "[0]", "[4,4]")
          "}", 6, 5 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t len;
        uint8_t *b = mk_image(cases[i].hdr, cases[i].dlen, &len);
        pi2_st *st = open_ok_buf(b, len);
        assert_int_equal(pi2_st_count(st), cases[i].count);
        free(b);
        pi2_st_close(st);
    }
    /* order is by offset; a zero-size tensor sorts before one starting at the same place */
    size_t len;
    uint8_t *b = mk_image(cases[6].hdr, cases[6].dlen, &len);
    pi2_st *st = open_ok_buf(b, len);
    static const char *order[] = { "z", "a", "m", "b", "c" };
    for (size_t i = 0; i < 5; i++)
        assert_string_equal(pi2_st_at(st, i)->name, order[i]);
    assert_ptr_equal(pi2_st_find(st, "b")->data, b + len - 2);
    assert_string_equal(pi2_st_find(st, "a")->file, "img");
    pi2_st_close(st);
    free(b);
}

/* ---- values ---- */

static void test_get_f32_known_values(void **state)
{
    (void)state;
    /* data (35 bytes): f16 x4, bf16 x4, f32, i8 x2, u8, then i32 and i64 at odd (unaligned) offsets */
    static const char hdr[] = "{\"h\":" T("F16", "[4]", "[0,8]") ",\"b\":" T("BF16", "[2,2]", "[8,16]")
                              ",\"f\":" T("F32", "[1]", "[16,20]") ",\"i8\":" T("I8", "[2]", "[20,22]")
                              ",\"u8\":" T("U8", "[1]", "[22,23]") ",\"i32\":" T("I32", "[1]", "[23,27]")
                              ",\"i64\":" T("I64", "[1]", "[27,35]") "}";
    size_t len;
    uint8_t *b = mk_image(hdr, 35, &len);
    uint8_t *d = b + 8 + strlen(hdr);
    static const uint16_t h[] = { 0x3c00, 0xc000, 0x7bff, 0x0001 };
    static const uint16_t bf[] = { 0x3f80, 0x4049, 0xc2f7, 0x0000 };
    for (int i = 0; i < 4; i++) {
        d[2 * i] = (uint8_t)h[i];
        d[2 * i + 1] = (uint8_t)(h[i] >> 8);
        d[8 + 2 * i] = (uint8_t)bf[i];
        d[8 + 2 * i + 1] = (uint8_t)(bf[i] >> 8);
    }
    static const uint8_t f[] = { 0x00, 0x00, 0x20, 0xc1 }; /* -10.0f LE */
    memcpy(d + 16, f, 4);
    d[20] = 0xfe; /* -2 */
    d[21] = 0x7f; /* 127 */
    d[22] = 0xff; /* 255 */
    static const uint8_t i32[] = { 0x9c, 0xff, 0xff, 0xff };                    /* -100, unaligned */
    static const uint8_t i64[] = { 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00 }; /* 2^32 */
    memcpy(d + 23, i32, 4);
    memcpy(d + 27, i64, 8);
    pi2_st *st = open_ok_buf(b, len);
    const pi2_st_tensor *t = pi2_st_find(st, "h");
    assert_true(pi2_st_get_f32(t, 0) == 1.0f);
    assert_true(pi2_st_get_f32(t, 1) == -2.0f);
    assert_true(pi2_st_get_f32(t, 2) == 65504.0f);
    assert_true(pi2_st_get_f32(t, 3) == 0x1p-24f);
    t = pi2_st_find(st, "b");
    assert_true(pi2_st_get_f32(t, 0) == 1.0f);
    assert_true(pi2_st_get_f32(t, 1) == 3.140625f);
    assert_true(pi2_st_get_f32(t, 2) == -123.5f);
    assert_true(pi2_st_get_f32(t, 3) == 0.0f);
    float out[4];
    assert_int_equal(pi2_st_to_f32(t, out, 4, NULL), 0);
    assert_true(out[0] == 1.0f && out[1] == 3.140625f && out[2] == -123.5f && out[3] == 0.0f);
    pi2_err e = { 0 };
    assert_int_equal(pi2_st_to_f32(t, out, 3, &e), PI2_EINVAL);
    assert_non_null(strstr(e.msg, "img: tensor 'b' has 4 elements, destination holds 3"));
    t = pi2_st_find(st, "f");
    assert_true(pi2_st_get_f32(t, 0) == -10.0f);
    assert_int_equal(pi2_st_to_f32(t, out, 1, NULL), 0);
    assert_true(out[0] == -10.0f);
    assert_true(pi2_st_get_f32(pi2_st_find(st, "i8"), 0) == -2.0f);
    assert_true(pi2_st_get_f32(pi2_st_find(st, "i8"), 1) == 127.0f);
    assert_true(pi2_st_get_f32(pi2_st_find(st, "u8"), 0) == 255.0f);
    assert_true(pi2_st_get_f32(pi2_st_find(st, "i32"), 0) == -100.0f);
    assert_true(pi2_st_get_f32(pi2_st_find(st, "i64"), 0) == 4294967296.0f);
    pi2_st_close(st);
    free(b);
}

static void test_expect_shape(void **state)
{
    (void)state;
    static const char hdr[] = "{\"w\":" T("U8", "[2,3]", "[0,6]") "}";
    size_t len;
    uint8_t *b = mk_image(hdr, 6, &len);
    pi2_st *st = open_ok_buf(b, len);
    const pi2_st_tensor *t = pi2_st_find(st, "w");
    int64_t ok[2] = { 2, 3 }, bad[2] = { 3, 2 }, three[3] = { 2, 3, 1 };
    pi2_err e = { 0 };
    assert_int_equal(pi2_st_expect_shape(t, 2, ok, &e), 0);
    assert_int_equal(pi2_st_expect_shape(t, 2, bad, &e), PI2_ESHAPE);
    assert_string_equal(e.msg, "img: tensor 'w' has shape [2, 3], expected [3, 2]");
    pi2_err_clear(&e);
    assert_int_equal(pi2_st_expect_shape(t, 3, three, &e), PI2_ESHAPE);
    assert_string_equal(e.msg, "img: tensor 'w' has shape [2, 3], expected [2, 3, 1]");
    assert_int_equal(pi2_st_expect_shape(t, 1, ok, NULL), PI2_ESHAPE);
    assert_int_equal(pi2_st_expect_shape(t, 0, NULL, NULL), PI2_ESHAPE);
    pi2_st_close(st);
    free(b);
}

/* Many tensors: lookup must not be quadratic and every name must be found. */
static void test_many_tensors(void **state)
{
    (void)state;
    enum { N = 100000 };
    size_t cap = (size_t)N * 80 + 16, n = 0;
    char *hdr = malloc(cap);
    assert_non_null(hdr);
    hdr[n++] = '{';
    for (size_t i = 0; i < N; i++)
        n += (size_t)snprintf(hdr + n, cap - n, "%s\"layer.%zu.w\":" T("U8", "[1]", "[%zu,%zu]"), i ? "," : "",
                              N - 1 - i, N - 1 - i, N - i); /* reverse order in the header */
    hdr[n++] = '}';
    hdr[n] = 0;
    size_t len;
    uint8_t *b = mk_image(hdr, N, &len);
    free(hdr);
    pi2_st *st = open_ok_buf(b, len);
    assert_int_equal(pi2_st_count(st), N);
    char name[32];
    for (size_t i = 0; i < N; i++) {
        snprintf(name, sizeof name, "layer.%zu.w", i);
        const pi2_st_tensor *t = pi2_st_find(st, name);
        assert_non_null(t);
        assert_ptr_equal(pi2_st_at(st, i), t);
        assert_int_equal(*(const uint8_t *)t->data, (uint8_t)i);
    }
    assert_null(pi2_st_find(st, "layer.100000.w"));
    pi2_st_close(st);
    free(b);
}

/* ---- the shared real model ---- */

static void test_shared_model(void **state)
{
    (void)state;
    char dir[512], file[600];
    PI2T_SHARED_MODEL(dir, "tinystories-656k");
    snprintf(file, sizeof file, "%s/model.safetensors", dir);
    for (int pass = 0; pass < 2; pass++) {
        pi2_st *st = pi2t_st_open_ok(pass ? file : dir);
        assert_int_equal(pi2_st_count(st), 20);
        assert_string_equal(pi2_st_metadata(st, "format"), "pt");
        const pi2_st_tensor *t = pi2_st_find(st, "model.layers.0.mlp.gate_proj.weight");
        assert_non_null(t);
        assert_int_equal(t->dtype, PI2_DT_F32);
        int64_t g[2] = { 384, 128 }, lm[2] = { 2048, 128 }, nrm[1] = { 128 };
        assert_int_equal(pi2_st_expect_shape(t, 2, g, NULL), 0);
        assert_true(fabsf(pi2_st_get_f32(t, 0) - -0.92578125f) < 1e-7f);
        t = pi2_st_find(st, "lm_head.weight");
        assert_non_null(t);
        assert_int_equal(pi2_st_expect_shape(t, 2, lm, NULL), 0);
        assert_ptr_equal(pi2_st_at(st, 0), t); /* first in the file */
        assert_int_equal(pi2_st_expect_shape(pi2_st_find(st, "model.norm.weight"), 1, nrm, NULL), 0);
        assert_null(pi2_st_find(st, "model.embed_tokens.weight")); /* tied: stored once */
        pi2_st_close(st);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtype_helpers),
        cmocka_unit_test(test_roundtrip_all_dtypes),
        cmocka_unit_test(test_roundtrip_metadata_and_empty),
        cmocka_unit_test(test_sharded_roundtrip),
        cmocka_unit_test(test_index_errors),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_writer_overrun_and_short),
        cmocka_unit_test(test_writer_argument_errors),
        cmocka_unit_test(test_writer_enospc),
        cmocka_unit_test(test_truncation),
        cmocka_unit_test(test_header_byte_flips),
        cmocka_unit_test(test_header_length_lies),
        cmocka_unit_test(test_lying_headers),
        cmocka_unit_test(test_legal_oddities),
        cmocka_unit_test(test_get_f32_known_values),
        cmocka_unit_test(test_expect_shape),
        cmocka_unit_test(test_many_tensors),
        cmocka_unit_test(test_shared_model),
    };
    return cmocka_run_group_tests_name("safetensors", tests, NULL, NULL);
}
