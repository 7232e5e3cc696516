/* Private to runtime/kernels/: what the op families share. The public
 * contract is runtime/kernels.h; nothing outside this folder includes
 * this file.
 *
 * Each kernel has a scalar twin (plain loops; for the quantized rows they
 * are formats/quant.c's own reference loops), kept in the file of its
 * family, and SIMD variants (x86-64 or arm64) compiled with target
 * attributes and picked per call from the one ISA state (isa.c:
 * pi2_k_get_isa) or the forced `isa`.
 *
 * ---- Forced ISA ----
 * The *_isa variants run the path asked for when this CPU supports it and
 * the scalar twin otherwise (never an illegal instruction). F32 weight rows
 * always take the scalar twin: the SIMD kernels are for Q4 and Q8.
 *
 * Families: matmul.c and matmul_avx512.c (one-token matmul and the
 * AVX2 4 x 4 tiles), panels.c (prefill panels, the superblock GEMM),
 * down.c and down_avx512.c (down projection by rows, and axpy),
 * down_gemm.c (prefill down projection on the panels), act.c
 * (activation quantization), vec.c (dequant, f32 GEMV, softmax), probe.c; on
 * arm64 the *_neon.c files, which each entry point asks first.
 */
#ifndef PI2_KERNELS_INTERNAL_H
#define PI2_KERNELS_INTERNAL_H

#include "runtime/kernels.h"

#include <float.h>
#include <math.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PI2_K_X86 1
#include <cpuid.h>
#include <immintrin.h>
#endif
#if defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
#define PI2_K_ARM64 1
#include <arm_neon.h>
#endif

#define QG PI2_Q_GROUP

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* The down twin's integer algorithm (kernels.h): rows per group, and the
 * smallest max |c| (and scale) that still contributes. */
#define K_DG 16            /* rows per down group (one int8 coefficient scale) */
#define K_DMIN 0x1p-100f   /* groups with max |c| below this contribute nothing */

/* Prefill panels: a superblock is K_SB blocks (256 values; the row's last
 * may be shorter); chunks of K_PB blocks (the panels') hold whole
 * superblocks. */
enum {
    K_PB = 64, /* blocks per panel chunk: weights 32 KiB */
    K_SB = PI2_K_SB / QG /* blocks per superblock */
};
#define K_KONE 4096.0f /* a superblock's largest block scale as an int16 factor */

/* Down projection by rows: chunks of rows and of blocks. */
enum {
    K_DRC = 64, /* rows per chunk */
    K_DKB = 64  /* blocks per block chunk, at most (a multiple of 8) */
};

/* cp[t * K_DRC + k] = coefficient r0 + k of token t for k < R, 0 up to
 * kp (the chunk's rows rounded up to whole groups). */
static inline void down_coefs(const float *coef, int64_t ldc, int T, int r0, int R, int kp, float *cp)
{
    for (int t = 0; t < T; t++) {
        memcpy(cp + t * K_DRC, coef + t * ldc + r0, (size_t)R * sizeof(float));
        for (int k = R; k < kp; k++)
            cp[t * K_DRC + k] = 0.0f;
    }
}

/* The fixed orders of the matmul family's float sums (kernels.h,
 * Numerics): per (row, token), chunks of K_MC blocks from block 0; the
 * chunks' sums added in order to +0. In a chunk, under K_BATCH_T tokens
 * (the one-token kernels), 16 striped partial sums (block b into stripe
 * b % 16, each from +0 by fma((float)dot_b, d_b * as_b, stripe) in block
 * order), combined by k_tree16; from K_BATCH_T tokens (the panels), one
 * such chain over all its blocks. No partial sum is ever -0, so one
 * without blocks (+0) changes nothing it is added to. */
enum { K_MC = 64 };
/* Batches of this many tokens or more take the batch order instead: per
 * chunk one FMA chain over its blocks in order from +0 (the panels'). */
enum { K_BATCH_T = 4 };

/* x[0..16) summed in one fixed tree: halves, quarters, then pairs
 * (y_j = x_j + x_j+8, z_i = y_i + y_i+4, (z_0 + z_2) + (z_1 + z_3)): the
 * order GCC's _mm512_reduce_add_ps takes, and k_sum16's. */
