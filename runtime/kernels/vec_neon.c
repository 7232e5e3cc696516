/* Vector ops on arm64, each bit-identical to its twin in vec.c: the
 * activation quantizer, the f32 GEMV pair, softmax and dequantized rows.
 *
 * Activation quantization (pi2_k_act_quantize), as pi2_q8act_quantize
 * (formats/quant.c): the same
 * max of |x| (NaN or infinity anywhere makes the block NaN-scaled and
 * zero), the same scalar 127 / amax and amax / 127, one multiply and a
 * round-to-nearest-even convert per value (fcvtns: rintf in the default
 * rounding mode), the same clamp to +-127. Decode quantizes each layer's
 * input on one thread, so this serial step has to be short. Every NEON
 * level (neon, dotprod, i8mm) takes it. */
#include "runtime/kernels/internal.h"

#ifdef PI2_K_ARM64

/* One block of 32 values: scale, q and the sum of q. */
static void act_block(const float *xb, float *scale, int8_t *qb, int32_t *sum)
{
    float32x4_t x[8], m = vdupq_n_f32(0.0f);
    uint32x4_t fin = vdupq_n_u32(~0u);
    for (int k = 0; k < 8; k++) {
        x[k] = vld1q_f32(xb + 4 * k);
        float32x4_t a = vabsq_f32(x[k]);
        fin = vandq_u32(fin, vcleq_f32(a, vdupq_n_f32(FLT_MAX))); /* false for NaN and inf */
        m = vmaxq_f32(m, a);
    }
    bool bad = vminvq_u32(fin) == 0;
    float amax = bad ? 0.0f : vmaxvq_f32(m);
    if (bad || amax < 0x1p-100f) {
        *scale = bad ? NAN : 0.0f;
        memset(qb, 0, QG);
        *sum = 0;
        return;
    }
    float id = 127.0f / amax;
    *scale = amax / 127.0f;
    int32x4_t lo = vdupq_n_s32(-127), hi = vdupq_n_s32(127), s = vdupq_n_s32(0);
    int16x8_t h[4];
    for (int k = 0; k < 8; k += 2) {
        int32x4_t r0 = vminq_s32(vmaxq_s32(vcvtnq_s32_f32(vmulq_n_f32(x[k], id)), lo), hi);
        int32x4_t r1 = vminq_s32(vmaxq_s32(vcvtnq_s32_f32(vmulq_n_f32(x[k + 1], id)), lo), hi);
        s = vaddq_s32(s, vaddq_s32(r0, r1));
        h[k / 2] = vcombine_s16(vmovn_s32(r0), vmovn_s32(r1));
    }
    vst1q_s8(qb, vcombine_s8(vmovn_s16(h[0]), vmovn_s16(h[1])));
    vst1q_s8(qb + 16, vcombine_s8(vmovn_s16(h[2]), vmovn_s16(h[3])));
    *sum = vaddvq_s32(s);
}

bool pi2_ki_act_quantize_neon(pi2_isa isa, const float *x, int64_t ldx, int T, int64_t n, float *scales, int8_t *q,
                              int32_t *sums)
{
    pi2_isa p = pi2_ki_isa_pick(isa);
    if (!k_neon(p))
        return false;
    int64_t nb = n / QG;
    for (int t = 0; t < T; t++)
        for (int64_t b = 0; b < nb; b++) {
            int64_t i = (int64_t)t * nb + b;
            act_block(x + (int64_t)t * ldx + b * QG, scales + i, q + (int64_t)t * n + b * QG, sums + i);
        }
    return true;
}

/* ---- f32 GEMV (attention) ----
 * pi2_k_sgemv: the 16 stripes of a row are 4 vectors (stripe j % 16 in
 * vector j % 16 / 4), each column an fma in column order; vec.c's tree
 * (x_4L + x_4L+2) + (x_4L+1 + x_4L+3) per vector, then (q_0 + q_1) +
 * (q_2 + q_3); the last n % 16 columns a scalar fma chain added last.
 * pi2_k_sgemv_t: 16 outputs in 4 vectors, one fma per row in row order. */

