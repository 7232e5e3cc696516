/* Runtime kernels (contract in kernels.h). Each kernel has a scalar twin
 * (plain loops; for the quantized rows they are formats/quant.c's own
 * reference loops) and x86 SIMD variants compiled with target attributes
 * and picked per call from pi2_q_get_isa() or the forced `isa`.
 *
 * ---- Forced ISA ----
 * The *_isa variants run the path asked for when this CPU supports it and
 * the scalar twin otherwise (never an illegal instruction). F32 weight rows
 * always take the scalar twin: the SIMD kernels are for Q4 and Q8.
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
 *     contiguous floats). Batches under 4 tokens and a lone 4k+1-th token
 *     run as decode; 2 or 3 left-over tokens form a padded group.
 *   - Q4's (q - 8) offset is applied as 8 * sum(a) per block in int32, from
 *     the sums pi2_k_act_quantize writes. Q8 on AVX2 uses the sign trick
 *     (|w| unsigned x sign(a, w)); on VNNI it multiplies (w + 128) unsigned
 *     by a and subtracts 128 * sum(a), so no per-token sign operation.
 *   - Per (token group, block pair) scale and offset vectors are gathered
 *     once per call into a stack table (k_tok4); blocks are processed in
 *     chunks that keep that table at 32 KiB, and each chunk's partial dot
 *     is added into out. Rows and tokens past the end of a tile repeat the
 *     last valid row/token and their results are dropped.
 *   - Two rows are interleaved statement by statement: each row's block is
 *     a ~25-cycle dependency chain, and one row at a time in program order
 *     fills the out-of-order window with waiting instructions.
 * Each lane accumulates at most nb/2 terms (plus the chunk and final
 * additions), within kernels.h's bound.
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
 * scale vector by the token's scale and one FMA. Each output sums its
 * blocks in order (plus one add per 64-block chunk): within kernels.h's
 * bound. Under 4 tokens (decode) the 4 x 1 path stays: repacking would
 * cost more than it saves.
 *
 * ---- down on AVX-512 VNNI, 4+ tokens ----
 * The 256-bit down path widens int16 pair products; with vpdpbusd the
 * output columns become the lanes (16 per zmm) and 4 rows are summed per
 * instruction, the weights repacked once per block for all tokens. What
 * costs besides the dots is quantizing the coefficients (the integer
 * algorithm of kernels.h, per token, block and group): that is built 16
 * blocks per vector. Bit-identical to the twin like the other paths.
 *
 * ---- activation quantization ----
 * Prefill quantizes each layer's inputs on one thread between the
 * parallel matmuls; on AVX-512 it runs vectorized (bit-identical).
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
#include "runtime/kernels.h"

#include <float.h>
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PI2_K_X86 1
#include <cpuid.h>
#include <immintrin.h>
#endif

#define QG PI2_Q_GROUP

/* ---- activations ---- */

static void act_quantize_scalar(const float *x, int64_t ldx, int T, int64_t n, float *scales, int8_t *q,
                                int32_t *sums)
{
    int64_t nb = n / QG;
    for (int t = 0; t < T; t++) {
        int8_t *qt = q + (int64_t)t * n;
        pi2_q8act_quantize(x + (int64_t)t * ldx, n, scales + (int64_t)t * nb, qt);
        for (int64_t b = 0; b < nb; b++) {
            int32_t s = 0;
            for (int j = 0; j < QG; j++)
                s += qt[b * QG + j];
            sums[(int64_t)t * nb + b] = s;
        }
    }
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* ---- scalar twins ---- */

static void matmul_scalar(pi2_qtype wt, int64_t n, int nrows, const uint8_t *const *wp, const uint16_t *const *ws,
                          const float *ascales, const int8_t *aq, int T, float *out, int64_t ldo)
{
    int64_t nb = n / QG;
    for (int t = 0; t < T; t++)
        for (int r = 0; r < nrows; r++)
            out[t * ldo + r] = pi2_q_dot_q8act_scalar(wt, ws[r], wp[r], ascales + t * nb, aq + t * n, n);
}

static void axpy_scalar(pi2_qtype wt, int64_t n, int nrows, const float *coef, const uint8_t *const *wp,
                        const uint16_t *const *ws, float *out)
{
    for (int r = 0; r < nrows; r++)
        pi2_q_axpy_row(wt, coef[r], ws[r], wp[r], n, out);
}

/* The down twin: kernels.h's integer algorithm in plain loops. */
#define K_DG 16            /* rows per down group (one int8 coefficient scale) */
#define K_DMIN 0x1p-100f   /* groups with max |c| below this contribute nothing */

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

static void gemm_coefs(pi2_isa isa, const float *coef, int64_t ldc, int T, int r0, int R, int8_t *aq, float *as,
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
        gemm_coefs(PI2_ISA_SCALAR, coef, ldc, T, r0, R, aq, as, su);
        for (int64_t b = 0; b < nb; b++) {
            float D[K_GC];
            int8_t w2[K_GC * K_GR][QG]; /* requantized weights of the block */
            for (int g = 0; g < G; g++) {
                float d[K_GR], m = 0.0f;
                for (int k = 0; k < K_GR; k++) {
                    int r = g * K_GR + k;
                    d[k] = r < R ? pi2_f16_to_f32(ws[r0 + r][b]) : 0.0f;
                    m = fmaxf(m, fabsf(d[k]));
                }
                bool ok = m >= K_DMIN;
                float inv = ok ? 127.0f / (qmax * m) : 0.0f;
                D[g] = ok ? qmax * m / 127.0f : 0.0f;
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

/* ---- prefill gate/up of Q4 rows: superblock GEMM (pi2_k_matmul_sb) ----
 *
 * The twin of kernels.h's algorithm, shared helpers first. A superblock is
 * K_SB blocks (256 values; the row's last may be shorter); chunks of K_PB
 * blocks (the panels') hold whole superblocks. */
enum {
    K_PB = 64, /* blocks per panel chunk: weights 32 KiB */
    K_SB = PI2_K_SB / QG /* blocks per superblock */
};
#define K_KONE 4096.0f /* a superblock's largest block scale as an int16 factor */

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

static void dequant_scalar(pi2_qtype wt, int64_t n, int nrows, const uint8_t *const *wp, const uint16_t *const *ws,
                           float *dst)
{
    for (int r = 0; r < nrows; r++)
        pi2_q_dequantize_row(wt, ws[r], wp[r], n, dst + (int64_t)r * n);
}

static void sgemv_scalar(const float *W, int64_t ldw, int64_t n, int nrows, const float *x, float *out)
{
    for (int r = 0; r < nrows; r++) {
        const float *w = W + (int64_t)r * ldw;
        float s = 0.0f;
        for (int64_t j = 0; j < n; j++)
            s += w[j] * x[j];
        out[r] = s;
    }
}

static void softmax_scalar(float *x, int64_t n)
{
    float mx = -INFINITY, sum = 0.0f;
    for (int64_t i = 0; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    float inv = 1.0f / sum;
    for (int64_t i = 0; i < n; i++)
        x[i] *= inv;
}

static void sgemv_t_scalar(const float *W, int64_t ldw, int64_t n, int nrows, const float *c, float *out)
{
    for (int64_t j = 0; j < n; j++)
        out[j] = 0.0f;
    for (int r = 0; r < nrows; r++) {
        const float *w = W + (int64_t)r * ldw;
        for (int64_t j = 0; j < n; j++)
            out[j] += c[r] * w[j];
    }
}

#ifdef PI2_K_X86

/* ---- ISA selection ---- */

/* Bit i set when pi2_isa i runs here; computed once (cpuid is slow in a VM
 * and the *_isa variants check on every call). Racing first calls store
 * the same value. */
static _Atomic int g_isa_mask = -1;

static bool isa_ok(pi2_isa isa)
{
    int m = atomic_load_explicit(&g_isa_mask, memory_order_relaxed);
    if (m < 0) {
        m = 0;
        for (int i = PI2_ISA_SCALAR; i <= PI2_ISA_AVX512; i++)
            if (pi2_q_isa_supported((pi2_isa)i))
                m |= 1 << i;
        atomic_store_explicit(&g_isa_mask, m, memory_order_relaxed);
    }
    return (unsigned)isa <= PI2_ISA_AVX512 && (m >> isa & 1);
}

/* The path a forced call runs: `isa` if supported, else scalar. */
static pi2_isa isa_pick(pi2_isa isa) { return isa_ok(isa) ? isa : PI2_ISA_SCALAR; }

/* GFNI, for the AVX-512 Q4 one-token kernel: -1 until first asked, then 0
 * or 1 (pi2_k_set_gfni turns it off and on). */
static _Atomic int g_gfni = -1;

static bool gfni_supported(void)
{
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (c >> 8 & 1);
}

static bool k_gfni(void)
{
    int g = atomic_load_explicit(&g_gfni, memory_order_relaxed);
    if (g < 0) {
        g = gfni_supported();
        atomic_store_explicit(&g_gfni, g, memory_order_relaxed);
    }
    return g;
}

/* ---- x86 building blocks ---- */

#define PI2_T_AVX2 __attribute__((target("avx2,fma,f16c")))
/* VL: 256-bit vpdpbusd and EVEX forms of 256-bit moves (see quant.c). */
#define PI2_T_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
/* The same with GFNI (k_gfni): AVX-512 CPUs have it from Ice Lake and Zen 4 on. */
#define PI2_T_AVX512G __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,gfni")))
/* The panel kernels stay functions of their own, as they were while each
 * had several callers: GCC inlines one with a single caller into that
 * caller's loops, and the alternated runs here could not tell whether
 * that costs or gains. */
#define K_NOINLINE __attribute__((noinline))

/* Per (token group of 4, pair of blocks b, b + 1): the tokens' activation
 * scales and int32 offsets (corr * sum of the block's q; see the products
 * below), lanes [b: t0..t3 | b + 1: t0..t3]. 64 bytes. */
typedef struct k_tok4 {
    float as[8];
    int32_t corr[8];
} k_tok4;

enum {
    K_PREP_CAP = 512, /* k_tok4 entries on the stack: 32 KiB */
    K_CHUNK_MAX = 64, /* blocks per chunk (4-row tables: scales 4 KiB, nibbles 8 KiB) */
    K_AXPY_ROWS = 8,   /* rows per axpy group */
    K_AXPY_CHUNK = 128 /* blocks per axpy chunk (scale table 4 KiB) */
};

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

/* res[0..4) = the two 128-bit halves of v added. */
PI2_T_AVX2 static inline void fold_store4(__m256 v, float *res)
{
    _mm_storeu_ps(res, _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)));
}

/* Sum of 8 floats. */
PI2_T_AVX2 static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* dst[i] = fp16 h[i] as float (exact), i < n. */
PI2_T_AVX2 static void cvt_scales(const uint16_t *h, int64_t n, float *dst)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(h + i))));
    for (; i < n; i++)
        dst[i] = _cvtsh_ss(h[i]);
}

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
 *     last nb % 8 blocks run once more from zero-padded copies.
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
        accx = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dx_), sx_, accx);                                    \
        accy = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dy_), sy_, accy);                                    \
    } while (0)

