/* pi2 quantization: Q4 and Q8 weight rows with scales stored apart from the
 * payloads, F32 passthrough, int8 activations, and the reference dot
 * products the runtime kernels are tested against.
 *
 * ---- Layout of a quantized matrix [rows, cols] (little-endian) ----
 *
 * A row is cut into groups of PI2_Q_GROUP = 32 consecutive values along the
 * row (the input dimension), so cols must be a multiple of 32. The matrix is
 * two arrays (a bundled model's FFN rows carry each payload row with its
 * scale row instead, bundle/layout.h; the row bytes are the same):
 *
 *   scales   uint16 fp16 [rows][cols/32]          (one scale d per group)
 *   payload  uint8       [rows][cols/32][G]       (G = 16 for Q4, 32 for Q8)
 *
 * Row r's scales start at scales + r*cols/32 and its payload at
 * payload + r*pi2_q_payload_row_bytes(t, cols); rows are contiguous, with no
 * padding between rows or groups.
 *
 *   Q4  G = 16 bytes. Byte j (0..15) holds element j of the group in its low
 *       nibble and element j+16 in its high nibble, so one 16-byte load splits
 *       into elements 0..15 (& 0x0f) and 16..31 (>> 4) in order. The nibble q
 *       is unsigned 0..15; value = (q - 8) * d.
 *   Q8  G = 32 bytes, one two's-complement int8 q per element in [-127, 127]
 *       (the quantizer never writes -128; readers and kernels accept it);
 *       value = q * d.
 *   F32 no scales; payload is the row as little-endian IEEE floats (4 bytes
 *       per element, any cols >= 1). Used for norms and other small tensors.
 *
 * ---- Quantization (pi2_q_quantize_row) ----
 *
 * Per group, m is the first element of largest magnitude (sign kept) and
 * amax = |m|.
 *   Q4  (like ggml Q4_0) d = m / -8, q_j = clamp(round(x_j / d) + 8, 0, 15).
 *   Q8  d = amax / 127,              q_j = clamp(round(x_j / d), -127, 127).
 * Unlike ggml, the stored fp16 scale is the fp16 value nearest to d *toward
 * zero* (|D| <= |d| < |D| + ulp), and x_j / D is evaluated with that stored D
 * in double precision; round() is half away from zero. A zero D is stored as
 * +0 (0x0000) and then every q is 8 (Q4) or 0 (Q8). Consequences:
 *   - the element m always lands exactly on the clamp (-8 or +-127), so
 *     quantizing a dequantized row reproduces the same scale and payload
 *     bytes for every group (including fp16-subnormal and zero scales);
 *   - the round-trip error bounds below hold exactly (no float slop):
 *     dequantized values (q - 8) * D and q * D are exact in float.
 *
 * ---- Round-trip error, |x_j - dequant(quant(x))_j|, D = stored scale ----
 *
 * ulp(D) is the fp16 spacing at D: 2^-24 when |D| < 2^-14 (subnormal or
 * zero), else 2^(e-10) for |D| in [2^e, 2^(e+1)).
 *   Q8  every element:                        <= max(D/2, 127*ulp(D)).
 *       For a normal D (|D| >= 2^-14) that is D/2: the clamped element m
 *       errs by at most 127*ulp(D) <= 0.124*D.
 *   Q4  elements with x_j / D <= 7.5:         <= max(|D|/2, |m| - 8|D|),
 *                                                which is |D|/2 for normal D;
 *       elements with x_j / D > 7.5 (opposite sign to m, |x_j| > 7.5|D|)
 *       are clamped to q = 15, value 7*D:     <= |m| - 7|D| < |D| + 8*ulp(D).
 *       So x_j = -m comes back as 7/8 of its value: Q4_0's asymmetric grid
 *       costs one full step, not half a step, on that side.
 *   pi2_q_error_bound returns the bound for any element of a group given its
 *   stored scale: |D| + 8*ulp(D) (Q4), max(D/2, 127*ulp(D)) (Q8), 0 (F32).
 *
 * Limits: inputs must be finite and |d| < 65536 (Q4: amax < 524288; Q8:
 * amax < 127 * 65536), else the row is rejected with PI2_ERANGE.
 *
 * ---- Activations and the dot product ----
 *
 * Activations are quantized per 32-block to int8 with an f32 scale
 * s = amax / 127 and q = clamp(rint(x * (127 / amax)), -127, 127) (rint:
 * round half to even, what SIMD conversions do). The weight-activation dot
 * product is, block by block,
 *     sum_b  (int32 sum_j wq_j * aq_j) * (float)(wscale_b * ascale_b)
 * (Q4's wq_j is q - 8). The scalar reference here sums the terms in double
 * and rounds once at the end. The fast kernels (AVX2, AVX-512 VNNI), their
 * instruction-set selection and their error bounds against this reference
 * are the runtime's: runtime/kernels.h.
 */
#ifndef PI2_QUANT_H
#define PI2_QUANT_H

#include <assert.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "formats/common.h"

#define PI2_Q_GROUP 32        /* values per group (one scale each) */
#define PI2_Q4_GROUP_BYTES 16 /* payload bytes per Q4 group */
#define PI2_Q8_GROUP_BYTES 32 /* payload bytes per Q8 group */

/* On-disk block sizes: changing any of these changes the file format. */
static_assert(PI2_Q4_GROUP_BYTES * 2 == PI2_Q_GROUP, "Q4 group: two nibbles per byte");
static_assert(PI2_Q8_GROUP_BYTES == PI2_Q_GROUP, "Q8 group: one byte per value");
static_assert(sizeof(uint16_t) == 2, "fp16 scales are 2 bytes");
static_assert(sizeof(float) == 4, "F32 payloads are 4 bytes per value");

