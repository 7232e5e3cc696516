/* pi2 manifest: manifest.json inside a pi2 container (formats/container.h).
 *
 * The manifest describes a model held in a container: its config, how its
 * weights are quantized and where each tensor's payload and scales live,
 * the activation predictors or thresholds, the activation profile, quality
 * figures and the section table (offset, size, SHA-256 of every other
 * member). pi2-convert writes kind "converted" (unsigned); pi2-bundle writes
 * kind "bundled", signs the exact bytes of manifest.json and puts the
 * signature in manifest.sig. Neither of those two members is listed in
 * "sections".
 *
 * ---- JSON layout (version 1), keys in this order ----
 *
 * {
 *   "format": "pi2",
 *   "version": 1,
 *   "kind": "converted" | "bundled",
 *   "created_by": string (1..255 bytes, no control characters),
 *   "source": string (model dir name; same rules),
 *   "config": { HF config.json object, as pi2_config_format writes it; read
 *               back through pi2_config_parse (its rules and errors apply) },
 *   "torch_dtype": "float32" | "float16" | "bfloat16"  (of the source),
 *   "quant": { "ffn": "q4"|"q8", "other": "q8"|"q4", "group": 32,
 *              "scales": "f16" },      (fp16 scales; where: see tensors)
 *   "tokenizer": member (tokenizer.json),
 *   "chat_template": member (optional: the model's tokenizer_config.json,
 *               kept when it carries a chat_template; formats/jinja.h
 *               reads it),
 *   "tensors": [ { "name": HF name (1..127 printable ASCII),
 *                  "layer": int (-1 for embed, out_norm, lm_head),
 *                  "expert": int (-1 unless a MoE gate/up/down),
 *                  "role": "embed"|"out_norm"|"lm_head"|"attn_norm"|"ffn_norm"|
 *                          "q"|"k"|"v"|"o"|"gate"|"up"|"down"|"router",
 *                  "qtype": "f32"|"q8"|"q4",
 *                  "rows": int, "cols": int,          (as stored)
 *                  "transposed": bool,
 *                  "payload": member, "scales": member ("" for f32) }, ... ],
 *   "sparsity": { "mode": "predictor" | "threshold" | "none",
 *                 "recall_target": number in (0, 1] or null,
 *                 "threshold_sparsity": number in [0, 1] or null,
 *                 "per_layer": [ { "layer": int, "expert": int,
 *                                  "predictor": null | { "rank", "threshold",
 *                                      "imported": bool,
 *                                      "input": "normed" | "prenorm",
 *                                      "dtype": "f32" | "f16" | "q8" | "q4",
 *                                      "fc1": member, "fc2": member,
 *                                      "fc1_scales": member,
 *                                      "fc2_scales": member (q8/q4 only),
 *                                      "report": { every pi2_pred_report field
 *                                                  under its C name } },
 *                                  "silu_threshold": number (optional) }, ... ] },
 *   "profile": { "tokens": int,
 *                "per_layer": [ { "layer", "expert", "active_frac", "hot_share",
 *                                 "top10_share", "freq": member,
 *                                 "bits": member ("" when bit_samples is 0),
 *                                 "bit_samples": int,
 *                                 "bits_selected": true (optional),
 *                                 "route_share": number (optional, MoE) }, ... ] },
 *   "quality": { "tokens": int, "ppl_ref", "ppl_q_dense", "ppl_q_sparse":
 *                number > 0, or null / absent for "not measured" (NaN) },
 *   "bundle": null (kind converted) | object (kind bundled; opaque here),
 *   "sections": [ { "name": member, "offset": int, "size": int,
 *                   "sha256": 64 lowercase hex digits }, ... ]
 * }
 * Every key is required except "silu_threshold", "bits_selected", "route_share", the three
 * "ppl_*" keys and the predictor's "input" and "dtype" (absent in containers
 * written before them: "normed" and "f32");
 * unknown keys are refused (inside "config" and "bundle", the rules of
 * their own readers apply). Numbers are JSON integers where the C field is
 * an integer; reals are written in their shortest round-trip form (float
 * fields in the shortest form that reads back as the same float).
 *
 * Meaning and checks (pi2_manifest_parse):
 *   member       a container member name: 1..99 bytes of printable ASCII
 *                without space, not starting with '/' or ".pad/", no empty,
 *                "." or ".." component, no trailing '/'; it must be listed in
 *                "sections" (PI2_ENOTFOUND otherwise).
 *   sections     at most PI2_CTR_MAX_MEMBERS, sorted by offset, offsets
 *                multiples of 4096, not overlapping (offset + size <= next
 *                offset), size <= PI2_CTR_MAX_SIZE, names unique, never
 *                "manifest.json" or "manifest.sig".
 *   tensors      stored shape [rows, cols] is the HF shape [R, C] (or [C, R]
 *                when transposed; FFN down is stored transposed so each
 *                neuron's down column is a contiguous row):
 *                  embed, lm_head [vocab, d]; norms [1, d] (never transposed);
 *                  q [heads*hd, d]; k, v [kv*hd, d]; o [d, heads*hd];
 *                  gate, up [n_ff, d]; down [d, n_ff]; router [experts, d].
 *                layer in [0, n_layers) for per-layer roles; expert in
 *                [0, n_experts) for gate/up/down of a MoE model, else -1;
 *                router only on MoE models. qtype: gate/up/down use
 *                quant.ffn; embed, lm_head, k, v, o any of f32, q8, q4
 *                (a conversion may keep them at q8 under quant.other q4);
 *                every other role f32 or quant.other; cols must
 *                suit the qtype (multiple of 32 for q4/q8). "scales" is ""
 *                exactly for f32. Names unique, (role, layer, expert) unique,
 *                at most 3 + n_layers * (9 + 3 * max(n_experts, 1)) entries.
 *                For kind "converted" the payload member holds exactly
 *                rows * pi2_q_payload_row_bytes bytes and the scales member
 *                rows * pi2_q_scale_row_count * 2 bytes; for "bundled" the
 *                members must exist and the bundle object describes layout
 *                (gate, up and down: payload and scales are both the FFN's
 *                slot member, bundle/layout.h).
 *   per_layer    (sparsity and profile) layer in [0, n_layers), expert -1 on
 *                dense models and in [0, n_experts) on MoE ones, each
 *                (layer, expert) at most once (so at most n_layers *
 *                max(n_experts, 1) entries). Mode "predictor" requires a
 *                predictor object and recall_target in every entry; mode
 *                "threshold" a silu_threshold (>= 0) in every entry and
 *                threshold_sparsity. Predictor rank in [1, PI2_PRED_MAX_DIM];
 *                fc1/fc2 members must exist; they hold fc1 [rank, d] and
 *                fc2 [n_ff, rank] row-major in "dtype" (f16: IEEE half,
 *                LE), the sizes the bundle reader checks. q8/q4 members
 *                hold the rows the runtime evaluates, as the tensors do:
 *                fc1 and fc2 the pi2_q payload of fc1 [rank, d] and fc2
 *                [n_ff, rank_p] (rank_p = rank rounded up to 32, the extra
 *                columns zero), fc1_scales and fc2_scales their f16 group
 *                scales (row-major, rank_p / 32 per fc2 row); the two scales
 *                keys are required for q8/q4 and refused otherwise, and in
 *                a converted container all four sizes are checked (named
 *                like the tensors': "<fc1>.s"). "input" is the
 *                vector the predictor reads (predictor/train.h). Report fractions in [0, 1] or null,
 *                losses, pos_weight and seconds >= 0 or null (NaN).
 *   profile      fractions in [0, 1]; the freq member holds float32 [n_ff]
 *                (per-neuron activation frequency), exactly n_ff * 4 bytes;
 *                the bits member holds the packed activation bits of
 *                bit_samples sampled tokens, row-major
 *                [bit_samples][ceil(n_ff / 64)] uint64 LE, exactly that size;
 *                bits_selected (written only when true) says the bits are
 *                the neuron sets the runtime selects (the predictor's output
 *                on the sampled tokens) rather than the activations;
 *                route_share (MoE only, refused on dense models) is the
 *                share of the layer's routing choices that picked this
 *                expert (the layer's entries sum to 1; NaN when absent).
 *   bundle       kept as JSON text (pi2_manifest.bundle_json) so pi2-bundle
 *                can define its contents without changing this parser;
 *                parse stores jansson's compact dump of the object (key
 *                order kept).
 *
 * Errors (exact codes; each message is one line "<name>: <json path>:
 * problem", e.g. "model.pi2:manifest.json: tensors[3].rows: ..."):
 *   PI2_EFORMAT       not JSON, duplicate or unknown key, wrong JSON type,
 *                     format not "pi2", invalid member name or sha256,
 *                     unsorted/overlapping/unaligned sections, duplicate
 *                     tensor or (layer, expert) entries, qtype not allowed
 *                     for a role, scales/bits member presence wrong, bundle
 *                     present on a converted manifest or absent on a bundled
 *                     one, a null recall_target / threshold_sparsity /
 *                     predictor that the mode requires
 *   PI2_ENOTFOUND     required key missing (also silu_threshold in mode
 *                     "threshold"); a member not in "sections"
 *   PI2_EUNSUPPORTED  version other than 1; unknown kind, role, qtype, mode,
 *                     torch_dtype, quant type or scales; quant group not 32
 *   PI2_ERANGE        a number out of its range, a string too long, too many
 *                     array entries, text longer than PI2_MF_MAX_BYTES
 *   PI2_ESHAPE        tensor shape or a member's size inconsistent with the
 *                     config
 *   PI2_EINVAL        NULL arguments;  PI2_ENOMEM
 * plus the codes of pi2_config_parse for the "config" object.
 *
 * Ownership: pi2_manifest is a plain struct the tools fill and read. Its
 * arrays and bundle_json are heap-owned by the manifest and released by
 * pi2_manifest_free; use the add/set helpers to grow them.
 */