#define K_DEF_T4(name, TGT, LOADW, PROD, ADDP, FIN, GB, CORR)                                                     \
    TGT static void name(const uint8_t *const w[4], const float *wsp, int64_t kb, const int8_t *const a[4],      \
                         const k_tok4 *pre, float res[16])                                                       \
    {                                                                                                            \
        __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;                                \
        int64_t kp = (kb + 1) / 2, p = 0;                                                                        \
        for (; p < kb / 2; p++) {                                                                                \
            K_T4_ROWS(acc0, acc1, 0, 1, p, 1, LOADW, PROD, ADDP, FIN, GB, CORR);                                 \
            K_T4_ROWS(acc2, acc3, 2, 3, p, 1, LOADW, PROD, ADDP, FIN, GB, CORR);                                 \
        }                                                                                                        \
        if (p < kp) {                                                                                            \
            K_T4_ROWS(acc0, acc1, 0, 1, p, 0, LOADW, PROD, ADDP, FIN, GB, CORR);                                 \
            K_T4_ROWS(acc2, acc3, 2, 3, p, 0, LOADW, PROD, ADDP, FIN, GB, CORR);                                 \
        }                                                                                                        \
        fold_store4(acc0, res);                                                                                  \
        fold_store4(acc1, res + 4);                                                                              \
        fold_store4(acc2, res + 8);                                                                              \
        fold_store4(acc3, res + 12);                                                                             \
    }

/* Rows x, y of t1 against 4 blocks (activations at ab): folds into vx, vy. */
#define K_T1_QUAD(vx, vy, wx, wy, ab, LOADW, PROD, ADDP, GB)                                            \
    do {                                                                                               \
        __m256i a0_ = ld256((ab)), a1_ = ld256((ab) + QG), a2_ = ld256((ab) + 2 * QG), a3_ = ld256((ab) + 3 * QG); \
        __m256i px0_ = PROD(LOADW((wx)), a0_), py0_ = PROD(LOADW((wy)), a0_);                          \
        __m256i px1_ = PROD(LOADW((wx) + (GB)), a1_), py1_ = PROD(LOADW((wy) + (GB)), a1_);            \
        __m256i sx01_ = ADDP(_mm256_unpacklo_epi32(px0_, px1_), _mm256_unpackhi_epi32(px0_, px1_));    \
        __m256i sy01_ = ADDP(_mm256_unpacklo_epi32(py0_, py1_), _mm256_unpackhi_epi32(py0_, py1_));    \
        __m256i px2_ = PROD(LOADW((wx) + 2 * (GB)), a2_), py2_ = PROD(LOADW((wy) + 2 * (GB)), a2_);    \
        __m256i px3_ = PROD(LOADW((wx) + 3 * (GB)), a3_), py3_ = PROD(LOADW((wy) + 3 * (GB)), a3_);    \
        __m256i sx23_ = ADDP(_mm256_unpacklo_epi32(px2_, px3_), _mm256_unpackhi_epi32(px2_, px3_));    \
        __m256i sy23_ = ADDP(_mm256_unpacklo_epi32(py2_, py3_), _mm256_unpackhi_epi32(py2_, py3_));    \
        vx = ADDP(_mm256_unpacklo_epi64(sx01_, sx23_), _mm256_unpackhi_epi64(sx01_, sx23_));           \
        vy = ADDP(_mm256_unpacklo_epi64(sy01_, sy23_), _mm256_unpackhi_epi64(sy01_, sy23_));           \
    } while (0)

/* Rows x, y of t1 against 8 blocks: weights at wx, wy, fp16 scales at sx,
 * sy; activations at ab, their scales asv and offsets corr (registers). */
