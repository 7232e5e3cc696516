/* Vector ops: dequantized rows, the f32 GEMV pair (pi2_k_sgemv,
 * pi2_k_sgemv_t), softmax, fp16 rows; each with its scalar twin.
 * Activation quantization is in act.c. */
#include "runtime/kernels/internal.h"

static void dequant_scalar(pi2_qtype wt, int64_t n, int nrows, const uint8_t *const *wp, const uint16_t *const *ws,
                           float *dst)
{
    for (int r = 0; r < nrows; r++)
        pi2_q_dequantize_row(wt, ws[r], wp[r], n, dst + (int64_t)r * n);
}

/* sgemv's order: the columns of whole 16s in 16 stripes (column j in
 * stripe j % 16, by fma in column order) summed per 4 stripes as (x_4L +
 * x_4L+2) + (x_4L+1 + x_4L+3), then (q_0 + q_1) + (q_2 + q_3) (the tree
 * sgemv16_avx512's folds and transpose take); the last n % 16 columns an
 * fma chain of their own from +0, added last. */
static inline float sgemv_tree(const float x[16])
{
    float q[4];
    for (int L = 0; L < 4; L++)
        q[L] = (x[4 * L] + x[4 * L + 2]) + (x[4 * L + 1] + x[4 * L + 3]);
    return (q[0] + q[1]) + (q[2] + q[3]);
}

static void sgemv_scalar(const float *W, int64_t ldw, int64_t n, int nrows, const float *x, float *out)
{
    for (int r = 0; r < nrows; r++) {
        const float *w = W + (int64_t)r * ldw;
        float s[16] = {0}, tail = 0.0f;
        int64_t nfull = n & ~(int64_t)15;
        for (int64_t j = 0; j < nfull; j++)
            s[j % 16] = fmaf(w[j], x[j], s[j % 16]);
        for (int64_t j = nfull; j < n; j++)
            tail = fmaf(w[j], x[j], tail);
        out[r] = sgemv_tree(s) + tail;
    }
}

/* exp(x) for softmax (x <= 0 after the max is subtracted): x = k ln2 + r,
 * |r| <= ln2 / 2, exp = 2^k * p(r), p the degree-6 Taylor polynomial
 * (relative error < 2e-7); x below -87.3 is taken as -87.3 (1.2e-38,
 * nothing next to the max's 1). Every path (AVX2, AVX-512, NEON in
 * vec_neon.c) computes these operations. */