#ifndef PI2_MANIFEST_H
#define PI2_MANIFEST_H

#include "formats/common.h"
#include "formats/container.h"
#include "formats/hfconfig.h"
#include "formats/quant.h"
#include "formats/predictor_fmt.h"

#define PI2_MF_VERSION 1
#define PI2_MF_NAME "manifest.json"
#define PI2_MF_SIG_NAME "manifest.sig"
#define PI2_MF_MAX_BYTES (64u << 20) /* manifest text cap */
#define PI2_MF_STR_MAX 256           /* created_by, source: shorter than this */
#define PI2_MF_TNAME_MAX 128         /* tensor names: shorter than this */
#define PI2_MF_DTYPE_MAX 16

typedef enum pi2_mf_kind {
    PI2_MF_CONVERTED = 0,
    PI2_MF_BUNDLED = 1,
} pi2_mf_kind;

typedef enum pi2_mf_mode {
    PI2_MF_SPARSE_NONE = 0,
    PI2_MF_SPARSE_PREDICTOR = 1,
    PI2_MF_SPARSE_THRESHOLD = 2,
} pi2_mf_mode;

/* One stored tensor. role is one of PI2_T_EMBED .. PI2_T_ROUTER. */
typedef struct pi2_mf_tensor {
    char name[PI2_MF_TNAME_MAX]; /* HF name */
    pi2_tname role;
    int layer;  /* -1 for embed, out_norm, lm_head */
    int expert; /* -1 unless a MoE gate/up/down */
    pi2_qtype qtype;
    int64_t rows, cols; /* as stored */
    bool transposed;
    char payload[PI2_CTR_NAME_MAX];
    char scales[PI2_CTR_NAME_MAX]; /* "" for f32 */
} pi2_mf_tensor;

