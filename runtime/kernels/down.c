/* The down projection by rows: pi2_k_down_rows (int8 coefficients times
 * the weight integers; scalar twin and AVX2 / 256-bit VNNI here, the
 * 512-bit paths in down_avx512.c) and pi2_k_axpy_rows (exact float
 * accumulation).
 *
 * ---- axpy ----
 * Rows with coef != 0 are taken in groups of 8; for each 32-float output
 * block the group's rows are FMAed into 4 (AVX2) or 2 (AVX-512) registers
 * between one load and one store. Each row's block scale is pre-multiplied
 * by coef (c*d, rounded once); Q4 nibbles are converted unsigned and the
 * -8 offset is added once per block and group as -8 * sum_r c_r*d_r. So
 * a SIMD result differs from the scalar twin (out += c * (w * d) per row,
 * in row order) by rounding only: at most (3m + 8) * 2^-24 *
 * (|out| + Q * sum_r |c_r * d_r|) for m nonzero rows, Q = 24 (Q4) or 128
 * (Q8) (the tests check this). dequant_rows is exact on every path (the
 * values q * d are exact floats).
 */
#include "runtime/kernels/internal.h"

static void axpy_scalar(pi2_qtype wt, int64_t n, int nrows, const float *coef, const uint8_t *const *wp,
                        const uint16_t *const *ws, float *out)
{
    for (int r = 0; r < nrows; r++)
        pi2_q_axpy_row(wt, coef[r], ws[r], wp[r], n, out);
}

/* The down twin: kernels.h's integer algorithm in plain loops. */

static void down_scalar(pi2_qtype wt, int64_t n, int nrows, const float *coef, int64_t ldc, const uint8_t *const *wp,
                        const uint16_t *const *ws, int T, float *out, int64_t ldo)
{
    int64_t nb = n / QG;
    for (int t = 0; t < T; t++)
        for (int64_t b = 0; b < nb; b++) {
            float *o = out + t * ldo + b * QG;
            for (int r0 = 0; r0 < nrows; r0 += K_DG) {
                int m = nrows - r0 < K_DG ? nrows - r0 : K_DG;
                float c[K_DG], amax = 0.0f;
                for (int k = 0; k < m; k++) {
                    c[k] = coef[t * ldc + r0 + k] * pi2_f16_to_f32(ws[r0 + k][b]);
                    amax = fmaxf(amax, fabsf(c[k]));
                }
                if (!(amax >= K_DMIN))
                    continue;
                float inv = 127.0f / amax, sc = amax / 127.0f;
                int cq[K_DG];
                for (int k = 0; k < m; k++) {
                    float q = rintf(c[k] * inv);
                    /* NaN (a non-finite coefficient: outside the contract,
                     * but a hostile model's activations reach here) must
                     * not meet the int conversion */
                    cq[k] = q > 127.0f ? 127 : q < -127.0f ? -127 : q == q ? (int)q : 0;
                }
                for (int j = 0; j < QG; j++) {
                    int32_t S = 0;
                    for (int k = 0; k < m; k++) {
                        const uint8_t *p = wp[r0 + k];
                        int wq = wt == PI2_QT_Q8 ? (int8_t)p[b * QG + j]
                                 : j < 16       ? (p[b * PI2_Q4_GROUP_BYTES + j] & 0x0f) - 8
                                                : (p[b * PI2_Q4_GROUP_BYTES + j - 16] >> 4) - 8;
                        S += cq[k] * wq;
                    }
                    o[j] = fmaf(sc, (float)S, o[j]);
                }
            }
        }
}

#ifdef PI2_K_X86

enum {
    K_AXPY_ROWS = 8,   /* rows per axpy group */
    K_AXPY_CHUNK = 128 /* blocks per axpy chunk (scale table 4 KiB) */
};

/* ---- axpy ----
 *
 * cd[k * kb + b] = coef_k * d_kb for the group's rows over the chunk;
 * off[b] = -8 * sum_k cd[k * kb + b] (Q4). */
PI2_T_AVX2 static void axpy_prep(pi2_qtype wt, int R, const float *c, const uint16_t *const *s, int64_t b0,
                                 int64_t kb, float *cd, float *off)
{
    for (int k = 0; k < R; k++) {
        float *d = cd + k * kb;
        cvt_scales(s[k] + b0, kb, d);
        __m256 cv = _mm256_set1_ps(c[k]);
        int64_t b = 0;
        for (; b + 8 <= kb; b += 8)
            _mm256_storeu_ps(d + b, _mm256_mul_ps(_mm256_loadu_ps(d + b), cv));
        for (; b < kb; b++)
            d[b] *= c[k];
    }
    if (wt == PI2_QT_Q4)
        for (int64_t b = 0; b < kb; b++) {
            float sum = 0.0f;
            for (int k = 0; k < R; k++)
                sum += cd[k * kb + b];
            off[b] = -8.0f * sum;
        }
}

