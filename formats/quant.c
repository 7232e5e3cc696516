/* Quantization. The format and the error bounds are specified in quant.h;
 * this file holds the quantizers and the scalar references the runtime's
 * SIMD kernels (runtime/kernels.h) are tested against.
 *
 * Why the quantizer divides in double by the stored fp16 scale: the stored
 * value is what every kernel multiplies by, so the bounds are stated on it;
 * and in double the rounding decision round(x / D) is exact: with 24- and
 * 11-bit significands, x / D is either exactly a half-integer or at least
 * 2^-24 (relative) away from one, far beyond double's rounding error. So
 * the bounds hold with no float slop and every platform writes the same
 * bytes. Quantizing is offline work; speed there
 * matters less than bit-for-bit reproducibility.
 */
#include "formats/quant.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* Payloads and scales are used in place from the mapped file. */
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "pi2 formats are little-endian; big-endian hosts unsupported");

#define SCALE_LIMIT 65536.0 /* |d| must stay below this (Q4 and Q8 alike) */
#define ACT_TINY 0x1p-100f  /* activation blocks with a smaller amax are zero */

/* ---- names, shapes ---- */

const char *pi2_q_type_name(pi2_qtype t)
{
    switch (t) {
    case PI2_QT_F32:
        return "f32";
    case PI2_QT_Q8:
        return "q8";
    case PI2_QT_Q4:
        return "q4";
    }
    return "?";
}

int pi2_q_type_parse(const char *s, pi2_qtype *out, pi2_err *err)
{
    static const pi2_qtype all[] = {PI2_QT_F32, PI2_QT_Q8, PI2_QT_Q4};
    for (size_t i = 0; s && i < sizeof all / sizeof all[0]; i++) {
        if (strcmp(s, pi2_q_type_name(all[i])) == 0) {
            *out = all[i];
            return 0;
        }
    }
    return pi2_err_set(err, PI2_EUNSUPPORTED, "unknown quantization type '%.64s' (expected f32, q8 or q4)",
                       s ? s : "(null)");
}

static bool qtype_valid(pi2_qtype t) { return t == PI2_QT_F32 || t == PI2_QT_Q8 || t == PI2_QT_Q4; }

int pi2_q_check_cols(pi2_qtype t, int64_t cols, const char *what, pi2_err *err)
{
    if (!what)
        what = "row";
    if (!qtype_valid(t))
        return pi2_err_set(err, PI2_EINVAL, "%s: unknown quantization type %d", what, (int)t);
    if (cols < 1)
        return pi2_err_set(err, PI2_ESHAPE, "%s: %lld columns (need at least 1)", what, (long long)cols);
    if (t != PI2_QT_F32 && cols % PI2_Q_GROUP != 0)
        return pi2_err_set(err, PI2_ESHAPE, "%s: %lld columns is not a multiple of the %s group size %d", what,
                           (long long)cols, pi2_q_type_name(t), PI2_Q_GROUP);
    size_t bytes;
    if ((uint64_t)cols > SIZE_MAX || !pi2_mul_size((size_t)cols, t == PI2_QT_F32 ? sizeof(float) : 1, &bytes))
        return pi2_err_set(err, PI2_ERANGE, "%s: %lld columns is too large", what, (long long)cols);
    return 0;
}

size_t pi2_q_payload_row_bytes(pi2_qtype t, int64_t cols)
{
    if (pi2_q_check_cols(t, cols, NULL, NULL) != 0)
        return 0;
    switch (t) {
    case PI2_QT_F32:
        return (size_t)cols * sizeof(float);
    case PI2_QT_Q8:
        return (size_t)cols / PI2_Q_GROUP * PI2_Q8_GROUP_BYTES;
    case PI2_QT_Q4:
        return (size_t)cols / PI2_Q_GROUP * PI2_Q4_GROUP_BYTES;
    }
    return 0;
}