static inline float k_tree16(const float x[16])
{
    float y[8], z[4];
    for (int j = 0; j < 8; j++)
        y[j] = x[j] + x[j + 8];
    for (int i = 0; i < 4; i++)
        z[i] = y[i] + y[i + 4];
    return (z[0] + z[2]) + (z[1] + z[3]);
}

/* Dispatch thresholds (tokens per call). */
enum {
    K_PANEL_MIN_T = K_BATCH_T, /* AVX-512 VNNI matmul: fewer tokens take the decode path */
    K_P2_MIN_T = 16,     /* AVX2 Q4 matmul: fewer tokens keep the t4 tiles: the packing would not pay */
    K_DOWN512_MIN_T = 4  /* AVX-512 VNNI down: fewer tokens take the 256-bit path */
};

/* ---- ISA state (isa.c) ---- */

/* The path a forced call runs: `isa` if supported, else scalar. */
pi2_isa pi2_ki_isa_pick(pi2_isa isa);

/* The prefill down GEMM's coefficients (down_gemm.c, every path): rows
 * r0 .. r0 + R of T tokens quantized per group of 32 rows as activations
 * are, into aq[t * Rp ..] (Rp = R rounded up to whole groups, zeros past
 * R), as[t * G + g] and su[t * G + g]. */
void pi2_ki_gemm_coefs(pi2_isa isa, const float *coef, int64_t ldc, int T, int r0, int R, int8_t *aq, float *as,
                       int32_t *su);
/* The down GEMM's weight group of n rows ws[0 .. n) (rows at or past R
 * read as scale 0) in block b: each row's scale into d[0 .. n), the
 * group's scale into *D, and the factor that requantizes a row's weights
 * to it (d[k] * factor) returned; both 0 for a group whose largest scale
 * is below K_DMIN. The scalar and NEON paths share it. */
static inline float k_gemm_wgroup(const uint16_t *const *ws, int n, int R, int64_t b, float qmax, float *d, float *D)
{
    float m = 0.0f;
    for (int k = 0; k < n; k++) {
        d[k] = k < R ? pi2_f16_to_f32(ws[k][b]) : 0.0f;
        m = fmaxf(m, fabsf(d[k]));
    }
    bool ok = m >= K_DMIN;
    *D = ok ? qmax * m / 127.0f : 0.0f;
    return ok ? 127.0f / (qmax * m) : 0.0f;
}

#ifdef PI2_K_ARM64

/* Whether a picked path (pi2_ki_isa_pick) is one of the NEON levels. */
static inline bool k_neon(pi2_isa p) { return p == PI2_ISA_NEON || p == PI2_ISA_DOTPROD || p == PI2_ISA_I8MM; }

/* A Q4 or Q8 weight block at p as 32 int8 (Q4: nibble - 8, byte j holding
 * values j (low) and j + 16 (high)): lo = values 0..15, hi = 16..31. */
static inline void k_neon_wblk(const uint8_t *p, bool q4, int8x16_t *lo, int8x16_t *hi)
{
    if (q4) {
        uint8x16_t raw = vld1q_u8(p);
        *lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(0x0f))), vdupq_n_s8(8));
        *hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(raw, 4)), vdupq_n_s8(8));
    } else {
        *lo = vld1q_s8((const int8_t *)p);
        *hi = vld1q_s8((const int8_t *)p + 16);
    }
}

/* ---- the NEON paths (*_neon.c) ----
 * Each returns false, computing nothing, when the picked path of `isa` is
 * scalar (or the weights are not Q4/Q8); the family's entry point then
 * runs its scalar twin. */
bool pi2_ki_mm_neon(pi2_isa isa, pi2_qtype wt, int64_t n, int nrows, const uint8_t *const *wp,
                    const uint16_t *const *ws, const float *ascales, const int8_t *aq, int T, float *out,
                    int64_t ldo);
