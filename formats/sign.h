/* pi2 sign: SHA-256 digests and Ed25519 signatures (OpenSSL 3, libcrypto).
 * This is the only module that uses OpenSSL; link with -lcrypto.
 *
 * Key files are PEM, as OpenSSL writes them:
 *   private key   "-----BEGIN PRIVATE KEY-----"  unencrypted PKCS#8 holding an
 *                 Ed25519 key (OID 1.3.101.112); written with mode 0600.
 *   public key    "-----BEGIN PUBLIC KEY-----"   SubjectPublicKeyInfo (X.509
 *                 SPKI) holding an Ed25519 key; written with mode 0644.
 * Files are read whole (at most PI2_SIGN_MAX_PEM bytes). Text before the PEM
 * block (as `openssl` sometimes writes) is tolerated.
 *
 * Loader error codes (messages are "<file>: <problem>"):
 *   PI2_ENOTFOUND    the file does not exist
 *   PI2_EIO          the file cannot be read (permissions, a directory, ...)
 *   PI2_ERANGE       the file is larger than PI2_SIGN_MAX_PEM
 *   PI2_EFORMAT      not a PEM file; a PEM block of the wrong kind (a public
 *                    key where a private key is expected or the reverse, a
 *                    certificate, ...); a corrupt PEM block (bad base64, bad
 *                    DER inside)
 *   PI2_EUNSUPPORTED a valid key that is not Ed25519 (the message names the
 *                    key type, e.g. "RSA key, not Ed25519"), or an encrypted
 *                    private key (never prompts for a passphrase)
 *   PI2_ENOMEM       allocation failed
 *
 * Signing and verification are "pure" Ed25519 (RFC 8032): the whole message
 * is signed, no pre-hash. pi2_sign_verify returns PI2_ESIG when the
 * signature does not match the message and key.
 */
#ifndef PI2_SIGN_H
#define PI2_SIGN_H

#include "formats/common.h"

#define PI2_SHA256_LEN 32      /* bytes in a SHA-256 digest */
#define PI2_SHA256_HEX_LEN 65  /* 64 lowercase hex digits + NUL */
#define PI2_SIG_LEN 64         /* bytes in an Ed25519 signature */
#define PI2_SIGN_PUBKEY_LEN 32 /* bytes in a raw Ed25519 public key */
#define PI2_SIGN_MAX_PEM (64u * 1024)

/* ---- SHA-256 ---- */

typedef struct pi2_sha256_ctx pi2_sha256_ctx;

/* Allocate a context ready to hash. Caller frees it with pi2_sha256_free. */
int pi2_sha256_init(pi2_sha256_ctx **out, pi2_err *err);
/* Hash n more bytes (any n, including 0 with buf == NULL). */
int pi2_sha256_update(pi2_sha256_ctx *c, const void *buf, size_t n, pi2_err *err);
/* Write the digest of everything hashed so far into out and reset the
 * context to the empty state, so it can hash another message. */
int pi2_sha256_final(pi2_sha256_ctx *c, uint8_t out[PI2_SHA256_LEN], pi2_err *err);
/* Release a context. NULL is a no-op. */
void pi2_sha256_free(pi2_sha256_ctx *c);

/* One-shot digest of n bytes. */
int pi2_sha256(const void *buf, size_t n, uint8_t out[PI2_SHA256_LEN], pi2_err *err);

/* Lowercase hex of a digest into out (64 digits + NUL). */
void pi2_sha256_hex(const uint8_t digest[PI2_SHA256_LEN], char out[PI2_SHA256_HEX_LEN]);
/* Parse exactly 64 hex digits (either case, nothing else) into out;
 * PI2_EFORMAT otherwise. */
int pi2_sha256_parse_hex(const char *hex, uint8_t out[PI2_SHA256_LEN], pi2_err *err);

/* ---- Ed25519 ---- */

/* An Ed25519 key: private (can sign and verify) or public (verify only). */
typedef struct pi2_sign_key pi2_sign_key;

/* Generate a new key pair and write it to priv_path (PKCS#8 PEM, mode 0600)
 * and pub_path (SPKI PEM, mode 0644). Each file is written to a temporary
 * file created 0600 in the same directory, fsynced and then linked into
 * place, so the private key is never readable by others, not even briefly,
 * and a crash never leaves a half-written key. Refuses (PI2_EINVAL, nothing
 * written) when either path already exists; if the public key cannot be
 * written after the private one was, the private key file is removed again. */
int pi2_sign_keygen(const char *priv_path, const char *pub_path, pi2_err *err);

/* Load a private key from a PEM file. Caller frees *out with
 * pi2_sign_key_free. Errors: see the top of this header. */
int pi2_sign_key_load_private(pi2_sign_key **out, const char *path, pi2_err *err);
/* Load a public key from a PEM file. Caller frees *out. */
int pi2_sign_key_load_public(pi2_sign_key **out, const char *path, pi2_err *err);
/* Release a key (private material is wiped by OpenSSL). NULL is a no-op. */
void pi2_sign_key_free(pi2_sign_key *k);

/* True if the key holds private material (can sign). */
bool pi2_sign_key_is_private(const pi2_sign_key *k);
/* The raw 32-byte public key (for fingerprints / key ids in manifests). */
int pi2_sign_key_raw_public(const pi2_sign_key *k, uint8_t out[PI2_SIGN_PUBKEY_LEN], pi2_err *err);

/* Sign len bytes of msg with a private key; writes 64 bytes to sig.
 * PI2_EINVAL if the key is public only. */
int pi2_sign(const pi2_sign_key *key, const void *msg, size_t len, uint8_t sig[PI2_SIG_LEN], pi2_err *err);
/* Verify a signature with a public (or private) key: 0 if it matches,
 * PI2_ESIG if it does not (including a signature of the wrong length). */
int pi2_sign_verify(const pi2_sign_key *key, const void *msg, size_t len, const uint8_t *sig, size_t siglen,
                    pi2_err *err);

#endif