static inline float exp_fixed(float x)
{
    x = fmaxf(x, -87.3f);
    float k = rintf(x * 1.44269504089f);
    float r = fmaf(-k, 0.693145751953125f, x); /* ln2 high part (exact k * hi) */
    r = fmaf(-k, 1.42860682030941723e-06f, r);  /* ln2 low part */
    float p = 1.0f / 720.0f;
    p = fmaf(p, r, 1.0f / 120.0f);
    p = fmaf(p, r, 1.0f / 24.0f);
    p = fmaf(p, r, 1.0f / 6.0f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    return p * ldexpf(1.0f, (int)k);
}

static void softmax_scalar(float *x, int64_t n)
{
    float mx = -INFINITY, s[16] = {0};
    for (int64_t i = 0; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    for (int64_t i = 0; i < n; i++) {
        x[i] = exp_fixed(x[i] - mx);
        s[i % 16] += x[i];
    }
    float inv = 1.0f / k_tree16(s);
    for (int64_t i = 0; i < n; i++)
        x[i] *= inv;
}

static void sgemv_t_scalar(const float *W, int64_t ldw, int64_t n, int nrows, const float *c, float *out, bool acc)
{
    for (int64_t j = 0; j < n && !acc; j++)
        out[j] = 0.0f;
    for (int r = 0; r < nrows; r++) {
        const float *w = W + (int64_t)r * ldw;
        for (int64_t j = 0; j < n; j++)
            out[j] = fmaf(c[r], w[j], out[j]);
    }
}

#ifdef PI2_K_X86

/* ---- dequant (exact: (q - 8) * d and q * d are exact floats) ---- */

PI2_T_AVX2 static void dequant_avx2(pi2_qtype wt, int64_t n, int nrows, const uint8_t *const *wp,
                                    const uint16_t *const *ws, float *dst)
{
    const __m256i m4 = _mm256_set1_epi32(0x0f), eight = _mm256_set1_epi32(8);
    int64_t nb = n / QG;
    for (int r = 0; r < nrows; r++) {
        for (int64_t b = 0; b < nb; b++) {
            float *o = dst + (int64_t)r * n + b * QG;
            __m256 d = _mm256_set1_ps(_cvtsh_ss(ws[r][b]));
            if (wt == PI2_QT_Q4) {
                const uint8_t *p = wp[r] + b * PI2_Q4_GROUP_BYTES;
                __m256i x0 = ld_u8x8(p), x1 = ld_u8x8(p + 8);
                __m256i q0 = _mm256_sub_epi32(_mm256_and_si256(x0, m4), eight);
                __m256i q1 = _mm256_sub_epi32(_mm256_and_si256(x1, m4), eight);
                __m256i q2 = _mm256_sub_epi32(_mm256_srli_epi32(x0, 4), eight);
                __m256i q3 = _mm256_sub_epi32(_mm256_srli_epi32(x1, 4), eight);
                _mm256_storeu_ps(o, _mm256_mul_ps(_mm256_cvtepi32_ps(q0), d));
                _mm256_storeu_ps(o + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(q1), d));
                _mm256_storeu_ps(o + 16, _mm256_mul_ps(_mm256_cvtepi32_ps(q2), d));
                _mm256_storeu_ps(o + 24, _mm256_mul_ps(_mm256_cvtepi32_ps(q3), d));
            } else {
                const uint8_t *p = wp[r] + b * PI2_Q8_GROUP_BYTES;
                for (int k = 0; k < 4; k++)
                    _mm256_storeu_ps(o + 8 * k, _mm256_mul_ps(_mm256_cvtepi32_ps(ld_i8x8(p + 8 * k)), d));
            }
        }
    }
}

PI2_T_AVX512 static void dequant_avx512(pi2_qtype wt, int64_t n, int nrows, const uint8_t *const *wp,
                                        const uint16_t *const *ws, float *dst)
{
    const __m512i m4 = _mm512_set1_epi32(0x0f), eight = _mm512_set1_epi32(8);
    int64_t nb = n / QG;
    for (int r = 0; r < nrows; r++) {
        for (int64_t b = 0; b < nb; b++) {
            float *o = dst + (int64_t)r * n + b * QG;
            __m512 d = _mm512_set1_ps(_cvtsh_ss(ws[r][b]));
            if (wt == PI2_QT_Q4) {
                const uint8_t *p = wp[r] + b * PI2_Q4_GROUP_BYTES;
                __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
                __m512i lo = _mm512_sub_epi32(_mm512_and_si512(x, m4), eight);
                __m512i hi = _mm512_sub_epi32(_mm512_srli_epi32(x, 4), eight);
                _mm512_storeu_ps(o, _mm512_mul_ps(_mm512_cvtepi32_ps(lo), d));
                _mm512_storeu_ps(o + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(hi), d));
            } else {
                const uint8_t *p = wp[r] + b * PI2_Q8_GROUP_BYTES;
                __m512i x0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
                __m512i x1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(p + 16)));
                _mm512_storeu_ps(o, _mm512_mul_ps(_mm512_cvtepi32_ps(x0), d));
                _mm512_storeu_ps(o + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(x1), d));
            }
        }
    }
}

/* ---- sgemv: the scalar twin's 16 stripes (column j in stripe j % 16,
 * by FMA in column order) and its tree (sgemv_tree) ---- */

/* A row's whole 16s: stripes 0-7 in a, 8-15 in b. */
#define K_SGEMV_ROW2(w, a, b)                                                                                \
    for (int64_t j_ = 0; j_ + 16 <= n; j_ += 16) {                                                           \
        a = _mm256_fmadd_ps(_mm256_loadu_ps((w) + j_), _mm256_loadu_ps(x + j_), a);                          \
        b = _mm256_fmadd_ps(_mm256_loadu_ps((w) + j_ + 8), _mm256_loadu_ps(x + j_ + 8), b);                  \
    }

