/* The matmul family (pi2_k_matmul, contract in kernels.h): the scalar
 * twin and the AVX2 tiles here, the AVX-512 VNNI one-token kernels in
 * matmul_avx512.c, batches on the prefill panels (panels.c).
 *
 * ---- matmul: why it is shaped like this ----
 * One 32-block of one row against one token is 32 MACs, which vpmaddubsw +
 * vpmaddwd (or one vpdpbusd) do in one instruction pair; what costs is
 * everything around it: unpacking nibbles, reducing the product lanes,
 * converting to float, forming the combined scale and the FMA. So:
 *   - Prefill tiles are 4 rows x 4 tokens. The tokens' activation blocks
 *     are shared by the rows; a row's block is unpacked once per tile, or,
 *     when 3+ token groups share a row tile, once per call into a stack
 *     buffer (q4_unpack_rows) that every group then reads.
 *   - A (row, block)'s 4 per-token products are folded by unpack + add into
 *     one vector [t0 t1 t2 t3 | t0 t1 t2 t3] (one 128-bit half per half
 *     block), and two blocks' folds are completed into [block b: t0..t3 |
 *     block b+1: t0..t3] with vpblendd + vperm2i128 + add. So each lane is
 *     one exact integer block dot and the float stage (cvt, scale multiply,
 *     FMA) runs once per 8 dots. For Q4 on AVX2 all of that runs on the
 *     int16 vpmaddubsw output (|pair| <= 2*15*127; a block's half sums stay
 *     below 2^15), and a single vpmaddwd per 8 dots widens it.
 *   - Decode (T = 1) is 4 rows x 1 token, folding 8 consecutive blocks the
 *     same way (lanes are blocks: scales load as 8 contiguous fp16 and 8
 *     contiguous floats). Batches under 4 tokens run as decode; 1 to 3
 *     left-over tokens form a padded group.
 *   - Q4's (q - 8) offset is applied as 8 * sum(a) per block in int32, from
 *     the sums pi2_k_act_quantize writes. Q8 on AVX2 uses the sign trick
 *     (|w| unsigned x sign(a, w)); on VNNI it multiplies (w + 128) unsigned
 *     by a and subtracts 128 * sum(a), so no per-token sign operation.
 *   - Per (token group, block pair) scale and offset vectors are gathered
 *     into a stack table (k_tok4) per chunk of K_MC blocks and batch of
 *     token groups (the table stays at 32 KiB), and each chunk's partial
 *     dot is added into out. Rows and tokens past the end of a tile repeat
 *     the last valid row/token and their results are dropped.
 *   - Two rows are interleaved statement by statement: each row's block is
 *     a ~25-cycle dependency chain, and one row at a time in program order
 *     fills the out-of-order window with waiting instructions.
 * Every float sum follows the fixed orders (internal.h, K_MC; kernels.h,
 * Numerics): t1 accumulates a block's stripe in its lane (two vectors of
 * 8 stripes) and sums the stripes in k_tree16's tree; t4 (4+ tokens) runs
 * each (row, token) as one chain over the blocks in order, the two blocks
 * of a vector one after the other into a 128-bit accumulator per row
 * (lane = token), and a 4k+1-th token goes in a padded group rather than
 * alone through t1, whose order is the other one. */
#include "runtime/kernels/internal.h"

/* One Q4 or Q8 row (payload p, scales s) against one token's nb blocks
 * in the fixed order (internal.h, K_MC; batch: one chain per chunk): the
 * sum every path gives. */
static float dot_fixed(pi2_qtype wt, const uint8_t *p, const uint16_t *s, const float *as, const int8_t *a, int64_t nb,
                       bool batch)
{
    float total = 0.0f;
    for (int64_t b0 = 0; b0 < nb; b0 += K_MC) {
        float x[16] = {0};
        int stripes = batch ? 1 : 16;
        for (int64_t b = b0; b < min64(b0 + K_MC, nb); b++) {
            const int8_t *ab = a + b * QG;
            int32_t d = 0;
            if (wt == PI2_QT_Q4) {
                const uint8_t *pb = p + b * PI2_Q4_GROUP_BYTES;
                for (int j = 0; j < 16; j++)
                    d += ((pb[j] & 0x0f) - 8) * ab[j] + ((pb[j] >> 4) - 8) * ab[j + 16];
            } else {
                const uint8_t *pb = p + b * PI2_Q8_GROUP_BYTES;
                for (int j = 0; j < QG; j++)
                    d += (int8_t)pb[j] * ab[j];
            }
            x[b % stripes] = fmaf((float)d, pi2_f16_to_f32(s[b]) * as[b], x[b % stripes]);
        }
        total += batch ? x[0] : k_tree16(x);
    }
    return total;
}

static void matmul_scalar(pi2_qtype wt, int64_t n, int nrows, const uint8_t *const *wp, const uint16_t *const *ws,
                          const float *ascales, const int8_t *aq, int T, float *out, int64_t ldo)
{
    int64_t nb = n / QG;
    for (int t = 0; t < T; t++)
        for (int r = 0; r < nrows; r++)
            out[t * ldo + r] = wt == PI2_QT_F32
                                   ? pi2_q_dot_q8act_scalar(wt, ws[r], wp[r], ascales + t * nb, aq + t * n, n)
                                   : dot_fixed(wt, wp[r], ws[r], ascales + t * nb, aq + t * n, nb, T >= K_BATCH_T);
}

#ifdef PI2_K_X86

enum {
    K_PREP_CAP = 512, /* k_tok4 entries on the stack: 32 KiB */
    K_CHUNK_MAX = K_MC /* blocks per chunk (4-row tables: scales 4 KiB, nibbles 8 KiB) */
};

/* Per-(weight block, activation block) products for the tiles below, as
 * 32-bit lanes [e0 e1 e2 e3 | e4 e5 e6 e7] (ei: the sum over bytes 4i..4i+3)
 * that the tiles fold with unpack + add (ADDP) and finish (FIN):
 *   AVX2 Q4  vpmaddubsw of nibbles u and a: int16 pairs (|pair| <= 2*15*127),
 *            folded as int16 and widened once by vpmaddwd(1) (FIN);
 *   AVX2 Q8  |w| x sign(a, w) (pairs <= 2*128*127 cannot saturate), widened
 *            per product;
 *   (VNNI takes the 512-bit paths below.) */
