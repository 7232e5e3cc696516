/* Quantization. The format and the error bounds are specified in quant.h;
 * this file keeps each scalar reference next to the SIMD kernels that are
 * tested against it.
 *
 * Why the quantizer divides in double by the stored fp16 scale: the stored
 * value is what every kernel multiplies by, so the bounds are stated on it;
 * and in double the rounding decision round(x / D) is exact: with 24- and
 * 11-bit significands, x / D is either exactly a half-integer or at least
 * 2^-24 (relative) away from one, far beyond double's rounding error. So
 * the bounds hold with no float slop and every platform writes the same
 * bytes. Quantizing is offline work; speed there
 * matters less than bit-for-bit reproducibility.
 */
#include "formats/quant.h"

#include <float.h>
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PI2_Q_X86 1
#include <cpuid.h>
#include <immintrin.h>
#endif

/* Payloads and scales are used in place from the mapped file. */
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "pi2 formats are little-endian; big-endian hosts unsupported");

#define SCALE_LIMIT 65536.0 /* |d| must stay below this (Q4 and Q8 alike) */
#define ACT_TINY 0x1p-100f  /* activation blocks with a smaller amax are zero */

/* ---- names, shapes ---- */

const char *pi2_q_type_name(pi2_qtype t)
{
    switch (t) {
    case PI2_QT_F32:
        return "f32";
    case PI2_QT_Q8:
        return "q8";
    case PI2_QT_Q4:
        return "q4";
    }
    return "?";
}

int pi2_q_type_parse(const char *s, pi2_qtype *out, pi2_err *err)
{
    static const pi2_qtype all[] = {PI2_QT_F32, PI2_QT_Q8, PI2_QT_Q4};
    for (size_t i = 0; s && i < sizeof all / sizeof all[0]; i++) {
        if (strcmp(s, pi2_q_type_name(all[i])) == 0) {
            *out = all[i];
            return 0;
        }
    }
    return pi2_err_set(err, PI2_EUNSUPPORTED, "unknown quantization type '%.64s' (expected f32, q8 or q4)",
                       s ? s : "(null)");
}

static bool qtype_valid(pi2_qtype t) { return t == PI2_QT_F32 || t == PI2_QT_Q8 || t == PI2_QT_Q4; }

int pi2_q_check_cols(pi2_qtype t, int64_t cols, const char *what, pi2_err *err)
{
    if (!what)
        what = "row";
    if (!qtype_valid(t))
        return pi2_err_set(err, PI2_EINVAL, "%s: unknown quantization type %d", what, (int)t);
    if (cols < 1)
        return pi2_err_set(err, PI2_ESHAPE, "%s: %lld columns (need at least 1)", what, (long long)cols);
    if (t != PI2_QT_F32 && cols % PI2_Q_GROUP != 0)
        return pi2_err_set(err, PI2_ESHAPE, "%s: %lld columns is not a multiple of the %s group size %d", what,
                           (long long)cols, pi2_q_type_name(t), PI2_Q_GROUP);
    size_t bytes;
    if ((uint64_t)cols > SIZE_MAX || !pi2_mul_size((size_t)cols, t == PI2_QT_F32 ? sizeof(float) : 1, &bytes))
        return pi2_err_set(err, PI2_ERANGE, "%s: %lld columns is too large", what, (long long)cols);
    return 0;
}

size_t pi2_q_payload_row_bytes(pi2_qtype t, int64_t cols)
{
    if (pi2_q_check_cols(t, cols, NULL, NULL) != 0)
        return 0;
    switch (t) {
    case PI2_QT_F32:
        return (size_t)cols * sizeof(float);
    case PI2_QT_Q8:
        return (size_t)cols / PI2_Q_GROUP * PI2_Q8_GROUP_BYTES;
    case PI2_QT_Q4:
        return (size_t)cols / PI2_Q_GROUP * PI2_Q4_GROUP_BYTES;
    }
    return 0;
}

size_t pi2_q_scale_row_count(pi2_qtype t, int64_t cols)
{
    if (t == PI2_QT_F32 || pi2_q_check_cols(t, cols, NULL, NULL) != 0)
        return 0;
    return (size_t)cols / PI2_Q_GROUP;
}

/* ---- scales ---- */