/* Row k's Q4 / Q8 block (payload p) times c added into x0..x3 (elements
 * 0-7, 8-15, 16-23, 24-31; Q4 nibbles unsigned, the -8 comes with off). */
#define K_AXPY_Q4_ROW(x0, x1, x2, x3, p, c)                                                            \
    do {                                                                                               \
        __m256i lo_ = ld_u8x8(p), hi_ = ld_u8x8((p) + 8); /* bytes 0-7, 8-15 */                        \
        x0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(lo_, m4)), c, x0);                    \
        x1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(hi_, m4)), c, x1);                    \
        x2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(lo_, 4)), c, x2);                    \
        x3 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(hi_, 4)), c, x3);                    \
    } while (0)

#define K_AXPY_Q8_ROW(x0, x1, x2, x3, p, c)                                                            \
    do {                                                                                               \
        x0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ld_i8x8(p)), c, x0);                                   \
        x1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ld_i8x8((p) + 8)), c, x1);                             \
        x2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ld_i8x8((p) + 16)), c, x2);                            \
        x3 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ld_i8x8((p) + 24)), c, x3);                            \
    } while (0)

/* Rows alternate between out's registers o and a second set e (added in
 * at the end), so each FMA chain is half as long. */
#define K_AXPY_BLOCK(ROW, GB)                                                                          \
    do {                                                                                               \
        int k = 0;                                                                                     \
        for (; k + 2 <= R; k += 2) {                                                                   \
            ROW(o0, o1, o2, o3, w[k] + (b0 + b) * (GB), _mm256_broadcast_ss(cd + k * kb + b));         \
            ROW(e0, e1, e2, e3, w[k + 1] + (b0 + b) * (GB), _mm256_broadcast_ss(cd + (k + 1) * kb + b)); \
        }                                                                                              \
        if (k < R)                                                                                     \
            ROW(o0, o1, o2, o3, w[k] + (b0 + b) * (GB), _mm256_broadcast_ss(cd + k * kb + b));         \
    } while (0)

PI2_T_AVX2 static void axpy_group_avx2(pi2_qtype wt, int R, const uint8_t *const *w, int64_t b0, int64_t kb,
                                       const float *cd, const float *off, float *out)
{
    const __m256i m4 = _mm256_set1_epi32(0x0f);
    for (int64_t b = 0; b < kb; b++) {
        float *o = out + (b0 + b) * QG;
        __m256 o0 = _mm256_loadu_ps(o), o1 = _mm256_loadu_ps(o + 8);
        __m256 o2 = _mm256_loadu_ps(o + 16), o3 = _mm256_loadu_ps(o + 24);
        __m256 e0 = _mm256_setzero_ps(), e1 = e0, e2 = e0, e3 = e0;
        if (wt == PI2_QT_Q4) {
            K_AXPY_BLOCK(K_AXPY_Q4_ROW, PI2_Q4_GROUP_BYTES);
            __m256 ov = _mm256_broadcast_ss(off + b);
            e0 = _mm256_add_ps(e0, ov);
            e1 = _mm256_add_ps(e1, ov);
            e2 = _mm256_add_ps(e2, ov);
            e3 = _mm256_add_ps(e3, ov);
        } else {
            K_AXPY_BLOCK(K_AXPY_Q8_ROW, PI2_Q8_GROUP_BYTES);
        }
        _mm256_storeu_ps(o, _mm256_add_ps(o0, e0));
        _mm256_storeu_ps(o + 8, _mm256_add_ps(o1, e1));
        _mm256_storeu_ps(o + 16, _mm256_add_ps(o2, e2));
        _mm256_storeu_ps(o + 24, _mm256_add_ps(o3, e3));
    }
}

/* The same with 16 floats per register: one zero/sign extension of 16
 * bytes feeds a whole 512-bit register. */
PI2_T_AVX512 static void axpy_group_avx512(pi2_qtype wt, int R, const uint8_t *const *w, int64_t b0, int64_t kb,
                                           const float *cd, const float *off, float *out)
{
    const __m512i m4 = _mm512_set1_epi32(0x0f);
    for (int64_t b = 0; b < kb; b++) {
        float *o = out + (b0 + b) * QG;
        __m512 o0 = _mm512_loadu_ps(o), o1 = _mm512_loadu_ps(o + 16);
        if (wt == PI2_QT_Q4) {
            for (int k = 0; k < R; k++) {
                const uint8_t *p = w[k] + (b0 + b) * PI2_Q4_GROUP_BYTES;
                __m512 c = _mm512_set1_ps(cd[k * kb + b]);
                __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
                o0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(x, m4)), c, o0);   /* elements 0-15 */
                o1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(x, 4)), c, o1); /* 16-31 */
            }
            __m512 ov = _mm512_set1_ps(off[b]);
            o0 = _mm512_add_ps(o0, ov);
            o1 = _mm512_add_ps(o1, ov);
        } else {
            for (int k = 0; k < R; k++) {
                const uint8_t *p = w[k] + (b0 + b) * PI2_Q8_GROUP_BYTES;
                __m512 c = _mm512_set1_ps(cd[k * kb + b]);
                __m512i x0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
                __m512i x1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(p + 16)));
                o0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(x0), c, o0);
                o1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(x1), c, o1);
            }
        }
        _mm512_storeu_ps(o, o0);
        _mm512_storeu_ps(o + 16, o1);
    }
}