bool pi2_ki_down_neon(pi2_isa isa, pi2_qtype wt, int64_t n, int nrows, const float *coef, int64_t ldc,
                      const uint8_t *const *wp, const uint16_t *const *ws, int T, float *out, int64_t ldo);
bool pi2_ki_down_gemm_neon(pi2_isa isa, pi2_qtype wt, int64_t n, int nrows, const float *coef, int64_t ldc,
                           const uint8_t *const *wp, const uint16_t *const *ws, int T, float *out, int64_t ldo);
bool pi2_ki_matmul_sb_neon(pi2_isa isa, int64_t n, int nrows, const uint8_t *const *wp, const uint16_t *const *ws,
                           const float *ascales, const int8_t *aq, int T, float *out, int64_t ldo);
bool pi2_ki_act_quantize_sb_neon(pi2_isa isa, const float *x, int64_t ldx, int T, int64_t n, float *scales,
                                 int8_t *q, int32_t *sums);
/* pi2_k_sgemv (transposed: pi2_k_sgemv_t; x is then the coefficients, and
 * acc adds to out, continuing its chains) */
bool pi2_ki_sgemv_neon(pi2_isa isa, bool transposed, bool acc, const float *W, int64_t ldw, int64_t n, int nrows,
                       const float *x, float *out);
bool pi2_ki_act_quantize_neon(pi2_isa isa, const float *x, int64_t ldx, int T, int64_t n, float *scales, int8_t *q,
                              int32_t *sums);
bool pi2_ki_softmax_neon(pi2_isa isa, float *x, int64_t n);
bool pi2_ki_dequant_neon(pi2_isa isa, pi2_qtype wt, int64_t n, int nrows, const uint8_t *const *wp,
                         const uint16_t *const *ws, float *dst);

#endif /* PI2_K_ARM64 */

#ifdef PI2_K_X86

/* Whether the AVX-512 Q4 one-token kernels take the high nibbles by GFNI. */
bool pi2_ki_gfni(void);

/* ---- x86 building blocks ---- */

#define PI2_T_AVX2 __attribute__((target("avx2,fma,f16c")))
/* avx512vl too: with BW enabled the compiler may pick EVEX forms of 256-bit
 * moves (vmovdqu16 ymm), which need VL, and 256-bit vpdpbusd is VL. Every
 * VNNI CPU has VL. */
#define PI2_T_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
/* The same with GFNI (pi2_ki_gfni): AVX-512 CPUs have it from Ice Lake and Zen 4 on. */
#define PI2_T_AVX512G __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,gfni")))
/* The panel kernels stay functions of their own, as they were while each
 * had several callers: GCC would inline one with a single caller into
 * that caller's loops, and nothing showed that to gain (runtime/PERF.md). */
#define K_NOINLINE __attribute__((noinline))

/* A 4-byte load from any address. */
typedef int32_t k_u32a __attribute__((may_alias, aligned(1)));

PI2_T_AVX2 static inline __m256i ld256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* 16 Q4 bytes -> the group's 32 nibbles in element order (byte j: element
 * j low, j + 16 high): both 128-bit halves get the bytes, the upper half is
 * shifted right by 4 within its 64-bit lanes, and the mask drops the bits
 * that crossed bytes. */
PI2_T_AVX2 static inline __m256i q4_nibbles(const uint8_t *p)
{
    __m256i raw = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)p));
    return _mm256_and_si256(_mm256_srlv_epi64(raw, _mm256_set_epi64x(4, 4, 0, 0)), _mm256_set1_epi8(0x0f));
}

/* k_tree16's tree on registers: k_sum4 of 4 lanes (x_0 + x_2) + (x_1 +
 * x_3), k_sum8 of 8 (quarters, then k_sum4), k_sum16 of 16; a row's
 * stripes 0-7 and 8-15 in two ymm sum as k_sum8(lo + hi). */
PI2_T_AVX2 static inline float k_sum4(__m128 x)
{
    __m128 w = _mm_add_ps(x, _mm_shuffle_ps(x, x, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtss_f32(w) + _mm_cvtss_f32(_mm_shuffle_ps(w, w, 1));
}

PI2_T_AVX2 static inline float k_sum8(__m256 x)
{
    return k_sum4(_mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x)));
}

