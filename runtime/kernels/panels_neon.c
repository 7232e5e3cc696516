/* Prefill's gate and up projections of Q4 rows on arm64: the superblock
 * GEMM (pi2_k_matmul_sb) and its activation quantizer
 * (pi2_k_act_quantize_sb), bit-identical to the twins in panels.c
 * (kernels.h gives the algorithm).
 *
 * Per row and chunk of K_PB blocks the block scales become int16 factors
 * k_b of one scale D per superblock (the twin's float operations, per
 * row and chunk: cheap next to the dots). Then, NEON and dotprod: 4
 * tokens per vector, each block's 4 exact dots (smull/sadalp or sdot,
 * two addp rounds), S += k_b * dot in int32 (|S| < 2^30), and per
 * superblock acc = fma(S, D * sigma, acc) per lane; i8mm: 2 rows x 2
 * tokens per vector by 4 smmla per block. Tokens and rows past the end
 * repeat the last; their lanes are dropped. */
#include "runtime/kernels/internal.h"

#ifdef PI2_K_ARM64

#define K_T_DP __attribute__((target("arch=armv8.2-a+dotprod")))
#define K_T_MM __attribute__((target("arch=armv8.2-a+dotprod+i8mm")))

static inline int32x4_t pdot_neon(int8x16_t wl, int8x16_t wh, const int8_t *a)
{
    int8x16_t al = vld1q_s8(a), ah = vld1q_s8(a + 16);
    int32x4_t p = vpaddlq_s16(vmull_s8(vget_low_s8(wl), vget_low_s8(al)));
    p = vpadalq_s16(p, vmull_high_s8(wl, al));
    p = vpadalq_s16(p, vmull_s8(vget_low_s8(wh), vget_low_s8(ah)));
    return vpadalq_s16(p, vmull_high_s8(wh, ah));
}

K_T_DP static inline int32x4_t pdot_dp(int8x16_t wl, int8x16_t wh, const int8_t *a)
{
    return vdotq_s32(vdotq_s32(vdupq_n_s32(0), wl, vld1q_s8(a)), wh, vld1q_s8(a + 16));
}

/* The factors of one row's chunk of kb blocks (scales h): k[b], and D per
 * superblock; panels.c's sb_factors, operation for operation. */
static void chunk_factors(const uint16_t *h, int64_t kb, int32_t *k, float *D)
{
    for (int64_t s0 = 0; s0 < kb; s0 += K_SB) {
        int m = (int)min64(K_SB, kb - s0);
        float d[K_SB], mx = 0.0f;
        for (int b = 0; b < m; b++) {
            d[b] = pi2_f16_to_f32(h[s0 + b]);
            mx = fmaxf(mx, fabsf(d[b]));
        }
        bool ok = mx >= K_DMIN;
        float inv = ok ? K_KONE / mx : 0.0f;
        D[s0 / K_SB] = ok ? mx * 0x1p-12f : 0.0f;
        for (int b = 0; b < m; b++) {
            float q = rintf(d[b] * inv);
            k[s0 + b] = q > K_KONE ? (int32_t)K_KONE : q < -K_KONE ? -(int32_t)K_KONE : q == q ? (int32_t)q : 0;
        }
    }
}

/* One row's chunk (payload p at the chunk, factors k, D) against 4
 * tokens (a[j] at the chunk, scales sc[j] of the chunk's superblocks):
 * the chunk's sums, lane j. */
#define K_DEF_SB4(name, TGT, PDOT)                                                                     \
    TGT static float32x4_t name(const uint8_t *p, int64_t kb, const int32_t *k, const float *D,        \
                                const int8_t *const a[4], const float *const sc[4])                    \
    {                                                                                                  \
        float32x4_t acc = vdupq_n_f32(0.0f);                                                           \
        for (int64_t s0 = 0; s0 < kb; s0 += K_SB) {                                                    \
            int32x4_t S = vdupq_n_s32(0);                                                              \
            for (int64_t b = s0; b < min64(s0 + K_SB, kb); b++) {                                      \
                int8x16_t wl, wh;                                                                      \
                k_neon_wblk(p + b * PI2_Q4_GROUP_BYTES, true, &wl, &wh);                               \
                int32x4_t d = vpaddq_s32(vpaddq_s32(PDOT(wl, wh, a[0] + b * QG), PDOT(wl, wh, a[1] + b * QG)), \
                                         vpaddq_s32(PDOT(wl, wh, a[2] + b * QG), PDOT(wl, wh, a[3] + b * QG))); \
                S = vmlaq_n_s32(S, d, k[b]);                                                           \
            }                                                                                          \
            float sv[4] = {sc[0][s0 / K_SB], sc[1][s0 / K_SB], sc[2][s0 / K_SB], sc[3][s0 / K_SB]};    \
            acc = vfmaq_f32(acc, vcvtq_f32_s32(S), vmulq_n_f32(vld1q_f32(sv), D[s0 / K_SB]));          \
        }                                                                                              \
        return acc;                                                                                    \
    }

