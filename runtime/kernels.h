/* pi2 runtime kernels: batched int8 matmul over quantized weight rows,
 * sparse axpy accumulation, f32 GEMV for predictors, and the machine
 * probes the benchmarks compare against.
 *
 * Weights are the rows of formats/quant.h (Q4 or Q8 payload rows with fp16
 * scales per 32-group, stored apart). Kernels take rows by pointer, one
 * payload pointer and one scale pointer per row, so the same code runs on a
 * contiguous matrix, on the interleaved neuron rows of an FFN bundle
 * (bundle/layout.h) and on rows sitting in a neuron cache.
 *
 * Activations for T tokens are quantized per 32-block to int8 exactly as
 * pi2_q8act_quantize does (formats/quant.h), and each block also records
 * the sum of its q values, so a Q4 row's (q - 8) offset is applied once per
 * block instead of per element:
 *     sum_j (wq_j - 8) * aq_j = sum_j wq_j * aq_j - 8 * sum_j aq_j.
 *
 * ---- Numerics: the same bits on every ISA ----
 * Results that decide which neurons fire (predictor scores against their
 * thresholds, the SiLU threshold, a ReLU gate's sign, MoE routing) and
 * everything that feeds them must not depend on the CPU, or a model says
 * different things on AVX2 and AVX-512 machines. So every path of a
 * kernel (scalar twin, AVX2, AVX-512 VNNI, NEON) computes the same float
 * operations in the same order, and gives the same bits:
 *   - pi2_k_matmul: each block's int32 dot exactly, times the float
 *     d_b * as_b (one rounding); per (row, token) chunks of 64 blocks from
 *     block 0, the chunks' sums added to +0 in order. In a chunk, for
 *     calls of 1-3 tokens (decode: the one-token kernels) 16 stripes
 *     (block b in stripe b % 16), each from +0 by fma(dot_b, d_b * as_b,
 *     stripe) in block order, summed in the tree y_j = x_j + x_j+8, z_i =
 *     y_i + y_i+4, (z_0 + z_2) + (z_1 + z_3); for 4+ tokens (prefill: the
 *     panels, whose lanes are rows) one such fma chain over the chunk's
 *     blocks in order. So a token's bits depend on whether it came in a
 *     batch of 4+, never on the ISA.
 *   - pi2_k_sgemv: the columns of whole 16s, column j in stripe j % 16 by
 *     fma in column order; the stripes summed as q_L = (x_4L + x_4L+2) +
 *     (x_4L+1 + x_4L+3), then (q_0 + q_1) + (q_2 + q_3); plus, added last,
 *     an fma chain over the last n % 16 columns from +0.
 *   - pi2_k_sgemv_t (and _group): each output an fma chain over the rows
 *     in order from +0.
 *   - pi2_k_softmax: one polynomial exp (vec.c, exp_fixed) on every path;
 *     the sum in 16 stripes and pi2_k_matmul's tree; x * (1 / sum).
 *   - pi2_k_down_rows, pi2_k_down_gemm, pi2_k_matmul_sb and the activation
 *     quantizers: integer algorithms with their float steps given below.
 * The scalar twins use fmaf where the SIMD paths fuse. pi2_k_axpy_rows
 * on Q4/Q8 rows (no engine path: decode sends f32 rows, which every ISA
 * runs on the twin) still sums in an order of its own.
 * The engine's other sums run through these kernels too: prefill and
 * decode attention are pi2_k_sgemv, pi2_k_softmax and pi2_k_sgemv_t_group
 * (no BLAS, whose kernel and order follow the CPU), the rest plain C
 * loops, the same code on every CPU.
 *
 * What the kernels do not cover, and is assumed identical: libm. The
 * selections are fed by expf (SiLU, runtime/mathops.c), exp (MoE routing
 * weights, in double), cosf and sinf (RoPE angles), powf and pow (RoPE
 * inverse frequencies, formats/hfconfig.c); sampling also takes expf.
 * sqrt and fmaf are correctly rounded (IEEE 754), the same everywhere.
 * glibc picks the others' code by CPU when it loads (ifunc): an FMA
 * variant where the CPU has FMA and AVX2, else an SSE2 one (FMA4 on some
 * older AMD), whatever --isa says. Zen 3 and Zen 4, like every AVX2 x86
 * machine this project runs on, take the FMA variants, and the same code
 * on deterministic IEEE instructions gives the same bits; so the
 * assumption is one glibc version and FMA + AVX2. A CPU without FMA, or
 * another libm or glibc version, may round one of them differently in
 * the last bit and so flip a neuron at a threshold. arm64 glibc runs
 * the same generic routines with fused multiply-add (every ARMv8 core
 * has it); make test-arm64's end-to-end run checks that a tiny model
 * gives the x86 build's greedy tokens on every arm64 path (under qemu),
 * which shows it for the values that model meets, not for all.
 * The decisions themselves (compares, top-k) call no libm function.
 *
 * ---- ISA ----
 * The path is the process's one ISA state, kept here (pi2_k_get_isa):
 * AVX-512 VNNI, AVX2, or scalar on x86-64; i8mm, dotprod, NEON or scalar
 * on arm64; the best this CPU runs unless pi2_k_set_isa forced one (a
 * tool's --isa flag, tests); the *_isa variants force one per call
 * (tests, probes). SIMD code is compiled with target attributes, so the
 * library builds with plain -O2 and runs on CPUs without them. The arm64
 * paths keep the Numerics above: the same bits as the x86 ones.
 *
 * The code is in runtime/kernels/, a file per op family, each kernel's
 * scalar twin next to its SIMD paths (runtime/kernels/internal.h lists
 * them).
 *
 * Buffers need no particular alignment. Nothing here allocates, and
 * nothing is thread-shared: callers partition rows between threads.
 */
