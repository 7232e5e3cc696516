/* Work shared out with locality: how every decode job of the engine (the
 * matmuls, attention, the predictor, both FFN sources' chunks and their
 * reduce) spreads its units over the compute pool. Shared by the forward
 * and the FFN sources, so that neither calls into the other. Not part of
 * the public API.
 *
 * eng_run_units runs fn as a shared job (pi2_pool_run_shared) over units
 * [0, units), cut into one contiguous range per thread; inside fn,
 * eng_share_next gives thread tid the front of its own range, then the
 * back of the others', and -1 when all are taken. One job at a time per
 * engine (the ranges live in e->share_rng). */
#ifndef PI2_UNITS_H
#define PI2_UNITS_H

#include "formats/pool.h"
#include "runtime/engine.h"

#include <stdint.h>

void eng_run_units(pi2_engine *e, int64_t units, pi2_pool_fn fn, void *ctx);
int64_t eng_share_next(const pi2_engine *e, int tid, int nt);

#endif
