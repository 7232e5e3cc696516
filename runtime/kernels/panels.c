/* Prefill panels: pi2_k_matmul for batches (AVX2 Q4 panels of 8 rows,
 * AVX-512 VNNI panels of 16) and the superblock GEMM of Q4 gate and up
 * rows (pi2_k_matmul_sb, pi2_k_act_quantize_sb) with its scalar twin.
 *
 * ---- matmul on AVX-512 VNNI, 4+ tokens: 16-row panels ----
 * The 4 x 4 tiles above spend most of their time folding 256-bit product
 * lanes; with 512-bit vpdpbusd the fold can go: each zmm lane is one row.
 * A panel of 16 rows is repacked once per call (and block chunk) so that
 * one zmm holds the 16 rows' 4 bytes of one 4-byte group of a block; a
 * token's 4 activation bytes are broadcast to all lanes, and 8 vpdpbusd
 * give the 16 rows' exact block dots, with no reduction at all. The
 * repack (a 4x4 dword transpose per 16-byte piece, nibble split) is paid
 * once per panel and reused by every token, 8 tokens per pass: 8 weight
 * registers, 8 float accumulators, one int32 accumulator at a time.
 * Weights are the unsigned operand (Q4 nibbles, Q8 w ^ 0x80 = w + 128) so
 * the activations can be the broadcast memory operand as they are; the
 * offset (8 or 128) * sum(a) starts the int32 accumulator. The float stage
 * per (16 rows, token, block) is one cvt, one multiply of the panel's
 * scale vector by the token's scale and one FMA. Each output follows the
 * batch order (kernels.h, Numerics; internal.h, K_MC): a panel chunk is
 * one of its chunks, its blocks one FMA chain in order (the AVX2 panels
 * alike). Under 4 tokens (decode) the 4 x 1 path stays: repacking would
 * cost more than it saves. */
#include "runtime/kernels/internal.h"

/* ---- prefill gate/up of Q4 rows: superblock GEMM (pi2_k_matmul_sb) ----
 *
 * The twin of kernels.h's algorithm, shared helpers first. A superblock is
 * K_SB blocks (256 values; the row's last may be shorter); chunks of K_PB
 * blocks (the panels') hold whole superblocks. */

/* One superblock's factors from the block scales d[0..m): k[b] and *D. */
static void sb_factors(const float *d, int m, int32_t *k, float *D)
{
    float mx = 0.0f;
    for (int b = 0; b < m; b++)
        mx = fmaxf(mx, fabsf(d[b]));
    bool ok = mx >= K_DMIN;
    float inv = ok ? K_KONE / mx : 0.0f;
    *D = ok ? mx * 0x1p-12f : 0.0f;
    for (int b = 0; b < m; b++) {
        float q = rintf(d[b] * inv);
        k[b] = q > K_KONE ? (int32_t)K_KONE : q < -K_KONE ? -(int32_t)K_KONE : q == q ? (int32_t)q : 0;
    }
}

static void act_sb_scalar(const float *x, int64_t ldx, int T, int64_t n, float *scales, int8_t *q, int32_t *sums)
{
    int64_t nb = n / QG, ns = (nb + K_SB - 1) / K_SB;
    for (int t = 0; t < T; t++) {
        const float *xt = x + (int64_t)t * ldx;
        int8_t *qt = q + (int64_t)t * n;
        for (int64_t s = 0; s < ns; s++) {
            int64_t j0 = s * K_SB * QG, j1 = min64(j0 + K_SB * QG, n);
            float m = 0.0f;
            for (int64_t j = j0; j < j1; j++)
                m = fmaxf(m, fabsf(xt[j]));
            bool ok = m >= K_DMIN;
            float inv = ok ? 127.0f / m : 0.0f;
            scales[(int64_t)t * ns + s] = ok ? m / 127.0f : 0.0f;
            for (int64_t j = j0; j < j1; j++) {
                float r = rintf(xt[j] * inv);
                qt[j] = (int8_t)(r > 127.0f ? 127 : r < -127.0f ? -127 : r == r ? (int)r : 0);
            }
        }
        for (int64_t b = 0; b < nb; b++) {
            int32_t s = 0;
            for (int j = 0; j < QG; j++)
                s += qt[b * QG + j];
            sums[(int64_t)t * nb + b] = s;
        }
    }
}

