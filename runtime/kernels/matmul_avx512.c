/* pi2_k_matmul's one-token kernels on AVX-512 VNNI (the tables
 * pi2_ki_mm_q4_vnni and pi2_ki_mm_q8_vnni that matmul.c runs). */
#include "runtime/kernels/internal.h"

#ifdef PI2_K_X86

/* ---- matmul on AVX-512 VNNI, one token: 4 rows x 16 blocks ----
 *
 * The 256-bit t1 above spends ~0.4 instructions per weight byte (nibble
 * broadcast per half block, a fold per 4 blocks, the float stage per 8):
 * compute-bound below the read bandwidth. Here one 64-byte load is 4 Q4
 * blocks (or 2 Q8 blocks) of a row, so each vpdpbusd covers 128 (64) of
 * its values, and a 128-bit lane holds one block (Q4; Q8: half a block).
 * Q4's nibbles split in place (low: elements 0-15 of each lane's block,
 * high: 16-31), so the activations are gathered to match: per 4 blocks
 * one qword permute for the 0-15 halves and one for 16-31, done once per
 * call for all its rows (k_split_a, rows of up to K_SPLIT_MAX values; else
 * per step, shared by the 4 rows), and with GFNI one affine map takes the
 * high nibbles instead of a shift and a mask. Per row and 16 blocks the 4
 * (Q8: 8) product vectors fold (unpack + add, K_FOLD4; Q8 then adds lane
 * pairs) into one vector of 16 exact block dots, which one vpermd puts in
 * block order; then the offset subtract, one cvt, one multiply of 16
 * weight scales by the activation scales and one FMA. About 0.14 (Q8:
 * 0.1) instructions per byte. Lane L of a row's accumulator is stripe L
 * of the fixed order (internal.h, K_MC): the FMAs run in block order, a
 * chunk's 16 lanes sum by k_sum16 and the chunks add up in order, the bits
 * of every other path. The last nb % 16 blocks run once more, every
 * load masked to them (the bytes of zero-padded copies; split
 * activations: their whole last group of 4 blocks); prefetching as in the
 * 256-bit t1. */

/* The mask of a 64-byte load of which `left` bytes are wanted (none, all
 * or the first `left`). */
PI2_T_AVX512 static inline __mmask64 k_mask64(int64_t left)
{
    return left <= 0 ? 0 : left >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << left) - 1;
}

/* Lane L of result dword i = the sum of v_i's 4 dwords of lane L. */
#define K_FOLD4(v0, v1, v2, v3)                                                                              \
    _mm512_add_epi32(                                                                                        \
        _mm512_unpacklo_epi64(_mm512_add_epi32(_mm512_unpacklo_epi32(v0, v1), _mm512_unpackhi_epi32(v0, v1)),  \
                              _mm512_add_epi32(_mm512_unpacklo_epi32(v2, v3), _mm512_unpackhi_epi32(v2, v3))), \
        _mm512_unpackhi_epi64(_mm512_add_epi32(_mm512_unpacklo_epi32(v0, v1), _mm512_unpackhi_epi32(v0, v1)),  \
                              _mm512_add_epi32(_mm512_unpacklo_epi32(v2, v3), _mm512_unpackhi_epi32(v2, v3))))

/* Float stage of one row: dots d (block order), offsets corr, fp16
 * scales at s, activation scales asv. */
#define K_T1W_FIN_(acc, d, s, LDS)                                                                           \
    do {                                                                                                     \
        __m512 sv_ = _mm512_cvtph_ps(LDS(s));                                                                \
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32((d), corr)), _mm512_mul_ps(sv_, asv), acc); \
    } while (0)

/* A row's 64-byte piece j at p and its 16 fp16 scales at s: whole, or
 * (rows of fewer than 16 blocks) masked to the row by wm_[j] and sm_,
 * the bytes past it read as zero and never touched. A step's activations
 * (64-byte piece j at p: K_LDA), their 16 scales (K_LDF) and sums (K_LDI)
 * likewise: a row's tail masks them by am_[j] and sm_. */
#define K_LD_ALL(p, j) _mm512_loadu_si512((const void *)((p) + 64 * (j)))
#define K_LD_MASK(p, j) _mm512_maskz_loadu_epi8(wm_[j], (const void *)((p) + 64 * (j)))
#define K_LDS_ALL(s) _mm256_loadu_si256((const __m256i *)(const void *)(s))
#define K_LDS_MASK(s) _mm256_maskz_loadu_epi16(sm_, (const void *)(s))
#define K_LDA_ALL(p, j) _mm512_loadu_si512((const void *)((p) + 64 * (j)))
#define K_LDA_MASK(p, j) _mm512_maskz_loadu_epi8(am_[j], (const void *)((p) + 64 * (j)))
#define K_LDF_ALL(p) _mm512_loadu_ps(p)
#define K_LDF_MASK(p) _mm512_maskz_loadu_ps(sm_, p)
#define K_LDI_ALL(p) _mm512_loadu_si512((const void *)(p))
#define K_LDI_MASK(p) _mm512_maskz_loadu_epi32(sm_, (const void *)(p))