#define K_T1_ROWS(accx, accy, wx, wy, sx, sy, ab, LOADW, PROD, ADDP, FIN, GB, CSH)                     \
    do {                                                                                               \
        __m256i xa_, ya_, xb_, yb_;                                                                    \
        K_T1_QUAD(xa_, ya_, (wx), (wy), (ab), LOADW, PROD, ADDP, GB);                                  \
        K_T1_QUAD(xb_, yb_, (wx) + 4 * (GB), (wy) + 4 * (GB), (ab) + 4 * QG, LOADW, PROD, ADDP, GB);   \
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
#define K_T1_STEP(ab, asb, sb, wq0, wq1, wq2, wq3, sq0, sq1, sq2, sq3, LOADW, PROD, ADDP, FIN, GB, CSH)         \
    do {                                                                                                       \
        __m256 asv = _mm256_loadu_ps((asb));                                                                   \
        __m256i corr = _mm256_slli_epi32(ld256((sb)), (CSH));                                                  \
        K_T1_ROWS(acc0, acc1, wq0, wq1, sq0, sq1, ab, LOADW, PROD, ADDP, FIN, GB, CSH);                        \
        K_T1_ROWS(acc2, acc3, wq2, wq3, sq2, sq3, ab, LOADW, PROD, ADDP, FIN, GB, CSH);                        \
    } while (0)

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

#define K_DEF_T1(name, TGT, LOADW, PROD, ADDP, FIN, GB, CSH)                                                      \
    TGT static void name(const uint8_t *const w[4], const uint16_t *const s[4], int64_t nb, const int8_t *a,     \
                         const float *as, const int32_t *sums, const uint8_t *const wn[4], const uint8_t *pf2,    \
                         int64_t pf2_len, float res[4])                                                          \
    {                                                                                                            \
        __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;                                \
        int64_t b = 0, rb_ = nb * (GB), po_ = 0, o2_ = 0, q2_ = k_pf_quota(pf2_len, nb / 8);                     \
        int pk_ = wn ? 0 : 4; /* NULL: no paced prefetch */                                                      \
        for (; b + 8 <= nb; b += 8) {                                                                            \
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
            K_T1_STEP(a + b * QG, as + b, sums + b, w[0] + b * (GB), w[1] + b * (GB), w[2] + b * (GB),            \
                      w[3] + b * (GB), s[0] + b, s[1] + b, s[2] + b, s[3] + b, LOADW, PROD, ADDP, FIN, GB, CSH);  \
        }                                                                                                        \
        if (b < nb) { /* 1..7 blocks left: zero-padded copies contribute 0 * 0 */                                \
            int64_t m = nb - b;                                                                                  \
            int8_t ta[8 * QG] = {0};                                                                             \
            float tas[8] = {0};                                                                                  \
            int32_t tsum[8] = {0};                                                                               \
            uint8_t tw[4][8 * (GB)] = {{0}};                                                                     \
            uint16_t tsc[4][8] = {{0}};                                                                          \
            memcpy(ta, a + b * QG, (size_t)m * QG);                                                              \
            memcpy(tas, as + b, (size_t)m * sizeof(float));                                                      \
            memcpy(tsum, sums + b, (size_t)m * sizeof(int32_t));                                                 \
            for (int k = 0; k < 4; k++) {                                                                        \
                memcpy(tw[k], w[k] + b * (GB), (size_t)m * (GB));                                                \
                memcpy(tsc[k], s[k] + b, (size_t)m * sizeof(uint16_t));                                          \
            }                                                                                                    \
            K_T1_STEP(ta, tas, tsum, tw[0], tw[1], tw[2], tw[3], tsc[0], tsc[1], tsc[2], tsc[3], LOADW, PROD,    \
                      ADDP, FIN, GB, CSH);                                                                       \
        }                                                                                                        \
        res[0] = hsum8(acc0);                                                                                    \
        res[1] = hsum8(acc1);                                                                                    \
        res[2] = hsum8(acc2);                                                                                    \
        res[3] = hsum8(acc3);                                                                                    \
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

typedef void (*k_t4_fn)(const uint8_t *const w[4], const float *wsp, int64_t kb, const int8_t *const a[4],
                        const k_tok4 *pre, float res[16]);
typedef void (*k_t1_fn)(const uint8_t *const w[4], const uint16_t *const s[4], int64_t nb, const int8_t *a,
                        const float *as, const int32_t *sums, const uint8_t *const wn[4], const uint8_t *pf2,
                        int64_t pf2_len, float res[4]);

enum { K_SPLIT_MAX = 8192 }; /* values of a split activation copy (stack) */

/* One token against nrows rows of nb < 16 blocks: out[r] (mm_one_token's
 * contract, the caller's prefetch range included). */
typedef void k_short_fn(int64_t nb, int nrows, const uint8_t *const *wp, const uint16_t *const *ws, const float *as,
                        const int8_t *a, const int32_t *sums, float *out, const uint8_t *pf, int64_t pf_len);

typedef struct k_mm_ops {
    k_t4_fn t4;    /* on payload rows, or (Q4) on rows unpacked by q4_unpack_rows */
    k_t4_fn t4raw; /* Q4 on payload rows, for few token groups (NULL: t4 is) */
    k_t1_fn t1;
    k_t1_fn t1s;   /* t1 on activations rearranged by split (NULL: none) */
    k_t1_fn t1sg;  /* t1s with GFNI (k_gfni) */
    void (*split)(const int8_t *a, int64_t nb, int8_t *dst);
    int32_t corr; /* k_tok4 offset: corr * sum(a) per block */
    int64_t gb;   /* payload bytes per block */
    k_short_fn *t1short, *t1shortg; /* one token, rows of under 16 blocks (NULL: t1's tail); with GFNI */
} k_mm_ops;


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
 * prefetches (0.6 -> 0.8 of the read bandwidth from DRAM, Zen 3). */
static void mm_one_token(const k_mm_ops *op, int64_t nb, int nrows, const uint8_t *const *wp,
                         const uint16_t *const *ws, const float *as, const int8_t *a, const int32_t *sums, float *out,
                         const uint8_t *pf, int64_t pf_len)
{
    if (nb < 16 && op->t1short) {
        (op->t1shortg && k_gfni() ? op->t1shortg : op->t1short)(nb, nrows, wp, ws, as, a, sums, out, pf, pf_len);
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
        t1 = op->t1sg && k_gfni() ? op->t1sg : op->t1s;
    }
    for (int r0 = 0; r0 < nrows; r0 += 4) {
        const uint8_t *w[4], *wn[4];
        const uint16_t *s[4];
        /* this tile and the next close together and ascending (a
         * matrix's rows, every gate row of a bundle: gaps of a few rows),
         * or gathered (the predicted neurons) */
        bool seq = true;
        for (int k = 0; k < 4; k++) {
            int r = r0 + k < nrows ? r0 + k : nrows - 1, rn = r0 + 4 + k < nrows ? r0 + 4 + k : nrows - 1;
            w[k] = wp[r];
            s[k] = ws[r];
            wn[k] = wp[rn];
        }
        for (int r = r0; r + 1 < nrows && r < r0 + 7; r++) {
            uintptr_t gap = (uintptr_t)wp[r + 1] - (uintptr_t)wp[r]; /* wraps when descending */
            seq = seq && gap <= (uintptr_t)(4 * nb * op->gb);
        }
        /* Gathered rows take one prefetch of each next row's first line:
         * the hardware streams the rest of a row once it starts, and paced
         * prefetches of whole rows held the miss buffers the demand loads
         * needed (12.8% of a 7B FFN's gate rows: 7.5 -> 12 GB/s on one
         * thread); rows close together keep the paced prefetch (every gate
         * row of a bundle: 4-7% slower dense decode without it) */
        if (!seq)
            for (int k = 0; k < 4; k++)
                _mm_prefetch((const char *)wn[k], _MM_HINT_T0);
        /* this tile's share of the caller's range */
        int64_t p0, p1;
        k_pf_share(pf_len, r0 / 4, tiles, &p0, &p1);
        float res[4];
        t1(w, s, nb, a, as, sums, seq ? wn : NULL, pf ? pf + p0 : NULL, pf ? p1 - p0 : 0, res);
        for (int k = 0; k < 4 && r0 + k < nrows; k++)
            out[r0 + k] = res[k];
    }
}

/* Tokens [0, T) in groups of 4 (T >= 2; the last group repeats token T-1). */
static void mm_groups(const k_mm_ops *op, int64_t n, int nrows, const uint8_t *const *wp, const uint16_t *const *ws,
                      const float *ascales, const int8_t *aq, const int32_t *asums, int T, float *out, int64_t ldo)
{
    int64_t nb = n / QG;
    int ng = (T + 3) / 4;
    int64_t kc = min64(2 * (K_PREP_CAP / ng), K_CHUNK_MAX); /* even */
    /* Q4: unpack each row tile once when 3+ token groups share it */
    bool unpack = op->t4raw && ng >= 3;
    k_t4_fn t4 = op->t4raw && !unpack ? op->t4raw : op->t4;
    k_tok4 pre[K_PREP_CAP];
    float wsp[4 * 4 * K_CHUNK_MAX];
    uint8_t wu[4 * K_CHUNK_MAX * QG];
    for (int64_t b0 = 0; b0 < nb; b0 += kc) {
        int64_t kb = min64(kc, nb - b0), kp = (kb + 1) / 2;
        for (int g = 0; g < ng; g++)
            for (int j = 0; j < 4; j++) {
                int t = 4 * g + j < T ? 4 * g + j : T - 1;
                for (int64_t b = 0; b < 2 * kp; b++) {
                    k_tok4 *e = &pre[g * kp + b / 2];
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
            for (int g = 0; g < ng; g++) {
                const int8_t *a[4];
                for (int j = 0; j < 4; j++) {
                    int t = 4 * g + j < T ? 4 * g + j : T - 1;
                    a[j] = aq + t * n + b0 * QG;
                }
                float res[16];
                t4(w, wsp, kb, a, pre + g * kp, res);
                for (int k = 0; k < 4 && r0 + k < nrows; k++)
                    for (int j = 0; j < 4 && 4 * g + j < T; j++) {
                        float *o = out + (4 * g + j) * ldo + r0 + k;
                        *o = b0 == 0 ? res[4 * k + j] : *o + res[4 * k + j];
                    }
            }
        }
    }
}

static void mm_simd(const k_mm_ops *op, int64_t n, int nrows, const uint8_t *const *wp, const uint16_t *const *ws,
                    const float *ascales, const int8_t *aq, const int32_t *asums, int T, float *out, int64_t ldo,
                    const uint8_t *pf, int64_t pf_len)
{
    int64_t nb = n / QG;
    /* Groups of 4 tokens, the last one padded when 2 or 3 tokens are left;
     * a lone last token, and batches under 4 tokens, run as decode (a
     * padded group would spend 2-4x the work). */
    int grouped = T < 4 ? 0 : T % 4 == 1 ? T - 1 : T;
    if (grouped > 0)
        mm_groups(op, n, nrows, wp, ws, ascales, aq, asums, grouped, out, ldo);
    for (int t = grouped; t < T; t++)
        mm_one_token(op, nb, nrows, wp, ws, ascales + t * nb, aq + t * n, asums + t * nb, out + t * ldo,
                     t == grouped ? pf : NULL, t == grouped ? pf_len : 0);
}

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
 * per step, shared by the 4 rows; one thread, Q4 rows in L2: 28.5 ->
 * 31.8 GB/s), and with GFNI one affine map takes the high nibbles (33.4
 * GB/s, the same binary with it off 31.8). Per row and 16 blocks the 4
 * (Q8: 8) product vectors fold (unpack + add, K_FOLD4; Q8 then adds lane
 * pairs) into one vector of 16 exact block dots, which one vpermd puts in
 * block order; then the offset subtract, one cvt, one multiply of 16
 * weight scales by the activation scales and one FMA. About 0.14 (Q8:
 * 0.1) instructions per byte. Each lane accumulates nb / 16 terms, then
 * 16 lanes are summed: within kernels.h's bound. The last nb % 16 blocks
 * run once more from zero-padded copies (split activations: their whole
 * last group of 4 blocks); prefetching as in the 256-bit t1. */

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
#define K_T1W_FIN(acc, d, s) K_T1W_FIN_(acc, d, s, K_LDS_ALL)

/* A row's 64-byte piece j at p and its 16 fp16 scales at s: whole, or
 * (rows of fewer than 16 blocks) masked to the row by wm_[j] and sm_,
 * the bytes past it read as zero and never touched. */
#define K_LD_ALL(p, j) _mm512_loadu_si512((const void *)((p) + 64 * (j)))
#define K_LD_MASK(p, j) _mm512_maskz_loadu_epi8(wm_[j], (const void *)((p) + 64 * (j)))
#define K_LDS_ALL(s) _mm256_loadu_si256((const __m256i *)(const void *)(s))
#define K_LDS_MASK(s) _mm256_maskz_loadu_epi16(sm_, (const void *)(s))

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
#define K_T1W_Q4_ROW(acc, wq, sq, HI) K_T1W_Q4_ROW_(acc, wq, sq, HI, K_LD_ALL, K_LDS_ALL)

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
#define K_T1W_Q8_ROW(acc, wq, sq) K_T1W_Q8_ROW_(acc, wq, sq, K_LD_ALL, K_LDS_ALL)

/* The 16-block step of 4 rows: activations at ab, scales asb, sums sb. */
#define K_T1W_AQ4(i, ab)                                                                                     \
    __m512i alo##i, ahi##i;                                                                                  \
    do {                                                                                                     \
        __m512i y0_ = _mm512_loadu_si512((const void *)((ab) + 128 * (i)));                                  \
        __m512i y1_ = _mm512_loadu_si512((const void *)((ab) + 128 * (i) + 64));                             \
        alo##i = _mm512_permutex2var_epi64(y0_, ilo, y1_);                                                   \
        ahi##i = _mm512_permutex2var_epi64(y0_, ihi, y1_);                                                   \
    } while (0)

/* Activations split beforehand (k_split_a): per 4 blocks their elements
 * 0-15, then 16-31. */
#define K_T1W_AQ4S(i, ab)                                                                                    \
    __m512i alo##i = _mm512_loadu_si512((const void *)((ab) + 128 * (i)));                                    \
    __m512i ahi##i = _mm512_loadu_si512((const void *)((ab) + 128 * (i) + 64))

/* The Q4 step, its activations gathered by AQ and high nibbles taken by HI. */
#define K_T1W_STEP_Q4_(ab, asb, sb, w0, w1, w2, w3, s0, s1, s2, s3, AQ, HI)                                  \
    do {                                                                                                     \
        AQ(0, ab);                                                                                           \
        AQ(1, ab);                                                                                           \
        AQ(2, ab);                                                                                           \
        AQ(3, ab);                                                                                           \
        __m512 asv = _mm512_loadu_ps((asb));                                                                 \
        __m512i corr = _mm512_slli_epi32(_mm512_loadu_si512((const void *)(sb)), 3);                         \
        K_T1W_Q4_ROW(acc0, w0, s0, HI);                                                                      \
        K_T1W_Q4_ROW(acc1, w1, s1, HI);                                                                      \
        K_T1W_Q4_ROW(acc2, w2, s2, HI);                                                                      \
        K_T1W_Q4_ROW(acc3, w3, s3, HI);                                                                      \
    } while (0)
#define K_T1W_STEP_Q4(ab, asb, sb, w0, w1, w2, w3, s0, s1, s2, s3) \
    K_T1W_STEP_Q4_(ab, asb, sb, w0, w1, w2, w3, s0, s1, s2, s3, K_T1W_AQ4, K_HI_SHIFT)
#define K_T1W_STEP_Q4S(ab, asb, sb, w0, w1, w2, w3, s0, s1, s2, s3) \
    K_T1W_STEP_Q4_(ab, asb, sb, w0, w1, w2, w3, s0, s1, s2, s3, K_T1W_AQ4S, K_HI_SHIFT)
#define K_T1W_STEP_Q4SG(ab, asb, sb, w0, w1, w2, w3, s0, s1, s2, s3) \
    K_T1W_STEP_Q4_(ab, asb, sb, w0, w1, w2, w3, s0, s1, s2, s3, K_T1W_AQ4S, K_HI_GFNI)

/* The Q8 step's 8 activation vectors (16 blocks at ab). */
#define K_T1W_AQ8(ab)                                                                                        \
    __m512i av0 = _mm512_loadu_si512((const void *)(ab)), av1 = _mm512_loadu_si512((const void *)((ab) + 64)); \
    __m512i av2 = _mm512_loadu_si512((const void *)((ab) + 128));                                            \
    __m512i av3 = _mm512_loadu_si512((const void *)((ab) + 192));                                            \
    __m512i av4 = _mm512_loadu_si512((const void *)((ab) + 256));                                            \
    __m512i av5 = _mm512_loadu_si512((const void *)((ab) + 320));                                            \
    __m512i av6 = _mm512_loadu_si512((const void *)((ab) + 384));                                            \
    __m512i av7 = _mm512_loadu_si512((const void *)((ab) + 448))

#define K_T1W_STEP_Q8(ab, asb, sb, w0, w1, w2, w3, s0, s1, s2, s3)                                           \
    do {                                                                                                     \
        K_T1W_AQ8(ab);                                                                                       \
        __m512 asv = _mm512_loadu_ps((asb));                                                                 \
        __m512i corr = _mm512_slli_epi32(_mm512_loadu_si512((const void *)(sb)), 7);                         \
        K_T1W_Q8_ROW(acc0, w0, s0);                                                                          \
        K_T1W_Q8_ROW(acc1, w1, s1);                                                                          \
        K_T1W_Q8_ROW(acc2, w2, s2);                                                                          \
        K_T1W_Q8_ROW(acc3, w3, s3);                                                                          \
    } while (0)

/* The sum of 16 lanes in a fixed tree: halves, quarters, then pairs (the
 * order GCC's _mm512_reduce_add_ps takes, written out so that the narrow
 * rows below can take its subtrees: a row in lanes 0-7 (0-3) of an
 * otherwise zero vector sums as k_sum8 (k_sum4) of those lanes; no lane
 * is ever -0, the accumulators starting at +0). */
PI2_T_AVX512 static inline float k_sum4(__m128 x)
{
    __m128 w = _mm_add_ps(x, _mm_shuffle_ps(x, x, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtss_f32(w) + _mm_cvtss_f32(_mm_shuffle_ps(w, w, 1));
}

PI2_T_AVX512 static inline float k_sum8(__m256 x)
{
    return k_sum4(_mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x)));
}

PI2_T_AVX512 static inline float k_sum16(__m512 x)
{
    return k_sum8(_mm256_add_ps(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)),
                                _mm512_castps512_ps256(x)));
}

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
        int64_t b = 0, rb_ = nb * (GB), po_ = 0, o2_ = 0, q2_ = k_pf_quota(pf2_len, nb / 16);                \
        int pk_ = wn ? 0 : 4; /* NULL: no paced prefetch */                                                  \
        for (; b + 16 <= nb; b += 16) {                                                                      \
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
            STEP(a + b * QG, as + b, sums + b, w[0] + b * (GB), w[1] + b * (GB), w[2] + b * (GB),             \
                 w[3] + b * (GB), s[0] + b, s[1] + b, s[2] + b, s[3] + b);                                   \
        }                                                                                                    \
        if (b < nb) { /* 1..15 blocks left: zero-padded copies contribute 0 * 0 */                           \
            int64_t m = nb - b;                                                                              \
            int8_t ta[16 * QG] = {0};                                                                        \
            float tas[16] = {0};                                                                             \
            int32_t tsum[16] = {0};                                                                          \
            uint8_t tw[4][16 * (GB)] = {{0}};                                                                \
            uint16_t tsc[4][16] = {{0}};                                                                     \
            memcpy(ta, a + b * QG, (size_t)((m + (AR) - 1) / (AR) * (AR)) * QG);                             \
            memcpy(tas, as + b, (size_t)m * sizeof(float));                                                  \
            memcpy(tsum, sums + b, (size_t)m * sizeof(int32_t));                                             \
            for (int k = 0; k < 4; k++) {                                                                    \
                memcpy(tw[k], w[k] + b * (GB), (size_t)m * (GB));                                            \
                memcpy(tsc[k], s[k] + b, (size_t)m * sizeof(uint16_t));                                      \
            }                                                                                                \
            STEP(ta, tas, tsum, tw[0], tw[1], tw[2], tw[3], tsc[0], tsc[1], tsc[2], tsc[3]);                 \
        }                                                                                                    \
        res[0] = k_sum16(acc0);                                                                              \
        res[1] = k_sum16(acc1);                                                                              \
        res[2] = k_sum16(acc2);                                                                              \
        res[3] = k_sum16(acc3);                                                                              \
    }

