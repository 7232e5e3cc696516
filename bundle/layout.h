/* pi2 bundle layout: where each FFN neuron's bytes live in a bundled
 * model.pi2, and the "bundle" object of its manifest that records it.
 * This module reads and writes that object (jansson) and computes offsets;
 * bundle/bundle.h describes the container as a whole.
 *
 * ---- Neuron order ----
 *
 * Every FFN (one per layer, or per layer and expert on MoE models) has its
 * own permutation P of its n_ff neurons: bundled neuron i is converted
 * (Hugging Face) neuron P[i]. Neurons are ordered hot to cold by profiled
 * activation frequency; the hot prefix stays in that order, the cold rest is
 * cut into groups of neurons that fire together (bundle/order.h). Inside a
 * bundled container EVERY per-neuron array of that FFN is in bundled order:
 * gate, up and down rows (payloads and fp16 scales), predictor fc2 rows,
 * the profile's frequencies and activation bits. The permutation member
 * holds P:
 *
 *   perm/<layer>.<expert>   uint32 LE [n_ff], P[i] = converted index of
 *                           bundled neuron i (expert 0 on dense models);
 *                           every value in [0, n_ff) exactly once.
 *
 * ---- FFN payload member:  ffn/<layer>.<expert> ----
 *
 * P = bytes of one row's payload, pi2_q_payload_row_bytes(quant.ffn,
 * hidden) (hidden/2 for q4, hidden for q8); C = bytes of its fp16 scales,
 * 2 * hidden/32; R = P + C, a row with its scales (pi2_bl_row_bytes). Both
 * exactly as formats/quant.h stores them (payload row, scale row). The
 * scales live in the member, next to rows read with them, so the FFN's
 * scales take no resident memory (version 1 kept them in resident
 * members). The down matrix is stored transposed (row i = column i of HF
 * down), so neuron i is three rows: gate_i, up_i, down_i. A = 4096.
 *
 * Neurons are packed in groups of g (per FFN, "group"); the member is
 * G = ceil(n_ff / g) slots of S bytes, slot k holding neurons k*g .. k*g+g-1.
 *
 *   one-phase (relu / ReGLU, silu / SwiGLU, and drelu unless bundled
 *   two-phase): each row's scales right after
 *   its payload (a row is R bytes):
 *     slot    = [gate_0 up_0 down_0] [gate_1 up_1 down_1] ... [.._{g-1}] pad
 *     bundle  = 3R bytes ("bundle_bytes"), S = roundup(g * 3R, A)
 *     neuron j of slot k:  gate at k*S + j*3R, up at +R, down at +2R;
 *                          each row's scales at its offset + P
 *
 *   two-phase (drelu: relu(x Wg) * relu(x Wu); read gates, then up/down of
 *   the neurons whose gate fired): the up+down part holds payloads only,
 *   and every scale of a neuron rides with its gate row, which decode reads
 *   first (and keeps in memory for the hot and gate-hot groups):
 *     gate unit = [gate payload P][gate scales C][up scales C][down scales C]
 *                 R + 2C bytes ("gate_bytes")
 *     ud unit   = [up payload P][down payload P], 2P bytes ("bundle_bytes")
 *     slot    = [gate unit_0 ... gate unit_{g-1}] pad | [ud unit_0 ... ud unit_{g-1}] pad
 *               <------------ gate part ----------->   <--------- up+down part --------->
 *     gate part  P_g = roundup(g * (R + 2C), A) ("gate_part")
 *     S = P_g + roundup(g * 2P, A)
 *     neuron j of slot k:  gate at u = k*S + j*(R + 2C), its scales at u + P,
 *                          up scales at u + R, down scales at u + R + C;
 *                          up at v = k*S + P_g + j*2P, down at v + P
 *   (version 2 put each up and down row's scales after its payload, 2R
 *   bytes a neuron in the up+down part: 4608 at hidden 4096 q4, so a cold
 *   up+down read spanned more pages and groups packed worse)
 *
 * Every pad byte, and every byte of the missing neurons of a partial last
 * slot, is zero. Slots, gate parts and up+down parts start on A-aligned
 * offsets of the member, and members are A-aligned in the file, so every
 * read below is an aligned O_DIRECT read.
 *
 * Group size and the I/O unit U ("io_unit", a power of two in 4 KiB ..
 * 256 KiB; pi2-bundle --io-unit, by default pi2_bl_auto_io_unit's choice
 * below): a group is one read of a
 * slot (one-phase) or two reads, gate part then up+down part (two-phase);
 * g is the largest count whose every read fits in U:
 *     one-phase  g = floor(U / 3R)
 *     two-phase  g = floor(U / max(2P, R + 2C)) = floor(U / 2P)
 *                (R + 2C = P + 3C < 2P, as C <= P/8 for q4 and q8)
 * clamped to [1, n_ff]. With g = 1 a read may exceed U (rows wider than U).
 * Example, hidden 4096, q4 (P = 2048, C = 256, R = 2304), U = 16 KiB:
 * one-phase g = 2, S = 16 KiB; two-phase g = 4, gate part 12 KiB
 * (4 * 2816 = 11 KiB of units), up+down part 16 KiB (4 * 4096, no
 * padding: each neuron's up+down is one page), S = 28 KiB.
 *
 * Regions of the member (offsets relative to the member's data; the file
 * offset is sections[ffn].offset + offset):
 *     hot   [0, H*S)          the first H = "hot_groups" slots: the
 *                             hot_neurons = min(H*g, n_ff) hottest neurons,
 *                             kept in memory by the runtime; a planner may
 *                             take any other whole number of slots as hot
 *     cold  [H*S, G*S)        the remaining groups, read on a cache miss
 * Prefill streams the whole member [0, G*S) sequentially.
 *
 * ---- The manifest's "bundle" object (version 3), keys in this order ----
 *
 * {
 *   "version": 3,                      (1: scales apart, resident; 2: up and
 *                                       down scales beside their payloads in
 *                                       the up+down part; both refused)
 *   "io_unit": U,
 *   "align": 4096,
 *   "row_bytes": R (payload and scales),
 *   "two_phase": bool                  (true only for act drelu; drelu may
 *                                       be either, pi2-bundle --layout),
 *   "hot_rule": { "min_freq": number in [0, 1] or null,
 *                 "share": number in [0, 1] or null }   (exactly one non-null),
 *   "signer": "" (unsigned) or 64 lowercase hex digits: the raw Ed25519
 *             public key that signed manifest.sig,
 *   "resident": [ member, ... ]        every section except the ffn members,
 *                                      in section (file) order,
 *   "ffn": [ { "layer": int, "expert": int (-1 on dense models),
 *              "ffn": member, "perm": member,
 *              "order": "coactivation" | "frequency" | "identity",
 *              "neurons": n_ff, "group": g, "bundle_bytes": 3R or 2P,
 *              "gate_bytes": R + 2C (0 when one-phase),
 *              "gate_part": P_g (0 when one-phase), "slot_bytes": S,
 *              "groups": G, "hot_groups": H, "hot_neurons": int,
 *              "hot": [offset, size], "cold": [offset, size],
 *              "read_efficiency": number in [0, 1] or null,
 *              "read_efficiency_freq": number in [0, 1] or null }, ... ]
 * }
 * "ffn" has one entry per (layer, expert), layer-major, expert-minor.
 * read_efficiency is, over the profiled tokens, the share of neuron reads
 * that fetch an active neuron when a cold group is read whenever one of its
 * neurons fires (null without activation bits); read_efficiency_freq is the
 * same for groups cut in plain frequency order, for comparison.
 *
 * Why versions 1 and 2 are refused rather than read: reading version 2
 * would need a second rule for where up and down scales are in every path
 * that points at rows (in memory, the neuron caches and their fill, the
 * decode pipeline, prefill streaming, the planner's byte counts), for a
 * file pi2-bundle remakes from the converted model. One layout in the
 * runtime keeps those paths single; the refusal is one line that says to
 * bundle again.
 *
 * Checks (pi2_bundle_layout_parse, against the parsed manifest): exact keys,
 * integer types, version 3, U a power of two in range, align 4096, R as
 * above, two_phase only for drelu, g in [1, n_ff] and the read rule
 * (g * 3R <= U, or g * max(2P, R + 2C) <= U, when g > 1), bundle_bytes,
 * gate_bytes (so a gate part too small for the scales is refused),
 * gate_part, slot_bytes, groups, hot_neurons and both regions exactly as
 * the formulas give them; ffn and perm members listed in sections, distinct, of exactly
 * G*S and 4*n_ff bytes; resident exactly the other sections, in order;
 * every tensor's payload / scales member of the right size (gate, up, down:
 * payload and scales both that FFN's ffn member),
 * predictor fc1 [rank, hidden] / fc2 [n_ff, rank] f32 sizes.
 *
 * Errors: PI2_EFORMAT (not JSON, unknown / duplicate key, wrong type, bad
 * member name or signer), PI2_ENOTFOUND (missing key; member not in
 * sections), PI2_EUNSUPPORTED (version), PI2_ERANGE (number out of range),
 * PI2_ESHAPE (sizes or offsets inconsistent with the formulas or the model),
 * PI2_EINVAL (NULL arguments), PI2_ENOMEM. Messages are one line
 * "<name>: bundle.<path>: problem".
 */
