/* The down projection on AVX-512 VNNI: 4+ tokens with output columns as
 * lanes, and one token straight from the payload rows (pi2_k_down_rows).
 *
 * ---- down on AVX-512 VNNI, 4+ tokens ----
 * The 256-bit down path widens int16 pair products; with vpdpbusd the
 * output columns become the lanes (16 per zmm) and 4 rows are summed per
 * instruction, the weights repacked once per block for all tokens. What
 * costs besides the dots is quantizing the coefficients (the integer
 * algorithm of kernels.h, per token, block and group): that is built 16
 * blocks per vector. Bit-identical to the twin like the other paths. */
#include "runtime/kernels/internal.h"

#ifdef PI2_K_X86

/* ---- down on AVX-512 VNNI, 4+ tokens ----
 *
 * The same integer sums with lanes as output columns: per block and group,
 * zmm (k, h) holds, for columns 16h .. 16h + 15, the unsigned bytes of the
 * group's rows 4k .. 4k + 3 (Q4 nibbles; Q8 w ^ 0x80 = w + 128), and a
 * token's 4 coefficients cq_4k .. cq_4k+3 are broadcast: 8 vpdpbusd give
 * the group's 32 sums S_j, the accumulator starting at -(8 or 128) *
 * sum(cq). The coefficient tables (k_qent) are built 16 blocks at a time
 * with the twin's float operations; quads of cq come from two packs and
 * one in-lane byte transpose. The 16 blocks of a table window are
 * repacked (2 KiB per block for 64 rows) and then serve every token, one
 * token at a time over the window so its table entries (6 cache lines per
 * block) and outputs stay in L1: visiting every token per block fetched
 * them all again for each block. out is loaded and stored once per
 * (token, block, row chunk). */

enum {
    K_QTAB = PI2_K_MAX_T * (K_DRC / K_DG) /* k_qent entries on the stack (192 KiB): T * G */
};

/* One (token, group) for 16 consecutive blocks (lane = block). */
typedef struct k_qent {
    int32_t q[4][16]; /* bytes cq_4k .. cq_4k+3 */
    float s[16];      /* the scale (0: skip the group) */
    int32_t bias[16]; /* -(8 or 128) * sum(cq) */
} k_qent;

/* tab[t * G + g] for t < T, g < G and the 16 blocks at dR[r * K_DKB + bo]
 * (zero past the chunk), from cp[t * K_DRC + r]. */
PI2_T_AVX512 static void down_prep512(pi2_qtype wt, int G, int T, const float *cp, const float *dR, int64_t bo,
                                      k_qent *tab)
{
    const __m512 c127 = _mm512_set1_ps(127.0f), dmin = _mm512_set1_ps(K_DMIN);
    const __m512i tr = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
    int sh = wt == PI2_QT_Q4 ? 3 : 7;
    for (int t = 0; t < T; t++)
        for (int g = 0; g < G; g++) {
            k_qent *e = &tab[t * G + g];
            const float *c = cp + t * K_DRC + g * K_DG, *d = dR + (int64_t)g * K_DG * K_DKB + bo;
            /* unrolled, and the max as a tree (exact in any order): the
             * chain max -> div -> quantize is this loop's latency */
            __m512 cv[K_DG], mx[K_DG];
#pragma GCC unroll 16
            for (int k = 0; k < K_DG; k++) {
                cv[k] = _mm512_mul_ps(_mm512_set1_ps(c[k]), _mm512_loadu_ps(d + k * K_DKB));
                mx[k] = _mm512_abs_ps(cv[k]);
            }
#pragma GCC unroll 16
            for (int h = K_DG / 2; h > 0; h /= 2)
#pragma GCC unroll 16
                for (int k = 0; k < h; k++)
                    mx[k] = _mm512_max_ps(mx[k], mx[k + h]);
            __m512 m = mx[0];
            __mmask16 ok = _mm512_cmp_ps_mask(m, dmin, _CMP_GE_OQ);
            __m512 inv = _mm512_maskz_div_ps(ok, c127, m); /* 0 where skipped: q = 0 */
            _mm512_storeu_ps(e->s, _mm512_maskz_div_ps(ok, m, c127));
            __m512i q[K_DG], sum = _mm512_setzero_si512();
#pragma GCC unroll 16
            for (int k = 0; k < K_DG; k++) {
                q[k] = _mm512_cvtps_epi32(_mm512_mul_ps(cv[k], inv)); /* |q| <= 127 */
                sum = _mm512_add_epi32(sum, q[k]);
            }
            _mm512_storeu_si512(e->bias, _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sum, sh)));
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                __m512i p = _mm512_packs_epi16(_mm512_packs_epi32(q[4 * k], q[4 * k + 1]),
                                               _mm512_packs_epi32(q[4 * k + 2], q[4 * k + 3]));
                _mm512_storeu_si512(e->q[k], _mm512_shuffle_epi8(p, tr));
            }
        }
}