typedef void (*k_axpy_fn)(pi2_qtype wt, int R, const uint8_t *const *w, int64_t b0, int64_t kb, const float *cd,
                          const float *off, float *out);

static void axpy_simd(k_axpy_fn fn, pi2_qtype wt, int64_t n, int nrows, const float *coef, const uint8_t *const *wp,
                      const uint16_t *const *ws, float *out)
{
    int64_t nb = n / QG;
    float cd[K_AXPY_ROWS * K_AXPY_CHUNK], off[K_AXPY_CHUNK];
    int r = 0;
    while (r < nrows) {
        /* the next group of up to 8 rows (zero coefficients too: callers
         * pass only the rows they want read) */
        float c[K_AXPY_ROWS];
        const uint8_t *w[K_AXPY_ROWS];
        const uint16_t *s[K_AXPY_ROWS];
        int R = 0;
        for (; r < nrows && R < K_AXPY_ROWS; r++) {
            c[R] = coef[r];
            w[R] = wp[r];
            s[R] = ws[r];
            R++;
        }
        if (R == 0)
            break;
        for (int64_t b0 = 0; b0 < nb; b0 += K_AXPY_CHUNK) {
            int64_t kb = min64(K_AXPY_CHUNK, nb - b0);
            axpy_prep(wt, R, c, s, b0, kb, cd, off);
            fn(wt, R, w, b0, kb, cd, off, out);
        }
    }
}

/* ---- down: int8 coefficients x weight integers ----
 *
 * Rows go in chunks of 64 (4 groups of 16). Per chunk and block chunk,
 * down_prep quantizes every (token, block, group)'s 16 coefficients into a
 * k_dent; per block, the chunk's weights are unpacked once into `wb` as
 * interleaved row pairs, then every token runs over them with its 32
 * outputs in 4 float registers (out loaded and stored once per token,
 * block and row chunk):
 *   Q4  wb pair k: rows 2k, 2k + 1's payload bytes interleaved, then split
 *       into nibbles: [u_2k[j], u_2k+1[j]] byte pairs for j = 0-15 and
 *       16-31; vpmaddubsw with the broadcast pair [cq_2k, cq_2k+1] gives
 *       int16 (|pair| <= 2 * 15 * 127, 8 pairs <= 30480: no saturation),
 *       widened once per group; 8 * sum(cq) removes the nibbles' offset.
 *   Q8  rows sign-extended to int16 and interleaved as int16 pairs (the
 *       qword permute puts elements in order after the in-lane unpack);
 *       vpmaddwd with the broadcast [cq_2k, cq_2k+1] gives int32 directly
 *       (-128 included), vpdpwssd on VNNI.
 * Each group's S_j is exact in int32 and in float (|S| <= 16 * 128 * 127),
 * and groups are added in row order with one FMA, like the twin: results
 * are bit-identical. Rows past the last chunk's end repeat one of its
 * rows with coefficient 0 (so no branches on row count). One token reads
 * the payload rows directly instead of going through wb, one group per
 * chunk: 16 row streams rather than 64, which the prefetchers keep up
 * with on a bundle's interleaved down rows. The coefficient tables are
 * built 8 blocks at a time (lanes are blocks), so the divisions and the
 * max run once per 8 groups. Next chunk's rows are
 * prefetched at the pace the current chunk is read (64 row streams are
 * too many for the hardware prefetcher alone). */

enum {
    K_DTAB = PI2_K_MAX_T * (K_DRC / K_DG) /* k_dent entries on the stack (160 KiB): T * G, at least 8 blocks */
};

/* Quantized coefficients of one (token, group) for 8 consecutive blocks
 * (lane = block): pair words of cq_2k, cq_2k+1 (Q4: bytes, low 16 bits;
 * Q8: int16 halves), the scale (0: skip the group) and, for Q4, 8 * sum(cq). */
typedef struct k_dent {
    int32_t pw[8][8];
    float s[8];
    int32_t off[8];
} k_dent;