static inline float sum4_pairs(float32x4_t v)
{
    return (vgetq_lane_f32(v, 0) + vgetq_lane_f32(v, 2)) + (vgetq_lane_f32(v, 1) + vgetq_lane_f32(v, 3));
}

static void sgemv_neon(const float *W, int64_t ldw, int64_t n, int nrows, const float *x, float *out)
{
    int64_t nfull = n & ~(int64_t)15;
    for (int r = 0; r < nrows; r++) {
        const float *w = W + (int64_t)r * ldw;
        float32x4_t s[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
        for (int64_t j = 0; j < nfull; j += 16)
            for (int k = 0; k < 4; k++)
                s[k] = vfmaq_f32(s[k], vld1q_f32(w + j + 4 * k), vld1q_f32(x + j + 4 * k));
        float tail = 0.0f;
        for (int64_t j = nfull; j < n; j++)
            tail = fmaf(w[j], x[j], tail);
        out[r] = ((sum4_pairs(s[0]) + sum4_pairs(s[1])) + (sum4_pairs(s[2]) + sum4_pairs(s[3]))) + tail;
    }
}

static void sgemv_t_neon(const float *W, int64_t ldw, int64_t n, int nrows, const float *c, float *out, bool acc)
{
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        float32x4_t o[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
        for (int k = 0; k < 4 && acc; k++)
            o[k] = vld1q_f32(out + j + 4 * k);
        for (int r = 0; r < nrows; r++) {
            const float *w = W + (int64_t)r * ldw + j;
            for (int k = 0; k < 4; k++)
                o[k] = vfmaq_n_f32(o[k], vld1q_f32(w + 4 * k), c[r]);
        }
        for (int k = 0; k < 4; k++)
            vst1q_f32(out + j + 4 * k, o[k]);
    }
    for (; j < n; j++) {
        float o = acc ? out[j] : 0.0f;
        for (int r = 0; r < nrows; r++)
            o = fmaf(c[r], W[(int64_t)r * ldw + j], o);
        out[j] = o;
    }
}

bool pi2_ki_sgemv_neon(pi2_isa isa, bool transposed, bool acc, const float *W, int64_t ldw, int64_t n, int nrows,
                       const float *x, float *out)
{
    pi2_isa p = pi2_ki_isa_pick(isa);
    if (!k_neon(p))
        return false;
    if (transposed)
        sgemv_t_neon(W, ldw, n, nrows, x, out, acc);
    else
        sgemv_neon(W, ldw, n, nrows, x, out);
    return true;
}

/* ---- softmax ----
 * vec.c's exp_fixed on 4 lanes, operation for operation: fmaxnm is fmaxf
 * (a NaN becomes the clamp), frintn is rintf, fmls/fmla the twin's fmaf
 * with -k and the polynomial's; 2^k from its exponent bits (k >= -126
 * after the clamp: a normal float, so p * 2^k rounds once, as the twin's
 * p * ldexpf(1, k)). The max is fmaxnm's, which ignores NaN as the twin's
 * compare does; where the twin keeps -0 and this +0, x - max is the same
 * but for a zero's sign, which exp_fixed maps to 1 either way. The sum:
 * element i in stripe i % 16 (vector (i % 16) / 4, lane i % 4) from +0,
 * the last n % 4 elements from a zero-padded copy (+0 changes no
 * stripe), then k_tree16's tree; x * (1 / sum). */

static inline float32x4_t exp_neon(float32x4_t x)
{
    x = vmaxnmq_f32(x, vdupq_n_f32(-87.3f));
    float32x4_t k = vrndnq_f32(vmulq_n_f32(x, 1.44269504089f));
    float32x4_t r = vfmsq_n_f32(x, k, 0.693145751953125f); /* ln2 high part (exact k * hi) */
    r = vfmsq_n_f32(r, k, 1.42860682030941723e-06f);       /* ln2 low part */
    float32x4_t p = vdupq_n_f32(1.0f / 720.0f);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 120.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 24.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 6.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(0.5f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(k), vdupq_n_s32(127)), 23);
    return vmulq_f32(p, vreinterpretq_f32_s32(e));
}