/* Element type of the predictor members. */
typedef enum pi2_mf_pdtype {
    PI2_MF_PRED_F32 = 0,
    PI2_MF_PRED_F16 = 1,
    PI2_MF_PRED_Q8 = 2, /* pi2_q rows and scales, as evaluated (see the layout above) */
    PI2_MF_PRED_Q4 = 3,
} pi2_mf_pdtype;

typedef struct pi2_mf_predictor {
    int rank;
    float threshold;
    bool imported;        /* published with the model (checkpoint or predictor repo), not trained */
    pi2_pred_input input; /* the vector it reads */
    pi2_mf_pdtype dtype;  /* of the fc1/fc2 members */
    char fc1[PI2_CTR_NAME_MAX];
    char fc2[PI2_CTR_NAME_MAX];
    char fc1_scales[PI2_CTR_NAME_MAX]; /* "" unless dtype is q8/q4 */
    char fc2_scales[PI2_CTR_NAME_MAX];
    pi2_pred_report report;
} pi2_mf_predictor;

/* sparsity.per_layer entry. */
typedef struct pi2_mf_layer {
    int layer;
    int expert; /* -1 on dense models */
    bool has_predictor;
    pi2_mf_predictor predictor;
    bool has_silu_threshold;
    float silu_threshold;
} pi2_mf_layer;