/* The fma chain of columns [j, n). */
static inline float sgemv_tail(const float *w, const float *x, int64_t j, int64_t n)
{
    float t = 0.0f;
    for (; j < n; j++)
        t = fmaf(w[j], x[j], t);
    return t;
}

PI2_T_AVX2 static inline float sgemv_tree2(__m256 a, __m256 b)
{
    return (k_sum4(_mm256_castps256_ps128(a)) + k_sum4(_mm256_extractf128_ps(a, 1))) +
           (k_sum4(_mm256_castps256_ps128(b)) + k_sum4(_mm256_extractf128_ps(b, 1)));
}

PI2_T_AVX2 static void sgemv_avx2(const float *W, int64_t ldw, int64_t n, int nrows, const float *x, float *out)
{
    int r = 0;
    for (; r + 2 <= nrows; r += 2) {
        const float *w0 = W + (int64_t)r * ldw, *w1 = w0 + ldw;
        __m256 a0 = _mm256_setzero_ps(), b0 = a0, a1 = a0, b1 = a0;
        K_SGEMV_ROW2(w0, a0, b0);
        K_SGEMV_ROW2(w1, a1, b1);
        out[r] = sgemv_tree2(a0, b0) + sgemv_tail(w0, x, n & ~(int64_t)15, n);
        out[r + 1] = sgemv_tree2(a1, b1) + sgemv_tail(w1, x, n & ~(int64_t)15, n);
    }
    for (; r < nrows; r++) {
        const float *w = W + (int64_t)r * ldw;
        __m256 a = _mm256_setzero_ps(), b = a;
        K_SGEMV_ROW2(w, a, b);
        out[r] = sgemv_tree2(a, b) + sgemv_tail(w, x, n & ~(int64_t)15, n);
    }
}

/* Lane L of the result, dword i = the sum of v_i's 4 floats in lane L. */
PI2_T_AVX512 static inline __m512 fold4_ps(__m512 v0, __m512 v1, __m512 v2, __m512 v3)
{
    __m512 s01 = _mm512_add_ps(_mm512_unpacklo_ps(v0, v1), _mm512_unpackhi_ps(v0, v1));
    __m512 s23 = _mm512_add_ps(_mm512_unpacklo_ps(v2, v3), _mm512_unpackhi_ps(v2, v3));
    __m512d a = _mm512_castps_pd(s01), b = _mm512_castps_pd(s23);
    return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
}

/* 16 short rows at once (attention's keys: rows of a head's size): one
 * accumulator per row (its 16 stripes), then 4 folds and a 4 x 4
 * transpose of 128-bit lanes sum all 16 in sgemv_tree's order at ~3
 * instructions a row, where a horizontal sum per row takes ~8. */
PI2_T_AVX512 static void sgemv16_avx512(const float *W, int64_t ldw, int64_t n, const float *x, float *out)
{
    __m512 a[16];
    for (int i = 0; i < 16; i++)
        a[i] = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        __m512 xv = _mm512_loadu_ps(x + j);
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++)
            a[i] = _mm512_fmadd_ps(_mm512_loadu_ps(W + i * ldw + j), xv, a[i]);
    }
    /* the last n % 16 columns a column at a time, gathered across the 16
     * rows (one gather per column rather than a masked load per row) */
    __m512 tail = _mm512_setzero_ps();
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32((int)ldw));
    for (; j < n; j++)
        tail = _mm512_fmadd_ps(_mm512_i32gather_ps(idx, W + j, 4), _mm512_set1_ps(x[j]), tail);
    __m512 f0 = fold4_ps(a[0], a[1], a[2], a[3]), f1 = fold4_ps(a[4], a[5], a[6], a[7]);
    __m512 f2 = fold4_ps(a[8], a[9], a[10], a[11]), f3 = fold4_ps(a[12], a[13], a[14], a[15]);
    /* f_q lane L dword i: row 4q + i over lane L; transposed, lane q of g[L] */
    __m512 g[4];
    lanes_t4(f0, f1, f2, f3, g);
    _mm512_storeu_ps(out, _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(g[0], g[1]), _mm512_add_ps(g[2], g[3])), tail));
}