#ifndef PI2_KERNELS_H
#define PI2_KERNELS_H

#include "formats/quant.h"

#include <stdbool.h>
#include <stdint.h>

/* ---- instruction-set selection ---- */
typedef enum pi2_isa {
    PI2_ISA_SCALAR = 0,
    PI2_ISA_AVX2 = 1,    /* x86-64: AVX2 + FMA + F16C */
    PI2_ISA_AVX512 = 2,  /* x86-64: AVX-512 F + BW + VL + VNNI */
    PI2_ISA_NEON = 3,    /* arm64: Advanced SIMD (every ARMv8-A core) */
    PI2_ISA_DOTPROD = 4, /* arm64: NEON + the dot product (sdot/udot, ARMv8.2+) */
    PI2_ISA_I8MM = 5,    /* arm64: dot product + int8 matrix multiply (smmla) */
} pi2_isa;
#define PI2_ISA_COUNT 6

/* "scalar", "avx2", "avx512vnni", "neon", "dotprod", "i8mm"; "?" outside
 * the enum. */
const char *pi2_k_isa_name(pi2_isa isa);
/* Whether this build has the kernels of `isa` (x86-64 builds the x86
 * paths, arm64 the NEON ones; scalar everywhere). */
bool pi2_k_isa_compiled(pi2_isa isa);
/* Whether this CPU (and OS) can run the kernels of `isa` (cpuid or
 * getauxval(AT_HWCAP, AT_HWCAP2), once). */
bool pi2_k_isa_supported(pi2_isa isa);
/* The best supported path. */
pi2_isa pi2_k_isa_best(void);
/* Force the path every kernel without an `isa` argument takes,
 * process-wide; call it before compute threads start. PI2_EUNSUPPORTED if
 * this CPU cannot run it, PI2_EINVAL outside the enum; the path is
 * unchanged on error. */
int pi2_k_set_isa(pi2_isa isa);
/* The path the kernels take now (pi2_k_isa_best() until set). */
pi2_isa pi2_k_get_isa(void);