/* ORD[p] = the fold position of block p: Q4 4 * (p % 4) + p / 4; Q8 see
 * K_T1W_Q8_ROW. */
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
 * same arithmetic, so the same sums. One thread, 5632 Q8 rows of 128
 * values in L2: 6.0 -> 12.8 GB/s (rows of 2048: 39); the 1B-shaped model's
 * sparse decode, 2 threads: 63.1 -> 66.4 tok/s (medians of 8 alternated
 * runs). Q8 rows of up to 8 blocks then took the narrow steps below. */
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
            int64_t left = nb * (GB) - 64 * j;                                                               \
            wm_[j] = left <= 0 ? 0 : left >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << left) - 1;                \
        }                                                                                                    \
        __mmask16 sm_ = (__mmask16)((1u << nb) - 1u);                                                        \
        ACTS(ta);                                                                                            \
        __m512 asv = _mm512_loadu_ps(tas);                                                                   \
        __m512i corr = _mm512_slli_epi32(_mm512_loadu_si512((const void *)tsum), SH);                        \
        int64_t tiles = (nrows + 3) / 4;                                                                     \
        for (int r0 = 0; r0 < nrows; r0 += 4) {                                                              \
            const uint8_t *w[4];                                                                             \
            const uint16_t *s[4];                                                                            \
            for (int k = 0; k < 4; k++) {                                                                    \
                int r = r0 + k < nrows ? r0 + k : nrows - 1, rn = r0 + 4 + k < nrows ? r0 + 4 + k : nrows - 1; \
                w[k] = wp[r];                                                                                \
                s[k] = ws[r];                                                                                \
                _mm_prefetch((const char *)wp[rn], _MM_HINT_T0);                                             \
            }                                                                                                \
            k_pf_tile(pf, pf_len, r0 / 4, tiles);                                                            \
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
#define K_SHORT_ACTS_Q8(ta) K_T1W_AQ8(ta)
#define K_SHORT_ACTS_Q4(ta)                                                                                  \
    _Alignas(64) int8_t sp_[16 * QG];                                                                        \
    k_split_a((ta), 16, sp_);                                                                                \
    K_T1W_AQ4S(0, sp_);                                                                                      \
    K_T1W_AQ4S(1, sp_);                                                                                      \
    K_T1W_AQ4S(2, sp_);                                                                                      \
    K_T1W_AQ4S(3, sp_)
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
 * bits (test_matmul_short). One thread in L2: the 1B-shaped model's
 * predictor, 5632 rows of 128 values, 12.8 -> 30.7 GB/s; rows of 256
 * values 25.8 -> 34.8. Its sparse decode, 2 threads: 69.5 -> 72.6 tok/s
 * (medians of 8 alternated runs). */
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
        int64_t left = nb * PI2_Q8_GROUP_BYTES - 64 * (j % jp);
        wm_[j] = left <= 0 ? 0 : left >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << left) - 1;
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
                int rn = r + per < nrows ? r + per : nrows - 1; /* the next tile's row */
                _mm_prefetch((const char *)wp[rn], _MM_HINT_T0);
            }
            sv[v] = rps == 2 ? _mm256_set_m128i(q[1], q[0])
                             : _mm256_set_m128i(_mm_unpacklo_epi64(q[2], q[3]), _mm_unpacklo_epi64(q[0], q[1]));
        }
        k_pf_tile(pf, pf_len, r0 / per, tiles);
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

/* Q8 rows of fewer than 16 blocks: up to 4 or 8 narrow, else the masked step. */
static void mm_short_q8(int64_t nb, int nrows, const uint8_t *const *wp, const uint16_t *const *ws, const float *as,
                        const int8_t *a, const int32_t *sums, float *out, const uint8_t *pf, int64_t pf_len)
{
    (nb <= 4   ? mm_narrow4_q8_vnni
     : nb <= 8 ? mm_narrow8_q8_vnni
               : mm_short_q8_vnni)(nb, nrows, wp, ws, as, a, sums, out, pf, pf_len);
}

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
 * tokens. 256 rows x 2048 values, one thread: 0.58-0.62 -> 0.73-0.85 of
 * the probe's rate at 128 tokens, 0.61-0.68 -> 0.64-0.72 at 32, about
 * the same at 16. Q8 rows keep the tiles: as two nibble passes (w = 16 h + l) they
 * came out slower (0.40-0.43 against 0.43-0.47). */

enum {
    K_P2_MIN_T = 16,  /* fewer tokens keep the t4 tiles: the packing would not pay */
    K_P2_W = K_PB * 8 /* ymm of weights in a panel: 64 blocks x 8 groups */
};