size_t pi2_q_scale_row_count(pi2_qtype t, int64_t cols)
{
    if (t == PI2_QT_F32 || pi2_q_check_cols(t, cols, NULL, NULL) != 0)
        return 0;
    return (size_t)cols / PI2_Q_GROUP;
}

/* ---- scales ---- */

/* fp16 bits of the largest fp16 value <= a, for 0 <= a < 65536. Rounding to
 * nearest first lands within half an fp16 step of a (the float rounding of a
 * is far finer), so at most one step down is ever taken. */
static uint16_t f16_toward_zero(double a)
{
    uint16_t h = pi2_f32_to_f16((float)a);
    while (h > 0 && (double)pi2_f16_to_f32(h) > a)
        h--;
    return h;
}

/* Spacing of fp16 values at |D| (see quant.h); +inf for inf/NaN scales. */
static float f16_ulp(uint16_t h)
{
    int e = (h >> 10) & 0x1f;
    if (e == 0x1f)
        return INFINITY;
    return e == 0 ? 0x1p-24f : ldexpf(1.0f, e - 25);
}

float pi2_q_error_bound(pi2_qtype t, uint16_t scale)
{
    float d = fabsf(pi2_f16_to_f32(scale));
    float ulp = f16_ulp(scale);
    switch (t) {
    case PI2_QT_Q4:
        return d + 8.0f * ulp;
    case PI2_QT_Q8:
        return fmaxf(0.5f * d, 127.0f * ulp);
    case PI2_QT_F32:
        return 0.0f;
    }
    return INFINITY;
}

/* ---- quantize / dequantize ---- */

/* The first element of largest magnitude, sign kept. */
static float group_max(const float *x)
{
    /* the largest magnitude first (a max reduction that vectorises), then
     * the first element that has it, sign kept */
    float amax = 0.0f;
    for (int j = 0; j < PI2_Q_GROUP; j++) {
        float a = fabsf(x[j]);
        amax = a > amax ? a : amax;
    }
    if (amax == 0.0f)
        return 0.0f;
    for (int j = 0; j < PI2_Q_GROUP; j++)
        if (fabsf(x[j]) == amax)
            return x[j];
    return 0.0f; /* not reached: inputs are finite */
}

/* x / D rounded half away from zero, for |x / D| <= 128 (the scale limits
 * guarantee it). Branch-free so the group loops vectorise: truncate, then
 * step away from zero when the exact remainder reaches one half. */
static inline int32_t div_round(float x, double dd)
{
    double v = (double)x / dd;
    int32_t t = (int32_t)v; /* exact truncation */
    double f = v - (double)t;
    return t + (int32_t)(f >= 0.5) - (int32_t)(f <= -0.5);
}

/* The fast twin of div_round: v = x * (1/D) in float (absolute error below
 * 2^-15 for |v| <= 128), rounded half away from zero. It agrees with
 * div_round except possibly when v lies within 2^-12 of a half-integer, and
 * it sets *near then so the caller redoes the group exactly. Vectorises. */
static inline int32_t mul_round(float x, float inv, int *near)
{
    float v = x * inv;
    float av = fabsf(v);
    float fr = av - (float)(int32_t)av;
    *near |= fabsf(fr - 0.5f) < 0x1p-12f;
    int32_t r = (int32_t)(av + 0.5f);
    return v < 0.0f ? -r : r;
}

/* The plain Q4 scale of a group (quant.h): m / -8, fp16 toward zero. */
static uint16_t q4_plain_scale(const float *x)
{
    double d = (double)group_max(x) / -8.0;
    uint16_t h = f16_toward_zero(fabs(d));
    return h != 0 && d < 0 ? (uint16_t)(h | 0x8000) : h;
}

/* q[j] = clamp(round(x_j / D) + 8, 0, 15) for the stored scale h (all 8
 * when D is zero), rounding exactly as quant.h states. */