/* sgemv_tree of one row's 16 stripes. */
PI2_T_AVX512 static inline float sgemv_tree16(__m512 v)
{
    __m512 t = _mm512_add_ps(v, _mm512_permute_ps(v, _MM_SHUFFLE(1, 0, 3, 2)));
    __m512 u = _mm512_add_ps(t, _mm512_permute_ps(t, _MM_SHUFFLE(2, 3, 0, 1))); /* lane L: q_L */
    __m512 w = _mm512_add_ps(u, _mm512_shuffle_f32x4(u, u, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm512_cvtss_f32(w) + _mm_cvtss_f32(_mm512_extractf32x4_ps(w, 2));
}

/* The other rows 4 (then 1) at a time, a stripe accumulator each. */
PI2_T_AVX512 static void sgemv_avx512(const float *W, int64_t ldw, int64_t n, int nrows, const float *x, float *out)
{
    int64_t nfull = n & ~(int64_t)15;
    int r = 0;
    if (n <= 256 && ldw <= INT32_MAX / 16)
        for (; r + 16 <= nrows; r += 16)
            sgemv16_avx512(W + (int64_t)r * ldw, ldw, n, x, out + r);
    for (; r + 4 <= nrows; r += 4) {
        const float *w0 = W + (int64_t)r * ldw, *w1 = w0 + ldw, *w2 = w1 + ldw, *w3 = w2 + ldw;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t j = 0; j < nfull; j += 16) {
            __m512 x0 = _mm512_loadu_ps(x + j);
            a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w0 + j), x0, a0);
            a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w1 + j), x0, a1);
            a2 = _mm512_fmadd_ps(_mm512_loadu_ps(w2 + j), x0, a2);
            a3 = _mm512_fmadd_ps(_mm512_loadu_ps(w3 + j), x0, a3);
        }
        out[r] = sgemv_tree16(a0) + sgemv_tail(w0, x, nfull, n);
        out[r + 1] = sgemv_tree16(a1) + sgemv_tail(w1, x, nfull, n);
        out[r + 2] = sgemv_tree16(a2) + sgemv_tail(w2, x, nfull, n);
        out[r + 3] = sgemv_tree16(a3) + sgemv_tail(w3, x, nfull, n);
    }
    for (; r < nrows; r++) {
        const float *w = W + (int64_t)r * ldw;
        __m512 a0 = _mm512_setzero_ps();
        for (int64_t j = 0; j < nfull; j += 16)
            a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + j), _mm512_loadu_ps(x + j), a0);
        out[r] = sgemv_tree16(a0) + sgemv_tail(w, x, nfull, n);
    }
}

/* ---- softmax: exp_fixed's operations on 16 lanes; the sum in 16 stripes
 * (element i in stripe i % 16) and k_tree16's order, as the twin ---- */

PI2_T_AVX512 static inline __m512 exp_avx512(__m512 x)
{
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
    __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504089f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693145751953125f), x); /* ln2 high part (exact k * hi) */
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(1.42860682030941723e-06f), r);  /* ln2 low part */
    __m512 p = _mm512_set1_ps(1.0f / 720.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, k);
}

/* exp_fixed on 8 lanes: 2^k built from its exponent bits (k >= -126 after
 * the clamp: a normal float, so p * 2^k rounds once, as scalef does). */
PI2_T_AVX2 static inline __m256 exp_avx2(__m256 x)
{
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504089f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(1.42860682030941723e-06f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* The twin's operations: elements i of whole 8s in stripe i % 16 (a:
 * 0-7, b: 8-15), the last n % 8 by masked loads (lanes past n add +0). */
PI2_T_AVX2 static void softmax_avx2(float *x, int64_t n)
{
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    __m256 mv = _mm256_set1_ps(mx), a = _mm256_setzero_ps(), b = a;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv));
        _mm256_storeu_ps(x + i, v);
        if (i % 16 == 0)
            a = _mm256_add_ps(a, v);
        else
            b = _mm256_add_ps(b, v);
    }
    if (i < n) {
        __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - i)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        __m256 v = _mm256_and_ps(exp_avx2(_mm256_sub_ps(_mm256_maskload_ps(x + i, m), mv)), _mm256_castsi256_ps(m));
        _mm256_maskstore_ps(x + i, m, v);
        if (i % 16 == 0)
            a = _mm256_add_ps(a, v);
        else
            b = _mm256_add_ps(b, v);
    }
    float inv = 1.0f / k_sum8(_mm256_add_ps(a, b));
    for (i = 0; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_set1_ps(inv)));
    for (; i < n; i++)
        x[i] *= inv;
}