typedef struct k_panel2 {
    _Alignas(32) uint8_t w[K_P2_W * 32]; /* [block][group][row][4 bytes] */
    _Alignas(32) float s[K_PB * 8];      /* [block][row] scales */
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

PI2_T_AVX2 static void mm_panels_avx2(int64_t n, int nrows, const uint8_t *const *wp, const uint16_t *const *ws,
                                      const float *ascales, const int8_t *aq, const int32_t *asums, int T,
                                      float *out, int64_t ldo)
{
    int64_t nb = n / QG, gb = PI2_Q4_GROUP_BYTES;
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
            int64_t lines = (kb * gb + 63) / 64, pf = 0;
            for (int t0 = 0; t0 < T;) {
                k_panel_pf(wp, r0, 8, nrows, b0 * gb, lines, t0 / 4 + 1, (T + 3) / 4, &pf);
                int N = T - t0 >= 4 ? 4 : T - t0 >= 2 ? 2 : 1;
                __m256 res[4];
                (N == 4 ? p2_tok4 : N == 2 ? p2_tok2 : p2_tok1)(&P, kb, aq + t0 * n + b0 * QG, n,
                                                                ascales + t0 * nb + b0, asums + t0 * nb + b0, nb,
                                                                res);
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

static const k_mm_ops MM_Q4_AVX2 = {mm_t4_q4_avx2, mm_t4_q4raw_avx2, mm_t1_q4_avx2, NULL, NULL, NULL, 8,
                                    PI2_Q4_GROUP_BYTES, NULL, NULL};
static const k_mm_ops MM_Q8_AVX2 = {mm_t4_q8_avx2, NULL, mm_t1_q8_avx2, NULL, NULL, NULL, 0, PI2_Q8_GROUP_BYTES,
                                    NULL, NULL};
/* VNNI: 4+ tokens take the 512-bit panels (mm_panels), fewer run one token
 * at a time, so no 4-token tiles */
static const k_mm_ops MM_Q4_VNNI = {NULL, NULL, mm_t1w_q4_vnni, mm_t1w_q4s_vnni, mm_t1w_q4sg_vnni, k_split_a, 8,
                                    PI2_Q4_GROUP_BYTES, mm_short_q4_vnni, mm_short_q4g_vnni};
static const k_mm_ops MM_Q8_VNNI = {NULL, NULL, mm_t1w_q8_vnni, NULL, NULL, NULL, 128, PI2_Q8_GROUP_BYTES,
                                    mm_short_q8, NULL};

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

enum {
    K_PANEL_MIN_T = 4 /* fewer tokens take the 4 x 4 tiles / decode path */
};

typedef struct k_panel {
    _Alignas(64) uint8_t w[K_PB * 8 * 64]; /* [block][group][lane][4 bytes] */
    union {
        _Alignas(64) float s[K_PB * 16];  /* [block][lane] scales */
        _Alignas(64) int32_t k[K_PB * 16]; /* superblock panels: [block][lane] int16 factors */
    };
    _Alignas(64) float d[K_PB / K_SB * 16]; /* superblock panels: [superblock][lane] scales */
} k_panel;

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
 * not): with the panel in cache, 0.83 of the int8 peak against 0.75
 * (vpdpbusd alone: 0.96); on the 1B-shaped model's FFN rows from memory,
 * 147-153 -> 158-166 G MAC/s on one thread. */
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

/* The panel kernels of one family (panel_tok, panel_toks, sb_tok) for 8,
 * 4, 2 and 1 tokens; sc: per token scales, ss apart. */
typedef void k_tok_fn(const k_panel *P, int64_t kb, const int8_t *a, int64_t n, const float *sc, int64_t ss,
                      const int32_t *bias, __m512 *res);
static k_tok_fn *const K_TOK[4] = {panel_tok8, panel_tok4, panel_tok2, panel_tok1};
static k_tok_fn *const K_TOKS[4] = {panel_toks8, panel_toks4, panel_toks2, panel_toks1};
static k_tok_fn *const K_SB_TOKS[4] = {sb_tok8, sb_tok4, sb_tok2, sb_tok1};

/* The next group of tokens from t0 of T (8, then 4, 2, 1) against a
 * panel, by the family's kernel for that many; returns N. */
static int panel_tokens(k_tok_fn *const fam[4], const k_panel *P, int64_t kb, const int8_t *a, int64_t n,
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
PI2_T_AVX512 static void mm_panels(pi2_qtype wt, bool sb, int64_t n, int nrows, const uint8_t *const *wp,
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
            /* the next panel's rows (its pack met them cold: ~30% of the
             * time) */
            int64_t lines = (kb * gb + 63) / 64, pf = 0;
            __mmask16 keep = (__mmask16)((1u << m) - 1u);
            for (int t0 = 0; t0 < T;) {
                k_panel_pf(wp, r0, 16, nrows, b0 * gb, lines, t0 / 8 + 1, (T + 7) / 8, &pf);
                __m512 res[8];
                int N = panel_tokens(sb ? K_SB_TOKS : K_TOK, &P, kb, aq + b0 * QG, n,
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

/* 8 bytes zero- or sign-extended to int32. */
PI2_T_AVX2 static inline __m256i ld_u8x8(const uint8_t *p)
{
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)p));
}

PI2_T_AVX2 static inline __m256i ld_i8x8(const uint8_t *p)
{
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)p));
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
 * chunk (16 row streams rather than 64: 6.8 -> 9.3 GB/s per thread on a
 * bundle's interleaved down rows). The coefficient
 * tables are built 8 blocks at a time (lanes are blocks), so the
 * divisions and the max run once per 8 groups. Next chunk's rows are
 * prefetched at the pace the current chunk is read (64 row streams are
 * too many for the hardware prefetcher alone). */

enum {
    K_DRC = 64,   /* rows per chunk */
    K_DTAB = PI2_K_MAX_T * (K_DRC / K_DG), /* k_dent entries on the stack (160 KiB): T * G, at least 8 blocks */
    K_DKB = 64    /* blocks per block chunk, at most (a multiple of 8) */
};

/* Quantized coefficients of one (token, group) for 8 consecutive blocks
 * (lane = block): pair words of cq_2k, cq_2k+1 (Q4: bytes, low 16 bits;
 * Q8: int16 halves), the scale (0: skip the group) and, for Q4, 8 * sum(cq). */
typedef struct k_dent {
    int32_t pw[8][8];
    float s[8];
    int32_t off[8];
} k_dent;

/* cp[t * K_DRC + k] = coefficient r0 + k of token t for k < R, 0 up to
 * kp (the chunk's rows rounded up to whole groups). */
static void down_coefs(const float *coef, int64_t ldc, int T, int r0, int R, int kp, float *cp)
{
    for (int t = 0; t < T; t++) {
        memcpy(cp + t * K_DRC, coef + t * ldc + r0, (size_t)R * sizeof(float));
        for (int k = R; k < kp; k++)
            cp[t * K_DRC + k] = 0.0f;
    }
}

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
 * them all again for each block (0.28 -> 0.34 of the int8 peak). out is
 * loaded and stored once per (token, block, row chunk). */

enum {
    K_QTAB = PI2_K_MAX_T * (K_DRC / K_DG), /* k_qent entries on the stack (192 KiB): T * G */
    K_DOWN512_MIN_T = 4 /* fewer tokens take the 256-bit path */
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

PI2_T_AVX512 static void down_vnni512(pi2_qtype wt, int64_t n, int nrows, const float *coef, int64_t ldc,
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
        int N = panel_tokens(K_TOKS, P, G, aq, Rp, sc, K_PB, bias0, t0, T, res);
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
        gemm_coefs(PI2_ISA_AVX512, coef, ldc, T, r0, R, aq, as, su);
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

PI2_T_AVX512 static void down_one512(pi2_qtype wt, int64_t n, int nrows, const float *coef, const uint8_t *const *wp,
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
                    if (k < R && wk == 16) { /* one conversion: a call per row cost 6% here */
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

/* ---- sgemv: 4 rows at a time, two accumulators per row ---- */

PI2_T_AVX2 static void sgemv_avx2(const float *W, int64_t ldw, int64_t n, int nrows, const float *x, float *out)
{
    int r = 0;
    for (; r + 4 <= nrows; r += 4) {
        const float *w0 = W + (int64_t)r * ldw, *w1 = w0 + ldw, *w2 = w1 + ldw, *w3 = w2 + ldw;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        int64_t j = 0;
        for (; j + 16 <= n; j += 16) {
            __m256 x0 = _mm256_loadu_ps(x + j), x1 = _mm256_loadu_ps(x + j + 8);
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + j), x0, a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + j), x0, a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + j), x0, a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + j), x0, a3);
            b0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + j + 8), x1, b0);
            b1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + j + 8), x1, b1);
            b2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + j + 8), x1, b2);
            b3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + j + 8), x1, b3);
        }
        if (j + 8 <= n) {
            __m256 x0 = _mm256_loadu_ps(x + j);
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + j), x0, a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + j), x0, a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + j), x0, a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + j), x0, a3);
            j += 8;
        }
        float s0 = hsum8(_mm256_add_ps(a0, b0)), s1 = hsum8(_mm256_add_ps(a1, b1));
        float s2 = hsum8(_mm256_add_ps(a2, b2)), s3 = hsum8(_mm256_add_ps(a3, b3));
        for (; j < n; j++) {
            s0 += w0[j] * x[j];
            s1 += w1[j] * x[j];
            s2 += w2[j] * x[j];
            s3 += w3[j] * x[j];
        }
        out[r] = s0;
        out[r + 1] = s1;
        out[r + 2] = s2;
        out[r + 3] = s3;
    }
    for (; r < nrows; r++) {
        const float *w = W + (int64_t)r * ldw;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0;
        int64_t j = 0;
        for (; j + 16 <= n; j += 16) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + j), _mm256_loadu_ps(x + j), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + j + 8), _mm256_loadu_ps(x + j + 8), a1);
        }
        if (j + 8 <= n) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + j), _mm256_loadu_ps(x + j), a0);
            j += 8;
        }
        float s = hsum8(_mm256_add_ps(a0, a1));
        for (; j < n; j++)
            s += w[j] * x[j];
        out[r] = s;
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

/* 16 short rows at once (the predictor's second layer: rows of its rank,
 * 64 floats): one accumulator per row, then 4 folds and a 4 x 4 transpose
 * of 128-bit lanes sum all 16 at ~3 instructions a row, where a
 * horizontal sum per row took ~8 (one thread, 5632 rows: 2.4x the read
 * speed at 64 floats, 1.5x at 65). */
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
    /* the last n % 16 columns a column at a time (gathered across the 16
     * rows: masked loads, one per row, ran at half the speed) */
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

