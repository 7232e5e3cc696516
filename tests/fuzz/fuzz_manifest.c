/* Fuzz target: manifest reader (pi2_manifest_parse). On success the
 * manifest must write back (pi2_manifest_to_json), read back, and write the
 * same bytes again; the lookups run over what was parsed. */
#include "formats/manifest.h"
#include "tests/fuzz/fuzz_util.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pi2_manifest *m = NULL, *m2 = NULL;
    pi2_err err = {0};
    char *buf = malloc(size ? size : 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    if (pi2_manifest_parse(buf, size, "fuzz.pi2:manifest.json", &m, &err) == 0) {
        for (size_t i = 0; i < m->n_tensors; i++) {
            const pi2_mf_tensor *t = &m->tensors[i];
            if (pi2_manifest_find_tensor(m, t->role, t->layer, t->expert) != t)
                abort(); /* (role, layer, expert) is unique */
            if (!pi2_manifest_find_section(m, t->payload))
                abort(); /* members are listed in sections */
        }
        for (size_t i = 0; i < m->n_layers; i++)
            (void)pi2_manifest_find_layer(m, m->layers[i].layer, m->layers[i].expert);
        for (size_t i = 0; i < m->n_profile; i++)
            (void)pi2_manifest_find_profile(m, m->profile[i].layer, m->profile[i].expert);
        (void)pi2_manifest_kind_name(m->kind);
        (void)pi2_manifest_mode_name(m->sparsity_mode);
        char *t1 = NULL, *t2 = NULL;
        size_t l1 = 0, l2 = 0;
        pi2_err e2 = {0};
        if (pi2_manifest_to_json(m, &t1, &l1, &e2) != 0) {
            fprintf(stderr, "parsed manifest does not write back: %s\n", e2.msg);
            abort();
        }
        if (pi2_manifest_parse(t1, l1, "manifest (written)", &m2, &e2) != 0) {
            fprintf(stderr, "written manifest does not read back: %s\n", e2.msg);
            abort();
        }
        if (pi2_manifest_to_json(m2, &t2, &l2, &e2) != 0 || l1 != l2 || memcmp(t1, t2, l1) != 0) {
            fprintf(stderr, "manifest round trip is not stable: %s\n", e2.msg);
            abort();
        }
        free(t1);
        free(t2);
        pi2_manifest_free(m2);
        pi2_manifest_free(m);
    }
    free(buf);
    return 0;
}