PI2_T_AVX2 static inline __m256i prod_q8_avx2(__m256i w, __m256i a)
{
    __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

PI2_T_AVX2 static inline __m256i fin_madd1(__m256i x) { return _mm256_madd_epi16(x, _mm256_set1_epi16(1)); }
PI2_T_AVX2 static inline __m256i fin_id(__m256i x) { return x; }

/* ---- matmul tiles ----
 *
 * Products of one row with 4 activation blocks are folded (unpack + add) into
 * [x0 x1 x2 x3 | x0 x1 x2 x3]: lane i of each 128-bit half sums product i's
 * lanes of that half. Two such folds X, Y are then completed (K_PAIR)
 * into [X.lo + X.hi | Y.hi + Y.lo], one vpblendd, one vperm2i128 and one
 * add, so every lane holds one block's exact integer dot (for Q4 on AVX2
 * still as two int16 halves, which FIN adds). The float stage then runs
 * once per 8 (row, block, token) dots.
 *
 * t4: 4 rows x 4 tokens; the pair of blocks (b, b + 1) gives lanes
 *     [b: t0..t3 | b + 1: t0..t3]. w[k]: row k's blocks at the chunk start
 *     (Q4: unpacked nibbles, 32 bytes per block); wsp[k * 8 * kp + 8 * p]:
 *     its scales for pair p as [d_b x4 | d_b+1 x4]; a[j]: token j's int8
 *     activations at the chunk start; pre[p]: the tokens' scales and
 *     offsets for pair p. An odd last block pairs with zeros.
 *     res[k * 4 + j] = the chunk's dot of row k with token j.
 * t1: 4 rows x 1 token, 8 blocks per step (lanes are blocks b..b+7); the
 *     last nb % 8 blocks run once more, read in place with zeros past
 *     them (the bytes of zero-padded copies).
 *     res[k] = the dot of row k. Each step also prefetches the next 4*8
 *     blocks' worth of lines of rows wn[0..4), wn[0] first to its end,
 *     then wn[1], ... (see mm_one_token), and into L2 an equal share per
 *     step of [pf2, pf2 + pf2_len) (the caller's range, pi2_k_matmul_pf). */

#define K_PAIR(x, y, ADDP) ADDP(_mm256_blend_epi32((x), (y), 0xf0), _mm256_permute2x128_si256((x), (y), 0x21))

/* Rows kx, ky of t4 (interleaved) against the 4 tokens' block blk: folds
 * into vx, vy. */
#define K_T4_BLOCK(vx, vy, kx, ky, blk, LOADW, PROD, ADDP, GB)                                          \
    do {                                                                                               \
        __m256i a0_ = ld256(a[0] + (blk) * QG), a1_ = ld256(a[1] + (blk) * QG);                        \
        __m256i ux_ = LOADW(w[kx] + (blk) * (GB)), uy_ = LOADW(w[ky] + (blk) * (GB));                  \
        __m256i px0_ = PROD(ux_, a0_), py0_ = PROD(uy_, a0_), px1_ = PROD(ux_, a1_), py1_ = PROD(uy_, a1_); \
        __m256i sx01_ = ADDP(_mm256_unpacklo_epi32(px0_, px1_), _mm256_unpackhi_epi32(px0_, px1_));    \
        __m256i sy01_ = ADDP(_mm256_unpacklo_epi32(py0_, py1_), _mm256_unpackhi_epi32(py0_, py1_));    \
        __m256i a2_ = ld256(a[2] + (blk) * QG), a3_ = ld256(a[3] + (blk) * QG);                        \
        __m256i px2_ = PROD(ux_, a2_), py2_ = PROD(uy_, a2_), px3_ = PROD(ux_, a3_), py3_ = PROD(uy_, a3_); \
        __m256i sx23_ = ADDP(_mm256_unpacklo_epi32(px2_, px3_), _mm256_unpackhi_epi32(px2_, px3_));    \
        __m256i sy23_ = ADDP(_mm256_unpacklo_epi32(py2_, py3_), _mm256_unpackhi_epi32(py2_, py3_));    \
        vx = ADDP(_mm256_unpacklo_epi64(sx01_, sx23_), _mm256_unpackhi_epi64(sx01_, sx23_));           \
        vy = ADDP(_mm256_unpacklo_epi64(sy01_, sy23_), _mm256_unpackhi_epi64(sy01_, sy23_));           \
    } while (0)

/* Rows kx, ky against pair p (blocks 2p and, if TWO, 2p + 1). */
#define K_T4_ROWS(accx, accy, kx, ky, p, TWO, LOADW, PROD, ADDP, FIN, GB, CORR)                        \
    do {                                                                                               \
        __m256i xb_, yb_, xc_ = _mm256_setzero_si256(), yc_ = xc_;                                     \
        K_T4_BLOCK(xb_, yb_, kx, ky, 2 * (p), LOADW, PROD, ADDP, GB);                                  \
        if (TWO)                                                                                       \
            K_T4_BLOCK(xc_, yc_, kx, ky, 2 * (p) + 1, LOADW, PROD, ADDP, GB);                          \
        __m256i dx_ = FIN(K_PAIR(xb_, xc_, ADDP)), dy_ = FIN(K_PAIR(yb_, yc_, ADDP));                  \
        if (CORR) {                                                                                    \
            __m256i c_ = ld256(pre[p].corr);                                                           \
            dx_ = _mm256_sub_epi32(dx_, c_);                                                           \
            dy_ = _mm256_sub_epi32(dy_, c_);                                                           \
        }                                                                                              \
        __m256 as_ = _mm256_loadu_ps(pre[p].as);                                                       \
        __m256 sx_ = _mm256_mul_ps(_mm256_loadu_ps(wsp + (kx) * 8 * kp + 8 * (p)), as_);               \
        __m256 sy_ = _mm256_mul_ps(_mm256_loadu_ps(wsp + (ky) * 8 * kp + 8 * (p)), as_);               \
        __m256 fx_ = _mm256_cvtepi32_ps(dx_), fy_ = _mm256_cvtepi32_ps(dy_);                           \
        accx = _mm_fmadd_ps(_mm256_castps256_ps128(fx_), _mm256_castps256_ps128(sx_), accx);           \
        accy = _mm_fmadd_ps(_mm256_castps256_ps128(fy_), _mm256_castps256_ps128(sy_), accy);           \
        if (TWO) {                                                                                     \
            accx = _mm_fmadd_ps(_mm256_extractf128_ps(fx_, 1), _mm256_extractf128_ps(sx_, 1), accx);   \
            accy = _mm_fmadd_ps(_mm256_extractf128_ps(fy_, 1), _mm256_extractf128_ps(sy_, 1), accy);   \
        }                                                                                              \
    } while (0)

/* The batch order (kernels.h, Numerics): per row and token one FMA chain
 * over the chunk's blocks in order, block 2p's lanes then block 2p + 1's
 * (128-bit accumulators, lane = token). */
#define K_DEF_T4(name, TGT, LOADW, PROD, ADDP, FIN, GB, CORR)                                                     \
    TGT static void name(const uint8_t *const w[4], const float *wsp, int64_t kb, const int8_t *const a[4],      \
                         const k_tok4 *pre, float res[16])                                                       \
    {                                                                                                            \
        __m128 acc0 = _mm_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;                                   \
        int64_t kp = (kb + 1) / 2, p = 0;                                                                        \
        for (; p < kb / 2; p++) {                                                                                \
            K_T4_ROWS(acc0, acc1, 0, 1, p, 1, LOADW, PROD, ADDP, FIN, GB, CORR);                                 \
            K_T4_ROWS(acc2, acc3, 2, 3, p, 1, LOADW, PROD, ADDP, FIN, GB, CORR);                                 \
        }                                                                                                        \
        if (p < kp) {                                                                                            \
            K_T4_ROWS(acc0, acc1, 0, 1, p, 0, LOADW, PROD, ADDP, FIN, GB, CORR);                                 \
            K_T4_ROWS(acc2, acc3, 2, 3, p, 0, LOADW, PROD, ADDP, FIN, GB, CORR);                                 \
        }                                                                                                        \
        _mm_storeu_ps(res, acc0);                                                                                \
        _mm_storeu_ps(res + 4, acc1);                                                                            \
        _mm_storeu_ps(res + 8, acc2);                                                                            \
        _mm_storeu_ps(res + 12, acc3);                                                                           \
    }

/* Rows x, y of t1 against 4 blocks (activations at ab, the step's blocks
 * q .. q + 3): folds into vx, vy. A block past the row's last (a tail,
 * m_ blocks: K_T1_HAS(q + i) false) is loaded as zeros, the bytes of a
 * zero-padded copy, which contribute 0 * 0. */
#define K_T1_ALL(i) 1
#define K_T1_TAIL(i) ((i) < m_)
#define K_T1_LD(HAS, i, ld) ((HAS(i)) ? (ld) : _mm256_setzero_si256())
#define K_T1_QUAD(vx, vy, wx, wy, ab, LOADW, PROD, ADDP, GB, HAS, q)                                     \
    do {                                                                                               \
        __m256i a0_ = K_T1_LD(HAS, (q), ld256((ab))), a1_ = K_T1_LD(HAS, (q) + 1, ld256((ab) + QG));    \
        __m256i a2_ = K_T1_LD(HAS, (q) + 2, ld256((ab) + 2 * QG));                                     \
        __m256i a3_ = K_T1_LD(HAS, (q) + 3, ld256((ab) + 3 * QG));                                     \
        __m256i wx0_ = K_T1_LD(HAS, (q), LOADW((wx))), wy0_ = K_T1_LD(HAS, (q), LOADW((wy)));          \
        __m256i wx1_ = K_T1_LD(HAS, (q) + 1, LOADW((wx) + (GB))), wy1_ = K_T1_LD(HAS, (q) + 1, LOADW((wy) + (GB))); \
        __m256i wx2_ = K_T1_LD(HAS, (q) + 2, LOADW((wx) + 2 * (GB)));                                  \
        __m256i wy2_ = K_T1_LD(HAS, (q) + 2, LOADW((wy) + 2 * (GB)));                                  \
        __m256i wx3_ = K_T1_LD(HAS, (q) + 3, LOADW((wx) + 3 * (GB)));                                  \
        __m256i wy3_ = K_T1_LD(HAS, (q) + 3, LOADW((wy) + 3 * (GB)));                                  \
        __m256i px0_ = PROD(wx0_, a0_), py0_ = PROD(wy0_, a0_);                                        \
        __m256i px1_ = PROD(wx1_, a1_), py1_ = PROD(wy1_, a1_);                                        \
        __m256i sx01_ = ADDP(_mm256_unpacklo_epi32(px0_, px1_), _mm256_unpackhi_epi32(px0_, px1_));    \
        __m256i sy01_ = ADDP(_mm256_unpacklo_epi32(py0_, py1_), _mm256_unpackhi_epi32(py0_, py1_));    \
        __m256i px2_ = PROD(wx2_, a2_), py2_ = PROD(wy2_, a2_);                                        \
        __m256i px3_ = PROD(wx3_, a3_), py3_ = PROD(wy3_, a3_);                                        \
        __m256i sx23_ = ADDP(_mm256_unpacklo_epi32(px2_, px3_), _mm256_unpackhi_epi32(px2_, px3_));    \
        __m256i sy23_ = ADDP(_mm256_unpacklo_epi32(py2_, py3_), _mm256_unpackhi_epi32(py2_, py3_));    \
        vx = ADDP(_mm256_unpacklo_epi64(sx01_, sx23_), _mm256_unpackhi_epi64(sx01_, sx23_));           \
        vy = ADDP(_mm256_unpacklo_epi64(sy01_, sy23_), _mm256_unpackhi_epi64(sy01_, sy23_));           \
    } while (0)

/* Rows x, y of t1 against 8 blocks: weights at wx, wy, fp16 scales at sx,
 * sy; activations at ab, their scales asv and offsets corr (registers). */
#define K_T1_ROWS(accx, accy, wx, wy, sx, sy, ab, LOADW, PROD, ADDP, FIN, GB, CSH, HAS)                \
    do {                                                                                               \
        __m256i xa_, ya_, xb_, yb_;                                                                    \
        K_T1_QUAD(xa_, ya_, (wx), (wy), (ab), LOADW, PROD, ADDP, GB, HAS, 0);                          \
        K_T1_QUAD(xb_, yb_, (wx) + 4 * (GB), (wy) + 4 * (GB), (ab) + 4 * QG, LOADW, PROD, ADDP, GB, HAS, 4); \
        __m256i dx_ = FIN(K_PAIR(xa_, xb_, ADDP)), dy_ = FIN(K_PAIR(ya_, yb_, ADDP));                  \
        if ((CSH) > 0) {                                                                               \
            dx_ = _mm256_sub_epi32(dx_, corr);                                                         \
            dy_ = _mm256_sub_epi32(dy_, corr);                                                         \
        }                                                                                              \
        __m256 sx_ = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(sx)));            \
        __m256 sy_ = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(sy)));            \
        accx = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dx_), _mm256_mul_ps(sx_, asv), accx);                \
        accy = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dy_), _mm256_mul_ps(sy_, asv), accy);                \
    } while (0)