PI2_T_AVX512 static void softmax_avx512(float *x, int64_t n)
{
    __m512 mv = _mm512_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        mv = _mm512_max_ps(mv, _mm512_loadu_ps(x + i));
    __mmask16 tail = (__mmask16)((1u << (n - i)) - 1u);
    if (tail)
        mv = _mm512_mask_max_ps(mv, tail, mv, _mm512_maskz_loadu_ps(tail, x + i));
    __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(mv)), sv = _mm512_setzero_ps();
    for (i = 0; i + 16 <= n; i += 16) {
        __m512 v = exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(x + i), mx));
        _mm512_storeu_ps(x + i, v);
        sv = _mm512_add_ps(sv, v);
    }
    if (tail) {
        __m512 v = _mm512_maskz_mov_ps(tail, exp_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, x + i), mx)));
        _mm512_mask_storeu_ps(x + i, tail, v);
        sv = _mm512_add_ps(sv, v);
    }
    __m512 inv = _mm512_set1_ps(1.0f / k_sum16(sv));
    for (i = 0; i + 16 <= n; i += 16)
        _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), inv));
    if (tail)
        _mm512_mask_storeu_ps(x + i, tail, _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, x + i), inv));
}

/* ---- sgemv_t: columns of up to 64 floats, rows in order ---- */

PI2_T_AVX2 static void sgemv_t_avx2(const float *W, int64_t ldw, int64_t n, int nrows, const float *c, float *out,
                                    bool acc)
{
    int64_t j = 0;
    for (; j + 32 <= n; j += 32) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        if (acc) {
            a0 = _mm256_loadu_ps(out + j);
            a1 = _mm256_loadu_ps(out + j + 8);
            a2 = _mm256_loadu_ps(out + j + 16);
            a3 = _mm256_loadu_ps(out + j + 24);
        }
        for (int r = 0; r < nrows; r++) {
            const float *w = W + (int64_t)r * ldw + j;
            __m256 cr = _mm256_set1_ps(c[r]);
            a0 = _mm256_fmadd_ps(cr, _mm256_loadu_ps(w), a0);
            a1 = _mm256_fmadd_ps(cr, _mm256_loadu_ps(w + 8), a1);
            a2 = _mm256_fmadd_ps(cr, _mm256_loadu_ps(w + 16), a2);
            a3 = _mm256_fmadd_ps(cr, _mm256_loadu_ps(w + 24), a3);
        }
        _mm256_storeu_ps(out + j, a0);
        _mm256_storeu_ps(out + j + 8, a1);
        _mm256_storeu_ps(out + j + 16, a2);
        _mm256_storeu_ps(out + j + 24, a3);
    }
    for (; j + 8 <= n; j += 8) {
        __m256 a = acc ? _mm256_loadu_ps(out + j) : _mm256_setzero_ps();
        for (int r = 0; r < nrows; r++)
            a = _mm256_fmadd_ps(_mm256_set1_ps(c[r]), _mm256_loadu_ps(W + (int64_t)r * ldw + j), a);
        _mm256_storeu_ps(out + j, a);
    }
    for (; j < n; j++) {
        float a = acc ? out[j] : 0.0f;
        for (int r = 0; r < nrows; r++)
            a = fmaf(c[r], W[(int64_t)r * ldw + j], a);
        out[j] = a;
    }
}