/* fp16 bits of the largest fp16 value <= a, for 0 <= a < 65536. Rounding to
 * nearest first lands within half an fp16 step of a (the float rounding of a
 * is far finer), so at most one step down is ever taken. */
static uint16_t f16_toward_zero(double a)
{
    uint16_t h = pi2_f32_to_f16((float)a);
    while (h > 0 && (double)pi2_f16_to_f32(h) > a)
        h--;
    return h;
}

/* Spacing of fp16 values at |D| (see quant.h); +inf for inf/NaN scales. */
static float f16_ulp(uint16_t h)
{
    int e = (h >> 10) & 0x1f;
    if (e == 0x1f)
        return INFINITY;
    return e == 0 ? 0x1p-24f : ldexpf(1.0f, e - 25);
}

float pi2_q_error_bound(pi2_qtype t, uint16_t scale)
{
    float d = fabsf(pi2_f16_to_f32(scale));
    float ulp = f16_ulp(scale);
    switch (t) {
    case PI2_QT_Q4:
        return d + 8.0f * ulp;
    case PI2_QT_Q8:
        return fmaxf(0.5f * d, 127.0f * ulp);
    case PI2_QT_F32:
        return 0.0f;
    }
    return INFINITY;
}

/* ---- quantize / dequantize ---- */

/* The first element of largest magnitude, sign kept. */
static float group_max(const float *x)
{
    /* the largest magnitude first (a max reduction that vectorises), then
     * the first element that has it, sign kept */
    float amax = 0.0f;
    for (int j = 0; j < PI2_Q_GROUP; j++) {
        float a = fabsf(x[j]);
        amax = a > amax ? a : amax;
    }
    if (amax == 0.0f)
        return 0.0f;
    for (int j = 0; j < PI2_Q_GROUP; j++)
        if (fabsf(x[j]) == amax)
            return x[j];
    return 0.0f; /* not reached: inputs are finite */
}

/* x / D rounded half away from zero, for |x / D| <= 128 (the scale limits
 * guarantee it). Branch-free so the group loops vectorise: truncate, then
 * step away from zero when the exact remainder reaches one half. */
static inline int32_t div_round(float x, double dd)
{
    double v = (double)x / dd;
    int32_t t = (int32_t)v; /* exact truncation */
    double f = v - (double)t;
    return t + (int32_t)(f >= 0.5) - (int32_t)(f <= -0.5);
}

/* The fast twin of div_round: v = x * (1/D) in float (absolute error below
 * 2^-15 for |v| <= 128), rounded half away from zero. It agrees with
 * div_round except possibly when v lies within 2^-12 of a half-integer, and
 * it sets *near then so the caller redoes the group exactly. Vectorises. */
static inline int32_t mul_round(float x, float inv, int *near)
{
    float v = x * inv;
    float av = fabsf(v);
    float fr = av - (float)(int32_t)av;
    *near |= fabsf(fr - 0.5f) < 0x1p-12f;
    int32_t r = (int32_t)(av + 0.5f);
    return v < 0.0f ? -r : r;
}

static void quantize_q4_group(const float *x, uint16_t *scale, uint8_t *qs)
{
    double d = (double)group_max(x) / -8.0;
    uint16_t h = f16_toward_zero(fabs(d));
    if (h != 0 && d < 0)
        h |= 0x8000;
    *scale = h;
    if (h == 0) {
        memset(qs, 0x88, PI2_Q4_GROUP_BYTES); /* every q is 8 */
        return;
    }
    double dd = pi2_f16_to_f32(h);
    float inv = 1.0f / (float)dd;
    int32_t q[PI2_Q_GROUP];
    int near = 0;
    for (int j = 0; j < PI2_Q_GROUP; j++) {
        int32_t t = mul_round(x[j], inv, &near) + 8;
        t = t < 0 ? 0 : t;
        q[j] = t > 15 ? 15 : t;
    }
    for (int j = 0; near && j < PI2_Q_GROUP; j++) { /* a near tie: exact path */
        int32_t t = div_round(x[j], dd) + 8;
        t = t < 0 ? 0 : t;
        q[j] = t > 15 ? 15 : t;
    }
    for (int j = 0; j < PI2_Q4_GROUP_BYTES; j++)
        qs[j] = (uint8_t)(q[j] | q[j + 16] << 4);
}

