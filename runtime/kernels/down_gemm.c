/* The prefill down projection as an int8 GEMM (pi2_k_down_gemm): the
 * scalar twin, AVX-512 VNNI through the prefill panels (panels.c), and
 * AVX2 on panels of int16 pairs. */
#include "runtime/kernels/internal.h"

/* ---- prefill down: requantized int8 GEMM (pi2_k_down_gemm) ----
 *
 * Shared by the twin and the SIMD path: the coefficients of rows r0 ..
 * r0 + R of T tokens, quantized per group of K_GR rows as activations are
 * (pi2_q8act_quantize: same q, scales and sums on every path) into
 * aq[t * Rp ..] (Rp = R rounded up to whole groups, zeros past R),
 * as[t * G + g] and su[t * G + g]. */
enum {
    K_GR = 32, /* rows per group: one coefficient scale, one weight scale per output block */
    K_GC = 16  /* groups per row chunk (512 rows): one float accumulation per chunk */
};

void pi2_ki_gemm_coefs(pi2_isa isa, const float *coef, int64_t ldc, int T, int r0, int R, int8_t *aq, float *as,
                       int32_t *su)
{
    int Rf = R / K_GR * K_GR, G = (R + K_GR - 1) / K_GR, Rp = G * K_GR;
    if (Rf == R) { /* whole groups: the tokens in one call, the layouts agree */
        pi2_k_act_quantize_isa(isa, coef + r0, ldc, T, R, as, aq, su);
        return;
    }
    for (int t = 0; t < T; t++) {
        const float *c = coef + t * ldc + r0;
        if (Rf > 0)
            pi2_k_act_quantize_isa(isa, c, ldc, 1, Rf, as + t * G, aq + t * Rp, su + t * G);
        if (Rf < R) {
            float tail[K_GR] = {0};
            memcpy(tail, c + Rf, (size_t)(R - Rf) * sizeof(float));
            pi2_k_act_quantize_isa(isa, tail, K_GR, 1, K_GR, as + t * G + Rf / K_GR, aq + t * Rp + Rf,
                                   su + t * G + Rf / K_GR);
        }
    }
}

/* The twin: per output block b and group g, the weight scale D and each
 * row's factor d_r * 127 / (qmax * m), then the exact integer sums. */
static void gemm_scalar(pi2_qtype wt, int64_t n, int nrows, const float *coef, int64_t ldc, const uint8_t *const *wp,
                        const uint16_t *const *ws, int T, float *out, int64_t ldo)
{
    int64_t nb = n / QG;
    float qmax = wt == PI2_QT_Q4 ? 8.0f : 128.0f;
    int8_t aq[PI2_K_MAX_T * K_GC * K_GR];
    float as[PI2_K_MAX_T * K_GC];
    int32_t su[PI2_K_MAX_T * K_GC];
    for (int r0 = 0; r0 < nrows; r0 += K_GC * K_GR) {
        int R = nrows - r0 < K_GC * K_GR ? nrows - r0 : K_GC * K_GR, G = (R + K_GR - 1) / K_GR, Rp = G * K_GR;
        pi2_ki_gemm_coefs(PI2_ISA_SCALAR, coef, ldc, T, r0, R, aq, as, su);
        for (int64_t b = 0; b < nb; b++) {
            float D[K_GC];
            int8_t w2[K_GC * K_GR][QG]; /* requantized weights of the block */
            for (int g = 0; g < G; g++) {
                float d[K_GR], inv = k_gemm_wgroup(ws + r0 + g * K_GR, K_GR, R - g * K_GR, b, qmax, d, &D[g]);
                for (int k = 0; k < K_GR; k++) {
                    int r = g * K_GR + k;
                    const uint8_t *p = wp[r0 + (r < R ? r : 0)];
                    for (int j = 0; j < QG; j++) {
                        int wq = wt == PI2_QT_Q8 ? (int8_t)p[b * QG + j]
                                 : j < 16       ? (p[b * PI2_Q4_GROUP_BYTES + j] & 0x0f) - 8
                                                : (p[b * PI2_Q4_GROUP_BYTES + j - 16] >> 4) - 8;
                        float q = rintf((float)wq * (d[k] * inv));
                        /* |q| <= 127 for finite scales; NaN (a non-finite
                         * scale: outside the contract) must not meet the
                         * int conversion */
                        w2[r][j] = (int8_t)(q > 127.0f ? 127 : q < -127.0f ? -127 : q == q ? (int)q : 0);
                    }
                }
            }
            for (int t = 0; t < T; t++)
                for (int j = 0; j < QG; j++) {
                    float acc = 0.0f;
                    for (int g = 0; g < G; g++) {
                        int32_t S = 0;
                        for (int k = 0; k < K_GR; k++) /* rows past R: coefficient 0 */
                            S += w2[g * K_GR + k][j] * aq[t * Rp + g * K_GR + k];
                        acc = fmaf((float)S, D[g] * as[t * G + g], acc);
                    }
                    out[t * ldo + b * QG + j] += acc;
                }
        }
    }
}