/* profile.per_layer entry. */
typedef struct pi2_mf_profile {
    int layer;
    int expert; /* -1 on dense models */
    double active_frac, hot_share, top10_share;
    char freq[PI2_CTR_NAME_MAX]; /* float32 [n_ff] */
    char bits[PI2_CTR_NAME_MAX]; /* uint64 [bit_samples][ceil(n_ff/64)]; "" if none */
    uint64_t bit_samples;
    bool bits_selected; /* bits are the runtime's selected sets (predictor output), not activations */
    double route_share; /* MoE: share of the layer's routing choices that picked this expert; NaN: unknown */
} pi2_mf_profile;

typedef struct pi2_manifest {
    pi2_mf_kind kind;
    char created_by[PI2_MF_STR_MAX];
    char source[PI2_MF_STR_MAX];
    pi2_model_desc config;
    char torch_dtype[PI2_MF_DTYPE_MAX];
    pi2_qtype quant_ffn;   /* q4 or q8 */
    pi2_qtype quant_other; /* q8 or q4 */
    char tokenizer[PI2_CTR_NAME_MAX];
    char chat_template[PI2_CTR_NAME_MAX]; /* "" when the model has none */

    pi2_mf_tensor *tensors;
    size_t n_tensors, cap_tensors;

    pi2_mf_mode sparsity_mode;
    double recall_target;      /* NaN: not applicable (null) */
    double threshold_sparsity; /* NaN: not applicable (null) */
    pi2_mf_layer *layers;      /* sparsity.per_layer */
    size_t n_layers, cap_layers;

    uint64_t profile_tokens;
    pi2_mf_profile *profile; /* profile.per_layer */
    size_t n_profile, cap_profile;

    uint64_t quality_tokens;
    double ppl_ref, ppl_q_dense, ppl_q_sparse; /* NaN: not measured (null) */

    char *bundle_json; /* NULL: "bundle": null; else a JSON object's text */

    pi2_ctr_section *sections;
    size_t n_sections, cap_sections;
} pi2_manifest;

/* A zeroed manifest with kind converted, mode none, quant q4/q8, the NaN
 * fields NaN. NULL if out of memory. Caller frees it with pi2_manifest_free. */
pi2_manifest *pi2_manifest_new(void);
/* Release the manifest and everything it owns. NULL is a no-op. */
void pi2_manifest_free(pi2_manifest *m);