static void matmul_sb_scalar(int64_t n, int nrows, const uint8_t *const *wp, const uint16_t *const *ws,
                             const float *ascales, const int8_t *aq, int T, float *out, int64_t ldo)
{
    int64_t nb = n / QG, ns = (nb + K_SB - 1) / K_SB;
    for (int r = 0; r < nrows; r++) {
        int32_t k[K_PB];
        float D[K_PB / K_SB], d[K_PB];
        for (int64_t b0 = 0; b0 < nb; b0 += K_PB) {
            int64_t kb = min64(K_PB, nb - b0);
            for (int64_t b = 0; b < kb; b++)
                d[b] = pi2_f16_to_f32(ws[r][b0 + b]);
            for (int64_t s0 = 0; s0 < kb; s0 += K_SB)
                sb_factors(d + s0, (int)min64(K_SB, kb - s0), k + s0, &D[s0 / K_SB]);
            for (int t = 0; t < T; t++) {
                const int8_t *a = aq + (int64_t)t * n;
                float acc = 0.0f;
                for (int64_t s0 = 0; s0 < kb; s0 += K_SB) {
                    int32_t S = 0;
                    for (int64_t b = s0; b < min64(s0 + K_SB, kb); b++) {
                        const uint8_t *p = wp[r] + (b0 + b) * PI2_Q4_GROUP_BYTES;
                        int32_t blk = 0;
                        for (int j = 0; j < 16; j++)
                            blk += ((p[j] & 0x0f) - 8) * a[(b0 + b) * QG + j] +
                                   ((p[j] >> 4) - 8) * a[(b0 + b) * QG + 16 + j];
                        S += k[b] * blk;
                    }
                    acc = fmaf((float)S, D[s0 / K_SB] * ascales[(int64_t)t * ns + (b0 + s0) / K_SB], acc);
                }
                float *o = out + (int64_t)t * ldo + r;
                *o = b0 == 0 ? acc : *o + acc;
            }
        }
    }
}

#ifdef PI2_K_X86

/* ---- matmul, AVX2 panels (prefill, Q4) ----
 *
 * The t4 tiles above fold every product vector with unpacks (shuffles)
 * and widen it per block. Here Q4 rows go in panels of 8 (lane i of a ymm
 * = row i), repacked per block chunk into k_panel2: per block and 4-byte
 * group g of its nibbles (0..15), one ymm of the 8 rows' bytes g (an 8 x 8
 * dword transpose). Per token and block, the token's 4 activation bytes of
 * each group are broadcast, vpmaddubsw multiplies them with the group's
 * nibbles, and the 8 groups' int16 pairs (each at most 2 * 15 * 128, so
 * 8 of them fit) add up in int16 before one vpmaddwd widens them: 9
 * multiplies for 256 multiply-adds, where the int8 probe takes 16. Less
 * 8 * sum(a), one cvt, one multiply of the panel's 8 scales by the
 * token's and one FMA, as the t4 tiles do per block: the sums are the same
 * exact integers. The block's 8 weight vectors stay in registers for 4
 * tokens. Under 16 tokens the packing does not pay (K_P2_MIN_T). Q8 rows
 * keep the tiles (two nibble passes, w = 16 h + l, lost to them:
 * runtime/PERF.md, "Kernels"). */

enum {
    K_P2_W = K_PB * 8 /* ymm of weights in a panel: 64 blocks x 8 groups */
};

typedef struct k_panel2 {
    _Alignas(32) uint8_t w[K_P2_W * 32]; /* [block][group][row][4 bytes] */
    union {
        _Alignas(32) float s[K_PB * 8];   /* [block][row] scales */
        _Alignas(32) int32_t k[K_PB * 8]; /* superblock panels: [block][row] int16 factors */
    };
    _Alignas(32) float d[K_PB / K_SB * 8]; /* superblock panels: [superblock][row] scales */
} k_panel2;