/* tab[(t * kb8 + b8) * G + g] for t < T, blocks 8 * b8 .. + 7 < 8 * kb8,
 * g < G, from the padded coefficients cp[t * K_DRC + r] and block scales
 * dR[r * K_DKB + b] (zero past the chunk). Vectorized across blocks, so
 * each lane runs the twin's float operations exactly. */
PI2_T_AVX2 static void down_prep(pi2_qtype wt, int G, int64_t kb8, int T, const float *cp, const float *dR,
                                 k_dent *tab)
{
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 c127 = _mm256_set1_ps(127.0f), dmin = _mm256_set1_ps(K_DMIN);
    const __m256i lo = _mm256_set1_epi32(wt == PI2_QT_Q4 ? 0xff : 0xffff);
    for (int t = 0; t < T; t++)
        for (int64_t b8 = 0; b8 < kb8; b8++)
            for (int g = 0; g < G; g++) {
                k_dent *e = &tab[((int64_t)t * kb8 + b8) * G + g];
                const float *c = cp + t * K_DRC + g * K_DG, *d = dR + (int64_t)g * K_DG * K_DKB + b8 * 8;
                __m256 cv[K_DG], m = _mm256_setzero_ps();
                for (int k = 0; k < K_DG; k++) {
                    cv[k] = _mm256_mul_ps(_mm256_broadcast_ss(c + k), _mm256_loadu_ps(d + k * K_DKB));
                    m = _mm256_max_ps(m, _mm256_and_ps(cv[k], absm));
                }
                __m256 ok = _mm256_cmp_ps(m, dmin, _CMP_GE_OQ);
                __m256 inv = _mm256_and_ps(_mm256_div_ps(c127, m), ok); /* 0 where skipped: q = 0 */
                _mm256_storeu_ps(e->s, _mm256_and_ps(_mm256_div_ps(m, c127), ok));
                __m256i sum = _mm256_setzero_si256();
                for (int k = 0; k < 8; k++) {
                    __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(cv[2 * k], inv)); /* |q| <= 127 */
                    __m256i q1 = _mm256_cvtps_epi32(_mm256_mul_ps(cv[2 * k + 1], inv));
                    sum = _mm256_add_epi32(sum, _mm256_add_epi32(q0, q1));
                    __m256i w = _mm256_or_si256(_mm256_and_si256(q0, lo),
                                                _mm256_slli_epi32(q1, wt == PI2_QT_Q4 ? 8 : 16));
                    _mm256_storeu_si256((__m256i *)(void *)e->pw[k], w);
                }
                _mm256_storeu_si256((__m256i *)(void *)e->off, _mm256_slli_epi32(sum, 3));
            }
}

/* Rows a, b's Q4 block as byte pairs: lo = [a_j, b_j] for elements
 * j = 0..15 (in order), hi = the same for j = 16..31. The raw bytes are
 * interleaved first, so the nibble split runs once for both rows. */
#define K_Q4_PAIR(lo, hi, pa, pb)                                                                            \
    do {                                                                                                     \
        __m128i xa_ = _mm_loadu_si128((const __m128i *)(const void *)(pa));                                 \
        __m128i xb_ = _mm_loadu_si128((const __m128i *)(const void *)(pb));                                 \
        __m256i y_ = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_unpacklo_epi8(xa_, xb_)),           \
                                             _mm_unpackhi_epi8(xa_, xb_), 1);                                \
        lo = _mm256_and_si256(y_, _mm256_set1_epi8(0x0f));                                                   \
        hi = _mm256_and_si256(_mm256_srli_epi16(y_, 4), _mm256_set1_epi8(0x0f));                             \
    } while (0)

/* Rows w[0..2 * npairs) of the chunk (rows past the chunk repeat a row of
 * it: their coefficients are 0), block at byte offset off, into wb as
 * interleaved pairs (see above). */
PI2_T_AVX2 static void down_unpack_q4(const uint8_t *const *w, int npairs, int64_t off, uint8_t *wb)
{
    for (int k = 0; k < npairs; k++) {
        __m256i lo, hi;
        K_Q4_PAIR(lo, hi, w[2 * k] + off, w[2 * k + 1] + off);
        _mm256_storeu_si256((__m256i *)(void *)(wb + k * 64), lo);
        _mm256_storeu_si256((__m256i *)(void *)(wb + k * 64 + 32), hi);
    }
}