#ifndef PI2_BUNDLE_LAYOUT_H
#define PI2_BUNDLE_LAYOUT_H

#include "formats/common.h"
#include "formats/container.h"
#include "formats/manifest.h"

#define PI2_BL_VERSION 3
#define PI2_BL_ALIGN 4096u
#define PI2_BL_IO_MIN 4096u
#define PI2_BL_IO_MAX (256u * 1024)
#define PI2_BL_IO_DEFAULT (16u * 1024)
#define PI2_BL_IO_AUTO_MIN (8u * 1024) /* the smallest unit pi2_bl_auto_io_unit picks */
#define PI2_BL_IO_AUTO_WASTE 8         /* ... whose slots waste at most 1/8 of their bytes */
#define PI2_BL_MAX_BYTES (16u << 20) /* bundle object text cap */

typedef enum pi2_bl_order {
    PI2_BL_ORDER_IDENTITY = 0,    /* no profile: converted order */
    PI2_BL_ORDER_FREQUENCY = 1,   /* hot to cold, no activation bits to group by */
    PI2_BL_ORDER_COACTIVATION = 2 /* hot to cold, cold neurons grouped by co-activation */
} pi2_bl_order;

/* One FFN (layer, expert). */
typedef struct pi2_bl_ffn {
    int layer;
    int expert; /* -1 on dense models */
    char ffn[PI2_CTR_NAME_MAX];
    char perm[PI2_CTR_NAME_MAX];
    pi2_bl_order order;
    uint32_t neurons;      /* n_ff */
    uint32_t group;        /* g */
    uint64_t bundle_bytes; /* 3R one-phase, 2P (up+down payloads) two-phase */
    uint64_t gate_bytes;   /* R + 2C (gate row, up and down scales) two-phase; 0 one-phase */
    uint64_t gate_part;    /* P_g; 0 one-phase */
    uint64_t slot_bytes;   /* S */
    uint32_t groups;       /* G */
    uint32_t hot_groups;   /* H */
    uint32_t hot_neurons;  /* min(H*g, n_ff) */
    uint64_t hot_offset, hot_size, cold_offset, cold_size;
    double read_eff;      /* NaN: not measured (null) */
    double read_eff_freq; /* NaN: not measured (null) */
} pi2_bl_ffn;