/* v[g] lane r = dword g of v[r] (8 x 8 dwords). */
PI2_T_AVX2 static inline void p2_t8(__m256i v[8])
{
    __m256i t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_epi32(v[i], v[i + 1]);
        t[i + 1] = _mm256_unpackhi_epi32(v[i], v[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int g = 0; g < 4; g++) {
        v[g] = _mm256_permute2x128_si256(u[g], u[g + 4], 0x20);
        v[g + 4] = _mm256_permute2x128_si256(u[g], u[g + 4], 0x31);
    }
}

/* Panel of Q4 rows p[0..8) (payload at the chunk start; scales s), kb
 * blocks: q4_nibbles puts elements 4g .. 4g + 3 in dword g. */
PI2_T_AVX2 static void p2_pack(const uint8_t *const p[8], const uint16_t *const s[8], int64_t kb, k_panel2 *P)
{
    for (int64_t b = 0; b < kb; b++) {
        __m256i v[8];
        for (int r = 0; r < 8; r++)
            v[r] = q4_nibbles(p[r] + b * PI2_Q4_GROUP_BYTES);
        p2_t8(v);
        for (int g = 0; g < 8; g++)
            _mm256_store_si256((__m256i *)(void *)(P->w + (b * 8 + g) * 32), v[g]);
    }
    float tmp[8][K_PB];
    for (int r = 0; r < 8; r++)
        cvt_scales(s[r], kb, tmp[r]);
    for (int64_t b = 0; b < kb; b++)
        for (int r = 0; r < 8; r++)
            P->s[b * 8 + r] = tmp[r][b];
}

/* N tokens (a: token 0's activations at the chunk start, stride n; as and
 * su: its scales and sums there, stride nb) against a panel of kb blocks:
 * res[t] lane r = the chunk's dot of row r. */
#define K_P2_TOK(N)                                                                                            \
    PI2_T_AVX2 K_NOINLINE static void p2_tok##N(const k_panel2 *P, int64_t kb, const int8_t *a, int64_t n,     \
                                                const float *as, const int32_t *su, int64_t nb, __m256 *res)   \
    {                                                                                                          \
        const __m256i one = _mm256_set1_epi16(1);                                                              \
        __m256 f[N];                                                                                           \
        for (int t = 0; t < N; t++)                                                                            \
            f[t] = _mm256_setzero_ps();                                                                        \
        for (int64_t b = 0; b < kb; b++) {                                                                     \
            const __m256i *w = (const __m256i *)(const void *)(P->w + b * 8 * 32);                             \
            __m256 ws = _mm256_load_ps(P->s + b * 8);                                                          \
            _Pragma("GCC unroll 4") for (int t = 0; t < N; t++)                                                \
            {                                                                                                  \
                const k_u32a *at = (const k_u32a *)(const void *)(a + t * n + b * QG);                         \
                __m256i lo = _mm256_setzero_si256();                                                           \
                _Pragma("GCC unroll 8") for (int g = 0; g < 8; g++)                                            \
                    lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(_mm256_load_si256(w + g),                   \
                                                                   _mm256_set1_epi32(at[g])));                 \
                __m256i d = _mm256_sub_epi32(_mm256_madd_epi16(lo, one), _mm256_set1_epi32(8 * su[t * nb + b])); \
                __m256 sc = _mm256_mul_ps(ws, _mm256_set1_ps(as[t * nb + b]));                                 \
                f[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), sc, f[t]);                                       \
            }                                                                                                  \
        }                                                                                                      \
        for (int t = 0; t < N; t++)                                                                            \
            res[t] = f[t];                                                                                     \
    }

K_P2_TOK(4)
K_P2_TOK(2)
K_P2_TOK(1)

/* ---- the superblock GEMM on AVX2 panels (pi2_k_matmul_sb) ----
 * The twin's factors (sb_factors) per row, then per token and block the
 * panel's 8 exact block dots as above (|dot| <= 32 * 8 * 127 fits an
 * int16), times the block's factors by one vpmaddwd (the factor's high
 * half zero) into the superblock's int32 sum; per superblock one cvt,
 * one multiply and one FMA, as the twin. */

/* The factors of rows s[0..8) (scales at the chunk start), kb blocks. */
PI2_T_AVX2 static void p2_sb_scales(const uint16_t *const s[8], int64_t kb, k_panel2 *P)
{
    for (int r = 0; r < 8; r++) {
        float d[K_PB], D;
        int32_t k[K_PB];
        cvt_scales(s[r], kb, d);
        for (int64_t s0 = 0; s0 < kb; s0 += K_SB) {
            sb_factors(d + s0, (int)min64(K_SB, kb - s0), k + s0, &D);
            P->d[s0 / K_SB * 8 + r] = D;
        }
        for (int64_t b = 0; b < kb; b++)
            P->k[b * 8 + r] = k[b] & 0xffff;
    }
}

/* N tokens (a, su as p2_tok; as: the superblock scales at the chunk's
 * first superblock, token stride ns): res[t] lane r = the chunk's sum. */
#define K_P2_SBTOK(N)                                                                                          \
    PI2_T_AVX2 K_NOINLINE static void p2_sbtok##N(const k_panel2 *P, int64_t kb, const int8_t *a, int64_t n,   \
                                                  const float *as, int64_t ns, const int32_t *su, int64_t nb,  \
                                                  __m256 *res)                                                 \
    {                                                                                                          \
        const __m256i one = _mm256_set1_epi16(1);                                                              \
        __m256 f[N];                                                                                           \
        for (int t = 0; t < N; t++)                                                                            \
            f[t] = _mm256_setzero_ps();                                                                        \
        for (int64_t s0 = 0; s0 < kb; s0 += K_SB) {                                                            \
            __m256i S[N];                                                                                      \
            for (int t = 0; t < N; t++)                                                                        \
                S[t] = _mm256_setzero_si256();                                                                 \
            for (int64_t b = s0; b < min64(kb, s0 + K_SB); b++) {                                              \
                const __m256i *w = (const __m256i *)(const void *)(P->w + b * 8 * 32);                         \
                __m256i kv = _mm256_load_si256((const __m256i *)(const void *)(P->k + b * 8));                 \
                _Pragma("GCC unroll 4") for (int t = 0; t < N; t++)                                            \
                {                                                                                              \
                    const k_u32a *at = (const k_u32a *)(const void *)(a + t * n + b * QG);                     \
                    __m256i lo = _mm256_setzero_si256();                                                       \
                    _Pragma("GCC unroll 8") for (int g = 0; g < 8; g++)                                        \
                        lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(_mm256_load_si256(w + g),               \
                                                                       _mm256_set1_epi32(at[g])));             \
                    __m256i d = _mm256_sub_epi32(_mm256_madd_epi16(lo, one), _mm256_set1_epi32(8 * su[t * nb + b])); \
                    S[t] = _mm256_add_epi32(S[t], _mm256_madd_epi16(d, kv));                                   \
                }                                                                                              \
            }                                                                                                  \
            __m256 dv = _mm256_load_ps(P->d + s0 / K_SB * 8);                                                  \
            for (int t = 0; t < N; t++)                                                                        \
                f[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(S[t]), _mm256_mul_ps(dv, _mm256_set1_ps(as[t * ns + s0 / K_SB])), \
                                       f[t]);                                                                  \
        }                                                                                                      \
        for (int t = 0; t < N; t++)                                                                            \
            res[t] = f[t];                                                                                     \
    }