static void q4_levels(const float *x, uint16_t h, int32_t *q)
{
    if ((h & 0x7fff) == 0) {
        for (int j = 0; j < PI2_Q_GROUP; j++)
            q[j] = 8;
        return;
    }
    double dd = pi2_f16_to_f32(h);
    float inv = 1.0f / (float)dd;
    int near = 0;
    for (int j = 0; j < PI2_Q_GROUP; j++) {
        int32_t t = mul_round(x[j], inv, &near) + 8;
        t = t < 0 ? 0 : t;
        q[j] = t > 15 ? 15 : t;
    }
    for (int j = 0; near && j < PI2_Q_GROUP; j++) { /* a near tie: exact path */
        int32_t t = div_round(x[j], dd) + 8;
        t = t < 0 ? 0 : t;
        q[j] = t > 15 ? 15 : t;
    }
}

static void q4_pack(const int32_t *q, uint8_t *qs)
{
    for (int j = 0; j < PI2_Q4_GROUP_BYTES; j++)
        qs[j] = (uint8_t)(q[j] | q[j + 16] << 4);
}

static void quantize_q4_group(const float *x, uint16_t *scale, uint8_t *qs)
{
    int32_t q[PI2_Q_GROUP];
    *scale = q4_plain_scale(x);
    q4_levels(x, *scale, q);
    q4_pack(q, qs);
}

static void quantize_q8_group(const float *x, uint16_t *scale, uint8_t *qs)
{
    double d = fabs((double)group_max(x)) / 127.0;
    uint16_t h = f16_toward_zero(d);
    *scale = h;
    if (h == 0) {
        memset(qs, 0, PI2_Q8_GROUP_BYTES);
        return;
    }
    double dd = pi2_f16_to_f32(h);
    float inv = 1.0f / (float)dd;
    int32_t q[PI2_Q_GROUP];
    int near = 0;
    for (int j = 0; j < PI2_Q_GROUP; j++) {
        int32_t t = mul_round(x[j], inv, &near);
        t = t < -127 ? -127 : t;
        q[j] = t > 127 ? 127 : t;
    }
    for (int j = 0; near && j < PI2_Q_GROUP; j++) { /* a near tie: exact path */
        int32_t t = div_round(x[j], dd);
        t = t < -127 ? -127 : t;
        q[j] = t > 127 ? 127 : t;
    }
    for (int j = 0; j < PI2_Q_GROUP; j++)
        qs[j] = (uint8_t)(int8_t)q[j];
}

/* 0, or PI2_ERANGE when a value of x is non-finite or past the type's
 * scale limit (quant.h, Limits). */
static int row_in_range(pi2_qtype t, const float *x, int64_t cols)
{
    double limit = t == PI2_QT_Q4 ? 8.0 * SCALE_LIMIT : t == PI2_QT_Q8 ? 127.0 * SCALE_LIMIT : INFINITY;
    int bad = 0; /* branch-free: NaN fails the comparison too */
    for (int64_t j = 0; j < cols; j++)
        bad |= !(fabs((double)x[j]) < limit);
    return bad ? PI2_ERANGE : 0;
}

int pi2_q_quantize_row(pi2_qtype t, const float *x, int64_t cols, uint16_t *scales, uint8_t *payload)
{
    if (!qtype_valid(t))
        return PI2_EINVAL;
    /* Validate everything first so nothing is written on error. */
    if (row_in_range(t, x, cols))
        return PI2_ERANGE;
    int64_t ng = cols / PI2_Q_GROUP;
    switch (t) {
    case PI2_QT_F32:
        memcpy(payload, x, (size_t)cols * sizeof(float));
        break;
    case PI2_QT_Q8:
        for (int64_t g = 0; g < ng; g++)
            quantize_q8_group(x + g * PI2_Q_GROUP, &scales[g], payload + g * PI2_Q8_GROUP_BYTES);
        break;
    case PI2_QT_Q4:
        for (int64_t g = 0; g < ng; g++)
            quantize_q4_group(x + g * PI2_Q_GROUP, &scales[g], payload + g * PI2_Q4_GROUP_BYTES);
        break;
    }
    return 0;
}