/* The 8-block step for all 4 rows: activations at ab, scales at asb, sums
 * at sb; rows wq_k, scales sq_k. */
#define K_T1_STEP_(A0, A1, A2, A3, ab, asb, sb, wq0, wq1, wq2, wq3, sq0, sq1, sq2, sq3, LOADW, PROD, ADDP, FIN, GB, \
                   CSH, HAS)                                                                                   \
    do {                                                                                                       \
        __m256 asv = _mm256_loadu_ps((asb));                                                                   \
        __m256i corr = _mm256_slli_epi32(ld256((sb)), (CSH));                                                  \
        K_T1_ROWS(A0, A1, wq0, wq1, sq0, sq1, ab, LOADW, PROD, ADDP, FIN, GB, CSH, HAS);                       \
        K_T1_ROWS(A2, A3, wq2, wq3, sq2, sq3, ab, LOADW, PROD, ADDP, FIN, GB, CSH, HAS);                       \
    } while (0)
/* Blocks b .. b + 7 are stripes 0-7 (acc) or 8-15 (hcc) of the fixed
 * order (internal.h, K_MC), as b % 16 is 0 or 8. */
#define K_T1_STEP(b, ...)                                                                                      \
    do {                                                                                                       \
        if ((b) % 16 == 0)                                                                                     \
            K_T1_STEP_(acc0, acc1, acc2, acc3, __VA_ARGS__);                                                   \
        else                                                                                                   \
            K_T1_STEP_(hcc0, hcc1, hcc2, hcc3, __VA_ARGS__);                                                   \
    } while (0)
