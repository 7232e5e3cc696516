/* The matmul family on arm64 (pi2_k_matmul, contract in kernels.h):
 * NEON, NEON with the dot product (sdot) and with int8 matrix multiply
 * (smmla), each giving the scalar twin's bits (matmul.c, dot_fixed).
 *
 * ---- shape ----
 * A weight block (Q4 nibbles - 8, or Q8 bytes) and an activation block are
 * 32 int8 each; their exact int32 dot comes from 4 x int32 partial sums:
 *   NEON     smull (int8 x int8 -> int16; |product| <= 2^14, never two
 *            added in int16) and sadalp into int32;
 *   dotprod  two sdot;
 * and 4 such dots reduce to one vector of 4 lanes with two addp rounds.
 *   - One token (calls of 1-3 tokens: decode): per row, 4 consecutive
 *     blocks per vector, so the 16 stripes of a chunk are 4 float vectors
 *     (stripe b % 16 in vector (b % 16) / 4, lane b % 4); the combined
 *     scales d_b * as_b load as 4 contiguous fp16 and 4 contiguous floats.
 *     A chunk's last 1-3 blocks run from zero-padded copies (0 x 0 adds
 *     nothing to a stripe, which is never -0).
 *   - Batches (4+ tokens), NEON and dotprod: per row 4 tokens per vector
 *     (lane = token; the last group repeats the last token, its lanes
 *     dropped), one FMA chain per lane over the blocks in order.
 *   - Batches on i8mm: 2 rows x 2 tokens per smmla, which leaves the 4
 *     dots [r0 t0, r0 t1, r1 t0, r1 t1] in one vector, 4 smmla per block
 *     (one per 8 bytes); the same chain per lane.
 * The dotprod and i8mm code is compiled for ARMv8.2-A with those
 * extensions (target attributes) and only called when getauxval says the
 * CPU has them (isa.c). */
#include "runtime/kernels/internal.h"

#ifdef PI2_K_ARM64

#define K_T_DP __attribute__((target("arch=armv8.2-a+dotprod")))
#define K_T_MM __attribute__((target("arch=armv8.2-a+dotprod+i8mm")))

/* A weight or activation block as 32 int8: lo = values 0..15, hi = 16..31. */
typedef struct k_blk {
    int8x16_t lo, hi;
} k_blk;

/* Weight block b of a row: Q4 nibbles - 8 (byte j: value j low, j + 16
 * high), or Q8 bytes. */
static inline k_blk ld_w(const uint8_t *p, bool q4)
{
    k_blk w;
    k_neon_wblk(p, q4, &w.lo, &w.hi);
    return w;
}

static inline k_blk ld_a(const int8_t *a)
{
    k_blk x = {vld1q_s8(a), vld1q_s8(a + 16)};
    return x;
}

/* Partial sums of one block pair (their total is the exact dot). */
static inline int32x4_t pdot_neon(k_blk w, k_blk a)
{
    int32x4_t p = vpaddlq_s16(vmull_s8(vget_low_s8(w.lo), vget_low_s8(a.lo)));
    p = vpadalq_s16(p, vmull_high_s8(w.lo, a.lo));
    p = vpadalq_s16(p, vmull_s8(vget_low_s8(w.hi), vget_low_s8(a.hi)));
    return vpadalq_s16(p, vmull_high_s8(w.hi, a.hi));
}

K_T_DP static inline int32x4_t pdot_dp(k_blk w, k_blk a)
{
    return vdotq_s32(vdotq_s32(vdupq_n_s32(0), w.lo, a.lo), w.hi, a.hi);
}

/* Lane i = the dot of pair i. */
#define K_DOTS4(PDOT, w0, a0, w1, a1, w2, a2, w3, a3)                                                  \
    vpaddq_s32(vpaddq_s32(PDOT(w0, a0), PDOT(w1, a1)), vpaddq_s32(PDOT(w2, a2), PDOT(w3, a3)))

