/* sign: SHA-256 known answers, Ed25519 keygen/sign/verify, key file errors.
 * Foreign keys (RSA, EC, encrypted) are made here with libcrypto directly:
 * pi2 itself can only write Ed25519 keys, and the loader must reject others. */
#include "tests/testutil.h"

#include "formats/sign.h"


#include <openssl/evp.h>
#include <openssl/pem.h>

static void path_in(char *buf, size_t cap, const char *dir, const char *name)
{
    assert_true(pi2_path_join(buf, cap, dir, name));
}

static char *slurp(const char *path, size_t *len)
{
    char *buf = NULL;
    assert_int_equal(pi2_read_file(path, 1u << 20, &buf, len, NULL), 0);
    return buf;
}

static void hex_of(const void *msg, size_t n, char out[PI2_SHA256_HEX_LEN])
{
    uint8_t d[PI2_SHA256_LEN];
    assert_int_equal(pi2_sha256(msg, n, d, NULL), 0);
    pi2_sha256_hex(d, out);
}

static void test_sha256_vectors(void **state)
{
    (void)state;
    char hex[PI2_SHA256_HEX_LEN];
    /* FIPS 180-2 / NIST examples */
    hex_of("abc", 3, hex);
    assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    hex_of("", 0, hex);
    assert_string_equal(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    hex_of(NULL, 0, hex);
    assert_string_equal(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    hex_of(two, strlen(two), hex);
    assert_string_equal(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");

    /* one million 'a', streamed in uneven chunks, context reused after final */
    char *a = malloc(1000000);
    assert_non_null(a);
    memset(a, 'a', 1000000);
    pi2_sha256_ctx *c;
    assert_int_equal(pi2_sha256_init(&c, NULL), 0);
    for (int round = 0; round < 2; round++) {
        size_t off = 0, step = 1;
        while (off < 1000000) {
            size_t n = step < 1000000 - off ? step : 1000000 - off;
            assert_int_equal(pi2_sha256_update(c, a + off, n, NULL), 0);
            off += n;
            step = step * 3 + 1;
        }
        uint8_t d[PI2_SHA256_LEN];
        assert_int_equal(pi2_sha256_final(c, d, NULL), 0);
        pi2_sha256_hex(d, hex);
        assert_string_equal(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    }
    /* after final the context is empty again */
    uint8_t d[PI2_SHA256_LEN];
    assert_int_equal(pi2_sha256_update(c, "ab", 2, NULL), 0);
    assert_int_equal(pi2_sha256_update(c, "c", 1, NULL), 0);
    assert_int_equal(pi2_sha256_final(c, d, NULL), 0);
    pi2_sha256_hex(d, hex);
    assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    pi2_sha256_free(c);
    pi2_sha256_free(NULL);
    free(a);
}

static void test_sha256_hex_parse(void **state)
{
    (void)state;
    pi2_err err = {0};
    uint8_t d[PI2_SHA256_LEN], back[PI2_SHA256_LEN];
    char hex[PI2_SHA256_HEX_LEN];
    assert_int_equal(pi2_sha256("abc", 3, d, NULL), 0);
    pi2_sha256_hex(d, hex);
    assert_int_equal(pi2_sha256_parse_hex(hex, back, &err), 0);
    assert_memory_equal(d, back, sizeof d);
    assert_int_equal(
        pi2_sha256_parse_hex("BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD", back, NULL), 0);
    assert_memory_equal(d, back, sizeof d);

    memset(back, 0x55, sizeof back);
    const char *bad[] = {
        "",
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015a",   /* 63 */
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad0", /* 65 */
        "ga7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015a ",
        " ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015a",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        pi2_err_clear(&err);
        assert_int_equal(pi2_sha256_parse_hex(bad[i], back, &err), PI2_EFORMAT);
        assert_non_null(strstr(err.msg, "64 hex digits"));
    }
    assert_int_equal(pi2_sha256_parse_hex(NULL, back, NULL), PI2_EFORMAT);
    for (size_t i = 0; i < sizeof back; i++)
        assert_int_equal(back[i], 0x55); /* untouched on failure */
}

static void test_keygen_files(void **state)
{
    (void)state;
    char dir[64], priv[256], pub[256];
    pi2t_tmpdir(dir, sizeof dir);
    path_in(priv, sizeof priv, dir, "k.pem");
    path_in(pub, sizeof pub, dir, "k.pub");
    mode_t old = umask(0); /* even with a permissive umask the key is 0600 */
    pi2_err err = {0};
    int rc = pi2_sign_keygen(priv, pub, &err);
    umask(old);
    assert_int_equal(rc, 0);
    struct stat st;
    assert_int_equal(stat(priv, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(stat(pub, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0644);
    assert_int_equal(pi2t_count_entries(dir), 2); /* no temp files left */

    size_t n;
    char *text = slurp(priv, &n);
    assert_non_null(strstr(text, "-----BEGIN PRIVATE KEY-----"));
    free(text);
    text = slurp(pub, &n);
    assert_non_null(strstr(text, "-----BEGIN PUBLIC KEY-----"));
    free(text);

    /* two key pairs differ */
    char priv2[256], pub2[256];
    path_in(priv2, sizeof priv2, dir, "k2.pem");
    path_in(pub2, sizeof pub2, dir, "k2.pub");
    assert_int_equal(pi2_sign_keygen(priv2, pub2, NULL), 0);
    pi2_sign_key *a, *b;
    assert_int_equal(pi2_sign_key_load_public(&a, pub, NULL), 0);
    assert_int_equal(pi2_sign_key_load_public(&b, pub2, NULL), 0);
    uint8_t ra[PI2_SIGN_PUBKEY_LEN], rb[PI2_SIGN_PUBKEY_LEN];
    assert_int_equal(pi2_sign_key_raw_public(a, ra, NULL), 0);
    assert_int_equal(pi2_sign_key_raw_public(b, rb, NULL), 0);
    assert_memory_not_equal(ra, rb, sizeof ra);
    pi2_sign_key_free(a);
    pi2_sign_key_free(b);
    pi2t_rmtree(dir);
}

static void test_keygen_refuses_existing(void **state)
{
    (void)state;
    char dir[64], priv[256], pub[256];
    pi2t_tmpdir(dir, sizeof dir);
    path_in(priv, sizeof priv, dir, "k.pem");
    path_in(pub, sizeof pub, dir, "k.pub");
    pi2_err err = {0};

    /* existing private key path: refused, the file is untouched, no public key */
    pi2t_write(priv, "precious", 8);
    assert_int_equal(pi2_sign_keygen(priv, pub, &err), PI2_EINVAL);
    assert_non_null(strstr(err.msg, priv));
    assert_non_null(strstr(err.msg, "already exists"));
    size_t n;
    char *text = slurp(priv, &n);
    assert_string_equal(text, "precious");
    free(text);
    assert_false(pi2t_exists(pub));
    assert_int_equal(unlink(priv), 0);

    /* existing public key path: refused, no private key written */
    pi2t_write(pub, "precious", 8);
    pi2_err_clear(&err);
    assert_int_equal(pi2_sign_keygen(priv, pub, &err), PI2_EINVAL);
    assert_non_null(strstr(err.msg, pub));
    assert_false(pi2t_exists(priv));
    assert_int_equal(pi2t_count_entries(dir), 1);

    /* same path for both */
    assert_int_equal(unlink(pub), 0);
    pi2_err_clear(&err);
    assert_int_equal(pi2_sign_keygen(priv, priv, &err), PI2_EINVAL);
    assert_false(pi2t_exists(priv));

    /* a second keygen over a real pair is refused too */
    assert_int_equal(pi2_sign_keygen(priv, pub, NULL), 0);
    text = slurp(priv, &n);
    pi2_err_clear(&err);
    assert_int_equal(pi2_sign_keygen(priv, pub, &err), PI2_EINVAL);
    char *again = slurp(priv, &n);
    assert_string_equal(text, again);
    free(text);
    free(again);
    assert_int_equal(pi2t_count_entries(dir), 2);

    /* unwritable directory */
    char bad[300];
    path_in(bad, sizeof bad, dir, "missing/k.pem");
    pi2_err_clear(&err);
    assert_int_equal(pi2_sign_keygen(bad, pub, &err), PI2_EINVAL); /* pub exists: refused first */
    char bad2[300];
    path_in(bad2, sizeof bad2, dir, "missing/k.pub");
    pi2_err_clear(&err);
    assert_int_equal(pi2_sign_keygen(bad, bad2, &err), PI2_EIO);
    assert_non_null(strstr(err.msg, bad));
    pi2t_rmtree(dir);
}

static void make_pair(const char *dir, const char *stem, char *priv, char *pub)
{
    char name[64];
    snprintf(name, sizeof name, "%s.pem", stem);
    path_in(priv, 256, dir, name);
    snprintf(name, sizeof name, "%s.pub", stem);
    path_in(pub, 256, dir, name);
    assert_int_equal(pi2_sign_keygen(priv, pub, NULL), 0);
}

static void test_sign_verify(void **state)
{
    (void)state;
    char dir[64], priv[256], pub[256], priv2[256], pub2[256];
    pi2t_tmpdir(dir, sizeof dir);
    make_pair(dir, "a", priv, pub);
    make_pair(dir, "b", priv2, pub2);
    pi2_sign_key *sk, *pk, *pk2;
    pi2_err err = {0};
    assert_int_equal(pi2_sign_key_load_private(&sk, priv, &err), 0);
    assert_int_equal(pi2_sign_key_load_public(&pk, pub, &err), 0);
    assert_int_equal(pi2_sign_key_load_public(&pk2, pub2, &err), 0);
    assert_true(pi2_sign_key_is_private(sk));
    assert_false(pi2_sign_key_is_private(pk));
    uint8_t r1[PI2_SIGN_PUBKEY_LEN], r2[PI2_SIGN_PUBKEY_LEN];
    assert_int_equal(pi2_sign_key_raw_public(sk, r1, NULL), 0);
    assert_int_equal(pi2_sign_key_raw_public(pk, r2, NULL), 0);
    assert_memory_equal(r1, r2, sizeof r1);

    char msg[] = "{\"format\": 1, \"sections\": []}";
    size_t len = strlen(msg);
    uint8_t sig[PI2_SIG_LEN], sig2[PI2_SIG_LEN];
    assert_int_equal(pi2_sign(sk, msg, len, sig, &err), 0);
    assert_int_equal(pi2_sign_verify(pk, msg, len, sig, sizeof sig, &err), 0);
    assert_int_equal(pi2_sign_verify(sk, msg, len, sig, sizeof sig, &err), 0);
    /* Ed25519 is deterministic */
    assert_int_equal(pi2_sign(sk, msg, len, sig2, &err), 0);
    assert_memory_equal(sig, sig2, sizeof sig);

    /* tampered message: every byte position */
    for (size_t i = 0; i < len; i++) {
        msg[i] ^= 0x01;
        pi2_err_clear(&err);
        assert_int_equal(pi2_sign_verify(pk, msg, len, sig, sizeof sig, &err), PI2_ESIG);
        msg[i] ^= 0x01;
    }
    assert_non_null(strstr(err.msg, pub));
    assert_int_equal(pi2_sign_verify(pk, msg, len - 1, sig, sizeof sig, NULL), PI2_ESIG);
    /* tampered signature: every byte */
    for (size_t i = 0; i < sizeof sig; i++) {
        sig[i] ^= 0x80;
        assert_int_equal(pi2_sign_verify(pk, msg, len, sig, sizeof sig, NULL), PI2_ESIG);
        sig[i] ^= 0x80;
    }
    /* wrong length / missing */
    assert_int_equal(pi2_sign_verify(pk, msg, len, sig, sizeof sig - 1, NULL), PI2_ESIG);
    uint8_t longer[PI2_SIG_LEN + 1] = {0};
    memcpy(longer, sig, sizeof sig);
    assert_int_equal(pi2_sign_verify(pk, msg, len, longer, sizeof longer, NULL), PI2_ESIG);
    assert_int_equal(pi2_sign_verify(pk, msg, len, NULL, 0, NULL), PI2_ESIG);
    /* wrong key */
    pi2_err_clear(&err);
    assert_int_equal(pi2_sign_verify(pk2, msg, len, sig, sizeof sig, &err), PI2_ESIG);
    assert_non_null(strstr(err.msg, "does not verify"));
    /* still fine afterwards */
    assert_int_equal(pi2_sign_verify(pk, msg, len, sig, sizeof sig, NULL), 0);

    /* empty message */
    assert_int_equal(pi2_sign(sk, NULL, 0, sig, NULL), 0);
    assert_int_equal(pi2_sign_verify(pk, "", 0, sig, sizeof sig, NULL), 0);
    assert_int_equal(pi2_sign_verify(pk, "x", 1, sig, sizeof sig, NULL), PI2_ESIG);

    /* a public key cannot sign */
    pi2_err_clear(&err);
    assert_int_equal(pi2_sign(pk, msg, len, sig, &err), PI2_EINVAL);
    assert_non_null(strstr(err.msg, "public key"));

    pi2_sign_key_free(sk);
    pi2_sign_key_free(pk);
    pi2_sign_key_free(pk2);
    pi2_sign_key_free(NULL);
    pi2t_rmtree(dir);
}

/* Write pkey as PKCS#8 private PEM and SPKI public PEM. */
static void write_foreign(EVP_PKEY *pkey, const char *priv, const char *pub)
{
    FILE *f = fopen(priv, "w");
    assert_non_null(f);
    assert_int_equal(PEM_write_PrivateKey(f, pkey, NULL, NULL, 0, NULL, NULL), 1);
    assert_int_equal(fclose(f), 0);
    f = fopen(pub, "w");
    assert_non_null(f);
    assert_int_equal(PEM_write_PUBKEY(f, pkey), 1);
    assert_int_equal(fclose(f), 0);
}

static void expect_load(const char *path, bool priv, int code, const char *a, const char *b)
{
    pi2_sign_key *k = (pi2_sign_key *)1;
    pi2_err err = {0};
    int rc = priv ? pi2_sign_key_load_private(&k, path, &err) : pi2_sign_key_load_public(&k, path, &err);
    if (rc != code)
        fprintf(stderr, "%s: got %d (%s), want %d\n", path, rc, err.msg, code);
    assert_int_equal(rc, code);
    assert_null(k);
    assert_int_equal(err.code, code);
    assert_non_null(strstr(err.msg, path));
    if (a && !strstr(err.msg, a))
        fail_msg("message '%s' lacks '%s'", err.msg, a);
    if (b && !strstr(err.msg, b))
        fail_msg("message '%s' lacks '%s'", err.msg, b);
}

static void test_foreign_keys(void **state)
{
    (void)state;
    char dir[64], priv[256], pub[256];
    pi2t_tmpdir(dir, sizeof dir);

    EVP_PKEY *rsa = EVP_PKEY_Q_keygen(NULL, NULL, "RSA", (size_t)2048);
    assert_non_null(rsa);
    path_in(priv, sizeof priv, dir, "rsa.pem");
    path_in(pub, sizeof pub, dir, "rsa.pub");
    write_foreign(rsa, priv, pub);
    expect_load(priv, true, PI2_EUNSUPPORTED, "RSA", "not Ed25519");
    expect_load(pub, false, PI2_EUNSUPPORTED, "RSA", "not Ed25519");

    /* traditional "BEGIN RSA PRIVATE KEY" form */
    char trad[256];
    path_in(trad, sizeof trad, dir, "rsa-trad.pem");
    BIO *bio = BIO_new_file(trad, "w");
    assert_non_null(bio);
    assert_int_equal(PEM_write_bio_PrivateKey_traditional(bio, rsa, NULL, NULL, 0, NULL, NULL), 1);
    BIO_free(bio);
    size_t n;
    char *text = slurp(trad, &n);
    assert_non_null(strstr(text, "BEGIN RSA PRIVATE KEY"));
    free(text);
    expect_load(trad, true, PI2_EUNSUPPORTED, "RSA", "not Ed25519");

    /* encrypted PKCS#8: refused without prompting for a passphrase */
    char enc[256];
    path_in(enc, sizeof enc, dir, "enc.pem");
    FILE *f = fopen(enc, "w");
    assert_non_null(f);
    assert_int_equal(PEM_write_PKCS8PrivateKey(f, rsa, EVP_aes_256_cbc(), "secret", 6, NULL, NULL), 1);
    assert_int_equal(fclose(f), 0);
    expect_load(enc, true, PI2_EUNSUPPORTED, "encrypted", NULL);
    EVP_PKEY_free(rsa);

    EVP_PKEY *ec = EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-256");
    assert_non_null(ec);
    path_in(priv, sizeof priv, dir, "ec.pem");
    path_in(pub, sizeof pub, dir, "ec.pub");
    write_foreign(ec, priv, pub);
    expect_load(priv, true, PI2_EUNSUPPORTED, "EC key", "not Ed25519");
    expect_load(pub, false, PI2_EUNSUPPORTED, "EC key", "not Ed25519");
    EVP_PKEY_free(ec);

    EVP_PKEY *ed448 = EVP_PKEY_Q_keygen(NULL, NULL, "ED448");
    assert_non_null(ed448);
    path_in(priv, sizeof priv, dir, "ed448.pem");
    path_in(pub, sizeof pub, dir, "ed448.pub");
    write_foreign(ed448, priv, pub);
    expect_load(priv, true, PI2_EUNSUPPORTED, "ED448", "not Ed25519");
    expect_load(pub, false, PI2_EUNSUPPORTED, "ED448", "not Ed25519");
    EVP_PKEY_free(ed448);
    pi2t_rmtree(dir);
}

static void test_bad_key_files(void **state)
{
    (void)state;
    char dir[64], priv[256], pub[256], p[256];
    pi2t_tmpdir(dir, sizeof dir);
    make_pair(dir, "k", priv, pub);
    size_t n;
    char *good = slurp(priv, &n);

    /* missing, directory, empty, not PEM, binary */
    path_in(p, sizeof p, dir, "nope.pem");
    expect_load(p, true, PI2_ENOTFOUND, NULL, NULL);
    expect_load(p, false, PI2_ENOTFOUND, NULL, NULL);
    expect_load(dir, true, PI2_EIO, NULL, NULL);
    path_in(p, sizeof p, dir, "empty.pem");
    pi2t_write(p, "", 0);
    expect_load(p, true, PI2_EFORMAT, "not a PEM file", NULL);
    path_in(p, sizeof p, dir, "text.pem");
    pi2t_write(p, "hello world\n", 12);
    expect_load(p, true, PI2_EFORMAT, "not a PEM file", NULL);
    expect_load(p, false, PI2_EFORMAT, "not a PEM file", NULL);
    path_in(p, sizeof p, dir, "bin.pem");
    uint8_t bin[300];
    for (size_t i = 0; i < sizeof bin; i++)
        bin[i] = (uint8_t)(i * 37);
    pi2t_write(p, bin, sizeof bin);
    expect_load(p, true, PI2_EFORMAT, "not a PEM file", NULL);

    /* too large */
    path_in(p, sizeof p, dir, "big.pem");
    char *big = calloc(1, PI2_SIGN_MAX_PEM + 1);
    assert_non_null(big);
    memset(big, 'A', PI2_SIGN_MAX_PEM + 1);
    pi2t_write(p, big, PI2_SIGN_MAX_PEM + 1);
    free(big);
    expect_load(p, true, PI2_ERANGE, NULL, NULL);

    /* public where private expected and the reverse */
    expect_load(pub, true, PI2_EFORMAT, "public key", "not a private key");
    expect_load(priv, false, PI2_EFORMAT, "private key", "not a public key");

    /* a certificate-like block */
    path_in(p, sizeof p, dir, "cert.pem");
    const char *cert = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
    pi2t_write(p, cert, strlen(cert));
    expect_load(p, true, PI2_EFORMAT, "CERTIFICATE", NULL);
    expect_load(p, false, PI2_EFORMAT, "CERTIFICATE", NULL);

    /* corrupt base64 body */
    size_t line = strcspn(good, "\n"); /* end of the BEGIN line */
    assert_true(line < n);
    char *bad = calloc(1, 4096);
    assert_non_null(bad);
    assert_true(n < 4096);
    memcpy(bad, good, n);
    bad[line + 5] = '!';
    bad[line + 6] = '*';
    path_in(p, sizeof p, dir, "corrupt.pem");
    pi2t_write(p, bad, n);
    expect_load(p, true, PI2_EFORMAT, "corrupt PEM", NULL);
    /* corrupt DER inside valid base64 (first byte of the body: 'M' -> 'A') */
    memcpy(bad, good, n);
    bad[line + 1] = 'A';
    pi2t_write(p, bad, n);
    expect_load(p, true, PI2_EFORMAT, "corrupt PEM", NULL);
    /* truncated: no END line */
    pi2t_write(p, good, n / 2);
    expect_load(p, true, PI2_EFORMAT, "corrupt PEM", NULL);
    /* same damage to the public key */
    char *pgood = slurp(pub, &n);
    assert_true(n < 4096);
    line = strcspn(pgood, "\n");
    pi2t_write(p, pgood, n - 30);
    expect_load(p, false, PI2_EFORMAT, "corrupt PEM", NULL);
    memcpy(bad, pgood, n);
    bad[line + 3] = '%';
    pi2t_write(p, bad, n);
    expect_load(p, false, PI2_EFORMAT, "corrupt PEM", NULL);
    free(pgood);
    free(bad);

    /* leading text is fine */
    path_in(p, sizeof p, dir, "lead.pem");
    size_t gl = strlen(good);
    char *lead = malloc(gl + 64);
    assert_non_null(lead);
    memcpy(lead, "Key for pi2 tests\n", 18);
    memcpy(lead + 18, good, gl);
    pi2t_write(p, lead, 18 + gl);
    free(lead);
    pi2_sign_key *k;
    assert_int_equal(pi2_sign_key_load_private(&k, p, NULL), 0);
    pi2_sign_key_free(k);
    free(good);
    pi2t_rmtree(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sha256_vectors),
        cmocka_unit_test(test_sha256_hex_parse),
        cmocka_unit_test(test_keygen_files),
        cmocka_unit_test(test_keygen_refuses_existing),
        cmocka_unit_test(test_sign_verify),
        cmocka_unit_test(test_foreign_keys),
        cmocka_unit_test(test_bad_key_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