typedef struct pi2_bundle_layout {
    uint32_t io_unit;
    uint64_t row_bytes;
    uint64_t pay_bytes; /* P: a row's payload (R - C); not in the JSON, set by the parser */
    bool two_phase;
    double hot_min_freq; /* NaN when the share rule is used */
    double hot_share;    /* NaN when the frequency rule is used */
    char signer[PI2_SHA256_HEX_LEN]; /* "" unsigned; else 64 hex digits */
    char (*resident)[PI2_CTR_NAME_MAX];
    size_t n_resident;
    pi2_bl_ffn *ffn;
    size_t n_ffn;
} pi2_bundle_layout;

/* Bytes of one FFN row with its scales: payload then fp16 scales (R
 * above); 0 for a quant other than q4 / q8. */
uint64_t pi2_bl_row_bytes(pi2_qtype q_ffn, int64_t hidden);

/* The geometry of one FFN for a model and an I/O unit: group, bundle bytes,
 * gate part, slot and group count (the formulas above), with hot_groups = 0.
 * PI2_EINVAL for a bad io_unit or a non-q4/q8 FFN quant, PI2_ERANGE if the
 * member would exceed PI2_CTR_MAX_SIZE. */
int pi2_bl_geometry(const pi2_model_desc *d, pi2_qtype q_ffn, uint32_t io_unit, bool two_phase, pi2_bl_ffn *out,
                    pi2_err *err);
