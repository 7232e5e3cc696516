/* Token sampling from logits: greedy, temperature, top-k, top-p, seeded.
 *
 * Greedy (temperature 0) picks the lowest index among equal maxima, as
 * torch.argmax does. Otherwise: logits / temperature -> keep the top_k most
 * likely (0 = all) -> keep the smallest prefix, by descending probability,
 * whose mass reaches top_p (1 = all) -> draw from the renormalised rest with
 * the sampler's own PRNG (deterministic for a seed).
 */
#ifndef PI2_SAMPLE_H
#define PI2_SAMPLE_H

#include "formats/common.h"

typedef struct pi2_sample_opts {
    float temperature; /* 0 = greedy */
    int top_k;         /* 0 = no limit */
    float top_p;       /* in (0, 1]; 1 = no limit */
    uint64_t seed;
} pi2_sample_opts;

typedef struct pi2_sampler pi2_sampler;

/* Validate options (temperature >= 0 and finite, top_k >= 0, 0 < top_p <= 1)
 * and allocate scratch for `vocab` entries. Caller owns *out. */
int pi2_sampler_create(pi2_sampler **out, int vocab, const pi2_sample_opts *o, pi2_err *err);
/* NULL is a no-op. */
void pi2_sampler_free(pi2_sampler *s);
/* Pick the next token from `vocab` logits. NaN logits are never picked
 * unless all are NaN (then 0). */
int pi2_sampler_next(pi2_sampler *s, const float *logits);
/* Index of the largest logit (lowest index on ties). */
int pi2_argmax(const float *x, int n);
/* A padded vocabulary: the rows of the embedding and head past the
 * tokenizer's last id (TurboSparse-Mistral: 32002 of 32064) are never valid
 * output. Sets logits[i] = -inf for n_valid <= i < vocab; no-op when
 * n_valid <= 0 (not known) or n_valid >= vocab. */
void pi2_logits_mask_padding(float *logits, int vocab, int n_valid);

#endif