static void quantize_q8_group(const float *x, uint16_t *scale, uint8_t *qs)
{
    double d = fabs((double)group_max(x)) / 127.0;
    uint16_t h = f16_toward_zero(d);
    *scale = h;
    if (h == 0) {
        memset(qs, 0, PI2_Q8_GROUP_BYTES);
        return;
    }
    double dd = pi2_f16_to_f32(h);
    float inv = 1.0f / (float)dd;
    int32_t q[PI2_Q_GROUP];
    int near = 0;
    for (int j = 0; j < PI2_Q_GROUP; j++) {
        int32_t t = mul_round(x[j], inv, &near);
        t = t < -127 ? -127 : t;
        q[j] = t > 127 ? 127 : t;
    }
    for (int j = 0; near && j < PI2_Q_GROUP; j++) { /* a near tie: exact path */
        int32_t t = div_round(x[j], dd);
        t = t < -127 ? -127 : t;
        q[j] = t > 127 ? 127 : t;
    }
    for (int j = 0; j < PI2_Q_GROUP; j++)
        qs[j] = (uint8_t)(int8_t)q[j];
}

int pi2_q_quantize_row(pi2_qtype t, const float *x, int64_t cols, uint16_t *scales, uint8_t *payload)
{
    if (!qtype_valid(t))
        return PI2_EINVAL;
    /* Validate everything first so nothing is written on error. */
    double limit = t == PI2_QT_Q4 ? 8.0 * SCALE_LIMIT : t == PI2_QT_Q8 ? 127.0 * SCALE_LIMIT : INFINITY;
    int bad = 0; /* branch-free: NaN fails the comparison too */
    for (int64_t j = 0; j < cols; j++)
        bad |= !(fabs((double)x[j]) < limit);
    if (bad)
        return PI2_ERANGE;
    int64_t ng = cols / PI2_Q_GROUP;
    switch (t) {
    case PI2_QT_F32:
        memcpy(payload, x, (size_t)cols * sizeof(float));
        break;
    case PI2_QT_Q8:
        for (int64_t g = 0; g < ng; g++)
            quantize_q8_group(x + g * PI2_Q_GROUP, &scales[g], payload + g * PI2_Q8_GROUP_BYTES);
        break;
    case PI2_QT_Q4:
        for (int64_t g = 0; g < ng; g++)
            quantize_q4_group(x + g * PI2_Q_GROUP, &scales[g], payload + g * PI2_Q4_GROUP_BYTES);
        break;
    }
    return 0;
}

void pi2_q_dequantize_row(pi2_qtype t, const uint16_t *scales, const uint8_t *payload, int64_t cols,
                          float *out)
{
    int64_t ng = cols / PI2_Q_GROUP;
    switch (t) {
    case PI2_QT_F32:
        memcpy(out, payload, (size_t)cols * sizeof(float));
        break;
    case PI2_QT_Q8:
        for (int64_t g = 0; g < ng; g++) {
            float d = pi2_f16_to_f32(scales[g]);
            const uint8_t *p = payload + g * PI2_Q8_GROUP_BYTES;
            float *o = out + g * PI2_Q_GROUP;
            for (int j = 0; j < PI2_Q_GROUP; j++)
                o[j] = (float)(int8_t)p[j] * d;
        }
        break;
    case PI2_QT_Q4:
        for (int64_t g = 0; g < ng; g++) {
            float d = pi2_f16_to_f32(scales[g]);
            const uint8_t *p = payload + g * PI2_Q4_GROUP_BYTES;
            float *o = out + g * PI2_Q_GROUP;
            for (int j = 0; j < PI2_Q4_GROUP_BYTES; j++) {
                o[j] = (float)((p[j] & 0x0f) - 8) * d;
                o[j + 16] = (float)((p[j] >> 4) - 8) * d;
            }
        }
        break;
    }
}

