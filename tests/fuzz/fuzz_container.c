/* Fuzz target: container reader (pi2_ctr_open on a temp file holding the
 * input), member iteration and lookup, pi2_ctr_verify_member against a zero
 * digest, then the bundle reader (pi2_bundle_open unsigned/skip-signature)
 * and pi2_bundle_verify over every member. */
#include "bundle/bundle.h"
#include "formats/container.h"
#include "tests/fuzz/fuzz_util.h"

#include <string.h>

#define MAX_HASHED_MEMBERS 64 /* bound the work per input */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    if (fuzz_tmpfile(data, size, path) != 0)
        return 0;
    pi2_err err = {0};
    pi2_ctr *c = NULL;
    if (pi2_ctr_open(&c, path, &err) == 0) {
        static const uint8_t zero[PI2_SHA256_LEN];
        size_t n = pi2_ctr_count(c);
        for (size_t i = 0; i < n; i++) {
            const pi2_ctr_member *mb = pi2_ctr_at(c, i);
            if (!mb || pi2_ctr_find(c, mb->name) != mb || mb->offset % PI2_CTR_ALIGN != 0 ||
                mb->offset > size || mb->size > size - mb->offset)
                abort(); /* the reader's own guarantees */
            if (i < MAX_HASHED_MEMBERS) {
                pi2_err e2 = {0};
                (void)pi2_ctr_verify_member(c, mb, zero, &e2);
            }
        }
        (void)pi2_ctr_at(c, n);
        (void)pi2_ctr_path(c);
        pi2_ctr_close(c);
    }
    pi2_bundle *b = NULL;
    pi2_bundle_open_opts o = {.pubkey = NULL, .allow_unsigned = true, .skip_signature = true};
    pi2_err_clear(&err);
    if (pi2_bundle_open(&b, path, &o, &err) == 0) {
        uint64_t done = 0;
        pi2_err e2 = {0};
        (void)pi2_bundle_sig_status(b);
        (void)pi2_bundle_manifest(b);
        (void)pi2_bundle_layout_get(b);
        (void)pi2_bundle_verify(b, true, &done, &e2);
        pi2_err_clear(&e2);
        (void)pi2_bundle_verify(b, false, &done, &e2);
        (void)pi2_bundle_perm(b, 0);
        pi2_bundle_neuron nr;
        (void)pi2_bundle_get_neuron(b, 0, 0, &nr, &e2);
        FILE *devnull = fopen("/dev/null", "w");
        if (devnull) {
            (void)pi2_bundle_inspect(b, devnull, &e2);
            fclose(devnull);
        }
        pi2_bundle_close(b);
    }
    unlink(path);
    return 0;
}