/* At block b, a chunk boundary past the first: the chunk's sums join the
 * rows' totals, the stripes start again from +0. */
#define K_T1_CHUNK(b)                                                                                          \
    do {                                                                                                       \
        if ((b) > 0 && (b) % K_MC == 0) {                                                                      \
            r0_ += k_sum8(_mm256_add_ps(acc0, hcc0));                                                          \
            r1_ += k_sum8(_mm256_add_ps(acc1, hcc1));                                                          \
            r2_ += k_sum8(_mm256_add_ps(acc2, hcc2));                                                          \
            r3_ += k_sum8(_mm256_add_ps(acc3, hcc3));                                                          \
            acc0 = acc1 = acc2 = acc3 = hcc0 = hcc1 = hcc2 = hcc3 = _mm256_setzero_ps();                       \
        }                                                                                                      \
    } while (0)

/* A tail's m (< 8) activation scales, sums and the 4 rows' weight scales
 * from block b on, into zeroed 8-entry copies (the loads of a step take 8). */
static inline void k_tail_scales(int m, const float *as, const int32_t *sums, const uint16_t *const s[4], int64_t b,
                                 float tas[8], int32_t tsum[8], uint16_t tsc[4][8])
{
    for (int j = 0; j < m; j++) {
        tas[j] = as[b + j];
        tsum[j] = sums[b + j];
        for (int k = 0; k < 4; k++)
            tsc[k][j] = s[k][b + j];
    }
}

#define K_DEF_T1(name, TGT, LOADW, PROD, ADDP, FIN, GB, CSH)                                                      \
    TGT static void name(const uint8_t *const w[4], const uint16_t *const s[4], int64_t nb, const int8_t *a,     \
                         const float *as, const int32_t *sums, const uint8_t *const wn[4], const uint8_t *pf2,    \
                         int64_t pf2_len, float res[4])                                                          \
    {                                                                                                            \
        __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;                                \
        __m256 hcc0 = acc0, hcc1 = acc0, hcc2 = acc0, hcc3 = acc0;                                               \
        float r0_ = 0.0f, r1_ = 0.0f, r2_ = 0.0f, r3_ = 0.0f; /* the chunks so far */                         \
        int64_t b = 0, rb_ = nb * (GB), po_ = 0, o2_ = 0, q2_ = k_pf_quota(pf2_len, nb / 8);                     \
        int pk_ = wn ? 0 : 4; /* NULL: no paced prefetch */                                                      \
        for (; b + 8 <= nb; b += 8) {                                                                            \
            K_T1_CHUNK(b);                                                                                       \
            for (int64_t e_ = o2_ + q2_ < pf2_len ? o2_ + q2_ : pf2_len; o2_ < e_; o2_ += 64)                    \
                _mm_prefetch((const char *)(pf2 + o2_), _MM_HINT_T1);                                            \
            for (int l_ = 0; l_ < 32 * (GB) && pk_ < 4; l_ += 64) {                                              \
                _mm_prefetch((const char *)(wn[pk_] + po_), _MM_HINT_T0);                                        \
                po_ += 64;                                                                                       \
                if (po_ >= rb_) {                                                                                \
                    po_ = 0;                                                                                     \
                    pk_++;                                                                                       \
                }                                                                                                \
            }                                                                                                    \
            K_T1_STEP(b, a + b * QG, as + b, sums + b, w[0] + b * (GB), w[1] + b * (GB), w[2] + b * (GB),         \
                      w[3] + b * (GB), s[0] + b, s[1] + b, s[2] + b, s[3] + b, LOADW, PROD, ADDP, FIN, GB, CSH,   \
                      K_T1_ALL);                                                                                 \
        }                                                                                                        \
        if (b < nb) { /* 1..7 blocks left: read in place, zeros past them (K_T1_QUAD) */                         \
            K_T1_CHUNK(b);                                                                                       \
            int m_ = (int)(nb - b);                                                                              \
            float tas[8] = {0};                                                                                  \
            int32_t tsum[8] = {0};                                                                               \
            uint16_t tsc[4][8] = {{0}};                                                                          \
            k_tail_scales(m_, as, sums, s, b, tas, tsum, tsc);                                           \
            K_T1_STEP(b, a + b * QG, tas, tsum, w[0] + b * (GB), w[1] + b * (GB), w[2] + b * (GB),                \
                      w[3] + b * (GB), tsc[0], tsc[1], tsc[2], tsc[3], LOADW, PROD, ADDP, FIN, GB, CSH, K_T1_TAIL); \
        }                                                                                                        \
        res[0] = r0_ + k_sum8(_mm256_add_ps(acc0, hcc0));                                                        \
        res[1] = r1_ + k_sum8(_mm256_add_ps(acc1, hcc1));                                                        \
        res[2] = r2_ + k_sum8(_mm256_add_ps(acc2, hcc2));                                                        \
        res[3] = r3_ + k_sum8(_mm256_add_ps(acc3, hcc3));                                                        \
    }