/* ---- Q4 with a searched scale ----
 *
 * Why these candidates: the plain scale puts the largest magnitude m on
 * level -8, which wastes resolution when an element of the other sign is
 * about as large as m (it clamps at +7) or when the rest of the group sits
 * between levels. Putting m on other levels (-6 .. -8, or the + side),
 * then refitting the scale to the levels chosen (least squares), is the
 * search ggml's k-quants and importance-weighted quantizers do. m itself
 * is never clamped: scales that clip the group's largest weight to lower
 * the squared error measured worse in perplexity on the real small models
 * (runtime/PERF.md), whatever the error said: the largest weights matter
 * beyond their squared error. */

#define SEARCH_LO 6.0f   /* m on level -6 .. -8 and +6 .. +7.5 */
#define SEARCH_HI 8.0f
#define SEARCH_STEP 0.25f

/* q[j] (0..15) nearest to x_j / D for a float D != 0, with the level
 * clamped first so a tiny refitted D cannot overflow the conversion. */
static void q4_levels_fast(const float *x, float D, int32_t *q)
{
    float inv = 1.0f / D;
    for (int j = 0; j < PI2_Q_GROUP; j++) {
        float v = x[j] * inv;
        v = v < -9.0f ? -9.0f : v > 9.0f ? 9.0f : v;
        int32_t t = (int32_t)(v + (v < 0.0f ? -0.5f : 0.5f)) + 8;
        t = t < 0 ? 0 : t;
        q[j] = t > 15 ? 15 : t;
    }
}

/* sum_j w_j (x_j - (q_j - 8) D)^2 in double (w NULL: weights 1). */
static double q4_sq_err(const float *x, const float *w, double D, const int32_t *q)
{
    double e = 0.0;
    for (int j = 0; j < PI2_Q_GROUP; j++) {
        double r = (double)x[j] - (double)(q[j] - 8) * D;
        e += (w ? (double)w[j] : 1.0) * r * r;
    }
    return e;
}

/* The scale that minimises the weighted error for the levels q (least
 * squares): d = sum w x l / sum w l^2 with l = q - 8; 0 when no level is
 * used. */
static double q4_refit(const float *x, const float *w, const int32_t *q)
{
    double sxl = 0.0, sll = 0.0;
    for (int j = 0; j < PI2_Q_GROUP; j++) {
        double wl = (w ? (double)w[j] : 1.0) * (double)(q[j] - 8);
        sxl += wl * (double)x[j];
        sll += wl * (double)(q[j] - 8);
    }
    return sll > 0.0 ? sxl / sll : 0.0;
}

/* Try scale d (rounded to the nearest fp16) for the group x whose
 * largest magnitude is m: keep it in *best when m's level is not clamped
 * and the error (fast levels) is below *best_e. Returns the refit of its
 * levels, 0 when it was not tried. */
static double q4_try(const float *x, const float *w, float m, double d, uint16_t *best, double *best_e)
{
    uint16_t h = pi2_f32_to_f16((float)d);
    if ((h & 0x7fff) == 0 || (h & 0x7c00) == 0x7c00)
        return 0.0; /* zero, or past fp16 */
    float D = pi2_f16_to_f32(h);
    int32_t q[PI2_Q_GROUP];
    float lm = m / D; /* m's level: never clamped (see above) */
    if (lm < -8.5f || lm > 7.5f)
        return 0.0;
    q4_levels_fast(x, D, q);
    double e = q4_sq_err(x, w, D, q);
    if (e < *best_e) {
        *best_e = e;
        *best = h;
    }
    return q4_refit(x, w, q);
}

/* One group: the plain scale, or a searched one whose exact levels err
 * less (so never more than the plain quantizer). */