/* Rows p[0..4)'s 16 bytes at off as column quads: dword j = [p0[j] .. p3[j]]. */
PI2_T_AVX512 static inline __m512i down_quad(const uint8_t *const *p, int64_t off)
{
    const __m512i perm = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m512i tr = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(const void *)(p[0] + off)));
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(const void *)(p[1] + off)), 1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(const void *)(p[2] + off)), 2);
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(const void *)(p[3] + off)), 3);
    return _mm512_shuffle_epi8(_mm512_permutexvar_epi32(perm, v), tr);
}

/* wb[(g * 8 + 2 * k + h) * 64 ..]: the zmm (k, h) of group g (see above)
 * for the chunk's rows w[0 .. 16 * G) at byte offset off. */
PI2_T_AVX512 static void down_pack512(pi2_qtype wt, const uint8_t *const *w, int G, int64_t off, uint8_t *wb)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), x80 = _mm512_set1_epi8(-128);
    for (int q = 0; q < 4 * G; q++) {
        __m512i *d = (__m512i *)(void *)(wb + q * 128);
        if (wt == PI2_QT_Q4) {
            __m512i x = down_quad(w + 4 * q, off);
            _mm512_store_si512(d, _mm512_and_si512(x, m4));
            _mm512_store_si512(d + 1, _mm512_and_si512(_mm512_srli_epi16(x, 4), m4));
        } else {
            _mm512_store_si512(d, _mm512_xor_si512(down_quad(w + 4 * q, off), x80));
            _mm512_store_si512(d + 1, _mm512_xor_si512(down_quad(w + 4 * q, off + 16), x80));
        }
    }
}

/* Token t's 32 outputs o += the chunk's G groups' sums for one block (lane
 * ln of the tables e[g]), groups in row order. Tokens go one at a time
 * over the block's weights (L1-resident): their outputs are ldo apart,
 * which would alias in L1 if every token were visited per group. */
PI2_T_AVX512 static void down_tok512(const uint8_t *wb, const k_qent *e, int G, int ln, float *o)
{
    __m512 o0 = _mm512_loadu_ps(o), o1 = _mm512_loadu_ps(o + 16);
    for (int g = 0; g < G; g++) {
        float s = e[g].s[ln];
        if (s == 0.0f)
            continue;
        const __m512i *W = (const __m512i *)(const void *)(wb + g * 8 * 64);
        /* two chains per half (quads 0-1, 2-3), added exactly at the end:
         * the vpdpbusd latency, not its throughput, bounded one chain */
        __m512i c0 = _mm512_set1_epi32(e[g].q[0][ln]), c1 = _mm512_set1_epi32(e[g].q[1][ln]);
        __m512i c2 = _mm512_set1_epi32(e[g].q[2][ln]), c3 = _mm512_set1_epi32(e[g].q[3][ln]);
        __m512i a0 = _mm512_set1_epi32(e[g].bias[ln]), a1 = a0;
        __m512i b0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_load_si512(W + 4), c2);
        __m512i b1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_load_si512(W + 5), c2);
        a0 = _mm512_dpbusd_epi32(a0, _mm512_load_si512(W), c0);
        a1 = _mm512_dpbusd_epi32(a1, _mm512_load_si512(W + 1), c0);
        b0 = _mm512_dpbusd_epi32(b0, _mm512_load_si512(W + 6), c3);
        b1 = _mm512_dpbusd_epi32(b1, _mm512_load_si512(W + 7), c3);
        a0 = _mm512_dpbusd_epi32(a0, _mm512_load_si512(W + 2), c1);
        a1 = _mm512_dpbusd_epi32(a1, _mm512_load_si512(W + 3), c1);
        a0 = _mm512_add_epi32(a0, b0);
        a1 = _mm512_add_epi32(a1, b1);
        __m512 sv = _mm512_set1_ps(s);
        o0 = _mm512_fmadd_ps(sv, _mm512_cvtepi32_ps(a0), o0);
        o1 = _mm512_fmadd_ps(sv, _mm512_cvtepi32_ps(a1), o1);
    }
    _mm512_storeu_ps(o, o0);
    _mm512_storeu_ps(o + 16, o1);
}