/* The same with 16 floats per register; the n % 16 tail is a masked load
 * (masked-off elements are not read). */
PI2_T_AVX512 static void sgemv_avx512(const float *W, int64_t ldw, int64_t n, int nrows, const float *x, float *out)
{
    int64_t nfull = n & ~(int64_t)15;
    __mmask16 tail = (__mmask16)((1u << (n & 15)) - 1u);
    int r = 0;
    if (n <= 256 && ldw <= INT32_MAX / 16)
        for (; r + 16 <= nrows; r += 16)
            sgemv16_avx512(W + (int64_t)r * ldw, ldw, n, x, out + r);
    for (; r + 4 <= nrows; r += 4) {
        const float *w0 = W + (int64_t)r * ldw, *w1 = w0 + ldw, *w2 = w1 + ldw, *w3 = w2 + ldw;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        int64_t j = 0;
        for (; j + 32 <= nfull; j += 32) {
            __m512 x0 = _mm512_loadu_ps(x + j), x1 = _mm512_loadu_ps(x + j + 16);
            a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w0 + j), x0, a0);
            a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w1 + j), x0, a1);
            a2 = _mm512_fmadd_ps(_mm512_loadu_ps(w2 + j), x0, a2);
            a3 = _mm512_fmadd_ps(_mm512_loadu_ps(w3 + j), x0, a3);
            b0 = _mm512_fmadd_ps(_mm512_loadu_ps(w0 + j + 16), x1, b0);
            b1 = _mm512_fmadd_ps(_mm512_loadu_ps(w1 + j + 16), x1, b1);
            b2 = _mm512_fmadd_ps(_mm512_loadu_ps(w2 + j + 16), x1, b2);
            b3 = _mm512_fmadd_ps(_mm512_loadu_ps(w3 + j + 16), x1, b3);
        }
        if (j < nfull) { /* one more full 16 */
            __m512 x0 = _mm512_loadu_ps(x + j);
            a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w0 + j), x0, a0);
            a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w1 + j), x0, a1);
            a2 = _mm512_fmadd_ps(_mm512_loadu_ps(w2 + j), x0, a2);
            a3 = _mm512_fmadd_ps(_mm512_loadu_ps(w3 + j), x0, a3);
        }
        if (tail) {
            __m512 xt = _mm512_maskz_loadu_ps(tail, x + nfull);
            b0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, w0 + nfull), xt, b0);
            b1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, w1 + nfull), xt, b1);
            b2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, w2 + nfull), xt, b2);
            b3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, w3 + nfull), xt, b3);
        }
        out[r] = _mm512_reduce_add_ps(_mm512_add_ps(a0, b0));
        out[r + 1] = _mm512_reduce_add_ps(_mm512_add_ps(a1, b1));
        out[r + 2] = _mm512_reduce_add_ps(_mm512_add_ps(a2, b2));
        out[r + 3] = _mm512_reduce_add_ps(_mm512_add_ps(a3, b3));
    }
    for (; r < nrows; r++) {
        const float *w = W + (int64_t)r * ldw;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0;
        int64_t j = 0;
        for (; j + 32 <= nfull; j += 32) {
            a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + j), _mm512_loadu_ps(x + j), a0);
            a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + j + 16), _mm512_loadu_ps(x + j + 16), a1);
        }
        if (j < nfull)
            a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + j), _mm512_loadu_ps(x + j), a0);
        if (tail)
            a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, w + nfull), _mm512_maskz_loadu_ps(tail, x + nfull), a1);
        out[r] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
    }
}

/* ---- probes ----
 *
 * Each inner iteration runs K independent multiply-accumulate chains on
 * register operands; the empty asm says x changed, so the products cannot
 * be hoisted out of the loop, and the accumulators end in a volatile sink. */

enum { K_PROBE_ITERS = 1 << 14 };

PI2_T_AVX2 static double probe_avx2(double seconds, volatile int32_t *sink)
{
    __m256i x = _mm256_set1_epi8(3);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i y0 = _mm256_set1_epi8(1), y1 = _mm256_set1_epi8(-2), y2 = _mm256_set1_epi8(3);
    __m256i y3 = _mm256_set1_epi8(-4), y4 = _mm256_set1_epi8(5), y5 = _mm256_set1_epi8(-6);
    __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0;
    uint64_t iters = 0;
    double t0 = pi2_now(), dt;
    do {
        for (int i = 0; i < K_PROBE_ITERS; i++) {
            __asm__ volatile("" : "+x"(x));
            c0 = _mm256_add_epi32(c0, _mm256_madd_epi16(_mm256_maddubs_epi16(x, y0), ones));
            c1 = _mm256_add_epi32(c1, _mm256_madd_epi16(_mm256_maddubs_epi16(x, y1), ones));
            c2 = _mm256_add_epi32(c2, _mm256_madd_epi16(_mm256_maddubs_epi16(x, y2), ones));
            c3 = _mm256_add_epi32(c3, _mm256_madd_epi16(_mm256_maddubs_epi16(x, y3), ones));
            c4 = _mm256_add_epi32(c4, _mm256_madd_epi16(_mm256_maddubs_epi16(x, y4), ones));
            c5 = _mm256_add_epi32(c5, _mm256_madd_epi16(_mm256_maddubs_epi16(x, y5), ones));
        }
        iters += K_PROBE_ITERS;
        dt = pi2_now() - t0;
    } while (dt < seconds);
    __m256i s = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(c0, c1), _mm256_add_epi32(c2, c3)),
                                 _mm256_add_epi32(c4, c5));
    *sink = _mm256_extract_epi32(s, 0) ^ _mm256_extract_epi32(s, 7);
    return (double)iters * 6 * 32 / dt;
}

/* 12 chains: vpdpbusd has ~5 cycles latency and issues up to 2 per cycle. */
PI2_T_AVX512 static double probe_avx512(double seconds, volatile int32_t *sink)
{
    __m512i x = _mm512_set1_epi8(3);
    __m512i y[12], c[12];
    for (int k = 0; k < 12; k++) {
        y[k] = _mm512_set1_epi8((char)(k & 1 ? -(k + 1) : k + 1));
        c[k] = _mm512_setzero_si512();
    }
    __m512i c0 = c[0], c1 = c[1], c2 = c[2], c3 = c[3], c4 = c[4], c5 = c[5];
    __m512i c6 = c[6], c7 = c[7], c8 = c[8], c9 = c[9], c10 = c[10], c11 = c[11];
    uint64_t iters = 0;
    double t0 = pi2_now(), dt;
    do {
        for (int i = 0; i < K_PROBE_ITERS; i++) {
            __asm__ volatile("" : "+v"(x));
            c0 = _mm512_dpbusd_epi32(c0, x, y[0]);
            c1 = _mm512_dpbusd_epi32(c1, x, y[1]);
            c2 = _mm512_dpbusd_epi32(c2, x, y[2]);
            c3 = _mm512_dpbusd_epi32(c3, x, y[3]);
            c4 = _mm512_dpbusd_epi32(c4, x, y[4]);
            c5 = _mm512_dpbusd_epi32(c5, x, y[5]);
            c6 = _mm512_dpbusd_epi32(c6, x, y[6]);
            c7 = _mm512_dpbusd_epi32(c7, x, y[7]);
            c8 = _mm512_dpbusd_epi32(c8, x, y[8]);
            c9 = _mm512_dpbusd_epi32(c9, x, y[9]);
            c10 = _mm512_dpbusd_epi32(c10, x, y[10]);
            c11 = _mm512_dpbusd_epi32(c11, x, y[11]);
        }
        iters += K_PROBE_ITERS;
        dt = pi2_now() - t0;
    } while (dt < seconds);
    __m512i s = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(c0, c1), _mm512_add_epi32(c2, c3)),
                                 _mm512_add_epi32(_mm512_add_epi32(c4, c5), _mm512_add_epi32(c6, c7)));
    s = _mm512_add_epi32(s, _mm512_add_epi32(_mm512_add_epi32(c8, c9), _mm512_add_epi32(c10, c11)));
    *sink = _mm512_reduce_or_epi32(s); /* only keeps the work alive; an add could overflow */
    return (double)iters * 12 * 64 / dt;
}

/* One pass over buf with four 256-bit accumulators; the tail as uint64s
 * and bytes. */
PI2_T_AVX2 static uint64_t read_pass_avx2(const uint8_t *p, size_t n)
{
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 128 <= n; i += 128) {
        s0 = _mm256_add_epi64(s0, ld256(p + i));
        s1 = _mm256_add_epi64(s1, ld256(p + i + 32));
        s2 = _mm256_add_epi64(s2, ld256(p + i + 64));
        s3 = _mm256_add_epi64(s3, ld256(p + i + 96));
    }
    __m256i s = _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3));
    uint64_t r = (uint64_t)_mm256_extract_epi64(s, 0) + (uint64_t)_mm256_extract_epi64(s, 1) +
                 (uint64_t)_mm256_extract_epi64(s, 2) + (uint64_t)_mm256_extract_epi64(s, 3);
    for (; i < n; i++)
        r += p[i];
    return r;
}

/* ---- activations on AVX-512 ----
 *
 * pi2_q8act_quantize's operations per block, 16 lanes at a time: the same
 * max, the same scalar 127 / amax and amax / 127, one multiply and a
 * round-to-nearest-even convert per value (rintf in the default rounding
 * mode), the same clamp; so bit-identical. Prefill quantizes every
 * layer's inputs on one thread: the scalar loop cost as much as a tenth
 * of the batch's matmul time. */