K_DEF_SB4(sb4_neon, , pdot_neon)
K_DEF_SB4(sb4_dp, K_T_DP, pdot_dp)

/* Two rows (p0, p1; factors k0, D0 and k1, D1) against two tokens (a0, a1;
 * scales sc0, sc1): lanes [r0 t0, r0 t1, r1 t0, r1 t1]. */
K_T_MM static float32x4_t sb_i8mm(const uint8_t *p0, const uint8_t *p1, int64_t kb, const int32_t *k0,
                                   const int32_t *k1, const float *D0, const float *D1, const int8_t *a0,
                                   const int8_t *a1, const float *sc0, const float *sc1)
{
#define K_Z1(x, y) vreinterpretq_s8_s64(vzip1q_s64(vreinterpretq_s64_s8(x), vreinterpretq_s64_s8(y)))
#define K_Z2(x, y) vreinterpretq_s8_s64(vzip2q_s64(vreinterpretq_s64_s8(x), vreinterpretq_s64_s8(y)))
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t s0 = 0; s0 < kb; s0 += K_SB) {
        int32x4_t S = vdupq_n_s32(0);
        for (int64_t b = s0; b < min64(s0 + K_SB, kb); b++) {
            int8x16_t l0, h0, l1, h1;
            k_neon_wblk(p0 + b * PI2_Q4_GROUP_BYTES, true, &l0, &h0);
            k_neon_wblk(p1 + b * PI2_Q4_GROUP_BYTES, true, &l1, &h1);
            int8x16_t x0 = vld1q_s8(a0 + b * QG), y0 = vld1q_s8(a0 + b * QG + 16);
            int8x16_t x1 = vld1q_s8(a1 + b * QG), y1 = vld1q_s8(a1 + b * QG + 16);
            int32x4_t d = vmmlaq_s32(vdupq_n_s32(0), K_Z1(l0, l1), K_Z1(x0, x1));
            d = vmmlaq_s32(d, K_Z2(l0, l1), K_Z2(x0, x1));
            d = vmmlaq_s32(d, K_Z1(h0, h1), K_Z1(y0, y1));
            d = vmmlaq_s32(d, K_Z2(h0, h1), K_Z2(y0, y1));
            int32_t kv[4] = {k0[b], k0[b], k1[b], k1[b]};
            S = vmlaq_s32(S, d, vld1q_s32(kv));
        }
        int64_t s = s0 / K_SB;
        float dv[4] = {D0[s], D0[s], D1[s], D1[s]}, av[4] = {sc0[s], sc1[s], sc0[s], sc1[s]};
        acc = vfmaq_f32(acc, vcvtq_f32_s32(S), vmulq_f32(vld1q_f32(dv), vld1q_f32(av)));
    }
    return acc;
#undef K_Z1
#undef K_Z2
}

/* out[t * ldo + r] for r < nrows, chunk b0 (the chunk's sums join out). */
static void sb_chunk_i8mm(int64_t n, int nrows, const uint8_t *const *wp, const uint16_t *const *ws,
                          const float *ascales, const int8_t *aq, int T, float *out, int64_t ldo, int64_t b0)
{
    int64_t nb = n / QG, ns = (nb + K_SB - 1) / K_SB, kb = min64(K_PB, nb - b0);
    for (int r = 0; r < nrows; r += 2) {
        int r1 = r + 1 < nrows ? r + 1 : r;
        int32_t k0[K_PB], k1[K_PB];
        float D0[K_PB / K_SB], D1[K_PB / K_SB];
        chunk_factors(ws[r] + b0, kb, k0, D0);
        chunk_factors(ws[r1] + b0, kb, k1, D1);
        for (int t = 0; t < T; t += 2) {
            int t1 = t + 1 < T ? t + 1 : t;
            float res[4];
            vst1q_f32(res, sb_i8mm(wp[r] + b0 * PI2_Q4_GROUP_BYTES, wp[r1] + b0 * PI2_Q4_GROUP_BYTES, kb, k0, k1, D0,
                                   D1, aq + t * n + b0 * QG, aq + t1 * n + b0 * QG, ascales + t * ns + b0 / K_SB,
                                   ascales + t1 * ns + b0 / K_SB));
            int rr[4] = {r, r, r1, r1}, tt[4] = {t, t1, t, t1};
            for (int i = 0; i < 4; i++) {
                if ((i & 1 && t1 == t) || (i & 2 && r1 == r))
                    continue;
                float *o = out + tt[i] * ldo + rr[i];
                *o = b0 == 0 ? res[i] : *o + res[i];
            }
        }
    }
}