typedef enum pi2_qtype {
    PI2_QT_F32 = 0,
    PI2_QT_Q8 = 1,
    PI2_QT_Q4 = 2,
} pi2_qtype;

/* "f32", "q8", "q4"; "?" for a value outside the enum. */
const char *pi2_q_type_name(pi2_qtype t);
/* Parse a name as printed by pi2_q_type_name (exact, lower case). Unknown
 * names give PI2_EUNSUPPORTED and a message listing the known ones. */
int pi2_q_type_parse(const char *s, pi2_qtype *out, pi2_err *err);

/* Check that a row of `cols` values can be stored as type t: cols >= 1 and,
 * for Q4/Q8, a multiple of 32 (PI2_ESHAPE, message names `what`); the row's
 * payload size must fit size_t (PI2_ERANGE); unknown t gives PI2_EINVAL.
 * Every other function here assumes cols passed this check. */
int pi2_q_check_cols(pi2_qtype t, int64_t cols, const char *what, pi2_err *err);

/* Payload bytes of one row: cols/2 (Q4), cols (Q8), 4*cols (F32). */
size_t pi2_q_payload_row_bytes(pi2_qtype t, int64_t cols);
/* fp16 scales of one row: cols/32 (Q4, Q8), 0 (F32). */
size_t pi2_q_scale_row_count(pi2_qtype t, int64_t cols);

/* Quantize one row x[cols] into scales[pi2_q_scale_row_count] and
 * payload[pi2_q_payload_row_bytes] (caller-owned; scales may be NULL for
 * F32). Returns 0, PI2_ERANGE if x holds a non-finite value or a group
 * whose scale does not fit fp16 (see Limits above), or PI2_EINVAL for a type
 * outside the enum; on error nothing is written. */
int pi2_q_quantize_row(pi2_qtype t, const float *x, int64_t cols, uint16_t *scales, uint8_t *payload);

/* Quantize one row like pi2_q_quantize_row, into the same layout (any
 * reader, pi2_q_dequantize_row and the runtime's kernels read it), but for
 * Q4 each group's scale is searched: the plain scale and candidates that
 * put the group's largest magnitude m on other levels (-6 .. -8 and
 * +6 .. +7.5 in quarter steps), each also refitted by least squares to the
 * levels it chose, all rounded to the nearest fp16; candidates that would
 * clamp m (its level x/D past -8.5 or 7.5) are skipped. The group keeps
 * the scale whose levels (nearest, rounded as above) give the least
 *     sum_j imp_j * (x_j - value_j)^2,
 * imp NULL meaning imp_j = 1. imp[cols] (caller-owned) is the importance
 * of each column, e.g. the mean square of the activation that column
 * multiplies; values must be finite and >= 0.
 * Guarantees, per group: that error is never above the plain quantizer's
 * (ties keep the plain bytes, so an all-zero or exactly representable
 * group is stored as pi2_q_quantize_row stores it); m comes back within
 * about half a step (|D|/2 up to float rounding of the level test); the
 * stored scale is a finite fp16 (possibly subnormal) and every level is
 * 0..15; the output is a pure function of (x, imp), the same bytes on
 * every platform. Not kept from pi2_q_quantize_row: the scale's sign and
 * size rule, so pi2_q_error_bound's per-element bound (a searched scale
 * may put m on the + side, clamping the other side sooner) and the
 * re-quantizing round trip. Q8 and F32 rows are quantized by pi2_q_quantize_row (imp
 * unused). Returns 0; PI2_EINVAL for a type outside the enum or a
 * negative or non-finite imp value; PI2_ERANGE as pi2_q_quantize_row. On
 * error nothing is written. */
int pi2_q_quantize_row_search(pi2_qtype t, const float *x, int64_t cols, const float *imp, uint16_t *scales,
                              uint8_t *payload);

/* out[cols] = the values a quantized row stands for (exact in float). */
void pi2_q_dequantize_row(pi2_qtype t, const uint16_t *scales, const uint8_t *payload, int64_t cols,
                          float *out);

/* out[j] += a * w_j for the dequantized row w (one multiply and one add per
 * element, in float): a sparse Down column, stored as a row, added in. */
void pi2_q_axpy_row(pi2_qtype t, float a, const uint16_t *scales, const uint8_t *payload, int64_t cols,
                    float *out);

/* Largest round-trip error of any element of a group stored with fp16
 * scale `scale` (see the bounds above). */
float pi2_q_error_bound(pi2_qtype t, uint16_t scale);

/* Quantize activations x[n] (n a multiple of 32) per 32-block into
 * scales[n/32] and q[n] (caller-owned). A block whose amax is 0 or below
 * 2^-100 gets scale 0 and q = 0; a block holding NaN or +-inf gets scale NaN
 * and q = 0, so dot products with it are NaN rather than garbage. Otherwise
 * |x_j - q_j * s| <= s/2 up to float rounding. */
void pi2_q8act_quantize(const float *x, int64_t n, float *scales, int8_t *q);

/* Dot product of one weight row (type wt, n values) with quantized
 * activations, the scalar reference (plain loops, summed in double; the
 * runtime's kernels are tested against it); n a multiple of 32 that passed
 * pi2_q_check_cols; aq values in [-127, 127] (as pi2_q8act_quantize
 * writes). For F32 rows wscales is unused and each block contributes
 * (sum_j w_j * aq_j) * ascale. */
float pi2_q_dot_q8act_scalar(pi2_qtype wt, const uint16_t *wscales, const uint8_t *wpayload,
                             const float *ascales, const int8_t *aq, int64_t n);

#endif