PI2_T_AVX2 static void down_unpack_q8(const uint8_t *const *w, int npairs, int64_t off, uint8_t *wb)
{
    for (int k = 0; k < npairs; k++) {
        const uint8_t *p0 = w[2 * k] + off, *p1 = w[2 * k + 1] + off;
        /* int16 elements [0-3 8-11 | 4-7 12-15] (and 16-31 alike) */
        __m256i a0 = _mm256_permute4x64_epi64(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)p0)), 0xd8);
        __m256i a1 = _mm256_permute4x64_epi64(
            _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(p0 + 16))), 0xd8);
        __m256i b0 = _mm256_permute4x64_epi64(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)p1)), 0xd8);
        __m256i b1 = _mm256_permute4x64_epi64(
            _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(p1 + 16))), 0xd8);
        __m256i *d = (__m256i *)(void *)(wb + k * 128);
        _mm256_storeu_si256(d, _mm256_unpacklo_epi16(a0, b0));     /* elements 0-7 */
        _mm256_storeu_si256(d + 1, _mm256_unpackhi_epi16(a0, b0)); /* 8-15 */
        _mm256_storeu_si256(d + 2, _mm256_unpacklo_epi16(a1, b1)); /* 16-23 */
        _mm256_storeu_si256(d + 3, _mm256_unpackhi_epi16(a1, b1)); /* 24-31 */
    }
}

/* One token over the chunk's G groups for one block: o[0..32) += ... */
#define K_DEF_DOWN_Q4(name, TGT)                                                                              \
    TGT static void name(const uint8_t *wb, int G, const k_dent *e, int ln, float *o)                                \
    {                                                                                                        \
        __m256 o0 = _mm256_loadu_ps(o), o1 = _mm256_loadu_ps(o + 8);                                         \
        __m256 o2 = _mm256_loadu_ps(o + 16), o3 = _mm256_loadu_ps(o + 24);                                   \
        for (int g = 0; g < G; g++) {                                                                        \
            if (e[g].s[ln] == 0.0f)                                                                              \
                continue;                                                                                    \
            const uint8_t *wg = wb + g * 8 * 64;                                                             \
            __m256i al = _mm256_setzero_si256(), ah = al;                                                    \
            for (int k = 0; k < 8; k++) {                                                                    \
                __m256i c = _mm256_set1_epi16((int16_t)e[g].pw[k][ln]);                                                 \
                al = _mm256_add_epi16(al, _mm256_maddubs_epi16(ld256(wg + k * 64), c));                      \
                ah = _mm256_add_epi16(ah, _mm256_maddubs_epi16(ld256(wg + k * 64 + 32), c));                 \
            }                                                                                                \
            __m256i off = _mm256_set1_epi32(e[g].off[ln]);                                                       \
            __m256 s = _mm256_set1_ps(e[g].s[ln]);                                                               \
            __m256i x0 = _mm256_sub_epi32(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(al)), off);           \
            __m256i x1 = _mm256_sub_epi32(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(al, 1)), off);      \
            __m256i x2 = _mm256_sub_epi32(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(ah)), off);           \
            __m256i x3 = _mm256_sub_epi32(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(ah, 1)), off);      \
            o0 = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(x0), o0);                                             \
            o1 = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(x1), o1);                                             \
            o2 = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(x2), o2);                                             \
            o3 = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(x3), o3);                                             \
        }                                                                                                    \
        _mm256_storeu_ps(o, o0);                                                                             \
        _mm256_storeu_ps(o + 8, o1);                                                                         \
        _mm256_storeu_ps(o + 16, o2);                                                                        \
        _mm256_storeu_ps(o + 24, o3);                                                                        \
    }

/* MADDW(acc, w, c): acc + the int16 pair products of w and c. */
#define K_DEF_DOWN_Q8(name, TGT, MADDW)                                                                      \
    TGT static void name(const uint8_t *wb, int G, const k_dent *e, int ln, float *o)                                \
    {                                                                                                        \
        __m256 o0 = _mm256_loadu_ps(o), o1 = _mm256_loadu_ps(o + 8);                                         \
        __m256 o2 = _mm256_loadu_ps(o + 16), o3 = _mm256_loadu_ps(o + 24);                                   \
        for (int g = 0; g < G; g++) {                                                                        \
            if (e[g].s[ln] == 0.0f)                                                                              \
                continue;                                                                                    \
            const uint8_t *wg = wb + g * 8 * 128;                                                            \
            __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;                                  \
            for (int k = 0; k < 8; k++) {                                                                    \
                __m256i c = _mm256_set1_epi32(e[g].pw[k][ln]);                                                 \
                a0 = MADDW(a0, ld256(wg + k * 128), c);                                                      \
                a1 = MADDW(a1, ld256(wg + k * 128 + 32), c);                                                 \
                a2 = MADDW(a2, ld256(wg + k * 128 + 64), c);                                                 \
                a3 = MADDW(a3, ld256(wg + k * 128 + 96), c);                                                 \
            }                                                                                                \
            __m256 s = _mm256_set1_ps(e[g].s[ln]);                                                               \
            o0 = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(a0), o0);                                             \
            o1 = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(a1), o1);                                             \
            o2 = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(a2), o2);                                             \
            o3 = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(a3), o3);                                             \
        }                                                                                                    \
        _mm256_storeu_ps(o, o0);                                                                             \
        _mm256_storeu_ps(o + 8, o1);                                                                         \
        _mm256_storeu_ps(o + 16, o2);                                                                        \
        _mm256_storeu_ps(o + 24, o3);                                                                        \
    }

