/* Seed generator for the fuzz corpora (tests/fuzz/make-corpus.sh), through
 * the project's own writers:
 *   gen-seeds st-trim IN OUT K   the first K tensors of safetensors IN, each
 *                                cut to at most 4 x 16 elements (leading
 *                                block of a matrix), dtype and metadata kept
 *   gen-seeds ctr OUT NAME=FILE...  a container with these members, in order
 *   gen-seeds tok OUT VOCAB SEED    pi2_tok_write_synthetic
 * Exit status 1 with one line on stderr on failure. */
#include "formats/container.h"
#include "formats/safetensors.h"
#include "formats/tokenizer.h"

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
    else {
        fprintf(stderr, "usage: gen-seeds st-trim IN OUT K | ctr OUT NAME=FILE... | tok OUT VOCAB SEED\n");
        return 2;
    }
    if (rc != 0) {
        fprintf(stderr, "gen-seeds: %s\n", err.msg);
        return 1;
    }
    return 0;
}
