/* Test helpers for the checkpoint readers (safetensors and PyTorch zips):
 * a tensor to write, its size, and an open that must succeed. */
#ifndef PI2_TESTST_H
#define PI2_TESTST_H

#include "formats/safetensors.h"
#include "tests/testutil.h"

/* A tensor to write: name, dtype and shape. */
typedef struct pi2t_spec {
    const char *name;
    pi2_dtype dt;
    int ndim;
    int64_t shape[PI2_ST_MAX_DIMS];
} pi2t_spec;

/* Its data size in bytes. */
static inline size_t pi2t_spec_bytes(const pi2t_spec *s)
{
    size_t n = pi2_dtype_size(s->dt);
    for (int i = 0; i < s->ndim; i++)
        n *= (size_t)s->shape[i];
    return n;
}

/* pi2_st_open of path, which must succeed (the caller closes it). */
static inline pi2_st *pi2t_st_open_ok(const char *path)
{
    pi2_st *st = NULL;
    pi2_err e = { 0 };
    int rc = pi2_st_open(&st, path, &e);
    if (rc != 0)
        fprintf(stderr, "unexpected failure: %s\n", e.msg);
    assert_int_equal(rc, 0);
    assert_non_null(st);
    return st;
}

#endif