/* Largest T the matmul kernels accept in one call (callers loop over
 * larger batches). */
#define PI2_K_MAX_T 128

/* Quantize T activation vectors of n values (n a multiple of 32), token t
 * at x + t*ldx, into scales[T][n/32], q[T][n] and sums[T][n/32] (sum of the
 * block's q). Same q and scales as pi2_q8act_quantize. */
void pi2_k_act_quantize(const float *x, int64_t ldx, int T, int64_t n, float *scales, int8_t *q, int32_t *sums);
void pi2_k_act_quantize_isa(pi2_isa isa, const float *x, int64_t ldx, int T, int64_t n, float *scales, int8_t *q,
                            int32_t *sums);

/* out[t * ldo + r] = dot(weight row r, activation t) for r < nrows,
 * t < T (1 <= T <= PI2_K_MAX_T). Weight type wt is Q4 or Q8; row r is
 * wp[r] (pi2_q_payload_row_bytes(wt, n) bytes) with scales ws[r] (n/32
 * fp16). Activations as written by pi2_k_act_quantize for the same n.
 * The kernel tiles rows x tokens so each weight block is loaded once per
 * tile of tokens. */
void pi2_k_matmul(pi2_qtype wt, int64_t n, int nrows, const uint8_t *const *wp, const uint16_t *const *ws,
                  const float *ascales, const int8_t *aq, const int32_t *asums, int T, float *out, int64_t ldo);
void pi2_k_matmul_isa(pi2_isa isa, pi2_qtype wt, int64_t n, int nrows, const uint8_t *const *wp,
                      const uint16_t *const *ws, const float *ascales, const int8_t *aq, const int32_t *asums,
                      int T, float *out, int64_t ldo);

/* Whether the AVX-512 VNNI one-token Q4 matmul may take the high nibbles
 * with GFNI (one instruction for a shift and a mask; the default where
 * the CPU has it). The results are the same bits either way: tests turn
 * it off to compare. -1 (nothing changed) when `on` and the CPU lacks it. */
int pi2_k_set_gfni(bool on);

/* pi2_k_matmul that also brings [pf, pf + pf_len) toward the core (L2)
 * when it runs one token at a time (T < 4: the first token's pass), the
 * prefetches spread evenly over its row tiles so that they stream from
 * memory while the tiles compute. For rows the caller reads next that the
 * hardware prefetcher does not run ahead on: dense decode passes the next
 * chunk's neuron bundles, whose gate rows sit between up and down rows.
 * Batches ignore it. A prefetch never faults: any range is safe, and the
 * results are those of pi2_k_matmul, bit for bit. */
void pi2_k_matmul_pf(pi2_qtype wt, int64_t n, int nrows, const uint8_t *const *wp, const uint16_t *const *ws,
                     const float *ascales, const int8_t *aq, const int32_t *asums, int T, float *out, int64_t ldo,
                     const void *pf, int64_t pf_len);

/* out[0..n) += sum_r coef[r] * dequant(row r) for r < nrows (Q4 or Q8
 * rows as above, or f32): the down projection as an exact float
 * accumulation of the active neurons' columns (stored as rows); decode
 * uses it for f32 rows, pi2_k_down_rows for Q4 and Q8. Every row is read,
 * whatever its coefficient: callers pass only the rows they want. */
void pi2_k_axpy_rows(pi2_qtype wt, int64_t n, int nrows, const float *coef, const uint8_t *const *wp,
                     const uint16_t *const *ws, float *out);
void pi2_k_axpy_rows_isa(pi2_isa isa, pi2_qtype wt, int64_t n, int nrows, const float *coef,
                         const uint8_t *const *wp, const uint16_t *const *ws, float *out);

