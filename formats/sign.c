/* SHA-256 and Ed25519 over OpenSSL 3 EVP. The rest of pi2 sees only opaque
 * contexts and keys, so OpenSSL stays inside this file.
 *
 * Why the key files are not written through pi2_afile: that writer makes the
 * file 0644 and renames over an existing file; a private key must stay 0600
 * from creation on, and keygen must never replace an existing key. So keys
 * go to a mkostemp file (born 0600), are fsynced, then hard-linked to the
 * final name, which fails atomically with EEXIST if something is there. */
#include "formats/sign.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

/* Last OpenSSL error reason as text (never NULL); clears the error queue. */
static const char *ossl_reason(void)
{
    unsigned long e = ERR_peek_last_error();
    const char *r = e ? ERR_reason_error_string(e) : NULL;
    ERR_clear_error();
    return r ? r : "unknown OpenSSL error";
}

/* ---- SHA-256 ---- */

struct pi2_sha256_ctx {
    EVP_MD_CTX *md;
};

int pi2_sha256_init(pi2_sha256_ctx **out, pi2_err *err)
{
    *out = NULL;
    pi2_sha256_ctx *c = calloc(1, sizeof *c);
    if (!c || !(c->md = EVP_MD_CTX_new())) {
        free(c);
        return pi2_err_set(err, PI2_ENOMEM, "sha256: out of memory");
    }
    if (EVP_DigestInit_ex(c->md, EVP_sha256(), NULL) != 1) {
        pi2_sha256_free(c);
        return pi2_err_set(err, PI2_EUNSUPPORTED, "sha256: cannot initialise digest: %s", ossl_reason());
    }
    *out = c;
    return 0;
}

int pi2_sha256_update(pi2_sha256_ctx *c, const void *buf, size_t n, pi2_err *err)
{
    if (n == 0)
        return 0;
    if (EVP_DigestUpdate(c->md, buf, n) != 1)
        return pi2_err_set(err, PI2_EIO, "sha256: update failed: %s", ossl_reason());
    return 0;
}

int pi2_sha256_final(pi2_sha256_ctx *c, uint8_t out[PI2_SHA256_LEN], pi2_err *err)
{
    unsigned int n = 0;
    if (EVP_DigestFinal_ex(c->md, out, &n) != 1 || n != PI2_SHA256_LEN)
        return pi2_err_set(err, PI2_EIO, "sha256: final failed: %s", ossl_reason());
    if (EVP_DigestInit_ex(c->md, EVP_sha256(), NULL) != 1)
        return pi2_err_set(err, PI2_EIO, "sha256: reset failed: %s", ossl_reason());
    return 0;
}

void pi2_sha256_free(pi2_sha256_ctx *c)
{
    if (!c)
        return;
    EVP_MD_CTX_free(c->md);
    free(c);
}

int pi2_sha256(const void *buf, size_t n, uint8_t out[PI2_SHA256_LEN], pi2_err *err)
{
    pi2_sha256_ctx *c;
    int rc = pi2_sha256_init(&c, err);
    if (rc == 0)
        rc = pi2_sha256_update(c, buf, n, err);
    if (rc == 0)
        rc = pi2_sha256_final(c, out, err);
    pi2_sha256_free(c);
    return rc;
}

void pi2_sha256_hex(const uint8_t digest[PI2_SHA256_LEN], char out[PI2_SHA256_HEX_LEN])
{
    static const char hexd[] = "0123456789abcdef";
    for (int i = 0; i < PI2_SHA256_LEN; i++) {
        out[2 * i] = hexd[digest[i] >> 4];
        out[2 * i + 1] = hexd[digest[i] & 15];
    }
    out[2 * PI2_SHA256_LEN] = 0;
}


int pi2_sha256_parse_hex(const char *hex, uint8_t out[PI2_SHA256_LEN], pi2_err *err)
{
    uint8_t tmp[PI2_SHA256_LEN];
    for (int i = 0; i < PI2_SHA256_LEN; i++) {
        int hi = hex ? pi2_hex_digit(hex[2 * i]) : -1;
        int lo = hi >= 0 ? pi2_hex_digit(hex[2 * i + 1]) : -1;
        if (lo < 0)
            return pi2_err_set(err, PI2_EFORMAT, "sha256 '%.80s': expected 64 hex digits", hex ? hex : "");
        tmp[i] = (uint8_t)(hi << 4 | lo);
    }
    if (hex[2 * PI2_SHA256_LEN] != 0)
        return pi2_err_set(err, PI2_EFORMAT, "sha256 '%.80s': expected 64 hex digits", hex);
    memcpy(out, tmp, sizeof tmp);
    return 0;
}