/* The sum of 16 lanes in k_tree16's order, so that narrow rows can take
 * its subtrees: a row in lanes 0-7 (0-3) of an otherwise zero vector sums
 * as k_sum8 (k_sum4) of those lanes, no lane ever being -0. */
PI2_T_AVX512 static inline float k_sum16(__m512 x)
{
    return k_sum8(_mm256_add_ps(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)),
                                _mm512_castps512_ps256(x)));
}

/* dst[i] = fp16 h[i] as float (exact), i < n. */
PI2_T_AVX2 static inline void cvt_scales(const uint16_t *h, int64_t n, float *dst)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(h + i))));
    for (; i < n; i++)
        dst[i] = _cvtsh_ss(h[i]);
}

/* 8 bytes zero- or sign-extended to int32. */
PI2_T_AVX2 static inline __m256i ld_u8x8(const uint8_t *p)
{
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)p));
}

PI2_T_AVX2 static inline __m256i ld_i8x8(const uint8_t *p)
{
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)p));
}

/* A prefetch the compiler keeps: GCC deletes a loop of _mm_prefetch alone
 * whose variables nothing reads after it (k_pf_tile's loop compiles to
 * nothing in the short-row kernels). */
static inline void k_prefetch_t0(const void *p)
{
    __asm__ volatile("prefetcht0 %0" : : "m"(*(const char *)p));
}

/* Tile i of `tiles`' share [p0, p1) of a caller's prefetch range of len
 * bytes: whole lines, the last tile taking the rest. */
static inline void k_pf_share(int64_t len, int64_t i, int64_t tiles, int64_t *p0, int64_t *p1)
{
    *p0 = len * i / tiles / 64 * 64;
    *p1 = i + 1 == tiles ? len : len * (i + 1) / tiles / 64 * 64;
}

/* Tile i's share of [pf, pf + len) toward L2 (pf NULL: nothing). */
static inline void k_pf_tile(const uint8_t *pf, int64_t len, int64_t i, int64_t tiles)
{
    if (!pf)
        return;
    int64_t p0, p1;
    k_pf_share(len, i, tiles, &p0, &p1);
    for (int64_t o = p0; o < p1; o += 64)
        _mm_prefetch((const char *)(pf + o), _MM_HINT_T1);
}

/* Bytes of a paced prefetch per step: len spread over steps, whole lines. */
static inline int64_t k_pf_quota(int64_t len, int64_t steps)
{
    return steps > 0 ? (len + 64 * steps - 1) / (64 * steps) * 64 : len;
}

/* A panel GEMM's pack meets its rows cold, R row streams at once, so while
 * one panel of R rows computes, the next panel's rows (the R after row r0,
 * fewer at the end) go toward L2 over the chunk at byte offset off, `lines`
 * lines a row, a share per token group: up to group `done` of ngrp; *pf
 * counts the lines issued. */
static inline void k_panel_pf(const uint8_t *const *wp, int r0, int R, int nrows, int64_t off, int64_t lines,
                              int64_t done, int64_t ngrp, int64_t *pf)
{
    int nk = nrows - r0 - R < R ? nrows - r0 - R : R;
    if (nk <= 0)
        return;
    for (int64_t e = R * lines * done / ngrp; *pf < e; (*pf)++) {
        int k = (int)(*pf % R);
        if (k < nk)
            _mm_prefetch((const char *)(wp[r0 + R + k] + off + *pf / R * 64), _MM_HINT_T1);
    }
}

/* The 4 x 4 transpose of 128-bit lanes: r[i] lane L = a[L] lane i. */
PI2_T_AVX512 static inline void lanes_t4(__m512 a0, __m512 a1, __m512 a2, __m512 a3, __m512 r[4])
{
    __m512 t0 = _mm512_shuffle_f32x4(a0, a1, 0x44), t1 = _mm512_shuffle_f32x4(a0, a1, 0xee);
    __m512 t2 = _mm512_shuffle_f32x4(a2, a3, 0x44), t3 = _mm512_shuffle_f32x4(a2, a3, 0xee);
    r[0] = _mm512_shuffle_f32x4(t0, t2, 0x88);
    r[1] = _mm512_shuffle_f32x4(t0, t2, 0xdd);
    r[2] = _mm512_shuffle_f32x4(t1, t3, 0x88);
    r[3] = _mm512_shuffle_f32x4(t1, t3, 0xdd);
}