PI2_T_AVX512 void pi2_ki_down_vnni512(pi2_qtype wt, int64_t n, int nrows, const float *coef, int64_t ldc,
                                      const uint8_t *const *wp, const uint16_t *const *ws, int T, float *out,
                                      int64_t ldo)
{
    int64_t nb = n / QG, gb = wt == PI2_QT_Q4 ? PI2_Q4_GROUP_BYTES : PI2_Q8_GROUP_BYTES;
    float cp[PI2_K_MAX_T * K_DRC], dR[K_DRC * K_DKB];
    k_qent tab[K_QTAB];
    _Alignas(64) uint8_t wb[16][K_DRC / 4 * 128]; /* a window's 16 blocks: 32 KiB */
    for (int r0 = 0; r0 < nrows; r0 += K_DRC) {
        int R = nrows - r0 < K_DRC ? nrows - r0 : K_DRC, G = (R + K_DG - 1) / K_DG;
        const uint8_t *w[K_DRC]; /* rows past the chunk repeat its first row (coefficient 0) */
        for (int k = 0; k < G * K_DG; k++)
            w[k] = wp[r0 + (k < R ? k : 0)];
        down_coefs(coef, ldc, T, r0, R, G * K_DG, cp);
        for (int64_t b0 = 0; b0 < nb; b0 += K_DKB) {
            int64_t kb = min64(K_DKB, nb - b0), kb16 = (kb + 15) / 16;
            for (int k = 0; k < G * K_DG; k++) {
                float *d = dR + k * K_DKB;
                int64_t done = 0;
                if (k < R) {
                    cvt_scales(ws[r0 + k] + b0, kb, d);
                    done = kb;
                }
                for (int64_t b = done; b < 16 * kb16; b++)
                    d[b] = 0.0f;
            }
            for (int64_t c = 0; c < kb16; c++) {
                down_prep512(wt, G, T, cp, dR, 16 * c, tab);
                int nw = (int)min64(16, kb - 16 * c);
                for (int i = 0; i < nw; i++)
                    down_pack512(wt, w, G, (b0 + 16 * c + i) * gb, wb[i]);
                /* token by token over the window: its table entries and
                 * outputs stay in L1 (block by block, every token's
                 * entries were fetched again for each block) */
                for (int t = 0; t < T; t++)
                    for (int i = 0; i < nw; i++)
                        down_tok512(wb[i], tab + t * G, G, i, out + t * ldo + (b0 + 16 * c + i) * QG);
            }
        }
    }
}

/* ---- down on AVX-512 VNNI, one token ----
 *
 * The same integer sums straight from the payload rows, 16 rows (one
 * group) at a time so 16 row streams are in flight, the next group's
 * prefetched. Per 64-byte step of the rows (Q4: 4 blocks, Q8: 2) and quad
 * of rows, two byte and two word unpacks put the quad's bytes side by side
 * (dword j of a 128-bit lane = [r0[j] r1[j] r2[j] r3[j]]), so vpdpbusd
 * with the quad's coefficients (per lane those of its block, from the
 * k_qent table) sums them with no repacking buffer: ~0.12 instructions per
 * weight byte against ~0.35 for the 256-bit pair kernels, which left this
 * pass at a third of the read bandwidth. The accumulators start at the
 * bias; a lane's dwords are 4 columns of its block (Q4: low nibbles
 * 4i .. 4i + 3, high nibbles those + 16; Q8: 16 * half + 4i ..), so the
 * outputs live in that order in a float buffer for the column chunk:
 * every 4 output vectors are a 4 x 4 transpose of 128-bit lanes away
 * (out is read into it first and written back last). Groups run in row
 * order with FMAs masked where the scale is 0: bit-identical to the twin. */

enum { K_D1_KB = 128 /* blocks per column chunk (the reordered outputs: 16 KiB) */ };

/* One step's outputs between column order (src/dst: 16 * z floats for
 * output vector z, block z / 2; vectors whose block is at or past `valid`
 * read as 0 and are not written) and the kernel's order (16 * v floats:
 * Q4 v = 2i + h, Q8 v = i). `to_kernel` picks the direction; the
 * transpose is its own inverse. */