void pi2_q_axpy_row(pi2_qtype t, float a, const uint16_t *scales, const uint8_t *payload, int64_t cols,
                    float *out)
{
    int64_t ng = cols / PI2_Q_GROUP;
    switch (t) {
    case PI2_QT_F32:
        for (int64_t j = 0; j < cols; j++) {
            float w;
            memcpy(&w, payload + j * (int64_t)sizeof(float), sizeof w);
            out[j] += a * w;
        }
        break;
    case PI2_QT_Q8:
        for (int64_t g = 0; g < ng; g++) {
            float d = pi2_f16_to_f32(scales[g]);
            const uint8_t *p = payload + g * PI2_Q8_GROUP_BYTES;
            float *o = out + g * PI2_Q_GROUP;
            for (int j = 0; j < PI2_Q_GROUP; j++)
                o[j] += a * ((float)(int8_t)p[j] * d);
        }
        break;
    case PI2_QT_Q4:
        for (int64_t g = 0; g < ng; g++) {
            float d = pi2_f16_to_f32(scales[g]);
            const uint8_t *p = payload + g * PI2_Q4_GROUP_BYTES;
            float *o = out + g * PI2_Q_GROUP;
            for (int j = 0; j < PI2_Q4_GROUP_BYTES; j++) {
                o[j] += a * ((float)((p[j] & 0x0f) - 8) * d);
                o[j + 16] += a * ((float)((p[j] >> 4) - 8) * d);
            }
        }
        break;
    }
}

/* ---- activations ---- */

void pi2_q8act_quantize(const float *x, int64_t n, float *scales, int8_t *q)
{
    for (int64_t b = 0; b < n / PI2_Q_GROUP; b++) {
        const float *xb = x + b * PI2_Q_GROUP;
        int8_t *qb = q + b * PI2_Q_GROUP;
        float amax = 0.0f;
        bool bad = false;
        for (int j = 0; j < PI2_Q_GROUP; j++) {
            float v = fabsf(xb[j]);
            if (!(v <= FLT_MAX))
                bad = true; /* NaN or inf */
            else if (v > amax)
                amax = v;
        }
        if (bad || amax < ACT_TINY) {
            scales[b] = bad ? NAN : 0.0f;
            memset(qb, 0, PI2_Q_GROUP);
            continue;
        }
        /* Multiply by 127/amax and round half to even, as a SIMD twin does
         * with one vmulps and a cvtps2dq. amax >= 2^-100 keeps both the
         * scale and its inverse normal and finite. */
        float id = 127.0f / amax;
        scales[b] = amax / 127.0f;
        for (int j = 0; j < PI2_Q_GROUP; j++) {
            float r = rintf(xb[j] * id);
            qb[j] = (int8_t)(r < -127.0f ? -127.0f : r > 127.0f ? 127.0f : r);
        }
    }
}

/* ---- dot products: scalar reference ---- */

float pi2_q_dot_q8act_scalar(pi2_qtype wt, const uint16_t *wscales, const uint8_t *wpayload,
                             const float *ascales, const int8_t *aq, int64_t n)
{
    assert(n % PI2_Q_GROUP == 0);
    int64_t nb = n / PI2_Q_GROUP;
    double acc = 0.0; /* the reference sums in double: closer to exact than any fast kernel */
    for (int64_t b = 0; b < nb; b++) {
        const int8_t *a = aq + b * PI2_Q_GROUP;
        if (wt == PI2_QT_F32) {
            const uint8_t *p = wpayload + b * PI2_Q_GROUP * (int64_t)sizeof(float);
            float s = 0.0f;
            for (int j = 0; j < PI2_Q_GROUP; j++) {
                float w;
                memcpy(&w, p + j * sizeof(float), sizeof w);
                s += w * (float)a[j];
            }
            acc += (double)(s * ascales[b]);
            continue;
        }
        int32_t s = 0;
        if (wt == PI2_QT_Q4) {
            const uint8_t *p = wpayload + b * PI2_Q4_GROUP_BYTES;
            for (int j = 0; j < PI2_Q4_GROUP_BYTES; j++)
                s += ((p[j] & 0x0f) - 8) * a[j] + ((p[j] >> 4) - 8) * a[j + 16];
        } else {
            const uint8_t *p = wpayload + b * PI2_Q8_GROUP_BYTES;
            for (int j = 0; j < PI2_Q_GROUP; j++)
                s += (int8_t)p[j] * a[j];
        }
        acc += (double)s * (double)(pi2_f16_to_f32(wscales[b]) * ascales[b]);
    }
    return (float)acc;
}