static void sb_chunk4(bool dp, int64_t n, int nrows, const uint8_t *const *wp, const uint16_t *const *ws,
                      const float *ascales, const int8_t *aq, int T, float *out, int64_t ldo, int64_t b0)
{
    int64_t nb = n / QG, ns = (nb + K_SB - 1) / K_SB, kb = min64(K_PB, nb - b0);
    for (int r = 0; r < nrows; r++) {
        int32_t k[K_PB];
        float D[K_PB / K_SB];
        chunk_factors(ws[r] + b0, kb, k, D);
        const uint8_t *p = wp[r] + b0 * PI2_Q4_GROUP_BYTES;
        for (int t0 = 0; t0 < T; t0 += 4) {
            const int8_t *a[4];
            const float *sc[4];
            for (int j = 0; j < 4; j++) {
                int t = t0 + j < T ? t0 + j : T - 1;
                a[j] = aq + t * n + b0 * QG;
                sc[j] = ascales + t * ns + b0 / K_SB;
            }
            float res[4];
            vst1q_f32(res, dp ? sb4_dp(p, kb, k, D, a, sc) : sb4_neon(p, kb, k, D, a, sc));
            for (int j = 0; j < 4 && t0 + j < T; j++) {
                float *o = out + (t0 + j) * ldo + r;
                *o = b0 == 0 ? res[j] : *o + res[j];
            }
        }
    }
}

bool pi2_ki_matmul_sb_neon(pi2_isa isa, int64_t n, int nrows, const uint8_t *const *wp, const uint16_t *const *ws,
                           const float *ascales, const int8_t *aq, int T, float *out, int64_t ldo)
{
    pi2_isa p = pi2_ki_isa_pick(isa);
    if (!k_neon(p))
        return false;
    for (int64_t b0 = 0; b0 < n / QG; b0 += K_PB) {
        if (p == PI2_ISA_I8MM)
            sb_chunk_i8mm(n, nrows, wp, ws, ascales, aq, T, out, ldo, b0);
        else
            sb_chunk4(p == PI2_ISA_DOTPROD, n, nrows, wp, ws, ascales, aq, T, out, ldo, b0);
    }
    return true;
}

/* ---- pi2_k_act_quantize_sb: panels.c's act_sb_scalar per superblock ---- */

static void act_sb_super(const float *x, int64_t len, float *scale, int8_t *q)
{
    float32x4_t mx = vdupq_n_f32(0.0f);
    for (int64_t j = 0; j < len; j += 4)
        mx = vmaxnmq_f32(mx, vabsq_f32(vld1q_f32(x + j))); /* fmaxf: NaN passed over */
    float m = vmaxnmvq_f32(mx);
    bool ok = m >= K_DMIN;
    float inv = ok ? 127.0f / m : 0.0f;
    *scale = ok ? m / 127.0f : 0.0f;
    int32x4_t lo = vdupq_n_s32(-127), hi = vdupq_n_s32(127);
    for (int64_t j = 0; j < len; j += 8) {
        /* fcvtns: round half to even, NaN to 0 as the twin's guard */
        int32x4_t r0 = vminq_s32(vmaxq_s32(vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + j), inv)), lo), hi);
        int32x4_t r1 = vminq_s32(vmaxq_s32(vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + j + 4), inv)), lo), hi);
        vst1_s8(q + j, vmovn_s16(vcombine_s16(vmovn_s32(r0), vmovn_s32(r1))));
    }
}

bool pi2_ki_act_quantize_sb_neon(pi2_isa isa, const float *x, int64_t ldx, int T, int64_t n, float *scales,
                                 int8_t *q, int32_t *sums)
{
    pi2_isa p = pi2_ki_isa_pick(isa);
    if (!k_neon(p))
        return false;
    int64_t nb = n / QG, ns = (nb + K_SB - 1) / K_SB;
    for (int t = 0; t < T; t++) {
        int8_t *qt = q + (int64_t)t * n;
        for (int64_t s = 0; s < ns; s++) {
            int64_t j0 = s * K_SB * QG;
            act_sb_super(x + (int64_t)t * ldx + j0, min64(K_SB * QG, n - j0), scales + (int64_t)t * ns + s, qt + j0);
        }
        for (int64_t b = 0; b < nb; b++) {
            int16x8_t w = vpaddlq_s8(vld1q_s8(qt + b * QG));
            w = vpadalq_s8(w, vld1q_s8(qt + b * QG + 16));
            sums[(int64_t)t * nb + b] = vaddlvq_s16(w);
        }
    }
    return true;
}

#endif /* PI2_K_ARM64 */