/* Offsets (see the products above): Q4 subtracts 8 * sum(a) (t1 shift 3),
 * VNNI Q8 128 * sum(a) (shift 7), AVX2 Q8 nothing. t4's Q4 tiles read
 * nibbles unpacked by q4_unpack_rows (32 bytes per block). */
K_DEF_T4(mm_t4_q4_avx2, PI2_T_AVX2, ld256, _mm256_maddubs_epi16, _mm256_add_epi16, fin_madd1, QG, 1)
K_DEF_T4(mm_t4_q4raw_avx2, PI2_T_AVX2, q4_nibbles, _mm256_maddubs_epi16, _mm256_add_epi16, fin_madd1,
         PI2_Q4_GROUP_BYTES, 1)
K_DEF_T4(mm_t4_q8_avx2, PI2_T_AVX2, ld256, prod_q8_avx2, _mm256_add_epi32, fin_id, PI2_Q8_GROUP_BYTES, 0)
K_DEF_T1(mm_t1_q4_avx2, PI2_T_AVX2, q4_nibbles, _mm256_maddubs_epi16, _mm256_add_epi16, fin_madd1,
         PI2_Q4_GROUP_BYTES, 3)
K_DEF_T1(mm_t1_q8_avx2, PI2_T_AVX2, ld256, prod_q8_avx2, _mm256_add_epi32, fin_id, PI2_Q8_GROUP_BYTES, 0)

/* ---- AVX2 Q4, one token, on split activations ----
 *
 * t1 above takes a Q4 block's nibbles by a broadcast load, a shift and a
 * mask, and folds products of 32-value blocks: ~0.45 instructions per
 * weight byte, below the read bandwidth of one core (runtime/PERF.md).
 * Here one 32-byte load is two blocks of a row: its low nibbles are the
 * blocks' elements 0-15, its high nibbles 16-31, against activations
 * split once per call as the AVX-512 kernels take them (k_split_a's
 * layout: per 4 blocks their elements 0-15, then 16-31). A pair's two
 * vpmaddubsw are added in int16 (4 products a lane), and 4 pairs fold
 * (unpack + add, still int16: 16 products of at most 15 * 127) into one
 * vector of the 8 blocks' dots in the order [0 2 4 6 | 1 3 5 7], which
 * one vpmaddwd widens and one vpermd puts in block order. The float stage
 * is t1's, so lane L of acc (hcc) is stripe L (L + 8) of the fixed order:
 * the same bits as every other path. */
#define K_Q4P_AVX2(x, alo, ahi)                                                                           \
    _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_and_si256((x), m4), (alo)),                             \
                     _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16((x), 4), m4), (ahi)))

/* Row at wq (8 blocks, 128 bytes), split activations at sa: the 8 dots in
 * block order, less the offsets corr. The loads are the set M: ALL, or
 * MASK for a row's last 1..7 blocks: the row's weights masked to its m_
 * blocks by wm_, the activations' second group of 4 blocks only when
 * there is one (k_split_a zero-pads the last); the rest read as zero, the
 * bytes of a step over zero-padded copies. */
#define K_T1S_LDW_ALL(p, j) ld256((p) + 32 * (j))
#define K_T1S_LDA_ALL(p, o) ld256((p) + (o))
#define K_T1S_LDW_MASK(p, j) _mm256_maskload_epi32((const int *)(const void *)((p) + 32 * (j)), wm_[j])
#define K_T1S_LDA_MASK(p, o) ((o) < 128 || m_ > 4 ? ld256((p) + (o)) : _mm256_setzero_si256())
#define K_T1S_DOTS(d, wq, sa, M)                                                                          \
    do {                                                                                                  \
        __m256i x0_ = K_Q4P_AVX2(K_T1S_LDW_##M(wq, 0), K_T1S_LDA_##M(sa, 0), K_T1S_LDA_##M(sa, 64));       \
        __m256i x1_ = K_Q4P_AVX2(K_T1S_LDW_##M(wq, 1), K_T1S_LDA_##M(sa, 32), K_T1S_LDA_##M(sa, 96));      \
        __m256i x2_ = K_Q4P_AVX2(K_T1S_LDW_##M(wq, 2), K_T1S_LDA_##M(sa, 128), K_T1S_LDA_##M(sa, 192));    \
        __m256i x3_ = K_Q4P_AVX2(K_T1S_LDW_##M(wq, 3), K_T1S_LDA_##M(sa, 160), K_T1S_LDA_##M(sa, 224));    \
        __m256i u01_ = _mm256_add_epi16(_mm256_unpacklo_epi32(x0_, x1_), _mm256_unpackhi_epi32(x0_, x1_)); \
        __m256i u23_ = _mm256_add_epi16(_mm256_unpacklo_epi32(x2_, x3_), _mm256_unpackhi_epi32(x2_, x3_)); \
        __m256i v_ = _mm256_add_epi16(_mm256_unpacklo_epi64(u01_, u23_), _mm256_unpackhi_epi64(u01_, u23_)); \
        d = _mm256_sub_epi32(_mm256_permutevar8x32_epi32(_mm256_madd_epi16(v_, ones), ord), corr);        \
    } while (0)

#define K_T1S_ROW(acc, wq, sq, sa, M)                                                                     \
    do {                                                                                                  \
        __m256i d_;                                                                                       \
        K_T1S_DOTS(d_, wq, sa, M);                                                                        \
        __m256 s_ = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(sq)));                \
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d_), _mm256_mul_ps(s_, asv), acc);                       \
    } while (0)

/* Blocks b .. b + 7 of the 4 rows (split activations at sa). */
#define K_T1S_STEP(A0, A1, A2, A3, M, sa, asb, sb, w0, w1, w2, w3, s0, s1, s2, s3)                        \
    do {                                                                                                  \
        __m256 asv = _mm256_loadu_ps(asb);                                                                \
        __m256i corr = _mm256_slli_epi32(ld256(sb), 3);                                                   \
        K_T1S_ROW(A0, w0, s0, sa, M);                                                                     \
        K_T1S_ROW(A1, w1, s1, sa, M);                                                                     \
        K_T1S_ROW(A2, w2, s2, sa, M);                                                                     \
        K_T1S_ROW(A3, w3, s3, sa, M);                                                                     \
    } while (0)