/* The I/O unit pi2-bundle uses unless told (--io-unit auto): the smallest
 * power of two from PI2_BL_IO_AUTO_MIN up whose every read fits it and
 * whose slot is at most 1/PI2_BL_IO_AUTO_WASTE padding, i.e. the smallest
 * read that packs whole neurons without waste (else the least wasteful).
 * Examples, q4: hidden 4096 (R = 2.25 KiB, 6.75 KiB a neuron), one-phase
 * -> 32 KiB, g = 4, 1/28 padding (8 KiB: g = 1, 5/32 padding), two-phase
 * -> 16 KiB, g = 4, 1/28 padding (8 KiB: g = 2, 5/32 padding); hidden 2048
 * ReGLU (3.375 KiB a neuron) -> 32 KiB, g = 9, 1/20 padding (16 KiB: g = 4,
 * 5/32). Bytes read
 * on a miss scale with the unit while the count of reads hardly changes
 * (missed neurons seldom share a group), and padding costs both disk
 * bytes and cache memory. PI2_BL_IO_DEFAULT for dimensions
 * pi2_bl_geometry refuses. */
uint32_t pi2_bl_auto_io_unit(const pi2_model_desc *d, pi2_qtype q_ffn, bool two_phase);
/* Set hot_groups = H (clamped to groups) and derive hot_neurons and both
 * regions from it. */
void pi2_bl_set_hot(pi2_bl_ffn *f, uint32_t hot_groups);

/* Where bundled neuron i's rows are (i < neurons): offsets inside the ffn
 * member of the payload and of the fp16 scales of its gate, up and down
 * rows (index 0, 1, 2), per the layout above. row_bytes R, pay_bytes P. */
typedef struct pi2_bl_rows {
    uint64_t pay[3], sc[3];
} pi2_bl_rows;
void pi2_bl_neuron_rows(const pi2_bl_ffn *f, uint64_t row_bytes, uint64_t pay_bytes, bool two_phase, uint32_t i,
                        pi2_bl_rows *out);

/* A zeroed layout (NaN rules). NULL if out of memory. */
pi2_bundle_layout *pi2_bl_new(void);
/* Release a layout. NULL is a no-op. */
void pi2_bl_free(pi2_bundle_layout *l);
/* Append a copy of a resident name / an FFN entry (PI2_ERANGE past
 * PI2_CTR_MAX_MEMBERS entries, PI2_ENOMEM). */
int pi2_bl_add_resident(pi2_bundle_layout *l, const char *name, pi2_err *err);
int pi2_bl_add_ffn(pi2_bundle_layout *l, const pi2_bl_ffn *f, pi2_err *err);

/* Compact JSON text of the bundle object (keys in the order above) for
 * pi2_manifest_set_bundle. Not checked here: the writer checks the whole
 * manifest with pi2_bundle_layout_parse before it is written. Caller frees
 * *text. */
int pi2_bl_to_json(const pi2_bundle_layout *l, char **text, pi2_err *err);

/* Parse and check mf->bundle_json against mf (see Checks above). `name`
 * starts every message (e.g. "model.pi2:manifest.json"). On success the
 * caller owns *out (pi2_bl_free); on error *out is NULL. */
int pi2_bundle_layout_parse(const pi2_manifest *mf, const char *name, pi2_bundle_layout **out, pi2_err *err);

/* The FFN entry of (layer, expert) (expert -1 on dense models); NULL if
 * absent. */
const pi2_bl_ffn *pi2_bl_find(const pi2_bundle_layout *l, int layer, int expert);

/* Check that perm[n] holds every value in [0, n) exactly once. 0 or
 * PI2_EFORMAT naming `what` and the first bad index. */
int pi2_bl_check_perm(const uint32_t *perm, uint32_t n, const char *what, pi2_err *err);

const char *pi2_bl_order_name(pi2_bl_order o);

#endif