PI2_T_AVX512 static void sgemv_t_avx512(const float *W, int64_t ldw, int64_t n, int nrows, const float *c, float *out,
                                        bool acc)
{
    int64_t j = 0;
    for (; j + 64 <= n; j += 64) {
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        if (acc) {
            a0 = _mm512_loadu_ps(out + j);
            a1 = _mm512_loadu_ps(out + j + 16);
            a2 = _mm512_loadu_ps(out + j + 32);
            a3 = _mm512_loadu_ps(out + j + 48);
        }
        for (int r = 0; r < nrows; r++) {
            const float *w = W + (int64_t)r * ldw + j;
            __m512 cr = _mm512_set1_ps(c[r]);
            a0 = _mm512_fmadd_ps(cr, _mm512_loadu_ps(w), a0);
            a1 = _mm512_fmadd_ps(cr, _mm512_loadu_ps(w + 16), a1);
            a2 = _mm512_fmadd_ps(cr, _mm512_loadu_ps(w + 32), a2);
            a3 = _mm512_fmadd_ps(cr, _mm512_loadu_ps(w + 48), a3);
        }
        _mm512_storeu_ps(out + j, a0);
        _mm512_storeu_ps(out + j + 16, a1);
        _mm512_storeu_ps(out + j + 32, a2);
        _mm512_storeu_ps(out + j + 48, a3);
    }
    for (; j < n; j += 16) { /* masked: lanes past n are neither read nor written */
        __mmask16 m = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1u);
        __m512 a = acc ? _mm512_maskz_loadu_ps(m, out + j) : _mm512_setzero_ps();
        for (int r = 0; r < nrows; r++)
            a = _mm512_fmadd_ps(_mm512_set1_ps(c[r]), _mm512_maskz_loadu_ps(m, W + (int64_t)r * ldw + j), a);
        _mm512_mask_storeu_ps(out + j, m, a);
    }
}

/* Up to 4 weight vectors c + g * ldc against the same rows: for each row,
 * its 64 columns are loaded once and every vector's FMA chain advances, in
 * row order from zero as sgemv_t_avx512 runs each alone (the same bits);
 * 4 x 4 independent chains also keep the FMA units busy, where one
 * vector's 4 wait on each other's latency. */
PI2_T_AVX512 static void sgemv_t4_avx512(const float *W, int64_t ldw, int64_t n, int nrows, const float *c,
                                         int64_t ldc, int G, float *out, int64_t ldo, bool acc)
{
    int64_t j = 0;
    for (; j + 64 <= n; j += 64) {
        __m512 a[4][4];
        for (int g = 0; g < 4; g++)
            for (int q = 0; q < 4; q++)
                a[g][q] = acc && g < G ? _mm512_loadu_ps(out + g * ldo + j + 16 * q) : _mm512_setzero_ps();
        for (int r = 0; r < nrows; r++) {
            const float *w = W + (int64_t)r * ldw + j;
            __m512 w0 = _mm512_loadu_ps(w), w1 = _mm512_loadu_ps(w + 16);
            __m512 w2 = _mm512_loadu_ps(w + 32), w3 = _mm512_loadu_ps(w + 48);
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                if (g >= G)
                    break;
                __m512 cr = _mm512_set1_ps(c[g * ldc + r]);
                a[g][0] = _mm512_fmadd_ps(cr, w0, a[g][0]);
                a[g][1] = _mm512_fmadd_ps(cr, w1, a[g][1]);
                a[g][2] = _mm512_fmadd_ps(cr, w2, a[g][2]);
                a[g][3] = _mm512_fmadd_ps(cr, w3, a[g][3]);
            }
        }
        for (int g = 0; g < G; g++)
            for (int q = 0; q < 4; q++)
                _mm512_storeu_ps(out + g * ldo + j + 16 * q, a[g][q]);
    }
    for (; j < n; j += 16) { /* masked: lanes past n are neither read nor written */
        __mmask16 m = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1u);
        __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        for (int g = 0; g < G && acc; g++)
            a[g] = _mm512_maskz_loadu_ps(m, out + g * ldo + j);
        for (int r = 0; r < nrows; r++) {
            __m512 w = _mm512_maskz_loadu_ps(m, W + (int64_t)r * ldw + j);
            for (int g = 0; g < G; g++)
                a[g] = _mm512_fmadd_ps(_mm512_set1_ps(c[g * ldc + r]), w, a[g]);
        }
        for (int g = 0; g < G; g++)
            _mm512_mask_storeu_ps(out + g * ldo + j, m, a[g]);
    }
}

