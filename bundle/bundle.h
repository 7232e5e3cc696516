/* pi2 bundle: converted model -> bundled, signed model.pi2; and the reader
 * that opens and verifies one (pi2-bundle verify / inspect, pi2-run).
 *
 * ---- model.pi2 ----
 *
 * A pi2 container (formats/container.h: uncompressed POSIX tar, every member's
 * data 4096-aligned) whose manifest.json (formats/manifest.h) has kind
 * "bundled" and whose "bundle" object is described in bundle/layout.h.
 * Members, in file order:
 *
 *   tokenizer.json           copy of the converted model's tokenizer
 *   w/<hf name>.q, .s, .f32  every non-FFN tensor, byte for byte as converted
 *                            (embeddings, attention, norms, MoE router, head)
 *   p/<l>.<e>.fc1, .fc2      predictors: fc1 as converted, fc2 [n_ff, rank]
 *                            rows in bundled neuron order
 *   profile/<l>.<e>.freq     activation frequencies, bundled order
 *   profile/<l>.<e>.bits     activation bits of sampled tokens, bit columns
 *                            in bundled order
 *   perm/<l>.<e>             uint32 [n_ff]: bundled neuron -> converted neuron
 *   ffn/<l>.<e>              the FFN: hot slots then cold slots of
 *                            row-column bundles, each row its payload then
 *                            its fp16 scales (bundle/layout.h)
 *   manifest.json            the manifest (sections: every member above)
 *   manifest.sig             64-byte Ed25519 signature of the exact bytes of
 *                            manifest.json (formats/sign.h); absent when the
 *                            container is unsigned
 * (<e> is the expert, 0 on dense models.) Everything before ffn/ is the
 * resident region, listed in the bundle object's "resident": what a runtime
 * keeps in memory and verifies at load. The ffn/ members are the flash
 * region; each is one contiguous range a prefill can stream.
 *
 * Trust: the signature covers the manifest, and the manifest holds the
 * SHA-256 of every other member, so a verified signature plus matching
 * digests vouch for every byte. An unsigned container is only produced on
 * explicit request and only opened with allow_unsigned; the bundle object's
 * "signer" (the signing public key, or "" for unsigned) lets tools report
 * which key signed it.
 *
 * ---- Bundling (pi2_bundle_create) ----
 *
 * Reads the converted model through pread (nothing of it stays mapped), and
 * checks every member it reads against the SHA-256 in the converted
 * manifest. Orders each FFN's neurons (bundle/order.h, one thread per core),
 * then writes the members above in order, streaming: one loader thread
 * reads and checks up to 3 jobs (an FFN's three payload and three scale
 * matrices, or an
 * 8 MiB chunk of a plain copy) ahead of the main thread, which lays out and
 * writes the current one, and holds at most 768 MiB ahead; so peak memory
 * is about 4 x (3 x n_ff x row bytes) plus the permutations (450 MB for a
 * 7B shape), whatever the number of layers. Output goes to a temporary
 * file renamed into place only when complete (formats/container.h), so a
 * failure leaves nothing at out_path.
 *
 * Errors (pi2_bundle_create): PI2_EINVAL (bad options: no key and not
 * unsigned, a public key, a bad I/O unit or hot rule; input not a converted
 * model), PI2_EUNSUPPORTED (FFN quant not q4/q8), PI2_ESIG (a converted
 * member does not match its digest), the container, manifest and I/O codes
 * (PI2_EFORMAT, PI2_ESHAPE, PI2_EIO, PI2_ENOSPC, PI2_ENOMEM, PI2_ERANGE).
 *
 * ---- Opening (pi2_bundle_open) ----
 *
 * In this order, stopping at the first failure:
 *   1. the container structure (pi2_ctr_open: PI2_EFORMAT for truncated or
 *      malformed files, duplicate members, ...);
 *   2. manifest.json present; manifest.sig absent (unsigned) or exactly 64
 *      bytes; no member other than these two that the manifest does not
 *      list;
 *   3. the signature: with a public key, manifest.sig must verify over the
 *      manifest bytes (PI2_ESIG naming both key fingerprints when the
 *      manifest says another key signed it); an unsigned container is
 *      refused with PI2_ESIG "unsigned" unless allow_unsigned; without a
 *      key (skip_signature, for inspection) nothing is checked;
 *   4. the manifest (pi2_manifest_parse; kind must be "bundled") and the
 *      bundle layout (pi2_bundle_layout_parse);
 *   5. the section table against the file: every section is a member at
 *      exactly the recorded offset and size, inside the file (PI2_EFORMAT
 *      naming the section);
 *   6. every perm member against its digest (PI2_ESIG naming it) and as a
 *      permutation (PI2_EFORMAT).
 * Member data other than the permutations is not hashed by open: see
 * pi2_bundle_verify.
 */
