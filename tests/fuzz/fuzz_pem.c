/* Fuzz target: key files (formats/sign.c): the input as a public and as a
 * private PEM key. A key read must give its raw public key; a private key
 * must sign, and the signature verify with it. */
#include "formats/sign.h"
#include "tests/fuzz/fuzz_util.h"

#include <string.h>

static void use_key(pi2_sign_key *k)
{
    uint8_t raw[PI2_SIGN_PUBKEY_LEN], sig[PI2_SIG_LEN];
    pi2_err e = {0};
    if (pi2_sign_key_raw_public(k, raw, &e) != 0) {
        fprintf(stderr, "a read key has no raw public key: %s\n", e.msg);
        abort();
    }
    if (!pi2_sign_key_is_private(k))
        return;
    static const char msg[] = "pi2 fuzz";
    if (pi2_sign(k, msg, sizeof msg, sig, &e) != 0 || pi2_sign_verify(k, msg, sizeof msg, sig, sizeof sig, &e) != 0) {
        fprintf(stderr, "a read private key does not sign and verify: %s\n", e.msg);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    if (fuzz_tmpfile(data, size, path) != 0)
        return 0;
    pi2_sign_key *k = NULL;
    pi2_err err = {0};
    if (pi2_sign_key_load_public(&k, path, &err) == 0)
        use_key(k);
    else if (!err.msg[0] || !strstr(err.msg, path)) {
        fprintf(stderr, "a refused public key's message does not name the file: %s\n", err.msg);
        abort();
    }
    pi2_sign_key_free(k);
    k = NULL;
    pi2_err e2 = {0};
    if (pi2_sign_key_load_private(&k, path, &e2) == 0)
        use_key(k);
    else if (!e2.msg[0] || !strstr(e2.msg, path)) {
        fprintf(stderr, "a refused private key's message does not name the file: %s\n", e2.msg);
        abort();
    }
    pi2_sign_key_free(k);
    unlink(path);
    return 0;
}
