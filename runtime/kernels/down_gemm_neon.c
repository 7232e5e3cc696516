/* The prefill down projection on arm64 (pi2_k_down_gemm, algorithm in
 * kernels.h): bit-identical to the twin in down_gemm.c.
 *
 * Per chunk of K_GC groups of K_GR rows the coefficients are quantized by
 * pi2_k_act_quantize (the same bits on every path); per output block the
 * rows' weights are requantized to one scale per group (the twin's float
 * operations, 4 lanes at a time: wq * (d_r * inv), fcvtns, clamp), then
 * per token and group the exact sums S_j = sum_r w'_r[j] * cq_r run
 * across the block's 32 outputs (smull/smlal of two rows in int16:
 * |two products| <= 2 * 127 * 127; widened per pair), and acc_j =
 * fma(S_j, D_g * sigma, acc_j) over the groups in order. Every NEON level
 * takes this path. */
#include "runtime/kernels/internal.h"

#ifdef PI2_K_ARM64

enum {
    K_GR = 32, /* rows per group (down_gemm.c's) */
    K_GC = 16  /* groups per row chunk */
};

/* 8 weights (int8) times f, rounded and clamped as the twin does. */
static inline int8x8_t requant8(int8x8_t w, float f)
{
    int16x8_t w16 = vmovl_s8(w);
    int32x4_t lo = vdupq_n_s32(-127), hi = vdupq_n_s32(127);
    int32x4_t a = vcvtnq_s32_f32(vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(w16))), f));
    int32x4_t b = vcvtnq_s32_f32(vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(w16)), f));
    a = vminq_s32(vmaxq_s32(a, lo), hi);
    b = vminq_s32(vmaxq_s32(b, lo), hi);
    return vmovn_s16(vcombine_s16(vmovn_s32(a), vmovn_s32(b)));
}

/* Block b's weights of the chunk's rows requantized per group into
 * w2[r][32] (rows past R: row 0's, met by zero coefficients); D[g]. */
static void requant_block(bool q4, const uint8_t *const *wp, const uint16_t *const *ws, int R, int G, int64_t b,
                          int8_t (*w2)[QG], float *D)
{
    float qmax = q4 ? 8.0f : 128.0f;
    for (int g = 0; g < G; g++) {
        float d[K_GR], inv = k_gemm_wgroup(ws + g * K_GR, K_GR, R - g * K_GR, b, qmax, d, &D[g]);
        for (int k = 0; k < K_GR; k++) {
            int r = g * K_GR + k;
            const uint8_t *p = wp[r < R ? r : 0];
            int8x16_t lo, hi;
            k_neon_wblk(p + b * (q4 ? PI2_Q4_GROUP_BYTES : PI2_Q8_GROUP_BYTES), q4, &lo, &hi);
            float f = d[k] * inv;
            vst1_s8(w2[r], requant8(vget_low_s8(lo), f));
            vst1_s8(w2[r] + 8, requant8(vget_high_s8(lo), f));
            vst1_s8(w2[r] + 16, requant8(vget_low_s8(hi), f));
            vst1_s8(w2[r] + 24, requant8(vget_high_s8(hi), f));
        }
    }
}

/* acc[0..8) (output j in acc[j / 4] lane j % 4) over the G groups of one
 * token's coefficients cq (scales as). */
static void block_token(const int8_t (*w2)[QG], int G, const float *D, const int8_t *cq, const float *as,
                        float32x4_t acc[8])
{
    for (int g = 0; g < G; g++) {
        int32x4_t S[8];
        for (int j = 0; j < 8; j++)
            S[j] = vdupq_n_s32(0);
        for (int k = g * K_GR; k < (g + 1) * K_GR; k += 2) {
            int8x16_t l0 = vld1q_s8(w2[k]), h0 = vld1q_s8(w2[k] + 16);
            int8x16_t l1 = vld1q_s8(w2[k + 1]), h1 = vld1q_s8(w2[k + 1] + 16);
            int8x8_t c0 = vdup_n_s8(cq[k]), c1 = vdup_n_s8(cq[k + 1]);
            int16x8_t p[4] = {vmlal_s8(vmull_s8(vget_low_s8(l0), c0), vget_low_s8(l1), c1),
                              vmlal_s8(vmull_s8(vget_high_s8(l0), c0), vget_high_s8(l1), c1),
                              vmlal_s8(vmull_s8(vget_low_s8(h0), c0), vget_low_s8(h1), c1),
                              vmlal_s8(vmull_s8(vget_high_s8(h0), c0), vget_high_s8(h1), c1)};
            for (int i = 0; i < 4; i++) {
                S[2 * i] = vaddw_s16(S[2 * i], vget_low_s16(p[i]));
                S[2 * i + 1] = vaddw_high_s16(S[2 * i + 1], p[i]);
            }
        }
        float f = D[g] * as[g];
        for (int j = 0; j < 8; j++)
            acc[j] = vfmaq_n_f32(acc[j], vcvtq_f32_s32(S[j]), f);
    }
}

bool pi2_ki_down_gemm_neon(pi2_isa isa, pi2_qtype wt, int64_t n, int nrows, const float *coef, int64_t ldc,
                           const uint8_t *const *wp, const uint16_t *const *ws, int T, float *out, int64_t ldo)
{
    pi2_isa p = pi2_ki_isa_pick(isa);
    if (!k_neon(p) || (wt != PI2_QT_Q4 && wt != PI2_QT_Q8))
        return false;
    int64_t nb = n / QG;
    int8_t aq[PI2_K_MAX_T * K_GC * K_GR];
    float as[PI2_K_MAX_T * K_GC], D[K_GC];
    int32_t su[PI2_K_MAX_T * K_GC];
    int8_t w2[K_GC * K_GR][QG];
    for (int r0 = 0; r0 < nrows; r0 += K_GC * K_GR) {
        int R = nrows - r0 < K_GC * K_GR ? nrows - r0 : K_GC * K_GR, G = (R + K_GR - 1) / K_GR, Rp = G * K_GR;
        pi2_ki_gemm_coefs(p, coef, ldc, T, r0, R, aq, as, su);
        for (int64_t b = 0; b < nb; b++) {
            requant_block(wt == PI2_QT_Q4, wp + r0, ws + r0, R, G, b, w2, D);
            for (int t = 0; t < T; t++) {
                float32x4_t acc[8];
                for (int j = 0; j < 8; j++)
                    acc[j] = vdupq_n_f32(0.0f);
                block_token((const int8_t(*)[QG])w2, G, D, aq + t * Rp, as + t * G, acc);
                float *o = out + t * ldo + b * QG;
                for (int j = 0; j < 8; j++)
                    vst1q_f32(o + 4 * j, vaddq_f32(vld1q_f32(o + 4 * j), acc[j]));
            }
        }
    }
    return true;
}

#endif /* PI2_K_ARM64 */