#ifdef PI2_K_X86

/* The same on AVX-512 VNNI, through the prefill panels (panel_tok*): lanes
 * are 16 output columns, a panel "block" is a group of 32 rows, its 8
 * quads hold the rows' requantized weights + 128 (so the accumulator
 * starts at -128 * sum(cq), the coefficients' k_pbias), and its scale
 * vector is the group's D for the output block. Per window of 16 output
 * blocks, each group's factors and D are computed 16 blocks at a time
 * (lane = block, the twin's float operations); per output block both
 * halves' panels are packed once and serve every token. Q4: per row a
 * 16-entry table rint((v - 8) * f) and one byte shuffle per half. */
typedef struct k_gfac {
    _Alignas(64) float f[K_GC * K_GR][16]; /* [row][block in window] */
    _Alignas(64) float D[K_GC][16];
} k_gfac;

/* F for the R rows ws[0 .. R) (zero factors past R), blocks bw .. bw + kbw. */
PI2_T_AVX512 static void gemm_factors(float qmax, const uint16_t *const *ws, int R, int G, int64_t bw, int kbw,
                                      k_gfac *F)
{
    const __m512 dmin = _mm512_set1_ps(K_DMIN), c127 = _mm512_set1_ps(127.0f), qm = _mm512_set1_ps(qmax);
    __mmask16 lanes = (__mmask16)((1u << kbw) - 1u);
    for (int g = 0; g < G; g++) {
        __m512 m = _mm512_setzero_ps();
        for (int k = 0; k < K_GR; k++) {
            int r = g * K_GR + k;
            __m512 d = r < R ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes, ws[r] + bw)) : _mm512_setzero_ps();
            _mm512_store_ps(F->f[r], d);
            m = _mm512_max_ps(m, _mm512_abs_ps(d));
        }
        __mmask16 ok = _mm512_cmp_ps_mask(m, dmin, _CMP_GE_OQ);
        __m512 qmm = _mm512_mul_ps(qm, m);
        __m512 inv = _mm512_maskz_div_ps(ok, c127, qmm);
        _mm512_store_ps(F->D[g], _mm512_maskz_div_ps(ok, qmm, c127));
        for (int k = 0; k < K_GR; k++) {
            float *f = F->f[g * K_GR + k];
            _mm512_store_ps(f, _mm512_mul_ps(_mm512_load_ps(f), inv));
        }
    }
}

/* Quad of 4 rows' 16-byte pieces (lane q = row q) -> dword j = the rows'
 * bytes j, xor 0x80 (w' + 128). */
PI2_T_AVX512 static inline __m512i gemm_quad(__m512i v)
{
    const __m512i perm = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m512i tr = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
    return _mm512_xor_si512(_mm512_shuffle_epi8(_mm512_permutexvar_epi32(perm, v), tr), _mm512_set1_epi8(-128));
}

/* rint(x * f) of 16 int32 lanes, as 16 bytes (|.| <= 127). */
PI2_T_AVX512 static inline __m128i gemm_rq(__m512i x, float f)
{
    return _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_cvtepi32_ps(x), _mm512_set1_ps(f))));
}

/* Panels P[0] (columns 0-15 of output block b) and P[1] (16-31) for the
 * chunk's G groups (rows w[0 .. 32 G), zero-factor rows past R). */