/* The high nibbles of x's bytes: a shift and a mask, or (GFNI) one
 * affine map of each byte whose matrix moves bits 4-7 to 0-3. */
#define K_HI_SHIFT(x) _mm512_and_si512(_mm512_srli_epi16((x), 4), m4)
#define K_HI_GFNI(x) _mm512_gf2p8affine_epi64_epi8((x), _mm512_set1_epi64(0x1020408000000000LL), 0)

/* Q4 row at wq (16 blocks): fold order is lane L, dword i = block 4i + L. */
#define K_T1W_Q4_V(x, i, HI) \
    _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512((x), m4), alo##i), HI(x), ahi##i)

#define K_T1W_Q4_ROW_(acc, wq, sq, HI, LD, LDS)                                                              \
    do {                                                                                                     \
        __m512i x0_ = LD(wq, 0), x1_ = LD(wq, 1), x2_ = LD(wq, 2), x3_ = LD(wq, 3);                          \
        __m512i v0_ = K_T1W_Q4_V(x0_, 0, HI), v1_ = K_T1W_Q4_V(x1_, 1, HI);                                  \
        __m512i v2_ = K_T1W_Q4_V(x2_, 2, HI), v3_ = K_T1W_Q4_V(x3_, 3, HI);                                  \
        __m512i d_ = _mm512_permutexvar_epi32(ord, K_FOLD4(v0_, v1_, v2_, v3_));                             \
        K_T1W_FIN_(acc, d_, sq, LDS);                                                                        \
    } while (0)

/* Q8 row at wq (16 blocks): after the two folds and the lane-pair add,
 * lane L dword i = block 2i + (L & 1) + 8 * (L >> 1). */
#define K_T1W_Q8_V(wq, j, LD) _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_xor_si512(LD(wq, j), x80), av##j)

#define K_T1W_Q8_ROW_(acc, wq, sq, LD, LDS)                                                                  \
    do {                                                                                                     \
        __m512i v0_ = K_T1W_Q8_V(wq, 0, LD), v1_ = K_T1W_Q8_V(wq, 1, LD), v2_ = K_T1W_Q8_V(wq, 2, LD);       \
        __m512i v3_ = K_T1W_Q8_V(wq, 3, LD), v4_ = K_T1W_Q8_V(wq, 4, LD), v5_ = K_T1W_Q8_V(wq, 5, LD);       \
        __m512i v6_ = K_T1W_Q8_V(wq, 6, LD), v7_ = K_T1W_Q8_V(wq, 7, LD);                                    \
        __m512i p_ = K_FOLD4(v0_, v1_, v2_, v3_), q_ = K_FOLD4(v4_, v5_, v6_, v7_);                          \
        __m512i h_ = _mm512_add_epi32(_mm512_shuffle_i32x4(p_, q_, _MM_SHUFFLE(2, 0, 2, 0)),                  \
                                      _mm512_shuffle_i32x4(p_, q_, _MM_SHUFFLE(3, 1, 3, 1)));                 \
        K_T1W_FIN_(acc, _mm512_permutexvar_epi32(ord, h_), sq, LDS);                                         \
    } while (0)

/* The 16-block step of 4 rows: activations at ab, scales asb, sums sb,
 * every load of the set M (ALL: whole; MASK: a row's tail, see K_LD_ALL). */
#define K_T1W_AQ4(i, ab, M)                                                                                  \
    __m512i alo##i, ahi##i;                                                                                  \
    do {                                                                                                     \
        __m512i y0_ = K_LDA_##M(ab, 2 * (i)), y1_ = K_LDA_##M(ab, 2 * (i) + 1);                              \
        alo##i = _mm512_permutex2var_epi64(y0_, ilo, y1_);                                                   \
        ahi##i = _mm512_permutex2var_epi64(y0_, ihi, y1_);                                                   \
    } while (0)

/* Activations split beforehand (k_split_a): per 4 blocks their elements
 * 0-15, then 16-31. */
#define K_T1W_AQ4S(i, ab, M) __m512i alo##i = K_LDA_##M(ab, 2 * (i)), ahi##i = K_LDA_##M(ab, 2 * (i) + 1)