/* 4 fp16 scales as floats (exact). */
static inline float32x4_t ld_h4(const uint16_t *h) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h))); }

/* k_tree16 of the stripes x[0..4) (x[k] lane i = stripe 4k + i). */
static inline float tree16(const float32x4_t x[4])
{
    float32x4_t z = vaddq_f32(vaddq_f32(x[0], x[2]), vaddq_f32(x[1], x[3]));
    return (vgetq_lane_f32(z, 0) + vgetq_lane_f32(z, 2)) + (vgetq_lane_f32(z, 1) + vgetq_lane_f32(z, 3));
}

/* One token: out[r] = the dot of row r (p: payloads, s: scales) with
 * activations a (as: block scales) over nb blocks, in the one-token
 * order. 4 blocks per step; a chunk's ragged end from padded copies. */
#define K_DEF_T1(name, TGT, PDOT)                                                                      \
    TGT static float name##_row(bool q4, const uint8_t *p, const uint16_t *s, const float *as,         \
                                const int8_t *a, int64_t nb)                                           \
    {                                                                                                  \
        int64_t gb = q4 ? PI2_Q4_GROUP_BYTES : PI2_Q8_GROUP_BYTES;                                     \
        float total = 0.0f;                                                                            \
        for (int64_t b0 = 0; b0 < nb; b0 += K_MC) {                                                    \
            int64_t e = min64(b0 + K_MC, nb);                                                          \
            float32x4_t x[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)}; \
            for (int64_t b = b0; b < e; b += 4) {                                                      \
                const uint8_t *pb = p + b * gb;                                                        \
                const int8_t *ab = a + b * QG;                                                         \
                const uint16_t *sb = s + b;                                                            \
                const float *asb = as + b;                                                             \
                uint8_t tw[4 * PI2_Q8_GROUP_BYTES];                                                    \
                int8_t ta[4 * QG];                                                                     \
                uint16_t ts[4] = {0};                                                                  \
                float tas[4] = {0};                                                                    \
                if (e - b < 4) { /* 1-3 blocks left in the chunk */                                    \
                    int64_t m = e - b;                                                                 \
                    memset(tw, q4 ? 0x88 : 0, sizeof tw);                                              \
                    memset(ta, 0, sizeof ta);                                                          \
                    memcpy(tw, pb, (size_t)(m * gb));                                                  \
                    memcpy(ta, ab, (size_t)(m * QG));                                                  \
                    memcpy(ts, sb, (size_t)m * sizeof(uint16_t));                                      \
                    memcpy(tas, asb, (size_t)m * sizeof(float));                                       \
                    pb = tw, ab = ta, sb = ts, asb = tas;                                              \
                }                                                                                      \
                int32x4_t d = K_DOTS4(PDOT, ld_w(pb, q4), ld_a(ab), ld_w(pb + gb, q4), ld_a(ab + QG),  \
                                      ld_w(pb + 2 * gb, q4), ld_a(ab + 2 * QG), ld_w(pb + 3 * gb, q4), \
                                      ld_a(ab + 3 * QG));                                              \
                float32x4_t sc = vmulq_f32(ld_h4(sb), vld1q_f32(asb));                                 \
                int k = (int)((b - b0) / 4 % 4);                                                       \
                x[k] = vfmaq_f32(x[k], vcvtq_f32_s32(d), sc);                                          \
            }                                                                                          \
            total += tree16(x);                                                                        \
        }                                                                                              \
        return total;                                                                                  \
    }

/* Batches, one row against 4 tokens (a[k], as[k]: token k's activations
 * and block scales): res lane k, in the batch order. */