PI2_T_AVX2 static inline __m256i maddw_avx2(__m256i acc, __m256i w, __m256i c)
{
    return _mm256_add_epi32(acc, _mm256_madd_epi16(w, c));
}

PI2_T_AVX512 static inline __m256i maddw_vnni(__m256i acc, __m256i w, __m256i c)
{
    return _mm256_dpwssd_epi32(acc, w, c);
}

K_DEF_DOWN_Q4(down_tok_q4_avx2, PI2_T_AVX2)
K_DEF_DOWN_Q4(down_tok_q4_vnni, PI2_T_AVX512)
K_DEF_DOWN_Q8(down_tok_q8_avx2, PI2_T_AVX2, maddw_avx2)
K_DEF_DOWN_Q8(down_tok_q8_vnni, PI2_T_AVX512, maddw_vnni)

/* T = 1: the same integer sums straight from the payload rows (no wb
 * round trip: each weight is used once). w[k] + off: row k's block. */
#define K_DEF_DOWN1_Q4(name, TGT)                                                                             \
    TGT static void name(const uint8_t *const *w, int G, int64_t off, const k_dent *e, int ln, float *o)      \
    {                                                                                                        \
        __m256 o0 = _mm256_loadu_ps(o), o1 = _mm256_loadu_ps(o + 8);                                         \
        __m256 o2 = _mm256_loadu_ps(o + 16), o3 = _mm256_loadu_ps(o + 24);                                   \
        for (int g = 0; g < G; g++) {                                                                        \
            if (e[g].s[ln] == 0.0f)                                                                              \
                continue;                                                                                    \
            __m256i al = _mm256_setzero_si256(), ah = al;                                                    \
            for (int k = 0; k < 8; k++) {                                                                    \
                __m256i lo, hi;                                                                              \
                K_Q4_PAIR(lo, hi, w[g * K_DG + 2 * k] + off, w[g * K_DG + 2 * k + 1] + off);                 \
                __m256i c = _mm256_set1_epi16((int16_t)e[g].pw[k][ln]);                                      \
                al = _mm256_add_epi16(al, _mm256_maddubs_epi16(lo, c));                                      \
                ah = _mm256_add_epi16(ah, _mm256_maddubs_epi16(hi, c));                                      \
            }                                                                                                \
            __m256i off_ = _mm256_set1_epi32(e[g].off[ln]);                                                      \
            __m256 s = _mm256_set1_ps(e[g].s[ln]);                                                               \
            __m256i x0 = _mm256_sub_epi32(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(al)), off_);          \
            __m256i x1 = _mm256_sub_epi32(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(al, 1)), off_);     \
            __m256i x2 = _mm256_sub_epi32(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(ah)), off_);          \
            __m256i x3 = _mm256_sub_epi32(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(ah, 1)), off_);     \
            o0 = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(x0), o0);                                             \
            o1 = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(x1), o1);                                             \
            o2 = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(x2), o2);                                             \
            o3 = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(x3), o3);                                             \
        }                                                                                                    \
        _mm256_storeu_ps(o, o0);                                                                             \
        _mm256_storeu_ps(o + 8, o1);                                                                         \
        _mm256_storeu_ps(o + 16, o2);                                                                        \
        _mm256_storeu_ps(o + 24, o3);                                                                        \
    }

#define K_DEF_DOWN1_Q8(name, TGT, MADDW)                                                                      \
    TGT static void name(const uint8_t *const *w, int G, int64_t off, const k_dent *e, int ln, float *o)      \
    {                                                                                                        \
        __m256 o0 = _mm256_loadu_ps(o), o1 = _mm256_loadu_ps(o + 8);                                         \
        __m256 o2 = _mm256_loadu_ps(o + 16), o3 = _mm256_loadu_ps(o + 24);                                   \
        for (int g = 0; g < G; g++) {                                                                        \
            if (e[g].s[ln] == 0.0f)                                                                              \
                continue;                                                                                    \
            __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;                                  \
            for (int k = 0; k < 8; k++) {                                                                    \
                const uint8_t *p0 = w[g * K_DG + 2 * k] + off, *p1 = w[g * K_DG + 2 * k + 1] + off;          \
                __m256i x0 = _mm256_permute4x64_epi64(                                                       \
                    _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)p0)), 0xd8);         \
                __m256i x1 = _mm256_permute4x64_epi64(                                                       \
                    _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(p0 + 16))), 0xd8);  \
                __m256i y0 = _mm256_permute4x64_epi64(                                                       \
                    _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)p1)), 0xd8);         \
                __m256i y1 = _mm256_permute4x64_epi64(                                                       \
                    _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(p1 + 16))), 0xd8);  \
                __m256i c = _mm256_set1_epi32(e[g].pw[k][ln]);                                                 \
                a0 = MADDW(a0, _mm256_unpacklo_epi16(x0, y0), c);                                            \
                a1 = MADDW(a1, _mm256_unpackhi_epi16(x0, y0), c);                                            \
                a2 = MADDW(a2, _mm256_unpacklo_epi16(x1, y1), c);                                            \
                a3 = MADDW(a3, _mm256_unpackhi_epi16(x1, y1), c);                                            \
            }                                                                                                \
            __m256 s = _mm256_set1_ps(e[g].s[ln]);                                                               \
            o0 = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(a0), o0);                                             \
            o1 = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(a1), o1);                                             \
            o2 = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(a2), o2);                                             \
            o3 = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(a3), o3);                                             \
        }                                                                                                    \
        _mm256_storeu_ps(o, o0);                                                                             \
        _mm256_storeu_ps(o + 8, o1);                                                                         \
        _mm256_storeu_ps(o + 16, o2);                                                                        \
        _mm256_storeu_ps(o + 24, o3);                                                                        \
    }