/* out[t * ldo + j] += sum_r coef[t * ldc + r] * dequant(row r)[j] for
 * t < T (1 <= T <= PI2_K_MAX_T), r < nrows, j < n: the down projection of
 * many neurons at once (decode's active neurons; prefill's of Q8 rows:
 * Q4 rows take pi2_k_down_gemm). wt is Q4 or Q8
 * (rows as above); coefficients must be finite and coef * scale must not
 * overflow, or the outputs are unspecified (never undefined behaviour:
 * decode passes the activations of whatever model it runs).
 * Rows past nrows and coefficients past nrows are never read.
 *
 * Integer arithmetic: per token t, 32-value output block b and group g of
 * rows 16g .. 16g + 15, the products c_r = coef_r * d_rb (float, d_rb the
 * row's fp16 block scale) are quantized to int8 with one scale
 * s = m / 127, m = max_g |c_r|: cq_r = rint(c_r * (127 / m)) (float ops,
 * round half to even). The group's exact integer sums
 * S_j = sum_r cq_r * wq_r[j] (Q4: wq = nibble - 8) are added as
 * out_j = fma(s, S_j, out_j), groups in row order. A group with m == 0 or
 * m < 2^-100 contributes nothing (out is left bit-for-bit alone). Every
 * path (scalar twin, AVX2, AVX-512 VNNI) gives bit-identical results.
 *
 * Error against the exact sum over dequantized rows, per output j:
 *   |out_j - exact_j| <= sum_g (s_g / 2) * sum_{r in g} |wq_r[j]|  (1 + 2^-16)
 *                        + (G + 2) * 2^-24 * (|out_j| + sum_r |c_r * wq_r[j]|)
 *                        + G * 16 * 128 * 2^-100
 * for G groups, i.e. at most (nrows / 2) * max_g s_g * max |wq| (8 for Q4,
 * 128 for Q8) plus float rounding (the tests check the first form). */
void pi2_k_down_rows(pi2_qtype wt, int64_t n, int nrows, const float *coef, int64_t ldc, const uint8_t *const *wp,
                     const uint16_t *const *ws, int T, float *out, int64_t ldo);
void pi2_k_down_rows_isa(pi2_isa isa, pi2_qtype wt, int64_t n, int nrows, const float *coef, int64_t ldc,
                         const uint8_t *const *wp, const uint16_t *const *ws, int T, float *out, int64_t ldo);
/* pi2_k_down_rows, also bringing [pf, pf + pf_len) toward the core while
 * it computes (one token on AVX-512 VNNI; elsewhere the range is left
 * alone): the results are those of pi2_k_down_rows, bit for bit. */
void pi2_k_down_rows_pf(pi2_qtype wt, int64_t n, int nrows, const float *coef, int64_t ldc, const uint8_t *const *wp,
                        const uint16_t *const *ws, int T, float *out, int64_t ldo, const void *pf, int64_t pf_len);

/* The same product as pi2_k_down_rows (out[t * ldo + j] += sum_r
 * coef[t * ldc + r] * dequant(row r)[j], 1 <= T <= PI2_K_MAX_T) as an
 * int8 GEMM for prefill, whose cost per token does not grow with the
 * number of output blocks a coefficient meets:
 *   - rows in groups of 32 from row 0 (the last padded with zero
 *     coefficients), groups in chunks of 16;
 *   - each token's coefficients quantized per group exactly as
 *     pi2_k_act_quantize quantizes activations (cq, scale sigma);
 *   - per group g and 32-value output block b, the rows' block scales d_r
 *     requantized into one: m = max_r |d_r|; if m < 2^-100 the pair
 *     contributes nothing, else D = qmax * m / 127 and each weight becomes
 *     w' = rint(wq * (d_r * (127 / (qmax * m)))), |w'| <= 127 (qmax 8 for
 *     Q4, 128 for Q8; float operations in that order, round half to even);
 *   - S = sum_r cq_r * w'_r[j] exactly; per chunk and token, acc = 0 then
 *     acc = fma((float)S, D * sigma, acc) over the chunk's groups in order,
 *     and out_j += acc.
 * Every path (the scalar twin, AVX2, AVX-512 VNNI) gives
 * bit-identical results for finite coefficients and scales (otherwise the
 * outputs are unspecified, never undefined behaviour). Error against the
 * exact product: the coefficients' int8 rounding (sigma / 2 each) and the
 * weights' (D / 2 each, at most 1/31.75 of a Q4 step of the group's
 * largest scale; one int8 step for Q8). */