/* ---- matmul (matmul.c, matmul_avx512.c) ---- */

/* Per (token group of 4, pair of blocks b, b + 1): the tokens' activation
 * scales and int32 offsets (corr * sum of the block's q; see the products
 * below), lanes [b: t0..t3 | b + 1: t0..t3]. 64 bytes. */
typedef struct k_tok4 {
    float as[8];
    int32_t corr[8];
} k_tok4;

typedef void (*k_t4_fn)(const uint8_t *const w[4], const float *wsp, int64_t kb, const int8_t *const a[4],
                        const k_tok4 *pre, float res[16]);
typedef void (*k_t1_fn)(const uint8_t *const w[4], const uint16_t *const s[4], int64_t nb, const int8_t *a,
                        const float *as, const int32_t *sums, const uint8_t *const wn[4], const uint8_t *pf2,
                        int64_t pf2_len, float res[4]);

/* One token against nrows rows of nb < 16 blocks: out[r] (mm_one_token's
 * contract, the caller's prefetch range included). */
typedef void k_short_fn(int64_t nb, int nrows, const uint8_t *const *wp, const uint16_t *const *ws, const float *as,
                        const int8_t *a, const int32_t *sums, float *out, const uint8_t *pf, int64_t pf_len);

typedef struct k_mm_ops {
    k_t4_fn t4;    /* on payload rows, or (Q4) on rows unpacked by q4_unpack_rows */
    k_t4_fn t4raw; /* Q4 on payload rows, for few token groups (NULL: t4 is) */
    k_t1_fn t1;
    k_t1_fn t1s;   /* t1 on activations rearranged by split (NULL: none) */
    k_t1_fn t1sg;  /* t1s with GFNI (pi2_ki_gfni) */
    void (*split)(const int8_t *a, int64_t nb, int8_t *dst);
    int32_t corr; /* k_tok4 offset: corr * sum(a) per block */
    int64_t gb;   /* payload bytes per block */
    k_short_fn *t1short, *t1shortg; /* one token, rows of under 16 blocks (NULL: t1's tail); with GFNI */
} k_mm_ops;

/* AVX2, one token, rows of under 16 blocks (matmul_avx2.c). */
k_short_fn pi2_ki_mm_short_q4_avx2, pi2_ki_mm_short_q8_avx2;

/* The AVX-512 VNNI one-token kernels (matmul_avx512.c). */
extern const k_mm_ops pi2_ki_mm_q4_vnni, pi2_ki_mm_q8_vnni;

/* ---- prefill panels (panels.c) ---- */

typedef struct k_panel {
    _Alignas(64) uint8_t w[K_PB * 8 * 64]; /* [block][group][lane][4 bytes] */
    union {
        _Alignas(64) float s[K_PB * 16];  /* [block][lane] scales */
        _Alignas(64) int32_t k[K_PB * 16]; /* superblock panels: [block][lane] int16 factors */
    };
    _Alignas(64) float d[K_PB / K_SB * 16]; /* superblock panels: [superblock][lane] scales */
} k_panel;

/* In a panel kernel's block loop (a, n, bias in scope): __m512i acc[N] =
 * the exact sums of block b of the panel weights W for N tokens, each
 * starting at its bias, then the 8 vpdpbusd rounds with the token's 4
 * activation bytes broadcast. */
