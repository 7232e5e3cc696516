#include "formats/predictor_fmt.h"

const char *pi2_pred_input_name(pi2_pred_input in)
{
    return in == PI2_PRED_IN_NORMED ? "normed" : in == PI2_PRED_IN_PRENORM ? "prenorm" : "?";
}

uint64_t pi2_pred_bytes_f32(int d, int n_ff, int rank)
{
    return ((uint64_t)rank * (uint64_t)d + (uint64_t)n_ff * (uint64_t)rank) * 4u;
}

uint64_t pi2_pred_bytes_q8(int d, int n_ff, int rank)
{
    uint64_t g1 = ((uint64_t)d + 31) / 32, g2 = ((uint64_t)rank + 31) / 32;
    return ((uint64_t)rank * g1 + (uint64_t)n_ff * g2) * 34u;
}