void pi2_k_down_gemm(pi2_qtype wt, int64_t n, int nrows, const float *coef, int64_t ldc, const uint8_t *const *wp,
                     const uint16_t *const *ws, int T, float *out, int64_t ldo);
void pi2_k_down_gemm_isa(pi2_isa isa, pi2_qtype wt, int64_t n, int nrows, const float *coef, int64_t ldc,
                         const uint8_t *const *wp, const uint16_t *const *ws, int T, float *out, int64_t ldo);

/* Prefill's gate and up projections of Q4 rows (the engine's choice on
 * every ISA: AVX-512 VNNI and AVX2 on their panels, scalar as the twin):
 * out[t * ldo + r] = dot(row r, activation t), as pi2_k_matmul, with the
 * activations and the weights' block scales coarser so the float work per
 * block goes:
 *   - pi2_k_act_quantize_sb quantizes each token per superblock of 8
 *     blocks (256 values; a row's last superblock may be shorter) as
 *     pi2_q8act_quantize does per block: m = max |x|; if m < 2^-100 the
 *     superblock is 0 with scale 0, else sigma = m / 127 and cq =
 *     rint(x * (127 / m)); scales[T][ns], ns = ceil(n / 256); q[T][n];
 *     sums[T][n / 32] of cq per 32-block;
 *   - per row and superblock the block scales d_b become int16 factors of
 *     one scale: m = max_b |d_b|; if m < 2^-100 the superblock contributes
 *     nothing, else D = m / 4096 and k_b = rint(d_b * (4096 / m)), |k_b| <=
 *     4096 (the scale's rounding: half a part in k_b);
 *   - S = sum_b k_b * sum_j (wq_j - 8) * cq_j exactly; per chunk of 64
 *     blocks and token acc = 0, then acc = fma((float)S, D * sigma, acc)
 *     over the chunk's superblocks in order; out = acc (later chunks: out +
 *     acc).
 * Every path gives bit-identical results for finite activations and
 * scales (otherwise unspecified, never undefined behaviour). */
#define PI2_K_SB 256 /* values per superblock (8 blocks) */
void pi2_k_act_quantize_sb(const float *x, int64_t ldx, int T, int64_t n, float *scales, int8_t *q, int32_t *sums);
void pi2_k_act_quantize_sb_isa(pi2_isa isa, const float *x, int64_t ldx, int T, int64_t n, float *scales, int8_t *q,
                               int32_t *sums);
void pi2_k_matmul_sb(int64_t n, int nrows, const uint8_t *const *wp, const uint16_t *const *ws, const float *ascales,
                     const int8_t *aq, const int32_t *asums, int T, float *out, int64_t ldo);
void pi2_k_matmul_sb_isa(pi2_isa isa, int64_t n, int nrows, const uint8_t *const *wp, const uint16_t *const *ws,
                         const float *ascales, const int8_t *aq, const int32_t *asums, int T, float *out, int64_t ldo);

/* dst[r * n + j] = dequant(row r)[j] for r < nrows (Q4, Q8 or f32 rows):
 * rows as a float tile, the exact values q * d, the same bits on every
 * path. No engine path takes it now (prefill's down projection is
 * pi2_k_down_gemm and pi2_k_down_rows). */
void pi2_k_dequant_rows(pi2_qtype wt, int64_t n, int nrows, const uint8_t *const *wp, const uint16_t *const *ws,
                        float *dst);

/* out[r] = dot(W[r, 0..n), x) for r in [0, nrows), W row-major f32 with
 * row stride ldw floats (predictor layers). */