/* ---- keys ---- */

struct pi2_sign_key {
    EVP_PKEY *pkey;
    bool is_private;
    char *path; /* for messages */
};

void pi2_sign_key_free(pi2_sign_key *k)
{
    if (!k)
        return;
    EVP_PKEY_free(k->pkey);
    free(k->path);
    free(k);
}

bool pi2_sign_key_is_private(const pi2_sign_key *k) { return k->is_private; }

int pi2_sign_key_raw_public(const pi2_sign_key *k, uint8_t out[PI2_SIGN_PUBKEY_LEN], pi2_err *err)
{
    size_t n = PI2_SIGN_PUBKEY_LEN;
    if (EVP_PKEY_get_raw_public_key(k->pkey, out, &n) != 1 || n != PI2_SIGN_PUBKEY_LEN)
        return pi2_err_set(err, PI2_EIO, "%s: cannot extract the public key: %s", k->path, ossl_reason());
    return 0;
}

/* Never prompt for a passphrase: encrypted keys are refused instead. */
static int no_passphrase(char *buf, int size, int rwflag, void *u)
{
    (void)buf;
    (void)size;
    (void)rwflag;
    (void)u;
    return -1;
}

static const char *find_mem(const char *hay, size_t n, const char *needle)
{
    return memmem(hay, n, needle, strlen(needle));
}

/* Copy the label of the first "-----BEGIN <label>-----" at or after p. */
static bool pem_label(const char *buf, size_t len, const char *p, char *label, size_t cap)
{
    const char *s = p + 11; /* strlen("-----BEGIN ") */
    size_t i = 0;
    while (s + i < buf + len && s[i] != '-' && s[i] != '\n' && i + 1 < cap) {
        label[i] = s[i];
        i++;
    }
    label[i] = 0;
    return i > 0;
}

/* Does any BEGIN line carry a label ending in `suffix` (e.g. "PRIVATE KEY")? */
static bool pem_has_label(const char *buf, size_t len, const char *suffix, char *label, size_t cap)
{
    const char *p = buf;
    while ((p = find_mem(p, len - (size_t)(p - buf), "-----BEGIN ")) != NULL) {
        if (pem_label(buf, len, p, label, cap)) {
            size_t ll = strlen(label), sl = strlen(suffix);
            if (ll >= sl && strcmp(label + ll - sl, suffix) == 0)
                return true;
        }
        p += 11;
    }
    return false;
}

static int key_wrap(pi2_sign_key **out, EVP_PKEY *pkey, bool priv, const char *path, pi2_err *err)
{
    if (EVP_PKEY_get_base_id(pkey) != EVP_PKEY_ED25519) {
        const char *t = EVP_PKEY_get0_type_name(pkey);
        int rc = pi2_err_set(err, PI2_EUNSUPPORTED, "%s: %s key, not Ed25519", path,
                             t ? t : "unknown");
        EVP_PKEY_free(pkey);
        return rc;
    }
    pi2_sign_key *k = calloc(1, sizeof *k);
    char *p = pi2_strdup(path);
    if (!k || !p) {
        free(k);
        free(p);
        EVP_PKEY_free(pkey);
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", path);
    }
    k->pkey = pkey;
    k->is_private = priv;
    k->path = p;
    *out = k;
    return 0;
}