PI2_T_AVX512 static void d1_order(bool q4, bool to_kernel, float *col, float *ker, int valid)
{
    for (int h = 0; h < (q4 ? 2 : 1); h++) {
        int zs = q4 ? 2 : 1; /* output vector z = zs * L + h */
        __m512 a[4], r[4];
        for (int L = 0; L < 4; L++) {
            int z = zs * L + h, v = q4 ? 2 * L + h : L;
            if (to_kernel)
                a[L] = z / 2 < valid ? _mm512_loadu_ps(col + 16 * z) : _mm512_setzero_ps();
            else
                a[L] = _mm512_load_ps(ker + 16 * v);
        }
        lanes_t4(a[0], a[1], a[2], a[3], r);
        for (int i = 0; i < 4; i++) {
            int z = zs * i + h, v = q4 ? 2 * i + h : i;
            if (to_kernel)
                _mm512_store_ps(ker + 16 * v, r[i]);
            else if (z / 2 < valid)
                _mm512_storeu_ps(col + 16 * z, r[i]);
        }
    }
}

/* One 64-byte step of a group: rows w[0..16) at byte offset off, the
 * coefficient table e with this step's first block at lane lo, outputs f
 * (kernel order). */
PI2_T_AVX512 static inline __attribute__((always_inline)) void d1_step(bool q4, const uint8_t *const *w, int64_t off,
                                                                       const k_qent *e, int lo, float *f)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), x80 = _mm512_set1_epi8(-128);
    /* dword p of a step vector belongs to block lo + p / 4 (Q4) or lo + p / 8 (Q8) */
    const __m512i lane = q4 ? _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)
                            : _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m512i idx = _mm512_add_epi32(lane, _mm512_set1_epi32(lo));
    __m512 sv = _mm512_permutexvar_ps(idx, _mm512_loadu_ps(e->s));
    __mmask16 nz = _mm512_cmp_ps_mask(sv, _mm512_setzero_ps(), _CMP_NEQ_UQ);
    if (nz == 0)
        return;
    __m512i bias = _mm512_permutexvar_epi32(idx, _mm512_loadu_si512((const void *)e->bias));
    __m512i acc[8] = {bias, bias, bias, bias, bias, bias, bias, bias};
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        __m512i c = _mm512_permutexvar_epi32(idx, _mm512_loadu_si512((const void *)e->q[k]));
        __m512i A = _mm512_loadu_si512((const void *)(w[4 * k] + off));
        __m512i B = _mm512_loadu_si512((const void *)(w[4 * k + 1] + off));
        __m512i C = _mm512_loadu_si512((const void *)(w[4 * k + 2] + off));
        __m512i D = _mm512_loadu_si512((const void *)(w[4 * k + 3] + off));
        __m512i ab0 = _mm512_unpacklo_epi8(A, B), ab1 = _mm512_unpackhi_epi8(A, B);
        __m512i cd0 = _mm512_unpacklo_epi8(C, D), cd1 = _mm512_unpackhi_epi8(C, D);
        __m512i q[4] = {_mm512_unpacklo_epi16(ab0, cd0), _mm512_unpackhi_epi16(ab0, cd0),
                        _mm512_unpacklo_epi16(ab1, cd1), _mm512_unpackhi_epi16(ab1, cd1)};
        if (q4) {
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                acc[2 * i] = _mm512_dpbusd_epi32(acc[2 * i], _mm512_and_si512(q[i], m4), c);
                __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q[i], 4), m4);
                acc[2 * i + 1] = _mm512_dpbusd_epi32(acc[2 * i + 1], hi, c);
            }
        } else {
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++)
                acc[i] = _mm512_dpbusd_epi32(acc[i], _mm512_xor_si512(q[i], x80), c);
        }
    }
#define K_D1_FMA(v)                                                                                   \
    _mm512_store_ps(f + 16 * (v),                                                                     \
                    _mm512_mask3_fmadd_ps(sv, _mm512_cvtepi32_ps(acc[v]), _mm512_load_ps(f + 16 * (v)), nz))
    K_D1_FMA(0);
    K_D1_FMA(1);
    K_D1_FMA(2);
    K_D1_FMA(3);
    if (q4) {
        K_D1_FMA(4);
        K_D1_FMA(5);
        K_D1_FMA(6);
        K_D1_FMA(7);
    }
#undef K_D1_FMA
}