#ifndef PI2_BUNDLE_H
#define PI2_BUNDLE_H

#include "bundle/layout.h"
#include "formats/container.h"
#include "formats/manifest.h"
#include "formats/sign.h"

#include <stdio.h>

/* ---- bundling ---- */

typedef struct pi2_bundle_opts {
    const char *in_path;       /* converted model (pi2-convert output) */
    const char *out_path;      /* model.pi2 to write */
    const pi2_sign_key *key;   /* private key to sign with, or NULL ... */
    bool allow_unsigned;       /* ... only together with this */
    uint32_t io_unit;          /* bytes, power of two in [4K, 256K]; 0 (default): pi2_bl_auto_io_unit */
    bool two_phase;            /* FFN layout (bundle/layout.h), drelu only: a group's gates, then up+down,
                                * for plans that read gates first; false (default): one-phase, one read
                                * a neuron, faster at every limit measured (runtime/PERF.md) */
    double hot_min_freq;       /* hot: neurons firing on at least this share of tokens (default 0.5) ... */
    double hot_share;          /* ... or this share of each FFN's neurons (NaN: use hot_min_freq) */
    int threads;               /* ordering threads; 0 = all cores */
    bool quiet;                /* no progress lines on a terminal */
} pi2_bundle_opts;

/* Defaults for every field but the paths and the key. */
void pi2_bundle_defaults(pi2_bundle_opts *o);

/* Bundle o->in_path into o->out_path (see the top of this header). A summary
 * (sizes, timing, ordering figures) goes to `report` when non-NULL;
 * progress to stderr when it is a terminal and !quiet. */
int pi2_bundle_create(const pi2_bundle_opts *o, FILE *report, pi2_err *err);

/* ---- reading ---- */

typedef enum pi2_bundle_sig {
    PI2_BUNDLE_SIG_VERIFIED = 0,  /* manifest.sig verified with the given key */
    PI2_BUNDLE_SIG_UNSIGNED = 1,  /* no manifest.sig (opened with allow_unsigned) */
    PI2_BUNDLE_SIG_UNCHECKED = 2, /* signed, but opened with skip_signature */
} pi2_bundle_sig;

typedef struct pi2_bundle_open_opts {
    const pi2_sign_key *pubkey; /* key to verify manifest.sig with */
    bool allow_unsigned;        /* accept a container without manifest.sig */
    bool skip_signature;        /* inspection only: do not check the signature */
    bool huge_pages;            /* back the mapping with huge pages (pi2_ctr_open_huge): runs that
                                   use the weights in place */
} pi2_bundle_open_opts;

typedef struct pi2_bundle pi2_bundle;

/* Open and check a bundled container (steps above). Without a pubkey and
 * without skip_signature a signed container is refused (PI2_EINVAL: a key is
 * needed to trust it). Caller closes *out with pi2_bundle_close. */
int pi2_bundle_open(pi2_bundle **out, const char *path, const pi2_bundle_open_opts *o, pi2_err *err);