PI2_T_AVX512 static void gemm_pack(pi2_qtype wt, const uint8_t *const *w, int G, int64_t b, int lb, const k_gfac *F,
                                   k_panel P[2])
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i vm8 = _mm512_setr_epi32(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
    for (int g = 0; g < G; g++) {
        for (int q = 0; q < 8; q++) {
            const uint8_t *const *p = w + g * K_GR + 4 * q;
            const int r = g * K_GR + 4 * q;
            __m512i lo, hi;
            if (wt == PI2_QT_Q4) {
                __m512i x = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(const void *)(p[0] + b * 16)));
                x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(const void *)(p[1] + b * 16)), 1);
                x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(const void *)(p[2] + b * 16)), 2);
                x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(const void *)(p[3] + b * 16)), 3);
                __m512i L = _mm512_castsi128_si512(gemm_rq(vm8, F->f[r][lb]));
                L = _mm512_inserti32x4(L, gemm_rq(vm8, F->f[r + 1][lb]), 1);
                L = _mm512_inserti32x4(L, gemm_rq(vm8, F->f[r + 2][lb]), 2);
                L = _mm512_inserti32x4(L, gemm_rq(vm8, F->f[r + 3][lb]), 3);
                lo = _mm512_shuffle_epi8(L, _mm512_and_si512(x, m4));
                hi = _mm512_shuffle_epi8(L, _mm512_and_si512(_mm512_srli_epi16(x, 4), m4));
            } else {
                __m128i l[4], h[4];
                for (int i = 0; i < 4; i++) {
                    const uint8_t *s = p[i] + b * 32;
                    l[i] = gemm_rq(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)s)), F->f[r + i][lb]);
                    h[i] = gemm_rq(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(s + 16))),
                                   F->f[r + i][lb]);
                }
                lo = _mm512_inserti32x4(_mm512_inserti32x4(_mm512_inserti32x4(_mm512_castsi128_si512(l[0]), l[1], 1), l[2], 2), l[3], 3);
                hi = _mm512_inserti32x4(_mm512_inserti32x4(_mm512_inserti32x4(_mm512_castsi128_si512(h[0]), h[1], 1), h[2], 2), h[3], 3);
            }
            _mm512_store_si512(P[0].w + g * 512 + q * 64, gemm_quad(lo));
            _mm512_store_si512(P[1].w + g * 512 + q * 64, gemm_quad(hi));
        }
    }
}

/* All T tokens against one panel of gemm_vnni (G groups), each token's
 * 16 results added to its 16 outputs out[t * ldo ..]: the 8-token groups
 * in this loop (panel_toks8's operations; one call per panel, the outputs
 * read and written here), the rest by panel_tokens. */
PI2_T_AVX512 K_NOINLINE static void gemm_tokens(const k_panel *P, int G, const int8_t *aq, int64_t Rp,
                                                const float *sc, const int32_t *bias0, int T, float *out,
                                                int64_t ldo)
{
    int t0 = 0;
    for (; t0 + 8 <= T; t0 += 8) {
        const int8_t *a = aq + t0 * Rp;
        const int32_t *bias = bias0 + t0 * K_PB;
        const float *st = sc + t0 * K_PB;
        int64_t n = Rp;
        __m512 f[8];
        for (int t = 0; t < 8; t++)
            f[t] = _mm512_setzero_ps();
        for (int b = 0; b < G; b++) {
            K_PANEL_DOTS(8, P->w, b);
            _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++)
                f[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[t]), _mm512_set1_ps(st[t * K_PB + b]), f[t]);
        }
        _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++)
        {
            float *o = out + (t0 + t) * ldo;
            _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), f[t]));
        }
    }
    while (t0 < T) {
        __m512 res[8];
        int N = pi2_ki_panel_tokens(pi2_ki_tok_scaled, P, G, aq, Rp, sc, K_PB, bias0, t0, T, res);
        for (int j = 0; j < N; j++) {
            float *o = out + (t0 + j) * ldo;
            _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), res[j]));
        }
        t0 += N;
    }
}