K_P2_SBTOK(4)
K_P2_SBTOK(2)
K_P2_SBTOK(1)

PI2_T_AVX2 void pi2_ki_mm_panels_avx2(bool sb, int64_t n, int nrows, const uint8_t *const *wp,
                                      const uint16_t *const *ws, const float *ascales, const int8_t *aq,
                                      const int32_t *asums, int T, float *out, int64_t ldo)
{
    int64_t nb = n / QG, gb = PI2_Q4_GROUP_BYTES, ns = (nb + K_SB - 1) / K_SB;
    k_panel2 P;
    for (int64_t b0 = 0; b0 < nb; b0 += K_PB) {
        int64_t kb = min64(K_PB, nb - b0);
        for (int r0 = 0; r0 < nrows; r0 += 8) {
            int m = nrows - r0 < 8 ? nrows - r0 : 8;
            const uint8_t *p[8];
            const uint16_t *s[8];
            for (int k = 0; k < 8; k++) {
                int r = r0 + (k < m ? k : m - 1);
                p[k] = wp[r] + b0 * gb;
                s[k] = ws[r] + b0;
            }
            p2_pack(p, s, kb, &P);
            if (sb)
                p2_sb_scales(s, kb, &P);
            int64_t lines = (kb * gb + 63) / 64, pf = 0;
            for (int t0 = 0; t0 < T;) {
                k_panel_pf(wp, r0, 8, nrows, b0 * gb, lines, t0 / 4 + 1, (T + 3) / 4, &pf);
                int N = T - t0 >= 4 ? 4 : T - t0 >= 2 ? 2 : 1;
                __m256 res[4];
                if (sb)
                    (N == 4 ? p2_sbtok4 : N == 2 ? p2_sbtok2 : p2_sbtok1)(&P, kb, aq + t0 * n + b0 * QG, n,
                                                                         ascales + t0 * ns + b0 / K_SB, ns,
                                                                         asums + t0 * nb + b0, nb, res);
                else
                    (N == 4 ? p2_tok4 : N == 2 ? p2_tok2 : p2_tok1)(&P, kb, aq + t0 * n + b0 * QG, n,
                                                                    ascales + t0 * nb + b0, asums + t0 * nb + b0,
                                                                    nb, res);
                for (int j = 0; j < N; j++) {
                    float *o = out + (t0 + j) * ldo + r0;
                    if (m == 8) {
                        _mm256_storeu_ps(o, b0 > 0 ? _mm256_add_ps(res[j], _mm256_loadu_ps(o)) : res[j]);
                    } else {
                        float tmp[8];
                        _mm256_storeu_ps(tmp, res[j]);
                        for (int k = 0; k < m; k++)
                            o[k] = b0 > 0 ? o[k] + tmp[k] : tmp[k];
                    }
                }
                t0 += N;
            }
        }
    }
}

/* ---- matmul, AVX-512 VNNI panels (prefill) ----
 *
 * Rows in panels of 16 (lane i of a zmm = one row), repacked per block
 * chunk into k_panel: for each block and 4-byte group g of it, one zmm of
 * the 16 rows' 4 unsigned weight bytes (Q4 nibbles; Q8 w + 128, i.e.
 * w ^ 0x80). Lane i holds row 4 * (i % 4) + i / 4 (the order a 4x4 dword
 * transpose leaves; an involution, so the same index vector puts lanes
 * back in row order). Per token and block: an int32 accumulator starts at
 * -corr * sum(a) (8 for Q4, 128 for Q8; k_pbias), 8 vpdpbusd with the
 * token's 4 activation bytes broadcast ({1to16} from memory), one cvt,
 * one multiply of the panel's scale vector by the token's scale and one
 * FMA into the token's float accumulator. */

/* The 4x4 dword transpose of 16 rows' 16-byte pieces p[0..16): out[m]
 * lane i = dword m of p[4 * (i % 4) + i / 4]. */
