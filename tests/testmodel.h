/* Test helpers: a signing key pair, converting a model directory and
 * bundling it, and opening a container's manifest, as the golden tests of the engine and the fixtures of
 * offloading need. */
#ifndef PI2_TESTMODEL_H
#define PI2_TESTMODEL_H

#include "bundle/bundle.h"
#include "convert/convert.h"
#include "formats/sign.h"
#include "tests/testutil.h"

#include <stdbool.h>
#include <stdio.h>

/* A fresh key pair written to dir/<stem>.pem and dir/<stem>.pub; the private
 * key loaded into *key and the public one into *pub when those are not NULL
 * (the caller frees them). 0, or the signing module's error in *e. */
static inline int pi2t_keypair(const char *dir, const char *stem, pi2_sign_key **key, pi2_sign_key **pub,
                               pi2_err *e)
{
    char priv[1200], pubp[1200];
    snprintf(priv, sizeof priv, "%s/%s.pem", dir, stem);
    snprintf(pubp, sizeof pubp, "%s/%s.pub", dir, stem);
    int rc = pi2_sign_keygen(priv, pubp, e);
    if (rc == 0 && key)
        rc = pi2_sign_key_load_private(key, priv, e);
    if (rc == 0 && pub)
        rc = pi2_sign_key_load_public(pub, pubp, e);
    return rc;
}

/* Bundle the converted model conv into out at the given I/O unit (0:
 * default) and FFN layout, signed with key (NULL: unsigned), quietly. */
static inline int pi2t_bundle(const char *conv, const char *out, uint32_t io_unit, bool two_phase,
                              const pi2_sign_key *key, pi2_err *e)
{
    pi2_bundle_opts bo;
    pi2_bundle_defaults(&bo);
    bo.in_path = conv;
    bo.out_path = out;
    bo.key = key;
    bo.allow_unsigned = key == NULL;
    bo.quiet = true;
    bo.two_phase = two_phase;
    bo.io_unit = io_unit;
    return pi2_bundle_create(&bo, NULL, e);
}

/* model_dir -> <tmp>/<name>.pi2c -> <tmp>/<name>.pi2 (path into out): FFN
 * rows at q_ffn, the others at q_other, predictors stored at q_pred
 * (PI2_QT_F32: f16 rows), trained by the converter when train (and the
 * checkpoint has none); the given I/O unit (0: default) and FFN layout;
 * signed with key.
 * One BLAS thread: ThreadSanitizer cannot see OpenBLAS's synchronisation.
 * 0, or the converter's or bundler's error in *e. */
static inline int pi2t_convert_bundle_lay(const char *model_dir, const char *tmp, const char *name, pi2_qtype q_ffn,
                                          pi2_qtype q_other, pi2_qtype q_pred, bool train, uint32_t io_unit,
                                          bool two_phase, const pi2_sign_key *key, char *out, size_t out_cap,
                                          pi2_err *e)
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
    co.train_predictors = train;
    co.q_ffn = q_ffn;
    co.q_other = q_other;
    co.q_pred = q_pred;
    if (pi2_convert(&co, NULL, e))
        return e->code;
    return pi2t_bundle(conv, out, io_unit, two_phase, key, e);
}

/* The same at the default FFN layout. */
static inline int pi2t_convert_bundle_q(const char *model_dir, const char *tmp, const char *name, pi2_qtype q_ffn,
                                        pi2_qtype q_other, pi2_qtype q_pred, bool train, uint32_t io_unit,
                                        const pi2_sign_key *key, char *out, size_t out_cap, pi2_err *e)
{
    return pi2t_convert_bundle_lay(model_dir, tmp, name, q_ffn, q_other, q_pred, train, io_unit, false, key, out,
                                   out_cap, e);
}

/* The same with q8 attention, f16 predictors and no training. */
static inline int pi2t_convert_bundle(const char *model_dir, const char *tmp, const char *name, pi2_qtype q_ffn,
                                      uint32_t io_unit, const pi2_sign_key *key, char *out, size_t out_cap,
                                      pi2_err *e)
{
    return pi2t_convert_bundle_q(model_dir, tmp, name, q_ffn, PI2_QT_Q8, PI2_QT_F32, false, io_unit, key, out,
                                 out_cap, e);
}

/* Open the container at path and parse its manifest, failing the test
 * otherwise. The caller closes both. */
static inline void pi2t_open_manifest(const char *path, pi2_ctr **c, pi2_manifest **mf)
{
    pi2_err e = {0};
    if (pi2_ctr_open(c, path, &e))
        fail_msg("%s", e.msg);
    const pi2_ctr_member *m = pi2_ctr_find(*c, PI2_MF_NAME);
    assert_non_null(m);
    if (pi2_manifest_parse((const char *)m->data, (size_t)m->size, path, mf, &e))
        fail_msg("%s", e.msg);
}

#endif