static void quantize_q4_group_search(const float *x, const float *w, uint16_t *scale, uint8_t *qs)
{
    int32_t qp[PI2_Q_GROUP], qb[PI2_Q_GROUP];
    uint16_t plain = q4_plain_scale(x), best = plain;
    q4_levels(x, plain, qp);
    double plain_e = q4_sq_err(x, w, pi2_f16_to_f32(plain), qp), best_e = plain_e;
    float m = group_max(x);
    for (float s = SEARCH_LO; m != 0.0f && plain_e > 0.0 && s <= SEARCH_HI; s += SEARCH_STEP) {
        double r = q4_try(x, w, m, (double)m / -s, &best, &best_e); /* m on level -s */
        if (r != 0.0)
            q4_try(x, w, m, r, &best, &best_e);
        if (s > 7.5f)
            continue;
        r = q4_try(x, w, m, (double)m / s, &best, &best_e); /* m on level +s */
        if (r != 0.0)
            q4_try(x, w, m, r, &best, &best_e);
    }
    if (best != plain) { /* the search's levels were approximate: compare exactly */
        q4_levels(x, best, qb);
        if (q4_sq_err(x, w, pi2_f16_to_f32(best), qb) < plain_e) {
            *scale = best;
            q4_pack(qb, qs);
            return;
        }
    }
    *scale = plain;
    q4_pack(qp, qs);
}

int pi2_q_quantize_row_search(pi2_qtype t, const float *x, int64_t cols, const float *imp, uint16_t *scales,
                              uint8_t *payload)
{
    if (t != PI2_QT_Q4)
        return pi2_q_quantize_row(t, x, cols, scales, payload);
    int bad = 0;
    for (int64_t j = 0; imp && j < cols; j++)
        bad |= !(imp[j] >= 0.0f && imp[j] <= FLT_MAX);
    if (bad)
        return PI2_EINVAL;
    if (row_in_range(t, x, cols))
        return PI2_ERANGE;
    for (int64_t g = 0; g < cols / PI2_Q_GROUP; g++)
        quantize_q4_group_search(x + g * PI2_Q_GROUP, imp ? imp + g * PI2_Q_GROUP : NULL, &scales[g],
                                 payload + g * PI2_Q4_GROUP_BYTES);
    return 0;
}

void pi2_q_dequantize_row(pi2_qtype t, const uint16_t *scales, const uint8_t *payload, int64_t cols,
                          float *out)
{
    int64_t ng = cols / PI2_Q_GROUP;
    switch (t) {
    case PI2_QT_F32:
        memcpy(out, payload, (size_t)cols * sizeof(float));
        break;
    case PI2_QT_Q8:
        for (int64_t g = 0; g < ng; g++) {
            float d = pi2_f16_to_f32(scales[g]);
            const uint8_t *p = payload + g * PI2_Q8_GROUP_BYTES;
            float *o = out + g * PI2_Q_GROUP;
            for (int j = 0; j < PI2_Q_GROUP; j++)
                o[j] = (float)(int8_t)p[j] * d;
        }
        break;
    case PI2_QT_Q4:
        for (int64_t g = 0; g < ng; g++) {
            float d = pi2_f16_to_f32(scales[g]);
            const uint8_t *p = payload + g * PI2_Q4_GROUP_BYTES;
            float *o = out + g * PI2_Q_GROUP;
            for (int j = 0; j < PI2_Q4_GROUP_BYTES; j++) {
                o[j] = (float)((p[j] & 0x0f) - 8) * d;
                o[j + 16] = (float)((p[j] >> 4) - 8) * d;
            }
        }
        break;
    }
}