static int key_load(pi2_sign_key **out, const char *path, bool priv, pi2_err *err)
{
    *out = NULL;
    char *buf = NULL;
    size_t len = 0;
    int rc = pi2_read_file(path, PI2_SIGN_MAX_PEM, &buf, &len, err);
    if (rc)
        return rc;
    char label[64];
    EVP_PKEY *pkey = NULL;
    if (!find_mem(buf, len, "-----BEGIN ")) {
        rc = pi2_err_set(err, PI2_EFORMAT, "%s: not a PEM file (no '-----BEGIN' line)", path);
        goto done;
    }
    if (priv && (pem_has_label(buf, len, "ENCRYPTED PRIVATE KEY", label, sizeof label) ||
                 find_mem(buf, len, "Proc-Type: 4,ENCRYPTED"))) {
        rc = pi2_err_set(err, PI2_EUNSUPPORTED, "%s: encrypted private key (passphrases are not supported)", path);
        goto done;
    }
    BIO *bio = BIO_new_mem_buf(buf, (int)len);
    if (!bio) {
        rc = pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", path);
        goto done;
    }
    pkey = priv ? PEM_read_bio_PrivateKey(bio, NULL, no_passphrase, NULL)
                : PEM_read_bio_PUBKEY(bio, NULL, no_passphrase, NULL);
    BIO_free(bio);
    if (pkey) {
        ERR_clear_error();
        rc = key_wrap(out, pkey, priv, path, err);
        goto done;
    }
    const char *want = priv ? "PRIVATE KEY" : "PUBLIC KEY";
    const char *other = priv ? "PUBLIC KEY" : "PRIVATE KEY";
    if (!priv && pem_has_label(buf, len, "RSA PUBLIC KEY", label, sizeof label))
        rc = pi2_err_set(err, PI2_EUNSUPPORTED, "%s: RSA key, not Ed25519", path);
    else if (pem_has_label(buf, len, want, label, sizeof label))
        /* OpenSSL 3's decoders report "unsupported" for any damage, which
         * misleads; name the block instead. */
        rc = pi2_err_set(err, PI2_EFORMAT, "%s: corrupt PEM '%s' block (cannot decode the key)", path, label);
    else if (pem_has_label(buf, len, other, label, sizeof label))
        rc = pi2_err_set(err, PI2_EFORMAT, "%s: holds a %s, not a %s", path, priv ? "public key" : "private key",
                         priv ? "private key" : "public key");
    else {
        const char *p = find_mem(buf, len, "-----BEGIN ");
        if (!pem_label(buf, len, p, label, sizeof label))
            snprintf(label, sizeof label, "?");
        rc = pi2_err_set(err, PI2_EFORMAT, "%s: no %s in this PEM file (found '%s')", path,
                         priv ? "private key" : "public key", label);
    }
    ERR_clear_error();
done:
    OPENSSL_cleanse(buf, len);
    free(buf);
    return rc;
}

int pi2_sign_key_load_private(pi2_sign_key **out, const char *path, pi2_err *err)
{
    return key_load(out, path, true, err);
}

int pi2_sign_key_load_public(pi2_sign_key **out, const char *path, pi2_err *err)
{
    return key_load(out, path, false, err);
}

/* ---- keygen ---- */

/* Write n bytes to a new file at path with the given mode; fail with EEXIST
 * (nothing changed) if path exists. See the note at the top of this file. */
static int write_new_file(const char *path, const void *data, size_t n, mode_t mode, pi2_err *err)
{
    size_t pl = strlen(path);
    char *tmp = malloc(pl + 16);
    if (!tmp)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", path);
    snprintf(tmp, pl + 16, "%s.tmp.XXXXXX", path);
    int fd = mkostemp(tmp, O_CLOEXEC); /* created 0600 */
    if (fd < 0) {
        int e = errno;
        free(tmp);
        return pi2_err_errno(err, PI2_EIO, e, "%s: cannot create temporary file", path);
    }
    int rc = 0;
    const uint8_t *p = data;
    size_t left = n;
    while (left > 0 && rc == 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            rc = pi2_err_errno(err, PI2_EIO, w < 0 ? errno : ENOSPC, "%s: write failed", path);
        else {
            p += w;
            left -= (size_t)w;
        }
    }
    if (rc == 0 && mode != 0600 && fchmod(fd, mode) != 0)
        rc = pi2_err_errno(err, PI2_EIO, errno, "%s: chmod failed", path);
    if (rc == 0 && fsync(fd) != 0)
        rc = pi2_err_errno(err, PI2_EIO, errno, "%s: fsync failed", path);
    if (close(fd) != 0 && rc == 0)
        rc = pi2_err_errno(err, PI2_EIO, errno, "%s: close failed", path);
    if (rc == 0 && link(tmp, path) != 0) {
        int e = errno;
        if (e == EEXIST)
            rc = pi2_err_set(err, PI2_EINVAL, "%s: already exists; refusing to overwrite a key file", path);
        else if (e == EPERM || e == EOPNOTSUPP || e == ENOSYS) {
            /* file systems without hard links: rename that refuses to replace */
            if (renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_NOREPLACE) != 0) {
                e = errno;
                rc = e == EEXIST ? pi2_err_set(err, PI2_EINVAL, "%s: already exists; refusing to overwrite a key file",
                                               path)
                                 : pi2_err_errno(err, PI2_EIO, e, "%s: cannot move the key file into place", path);
            }
        } else
            rc = pi2_err_errno(err, PI2_EIO, e, "%s: cannot move the key file into place", path);
    }
    unlink(tmp); /* the temp name (the key now lives under path, or nowhere) */
    free(tmp);
    if (rc == 0)
        pi2_fsync_dir_of(path);
    return rc;
}

