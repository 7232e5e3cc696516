/* Machine probes for the benchmarks and the planner's hardware profile
 * (contract in kernels.h): int8 peak and read bandwidth. */
#include "runtime/kernels/internal.h"

#ifdef PI2_K_X86

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

#endif /* PI2_K_X86 */

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
    switch (pi2_ki_isa_pick(isa)) {
    case PI2_ISA_AVX512:
        return probe_avx512(seconds, &sink);
    case PI2_ISA_AVX2:
        return probe_avx2(seconds, &sink);
    default:
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
    bool avx2 = pi2_k_isa_supported(PI2_ISA_AVX2);
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
