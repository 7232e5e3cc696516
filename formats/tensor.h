/* pi2 tensor descriptors: the element types of the checkpoint formats
 * pi2 reads, and the view of one tensor that each reader fills
 * (formats/safetensors.h for .safetensors files and their index,
 * formats/torchzip.h for PyTorch zip checkpoints). */
#ifndef PI2_TENSOR_H
#define PI2_TENSOR_H

#include "formats/common.h"

#define PI2_ST_MAX_DIMS 8
#define PI2_ST_MAX_TENSORS (1u << 20)

typedef enum pi2_dtype {
    PI2_DT_F32,
    PI2_DT_F16,
    PI2_DT_BF16,
    PI2_DT_I8,
    PI2_DT_U8,
    PI2_DT_I32,
    PI2_DT_I64,
} pi2_dtype;

/* "F32", ... ; NULL for an invalid value. */
const char *pi2_dtype_name(pi2_dtype dt);
/* Size in bytes of one element. */
size_t pi2_dtype_size(pi2_dtype dt);
/* Parse a dtype name; PI2_EUNSUPPORTED if unknown. */
int pi2_dtype_parse(const char *name, pi2_dtype *out);

/* A tensor view into the mapped file. Valid until the owning pi2_st closes. */
typedef struct pi2_st_tensor {
    const char *name;
    pi2_dtype dtype;
    int ndim;
    int64_t shape[PI2_ST_MAX_DIMS];
    size_t nelem;
    const void *data; /* inside the mapping; may be unaligned for its dtype */
    size_t nbytes;
    const char *file; /* path of the shard that holds it */
} pi2_st_tensor;

#endif