K_DEF_DOWN1_Q4(down_one_q4_avx2, PI2_T_AVX2)
K_DEF_DOWN1_Q4(down_one_q4_vnni, PI2_T_AVX512)
K_DEF_DOWN1_Q8(down_one_q8_avx2, PI2_T_AVX2, maddw_avx2)
K_DEF_DOWN1_Q8(down_one_q8_vnni, PI2_T_AVX512, maddw_vnni)

typedef void (*k_down_tok_fn)(const uint8_t *wb, int G, const k_dent *e, int ln, float *o);
typedef void (*k_down_one_fn)(const uint8_t *const *w, int G, int64_t off, const k_dent *e, int ln, float *o);

PI2_T_AVX2 static void down_simd(k_down_tok_fn tok, k_down_one_fn one, pi2_qtype wt, int64_t n, int nrows, const float *coef,
                                 int64_t ldc, const uint8_t *const *wp, const uint16_t *const *ws, int T, float *out,
                                 int64_t ldo)
{
    int64_t nb = n / QG, gb = wt == PI2_QT_Q4 ? PI2_Q4_GROUP_BYTES : PI2_Q8_GROUP_BYTES;
    float cp[PI2_K_MAX_T * K_DRC], dR[K_DRC * K_DKB];
    k_dent tab[K_DTAB];
    _Alignas(64) uint8_t wb[K_DRC / 2 * 128];
    /* One token reads each row once: one group at a time keeps 16 row
     * streams (plus the prefetched next 16) in flight instead of 64 */
    int drc = T == 1 ? K_DG : K_DRC;
    for (int r0 = 0; r0 < nrows; r0 += drc) {
        int R = nrows - r0 < drc ? nrows - r0 : drc, G = (R + K_DG - 1) / K_DG;
        const uint8_t *w[K_DRC]; /* rows past the chunk repeat its first row (coefficient 0) */
        for (int k = 0; k < G * K_DG; k++)
            w[k] = wp[r0 + (k < R ? k : 0)];
        int rn0 = r0 + drc, Rn = rn0 >= nrows ? 0 : nrows - rn0 < drc ? nrows - rn0 : drc;
        down_coefs(coef, ldc, T, r0, R, G * K_DG, cp);
        int64_t kc = 8 * min64(K_DTAB / (T * G), K_DKB / 8); /* T * G <= K_DTAB: kc >= 8 */
        for (int64_t b0 = 0; b0 < nb; b0 += kc) {
            int64_t kb = min64(kc, nb - b0), kb8 = (kb + 7) / 8;
            for (int k = 0; k < G * K_DG; k++) {
                float *d = dR + k * K_DKB;
                int64_t done = 0;
                if (k < R) {
                    cvt_scales(ws[r0 + k] + b0, kb, d);
                    done = kb;
                }
                for (int64_t b = done; b < 8 * kb8; b++)
                    d[b] = 0.0f;
            }
            down_prep(wt, G, kb8, T, cp, dR, tab);
            for (int64_t b = 0; b < kb; b++) {
                int64_t off = (b0 + b) * gb;
                const k_dent *e = tab + (b / 8) * G;
                int ln = (int)(b % 8);
                if ((off & 63) < gb) /* a new cache line of every row */
                    for (int k = 0; k < Rn; k++)
                        _mm_prefetch((const char *)(wp[rn0 + k] + off), _MM_HINT_T0);
                if (T == 1) {
                    one(w, G, off, e, ln, out + (b0 + b) * QG);
                    continue;
                }
                if (wt == PI2_QT_Q4)
                    down_unpack_q4(w, G * 8, off, wb);
                else
                    down_unpack_q8(w, G * 8, off, wb);
                for (int t = 0; t < T; t++)
                    tok(wb, G, e + (int64_t)t * kb8 * G, ln, out + t * ldo + (b0 + b) * QG);
            }
        }
    }
}