/* ---- dot products: x86 SIMD ----
 *
 * Every kernel computes each block's int32 sum exactly, as the scalar loop
 * does, then accumulates its int32 lanes times the block's combined scale
 * (wscale * ascale, rounded once to float as in the scalar code) with FMA.
 * Consecutive blocks go to four independent accumulators: that hides FMA
 * latency and keeps each float lane's running sum short (n/128 terms), so
 * the rounding error stays near the scalar twin's double accumulation.
 *
 * AVX2 has no product of two signed bytes, so it uses the usual sign trick:
 * |w| (as unsigned) times a with w's sign applied. maddubs cannot saturate:
 * |w| <= 128 and |a| <= 127 give pair sums <= 32512. */
#ifdef PI2_Q_X86

#define PI2_T_AVX2 __attribute__((target("avx2,fma,f16c")))
/* avx512vl too: with BW enabled the compiler may pick EVEX forms of 256-bit
 * moves (vmovdqu16 ymm), which need VL. Every VNNI CPU has VL. */
#define PI2_T_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

PI2_T_AVX2 static inline float hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Combined scale of block b, rounded as the scalar reference rounds it. */
PI2_T_AVX2 static inline float block_scale(const uint16_t *ws, const float *as, int64_t b)
{
    return _cvtsh_ss(ws[b]) * as[b];
}

/* 16 Q4 bytes -> the group's 32 nibbles in element order, unsigned 0..15. */
PI2_T_AVX2 static inline __m256i q4_unpack(const uint8_t *p)
{
    __m128i raw = _mm_loadu_si128((const __m128i *)(const void *)p);
    __m256i w = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
    return _mm256_and_si256(w, _mm256_set1_epi8(0x0f));
}

PI2_T_AVX2 static inline __m256i load256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* acc + (int32 lanes summing to dot(w, a)) * scale, w and a signed bytes. */
PI2_T_AVX2 static inline __m256 dot_i8_avx2(__m256i w, __m256i a, float scale, __m256 acc)
{
    __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
    __m256i s = _mm256_madd_epi16(p, _mm256_set1_epi16(1));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(scale), acc);
}

PI2_T_AVX2 static inline __m256 q4_block_avx2(const uint16_t *ws, const uint8_t *wp, const float *as,
                                              const int8_t *aq, int64_t b, __m256 acc)
{
    __m256i w = _mm256_sub_epi8(q4_unpack(wp + b * PI2_Q4_GROUP_BYTES), _mm256_set1_epi8(8));
    return dot_i8_avx2(w, load256(aq + b * PI2_Q_GROUP), block_scale(ws, as, b), acc);
}

PI2_T_AVX2 static inline __m256 q8_block_avx2(const uint16_t *ws, const uint8_t *wp, const float *as,
                                              const int8_t *aq, int64_t b, __m256 acc)
{
    return dot_i8_avx2(load256(wp + b * PI2_Q8_GROUP_BYTES), load256(aq + b * PI2_Q_GROUP),
                       block_scale(ws, as, b), acc);
}

#define PI2_DOT_AVX2(name, block)                                                                              \
    PI2_T_AVX2 static float name(const uint16_t *ws, const uint8_t *wp, const float *as, const int8_t *aq,    \
                                 int64_t nb)                                                                   \
    {                                                                                                          \
        __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;                              \
        int64_t b = 0;                                                                                         \
        for (; b + 4 <= nb; b += 4) {                                                                          \
            acc0 = block(ws, wp, as, aq, b, acc0);                                                             \
            acc1 = block(ws, wp, as, aq, b + 1, acc1);                                                         \
            acc2 = block(ws, wp, as, aq, b + 2, acc2);                                                         \
            acc3 = block(ws, wp, as, aq, b + 3, acc3);                                                         \
        }                                                                                                      \
        for (; b < nb; b++)                                                                                    \
            acc0 = block(ws, wp, as, aq, b, acc0);                                                             \
        return hsum256(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));                  \
    }

PI2_DOT_AVX2(dot_q4_avx2, q4_block_avx2)
PI2_DOT_AVX2(dot_q8_avx2, q8_block_avx2)

/* AVX-512 VNNI: two blocks per 512-bit register (int32 lanes 0-7 belong to
 * block b, lanes 8-15 to block b+1); vpdpbusd multiplies u8 x s8 and sums
 * groups of four into int32 without saturation. A lone last block runs with
 * the upper half zeroed (masked loads do not touch the bytes past the row). */