PI2_T_AVX512 void pi2_ki_down_one512(pi2_qtype wt, int64_t n, int nrows, const float *coef, const uint8_t *const *wp,
                                     const uint16_t *const *ws, float *out, const uint8_t *pf, int64_t pf_len)
{
    bool q4 = wt == PI2_QT_Q4;
    int64_t nb = n / QG, gb = q4 ? PI2_Q4_GROUP_BYTES : PI2_Q8_GROUP_BYTES;
    int bps = q4 ? 4 : 2; /* blocks per 64-byte step */
    _Alignas(64) float f[QG * K_D1_KB];
    _Alignas(64) uint8_t pad[K_DG][64];
    float cp[K_DG], dR[K_DG * K_DKB]; /* one group: down_prep512 with T = G = 1 */
    k_qent e;
    /* the caller's range, in equal shares of whole lines per 16-block window */
    int64_t n_win = 0, i_win = 0, pf_o = 0;
    for (int64_t c0 = 0; c0 < nb; c0 += K_D1_KB)
        n_win += (min64(K_D1_KB, nb - c0) + 15) / 16;
    n_win *= (nrows + K_DG - 1) / K_DG;
    for (int64_t c0 = 0; c0 < nb; c0 += K_D1_KB) {
        int64_t kb = min64(K_D1_KB, nb - c0);
        for (int64_t b = 0; b < kb; b += bps)
            d1_order(q4, true, out + (c0 + b) * QG, f + b * QG, (int)(kb - b));
        for (int r0 = 0; r0 < nrows; r0 += K_DG) {
            int R = nrows - r0 < K_DG ? nrows - r0 : K_DG;
            int rn0 = r0 + K_DG, Rn = rn0 >= nrows ? 0 : nrows - rn0 < K_DG ? nrows - rn0 : K_DG;
            const uint8_t *w[K_DG]; /* rows past the end repeat the group's first (coefficient 0) */
            for (int k = 0; k < K_DG; k++)
                w[k] = wp[r0 + (k < R ? k : 0)] + c0 * gb;
            down_coefs(coef, 0, 1, r0, R, K_DG, cp);
            for (int64_t w0 = 0; w0 < kb; w0 += 16) {
                int64_t wk = min64(16, kb - w0);
                for (int k = 0; k < K_DG; k++) {
                    float *d = dR + k * K_DKB;
                    int64_t done = 0;
                    if (k < R && wk == 16) { /* one conversion, not a call per row */
                        const uint16_t *h = ws[r0 + k] + c0 + w0;
                        _mm512_storeu_ps(d, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)h)));
                        continue;
                    }
                    if (k < R) {
                        cvt_scales(ws[r0 + k] + c0 + w0, wk, d);
                        done = wk;
                    }
                    for (int64_t b = done; b < 16; b++)
                        d[b] = 0.0f;
                }
                for (int k = 0; k < Rn; k++) /* the next group's scales for this window */
                    _mm_prefetch((const char *)(ws[rn0 + k] + c0 + w0), _MM_HINT_T0);
                for (int64_t e1 = pf_len * ++i_win / n_win / 64 * 64; pf && pf_o < e1; pf_o += 64)
                    _mm_prefetch((const char *)(pf + pf_o), _MM_HINT_T1);
                down_prep512(wt, 1, 1, cp, dR, 0, &e);
                for (int64_t b = w0; b < w0 + wk; b += bps) {
                    int64_t off = b * gb;
                    for (int k = 0; k < Rn; k++)
                        _mm_prefetch((const char *)(wp[rn0 + k] + (c0 + b) * gb), _MM_HINT_T0);
                    if (b + bps <= kb) {
                        d1_step(q4, w, off, &e, (int)(b - w0), f + b * QG);
                        continue;
                    }
                    /* the chunk's last blocks: zero-padded copies */
                    const uint8_t *pw[K_DG];
                    memset(pad, 0, sizeof pad);
                    for (int k = 0; k < K_DG; k++) {
                        memcpy(pad[k], w[k] + off, (size_t)((kb - b) * gb));
                        pw[k] = pad[k];
                    }
                    d1_step(q4, pw, 0, &e, (int)(b - w0), f + b * QG);
                }
            }
        }
        for (int64_t b = 0; b < kb; b += bps)
            d1_order(q4, false, out + (c0 + b) * QG, f + b * QG, (int)(kb - b));
    }
}

#else
/* nothing here without x86: the dispatch runs the twins */
typedef int pi2_k_down_avx512_none;
#endif /* PI2_K_X86 */