#define K_T1S_STEP16(b, ...)                                                                              \
    do {                                                                                                  \
        if ((b) % 16 == 0)                                                                                \
            K_T1S_STEP(acc0, acc1, acc2, acc3, __VA_ARGS__);                                              \
        else                                                                                              \
            K_T1S_STEP(hcc0, hcc1, hcc2, hcc3, __VA_ARGS__);                                              \
    } while (0)

/* t1 (k_t1_fn) on split activations a; the prefetches as t1's. */
PI2_T_AVX2 static void mm_t1s_q4_avx2(const uint8_t *const w[4], const uint16_t *const s[4], int64_t nb,
                                      const int8_t *a, const float *as, const int32_t *sums,
                                      const uint8_t *const wn[4], const uint8_t *pf2, int64_t pf2_len, float res[4])
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    const __m256i ord = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    __m256 hcc0 = acc0, hcc1 = acc0, hcc2 = acc0, hcc3 = acc0;
    float r0_ = 0.0f, r1_ = 0.0f, r2_ = 0.0f, r3_ = 0.0f; /* the chunks so far */
    int64_t b = 0, rb_ = nb * PI2_Q4_GROUP_BYTES, po_ = 0, o2_ = 0, q2_ = k_pf_quota(pf2_len, nb / 8);
    int pk_ = wn ? 0 : 4; /* NULL: no paced prefetch */
    for (; b + 8 <= nb; b += 8) {
        K_T1_CHUNK(b);
        for (int64_t e_ = o2_ + q2_ < pf2_len ? o2_ + q2_ : pf2_len; o2_ < e_; o2_ += 64)
            _mm_prefetch((const char *)(pf2 + o2_), _MM_HINT_T1);
        for (int l_ = 0; l_ < 8 * PI2_Q4_GROUP_BYTES * 4 && pk_ < 4; l_ += 64) {
            _mm_prefetch((const char *)(wn[pk_] + po_), _MM_HINT_T0);
            po_ += 64;
            if (po_ >= rb_) {
                po_ = 0;
                pk_++;
            }
        }
        int64_t o = b * PI2_Q4_GROUP_BYTES;
        K_T1S_STEP16(b, ALL, a + b * QG, as + b, sums + b, w[0] + o, w[1] + o, w[2] + o, w[3] + o, s[0] + b,
                     s[1] + b, s[2] + b, s[3] + b);
    }
    if (b < nb) { /* 1..7 blocks left: the weights' loads masked to them, zeros past them contribute 0 * 0 */
        K_T1_CHUNK(b);
        int m_ = (int)(nb - b);
        float tas[8] = {0};
        int32_t tsum[8] = {0};
        uint16_t tsc[4][8] = {{0}};
        k_tail_scales(m_, as, sums, s, b, tas, tsum, tsc);
        __m256i wm_[4];
        for (int j = 0; j < 4; j++) { /* dwords of the 32-byte piece j within the m_ * 16 bytes */
            int left = (m_ * PI2_Q4_GROUP_BYTES - 32 * j) / 4;
            wm_[j] = _mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        }
        int64_t o = b * PI2_Q4_GROUP_BYTES;
        K_T1S_STEP16(b, MASK, a + b * QG, tas, tsum, w[0] + o, w[1] + o, w[2] + o, w[3] + o, tsc[0], tsc[1], tsc[2],
                     tsc[3]);
    }
    res[0] = r0_ + k_sum8(_mm256_add_ps(acc0, hcc0));
    res[1] = r1_ + k_sum8(_mm256_add_ps(acc1, hcc1));
    res[2] = r2_ + k_sum8(_mm256_add_ps(acc2, hcc2));
    res[3] = r3_ + k_sum8(_mm256_add_ps(acc3, hcc3));
}

/* dst = a's n / 32 blocks split per 4 (the last group zero-padded): their
 * elements 0-15, then 16-31; the layout of k_split_a (matmul_avx512.c). */
PI2_T_AVX2 static void k_split_a_avx2(const int8_t *a, int64_t nb, int8_t *dst)
{
    for (int64_t b = 0; b < nb; b += 4) {
        _Alignas(32) int8_t t[4 * QG] = {0};
        const int8_t *src = a + b * QG;
        if (b + 4 > nb) {
            memcpy(t, src, (size_t)(nb - b) * QG);
            src = t;
        }
        for (int j = 0; j < 2; j++) {
            __m256i y0 = ld256(src + 2 * j * QG), y1 = ld256(src + (2 * j + 1) * QG);
            _mm256_storeu_si256((__m256i *)(void *)(dst + b * QG + 32 * j), _mm256_permute2x128_si256(y0, y1, 0x20));
            _mm256_storeu_si256((__m256i *)(void *)(dst + b * QG + 64 + 32 * j),
                                _mm256_permute2x128_si256(y0, y1, 0x31));
        }
    }
}

enum { K_SPLIT_MAX = 8192 }; /* values of a split activation copy (stack) */

/* dst[b * 32 ..] = the nibbles of Q4 block b of p, b < kb: a row tile is
 * unpacked once per chunk and then read by every token group. */
PI2_T_AVX2 static void q4_unpack_rows(const uint8_t *p, int64_t kb, uint8_t *dst)
{
    for (int64_t b = 0; b < kb; b++)
        _mm256_storeu_si256((__m256i *)(void *)(dst + b * QG), q4_nibbles(p + b * PI2_Q4_GROUP_BYTES));
}

/* dst[8p .. 8p + 8) = [d_2p x4 | d_2p+1 x4] for the fp16 scales h[0..kb)
 * (d_kb = 0 when kb is odd). */
PI2_T_AVX2 static void pair_scales(const uint16_t *h, int64_t kb, float *dst)
{
    int64_t b = 0;
    for (; b + 8 <= kb; b += 8) {
        __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(h + b)));
        for (int k = 0; k < 4; k++) {
            __m256i idx = _mm256_set_epi32(2 * k + 1, 2 * k + 1, 2 * k + 1, 2 * k + 1, 2 * k, 2 * k, 2 * k, 2 * k);
            _mm256_storeu_ps(dst + 4 * b + 8 * k, _mm256_permutevar8x32_ps(d, idx));
        }
    }
    for (; b < kb; b += 2) {
        float lo = _cvtsh_ss(h[b]), hi = b + 1 < kb ? _cvtsh_ss(h[b + 1]) : 0.0f;
        _mm256_storeu_ps(dst + 4 * b, _mm256_set_m128(_mm_set1_ps(hi), _mm_set1_ps(lo)));
    }
}