/* The Q4 step, its activations gathered by AQ and high nibbles taken by HI. */
#define K_T1W_STEP_Q4_(ab, asb, sb, w0, w1, w2, w3, s0, s1, s2, s3, AQ, HI, M)                               \
    do {                                                                                                     \
        AQ(0, ab, M);                                                                                        \
        AQ(1, ab, M);                                                                                        \
        AQ(2, ab, M);                                                                                        \
        AQ(3, ab, M);                                                                                        \
        __m512 asv = K_LDF_##M(asb);                                                                         \
        __m512i corr = _mm512_slli_epi32(K_LDI_##M(sb), 3);                                                  \
        K_T1W_Q4_ROW_(acc0, w0, s0, HI, K_LD_##M, K_LDS_##M);                                                \
        K_T1W_Q4_ROW_(acc1, w1, s1, HI, K_LD_##M, K_LDS_##M);                                                \
        K_T1W_Q4_ROW_(acc2, w2, s2, HI, K_LD_##M, K_LDS_##M);                                                \
        K_T1W_Q4_ROW_(acc3, w3, s3, HI, K_LD_##M, K_LDS_##M);                                                \
    } while (0)
#define K_T1W_STEP_Q4(M, ...) K_T1W_STEP_Q4_(__VA_ARGS__, K_T1W_AQ4, K_HI_SHIFT, M)
#define K_T1W_STEP_Q4S(M, ...) K_T1W_STEP_Q4_(__VA_ARGS__, K_T1W_AQ4S, K_HI_SHIFT, M)
#define K_T1W_STEP_Q4SG(M, ...) K_T1W_STEP_Q4_(__VA_ARGS__, K_T1W_AQ4S, K_HI_GFNI, M)

/* The Q8 step's 8 activation vectors (16 blocks at ab). */
#define K_T1W_AQ8(ab, M)                                                                                     \
    __m512i av0 = K_LDA_##M(ab, 0), av1 = K_LDA_##M(ab, 1), av2 = K_LDA_##M(ab, 2), av3 = K_LDA_##M(ab, 3);  \
    __m512i av4 = K_LDA_##M(ab, 4), av5 = K_LDA_##M(ab, 5), av6 = K_LDA_##M(ab, 6), av7 = K_LDA_##M(ab, 7)

#define K_T1W_STEP_Q8(M, ab, asb, sb, w0, w1, w2, w3, s0, s1, s2, s3)                                        \
    do {                                                                                                     \
        K_T1W_AQ8(ab, M);                                                                                    \
        __m512 asv = K_LDF_##M(asb);                                                                         \
        __m512i corr = _mm512_slli_epi32(K_LDI_##M(sb), 7);                                                  \
        K_T1W_Q8_ROW_(acc0, w0, s0, K_LD_##M, K_LDS_##M);                                                    \
        K_T1W_Q8_ROW_(acc1, w1, s1, K_LD_##M, K_LDS_##M);                                                    \
        K_T1W_Q8_ROW_(acc2, w2, s2, K_LD_##M, K_LDS_##M);                                                    \
        K_T1W_Q8_ROW_(acc3, w3, s3, K_LD_##M, K_LDS_##M);                                                    \
    } while (0)

#define K_T1W_CHUNK(b)                                                                                       \
    do {                                                                                                     \
        if ((b) > 0 && (b) % K_MC == 0) {                                                                    \
            r0_ += k_sum16(acc0);                                                                            \
            r1_ += k_sum16(acc1);                                                                            \
            r2_ += k_sum16(acc2);                                                                            \
            r3_ += k_sum16(acc3);                                                                            \
            acc0 = acc1 = acc2 = acc3 = _mm512_setzero_ps();                                                 \
        }                                                                                                    \
    } while (0)

#define K_DEF_T1W(name, TGT, STEP, GB, ORD, AR)                                                                     \
    TGT static void name(const uint8_t *const w[4], const uint16_t *const s[4], int64_t nb,                   \
                                  const int8_t *a, const float *as, const int32_t *sums,                      \
                                  const uint8_t *const wn[4], const uint8_t *pf2, int64_t pf2_len, float res[4]) \
    {                                                                                                        \
        const __m512i m4 = _mm512_set1_epi8(0x0f), x80 = _mm512_set1_epi8(-128);                             \
        const __m512i ilo = _mm512_setr_epi64(0, 1, 4, 5, 8, 9, 12, 13);                                     \
        const __m512i ihi = _mm512_setr_epi64(2, 3, 6, 7, 10, 11, 14, 15);                                   \
        const __m512i ord = ORD;                                                                             \
        (void)m4, (void)x80, (void)ilo, (void)ihi;                                                           \
        __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;                            \
        float r0_ = 0.0f, r1_ = 0.0f, r2_ = 0.0f, r3_ = 0.0f; /* the chunks so far */                     \
        int64_t b = 0, rb_ = nb * (GB), po_ = 0, o2_ = 0, q2_ = k_pf_quota(pf2_len, nb / 16);                \
        int pk_ = wn ? 0 : 4; /* NULL: no paced prefetch */                                                  \
        for (; b + 16 <= nb; b += 16) {                                                                      \
            K_T1W_CHUNK(b);                                                                                  \
            for (int64_t e_ = o2_ + q2_ < pf2_len ? o2_ + q2_ : pf2_len; o2_ < e_; o2_ += 64)                \
                _mm_prefetch((const char *)(pf2 + o2_), _MM_HINT_T1);                                        \
            for (int l_ = 0; l_ < 64 * (GB) && pk_ < 4; l_ += 64) {                                          \
                _mm_prefetch((const char *)(wn[pk_] + po_), _MM_HINT_T0);                                    \
                po_ += 64;                                                                                   \
                if (po_ >= rb_) {                                                                            \
                    po_ = 0;                                                                                 \
                    pk_++;                                                                                   \
                }                                                                                            \
            }                                                                                                \
            STEP(ALL, a + b * QG, as + b, sums + b, w[0] + b * (GB), w[1] + b * (GB), w[2] + b * (GB),        \
                 w[3] + b * (GB), s[0] + b, s[1] + b, s[2] + b, s[3] + b);                                   \
        }                                                                                                    \
        if (b < nb) { /* 1..15 blocks left: loads masked to them (the bytes of a step over zero-padded \
                         copies, which contribute 0 * 0, without the copies) */                              \
            K_T1W_CHUNK(b);                                                                                  \
            int64_t m = nb - b, la_ = (m + (AR) - 1) / (AR) * (AR) * QG, lw_ = m * (GB);                     \
            __mmask64 am_[8], wm_[8];                                                                        \
            for (int j = 0; j < 8; j++) {                                                                    \
                am_[j] = k_mask64(la_ - 64 * j);                                                             \
                wm_[j] = k_mask64(lw_ - 64 * j);                                                             \
            }                                                                                                \
            __mmask16 sm_ = (__mmask16)((1u << m) - 1u);                                                     \
            STEP(MASK, a + b * QG, as + b, sums + b, w[0] + b * (GB), w[1] + b * (GB), w[2] + b * (GB),       \
                 w[3] + b * (GB), s[0] + b, s[1] + b, s[2] + b, s[3] + b);                                   \
        }                                                                                                    \
        res[0] = r0_ + k_sum16(acc0);                                                                        \
        res[1] = r1_ + k_sum16(acc1);                                                                        \
        res[2] = r2_ + k_sum16(acc2);                                                                        \
        res[3] = r3_ + k_sum16(acc3);                                                                        \
    }

/* ORD[p] = the fold position of block p: Q4 4 * (p % 4) + p / 4; Q8 see
 * K_T1W_Q8_ROW_. */
#define K_ORD_Q4 _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15)
K_DEF_T1W(mm_t1w_q4_vnni, PI2_T_AVX512, K_T1W_STEP_Q4, PI2_Q4_GROUP_BYTES, K_ORD_Q4, 1)
K_DEF_T1W(mm_t1w_q4s_vnni, PI2_T_AVX512, K_T1W_STEP_Q4S, PI2_Q4_GROUP_BYTES, K_ORD_Q4, 4)
K_DEF_T1W(mm_t1w_q4sg_vnni, PI2_T_AVX512G, K_T1W_STEP_Q4SG, PI2_Q4_GROUP_BYTES, K_ORD_Q4, 4)
K_DEF_T1W(mm_t1w_q8_vnni, PI2_T_AVX512, K_T1W_STEP_Q8, PI2_Q8_GROUP_BYTES,
          _mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15), 1)

/* dst = a's n / 32 blocks split per 4 (the last group zero-padded): their
 * elements 0-15, then 16-31, as K_T1W_STEP_Q4S reads them. */
PI2_T_AVX512 static void k_split_a(const int8_t *a, int64_t nb, int8_t *dst)
{
    const __m512i ilo = _mm512_setr_epi64(0, 1, 4, 5, 8, 9, 12, 13);
    const __m512i ihi = _mm512_setr_epi64(2, 3, 6, 7, 10, 11, 14, 15);
    for (int64_t b = 0; b < nb; b += 4) {
        __m512i y0, y1;
        if (b + 4 <= nb) {
            y0 = _mm512_loadu_si512((const void *)(a + b * QG));
            y1 = _mm512_loadu_si512((const void *)(a + b * QG + 64));
        } else {
            _Alignas(64) int8_t t[4 * QG] = {0};
            memcpy(t, a + b * QG, (size_t)(nb - b) * QG);
            y0 = _mm512_load_si512((const void *)t);
            y1 = _mm512_load_si512((const void *)(t + 64));
        }
        _mm512_storeu_si512((void *)(dst + b * QG), _mm512_permutex2var_epi64(y0, ilo, y1));
        _mm512_storeu_si512((void *)(dst + b * QG + 64), _mm512_permutex2var_epi64(y0, ihi, y1));
    }
}

/* ---- rows of fewer than 16 blocks, one token ----
 *
 * A predictor's second layer has rows of its rank (the 1B-shaped model's:
 * 5632 rows of 128 values): the whole row is a tail of the step above,
 * whose every tile copied its rows, their scales and the activations into
 * zeroed buffers and ran a 16-block step. Here the activations are padded
 * (and split) once per call and each tile runs the same step with its
 * weights and scales masked to the row at the load: the same inputs to the
 * same arithmetic, so the same sums, without the per-tile copies. Q8 rows
 * of up to 8 blocks take the narrow steps below. */
/* Short rows that lie end to end (a predictor's matrix) stream as one
 * range: each tile prefetches its own bytes K_SHORT_AHEAD further on,
 * ascending; the next tile's rows alone (2 KiB of Q8 rows of 128 values)
 * were too close to cover the memory's latency (runtime/PERF.md). A
 * caller's range that goes on from the last row is then that stream's
 * continuation, not spread toward L2 over the tiles. Other rows take
 * the first line of each next row and the spread range. */
enum { K_SHORT_AHEAD = 4096 };
typedef struct k_short_pf {
    bool lin;  /* rows end to end */
    bool cont; /* and the caller's range goes on from the last */
} k_short_pf;

PI2_T_AVX512 static inline k_short_pf short_pf_mode(const uint8_t *const *wp, int nrows, int64_t rb, const uint8_t *pf)
{
    k_short_pf m;
    m.lin = wp[nrows - 1] == wp[0] + (int64_t)(nrows - 1) * rb;
    m.cont = m.lin && pf && pf == wp[nrows - 1] + rb;
    return m;
}

/* The prefetches of the tile of `per` rows from r0 (tile i of `tiles`). */
PI2_T_AVX512 static inline void short_pf_tile(k_short_pf m, const uint8_t *const *wp, int nrows, int64_t rb, int r0,
                                              int per, const uint8_t *pf, int64_t pf_len, int64_t tiles)
{
    if (m.lin) {
        for (int64_t l = 0; l < per * rb; l += 64)
            k_prefetch_t0(wp[r0] + K_SHORT_AHEAD + l);
    } else {
        for (int k = 0; k < per; k++)
            _mm_prefetch((const char *)wp[r0 + per + k < nrows ? r0 + per + k : nrows - 1], _MM_HINT_T0);
    }
    if (!m.cont)
        k_pf_tile(pf, pf_len, r0 / per, tiles);
}

#define K_DEF_T1W_SHORT(name, TGT, GB, ORD, SH, ACTS, ROW)                                                   \
    TGT static void name(int64_t nb, int nrows, const uint8_t *const *wp, const uint16_t *const *ws,           \
                         const float *as, const int8_t *a, const int32_t *sums, float *out, const uint8_t *pf,  \
                         int64_t pf_len)                                                                     \
    {                                                                                                        \
        const __m512i m4 = _mm512_set1_epi8(0x0f), x80 = _mm512_set1_epi8(-128);                             \
        const __m512i ord = ORD;                                                                             \
        (void)m4, (void)x80;                                                                                 \
        _Alignas(64) int8_t ta[16 * QG] = {0};                                                               \
        float tas[16] = {0};                                                                                 \
        int32_t tsum[16] = {0};                                                                              \
        memcpy(ta, a, (size_t)nb * QG);                                                                      \
        memcpy(tas, as, (size_t)nb * sizeof(float));                                                         \
        memcpy(tsum, sums, (size_t)nb * sizeof(int32_t));                                                    \
        __mmask64 wm_[8];                                                                                    \
        for (int j = 0; j < 8; j++) {                                                                        \
            wm_[j] = k_mask64(nb * (GB) - 64 * j);                                                           \
        }                                                                                                    \
        __mmask16 sm_ = (__mmask16)((1u << nb) - 1u);                                                        \
        ACTS(ta);                                                                                            \
        __m512 asv = _mm512_loadu_ps(tas);                                                                   \
        __m512i corr = _mm512_slli_epi32(_mm512_loadu_si512((const void *)tsum), SH);                        \
        int64_t tiles = (nrows + 3) / 4;                                                                     \
        k_short_pf pm_ = short_pf_mode(wp, nrows, nb * (GB), pf);                                            \
        for (int r0 = 0; r0 < nrows; r0 += 4) {                                                              \
            const uint8_t *w[4];                                                                             \
            const uint16_t *s[4];                                                                            \
            for (int k = 0; k < 4; k++) {                                                                    \
                int r = r0 + k < nrows ? r0 + k : nrows - 1;                                                 \
                w[k] = wp[r];                                                                                \
                s[k] = ws[r];                                                                                \
            }                                                                                                \
            short_pf_tile(pm_, wp, nrows, nb * (GB), r0, 4, pf, pf_len, tiles);                              \
            __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;                        \
            ROW(acc0, w[0], s[0]);                                                                           \
            ROW(acc1, w[1], s[1]);                                                                           \
            ROW(acc2, w[2], s[2]);                                                                           \
            ROW(acc3, w[3], s[3]);                                                                           \
            float res[4] = {k_sum16(acc0), k_sum16(acc1), k_sum16(acc2), k_sum16(acc3)};                     \
            for (int k = 0; k < 4 && r0 + k < nrows; k++)                                                    \
                out[r0 + k] = res[k];                                                                        \
        }                                                                                                    \
    }

/* the activation vectors of the one step: Q8 as they are, Q4 split per 4
 * blocks as k_split_a leaves them */
#define K_SHORT_ACTS_Q8(ta) K_T1W_AQ8(ta, ALL)
#define K_SHORT_ACTS_Q4(ta)                                                                                  \
    _Alignas(64) int8_t sp_[16 * QG];                                                                        \
    k_split_a((ta), 16, sp_);                                                                                \
    K_T1W_AQ4S(0, sp_, ALL);                                                                                 \
    K_T1W_AQ4S(1, sp_, ALL);                                                                                 \
    K_T1W_AQ4S(2, sp_, ALL);                                                                                 \
    K_T1W_AQ4S(3, sp_, ALL)
#define K_SHORT_ROW_Q8(acc, wq, sq) K_T1W_Q8_ROW_(acc, wq, sq, K_LD_MASK, K_LDS_MASK)
#define K_SHORT_ROW_Q4(acc, wq, sq) K_T1W_Q4_ROW_(acc, wq, sq, K_HI_SHIFT, K_LD_MASK, K_LDS_MASK)
#define K_SHORT_ROW_Q4G(acc, wq, sq) K_T1W_Q4_ROW_(acc, wq, sq, K_HI_GFNI, K_LD_MASK, K_LDS_MASK)

K_DEF_T1W_SHORT(mm_short_q8_vnni, PI2_T_AVX512, PI2_Q8_GROUP_BYTES,
                _mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15), 7, K_SHORT_ACTS_Q8,
                K_SHORT_ROW_Q8)
K_DEF_T1W_SHORT(mm_short_q4_vnni, PI2_T_AVX512, PI2_Q4_GROUP_BYTES, K_ORD_Q4, 3, K_SHORT_ACTS_Q4, K_SHORT_ROW_Q4)
K_DEF_T1W_SHORT(mm_short_q4g_vnni, PI2_T_AVX512G, PI2_Q4_GROUP_BYTES, K_ORD_Q4, 3, K_SHORT_ACTS_Q4,
                K_SHORT_ROW_Q4G)

/* Q8 rows of at most 8 (4) blocks, each padded to nbp = 8 (4): one step
 * holds 16 / nbp rows side by side, its 8 loads and 16 scales split among
 * them, the activations repeated for each; a tile is 4 such steps. Every
 * lane sees the operations of the 16-block step over the row padded with
 * zero blocks, and a row's lanes sum in that step's subtree: the same
 * bits (test_matmul_short), with 2 or 4 rows' worth of work per step
 * instead of one. */
#define K_LD_ROWS(p, j) _mm512_maskz_loadu_epi8(wm_[j], (const void *)((p)[j] + 64 * ((j) % jp)))
#define K_LDS_READY(s) (s)
PI2_T_AVX512 static inline __attribute__((always_inline)) void
narrow_q8(const int nbp, int64_t nb, int nrows, const uint8_t *const *wp, const uint16_t *const *ws, const float *as,
          const int8_t *a, const int32_t *sums, float *out, const uint8_t *pf, int64_t pf_len)
{
    const __m512i x80 = _mm512_set1_epi8(-128);
    const __m512i ord = _mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
    const int rps = 16 / nbp, jp = nbp / 2; /* rows per step, loads per row */
    _Alignas(64) int8_t ta[8 * QG] = {0};
    float tas[16];
    int32_t tsum[16];
    memcpy(ta, a, (size_t)nb * QG);
    for (int p = 0; p < 16; p++) {
        tas[p] = p % nbp < nb ? as[p % nbp] : 0.0f;
        tsum[p] = p % nbp < nb ? sums[p % nbp] : 0;
    }
    __mmask64 wm_[8];
    for (int j = 0; j < 8; j++) {
        wm_[j] = k_mask64(nb * PI2_Q8_GROUP_BYTES - 64 * (j % jp));
    }
    const __mmask8 sm = (__mmask8)((1u << nb) - 1u);
    __m512i av0 = _mm512_load_si512((const void *)ta), av1 = _mm512_load_si512((const void *)(ta + 64 * (1 % jp)));
    __m512i av2 = _mm512_load_si512((const void *)(ta + 64 * (2 % jp)));
    __m512i av3 = _mm512_load_si512((const void *)(ta + 64 * (3 % jp)));
    __m512i av4 = av0, av5 = av1, av6 = av2, av7 = av3;
    __m512 asv = _mm512_loadu_ps(tas);
    __m512i corr = _mm512_slli_epi32(_mm512_loadu_si512((const void *)tsum), 7);
    int per = 4 * rps; /* rows per tile */
    int64_t tiles = (nrows + per - 1) / per;
    k_short_pf pm = short_pf_mode(wp, nrows, nb * PI2_Q8_GROUP_BYTES, pf);
    for (int r0 = 0; r0 < nrows; r0 += per) {
        const uint8_t *rp[4][8];
        __m256i sv[4];
        for (int v = 0; v < 4; v++) {
            __m128i q[4];
            for (int i = 0; i < rps; i++) {
                int r = r0 + v * rps + i < nrows ? r0 + v * rps + i : nrows - 1;
                for (int j = i * jp; j < (i + 1) * jp; j++)
                    rp[v][j] = wp[r];
                q[i] = _mm_maskz_loadu_epi16(sm, (const void *)ws[r]);
            }
            sv[v] = rps == 2 ? _mm256_set_m128i(q[1], q[0])
                             : _mm256_set_m128i(_mm_unpacklo_epi64(q[2], q[3]), _mm_unpacklo_epi64(q[0], q[1]));
        }
        short_pf_tile(pm, wp, nrows, nb * PI2_Q8_GROUP_BYTES, r0, per, pf, pf_len, tiles);
        __m512 acc[4];
        for (int v = 0; v < 4; v++) {
            acc[v] = _mm512_setzero_ps();
            K_T1W_Q8_ROW_(acc[v], rp[v], sv[v], K_LD_ROWS, K_LDS_READY);
        }
        for (int v = 0; v < 4; v++)
            for (int i = 0; i < rps && r0 + v * rps + i < nrows; i++) {
                float r;
                if (rps == 2)
                    r = k_sum8(i ? _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[v]), 1))
                                 : _mm512_castps512_ps256(acc[v]));
                else
                    r = k_sum4(i == 0   ? _mm512_castps512_ps128(acc[v])
                               : i == 1 ? _mm512_extractf32x4_ps(acc[v], 1)
                               : i == 2 ? _mm512_extractf32x4_ps(acc[v], 2)
                                        : _mm512_extractf32x4_ps(acc[v], 3));
                out[r0 + v * rps + i] = r;
            }
    }
}

PI2_T_AVX512 static void mm_narrow4_q8_vnni(int64_t nb, int nrows, const uint8_t *const *wp,
                                           const uint16_t *const *ws, const float *as, const int8_t *a,
                                           const int32_t *sums, float *out, const uint8_t *pf, int64_t pf_len)
{
    narrow_q8(4, nb, nrows, wp, ws, as, a, sums, out, pf, pf_len);
}

PI2_T_AVX512 static void mm_narrow8_q8_vnni(int64_t nb, int nrows, const uint8_t *const *wp,
                                           const uint16_t *const *ws, const float *as, const int8_t *a,
                                           const int32_t *sums, float *out, const uint8_t *pf, int64_t pf_len)
{
    narrow_q8(8, nb, nrows, wp, ws, as, a, sums, out, pf, pf_len);
}

/* Q4 rows of at most 4 blocks (a predictor's second layer at rank <= 128):
 * each row is one 64-byte load, 4 rows a step against the same 4 blocks
 * of split activations; the fold leaves row i's blocks in lane i once
 * K_ORD_Q4 transposes it (as the 16-block step leaves one row's blocks
 * 0-3), and each lane sums by k_sum4, the subtree k_sum16 takes over a row
 * padded with zero blocks: the same bits (test_matmul_short), a quarter of
 * the work per row. */
#define K_NARROW_Q4_V(x, HI)                                                                                 \
    _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512((x), m4), alo0), HI(x), ahi0)
#define K_DEF_NARROW_Q4(name, TGT, HI)                                                                        \
    TGT static void name(int64_t nb, int nrows, const uint8_t *const *wp, const uint16_t *const *ws,           \
                         const float *as, const int8_t *a, const int32_t *sums, float *out, const uint8_t *pf,  \
                         int64_t pf_len)                                                                     \
    {                                                                                                        \
        const __m512i m4 = _mm512_set1_epi8(0x0f), ord = K_ORD_Q4;                                          \
        _Alignas(64) int8_t ta[4 * QG] = {0};                                                                \
        float tas[16];                                                                                       \
        int32_t tsum[16];                                                                                    \
        memcpy(ta, a, (size_t)nb * QG);                                                                      \
        for (int p = 0; p < 16; p++) {                                                                       \
            tas[p] = p % 4 < nb ? as[p % 4] : 0.0f;                                                          \
            tsum[p] = p % 4 < nb ? sums[p % 4] : 0;                                                          \
        }                                                                                                    \
        _Alignas(64) int8_t sp_[4 * QG];                                                                     \
        k_split_a(ta, 4, sp_);                                                                               \
        K_T1W_AQ4S(0, sp_, ALL);                                                                             \
        const __mmask64 wm = nb >= 4 ? ~(__mmask64)0 : ((__mmask64)1 << (nb * PI2_Q4_GROUP_BYTES)) - 1;     \
        const __mmask8 sm = (__mmask8)((1u << nb) - 1u);                                                     \
        __m512 asv = _mm512_loadu_ps(tas);                                                                   \
        __m512i corr = _mm512_slli_epi32(_mm512_loadu_si512((const void *)tsum), 3);                         \
        int64_t tiles = (nrows + 15) / 16;                                                                   \
        k_short_pf pm = short_pf_mode(wp, nrows, nb * PI2_Q4_GROUP_BYTES, pf);                               \
        for (int r0 = 0; r0 < nrows; r0 += 16) {                                                             \
            short_pf_tile(pm, wp, nrows, nb * PI2_Q4_GROUP_BYTES, r0, 16, pf, pf_len, tiles);                \
            for (int v = 0; v < 4 && r0 + 4 * v < nrows; v++) {                                              \
                __m512i x[4];                                                                                \
                __m128i q[4];                                                                                \
                for (int i = 0; i < 4; i++) {                                                                \
                    int r = r0 + 4 * v + i < nrows ? r0 + 4 * v + i : nrows - 1;                             \
                    x[i] = _mm512_maskz_loadu_epi8(wm, (const void *)wp[r]);                                 \
                    q[i] = _mm_maskz_loadu_epi16(sm, (const void *)ws[r]);                                   \
                }                                                                                            \
                __m256i sv = _mm256_set_m128i(_mm_unpacklo_epi64(q[2], q[3]), _mm_unpacklo_epi64(q[0], q[1])); \
                __m512i d = _mm512_permutexvar_epi32(                                                        \
                    ord, K_FOLD4(K_NARROW_Q4_V(x[0], HI), K_NARROW_Q4_V(x[1], HI), K_NARROW_Q4_V(x[2], HI),   \
                                 K_NARROW_Q4_V(x[3], HI)));                                                  \
                __m512 acc = _mm512_setzero_ps();                                                            \
                K_T1W_FIN_(acc, d, sv, K_LDS_READY);                                                         \
                for (int i = 0; i < 4 && r0 + 4 * v + i < nrows; i++)                                        \
                    out[r0 + 4 * v + i] = k_sum4(i == 0   ? _mm512_castps512_ps128(acc)                      \
                                                 : i == 1 ? _mm512_extractf32x4_ps(acc, 1)                   \
                                                 : i == 2 ? _mm512_extractf32x4_ps(acc, 2)                   \
                                                          : _mm512_extractf32x4_ps(acc, 3));                 \
            }                                                                                                \
        }                                                                                                    \
    }
K_DEF_NARROW_Q4(mm_narrow_q4_vnni, PI2_T_AVX512, K_HI_SHIFT)
K_DEF_NARROW_Q4(mm_narrow_q4g_vnni, PI2_T_AVX512G, K_HI_GFNI)

/* Q4 rows of fewer than 16 blocks: up to 4 narrow, else the masked step
 * (with GFNI: the g twins). */
static void mm_short_q4(int64_t nb, int nrows, const uint8_t *const *wp, const uint16_t *const *ws, const float *as,
                        const int8_t *a, const int32_t *sums, float *out, const uint8_t *pf, int64_t pf_len)
{
    (nb <= 4 ? mm_narrow_q4_vnni : mm_short_q4_vnni)(nb, nrows, wp, ws, as, a, sums, out, pf, pf_len);
}

static void mm_short_q4g(int64_t nb, int nrows, const uint8_t *const *wp, const uint16_t *const *ws,
                         const float *as, const int8_t *a, const int32_t *sums, float *out, const uint8_t *pf,
                         int64_t pf_len)
{
    (nb <= 4 ? mm_narrow_q4g_vnni : mm_short_q4g_vnni)(nb, nrows, wp, ws, as, a, sums, out, pf, pf_len);
}

/* Q8 rows of fewer than 16 blocks: up to 4 or 8 narrow, else the masked step. */
static void mm_short_q8(int64_t nb, int nrows, const uint8_t *const *wp, const uint16_t *const *ws, const float *as,
                        const int8_t *a, const int32_t *sums, float *out, const uint8_t *pf, int64_t pf_len)
{
    (nb <= 4   ? mm_narrow4_q8_vnni
     : nb <= 8 ? mm_narrow8_q8_vnni
               : mm_short_q8_vnni)(nb, nrows, wp, ws, as, a, sums, out, pf, pf_len);
}

/* VNNI: 4+ tokens take the 512-bit panels (mm_panels), fewer run one token
 * at a time, so no 4-token tiles */
const k_mm_ops pi2_ki_mm_q4_vnni = {NULL, NULL, mm_t1w_q4_vnni, mm_t1w_q4s_vnni, mm_t1w_q4sg_vnni, k_split_a, 8,
                                    PI2_Q4_GROUP_BYTES, mm_short_q4, mm_short_q4g};
const k_mm_ops pi2_ki_mm_q8_vnni = {NULL, NULL, mm_t1w_q8_vnni, NULL, NULL, NULL, 128, PI2_Q8_GROUP_BYTES,
                                    mm_short_q8, NULL};

#else
/* nothing here without x86: the dispatch runs the twins */
typedef int pi2_k_matmul_avx512_none;
#endif /* PI2_K_X86 */
