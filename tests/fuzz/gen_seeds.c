/* Seed generator for the fuzz corpora (tests/fuzz/make-corpus.sh), through
 * the project's own writers:
 *   gen-seeds st-trim IN OUT K   the first K tensors of safetensors IN, each
 *                                cut to at most 4 x 16 elements (leading
 *                                block of a matrix), dtype and metadata kept
 *   gen-seeds ctr OUT NAME=FILE...  a container with these members, in order
 *   gen-seeds tok OUT VOCAB SEED    pi2_tok_write_synthetic
 *   gen-seeds tz OUT KIND        a PyTorch zip (pi2_tz_write): KIND "four"
 *                                (F32[2,3] F16[4,8] BF16[0,5] U8[16,16], the
 *                                storages fuzz_torchzip wraps a bare pickle
 *                                with), "all" (every dtype, a scalar, 4 dims),
 *                                "pred" (a predictor's fc1, fc2)
 *   gen-seeds tz-pkl IN OUT      the data.pkl member of zip IN (as written
 *                                by the above: small, no zip64 fields)
 * Exit status 1 with one line on stderr on failure. */
#include "convert/synth_tok.h"
#include "formats/container.h"
#include "formats/safetensors.h"
#include "formats/torchzip.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int st_trim(const char *in, const char *out, size_t k, pi2_err *err)
{
    pi2_st *st = NULL;
    pi2_st_writer *w = NULL;
    int rc = pi2_st_open(&st, in, err);
    if (rc == 0)
        rc = pi2_st_writer_create(&w, out, err);
    size_t n = st ? pi2_st_count(st) : 0;
    if (k > n)
        k = n;
    int64_t shapes[64][2];
    if (k > 64)
        k = 64;
    if (rc == 0)
        rc = pi2_st_writer_meta(w, "format", "pt", err);
    for (size_t i = 0; i < k && rc == 0; i++) {
        const pi2_st_tensor *t = pi2_st_at(st, i);
        int64_t r = t->ndim == 2 ? t->shape[0] : 1, c = t->ndim == 2 ? t->shape[1] : (int64_t)t->nelem;
        shapes[i][0] = r < 4 ? r : 4;
        shapes[i][1] = c < 16 ? c : 16;
        if (t->ndim == 2)
            rc = pi2_st_writer_add(w, t->name, t->dtype, 2, shapes[i], err);
        else
            rc = pi2_st_writer_add(w, t->name, t->dtype, 1, &shapes[i][1], err);
    }
    for (size_t i = 0; i < k && rc == 0; i++) {
        const pi2_st_tensor *t = pi2_st_at(st, i);
        size_t es = pi2_dtype_size(t->dtype);
        int64_t c = t->ndim == 2 ? t->shape[1] : (int64_t)t->nelem;
        for (int64_t row = 0; row < shapes[i][0] && rc == 0; row++)
            rc = pi2_st_writer_write(w, (const uint8_t *)t->data + (size_t)(row * c) * es,
                                     (size_t)shapes[i][1] * es, err);
    }
    if (rc == 0) {
        rc = pi2_st_writer_finish(w, err);
        w = NULL;
    }
    pi2_st_writer_free(w);
    pi2_st_close(st);
    return rc;
}

static int ctr(const char *out, int n, char **members, pi2_err *err)
{
    pi2_ctr_writer *w = NULL;
    int rc = pi2_ctr_writer_create(&w, out, err);
    for (int i = 0; i < n && rc == 0; i++) {
        char *eq = strchr(members[i], '=');
        if (!eq) {
            rc = pi2_err_set(err, PI2_EINVAL, "%s: expected NAME=FILE", members[i]);
            break;
        }
        *eq = 0;
        char *buf = NULL;
        size_t len = 0;
        rc = pi2_read_file(eq + 1, 1u << 24, &buf, &len, err);
        if (rc == 0)
            rc = pi2_ctr_writer_add(w, members[i], buf, len, err);
        free(buf);
    }
    if (rc == 0)
        rc = pi2_ctr_writer_finish(w, err);
    pi2_ctr_writer_free(w);
    return rc;
}