PI2_T_AVX512 static inline void panel_t16(const uint8_t *const p[16], int64_t off, __m512i out[4])
{
    __m512i z[4];
    for (int q = 0; q < 4; q++) {
        __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(const void *)(p[4 * q] + off)));
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(const void *)(p[4 * q + 1] + off)), 1);
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(const void *)(p[4 * q + 2] + off)), 2);
        z[q] = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(const void *)(p[4 * q + 3] + off)), 3);
    }
    __m512i a0 = _mm512_unpacklo_epi32(z[0], z[1]), a1 = _mm512_unpackhi_epi32(z[0], z[1]);
    __m512i b0 = _mm512_unpacklo_epi32(z[2], z[3]), b1 = _mm512_unpackhi_epi32(z[2], z[3]);
    out[0] = _mm512_unpacklo_epi64(a0, b0);
    out[1] = _mm512_unpackhi_epi64(a0, b0);
    out[2] = _mm512_unpacklo_epi64(a1, b1);
    out[3] = _mm512_unpackhi_epi64(a1, b1);
}

/* The weights of panel rows p[0..16) (payload at the chunk start), kb
 * blocks, into w ([block][group][lane][4 bytes]). */
PI2_T_AVX512 static void panel_pack_w(pi2_qtype wt, const uint8_t *const p[16], int64_t kb, uint8_t *w)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), x80 = _mm512_set1_epi8(-128);
    for (int64_t b = 0; b < kb; b++) {
        __m512i *d = (__m512i *)(void *)(w + b * 512), t[4];
        if (wt == PI2_QT_Q4) {
            panel_t16(p, b * PI2_Q4_GROUP_BYTES, t);
            for (int m = 0; m < 4; m++) {
                _mm512_store_si512(d + m, _mm512_and_si512(t[m], m4));
                _mm512_store_si512(d + 4 + m, _mm512_and_si512(_mm512_srli_epi16(t[m], 4), m4));
            }
        } else {
            for (int h = 0; h < 2; h++) {
                panel_t16(p, b * PI2_Q8_GROUP_BYTES + 16 * h, t);
                for (int m = 0; m < 4; m++)
                    _mm512_store_si512(d + 4 * h + m, _mm512_xor_si512(t[m], x80));
            }
        }
    }
}

/* Panel of rows p[0..16) (payload at the chunk start), kb blocks; the
 * scales s[0..16) at the chunk start. */
PI2_T_AVX512 static void panel_pack(pi2_qtype wt, const uint8_t *const p[16], const uint16_t *const s[16], int64_t kb,
                                    k_panel *P)
{
    panel_pack_w(wt, p, kb, P->w);
    float tmp[16 * K_PB];
    for (int i = 0; i < 16; i++)
        cvt_scales(s[4 * (i % 4) + i / 4], kb, tmp + i * K_PB);
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32(K_PB));
    for (int64_t b = 0; b < kb; b++)
        _mm512_store_ps(P->s + b * 16, _mm512_i32gather_ps(idx, tmp + b, 4));
}

/* N tokens (a: token 0's activations at the chunk start, token stride n;
 * as: its scales, stride nb; bias: k_pbias rows, stride K_PB) against a
 * panel of kb blocks: res[t] lane i = the chunk's dot of lane i's row. */
#define K_PANEL_TOK(N)                                                                                        \
    PI2_T_AVX512 K_NOINLINE static void panel_tok##N(const k_panel *P, int64_t kb, const int8_t *a,           \
        int64_t n, const float *as, int64_t nb, const int32_t *bias, __m512 *res)                             \
    {                                                                                                         \
        __m512 f[N];                                                                                          \
        for (int t = 0; t < N; t++)                                                                           \
            f[t] = _mm512_setzero_ps();                                                                       \
        for (int64_t b = 0; b < kb; b++) {                                                                    \
            K_PANEL_DOTS(N, P->w, b);                                                                         \
            __m512 ws = _mm512_load_ps(P->s + b * 16);                                                        \
            _Pragma("GCC unroll 8") for (int t = 0; t < N; t++)                                               \
            {                                                                                                 \
                __m512 sc = _mm512_mul_ps(ws, _mm512_set1_ps(as[t * nb + b]));                                \
                f[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[t]), sc, f[t]);                                 \
            }                                                                                                 \
        }                                                                                                     \
        for (int t = 0; t < N; t++)                                                                           \
            res[t] = f[t];                                                                                    \
    }

K_PANEL_TOK(8)
K_PANEL_TOK(4)
K_PANEL_TOK(2)
K_PANEL_TOK(1)

/* The same with one scale per token and block for all 16 lanes, given:
 * sc[t * ss + b] (the down GEMM's D * sigma, computed once per token and
 * group instead of once per token, group and lane vector). */
