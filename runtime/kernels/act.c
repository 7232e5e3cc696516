/* Activation quantization (pi2_k_act_quantize): pi2_q8act_quantize's
 * int8 blocks with their sums, on the scalar path and its AVX-512 and
 * AVX2 twins (the NEON one is in vec_neon.c), all bit-identical. Prefill
 * quantizes each layer's inputs on one thread between the parallel
 * matmuls, and decode every matmul's input on the calling thread between
 * the pool's jobs, where the other thread waits for it. */
#include "runtime/kernels/internal.h"

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

#ifdef PI2_K_X86

/* A block's scale from its largest magnitude amax, as pi2_q8act_quantize
 * takes it (bad: a NaN or inf in the block): false, the block zeroed with
 * scale NaN or 0, when there is nothing to quantize; else *id = 127 / amax. */
static inline bool act_block_scale(bool bad, float amax, float *scale, int8_t *qb, int32_t *sum, float *id)
{
    if (bad || amax < 0x1p-100f) {
        *scale = bad ? NAN : 0.0f;
        memset(qb, 0, QG);
        *sum = 0;
        return false;
    }
    *id = 127.0f / amax;
    *scale = amax / 127.0f;
    return true;
}

/* ---- activations on AVX-512 ----
 *
 * pi2_q8act_quantize's operations per block, 16 lanes at a time: the same
 * max, the same scalar 127 / amax and amax / 127, one multiply and a
 * round-to-nearest-even convert per value (rintf in the default rounding
 * mode), the same clamp; so bit-identical. Prefill quantizes every
 * layer's inputs on one thread between the parallel matmuls, so this
 * serial step has to be short. */
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
            float id;
            if (!act_block_scale(bad, amax, scales + i, qb, sums + i, &id))
                continue;
            __m512 iv = _mm512_set1_ps(id);
            __m512i r0 = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(x0, iv)), lo), hi);
            __m512i r1 = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(x1, iv)), lo), hi);
            _mm_storeu_si128((__m128i *)(void *)qb, _mm512_cvtepi32_epi8(r0));
            _mm_storeu_si128((__m128i *)(void *)(qb + 16), _mm512_cvtepi32_epi8(r1));
            sums[i] = _mm512_reduce_add_epi32(_mm512_add_epi32(r0, r1));
        }
}

/* ---- activations on AVX2 ----
 *
 * The AVX-512 twin's operations on 8 lanes: the same max (exact in any
 * order), the same scalar 127 / amax and amax / 127, one multiply and a
 * round-to-nearest-even convert per value, the same clamp; so
 * bit-identical. Decode quantizes every matmul's input on the calling
 * thread between the pool's jobs, where the other thread waits for it
 * (runtime/PERF.md). */
PI2_T_AVX2 static void act_quantize_avx2(const float *x, int64_t ldx, int T, int64_t n, float *scales, int8_t *q,
                                         int32_t *sums)
{
    int64_t nb = n / QG;
    const __m256 sign = _mm256_set1_ps(-0.0f), fmax = _mm256_set1_ps(FLT_MAX);
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
    const __m256i ord = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int t = 0; t < T; t++)
        for (int64_t b = 0; b < nb; b++) {
            const float *xb = x + (int64_t)t * ldx + b * QG;
            int8_t *qb = q + (int64_t)t * n + b * QG;
            int64_t i = (int64_t)t * nb + b;
            __m256 v[4], ok = _mm256_castsi256_ps(_mm256_set1_epi32(-1)), m = _mm256_setzero_ps();
            for (int k = 0; k < 4; k++) {
                v[k] = _mm256_loadu_ps(xb + 8 * k);
                __m256 a = _mm256_andnot_ps(sign, v[k]);
                ok = _mm256_and_ps(ok, _mm256_cmp_ps(a, fmax, _CMP_LE_OQ));
                m = _mm256_max_ps(m, a);
            }
            bool bad = _mm256_movemask_ps(ok) != 0xff; /* NaN or inf */
            __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            float amax = bad ? 0.0f : _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
            float id;
            if (!act_block_scale(bad, amax, scales + i, qb, sums + i, &id))
                continue;
            __m256 iv = _mm256_set1_ps(id);
            __m256i r[4];
            for (int k = 0; k < 4; k++)
                r[k] = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v[k], iv)), lo), hi);
            __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3]));
            _mm256_storeu_si256((__m256i *)(void *)qb, _mm256_permutevar8x32_epi32(p, ord));
            __m256i s8 = _mm256_add_epi32(_mm256_add_epi32(r[0], r[1]), _mm256_add_epi32(r[2], r[3]));
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 0, 3, 2)));
            sums[i] = _mm_cvtsi128_si32(_mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1))));
        }
}

#endif /* PI2_K_X86 */

void pi2_k_act_quantize_isa(pi2_isa isa, const float *x, int64_t ldx, int T, int64_t n, float *scales, int8_t *q,
                            int32_t *sums)
{
    assert(n % QG == 0 && T >= 0);
#ifdef PI2_K_ARM64
    if (pi2_ki_act_quantize_neon(isa, x, ldx, T, n, scales, q, sums))
        return;
#endif
#ifdef PI2_K_X86
    pi2_isa pick = pi2_ki_isa_pick(isa);
    if (pick == PI2_ISA_AVX512) {
        act_quantize_avx512(x, ldx, T, n, scales, q, sums);
        return;
    }
    if (pick == PI2_ISA_AVX2) {
        act_quantize_avx2(x, ldx, T, n, scales, q, sums);
        return;
    }
#elif !defined(PI2_K_ARM64)
    (void)isa;
#endif
    act_quantize_scalar(x, ldx, T, n, scales, q, sums);
}

void pi2_k_act_quantize(const float *x, int64_t ldx, int T, int64_t n, float *scales, int8_t *q, int32_t *sums)
{
    pi2_k_act_quantize_isa(pi2_k_get_isa(), x, ldx, T, n, scales, q, sums);
}
