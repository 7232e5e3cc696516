/* pi2_k_matmul's one-token kernel for AVX2 rows of under 16 blocks (the
 * table MM_Q4_AVX2 / MM_Q8_AVX2 in matmul.c runs it as t1short). */
#include "runtime/kernels/internal.h"

#ifdef PI2_K_X86

/* ---- AVX2, one token, rows of under 16 blocks ----
 *
 * A predictor's second layer (rows of its rank, 3-4 blocks) ran through
 * t1's tail, which copies each tile's rows and scales into zeroed
 * buffers (slow from memory: runtime/PERF.md). Here a row's blocks are
 * read in place (the scales, activation scales and sums past the row by
 * masked loads, as zeros), their products summed by vphaddd into the 8
 * block dots of a half (blocks 8h .. 8h + 7), and the float stage is t1's
 * on the same lanes (acc: half 0, hcc: half 1, each stripe at most one
 * block from +0): the bits of every path. Rows that lie end to end
 * stream as one range, K_SHORT2_AHEAD bytes ahead. */
enum { K_SHORT2_AHEAD = 4096 };

/* Lanes b < n of 8 set (a vpmaskmov mask). */
PI2_T_AVX2 static inline __m256i lanes_below(int64_t n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* The exact products of block b of row p (wt) with the activations,
 * as 8 int32 lanes to be summed; zero past the row's m blocks. */
PI2_T_AVX2 static inline __m256i short_prod(pi2_qtype wt, const uint8_t *p, const int8_t *a, int64_t b, int64_t m)
{
    const __m256i ones = _mm256_set1_epi16(1);
    if (b >= m)
        return _mm256_setzero_si256();
    __m256i ab = ld256(a + b * QG), pr;
    if (wt == PI2_QT_Q4)
        pr = _mm256_maddubs_epi16(q4_nibbles(p + b * PI2_Q4_GROUP_BYTES), ab);
    else {
        __m256i w = ld256(p + b * PI2_Q8_GROUP_BYTES);
        pr = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(ab, w));
    }
    return _mm256_madd_epi16(pr, ones);
}

/* Half h of row p: fma(dot_b - corr_b, d_b * as_b, +0) in lane b - 8h. */
PI2_T_AVX2 static inline __m256 short_half(pi2_qtype wt, const uint8_t *p, const uint16_t *s, const int8_t *a,
                                           int64_t nb, int h, __m256 asv, __m256i corr)
{
    int64_t b0 = 8 * h, m = nb - b0 < 8 ? nb - b0 : 8;
    const uint8_t *ph = p + b0 * (wt == PI2_QT_Q4 ? PI2_Q4_GROUP_BYTES : PI2_Q8_GROUP_BYTES);
    const int8_t *ah = a + b0 * QG;
    /* [q0 q1 q2 q3 | same, high halves] summed per block, then the halves */
    __m256i x = _mm256_hadd_epi32(_mm256_hadd_epi32(short_prod(wt, ph, ah, 0, m), short_prod(wt, ph, ah, 1, m)),
                                  _mm256_hadd_epi32(short_prod(wt, ph, ah, 2, m), short_prod(wt, ph, ah, 3, m)));
    __m256i y = _mm256_setzero_si256();
    if (m > 4)
        y = _mm256_hadd_epi32(_mm256_hadd_epi32(short_prod(wt, ph, ah, 4, m), short_prod(wt, ph, ah, 5, m)),
                              _mm256_hadd_epi32(short_prod(wt, ph, ah, 6, m), short_prod(wt, ph, ah, 7, m)));
    __m256i d = _mm256_add_epi32(_mm256_permute2x128_si256(x, y, 0x20), _mm256_permute2x128_si256(x, y, 0x31));
    /* the row's m fp16 scales: m / 2 dwords, an odd last one apart */
    __m128i sh = _mm_maskload_epi32((const int *)(const void *)(s + b0), _mm256_castsi256_si128(lanes_below(m / 2)));
    if (m % 2) {
        __m128i at = _mm_cmpeq_epi16(_mm_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7), _mm_set1_epi16((short)(m - 1)));
        sh = _mm_blendv_epi8(sh, _mm_set1_epi16((short)s[b0 + m - 1]), at);
    }
    __m256 sv = _mm256_mul_ps(_mm256_cvtph_ps(sh), asv);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(d, corr)), sv, _mm256_setzero_ps());
}

PI2_T_AVX2 static void mm_short_avx2(pi2_qtype wt, int64_t nb, int nrows, const uint8_t *const *wp,
                                     const uint16_t *const *ws, const float *as, const int8_t *a, const int32_t *sums,
                                     float *out)
{
    int64_t rb = nb * (wt == PI2_QT_Q4 ? PI2_Q4_GROUP_BYTES : PI2_Q8_GROUP_BYTES);
    __m256 asv[2];
    __m256i corr[2];
    for (int h = 0; h < 2; h++) {
        int64_t m = nb - 8 * h < 0 ? 0 : nb - 8 * h;
        asv[h] = _mm256_maskload_ps(as + 8 * h, lanes_below(m));
        __m256i sm = _mm256_maskload_epi32((const int *)(sums + 8 * h), lanes_below(m));
        corr[h] = wt == PI2_QT_Q4 ? _mm256_slli_epi32(sm, 3) : _mm256_setzero_si256();
    }
    bool lin = wp[nrows - 1] == wp[0] + (int64_t)(nrows - 1) * rb;
    int64_t ahead = 0; /* bytes from wp[0] + K_SHORT2_AHEAD prefetched so far */
    for (int r = 0; r < nrows; r++) {
        if (lin)
            for (; ahead < (r + 1) * rb; ahead += 64)
                k_prefetch_t0(wp[0] + K_SHORT2_AHEAD + ahead);
        else
            _mm_prefetch((const char *)wp[r + 1 < nrows ? r + 1 : r], _MM_HINT_T0);
        __m256 lo = short_half(wt, wp[r], ws[r], a, nb, 0, asv[0], corr[0]);
        __m256 hi = nb > 8 ? short_half(wt, wp[r], ws[r], a, nb, 1, asv[1], corr[1]) : _mm256_setzero_ps();
        out[r] = 0.0f + k_sum8(_mm256_add_ps(lo, hi));
    }
}

PI2_T_AVX2 void pi2_ki_mm_short_q4_avx2(int64_t nb, int nrows, const uint8_t *const *wp, const uint16_t *const *ws,
                                        const float *as, const int8_t *a, const int32_t *sums, float *out,
                                        const uint8_t *pf, int64_t pf_len)
{
    (void)pf, (void)pf_len;
    mm_short_avx2(PI2_QT_Q4, nb, nrows, wp, ws, as, a, sums, out);
}

PI2_T_AVX2 void pi2_ki_mm_short_q8_avx2(int64_t nb, int nrows, const uint8_t *const *wp, const uint16_t *const *ws,
                                        const float *as, const int8_t *a, const int32_t *sums, float *out,
                                        const uint8_t *pf, int64_t pf_len)
{
    (void)pf, (void)pf_len;
    mm_short_avx2(PI2_QT_Q8, nb, nrows, wp, ws, as, a, sums, out);
}

#else
/* nothing here without x86: the dispatch runs the twins */
typedef int pi2_k_matmul_avx2_none;
#endif /* PI2_K_X86 */