#define K_PANEL_TOKS(N)                                                                                        \
    PI2_T_AVX512 K_NOINLINE static void panel_toks##N(const k_panel *P, int64_t kb, const int8_t *a,          \
        int64_t n, const float *sc, int64_t ss, const int32_t *bias, __m512 *res)                             \
    {                                                                                                         \
        __m512 f[N];                                                                                          \
        for (int t = 0; t < N; t++)                                                                           \
            f[t] = _mm512_setzero_ps();                                                                       \
        for (int64_t b = 0; b < kb; b++) {                                                                    \
            K_PANEL_DOTS(N, P->w, b);                                                                         \
            _Pragma("GCC unroll 8") for (int t = 0; t < N; t++)                                               \
            {                                                                                                 \
                f[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[t]), _mm512_set1_ps(sc[t * ss + b]), f[t]);      \
            }                                                                                                 \
        }                                                                                                     \
        for (int t = 0; t < N; t++)                                                                           \
            res[t] = f[t];                                                                                    \
    }

K_PANEL_TOKS(8)
K_PANEL_TOKS(4)
K_PANEL_TOKS(2)
K_PANEL_TOKS(1)

/* ---- prefill gate/up of Q4 rows on AVX-512 VNNI: superblock panels ----
 *
 * The panels' weights as mm_panels packs them (panel_pack_w); instead of
 * a float scale per block, an int16 factor per block and lane (k_panel.k,
 * the high half zero) and a float scale per superblock and lane (k_panel.d).
 * Per token and block: the accumulator starts at -8 * sum(a) (|.| <=
 * 32 * 8 * 127, an int16), 8 vpdpbusd, then one vpdpwssd adds it times the
 * block's factors into the superblock's int32 sum; per superblock one
 * cvt, one multiply and one FMA. mm_panels' multiply and FMA per block
 * contend with vpdpbusd for the same pipes (a cvt and a float add do
 * not), so moving them to once per superblock leaves vpdpbusd more of
 * the cycles. */
/* The factors of rows s[0..16) (scales at the chunk start; lane order as
 * panel_pack), kb blocks. */
PI2_T_AVX512 static void sb_pack_scales(const uint16_t *const s[16], int64_t kb, k_panel *P)
{
    float tmp[16 * K_PB];
    for (int i = 0; i < 16; i++)
        cvt_scales(s[4 * (i % 4) + i / 4], kb, tmp + i * K_PB);
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32(K_PB));
    const __m512 dmin = _mm512_set1_ps(K_DMIN), one = _mm512_set1_ps(K_KONE), lsb = _mm512_set1_ps(0x1p-12f);
    const __m512i lo16 = _mm512_set1_epi32(0xffff);
    for (int64_t s0 = 0; s0 < kb; s0 += K_SB) {
        int m = (int)min64(K_SB, kb - s0);
        __m512 d[K_SB], mx = _mm512_setzero_ps();
        for (int b = 0; b < m; b++) {
            d[b] = _mm512_i32gather_ps(idx, tmp + s0 + b, 4);
            mx = _mm512_max_ps(mx, _mm512_abs_ps(d[b]));
        }
        __mmask16 ok = _mm512_cmp_ps_mask(mx, dmin, _CMP_GE_OQ);
        __m512 inv = _mm512_maskz_div_ps(ok, one, mx);
        _mm512_store_ps(P->d + s0 / K_SB * 16, _mm512_maskz_mul_ps(ok, mx, lsb));
        for (int b = 0; b < m; b++)
            _mm512_store_si512(P->k + (s0 + b) * 16,
                               _mm512_and_si512(_mm512_cvtps_epi32(_mm512_mul_ps(d[b], inv)), lo16));
    }
}

/* N tokens (a: token 0's activations at the chunk start, token stride n;
 * as: its superblock scales, stride ns; bias: -8 * block sums, stride
 * K_PB) against a panel of kb blocks: res[t] lane i = the chunk's sum. */
#define K_SB_TOK(N)                                                                                           \
    PI2_T_AVX512 K_NOINLINE static void sb_tok##N(const k_panel *P, int64_t kb, const int8_t *a, int64_t n,   \
        const float *as, int64_t ns, const int32_t *bias, __m512 *res)                                        \
    {                                                                                                         \
        __m512 f[N];                                                                                          \
        for (int t = 0; t < N; t++)                                                                           \
            f[t] = _mm512_setzero_ps();                                                                       \
        for (int64_t s0 = 0; s0 < kb; s0 += K_SB) {                                                           \
            __m512i S[N];                                                                                     \
            for (int t = 0; t < N; t++)                                                                       \
                S[t] = _mm512_setzero_si512();                                                                \
            int64_t e = min64(kb, s0 + K_SB);                                                                 \
            for (int64_t b = s0; b < e; b++) {                                                                \
                K_PANEL_DOTS(N, P->w, b);                                                                     \
                __m512i kv = _mm512_load_si512(P->k + b * 16);                                                \
                _Pragma("GCC unroll 8") for (int t = 0; t < N; t++)                                           \
                    S[t] = _mm512_dpwssd_epi32(S[t], acc[t], kv);                                             \
            }                                                                                                 \
            __m512 dv = _mm512_load_ps(P->d + s0 / K_SB * 16);                                                \
            _Pragma("GCC unroll 8") for (int t = 0; t < N; t++)                                               \
            {                                                                                                 \
                __m512 sc = _mm512_mul_ps(dv, _mm512_set1_ps(as[t * ns + s0 / K_SB]));                        \
                f[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S[t]), sc, f[t]);                                   \
            }                                                                                                 \
        }                                                                                                     \
        for (int t = 0; t < N; t++)                                                                           \
            res[t] = f[t];                                                                                    \
    }