/* PEM of pkey (private or public) into a memory BIO; returns NULL on failure. */
static BIO *pem_to_mem(EVP_PKEY *pkey, bool priv)
{
    BIO *mem = BIO_new(BIO_s_mem());
    if (!mem)
        return NULL;
    int ok = priv ? PEM_write_bio_PrivateKey(mem, pkey, NULL, NULL, 0, NULL, NULL) : PEM_write_bio_PUBKEY(mem, pkey);
    if (ok != 1) {
        BIO_free(mem);
        return NULL;
    }
    return mem;
}

static void mem_wipe_free(BIO *mem)
{
    if (!mem)
        return;
    char *d = NULL;
    long n = BIO_get_mem_data(mem, &d);
    if (d && n > 0)
        OPENSSL_cleanse(d, (size_t)n);
    BIO_free(mem);
}

int pi2_sign_keygen(const char *priv_path, const char *pub_path, pi2_err *err)
{
    struct stat st;
    if (strcmp(priv_path, pub_path) == 0)
        return pi2_err_set(err, PI2_EINVAL, "%s: private and public key paths must differ", priv_path);
    if (lstat(priv_path, &st) == 0)
        return pi2_err_set(err, PI2_EINVAL, "%s: already exists; refusing to overwrite a key file", priv_path);
    if (lstat(pub_path, &st) == 0)
        return pi2_err_set(err, PI2_EINVAL, "%s: already exists; refusing to overwrite a key file", pub_path);

    EVP_PKEY *pkey = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
    if (!pkey)
        return pi2_err_set(err, PI2_EUNSUPPORTED, "%s: Ed25519 key generation failed: %s", priv_path, ossl_reason());
    int rc = 0;
    BIO *priv = pem_to_mem(pkey, true), *pub = pem_to_mem(pkey, false);
    EVP_PKEY_free(pkey);
    char *pd = NULL, *qd = NULL;
    long pn = priv ? BIO_get_mem_data(priv, &pd) : 0;
    long qn = pub ? BIO_get_mem_data(pub, &qd) : 0;
    if (!priv || !pub || pn <= 0 || qn <= 0)
        rc = pi2_err_set(err, PI2_ENOMEM, "%s: cannot encode the key as PEM: %s", priv_path, ossl_reason());
    if (rc == 0)
        rc = write_new_file(priv_path, pd, (size_t)pn, 0600, err);
    if (rc == 0) {
        rc = write_new_file(pub_path, qd, (size_t)qn, 0644, err);
        if (rc != 0)
            unlink(priv_path); /* we created it just now: don't leave half a pair */
    }
    mem_wipe_free(priv);
    mem_wipe_free(pub);
    return rc;
}

/* ---- sign / verify ---- */

int pi2_sign(const pi2_sign_key *key, const void *msg, size_t len, uint8_t sig[PI2_SIG_LEN], pi2_err *err)
{
    static const uint8_t empty[1];
    if (!key->is_private)
        return pi2_err_set(err, PI2_EINVAL, "%s: a public key cannot sign; load the private key", key->path);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", key->path);
    size_t n = PI2_SIG_LEN;
    int rc = 0;
    if (EVP_DigestSignInit(ctx, NULL, NULL, NULL, key->pkey) != 1 ||
        EVP_DigestSign(ctx, sig, &n, msg ? msg : empty, len) != 1 || n != PI2_SIG_LEN)
        rc = pi2_err_set(err, PI2_EIO, "%s: signing failed: %s", key->path, ossl_reason());
    EVP_MD_CTX_free(ctx);
    return rc;
}

int pi2_sign_verify(const pi2_sign_key *key, const void *msg, size_t len, const uint8_t *sig, size_t siglen,
                    pi2_err *err)
{
    static const uint8_t empty[1];
    if (!sig || siglen != PI2_SIG_LEN)
        return pi2_err_set(err, PI2_ESIG, "signature is %zu bytes, not %d (key %s)", sig ? siglen : 0,
                           PI2_SIG_LEN, key->path);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", key->path);
    int rc = 0;
    if (EVP_DigestVerifyInit(ctx, NULL, NULL, NULL, key->pkey) != 1) {
        rc = pi2_err_set(err, PI2_EIO, "%s: cannot start verification: %s", key->path, ossl_reason());
    } else {
        int r = EVP_DigestVerify(ctx, sig, siglen, msg ? msg : empty, len);
        if (r != 1) {
            ERR_clear_error();
            rc = pi2_err_set(err, PI2_ESIG, "signature does not verify with key %s", key->path);
        }
    }
    EVP_MD_CTX_free(ctx);
    return rc;
}
