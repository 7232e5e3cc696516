/* Internals shared by the manifest reader's files; formats/manifest.h is
 * the contract.
 *   manifest.c          lifetime, lookups; the sections, tensors, config,
 *                       quant and bundle objects
 *   manifest_parse.c    pi2_manifest_parse: the top level, then the
 *                       per-layer sparsity, profile and quality objects */
#ifndef PI2_MANIFEST_INTERNAL_H
#define PI2_MANIFEST_INTERNAL_H

#include "formats/jsonread.h"
#include "formats/manifest.h"

#include <jansson.h>

typedef struct pctx {
    pi2_jr r; /* file name and error for the messages */
    pi2_manifest *m;
    const pi2_ctr_section **by_name; /* sections sorted by name */
    size_t n_by_name;
} pctx;

/* "<name>: <where>.<key>: <problem>"; where or key may be empty/NULL. */
#define fail(c, ...) pi2_jr_fail(&(c)->r, __VA_ARGS__)

/* The name of each pi2_mf_pdtype, indexed by it. */
extern const char *const mf_pred_dtypes[];

/* Section named name, or NULL. */
const pi2_ctr_section *mf_lookup(const pctx *c, const char *name);

/* Member name ("" allowed when allow_empty); if listed, *sec gets its section
 * (may be NULL); a non-empty name must be listed when must_exist. */
int mf_get_member(pctx *c, json_t *o, const char *w, const char *k, bool allow_empty, bool must_exist,
                  char dst[PI2_CTR_NAME_MAX], const pi2_ctr_section **sec);

/* The top-level objects of the same names (manifest.c). */
int mf_parse_sections(pctx *c, json_t *root);
int mf_parse_tensors(pctx *c, json_t *root);
int mf_parse_config(pctx *c, json_t *root);
int mf_parse_quant(pctx *c, json_t *root);
int mf_parse_bundle_obj(pctx *c, json_t *root);

#endif