PI2_T_AVX512 static inline __m512 pair_scale(const uint16_t *ws, const float *as, int64_t b)
{
    return _mm512_mask_blend_ps((__mmask16)0xff00, _mm512_set1_ps(block_scale(ws, as, b)),
                                _mm512_set1_ps(block_scale(ws, as, b + 1)));
}

/* Q4 with unsigned nibbles u: sum (u - 8) * a = sum u * a - 8 * sum a. */
PI2_T_AVX512 static inline __m512i q4_dot_vnni(__m512i u, __m512i a)
{
    const __m512i zero = _mm512_setzero_si512();
    __m512i s = _mm512_dpbusd_epi32(zero, u, a);
    __m512i sa = _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(1), a);
    return _mm512_sub_epi32(s, _mm512_slli_epi32(sa, 3));
}

/* Q8: |w| (unsigned; |-128| = 128 fits) times a, negated where w < 0. */
PI2_T_AVX512 static inline __m512i q8_dot_vnni(__m512i w, __m512i a)
{
    const __m512i zero = _mm512_setzero_si512();
    __m512i sa = _mm512_mask_sub_epi8(a, _mm512_movepi8_mask(w), zero, a);
    return _mm512_dpbusd_epi32(zero, _mm512_abs_epi8(w), sa);
}

PI2_T_AVX512 static inline __m512 q4_pair_avx512(const uint16_t *ws, const uint8_t *wp, const float *as,
                                                 const int8_t *aq, int64_t b, __m512 acc)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256i raw = _mm256_loadu_si256((const __m256i *)(const void *)(wp + b * PI2_Q4_GROUP_BYTES));
    __m256i lo = _mm256_and_si256(raw, m4);                            /* [lo_b | lo_b+1] */
    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);      /* [hi_b | hi_b+1] */
    __m512i u = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); /* 128-bit lanes lo_b lo_b+1 hi_b hi_b+1 */
    u = _mm512_shuffle_i64x2(u, u, _MM_SHUFFLE(3, 1, 2, 0));          /* lo_b hi_b lo_b+1 hi_b+1 */
    __m512i a = _mm512_loadu_si512((const void *)(aq + b * PI2_Q_GROUP));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(q4_dot_vnni(u, a)), pair_scale(ws, as, b), acc);
}

PI2_T_AVX512 static inline __m512 q4_single_avx512(const uint16_t *ws, const uint8_t *wp, const float *as,
                                                   const int8_t *aq, int64_t b, __m512 acc)
{
    __m512i u = _mm512_inserti64x4(_mm512_setzero_si512(), q4_unpack(wp + b * PI2_Q4_GROUP_BYTES), 0);
    __m512i a = _mm512_maskz_loadu_epi8((__mmask64)0xffffffffu, (const void *)(aq + b * PI2_Q_GROUP));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(q4_dot_vnni(u, a)), _mm512_set1_ps(block_scale(ws, as, b)), acc);
}

PI2_T_AVX512 static inline __m512 q8_pair_avx512(const uint16_t *ws, const uint8_t *wp, const float *as,
                                                 const int8_t *aq, int64_t b, __m512 acc)
{
    __m512i w = _mm512_loadu_si512((const void *)(wp + b * PI2_Q8_GROUP_BYTES));
    __m512i a = _mm512_loadu_si512((const void *)(aq + b * PI2_Q_GROUP));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(q8_dot_vnni(w, a)), pair_scale(ws, as, b), acc);
}

PI2_T_AVX512 static inline __m512 q8_single_avx512(const uint16_t *ws, const uint8_t *wp, const float *as,
                                                   const int8_t *aq, int64_t b, __m512 acc)
{
    const __mmask64 half = (__mmask64)0xffffffffu;
    __m512i w = _mm512_maskz_loadu_epi8(half, (const void *)(wp + b * PI2_Q8_GROUP_BYTES));
    __m512i a = _mm512_maskz_loadu_epi8(half, (const void *)(aq + b * PI2_Q_GROUP));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(q8_dot_vnni(w, a)), _mm512_set1_ps(block_scale(ws, as, b)), acc);
}