PI2_T_AVX512 static void act_quantize_avx512(const float *x, int64_t ldx, int T, int64_t n, float *scales, int8_t *q,
                                             int32_t *sums)
{
    int64_t nb = n / QG;
    const __m512 fmax = _mm512_set1_ps(FLT_MAX);
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    for (int t = 0; t < T; t++)
        for (int64_t b = 0; b < nb; b++) {
            const float *xb = x + (int64_t)t * ldx + b * QG;
            int8_t *qb = q + (int64_t)t * n + b * QG;
            int64_t i = (int64_t)t * nb + b;
            __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
            __m512 a0 = _mm512_abs_ps(x0), a1 = _mm512_abs_ps(x1);
            bool bad = (__mmask16)(_mm512_cmp_ps_mask(a0, fmax, _CMP_LE_OQ) & _mm512_cmp_ps_mask(a1, fmax, _CMP_LE_OQ)) !=
                       (__mmask16)0xffff; /* NaN or inf */
            float amax = bad ? 0.0f : _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
            if (bad || amax < 0x1p-100f) {
                scales[i] = bad ? NAN : 0.0f;
                memset(qb, 0, QG);
                sums[i] = 0;
                continue;
            }
            float id = 127.0f / amax;
            scales[i] = amax / 127.0f;
            __m512 iv = _mm512_set1_ps(id);
            __m512i r0 = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(x0, iv)), lo), hi);
            __m512i r1 = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(x1, iv)), lo), hi);
            _mm_storeu_si128((__m128i *)(void *)qb, _mm512_cvtepi32_epi8(r0));
            _mm_storeu_si128((__m128i *)(void *)(qb + 16), _mm512_cvtepi32_epi8(r1));
            sums[i] = _mm512_reduce_add_epi32(_mm512_add_epi32(r0, r1));
        }
}

#endif /* PI2_K_X86 */

/* ---- dispatch ---- */

void pi2_k_act_quantize_isa(pi2_isa isa, const float *x, int64_t ldx, int T, int64_t n, float *scales, int8_t *q,
                            int32_t *sums)
{
    assert(n % QG == 0 && T >= 0);
#ifdef PI2_K_X86
    if (isa_pick(isa) == PI2_ISA_AVX512) {
        act_quantize_avx512(x, ldx, T, n, scales, q, sums);
        return;
    }
#else
    (void)isa;
#endif
    act_quantize_scalar(x, ldx, T, n, scales, q, sums);
}

int pi2_k_set_gfni(bool on)
{
#ifdef PI2_K_X86
    if (on && !gfni_supported())
        return -1;
    atomic_store_explicit(&g_gfni, on, memory_order_relaxed);
    return 0;
#else
    return on ? -1 : 0;
#endif
}

void pi2_k_act_quantize(const float *x, int64_t ldx, int T, int64_t n, float *scales, int8_t *q, int32_t *sums)
{
    pi2_k_act_quantize_isa(pi2_q_get_isa(), x, ldx, T, n, scales, q, sums);
}

static void matmul(pi2_isa isa, pi2_qtype wt, int64_t n, int nrows, const uint8_t *const *wp, const uint16_t *const *ws,
                   const float *ascales, const int8_t *aq, const int32_t *asums, int T, float *out, int64_t ldo,
                   const void *pf, int64_t pf_len)
{
    assert(n % QG == 0 && nrows >= 0 && T >= 1 && T <= PI2_K_MAX_T);
    if (nrows == 0)
        return;
#ifdef PI2_K_X86
    const k_mm_ops *op = NULL;
    switch (isa_pick(isa)) {
    case PI2_ISA_AVX512:
        op = wt == PI2_QT_Q4 ? &MM_Q4_VNNI : wt == PI2_QT_Q8 ? &MM_Q8_VNNI : NULL;
        break;
    case PI2_ISA_AVX2:
        op = wt == PI2_QT_Q4 ? &MM_Q4_AVX2 : wt == PI2_QT_Q8 ? &MM_Q8_AVX2 : NULL;
        break;
    case PI2_ISA_SCALAR:
        break;
    }
    if (op == &MM_Q4_VNNI || op == &MM_Q8_VNNI) {
        if (T >= K_PANEL_MIN_T) {
            mm_panels(wt, false, n, nrows, wp, ws, ascales, aq, asums, T, out, ldo);
            return;
        }
    }
    if (op == &MM_Q4_AVX2 && T >= K_P2_MIN_T) {
        mm_panels_avx2(n, nrows, wp, ws, ascales, aq, asums, T, out, ldo);
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
    matmul(pi2_q_get_isa(), wt, n, nrows, wp, ws, ascales, aq, asums, T, out, ldo, NULL, 0);
}

void pi2_k_matmul_pf(pi2_qtype wt, int64_t n, int nrows, const uint8_t *const *wp, const uint16_t *const *ws,
                     const float *ascales, const int8_t *aq, const int32_t *asums, int T, float *out, int64_t ldo,
                     const void *pf, int64_t pf_len)
{
    matmul(pi2_q_get_isa(), wt, n, nrows, wp, ws, ascales, aq, asums, T, out, ldo, pf, pf_len);
}

void pi2_k_axpy_rows_isa(pi2_isa isa, pi2_qtype wt, int64_t n, int nrows, const float *coef,
                         const uint8_t *const *wp, const uint16_t *const *ws, float *out)
{
    assert(n % QG == 0 || wt == PI2_QT_F32);
#ifdef PI2_K_X86
    if (wt == PI2_QT_Q4 || wt == PI2_QT_Q8) {
        switch (isa_pick(isa)) {
        case PI2_ISA_AVX512:
            axpy_simd(axpy_group_avx512, wt, n, nrows, coef, wp, ws, out);
            return;
        case PI2_ISA_AVX2:
            axpy_simd(axpy_group_avx2, wt, n, nrows, coef, wp, ws, out);
            return;
        case PI2_ISA_SCALAR:
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
    pi2_k_axpy_rows_isa(pi2_q_get_isa(), wt, n, nrows, coef, wp, ws, out);
}

static void down_rows(pi2_isa isa, pi2_qtype wt, int64_t n, int nrows, const float *coef, int64_t ldc,
                      const uint8_t *const *wp, const uint16_t *const *ws, int T, float *out, int64_t ldo,
                      const uint8_t *pf, int64_t pf_len)
{
    assert((wt == PI2_QT_Q4 || wt == PI2_QT_Q8) && n % QG == 0 && nrows >= 0 && T >= 1 && T <= PI2_K_MAX_T);
    if (nrows == 0)
        return;
#ifdef PI2_K_X86
    switch (isa_pick(isa)) {
    case PI2_ISA_AVX512:
        if (T >= K_DOWN512_MIN_T) {
            down_vnni512(wt, n, nrows, coef, ldc, wp, ws, T, out, ldo);
            return;
        }
        if (T == 1) {
            down_one512(wt, n, nrows, coef, wp, ws, out, pf, pf_len);
            return;
        }
        down_simd(wt == PI2_QT_Q4 ? down_tok_q4_vnni : down_tok_q8_vnni,
                  wt == PI2_QT_Q4 ? down_one_q4_vnni : down_one_q8_vnni, wt, n, nrows, coef, ldc, wp, ws, T, out, ldo);
        return;
    case PI2_ISA_AVX2:
        down_simd(wt == PI2_QT_Q4 ? down_tok_q4_avx2 : down_tok_q8_avx2,
                  wt == PI2_QT_Q4 ? down_one_q4_avx2 : down_one_q8_avx2, wt, n, nrows, coef, ldc, wp, ws, T, out, ldo);
        return;
    case PI2_ISA_SCALAR:
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
    down_rows(pi2_q_get_isa(), wt, n, nrows, coef, ldc, wp, ws, T, out, ldo, NULL, 0);
}

void pi2_k_down_rows_pf(pi2_qtype wt, int64_t n, int nrows, const float *coef, int64_t ldc, const uint8_t *const *wp,
                        const uint16_t *const *ws, int T, float *out, int64_t ldo, const void *pf, int64_t pf_len)
{
    down_rows(pi2_q_get_isa(), wt, n, nrows, coef, ldc, wp, ws, T, out, ldo, pf, pf_len);
}

void pi2_k_down_gemm_isa(pi2_isa isa, pi2_qtype wt, int64_t n, int nrows, const float *coef, int64_t ldc,
                         const uint8_t *const *wp, const uint16_t *const *ws, int T, float *out, int64_t ldo)
{
    assert((wt == PI2_QT_Q4 || wt == PI2_QT_Q8) && n % QG == 0 && nrows >= 0 && T >= 1 && T <= PI2_K_MAX_T);
    if (nrows == 0)
        return;
#ifdef PI2_K_X86
    if (isa_pick(isa) == PI2_ISA_AVX512) {
        gemm_vnni(wt, n, nrows, coef, ldc, wp, ws, T, out, ldo);
        return;
    }
#else
    (void)isa;
#endif
    gemm_scalar(wt, n, nrows, coef, ldc, wp, ws, T, out, ldo);
}

void pi2_k_down_gemm(pi2_qtype wt, int64_t n, int nrows, const float *coef, int64_t ldc, const uint8_t *const *wp,
                     const uint16_t *const *ws, int T, float *out, int64_t ldo)
{
    pi2_k_down_gemm_isa(pi2_q_get_isa(), wt, n, nrows, coef, ldc, wp, ws, T, out, ldo);
}

void pi2_k_act_quantize_sb_isa(pi2_isa isa, const float *x, int64_t ldx, int T, int64_t n, float *scales, int8_t *q,
                               int32_t *sums)
{
    assert(n % QG == 0 && T >= 0);
#ifdef PI2_K_X86
    if (isa_pick(isa) == PI2_ISA_AVX512) {
        act_sb_avx512(x, ldx, T, n, scales, q, sums);
        return;
    }
#else
    (void)isa;
#endif
    act_sb_scalar(x, ldx, T, n, scales, q, sums);
}

void pi2_k_act_quantize_sb(const float *x, int64_t ldx, int T, int64_t n, float *scales, int8_t *q, int32_t *sums)
{
    pi2_k_act_quantize_sb_isa(pi2_q_get_isa(), x, ldx, T, n, scales, q, sums);
}

void pi2_k_matmul_sb_isa(pi2_isa isa, int64_t n, int nrows, const uint8_t *const *wp, const uint16_t *const *ws,
                         const float *ascales, const int8_t *aq, const int32_t *asums, int T, float *out, int64_t ldo)
{
    assert(n % QG == 0 && nrows >= 0 && T >= 1 && T <= PI2_K_MAX_T);
    if (nrows == 0)
        return;
#ifdef PI2_K_X86
    if (isa_pick(isa) == PI2_ISA_AVX512) {
        mm_panels(PI2_QT_Q4, true, n, nrows, wp, ws, ascales, aq, asums, T, out, ldo);
        return;
    }
#else
    (void)isa;
#endif
    (void)asums;
    matmul_sb_scalar(n, nrows, wp, ws, ascales, aq, T, out, ldo);
}

void pi2_k_matmul_sb(int64_t n, int nrows, const uint8_t *const *wp, const uint16_t *const *ws, const float *ascales,
                     const int8_t *aq, const int32_t *asums, int T, float *out, int64_t ldo)
{
    pi2_k_matmul_sb_isa(pi2_q_get_isa(), n, nrows, wp, ws, ascales, aq, asums, T, out, ldo);
}

void pi2_k_dequant_rows(pi2_qtype wt, int64_t n, int nrows, const uint8_t *const *wp, const uint16_t *const *ws,
                        float *dst)
{
#ifdef PI2_K_X86
    if (wt == PI2_QT_Q4 || wt == PI2_QT_Q8) {
        switch (pi2_q_get_isa()) {
        case PI2_ISA_AVX512:
            dequant_avx512(wt, n, nrows, wp, ws, dst);
            return;
        case PI2_ISA_AVX2:
            dequant_avx2(wt, n, nrows, wp, ws, dst);
            return;
        case PI2_ISA_SCALAR:
            break;
        }
    }
#endif
    dequant_scalar(wt, n, nrows, wp, ws, dst);
}

/* ---- softmax: exp(x) = 2^k * p(r), x = k ln2 + r, |r| <= ln2 / 2, p the
 * degree-6 Taylor polynomial (relative error < 2e-7); x below -87.3
 * (after the max is subtracted) is taken as -87.3: 1.2e-38, nothing next
 * to the max's 1 ---- */

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
    __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sv));
    for (i = 0; i + 16 <= n; i += 16)
        _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), inv));
    if (tail)
        _mm512_mask_storeu_ps(x + i, tail, _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, x + i), inv));
}