#endif /* PI2_K_X86 */

void pi2_k_dequant_rows(pi2_qtype wt, int64_t n, int nrows, const uint8_t *const *wp, const uint16_t *const *ws,
                        float *dst)
{
#ifdef PI2_K_ARM64
    if (pi2_ki_dequant_neon(pi2_k_get_isa(), wt, n, nrows, wp, ws, dst))
        return;
#endif
#ifdef PI2_K_X86
    if (wt == PI2_QT_Q4 || wt == PI2_QT_Q8) {
        switch (pi2_k_get_isa()) {
        case PI2_ISA_AVX512:
            dequant_avx512(wt, n, nrows, wp, ws, dst);
            return;
        case PI2_ISA_AVX2:
            dequant_avx2(wt, n, nrows, wp, ws, dst);
            return;
        default:
            break;
        }
    }
#endif
    dequant_scalar(wt, n, nrows, wp, ws, dst);
}

void pi2_k_sgemv_isa(pi2_isa isa, const float *W, int64_t ldw, int64_t n, int nrows, const float *x, float *out)
{
#ifdef PI2_K_ARM64
    if (pi2_ki_sgemv_neon(isa, false, false, W, ldw, n, nrows, x, out))
        return;
#endif
#ifdef PI2_K_X86
    switch (pi2_ki_isa_pick(isa)) {
    case PI2_ISA_AVX512:
        sgemv_avx512(W, ldw, n, nrows, x, out);
        return;
    case PI2_ISA_AVX2:
        sgemv_avx2(W, ldw, n, nrows, x, out);
        return;
    default:
        break;
    }
#elif !defined(PI2_K_ARM64)
    (void)isa;
#endif
    sgemv_scalar(W, ldw, n, nrows, x, out);
}

void pi2_k_sgemv(const float *W, int64_t ldw, int64_t n, int nrows, const float *x, float *out)
{
    pi2_k_sgemv_isa(pi2_k_get_isa(), W, ldw, n, nrows, x, out);
}

void pi2_k_softmax_isa(pi2_isa isa, float *x, int64_t n)
{
#ifdef PI2_K_ARM64
    if (pi2_ki_softmax_neon(isa, x, n))
        return;
#endif
#ifdef PI2_K_X86
    if (pi2_ki_isa_pick(isa) == PI2_ISA_AVX512) {
        softmax_avx512(x, n);
        return;
    }
    if (pi2_ki_isa_pick(isa) == PI2_ISA_AVX2) {
        softmax_avx2(x, n);
        return;
    }
#elif !defined(PI2_K_ARM64)
    (void)isa;
#endif
    softmax_scalar(x, n);
}

void pi2_k_softmax(float *x, int64_t n) { pi2_k_softmax_isa(pi2_k_get_isa(), x, n); }

/* sgemv_t on isa, into out or (acc) added to it, continuing its chains. */
static void sgemv_t_on(pi2_isa isa, const float *W, int64_t ldw, int64_t n, int nrows, const float *c, float *out,
                       bool acc)
{
#ifdef PI2_K_ARM64
    if (pi2_ki_sgemv_neon(isa, true, acc, W, ldw, n, nrows, c, out))
        return;
#endif
#ifdef PI2_K_X86
    switch (pi2_ki_isa_pick(isa)) {
    case PI2_ISA_AVX512:
        sgemv_t_avx512(W, ldw, n, nrows, c, out, acc);
        return;
    case PI2_ISA_AVX2:
        sgemv_t_avx2(W, ldw, n, nrows, c, out, acc);
        return;
    default:
        break;
    }
#elif !defined(PI2_K_ARM64)
    (void)isa;
#endif
    sgemv_t_scalar(W, ldw, n, nrows, c, out, acc);
}

void pi2_k_sgemv_t_isa(pi2_isa isa, const float *W, int64_t ldw, int64_t n, int nrows, const float *c, float *out)
{
    sgemv_t_on(isa, W, ldw, n, nrows, c, out, false);
}

