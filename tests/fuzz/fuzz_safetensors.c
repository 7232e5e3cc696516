/* Fuzz target: safetensors reader (pi2_st_open_buffer), tensor iteration,
 * lookup by name, metadata, and conversion of small tensors to f32. */
#include "formats/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

#include <string.h>

#define MAX_CONVERT_ELEMS (1u << 16) /* bound the work per input */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pi2_st *st = NULL;
    pi2_err err = {0};
    /* A private copy so a read past `size` is caught by ASan. */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    if (pi2_st_open_buffer(&st, buf, size, "fuzz.safetensors", &err) == 0) {
        size_t n = pi2_st_count(st);
        (void)pi2_st_metadata(st, "format");
        for (size_t i = 0; i < n; i++) {
            const pi2_st_tensor *t = pi2_st_at(st, i);
            if (!t || pi2_st_find(st, t->name) != t)
                abort(); /* our invariant: names are unique and found */
            (void)pi2_dtype_name(t->dtype);
            if (i < 8 && t->nelem <= MAX_CONVERT_ELEMS) {
                float *f = malloc((t->nelem ? t->nelem : 1) * sizeof(float));
                if (f) {
                    if (pi2_st_to_f32(t, f, t->nelem, &err) == 0 && t->nelem &&
                        (t->dtype == PI2_DT_F32 || t->dtype == PI2_DT_F16 || t->dtype == PI2_DT_BF16)) {
                        float a = pi2_st_get_f32(t, 0), b = pi2_st_get_f32(t, t->nelem - 1);
                        (void)a;
                        (void)b;
                    }
                    free(f);
                }
            }
            int64_t shape[PI2_ST_MAX_DIMS] = {0};
            (void)pi2_st_expect_shape(t, t->ndim, shape, NULL);
        }
        (void)pi2_st_find(st, "model.embed_tokens.weight");
        pi2_st_close(st);
    }
    free(buf);
    return 0;
}