#define K_DEF_T4(name, TGT, PDOT)                                                                      \
    TGT static float32x4_t name##_row4(bool q4, const uint8_t *p, const uint16_t *s,                   \
                                       const float *const as[4], const int8_t *const a[4], int64_t nb) \
    {                                                                                                  \
        int64_t gb = q4 ? PI2_Q4_GROUP_BYTES : PI2_Q8_GROUP_BYTES;                                     \
        float32x4_t total = vdupq_n_f32(0.0f);                                                         \
        for (int64_t b0 = 0; b0 < nb; b0 += K_MC) {                                                    \
            float32x4_t acc = vdupq_n_f32(0.0f);                                                       \
            for (int64_t b = b0; b < min64(b0 + K_MC, nb); b++) {                                      \
                k_blk w = ld_w(p + b * gb, q4);                                                        \
                int32x4_t d = K_DOTS4(PDOT, w, ld_a(a[0] + b * QG), w, ld_a(a[1] + b * QG), w,         \
                                      ld_a(a[2] + b * QG), w, ld_a(a[3] + b * QG));                    \
                float asv[4] = {as[0][b], as[1][b], as[2][b], as[3][b]};                               \
                float32x4_t sc = vmulq_n_f32(vld1q_f32(asv), pi2_f16_to_f32(s[b]));                    \
                acc = vfmaq_f32(acc, vcvtq_f32_s32(d), sc);                                            \
            }                                                                                          \
            total = vaddq_f32(total, acc);                                                             \
        }                                                                                              \
        return total;                                                                                  \
    }

K_DEF_T1(mm_neon, , pdot_neon)
K_DEF_T1(mm_dp, K_T_DP, pdot_dp)
K_DEF_T4(mm_neon, , pdot_neon)
K_DEF_T4(mm_dp, K_T_DP, pdot_dp)

/* Two rows (w0, w1) against two tokens' block (a0, a1): the exact dots
 * [r0 t0, r0 t1, r1 t0, r1 t1], one smmla per 8 bytes. */
K_T_MM static inline int32x4_t mmla_2x2(k_blk w0, k_blk w1, k_blk a0, k_blk a1)
{
#define K_Z1(x, y) vreinterpretq_s8_s64(vzip1q_s64(vreinterpretq_s64_s8(x), vreinterpretq_s64_s8(y)))
#define K_Z2(x, y) vreinterpretq_s8_s64(vzip2q_s64(vreinterpretq_s64_s8(x), vreinterpretq_s64_s8(y)))
    int32x4_t d = vmmlaq_s32(vdupq_n_s32(0), K_Z1(w0.lo, w1.lo), K_Z1(a0.lo, a1.lo));
    d = vmmlaq_s32(d, K_Z2(w0.lo, w1.lo), K_Z2(a0.lo, a1.lo));
    d = vmmlaq_s32(d, K_Z1(w0.hi, w1.hi), K_Z1(a0.hi, a1.hi));
    return vmmlaq_s32(d, K_Z2(w0.hi, w1.hi), K_Z2(a0.hi, a1.hi));
#undef K_Z1
#undef K_Z2
}

/* Batches on i8mm: rows p0, p1 against tokens (a0, as0), (a1, as1): lanes
 * [r0 t0, r0 t1, r1 t0, r1 t1], in the batch order. */
K_T_MM static float32x4_t mm_i8_2x2(bool q4, const uint8_t *p0, const uint8_t *p1, const uint16_t *s0,
                                     const uint16_t *s1, const float *as0, const float *as1, const int8_t *a0,
                                     const int8_t *a1, int64_t nb)
{
    int64_t gb = q4 ? PI2_Q4_GROUP_BYTES : PI2_Q8_GROUP_BYTES;
    float32x4_t total = vdupq_n_f32(0.0f);
    for (int64_t b0 = 0; b0 < nb; b0 += K_MC) {
        float32x4_t acc = vdupq_n_f32(0.0f);
        for (int64_t b = b0; b < min64(b0 + K_MC, nb); b++) {
            int32x4_t d = mmla_2x2(ld_w(p0 + b * gb, q4), ld_w(p1 + b * gb, q4), ld_a(a0 + b * QG), ld_a(a1 + b * QG));
            float dv[4] = {pi2_f16_to_f32(s0[b]), pi2_f16_to_f32(s0[b]), pi2_f16_to_f32(s1[b]),
                           pi2_f16_to_f32(s1[b])};
            float av[4] = {as0[b], as1[b], as0[b], as1[b]};
            acc = vfmaq_f32(acc, vcvtq_f32_s32(d), vmulq_f32(vld1q_f32(dv), vld1q_f32(av)));
        }
        total = vaddq_f32(total, acc);
    }
    return total;
}