static int tz(const char *out, const char *kind, pi2_err *err)
{
    static uint8_t d[1024];
    for (size_t i = 0; i < sizeof d; i++)
        d[i] = (uint8_t)(i * 13 + 5);
    const pi2_tz_item four[4] = { { "a.f32", PI2_DT_F32, 2, { 2, 3 }, d },
                                  { "b.f16", PI2_DT_F16, 2, { 4, 8 }, d },
                                  { "c.bf16", PI2_DT_BF16, 2, { 0, 5 }, d },
                                  { "d.u8", PI2_DT_U8, 2, { 16, 16 }, d } };
    const pi2_tz_item all[7] = { { "f32", PI2_DT_F32, 1, { 3 }, d },     { "f16", PI2_DT_F16, 2, { 2, 2 }, d },
                                 { "bf16", PI2_DT_BF16, 4, { 1, 2, 1, 2 }, d },
                                 { "i8", PI2_DT_I8, 1, { 5 }, d },       { "u8", PI2_DT_U8, 0, { 0 }, d },
                                 { "i32", PI2_DT_I32, 2, { 1, 3 }, d },  { "i64", PI2_DT_I64, 1, { 2 }, d } };
    const pi2_tz_item pred[2] = { { "fc1.weight", PI2_DT_F16, 2, { 8, 16 }, d },
                                  { "fc2.weight", PI2_DT_F16, 2, { 24, 8 }, d } };
    if (strcmp(kind, "four") == 0)
        return pi2_tz_write(out, 4, four, err);
    if (strcmp(kind, "all") == 0)
        return pi2_tz_write(out, 7, all, err);
    if (strcmp(kind, "pred") == 0)
        return pi2_tz_write(out, 2, pred, err);
    return pi2_err_set(err, PI2_EINVAL, "tz: unknown kind '%s'", kind);
}

static uint32_t le(const uint8_t *p, int n)
{
    uint32_t v = 0;
    for (int i = n; i-- > 0;)
        v = v << 8 | p[i];
    return v;
}

/* The data.pkl member of a small zip: end record (no comment), central
 * directory, local header. */
static int tz_pkl(const char *in, const char *out, pi2_err *err)
{
    char *b = NULL;
    size_t n = 0;
    int rc = pi2_read_file(in, 1u << 24, &b, &n, err);
    if (rc != 0)
        return rc;
    const uint8_t *u = (const uint8_t *)b;
    rc = pi2_err_set(err, PI2_EFORMAT, "%s: no data.pkl member found", in);
    if (n >= 22 && le(u + n - 22, 4) == 0x06054b50) {
        size_t cd = le(u + n - 6, 4), end = cd + le(u + n - 10, 4);
        for (size_t p = cd; end <= n && p + 46 <= end;) {
            size_t nl = le(u + p + 28, 2), xl = le(u + p + 30, 2), cl = le(u + p + 32, 2);
            size_t size = le(u + p + 20, 4), lh = le(u + p + 42, 4);
            if (p + 46 + nl > end)
                break;
            if (nl > 9 && memcmp(u + p + 46 + nl - 9, "/data.pkl", 9) == 0 && lh + 30 <= n) {
                size_t off = lh + 30 + le(u + lh + 26, 2) + le(u + lh + 28, 2);
                if (off <= n && size <= n - off) {
                    pi2_afile *f;
                    pi2_err_clear(err);
                    rc = pi2_afile_open(&f, out, err);
                    if (rc == 0 && (rc = pi2_afile_write(f, u + off, size, err)) == 0)
                        rc = pi2_afile_commit(f, err);
                    else
                        pi2_afile_abort(f); /* NULL when the open failed */
                }
                break;
            }
            p += 46 + nl + xl + cl;
        }
    }
    free(b);
    return rc;
}

int main(int argc, char **argv)
{
    pi2_err err = {0};
    int rc;
    if (argc >= 5 && strcmp(argv[1], "st-trim") == 0)
        rc = st_trim(argv[2], argv[3], (size_t)strtoul(argv[4], NULL, 10), &err);
    else if (argc >= 3 && strcmp(argv[1], "ctr") == 0)
        rc = ctr(argv[2], argc - 3, argv + 3, &err);
    else if (argc >= 5 && strcmp(argv[1], "tok") == 0)
        rc = pi2_tok_write_synthetic(argv[2], atoi(argv[3]), strtoull(argv[4], NULL, 10), &err);
    else if (argc >= 4 && strcmp(argv[1], "tz") == 0)
        rc = tz(argv[2], argv[3], &err);
    else if (argc >= 4 && strcmp(argv[1], "tz-pkl") == 0)
        rc = tz_pkl(argv[2], argv[3], &err);
    else {
        fprintf(stderr, "usage: gen-seeds st-trim IN OUT K | ctr OUT NAME=FILE... | tok OUT VOCAB SEED | "
                        "tz OUT four|all|pred | tz-pkl IN OUT\n");
        return 2;
    }
    if (rc != 0) {
        fprintf(stderr, "gen-seeds: %s\n", err.msg);
        return 1;
    }
    return 0;
}