PI2_T_AVX512 static void gemm_vnni(pi2_qtype wt, int64_t n, int nrows, const float *coef, int64_t ldc,
                                   const uint8_t *const *wp, const uint16_t *const *ws, int T, float *out, int64_t ldo)
{
    int64_t nb = n / QG;
    float qmax = wt == PI2_QT_Q4 ? 8.0f : 128.0f;
    int8_t aq[PI2_K_MAX_T * K_GC * K_GR];
    float as[PI2_K_MAX_T * K_GC];
    int32_t su[PI2_K_MAX_T * K_GC], bias[PI2_K_MAX_T * K_PB];
    float sc[PI2_K_MAX_T * K_PB]; /* per token and group: D * sigma of the output block */
    static_assert((int)K_GC <= (int)K_PB, "a row chunk's groups fit a panel");
    k_gfac F;
    k_panel P[2];
    float dcol[16 * K_GC] = {0}; /* [output block in window][group] */
    for (int r0 = 0; r0 < nrows; r0 += K_GC * K_GR) {
        int R = nrows - r0 < K_GC * K_GR ? nrows - r0 : K_GC * K_GR, G = (R + K_GR - 1) / K_GR, Rp = G * K_GR;
        pi2_ki_gemm_coefs(PI2_ISA_AVX512, coef, ldc, T, r0, R, aq, as, su);
        for (int t = 0; t < T; t++)
            for (int g = 0; g < G; g++)
                bias[t * K_PB + g] = -128 * su[t * G + g];
        const uint8_t *w[K_GC * K_GR]; /* rows past R repeat row r0 (factor 0) */
        for (int k = 0; k < G * K_GR; k++)
            w[k] = wp[r0 + (k < R ? k : 0)];
        for (int64_t bw = 0; bw < nb; bw += 16) {
            int kbw = (int)min64(16, nb - bw);
            gemm_factors(qmax, ws + r0, R, G, bw, kbw, &F);
            for (int g = 0; g < G; g++) /* D by output block, then group */
                for (int lb = 0; lb < kbw; lb++)
                    dcol[lb * K_GC + g] = F.D[g][lb];
            for (int lb = 0; lb < kbw; lb++) {
                gemm_pack(wt, w, G, bw + lb, lb, &F, P);
                __m512 Dv = _mm512_loadu_ps(dcol + lb * K_GC);
                __mmask16 gm = (__mmask16)((1u << G) - 1u);
                for (int t = 0; t < T; t++)
                    _mm512_mask_storeu_ps(sc + t * K_PB, gm,
                                          _mm512_mul_ps(Dv, _mm512_maskz_loadu_ps(gm, as + t * G)));
                if (bw + lb + 1 < nb) /* the next output block's strip, token-strided */
                    for (int t = 0; t < T; t++) {
                        _mm_prefetch((const char *)(out + t * ldo + (bw + lb + 1) * QG), _MM_HINT_T0);
                        _mm_prefetch((const char *)(out + t * ldo + (bw + lb + 1) * QG + 16), _MM_HINT_T0);
                    }
                for (int h = 0; h < 2; h++)
                    gemm_tokens(&P[h], G, aq, Rp, sc, bias, T, out + (bw + lb) * QG + 16 * h, ldo);
            }
        }
    }
}

/* The same on AVX2: lanes are 8 output columns. Per output block the
 * requantized weights go into 4 panels of 8 columns as int16 pairs (rows
 * 2p and 2p + 1 of a group in a column's dword), the coefficients widened
 * to int16 once per row chunk; vpmaddwd of a panel's pair and a token's
 * broadcast coefficient pair gives both rows' exact products per column
 * (|w' cq| <= 127 * 127: no saturation), so the group's 16 pair sums are
 * the twin's S in int32. The factors, D and the FMA chain are the twin's
 * float operations. */
typedef struct k_gpan2 {
    _Alignas(32) int32_t w[4][K_GC * K_GR / 2][8]; /* [column group][row pair][column]: two int16 */
} k_gpan2;

/* rint(x * f) of 8 int32 lanes (|.| <= 127 for finite factors). */
PI2_T_AVX2 static inline __m256i gemm2_rq(__m256i x, float f)
{
    return _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_cvtepi32_ps(x), _mm256_set1_ps(f)));
}

/* Block b's panels for the chunk's G groups: rows w[0 .. 32 G), the
 * factor of row r f[r] (0 past R). */