/* After pi2_bundle_open failed at path with rc: when path holds a pi2
 * model that is not bundled (a converted one fails the signature step
 * first), err is replaced by what it is (PI2_EFORMAT, returned), else rc
 * is returned and err left as it is. The manifest is parsed unverified,
 * for the message only. */
int pi2_bundle_open_failed(const char *path, int rc, pi2_err *err);
/* Release everything. NULL is a no-op. */
void pi2_bundle_close(pi2_bundle *b);

/* Hash members and compare with the manifest's digests, in file order:
 * the resident ones only, or all. 0, or PI2_ESIG naming the first bad
 * section. `done` (may be NULL) gets the number of bytes hashed. */
int pi2_bundle_verify(const pi2_bundle *b, bool resident_only, uint64_t *done, pi2_err *err);
/* The resident check of pi2_bundle_verify on the mapping again, within a
 * bounded footprint (the offloading engine's check after generating): each
 * member hashed PI2_BUNDLE_RECHECK_WINDOW bytes at a time, each window's
 * pages dropped from the process and the page cache once hashed, on
 * PI2_BUNDLE_VERIFY_THREADS threads, so at most that many windows are
 * present at once (the planner counts them: pi2_plan_container_touched). */
#define PI2_BUNDLE_RECHECK_WINDOW ((size_t)2 << 20)
#define PI2_BUNDLE_VERIFY_THREADS 2
int pi2_bundle_recheck(const pi2_bundle *b, pi2_err *err);
/* The resident check of pi2_bundle_verify on a copy of the file's bytes
 * [0, len) read apart (the offloading engine's direct reads): each
 * resident member is hashed at its offset in copy. PI2_EFORMAT when one
 * lies past len. */
int pi2_bundle_verify_copy(const pi2_bundle *b, const uint8_t *copy, uint64_t len, pi2_err *err);
/* pi2_bundle_verify_copy with the sections named in skip[0 .. n_skip)
 * left out: the caller hashes them apart against the same manifest (the
 * offloading engine streams its predictors through a bounded buffer and
 * keeps them out of the copy). */
int pi2_bundle_verify_copy_except(const pi2_bundle *b, const uint8_t *copy, uint64_t len, const char *const *skip,
                                  size_t n_skip, pi2_err *err);

pi2_bundle_sig pi2_bundle_sig_status(const pi2_bundle *b);
const pi2_manifest *pi2_bundle_manifest(const pi2_bundle *b);
const pi2_bundle_layout *pi2_bundle_layout_get(const pi2_bundle *b);
const pi2_ctr *pi2_bundle_container(const pi2_bundle *b);

/* Bundled neuron i of an FFN: pointers into the mapping to its gate, up and
 * down payload rows and fp16 scale rows (hidden/32 each, where
 * bundle/layout.h puts them: after each payload one-phase, in the gate
 * unit two-phase), and its converted index. PI2_ERANGE for a bad index. */
typedef struct pi2_bundle_neuron {
    const uint8_t *payload[3];  /* gate, up, down */
    const uint16_t *scales[3];
    uint32_t original;
} pi2_bundle_neuron;
int pi2_bundle_get_neuron(const pi2_bundle *b, size_t ffn, uint32_t i, pi2_bundle_neuron *out, pi2_err *err);

/* The permutation of FFN index ffn (layout order), inside the mapping. */
const uint32_t *pi2_bundle_perm(const pi2_bundle *b, size_t ffn);

/* Print a short summary: model, quant, signature status, region sizes, the
 * layout, predictor and activation-profile summaries. */
int pi2_bundle_inspect(const pi2_bundle *b, FILE *out, pi2_err *err);

/* Hex of the first 8 bytes of the SHA-256 of a raw public key (for
 * messages); out holds 17 bytes. */
void pi2_bundle_key_fingerprint(const uint8_t raw[PI2_SIGN_PUBKEY_LEN], char out[17]);

#endif