/* ---- sgemv_t: columns of up to 64 floats, rows in order ---- */

PI2_T_AVX2 static void sgemv_t_avx2(const float *W, int64_t ldw, int64_t n, int nrows, const float *c, float *out)
{
    int64_t j = 0;
    for (; j + 32 <= n; j += 32) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
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
        __m256 a = _mm256_setzero_ps();
        for (int r = 0; r < nrows; r++)
            a = _mm256_fmadd_ps(_mm256_set1_ps(c[r]), _mm256_loadu_ps(W + (int64_t)r * ldw + j), a);
        _mm256_storeu_ps(out + j, a);
    }
    for (; j < n; j++) {
        float a = 0.0f;
        for (int r = 0; r < nrows; r++)
            a = fmaf(c[r], W[(int64_t)r * ldw + j], a);
        out[j] = a;
    }
}

PI2_T_AVX512 static void sgemv_t_avx512(const float *W, int64_t ldw, int64_t n, int nrows, const float *c, float *out)
{
    int64_t j = 0;
    for (; j + 64 <= n; j += 64) {
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
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
        __m512 a = _mm512_setzero_ps();
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
                                         int64_t ldc, int G, float *out, int64_t ldo)
{
    int64_t j = 0;
    for (; j + 64 <= n; j += 64) {
        __m512 a[4][4];
        for (int g = 0; g < 4; g++)
            for (int q = 0; q < 4; q++)
                a[g][q] = _mm512_setzero_ps();
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
        for (int r = 0; r < nrows; r++) {
            __m512 w = _mm512_maskz_loadu_ps(m, W + (int64_t)r * ldw + j);
            for (int g = 0; g < G; g++)
                a[g] = _mm512_fmadd_ps(_mm512_set1_ps(c[g * ldc + r]), w, a[g]);
        }
        for (int g = 0; g < G; g++)
            _mm512_mask_storeu_ps(out + g * ldo + j, m, a[g]);
    }
}

void pi2_k_sgemv_isa(pi2_isa isa, const float *W, int64_t ldw, int64_t n, int nrows, const float *x, float *out)
{
#ifdef PI2_K_X86
    switch (isa_pick(isa)) {
    case PI2_ISA_AVX512:
        sgemv_avx512(W, ldw, n, nrows, x, out);
        return;
    case PI2_ISA_AVX2:
        sgemv_avx2(W, ldw, n, nrows, x, out);
        return;
    case PI2_ISA_SCALAR:
        break;
    }
#else
    (void)isa;
#endif
    sgemv_scalar(W, ldw, n, nrows, x, out);
}

void pi2_k_sgemv(const float *W, int64_t ldw, int64_t n, int nrows, const float *x, float *out)
{
    pi2_k_sgemv_isa(pi2_q_get_isa(), W, ldw, n, nrows, x, out);
}

void pi2_k_softmax_isa(pi2_isa isa, float *x, int64_t n)
{
#ifdef PI2_K_X86
    if (isa_pick(isa) == PI2_ISA_AVX512) {
        softmax_avx512(x, n);
        return;
    }
#else
    (void)isa;
#endif
    softmax_scalar(x, n);
}

void pi2_k_softmax(float *x, int64_t n) { pi2_k_softmax_isa(pi2_q_get_isa(), x, n); }

void pi2_k_sgemv_t_isa(pi2_isa isa, const float *W, int64_t ldw, int64_t n, int nrows, const float *c, float *out)
{
#ifdef PI2_K_X86
    switch (isa_pick(isa)) {
    case PI2_ISA_AVX512:
        sgemv_t_avx512(W, ldw, n, nrows, c, out);
        return;
    case PI2_ISA_AVX2:
        sgemv_t_avx2(W, ldw, n, nrows, c, out);
        return;
    case PI2_ISA_SCALAR:
        break;
    }
#else
    (void)isa;
#endif
    sgemv_t_scalar(W, ldw, n, nrows, c, out);
}

void pi2_k_sgemv_t_group_isa(pi2_isa isa, const float *W, int64_t ldw, int64_t n, int nrows, const float *c,
                             int64_t ldc, int G, float *out, int64_t ldo)
{
#ifdef PI2_K_X86
    if (isa_pick(isa) == PI2_ISA_AVX512) {
        for (int g0 = 0; g0 < G; g0 += 4)
            sgemv_t4_avx512(W, ldw, n, nrows, c + g0 * ldc, ldc, G - g0 < 4 ? G - g0 : 4, out + g0 * ldo, ldo);
        return;
    }
#endif
    for (int g = 0; g < G; g++)
        pi2_k_sgemv_t_isa(isa, W, ldw, n, nrows, c + g * ldc, out + g * ldo);
}

void pi2_k_sgemv_t_group(const float *W, int64_t ldw, int64_t n, int nrows, const float *c, int64_t ldc, int G,
                         float *out, int64_t ldo)
{
    pi2_k_sgemv_t_group_isa(pi2_q_get_isa(), W, ldw, n, nrows, c, ldc, G, out, ldo);
}

void pi2_k_sgemv_t(const float *W, int64_t ldw, int64_t n, int nrows, const float *c, float *out)
{
    pi2_k_sgemv_t_isa(pi2_q_get_isa(), W, ldw, n, nrows, c, out);
}

/* ---- probes ---- */

static double probe_scalar(double seconds, volatile int32_t *sink)
{
    uint32_t x = 3, c0 = 0, c1 = 0, c2 = 0, c3 = 0, c4 = 0, c5 = 0, c6 = 0, c7 = 0; /* unsigned: wraps */
    uint64_t iters = 0;
    double t0 = pi2_now(), dt;
    do {
        for (int i = 0; i < 1 << 16; i++) {
            __asm__ volatile("" : "+r"(x));
            c0 += x * 1u;
            c1 += x * 2u;
            c2 += x * 3u;
            c3 += x * 5u;
            c4 += x * 7u;
            c5 += x * 11u;
            c6 += x * 13u;
            c7 += x * 17u;
        }
        iters += 1 << 16;
        dt = pi2_now() - t0;
    } while (dt < seconds);
    *sink = (int32_t)(c0 ^ c1 ^ c2 ^ c3 ^ c4 ^ c5 ^ c6 ^ c7);
    return (double)iters * 8 / dt;
}

double pi2_k_probe_int8_peak(pi2_isa isa, double seconds)
{
    volatile int32_t sink = 0;
#ifdef PI2_K_X86
    switch (isa_pick(isa)) {
    case PI2_ISA_AVX512:
        return probe_avx512(seconds, &sink);
    case PI2_ISA_AVX2:
        return probe_avx2(seconds, &sink);
    case PI2_ISA_SCALAR:
        break;
    }
#else
    (void)isa;
#endif
    return probe_scalar(seconds, &sink);
}

static uint64_t read_pass_scalar(const uint8_t *p, size_t n)
{
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        uint64_t v[4];
        memcpy(v, p + i, sizeof v);
        s0 += v[0];
        s1 += v[1];
        s2 += v[2];
        s3 += v[3];
    }
    for (; i < n; i++)
        s0 += p[i];
    return s0 + s1 + s2 + s3;
}

double pi2_k_probe_combine(const double *rate, const double *t0, const double *t1, int n)
{
    double work = 0.0, lo = 0.0, hi = 0.0;
    for (int i = 0; i < n; i++) {
        work += rate[i] * (t1[i] - t0[i]);
        lo = i == 0 || t0[i] < lo ? t0[i] : lo;
        hi = i == 0 || t1[i] > hi ? t1[i] : hi;
    }
    return hi > lo ? work / (hi - lo) : 0.0;
}

double pi2_k_probe_read_bw(const void *buf, size_t n, double seconds)
{
    if (n == 0)
        return 0.0;
    volatile uint64_t sink = 0;
#ifdef PI2_K_X86
    bool avx2 = isa_ok(PI2_ISA_AVX2);
#endif
    size_t reps = n >= (1u << 20) ? 1 : (1u << 20) / n; /* passes between clock reads */
    uint64_t passes = 0;
    double t0 = pi2_now(), dt;
    do {
        for (size_t k = 0; k < reps; k++) {
#ifdef PI2_K_X86
            if (avx2) {
                sink = sink + read_pass_avx2(buf, n);
                continue;
            }
#endif
            sink = sink + read_pass_scalar(buf, n);
        }
        passes += reps;
        dt = pi2_now() - t0;
    } while (dt < seconds);
    return (double)passes * (double)n / dt;
}