#endif /* PI2_K_X86 */

void pi2_k_axpy_rows_isa(pi2_isa isa, pi2_qtype wt, int64_t n, int nrows, const float *coef,
                         const uint8_t *const *wp, const uint16_t *const *ws, float *out)
{
    assert(n % QG == 0 || wt == PI2_QT_F32);
#ifdef PI2_K_X86
    if (wt == PI2_QT_Q4 || wt == PI2_QT_Q8) {
        switch (pi2_ki_isa_pick(isa)) {
        case PI2_ISA_AVX512:
            axpy_simd(axpy_group_avx512, wt, n, nrows, coef, wp, ws, out);
            return;
        case PI2_ISA_AVX2:
            axpy_simd(axpy_group_avx2, wt, n, nrows, coef, wp, ws, out);
            return;
        default:
            break;
        }
    }
#else
    (void)isa;
#endif
    axpy_scalar(wt, n, nrows, coef, wp, ws, out);
}

void pi2_k_axpy_rows(pi2_qtype wt, int64_t n, int nrows, const float *coef, const uint8_t *const *wp,
                     const uint16_t *const *ws, float *out)
{
    pi2_k_axpy_rows_isa(pi2_k_get_isa(), wt, n, nrows, coef, wp, ws, out);
}

static void down_rows(pi2_isa isa, pi2_qtype wt, int64_t n, int nrows, const float *coef, int64_t ldc,
                      const uint8_t *const *wp, const uint16_t *const *ws, int T, float *out, int64_t ldo,
                      const uint8_t *pf, int64_t pf_len)
{
    assert((wt == PI2_QT_Q4 || wt == PI2_QT_Q8) && n % QG == 0 && nrows >= 0 && T >= 1 && T <= PI2_K_MAX_T);
    if (nrows == 0)
        return;
#ifdef PI2_K_ARM64
    if (pi2_ki_down_neon(isa, wt, n, nrows, coef, ldc, wp, ws, T, out, ldo))
        return;
#endif
#ifdef PI2_K_X86
    switch (pi2_ki_isa_pick(isa)) {
    case PI2_ISA_AVX512:
        if (T >= K_DOWN512_MIN_T) {
            pi2_ki_down_vnni512(wt, n, nrows, coef, ldc, wp, ws, T, out, ldo);
            return;
        }
        if (T == 1) {
            pi2_ki_down_one512(wt, n, nrows, coef, wp, ws, out, pf, pf_len);
            return;
        }
        down_simd(wt == PI2_QT_Q4 ? down_tok_q4_vnni : down_tok_q8_vnni,
                  wt == PI2_QT_Q4 ? down_one_q4_vnni : down_one_q8_vnni, wt, n, nrows, coef, ldc, wp, ws, T, out, ldo);
        return;
    case PI2_ISA_AVX2:
        down_simd(wt == PI2_QT_Q4 ? down_tok_q4_avx2 : down_tok_q8_avx2,
                  wt == PI2_QT_Q4 ? down_one_q4_avx2 : down_one_q8_avx2, wt, n, nrows, coef, ldc, wp, ws, T, out, ldo);
        return;
    default:
        break;
    }
#else
    (void)isa, (void)pf, (void)pf_len;
#endif
    down_scalar(wt, n, nrows, coef, ldc, wp, ws, T, out, ldo);
}

void pi2_k_down_rows_isa(pi2_isa isa, pi2_qtype wt, int64_t n, int nrows, const float *coef, int64_t ldc,
                         const uint8_t *const *wp, const uint16_t *const *ws, int T, float *out, int64_t ldo)
{
    down_rows(isa, wt, n, nrows, coef, ldc, wp, ws, T, out, ldo, NULL, 0);
}

void pi2_k_down_rows(pi2_qtype wt, int64_t n, int nrows, const float *coef, int64_t ldc, const uint8_t *const *wp,
                     const uint16_t *const *ws, int T, float *out, int64_t ldo)
{
    down_rows(pi2_k_get_isa(), wt, n, nrows, coef, ldc, wp, ws, T, out, ldo, NULL, 0);
}

void pi2_k_down_rows_pf(pi2_qtype wt, int64_t n, int nrows, const float *coef, int64_t ldc, const uint8_t *const *wp,
                        const uint16_t *const *ws, int T, float *out, int64_t ldo, const void *pf, int64_t pf_len)
{
    down_rows(pi2_k_get_isa(), wt, n, nrows, coef, ldc, wp, ws, T, out, ldo, pf, pf_len);
}