#define K_DP_ROUND(N, j)                                                                                      \
    _Pragma("GCC unroll 8") for (int t = 0; t < N; t++)                                                       \
        acc[t] = _mm512_dpbusd_epi32(acc[t], w##j, _mm512_set1_epi32(av[t][j]));
#define K_PANEL_DOTS(N, W, b)                                                                                 \
    const __m512i *wb = (const __m512i *)(const void *)((W) + (b) * 512);                                    \
    __m512i w0 = _mm512_load_si512(wb), w1 = _mm512_load_si512(wb + 1);                                       \
    __m512i w2 = _mm512_load_si512(wb + 2), w3 = _mm512_load_si512(wb + 3);                                   \
    __m512i w4 = _mm512_load_si512(wb + 4), w5 = _mm512_load_si512(wb + 5);                                   \
    __m512i w6 = _mm512_load_si512(wb + 6), w7 = _mm512_load_si512(wb + 7);                                   \
    __m512i acc[N];                                                                                           \
    const k_u32a *av[N];                                                                                      \
    _Pragma("GCC unroll 8") for (int t = 0; t < N; t++)                                                       \
    {                                                                                                         \
        av[t] = (const k_u32a *)(const void *)(a + t * n + (b) * QG);                                         \
        acc[t] = _mm512_set1_epi32(bias[t * K_PB + (b)]);                                                     \
    }                                                                                                         \
    K_DP_ROUND(N, 0) K_DP_ROUND(N, 1) K_DP_ROUND(N, 2) K_DP_ROUND(N, 3)                                       \
    K_DP_ROUND(N, 4) K_DP_ROUND(N, 5) K_DP_ROUND(N, 6) K_DP_ROUND(N, 7)

/* The panel kernels of one family (panel_tok, panel_toks, sb_tok) for 8,
 * 4, 2 and 1 tokens; sc: per token scales, ss apart. */
typedef void k_tok_fn(const k_panel *P, int64_t kb, const int8_t *a, int64_t n, const float *sc, int64_t ss,
                      const int32_t *bias, __m512 *res);
/* panel_toks: one scale per token and block for all 16 lanes */
extern k_tok_fn *const pi2_ki_tok_scaled[4];
/* The next group of tokens from t0 of T (8, then 4, 2, 1) against a
 * panel, by the family's kernel for that many; returns N. */
int pi2_ki_panel_tokens(k_tok_fn *const fam[4], const k_panel *P, int64_t kb, const int8_t *a, int64_t n,
                        const float *sc, int64_t ss, const int32_t *bias, int t0, int T, __m512 res[8]);

/* pi2_k_matmul on AVX2 panels of 8 Q4 rows (T >= K_P2_MIN_T); sb:
 * pi2_k_matmul_sb (any T). */
PI2_T_AVX2 void pi2_ki_mm_panels_avx2(bool sb, int64_t n, int nrows, const uint8_t *const *wp,
                                      const uint16_t *const *ws, const float *ascales, const int8_t *aq,
                                      const int32_t *asums, int T, float *out, int64_t ldo);
/* All of pi2_k_matmul (sb: pi2_k_matmul_sb, Q4) on the panels: block
 * chunks of K_PB, in them row panels of 16 (the last one repeats its last
 * row; those lanes are not stored), in them tokens in groups of 8 (then
 * 4, 2, 1). */
PI2_T_AVX512 void pi2_ki_mm_panels(pi2_qtype wt, bool sb, int64_t n, int nrows, const uint8_t *const *wp,
                                   const uint16_t *const *ws, const float *ascales, const int8_t *aq,
                                   const int32_t *asums, int T, float *out, int64_t ldo);

/* ---- down projection on AVX-512 VNNI (down_avx512.c) ---- */

/* pi2_k_down_rows for T >= K_DOWN512_MIN_T. */
PI2_T_AVX512 void pi2_ki_down_vnni512(pi2_qtype wt, int64_t n, int nrows, const float *coef, int64_t ldc,
                                      const uint8_t *const *wp, const uint16_t *const *ws, int T, float *out,
                                      int64_t ldo);
/* pi2_k_down_rows_pf for one token. */
PI2_T_AVX512 void pi2_ki_down_one512(pi2_qtype wt, int64_t n, int nrows, const float *coef, const uint8_t *const *wp,
                                     const uint16_t *const *ws, float *out, const uint8_t *pf, int64_t pf_len);

#endif /* PI2_K_X86 */

#endif