PI2_T_AVX2 static void gemm2_pack(pi2_qtype wt, const uint8_t *const *w, int G, int64_t b, const float *f, k_gpan2 *P)
{
    for (int r = 0; r < G * K_GR; r += 2) {
        __m256i v[2][4];
        for (int i = 0; i < 2; i++) {
            if (wt == PI2_QT_Q4) {
                _Alignas(32) uint8_t nib[QG];
                _mm256_store_si256((__m256i *)(void *)nib, q4_nibbles(w[r + i] + b * PI2_Q4_GROUP_BYTES));
                for (int c = 0; c < 4; c++)
                    v[i][c] = gemm2_rq(_mm256_sub_epi32(ld_u8x8(nib + 8 * c), _mm256_set1_epi32(8)), f[r + i]);
            } else {
                for (int c = 0; c < 4; c++)
                    v[i][c] = gemm2_rq(ld_i8x8(w[r + i] + b * QG + 8 * c), f[r + i]);
            }
        }
        for (int c = 0; c < 4; c++)
            _mm256_store_si256((__m256i *)(void *)P->w[c][r / 2],
                               _mm256_blend_epi16(v[0][c], _mm256_slli_epi32(v[1][c], 16), 0xaa));
    }
}

/* N tokens (ca: their coefficient pairs, Rp2 apart; sc: scales, K_PB
 * apart) against the two panels P and P + PS (8 columns each; a panel's
 * row pairs are 8 dwords), each token's 16 results added to
 * out[t * ldo ..]. */
enum { K_G2PS = K_GC * K_GR / 2 * 8 }; /* dwords from one column group's panel to the next */
PI2_T_AVX2 static inline __attribute__((always_inline)) void gemm2_toks(int N, const int32_t *P, int G,
                                                                       const k_u32a *ca, int64_t Rp2,
                                                                       const float *sc, float *out, int64_t ldo)
{
    __m256 f[4][2];
    _Pragma("GCC unroll 4") for (int t = 0; t < N; t++)
        f[t][0] = f[t][1] = _mm256_setzero_ps();
    for (int g = 0; g < G; g++) {
        __m256i acc[4][2];
        _Pragma("GCC unroll 4") for (int t = 0; t < N; t++)
            acc[t][0] = acc[t][1] = _mm256_setzero_si256();
        _Pragma("GCC unroll 16") for (int k = 0; k < K_GR / 2; k++) {
            int p = g * K_GR / 2 + k;
            __m256i w0 = _mm256_load_si256((const __m256i *)(const void *)(P + 8 * p));
            __m256i w1 = _mm256_load_si256((const __m256i *)(const void *)(P + K_G2PS + 8 * p));
            _Pragma("GCC unroll 4") for (int t = 0; t < N; t++) {
                __m256i c = _mm256_set1_epi32(ca[t * Rp2 + p]);
                acc[t][0] = _mm256_add_epi32(acc[t][0], _mm256_madd_epi16(w0, c));
                acc[t][1] = _mm256_add_epi32(acc[t][1], _mm256_madd_epi16(w1, c));
            }
        }
        _Pragma("GCC unroll 4") for (int t = 0; t < N; t++) {
            __m256 s = _mm256_set1_ps(sc[t * K_PB + g]);
            f[t][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[t][0]), s, f[t][0]);
            f[t][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[t][1]), s, f[t][1]);
        }
    }
    _Pragma("GCC unroll 4") for (int t = 0; t < N; t++) {
        float *o = out + t * ldo;
        _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), f[t][0]));
        _mm256_storeu_ps(o + 8, _mm256_add_ps(_mm256_loadu_ps(o + 8), f[t][1]));
    }
}

/* All T tokens against two panels: 4 at a time, then 2, 1. */
PI2_T_AVX2 K_NOINLINE static void gemm2_tokens(const int32_t *P, int G, const k_u32a *ca, int64_t Rp2,
                                               const float *sc, int T, float *out, int64_t ldo)
{
    int t = 0;
    for (; t + 4 <= T; t += 4)
        gemm2_toks(4, P, G, ca + t * Rp2, Rp2, sc + t * K_PB, out + t * ldo, ldo);
    if (t + 2 <= T) {
        gemm2_toks(2, P, G, ca + t * Rp2, Rp2, sc + t * K_PB, out + t * ldo, ldo);
        t += 2;
    }
    if (t < T)
        gemm2_toks(1, P, G, ca + t * Rp2, Rp2, sc + t * K_PB, out + t * ldo, ldo);
}