K_SB_TOK(8)
K_SB_TOK(4)
K_SB_TOK(2)
K_SB_TOK(1)

static k_tok_fn *const K_TOK[4] = {panel_tok8, panel_tok4, panel_tok2, panel_tok1};
k_tok_fn *const pi2_ki_tok_scaled[4] = {panel_toks8, panel_toks4, panel_toks2, panel_toks1};
static k_tok_fn *const K_SB_TOKS[4] = {sb_tok8, sb_tok4, sb_tok2, sb_tok1};

/* The next group of tokens from t0 of T (8, then 4, 2, 1) against a
 * panel, by the family's kernel for that many; returns N. */
int pi2_ki_panel_tokens(k_tok_fn *const fam[4], const k_panel *P, int64_t kb, const int8_t *a, int64_t n,
                        const float *sc, int64_t ss, const int32_t *bias, int t0, int T, __m512 res[8])
{
    int N = T - t0 >= 8 ? 8 : T - t0 >= 4 ? 4 : T - t0 >= 2 ? 2 : 1;
    fam[N == 8 ? 0 : N == 4 ? 1 : N == 2 ? 2 : 3](P, kb, a + t0 * n, n, sc + t0 * ss, ss, bias + t0 * K_PB, res);
    return N;
}

/* All of pi2_k_matmul (sb: pi2_k_matmul_sb, Q4) on the panels: block
 * chunks of K_PB, in them row panels of 16 (the last one repeats its last
 * row; those lanes are not stored), in them tokens in groups of 8 (then
 * 4, 2, 1). */
PI2_T_AVX512 void pi2_ki_mm_panels(pi2_qtype wt, bool sb, int64_t n, int nrows, const uint8_t *const *wp,
                                   const uint16_t *const *ws, const float *ascales, const int8_t *aq,
                                   const int32_t *asums, int T, float *out, int64_t ldo)
{
    int64_t nb = n / QG, gb = wt == PI2_QT_Q4 ? PI2_Q4_GROUP_BYTES : PI2_Q8_GROUP_BYTES;
    int64_t ss = sb ? (nb + K_SB - 1) / K_SB : nb; /* activation scales per token */
    int32_t corr = wt == PI2_QT_Q4 ? 8 : 128;
    k_panel P;
    int32_t bias[PI2_K_MAX_T * K_PB];
    /* lane i <-> row 4 * (i % 4) + i / 4 (both ways) */
    const __m512i perm = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    for (int64_t b0 = 0; b0 < nb; b0 += K_PB) {
        int64_t kb = min64(K_PB, nb - b0);
        for (int t = 0; t < T; t++)
            for (int64_t b = 0; b < kb; b++)
                bias[t * K_PB + b] = -corr * asums[t * nb + b0 + b];
        for (int r0 = 0; r0 < nrows; r0 += 16) {
            int m = nrows - r0 < 16 ? nrows - r0 : 16;
            const uint8_t *p[16];
            const uint16_t *s[16];
            for (int k = 0; k < 16; k++) {
                int r = r0 + (k < m ? k : m - 1);
                p[k] = wp[r] + b0 * gb;
                s[k] = ws[r] + b0;
            }
            if (sb) {
                panel_pack_w(wt, p, kb, P.w);
                sb_pack_scales(s, kb, &P);
            } else {
                panel_pack(wt, p, s, kb, &P);
            }
            /* the next panel's rows (its pack would meet them cold) */
            int64_t lines = (kb * gb + 63) / 64, pf = 0;
            __mmask16 keep = (__mmask16)((1u << m) - 1u);
            for (int t0 = 0; t0 < T;) {
                k_panel_pf(wp, r0, 16, nrows, b0 * gb, lines, t0 / 8 + 1, (T + 7) / 8, &pf);
                __m512 res[8];
                int N = pi2_ki_panel_tokens(sb ? K_SB_TOKS : K_TOK, &P, kb, aq + b0 * QG, n,
                                     ascales + (sb ? b0 / K_SB : b0), ss, bias, t0, T, res);
                for (int j = 0; j < N; j++) {
                    float *o = out + (t0 + j) * ldo + r0;
                    __m512 v = _mm512_permutexvar_ps(perm, res[j]);
                    if (b0 > 0)
                        v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(keep, o));
                    _mm512_mask_storeu_ps(o, keep, v);
                }
                t0 += N;
            }
        }
    }
}