void pi2_q_axpy_row(pi2_qtype t, float a, const uint16_t *scales, const uint8_t *payload, int64_t cols,
                    float *out)
{
    int64_t ng = cols / PI2_Q_GROUP;
    switch (t) {
    case PI2_QT_F32:
        for (int64_t j = 0; j < cols; j++) {
            float w;
            memcpy(&w, payload + j * (int64_t)sizeof(float), sizeof w);
            out[j] += a * w;
        }
        break;
    case PI2_QT_Q8:
        for (int64_t g = 0; g < ng; g++) {
            float d = pi2_f16_to_f32(scales[g]);
            const uint8_t *p = payload + g * PI2_Q8_GROUP_BYTES;
            float *o = out + g * PI2_Q_GROUP;
            for (int j = 0; j < PI2_Q_GROUP; j++)
                o[j] += a * ((float)(int8_t)p[j] * d);
        }
        break;
    case PI2_QT_Q4:
        for (int64_t g = 0; g < ng; g++) {
            float d = pi2_f16_to_f32(scales[g]);
            const uint8_t *p = payload + g * PI2_Q4_GROUP_BYTES;
            float *o = out + g * PI2_Q_GROUP;
            for (int j = 0; j < PI2_Q4_GROUP_BYTES; j++) {
                o[j] += a * ((float)((p[j] & 0x0f) - 8) * d);
                o[j + 16] += a * ((float)((p[j] >> 4) - 8) * d);
            }
        }
        break;
    }
}

/* ---- activations ---- */

void pi2_q8act_quantize(const float *x, int64_t n, float *scales, int8_t *q)
{
    for (int64_t b = 0; b < n / PI2_Q_GROUP; b++) {
        const float *xb = x + b * PI2_Q_GROUP;
        int8_t *qb = q + b * PI2_Q_GROUP;
        float amax = 0.0f;
        bool bad = false;
        for (int j = 0; j < PI2_Q_GROUP; j++) {
            float v = fabsf(xb[j]);
            if (!(v <= FLT_MAX))
                bad = true; /* NaN or inf */
            else if (v > amax)
                amax = v;
        }
        if (bad || amax < ACT_TINY) {
            scales[b] = bad ? NAN : 0.0f;
            memset(qb, 0, PI2_Q_GROUP);
            continue;
        }
        /* Multiply by 127/amax and round half to even, as a SIMD twin does
         * with one vmulps and a cvtps2dq. amax >= 2^-100 keeps both the
         * scale and its inverse normal and finite. */
        float id = 127.0f / amax;
        scales[b] = amax / 127.0f;
        for (int j = 0; j < PI2_Q_GROUP; j++) {
            float r = rintf(xb[j] * id);
            qb[j] = (int8_t)(r < -127.0f ? -127.0f : r > 127.0f ? 127.0f : r);
        }
    }
}

/* ---- dot products: scalar reference ---- */

float pi2_q_dot_q8act_scalar(pi2_qtype wt, const uint16_t *wscales, const uint8_t *wpayload,
                             const float *ascales, const int8_t *aq, int64_t n)
{
    assert(n % PI2_Q_GROUP == 0);
    int64_t nb = n / PI2_Q_GROUP;
    double acc = 0.0; /* the reference sums in double: closer to exact than any fast kernel */
    for (int64_t b = 0; b < nb; b++) {
        const int8_t *a = aq + b * PI2_Q_GROUP;
        if (wt == PI2_QT_F32) {
            const uint8_t *p = wpayload + b * PI2_Q_GROUP * (int64_t)sizeof(float);
            float s = 0.0f;
            for (int j = 0; j < PI2_Q_GROUP; j++) {
                float w;
                memcpy(&w, p + j * sizeof(float), sizeof w);
                s += w * (float)a[j];
            }
            acc += (double)(s * ascales[b]);
            continue;
        }
        int32_t s = 0;
        if (wt == PI2_QT_Q4) {
            const uint8_t *p = wpayload + b * PI2_Q4_GROUP_BYTES;
            for (int j = 0; j < PI2_Q4_GROUP_BYTES; j++)
                s += ((p[j] & 0x0f) - 8) * a[j] + ((p[j] >> 4) - 8) * a[j + 16];
        } else {
            const uint8_t *p = wpayload + b * PI2_Q8_GROUP_BYTES;
            for (int j = 0; j < PI2_Q_GROUP; j++)
                s += (int8_t)p[j] * a[j];
        }
        acc += (double)s * (double)(pi2_f16_to_f32(wscales[b]) * ascales[b]);
    }
    return (float)acc;
}
