/* The forward pass (forward.c): the engine's transformer, prefill batches
 * and sparse decode, over the FFN source chosen at open
 * (runtime/ffn_source.h). Not part of the public API. */
#ifndef PI2_FORWARD_H
#define PI2_FORWARD_H

#include "runtime/state.h"

/* Runs tokens[0..T) at positions pos .. pos + T - 1 (pos <= the cached
 * positions: the cache is rewound to pos), filling the KV cache, and puts
 * the last token's logits [vocab] into logits (NULL: none). decode: one
 * token through the sparse FFNs. PI2_ERANGE for a token id or a position
 * out of range; a failed FFN leaves the cache at pos. */
int eng_forward(pi2_engine *e, const int32_t *tokens, int T, int pos, bool decode, float *logits, pi2_err *err);
/* Whether decode prefetches the next unit of rows (matmuls) or chunk of
 * neurons (dense FFN) into L2 while it computes the current one, for an
 * L2 of l2_bytes per core (<= 0: unknown). The two must fit beside each
 * other: kept where the L2 is unknown or 1 MiB and up; on a 512 KiB L2,
 * where a dense chunk alone takes 384 KiB, decode was faster without it
 * (figures: runtime/PERF.md). */
bool eng_l2_ahead(long l2_bytes);
#define ENG_AHEAD_MIN_L2 (1L << 20)

#endif