void pi2_k_sgemv(const float *W, int64_t ldw, int64_t n, int nrows, const float *x, float *out);
void pi2_k_sgemv_isa(pi2_isa isa, const float *W, int64_t ldw, int64_t n, int nrows, const float *x, float *out);

/* dst[0..n) = the fp16 values src[0..n) as f32: exact on every path
 * (the fp16 KV cache's rows before the attention kernels above read them,
 * so its sums are theirs, in their order, on every CPU). */
void pi2_k_f16_to_f32(const uint16_t *src, int64_t n, float *dst);
void pi2_k_f16_to_f32_isa(pi2_isa isa, const uint16_t *src, int64_t n, float *dst);
/* x[0..n) = softmax(x) in place (n >= 1): exp(x - max) / sum. Every path
 * computes exp with the same degree-6 polynomial (relative error below
 * 2e-7; no libm) and gives the same bits (Numerics above). */
void pi2_k_softmax(float *x, int64_t n);
void pi2_k_softmax_isa(pi2_isa isa, float *x, int64_t n);

/* out[j] = sum over r in [0, nrows) of c[r] * W[r, j], for j in [0, n): the
 * rows weighted and added, in row order (attention's weighted sum of V). */
void pi2_k_sgemv_t(const float *W, int64_t ldw, int64_t n, int nrows, const float *c, float *out);
void pi2_k_sgemv_t_isa(pi2_isa isa, const float *W, int64_t ldw, int64_t n, int nrows, const float *c, float *out);
/* pi2_k_sgemv_t for G weight vectors (c + g * ldc) against the same rows,
 * into out + g * ldo: the same bits as G calls, each row read once for up
 * to 4 of them (attention's heads that share a KV head). */
void pi2_k_sgemv_t_group(const float *W, int64_t ldw, int64_t n, int nrows, const float *c, int64_t ldc, int G,
                         float *out, int64_t ldo);
void pi2_k_sgemv_t_group_isa(pi2_isa isa, const float *W, int64_t ldw, int64_t n, int nrows, const float *c,
                             int64_t ldc, int G, float *out, int64_t ldo);
/* The same added to out, each column's chain continued in row order: a
 * call over rows [0, a) then this over [a, b) give the bits of one call
 * over [0, b) (the fp16 KV cache's values, converted a block at a time). */
void pi2_k_sgemv_t_group_acc(const float *W, int64_t ldw, int64_t n, int nrows, const float *c, int64_t ldc, int G,
                             float *out, int64_t ldo);
void pi2_k_sgemv_t_group_acc_isa(pi2_isa isa, const float *W, int64_t ldw, int64_t n, int nrows, const float *c,
                                 int64_t ldc, int G, float *out, int64_t ldo);

/* ---- probes (benchmarks and the planner's hardware profile) ---- */

/* Peak int8 multiply-accumulates per second of one thread: a register-
 * resident chain of the ISA's int8 dot instructions (VNNI vpdpbusd, or
 * AVX2 vpmaddubsw + vpmaddwd + vpaddd), no loads, run for about `seconds`.
 * Scalar: plain integer multiply-adds. */
double pi2_k_probe_int8_peak(pi2_isa isa, double seconds);

/* Read bandwidth in bytes/s of one thread streaming over buf[0..n) (wide
 * loads summed so nothing is optimised away), repeated for about
 * `seconds`. Callers run one per thread on disjoint buffers and combine
 * the rates with pi2_k_probe_combine. */
double pi2_k_probe_read_bw(const void *buf, size_t n, double seconds);

/* The machine's rate from n threads' probes: thread i measured rate[i]
 * between the clock readings t0[i] and t1[i]. The work they did over the
 * span from the first start to the last end, so threads the scheduler ran
 * one after the other count once, where a plain sum of their rates would
 * count them as if they had run side by side. */
double pi2_k_probe_combine(const double *rate, const double *t0, const double *t1, int n);

#endif