/* Rows [0, nrows) against one token: out[r] (stride 1). Decode streams
 * the weights once: while a row tile computes, t1 prefetches the next
 * tile's rows at the same pace (the hardware prefetcher alone left the
 * 4 interleaved row streams at a third of the read bandwidth), one row
 * after the other rather than interleaved like the loads: an ascending
 * stream of lines lets the L2 streamer run ahead of the software
 * prefetches. */
static void mm_one_token(const k_mm_ops *op, int64_t nb, int nrows, const uint8_t *const *wp,
                         const uint16_t *const *ws, const float *as, const int8_t *a, const int32_t *sums, float *out,
                         const uint8_t *pf, int64_t pf_len)
{
    if (nb < 16 && op->t1short) {
        (op->t1shortg && pi2_ki_gfni() ? op->t1shortg : op->t1short)(nb, nrows, wp, ws, as, a, sums, out, pf, pf_len);
        return;
    }
    int64_t tiles = (nrows + 3) / 4;
    /* the activations rearranged once for all the rows (up to a stack
     * buffer's worth; rows of more values take t1) */
    _Alignas(64) int8_t split[K_SPLIT_MAX];
    k_t1_fn t1 = op->t1;
    if (op->t1s && nb * QG <= K_SPLIT_MAX) {
        op->split(a, nb, split);
        a = split;
        t1 = op->t1sg && pi2_ki_gfni() ? op->t1sg : op->t1s;
    }
    /* A caller's range that starts right where the last row ends (the
     * next unit of rows of one matrix; not a bundle's next chunk, which
     * the down pass reads too) goes on with the tiles' own stream: the last
     * tile prefetches its first rows as it would a next tile's, ascending,
     * and the next call the rest. Spread over the tiles as T1 prefetches
     * of a whole unit ahead, it slowed rows from memory by a fifth on Zen
     * (runtime/PERF.md; likely as AMD cores fill L1 on every hint and the
     * lines a unit ahead evict the tile's). */
    int64_t rb = nb * op->gb;
    bool cont = pf && pf == wp[nrows - 1] + rb;
    for (int r0 = 0; r0 < nrows; r0 += 4) {
        const uint8_t *w[4], *wn[4];
        const uint16_t *s[4];
        /* this tile and the next close together and ascending (a
         * matrix's rows, every gate row of a bundle: gaps of a few rows),
         * or gathered (the predicted neurons) */
        bool seq = true;
        for (int k = 0; k < 4; k++) {
            int r = r0 + k < nrows ? r0 + k : nrows - 1, rn = r0 + 4 + k < nrows ? r0 + 4 + k : nrows - 1;
            int64_t past = r0 + 4 + k - nrows; /* rows into the caller's range */
            w[k] = wp[r];
            s[k] = ws[r];
            wn[k] = cont && past >= 0 && (past + 1) * rb <= pf_len ? pf + past * rb : wp[rn];
        }
        for (int r = r0; r + 1 < nrows && r < r0 + 7; r++) {
            uintptr_t gap = (uintptr_t)wp[r + 1] - (uintptr_t)wp[r]; /* wraps when descending */
            seq = seq && gap <= (uintptr_t)(4 * nb * op->gb);
        }
        /* Gathered rows (the predicted neurons' gate and up rows) take the
         * paced prefetch of the next tile's rows too, and the first lines
         * of the rows and scales of the tile after it: each row starts its
         * own stream, so its first miss is what the tile waits for
         * (runtime/PERF.md, "Gathered rows"). */
        if (!seq)
            for (int k = 0; k < 4; k++) {
                int r2 = r0 + 8 + k < nrows ? r0 + 8 + k : nrows - 1;
                _mm_prefetch((const char *)wp[r2], _MM_HINT_T0);
                _mm_prefetch((const char *)ws[r2], _MM_HINT_T0);
            }
        /* this tile's share of the caller's range */
        int64_t p0 = 0, p1 = 0;
        if (!cont)
            k_pf_share(pf_len, r0 / 4, tiles, &p0, &p1);
        float res[4];
        t1(w, s, nb, a, as, sums, wn, pf && !cont ? pf + p0 : NULL, p1 - p0, res);
        for (int k = 0; k < 4 && r0 + k < nrows; k++)
            out[r0 + k] = res[k];
    }
}

/* Token groups [g0, g1) of T tokens (groups of 4, the last repeating
 * token T-1) against every row, blocks [b0, b0 + kb) (one chunk of the
 * fixed order: its sums join out, in chunk order). */
static void mm_groups_chunk(const k_mm_ops *op, int64_t n, int nrows, const uint8_t *const *wp,
                            const uint16_t *const *ws, const float *ascales, const int8_t *aq, const int32_t *asums,
                            int T, float *out, int64_t ldo, int64_t b0, int g0, int g1, bool unpack)
{
    int64_t nb = n / QG, kb = min64(K_MC, nb - b0), kp = (kb + 1) / 2;
    k_t4_fn t4 = op->t4raw && !unpack ? op->t4raw : op->t4;
    k_tok4 pre[K_PREP_CAP];
    float wsp[4 * 4 * K_CHUNK_MAX];
    uint8_t wu[4 * K_CHUNK_MAX * QG];
    for (int g = g0; g < g1; g++)
        for (int j = 0; j < 4; j++) {
            int t = 4 * g + j < T ? 4 * g + j : T - 1;
            for (int64_t b = 0; b < 2 * kp; b++) {
                k_tok4 *e = &pre[(g - g0) * kp + b / 2];
                int i = 4 * (int)(b & 1) + j;
                e->as[i] = b < kb ? ascales[t * nb + b0 + b] : 0.0f;
                e->corr[i] = b < kb ? op->corr * asums[t * nb + b0 + b] : 0;
            }
        }
    for (int r0 = 0; r0 < nrows; r0 += 4) {
        const uint8_t *w[4];
        for (int k = 0; k < 4; k++) {
            int r = r0 + k < nrows ? r0 + k : nrows - 1;
            w[k] = wp[r] + b0 * op->gb;
            if (unpack) {
                q4_unpack_rows(w[k], kb, wu + k * kb * QG);
                w[k] = wu + k * kb * QG;
            }
            pair_scales(ws[r] + b0, kb, wsp + k * 8 * kp);
        }
        for (int g = g0; g < g1; g++) {
            const int8_t *a[4];
            for (int j = 0; j < 4; j++) {
                int t = 4 * g + j < T ? 4 * g + j : T - 1;
                a[j] = aq + t * n + b0 * QG;
            }
            float res[16];
            t4(w, wsp, kb, a, pre + (g - g0) * kp, res);
            for (int k = 0; k < 4 && r0 + k < nrows; k++)
                for (int j = 0; j < 4 && 4 * g + j < T; j++) {
                    float *o = out + (4 * g + j) * ldo + r0 + k;
                    *o = b0 == 0 ? res[4 * k + j] : *o + res[4 * k + j];
                }
        }
    }
}

