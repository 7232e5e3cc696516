/* Test helper: convert a model directory and bundle it, as the golden tests
 * of the engine and the fixtures of offloading need. */
#ifndef PI2_TESTMODEL_H
#define PI2_TESTMODEL_H

#include "bundle/bundle.h"
#include "convert/convert.h"

#include <stdio.h>

/* model_dir -> <tmp>/<name>.pi2c -> <tmp>/<name>.pi2 (written to out),
 * q8 attention, the given FFN quant and I/O unit (0: default), signed with
 * key. One BLAS thread: ThreadSanitizer cannot see OpenBLAS's
 * synchronisation. 0, or the converter's or bundler's error in *e. */
/* Convert model_dir at q_ffn / q_other with predictors stored at q_pred
 * (PI2_QT_F32: f16 rows) and bundle it to tmp/name.pi2 (path into out). */
static inline int pi2t_convert_bundle_q(const char *model_dir, const char *tmp, const char *name, pi2_qtype q_ffn,
                                        pi2_qtype q_other, pi2_qtype q_pred, uint32_t io_unit,
                                        const pi2_sign_key *key, char *out, size_t out_cap, pi2_err *e)
{
    char conv[1200];
    snprintf(conv, sizeof conv, "%s/%s.pi2c", tmp, name);
    snprintf(out, out_cap, "%s/%s.pi2", tmp, name);
    pi2_convert_opts co;
    pi2_convert_defaults(&co);
    co.model_dir = model_dir;
    co.out_path = conv;
    co.calib_tokens = 512;
    co.quiet = true;
    co.threads = 1;
    co.q_ffn = q_ffn;
    co.q_other = q_other;
    co.q_pred = q_pred;
    if (pi2_convert(&co, NULL, e))
        return e->code;
    pi2_bundle_opts bo;
    pi2_bundle_defaults(&bo);
    bo.in_path = conv;
    bo.out_path = out;
    bo.key = key;
    bo.quiet = true;
    if (io_unit)
        bo.io_unit = io_unit;
    return pi2_bundle_create(&bo, NULL, e);
}

static inline int pi2t_convert_bundle(const char *model_dir, const char *tmp, const char *name, pi2_qtype q_ffn,
                                      uint32_t io_unit, const pi2_sign_key *key, char *out, size_t out_cap,
                                      pi2_err *e)
{
    return pi2t_convert_bundle_q(model_dir, tmp, name, q_ffn, PI2_QT_Q8, PI2_QT_F32, io_unit, key, out, out_cap, e);
}

#endif