PI2_T_AVX2 static void gemm_avx2(pi2_qtype wt, int64_t n, int nrows, const float *coef, int64_t ldc,
                                 const uint8_t *const *wp, const uint16_t *const *ws, int T, float *out, int64_t ldo)
{
    int64_t nb = n / QG;
    float qmax = wt == PI2_QT_Q4 ? 8.0f : 128.0f;
    int8_t aq[PI2_K_MAX_T * K_GC * K_GR];
    _Alignas(32) int16_t ca[PI2_K_MAX_T * K_GC * K_GR];
    float as[PI2_K_MAX_T * K_GC];
    int32_t su[PI2_K_MAX_T * K_GC];
    float sc[PI2_K_MAX_T * K_PB]; /* per token and group: D * sigma of the output block */
    static_assert((int)K_GC <= (int)K_PB, "a row chunk's groups fit a scale row");
    k_gpan2 P;
    for (int r0 = 0; r0 < nrows; r0 += K_GC * K_GR) {
        int R = nrows - r0 < K_GC * K_GR ? nrows - r0 : K_GC * K_GR, G = (R + K_GR - 1) / K_GR, Rp = G * K_GR;
        pi2_ki_gemm_coefs(PI2_ISA_AVX2, coef, ldc, T, r0, R, aq, as, su);
        for (int64_t i = 0; i < (int64_t)T * Rp; i += 16)
            _mm256_store_si256((__m256i *)(void *)(ca + i),
                               _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(aq + i))));
        const k_u32a *ca2 = (const k_u32a *)(const void *)ca;
        const uint8_t *w[K_GC * K_GR]; /* rows past R repeat row r0 (factor 0) */
        for (int k = 0; k < Rp; k++)
            w[k] = wp[r0 + (k < R ? k : 0)];
        for (int64_t b = 0; b < nb; b++) {
            float f[K_GC * K_GR], D[K_GC];
            for (int g = 0; g < G; g++) {
                float m = 0.0f;
                for (int k = 0; k < K_GR; k++) {
                    int r = g * K_GR + k;
                    f[r] = r < R ? _cvtsh_ss(ws[r0 + r][b]) : 0.0f;
                    m = fmaxf(m, fabsf(f[r]));
                }
                bool ok = m >= K_DMIN;
                float inv = ok ? 127.0f / (qmax * m) : 0.0f;
                D[g] = ok ? qmax * m / 127.0f : 0.0f;
                for (int k = 0; k < K_GR; k++)
                    f[g * K_GR + k] *= inv;
            }
            gemm2_pack(wt, w, G, b, f, &P);
            for (int t = 0; t < T; t++)
                for (int g = 0; g < G; g++)
                    sc[t * K_PB + g] = D[g] * as[t * G + g];
            for (int c = 0; c < 4; c += 2)
                gemm2_tokens(P.w[c][0], G, ca2, Rp / 2, sc, T, out + b * QG + 8 * c, ldo);
        }
    }
}

#endif /* PI2_K_X86 */

void pi2_k_down_gemm_isa(pi2_isa isa, pi2_qtype wt, int64_t n, int nrows, const float *coef, int64_t ldc,
                         const uint8_t *const *wp, const uint16_t *const *ws, int T, float *out, int64_t ldo)
{
    assert((wt == PI2_QT_Q4 || wt == PI2_QT_Q8) && n % QG == 0 && nrows >= 0 && T >= 1 && T <= PI2_K_MAX_T);
    if (nrows == 0)
        return;
#ifdef PI2_K_ARM64
    if (pi2_ki_down_gemm_neon(isa, wt, n, nrows, coef, ldc, wp, ws, T, out, ldo))
        return;
#endif
#ifdef PI2_K_X86
    if (pi2_ki_isa_pick(isa) == PI2_ISA_AVX512) {
        gemm_vnni(wt, n, nrows, coef, ldc, wp, ws, T, out, ldo);
        return;
    }
    if (pi2_ki_isa_pick(isa) == PI2_ISA_AVX2) {
        gemm_avx2(wt, n, nrows, coef, ldc, wp, ws, T, out, ldo);
        return;
    }
#elif !defined(PI2_K_ARM64)
    (void)isa;
#endif
    gemm_scalar(wt, n, nrows, coef, ldc, wp, ws, T, out, ldo);
}

void pi2_k_down_gemm(pi2_qtype wt, int64_t n, int nrows, const float *coef, int64_t ldc, const uint8_t *const *wp,
                     const uint16_t *const *ws, int T, float *out, int64_t ldo)
{
    pi2_k_down_gemm_isa(pi2_k_get_isa(), wt, n, nrows, coef, ldc, wp, ws, T, out, ldo);
}