/* All rows against tokens [0, T), T >= K_BATCH_T, on i8mm: rows and
 * tokens in pairs (an odd last one repeated, its lanes dropped). */
static void mm_batch_i8(bool q4, int64_t n, int nrows, const uint8_t *const *wp, const uint16_t *const *ws,
                        const float *ascales, const int8_t *aq, int T, float *out, int64_t ldo)
{
    int64_t nb = n / QG;
    for (int r = 0; r < nrows; r += 2) {
        int r1 = r + 1 < nrows ? r + 1 : r;
        for (int t = 0; t < T; t += 2) {
            int t1 = t + 1 < T ? t + 1 : t;
            float res[4];
            vst1q_f32(res, mm_i8_2x2(q4, wp[r], wp[r1], ws[r], ws[r1], ascales + t * nb, ascales + t1 * nb,
                                     aq + t * n, aq + t1 * n, nb));
            out[t * ldo + r] = res[0];
            if (t1 != t)
                out[t1 * ldo + r] = res[1];
            if (r1 != r) {
                out[t * ldo + r1] = res[2];
                if (t1 != t)
                    out[t1 * ldo + r1] = res[3];
            }
        }
    }
}

/* All rows against tokens [0, T), T >= K_BATCH_T, 4 tokens per vector. */
static void mm_batch4(bool dp, bool q4, int64_t n, int nrows, const uint8_t *const *wp, const uint16_t *const *ws,
                      const float *ascales, const int8_t *aq, int T, float *out, int64_t ldo)
{
    int64_t nb = n / QG;
    for (int t0 = 0; t0 < T; t0 += 4) {
        const float *as[4];
        const int8_t *a[4];
        for (int k = 0; k < 4; k++) {
            int t = t0 + k < T ? t0 + k : T - 1;
            as[k] = ascales + t * nb;
            a[k] = aq + t * n;
        }
        for (int r = 0; r < nrows; r++) {
            float res[4];
            vst1q_f32(res, dp ? mm_dp_row4(q4, wp[r], ws[r], as, a, nb) : mm_neon_row4(q4, wp[r], ws[r], as, a, nb));
            for (int k = 0; k < 4 && t0 + k < T; k++)
                out[(t0 + k) * ldo + r] = res[k];
        }
    }
}

bool pi2_ki_mm_neon(pi2_isa isa, pi2_qtype wt, int64_t n, int nrows, const uint8_t *const *wp,
                    const uint16_t *const *ws, const float *ascales, const int8_t *aq, int T, float *out,
                    int64_t ldo)
{
    pi2_isa p = pi2_ki_isa_pick(isa);
    if (!k_neon(p) || (wt != PI2_QT_Q4 && wt != PI2_QT_Q8))
        return false;
    bool q4 = wt == PI2_QT_Q4, dp = p != PI2_ISA_NEON;
    int64_t nb = n / QG;
    if (T >= K_BATCH_T) {
        if (p == PI2_ISA_I8MM)
            mm_batch_i8(q4, n, nrows, wp, ws, ascales, aq, T, out, ldo);
        else
            mm_batch4(dp, q4, n, nrows, wp, ws, ascales, aq, T, out, ldo);
        return true;
    }
    for (int t = 0; t < T; t++)
        for (int r = 0; r < nrows; r++)
            out[t * ldo + r] = dp ? mm_dp_row(q4, wp[r], ws[r], ascales + t * nb, aq + t * n, nb)
                                  : mm_neon_row(q4, wp[r], ws[r], ascales + t * nb, aq + t * n, nb);
    return true;
}

#endif /* PI2_K_ARM64 */