#define PI2_DOT_AVX512(name, pair, single)                                                                     \
    PI2_T_AVX512 static float name(const uint16_t *ws, const uint8_t *wp, const float *as, const int8_t *aq,  \
                                   int64_t nb)                                                                 \
    {                                                                                                          \
        __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0;                                                        \
        int64_t b = 0;                                                                                         \
        for (; b + 4 <= nb; b += 4) {                                                                          \
            acc0 = pair(ws, wp, as, aq, b, acc0);                                                              \
            acc1 = pair(ws, wp, as, aq, b + 2, acc1);                                                          \
        }                                                                                                      \
        if (b + 2 <= nb) {                                                                                     \
            acc0 = pair(ws, wp, as, aq, b, acc0);                                                              \
            b += 2;                                                                                            \
        }                                                                                                      \
        if (b < nb)                                                                                            \
            acc1 = single(ws, wp, as, aq, b, acc1);                                                            \
        return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));                                                \
    }

PI2_DOT_AVX512(dot_q4_avx512, q4_pair_avx512, q4_single_avx512)
PI2_DOT_AVX512(dot_q8_avx512, q8_pair_avx512, q8_single_avx512)

#endif /* PI2_Q_X86 */

/* ---- dispatch ---- */

const char *pi2_q_isa_name(pi2_isa isa)
{
    switch (isa) {
    case PI2_ISA_SCALAR:
        return "scalar";
    case PI2_ISA_AVX2:
        return "avx2";
    case PI2_ISA_AVX512:
        return "avx512vnni";
    }
    return "?";
}

bool pi2_q_isa_supported(pi2_isa isa)
{
    if (isa == PI2_ISA_SCALAR)
        return true;
#ifdef PI2_Q_X86
    /* libgcc's cpu model also checks XGETBV, so the OS saves the registers. */
    __builtin_cpu_init();
    unsigned eax, ebx, ecx = 0, edx;
    bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C); /* not a cpu_supports name in clang */
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    if (isa == PI2_ISA_AVX2)
        return avx2;
    if (isa == PI2_ISA_AVX512)
        return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#endif
    return false;
}

pi2_isa pi2_q_isa_best(void)
{
    if (pi2_q_isa_supported(PI2_ISA_AVX512))
        return PI2_ISA_AVX512;
    if (pi2_q_isa_supported(PI2_ISA_AVX2))
        return PI2_ISA_AVX2;
    return PI2_ISA_SCALAR;
}

/* The one piece of process state here: which kernel pi2_q_dot_q8act runs.
 * -1 until first use; racing first uses store the same value. */
static _Atomic int g_isa = -1;

pi2_isa pi2_q_get_isa(void)
{
    int isa = atomic_load_explicit(&g_isa, memory_order_relaxed);
    if (isa < 0) {
        isa = (int)pi2_q_isa_best();
        atomic_store_explicit(&g_isa, isa, memory_order_relaxed);
    }
    return (pi2_isa)isa;
}

int pi2_q_set_isa(pi2_isa isa)
{
    if (isa != PI2_ISA_SCALAR && isa != PI2_ISA_AVX2 && isa != PI2_ISA_AVX512)
        return PI2_EINVAL;
    if (!pi2_q_isa_supported(isa))
        return PI2_EUNSUPPORTED;
    atomic_store_explicit(&g_isa, (int)isa, memory_order_relaxed);
    return 0;
}

float pi2_q_dot_q8act(pi2_qtype wt, const uint16_t *wscales, const uint8_t *wpayload, const float *ascales,
                      const int8_t *aq, int64_t n)
{
    assert(n % PI2_Q_GROUP == 0);
#ifdef PI2_Q_X86
    int64_t nb = n / PI2_Q_GROUP;
    switch (pi2_q_get_isa()) {
    case PI2_ISA_AVX512:
        if (wt == PI2_QT_Q4)
            return dot_q4_avx512(wscales, wpayload, ascales, aq, nb);
        if (wt == PI2_QT_Q8)
            return dot_q8_avx512(wscales, wpayload, ascales, aq, nb);
        break;
    case PI2_ISA_AVX2:
        if (wt == PI2_QT_Q4)
            return dot_q4_avx2(wscales, wpayload, ascales, aq, nb);
        if (wt == PI2_QT_Q8)
            return dot_q8_avx2(wscales, wpayload, ascales, aq, nb);
        break;
    case PI2_ISA_SCALAR:
        break;
    }
#endif
    return pi2_q_dot_q8act_scalar(wt, wscales, wpayload, ascales, aq, n);
}
