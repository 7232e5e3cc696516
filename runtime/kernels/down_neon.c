/* The down projection by rows on arm64 (pi2_k_down_rows, contract and
 * integer algorithm in kernels.h): bit-identical to the twin in down.c.
 *
 * Per token, 32-value output block and group of 16 rows, the products
 * c_r = coef_r * d_r are quantized as the twin does (fmaxnm is fmaxf:
 * a NaN product is passed over; fcvtns is rintf, and gives 0 for NaN,
 * where the twin's guard does), then the exact sums S_j = sum_r cq_r *
 * wq_r[j] run across the 32 outputs: smull/smlal of two rows in int16
 * (|two products| <= 2 * 127 * 128 < 2^15), widened into int32 per pair.
 * out_j = fma(s, S_j, out_j), groups in row order. Every NEON level
 * (neon, dotprod, i8mm) takes this path: an sdot needs the weights
 * transposed (4 rows per lane), which the one-token decode would pay per
 * call. */
#include "runtime/kernels/internal.h"

#ifdef PI2_K_ARM64

/* cq[0..m) for the products c[0..m) (m <= 16; the rest 0); returns the
 * scale s, or 0 when the group contributes nothing. */
static float group_quant(const float c[K_DG], int8_t cq[K_DG])
{
    float32x4_t v[4], mx = vdupq_n_f32(0.0f);
    for (int k = 0; k < 4; k++) {
        v[k] = vld1q_f32(c + 4 * k);
        mx = vmaxnmq_f32(mx, vabsq_f32(v[k]));
    }
    float amax = vmaxnmvq_f32(mx);
    if (!(amax >= K_DMIN))
        return 0.0f;
    float inv = 127.0f / amax;
    int32x4_t lo = vdupq_n_s32(-127), hi = vdupq_n_s32(127);
    int16x4_t h[4];
    for (int k = 0; k < 4; k++)
        h[k] = vmovn_s32(vminq_s32(vmaxq_s32(vcvtnq_s32_f32(vmulq_n_f32(v[k], inv)), lo), hi));
    vst1q_s8(cq, vcombine_s8(vmovn_s16(vcombine_s16(h[0], h[1])), vmovn_s16(vcombine_s16(h[2], h[3]))));
    return amax / 127.0f;
}

/* S[0..8) (output j in S[j / 4] lane j % 4) += sum_k cq[k] * w_k for the
 * group's m rows at byte offset off. */
static void group_sums(bool q4, const uint8_t *const *w, int m, int64_t off, const int8_t *cq, int32x4_t S[8])
{
    for (int k = 0; k < m; k += 2) {
        int8x16_t lo0, hi0, lo1 = vdupq_n_s8(0), hi1 = vdupq_n_s8(0);
        k_neon_wblk(w[k] + off, q4, &lo0, &hi0);
        int8x8_t c0 = vdup_n_s8(cq[k]), c1 = vdup_n_s8(k + 1 < m ? cq[k + 1] : 0);
        if (k + 1 < m)
            k_neon_wblk(w[k + 1] + off, q4, &lo1, &hi1);
        int16x8_t p0 = vmlal_s8(vmull_s8(vget_low_s8(lo0), c0), vget_low_s8(lo1), c1);
        int16x8_t p1 = vmlal_s8(vmull_s8(vget_high_s8(lo0), c0), vget_high_s8(lo1), c1);
        int16x8_t p2 = vmlal_s8(vmull_s8(vget_low_s8(hi0), c0), vget_low_s8(hi1), c1);
        int16x8_t p3 = vmlal_s8(vmull_s8(vget_high_s8(hi0), c0), vget_high_s8(hi1), c1);
        S[0] = vaddw_s16(S[0], vget_low_s16(p0));
        S[1] = vaddw_high_s16(S[1], p0);
        S[2] = vaddw_s16(S[2], vget_low_s16(p1));
        S[3] = vaddw_high_s16(S[3], p1);
        S[4] = vaddw_s16(S[4], vget_low_s16(p2));
        S[5] = vaddw_high_s16(S[5], p2);
        S[6] = vaddw_s16(S[6], vget_low_s16(p3));
        S[7] = vaddw_high_s16(S[7], p3);
    }
}

bool pi2_ki_down_neon(pi2_isa isa, pi2_qtype wt, int64_t n, int nrows, const float *coef, int64_t ldc,
                      const uint8_t *const *wp, const uint16_t *const *ws, int T, float *out, int64_t ldo)
{
    pi2_isa p = pi2_ki_isa_pick(isa);
    if (!k_neon(p) || (wt != PI2_QT_Q4 && wt != PI2_QT_Q8))
        return false;
    bool q4 = wt == PI2_QT_Q4;
    int64_t nb = n / QG, gb = q4 ? PI2_Q4_GROUP_BYTES : PI2_Q8_GROUP_BYTES;
    for (int t = 0; t < T; t++)
        for (int64_t b = 0; b < nb; b++) {
            float *o = out + t * ldo + b * QG;
            for (int r0 = 0; r0 < nrows; r0 += K_DG) {
                int m = nrows - r0 < K_DG ? nrows - r0 : K_DG;
                float c[K_DG] = {0};
                int8_t cq[K_DG];
                for (int k = 0; k < m; k++)
                    c[k] = coef[t * ldc + r0 + k] * pi2_f16_to_f32(ws[r0 + k][b]);
                float s = group_quant(c, cq);
                if (s == 0.0f)
                    continue;
                int32x4_t S[8];
                for (int j = 0; j < 8; j++)
                    S[j] = vdupq_n_s32(0);
                group_sums(q4, wp + r0, m, b * gb, cq, S);
                for (int j = 0; j < 8; j++)
                    vst1q_f32(o + 4 * j, vfmaq_n_f32(vld1q_f32(o + 4 * j), vcvtq_f32_s32(S[j]), s));
            }
        }
    return true;
}

#endif /* PI2_K_ARM64 */