/* Tokens [0, T) in groups of 4 (T >= 2; the last group repeats token
 * T-1): chunks of K_MC blocks, in them the groups in batches whose
 * tables fit the stack. */
static void mm_groups(const k_mm_ops *op, int64_t n, int nrows, const uint8_t *const *wp, const uint16_t *const *ws,
                      const float *ascales, const int8_t *aq, const int32_t *asums, int T, float *out, int64_t ldo)
{
    int64_t nb = n / QG;
    int ng = (T + 3) / 4, batch = K_PREP_CAP / (K_MC / 2);
    /* Q4: unpack each row tile once when 3+ token groups share it */
    bool unpack = op->t4raw && ng >= 3;
    for (int64_t b0 = 0; b0 < nb; b0 += K_MC)
        for (int g0 = 0; g0 < ng; g0 += batch)
            mm_groups_chunk(op, n, nrows, wp, ws, ascales, aq, asums, T, out, ldo, b0, g0,
                            ng - g0 < batch ? ng : g0 + batch, unpack);
}

static void mm_simd(const k_mm_ops *op, int64_t n, int nrows, const uint8_t *const *wp, const uint16_t *const *ws,
                    const float *ascales, const int8_t *aq, const int32_t *asums, int T, float *out, int64_t ldo,
                    const uint8_t *pf, int64_t pf_len)
{
    int64_t nb = n / QG;
    /* Groups of 4 tokens, the last one padded when 1 to 3 tokens are
     * left; batches under 4 tokens run as decode (the orders differ:
     * kernels.h, Numerics). */
    int grouped = T < K_BATCH_T ? 0 : T;
    if (grouped > 0)
        mm_groups(op, n, nrows, wp, ws, ascales, aq, asums, grouped, out, ldo);
    for (int t = grouped; t < T; t++)
        mm_one_token(op, nb, nrows, wp, ws, ascales + t * nb, aq + t * n, asums + t * nb, out + t * ldo,
                     t == grouped ? pf : NULL, t == grouped ? pf_len : 0);
}

static const k_mm_ops MM_Q4_AVX2 = {mm_t4_q4_avx2,           mm_t4_q4raw_avx2,  mm_t1_q4_avx2,
                                    mm_t1s_q4_avx2,          NULL,              k_split_a_avx2,
                                    8,                       PI2_Q4_GROUP_BYTES, pi2_ki_mm_short_q4_avx2,
                                    NULL};
static const k_mm_ops MM_Q8_AVX2 = {mm_t4_q8_avx2, NULL, mm_t1_q8_avx2, NULL, NULL, NULL, 0, PI2_Q8_GROUP_BYTES,
                                    pi2_ki_mm_short_q8_avx2, NULL};

#endif /* PI2_K_X86 */

static void matmul(pi2_isa isa, pi2_qtype wt, int64_t n, int nrows, const uint8_t *const *wp, const uint16_t *const *ws,
                   const float *ascales, const int8_t *aq, const int32_t *asums, int T, float *out, int64_t ldo,
                   const void *pf, int64_t pf_len)
{
    assert(n % QG == 0 && nrows >= 0 && T >= 1 && T <= PI2_K_MAX_T);
    if (nrows == 0)
        return;
#ifdef PI2_K_ARM64
    if (pi2_ki_mm_neon(isa, wt, n, nrows, wp, ws, ascales, aq, T, out, ldo))
        return;
#endif
#ifdef PI2_K_X86
    const k_mm_ops *op = NULL;
    switch (pi2_ki_isa_pick(isa)) {
    case PI2_ISA_AVX512:
        op = wt == PI2_QT_Q4 ? &pi2_ki_mm_q4_vnni : wt == PI2_QT_Q8 ? &pi2_ki_mm_q8_vnni : NULL;
        break;
    case PI2_ISA_AVX2:
        op = wt == PI2_QT_Q4 ? &MM_Q4_AVX2 : wt == PI2_QT_Q8 ? &MM_Q8_AVX2 : NULL;
        break;
    default:
        break;
    }
    if (op == &pi2_ki_mm_q4_vnni || op == &pi2_ki_mm_q8_vnni) {
        if (T >= K_PANEL_MIN_T) {
            pi2_ki_mm_panels(wt, false, n, nrows, wp, ws, ascales, aq, asums, T, out, ldo);
            return;
        }
    }
    if (op == &MM_Q4_AVX2 && T >= K_P2_MIN_T) {
        pi2_ki_mm_panels_avx2(false, n, nrows, wp, ws, ascales, aq, asums, T, out, ldo);
        return;
    }
    if (op) {
        mm_simd(op, n, nrows, wp, ws, ascales, aq, asums, T, out, ldo, pf, pf_len > 0 ? pf_len : 0);
        return;
    }
#else
    (void)isa;
    (void)asums;
    (void)pf;
    (void)pf_len;
#endif
    matmul_scalar(wt, n, nrows, wp, ws, ascales, aq, T, out, ldo);
}

void pi2_k_matmul_isa(pi2_isa isa, pi2_qtype wt, int64_t n, int nrows, const uint8_t *const *wp,
                      const uint16_t *const *ws, const float *ascales, const int8_t *aq, const int32_t *asums,
                      int T, float *out, int64_t ldo)
{
    matmul(isa, wt, n, nrows, wp, ws, ascales, aq, asums, T, out, ldo, NULL, 0);
}

void pi2_k_matmul(pi2_qtype wt, int64_t n, int nrows, const uint8_t *const *wp, const uint16_t *const *ws,
                  const float *ascales, const int8_t *aq, const int32_t *asums, int T, float *out, int64_t ldo)
{
    matmul(pi2_k_get_isa(), wt, n, nrows, wp, ws, ascales, aq, asums, T, out, ldo, NULL, 0);
}

void pi2_k_matmul_pf(pi2_qtype wt, int64_t n, int nrows, const uint8_t *const *wp, const uint16_t *const *ws,
                     const float *ascales, const int8_t *aq, const int32_t *asums, int T, float *out, int64_t ldo,
                     const void *pf, int64_t pf_len)
{
    matmul(pi2_k_get_isa(), wt, n, nrows, wp, ws, ascales, aq, asums, T, out, ldo, pf, pf_len);
}