static void sgemv_t_group_on(pi2_isa isa, const float *W, int64_t ldw, int64_t n, int nrows, const float *c,
                             int64_t ldc, int G, float *out, int64_t ldo, bool acc)
{
#ifdef PI2_K_X86
    if (pi2_ki_isa_pick(isa) == PI2_ISA_AVX512) {
        for (int g0 = 0; g0 < G; g0 += 4)
            sgemv_t4_avx512(W, ldw, n, nrows, c + g0 * ldc, ldc, G - g0 < 4 ? G - g0 : 4, out + g0 * ldo, ldo, acc);
        return;
    }
#endif
    for (int g = 0; g < G; g++)
        sgemv_t_on(isa, W, ldw, n, nrows, c + g * ldc, out + g * ldo, acc);
}

void pi2_k_sgemv_t_group_isa(pi2_isa isa, const float *W, int64_t ldw, int64_t n, int nrows, const float *c,
                             int64_t ldc, int G, float *out, int64_t ldo)
{
    sgemv_t_group_on(isa, W, ldw, n, nrows, c, ldc, G, out, ldo, false);
}

void pi2_k_sgemv_t_group(const float *W, int64_t ldw, int64_t n, int nrows, const float *c, int64_t ldc, int G,
                         float *out, int64_t ldo)
{
    pi2_k_sgemv_t_group_isa(pi2_k_get_isa(), W, ldw, n, nrows, c, ldc, G, out, ldo);
}

void pi2_k_sgemv_t_group_acc_isa(pi2_isa isa, const float *W, int64_t ldw, int64_t n, int nrows, const float *c,
                                 int64_t ldc, int G, float *out, int64_t ldo)
{
    sgemv_t_group_on(isa, W, ldw, n, nrows, c, ldc, G, out, ldo, true);
}

void pi2_k_sgemv_t_group_acc(const float *W, int64_t ldw, int64_t n, int nrows, const float *c, int64_t ldc, int G,
                             float *out, int64_t ldo)
{
    pi2_k_sgemv_t_group_acc_isa(pi2_k_get_isa(), W, ldw, n, nrows, c, ldc, G, out, ldo);
}

void pi2_k_sgemv_t(const float *W, int64_t ldw, int64_t n, int nrows, const float *c, float *out)
{
    pi2_k_sgemv_t_isa(pi2_k_get_isa(), W, ldw, n, nrows, c, out);
}

/* ---- fp16 rows (an fp16 KV cache) ---- */

#ifdef PI2_K_X86
PI2_T_AVX2 static void f16_to_f32_avx2(const uint16_t *src, int64_t n, float *dst)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++)
        dst[i] = pi2_f16_to_f32(src[i]);
}

PI2_T_AVX512 static void f16_to_f32_avx512(const uint16_t *src, int64_t n, float *dst)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
    for (; i < n; i++)
        dst[i] = pi2_f16_to_f32(src[i]);
}
#endif

void pi2_k_f16_to_f32_isa(pi2_isa isa, const uint16_t *src, int64_t n, float *dst)
{
#ifdef PI2_K_X86
    switch (pi2_ki_isa_pick(isa)) {
    case PI2_ISA_AVX512:
        f16_to_f32_avx512(src, n, dst);
        return;
    case PI2_ISA_AVX2:
        f16_to_f32_avx2(src, n, dst);
        return;
    default:
        break;
    }
#elif defined(PI2_K_ARM64)
    if (isa != PI2_ISA_SCALAR) { /* fcvtl: the same exact conversion, 4 at a time */
        int64_t i = 0;
        for (; i + 4 <= n; i += 4)
            vst1q_f32(dst + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(src + i))));
        for (; i < n; i++)
            dst[i] = pi2_f16_to_f32(src[i]);
        return;
    }
#else
    (void)isa;
#endif
    for (int64_t i = 0; i < n; i++)
        dst[i] = pi2_f16_to_f32(src[i]);
}

void pi2_k_f16_to_f32(const uint16_t *src, int64_t n, float *dst) { pi2_k_f16_to_f32_isa(pi2_k_get_isa(), src, n, dst); }
