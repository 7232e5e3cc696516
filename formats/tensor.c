/* pi2 tensor descriptors: element type names and sizes (see tensor.h). */
#include "formats/tensor.h"

#include <string.h>

static const struct {
    const char *name;
    size_t size;
} dtypes[] = {
    [PI2_DT_F32] = { "F32", 4 }, [PI2_DT_F16] = { "F16", 2 }, [PI2_DT_BF16] = { "BF16", 2 },
    [PI2_DT_I8] = { "I8", 1 },   [PI2_DT_U8] = { "U8", 1 },   [PI2_DT_I32] = { "I32", 4 },
    [PI2_DT_I64] = { "I64", 8 },
};
#define NDTYPES (sizeof dtypes / sizeof dtypes[0])

const char *pi2_dtype_name(pi2_dtype dt) { return (unsigned)dt < NDTYPES ? dtypes[dt].name : NULL; }

size_t pi2_dtype_size(pi2_dtype dt) { return (unsigned)dt < NDTYPES ? dtypes[dt].size : 0; }

int pi2_dtype_parse(const char *name, pi2_dtype *out)
{
    if (name) {
        for (unsigned i = 0; i < NDTYPES; i++) {
            if (strcmp(name, dtypes[i].name) == 0) {
                *out = (pi2_dtype)i;
                return 0;
            }
        }
    }
    return PI2_EUNSUPPORTED;
}