static void softmax_neon(float *x, int64_t n)
{
    float32x4_t mv = vdupq_n_f32(-INFINITY);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        mv = vmaxnmq_f32(mv, vld1q_f32(x + i));
    float mx = vmaxnmvq_f32(mv);
    for (; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    float32x4_t mxv = vdupq_n_f32(mx), s[4];
    for (int k = 0; k < 4; k++)
        s[k] = vdupq_n_f32(0.0f);
    for (i = 0; i + 4 <= n; i += 4) {
        float32x4_t v = exp_neon(vsubq_f32(vld1q_f32(x + i), mxv));
        vst1q_f32(x + i, v);
        s[i / 4 % 4] = vaddq_f32(s[i / 4 % 4], v);
    }
    if (i < n) {
        float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        int m = (int)(n - i);
        memcpy(t, x + i, (size_t)m * sizeof(float));
        vst1q_f32(t, exp_neon(vsubq_f32(vld1q_f32(t), mxv)));
        memcpy(x + i, t, (size_t)m * sizeof(float));
        for (int k = m; k < 4; k++)
            t[k] = 0.0f;
        s[i / 4 % 4] = vaddq_f32(s[i / 4 % 4], vld1q_f32(t));
    }
    /* k_tree16: y = x_j + x_j+8 is (s0 + s2 | s1 + s3), z_i = y_i + y_i+4 */
    float32x4_t z = vaddq_f32(vaddq_f32(s[0], s[2]), vaddq_f32(s[1], s[3]));
    float inv = 1.0f / sum4_pairs(z);
    for (i = 0; i + 4 <= n; i += 4)
        vst1q_f32(x + i, vmulq_n_f32(vld1q_f32(x + i), inv));
    for (; i < n; i++)
        x[i] *= inv;
}

bool pi2_ki_softmax_neon(pi2_isa isa, float *x, int64_t n)
{
    pi2_isa p = pi2_ki_isa_pick(isa);
    if (!k_neon(p))
        return false;
    softmax_neon(x, n);
    return true;
}

/* ---- dequantized rows: (q - 8) * d and q * d are exact floats, so any
 * order gives the twin's bits; the scale converts as the twin's does ---- */

static void dequant_neon(bool q4, int64_t n, int nrows, const uint8_t *const *wp, const uint16_t *const *ws,
                         float *dst)
{
    int64_t nb = n / QG, gb = q4 ? PI2_Q4_GROUP_BYTES : PI2_Q8_GROUP_BYTES;
    for (int r = 0; r < nrows; r++)
        for (int64_t b = 0; b < nb; b++) {
            float *o = dst + (int64_t)r * n + b * QG;
            float d = pi2_f16_to_f32(ws[r][b]);
            int8x16_t h[2];
            k_neon_wblk(wp[r] + b * gb, q4, &h[0], &h[1]);
            for (int k = 0; k < 2; k++) {
                int16x8_t lo = vmovl_s8(vget_low_s8(h[k])), hi = vmovl_high_s8(h[k]);
                vst1q_f32(o + 16 * k, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), d));
                vst1q_f32(o + 16 * k + 4, vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(lo)), d));
                vst1q_f32(o + 16 * k + 8, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), d));
                vst1q_f32(o + 16 * k + 12, vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(hi)), d));
            }
        }
}

bool pi2_ki_dequant_neon(pi2_isa isa, pi2_qtype wt, int64_t n, int nrows, const uint8_t *const *wp,
                         const uint16_t *const *ws, float *dst)
{
    pi2_isa p = pi2_ki_isa_pick(isa);
    if (!k_neon(p) || (wt != PI2_QT_Q4 && wt != PI2_QT_Q8))
        return false;
    dequant_neon(wt == PI2_QT_Q4, n, nrows, wp, ws, dst);
    return true;
}

#endif /* PI2_K_ARM64 */