/* Growth helpers: append a copy of *x. PI2_ERANGE past the caps above
 * (tensors/per-layer entries 1<<22, sections PI2_CTR_MAX_MEMBERS),
 * PI2_ENOMEM; the manifest is unchanged on error. Content is checked by
 * pi2_manifest_to_json / pi2_manifest_parse, not here. */
int pi2_manifest_add_tensor(pi2_manifest *m, const pi2_mf_tensor *t, pi2_err *err);
int pi2_manifest_add_layer(pi2_manifest *m, const pi2_mf_layer *l, pi2_err *err);
int pi2_manifest_add_profile(pi2_manifest *m, const pi2_mf_profile *p, pi2_err *err);
int pi2_manifest_add_section(pi2_manifest *m, const pi2_ctr_section *s, pi2_err *err);
/* Append every section of a container writer's list except manifest.json
 * and manifest.sig (pass pi2_ctr_writer_sections' result). */
int pi2_manifest_add_sections(pi2_manifest *m, const pi2_ctr_section *s, size_t n, pi2_err *err);
/* Replace bundle_json by a copy of text (NULL clears it). Not checked here. */
int pi2_manifest_set_bundle(pi2_manifest *m, const char *text, pi2_err *err);

/* Deterministic JSON text of m (the same struct gives the same bytes):
 * two-space indent, keys in the order above, small all-scalar objects and
 * arrays on one line, ending with a newline. The text is checked with
 * pi2_manifest_parse (name "manifest") before it is returned, so whatever
 * is written can be read back; errors are that function's codes, or
 * PI2_EINVAL for a string that is not UTF-8 or a bundle_json that is not a
 * JSON object, or a config pi2_config_format refuses. *text is
 * NUL-terminated, caller frees it; NULL on error. */
int pi2_manifest_to_json(const pi2_manifest *m, char **text, size_t *len, pi2_err *err);

/* Parse and check manifest text (len bytes; need not be NUL-terminated).
 * `name` (e.g. "model.pi2:manifest.json") starts every message; NULL gives
 * "manifest.json". On success the caller owns *out (pi2_manifest_free); on
 * error *out is NULL. */
int pi2_manifest_parse(const char *text, size_t len, const char *name, pi2_manifest **out, pi2_err *err);

/* Bytes of one predictor weight in its members: 4 (f32) or 2 (f16);
 * 0 for q8/q4, whose rows are sized by pi2_q (pi2_mf_pred_qtype). */
size_t pi2_mf_pred_elem(pi2_mf_pdtype dt);
/* PI2_QT_Q8 / PI2_QT_Q4 for a quantized predictor dtype, else PI2_QT_F32. */
pi2_qtype pi2_mf_pred_qtype(pi2_mf_pdtype dt);
/* "f32", "f16", "q8" or "q4". */
const char *pi2_mf_pred_dtype_name(pi2_mf_pdtype dt);

/* The tensor with this role, layer and expert (-1 where n/a); NULL if absent. */
const pi2_mf_tensor *pi2_manifest_find_tensor(const pi2_manifest *m, pi2_tname role, int layer, int expert);
/* The section named `name`; NULL if absent. Linear scan. */
const pi2_ctr_section *pi2_manifest_find_section(const pi2_manifest *m, const char *name);
/* The sparsity / profile entry for (layer, expert); NULL if absent. */
const pi2_mf_layer *pi2_manifest_find_layer(const pi2_manifest *m, int layer, int expert);
const pi2_mf_profile *pi2_manifest_find_profile(const pi2_manifest *m, int layer, int expert);

/* JSON names: "embed" .. "router" for PI2_T_EMBED .. PI2_T_ROUTER ("?" for
 * others); "converted"/"bundled"; "predictor"/"threshold"/"none". */
const char *pi2_manifest_role_name(pi2_tname role);
const char *pi2_manifest_kind_name(pi2_mf_kind kind);
const char *pi2_manifest_mode_name(pi2_mf_mode mode);

#endif