/* Activations per superblock: the scalar twin's operations on 16 lanes. */
PI2_T_AVX512 static void act_sb_avx512(const float *x, int64_t ldx, int T, int64_t n, float *scales, int8_t *q,
                                       int32_t *sums)
{
    int64_t nb = n / QG, ns = (nb + K_SB - 1) / K_SB;
    const __m512 dmin = _mm512_set1_ps(K_DMIN), c127 = _mm512_set1_ps(127.0f);
    const __m512i c127i = _mm512_set1_epi32(127);
    for (int t = 0; t < T; t++) {
        const float *xt = x + (int64_t)t * ldx;
        int8_t *qt = q + (int64_t)t * n;
        for (int64_t s = 0; s < ns; s++) {
            int64_t j0 = s * K_SB * QG, nv = (min64(j0 + K_SB * QG, n) - j0) / 16;
            __m512 v[K_SB * 2], mx = _mm512_setzero_ps();
            for (int64_t i = 0; i < nv; i++) {
                v[i] = _mm512_loadu_ps(xt + j0 + 16 * i);
                mx = _mm512_max_ps(mx, _mm512_abs_ps(v[i]));
            }
            __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
            __mmask16 ok = _mm512_cmp_ps_mask(m, dmin, _CMP_GE_OQ);
            __m512 inv = _mm512_maskz_div_ps(ok, c127, m);
            scales[(int64_t)t * ns + s] = _mm512_cvtss_f32(_mm512_maskz_div_ps(ok, m, c127));
            __m512i prev = _mm512_setzero_si512();
            for (int64_t i = 0; i < nv; i++) {
                /* the clamp only matters for values that are not finite */
                __m512i qi = _mm512_cvtps_epi32(_mm512_mul_ps(v[i], inv));
                qi = _mm512_max_epi32(_mm512_min_epi32(qi, c127i), _mm512_sub_epi32(_mm512_setzero_si512(), c127i));
                _mm_storeu_si128((__m128i *)(void *)(qt + j0 + 16 * i), _mm512_cvtepi32_epi8(qi));
                if (i % 2 == 1)
                    sums[(int64_t)t * nb + (j0 + 16 * i) / QG] = _mm512_reduce_add_epi32(_mm512_add_epi32(prev, qi));
                prev = qi;
            }
        }
    }
}

#endif /* PI2_K_X86 */

void pi2_k_act_quantize_sb_isa(pi2_isa isa, const float *x, int64_t ldx, int T, int64_t n, float *scales, int8_t *q,
                               int32_t *sums)
{
    assert(n % QG == 0 && T >= 0);
#ifdef PI2_K_ARM64
    if (pi2_ki_act_quantize_sb_neon(isa, x, ldx, T, n, scales, q, sums))
        return;
#endif
#ifdef PI2_K_X86
    if (pi2_ki_isa_pick(isa) == PI2_ISA_AVX512) {
        act_sb_avx512(x, ldx, T, n, scales, q, sums);
        return;
    }
#elif !defined(PI2_K_ARM64)
    (void)isa;
#endif
    act_sb_scalar(x, ldx, T, n, scales, q, sums);
}

void pi2_k_act_quantize_sb(const float *x, int64_t ldx, int T, int64_t n, float *scales, int8_t *q, int32_t *sums)
{
    pi2_k_act_quantize_sb_isa(pi2_k_get_isa(), x, ldx, T, n, scales, q, sums);
}

void pi2_k_matmul_sb_isa(pi2_isa isa, int64_t n, int nrows, const uint8_t *const *wp, const uint16_t *const *ws,
                         const float *ascales, const int8_t *aq, const int32_t *asums, int T, float *out, int64_t ldo)
{
    assert(n % QG == 0 && nrows >= 0 && T >= 1 && T <= PI2_K_MAX_T);
    if (nrows == 0)
        return;
#ifdef PI2_K_ARM64
    if (pi2_ki_matmul_sb_neon(isa, n, nrows, wp, ws, ascales, aq, T, out, ldo))
        return;
#endif
#ifdef PI2_K_X86
    if (pi2_ki_isa_pick(isa) == PI2_ISA_AVX512) {
        pi2_ki_mm_panels(PI2_QT_Q4, true, n, nrows, wp, ws, ascales, aq, asums, T, out, ldo);
        return;
    }
    if (pi2_ki_isa_pick(isa) == PI2_ISA_AVX2) {
        pi2_ki_mm_panels_avx2(true, n, nrows, wp, ws, ascales, aq, asums, T, out, ldo);
        return;
    }
#elif !defined(PI2_K_ARM64)
    (void)isa;
#endif
    (void)asums;
    matmul_sb_scalar(n, nrows, wp, ws, ascales, aq, T, out, ldo);
}

void pi2_k_matmul_sb(int64_t n, int nrows, const uint8_t *const *wp, const uint16_t *const *ws, const float *ascales,
                     const int8_t *aq, const int32_t *asums, int T, float *out, int64_t ldo)
{
    pi2_k_matmul_sb_isa(pi2_k_get_isa(), n, nrows, wp, ws, ascales, aq, asums, T, out, ldo);
}
