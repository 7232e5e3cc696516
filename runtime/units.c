/* pi2 engine: work shared out with locality (contract: runtime/units.h).
 *
 * Units [0, n) are cut into one contiguous range per thread (rng[t]: first
 * << 32 | end). A thread takes units from the front of its own range
 * (ascending: the hardware prefetcher runs on from one unit into the next)
 * and, once it is empty, from the back of the others'. On 2 cores the
 * offloading I/O thread and interrupts take time from one compute thread
 * at a time; with fixed halves the other waited for it at every step. */
#include "runtime/units.h"
#include "runtime/state.h"

#include <stdatomic.h>

static void share_init(_Atomic uint64_t *rng, int nt, int64_t n)
{
    for (int t = 0; t < nt; t++)
        atomic_store_explicit(&rng[t], (uint64_t)(n * t / nt) << 32 | (uint64_t)(n * (t + 1) / nt),
                              memory_order_relaxed);
}

/* A unit of range r: from its front (the owner) or its back (another
 * thread). -1 when the range is empty. */
static int64_t share_take(_Atomic uint64_t *r, bool front)
{
    uint64_t v = atomic_load_explicit(r, memory_order_relaxed);
    for (;;) {
        uint64_t f = v >> 32, b = v & 0xffffffffu;
        if (f >= b)
            return -1;
        uint64_t nv = front ? (f + 1) << 32 | b : f << 32 | (b - 1);
        if (atomic_compare_exchange_weak_explicit(r, &v, nv, memory_order_relaxed, memory_order_relaxed))
            return front ? (int64_t)f : (int64_t)(b - 1);
    }
}

/* The next unit for thread tid: its own first, then the others' last. */
int64_t eng_share_next(const pi2_engine *e, int tid, int nt)
{
    _Atomic uint64_t *rng = e->share_rng;
    int64_t u = share_take(&rng[tid], true);
    for (int k = 1; k < nt && u < 0; k++)
        u = share_take(&rng[(tid + k) % nt], false);
    return u;
}

void eng_run_units(pi2_engine *e, int64_t units, pi2_pool_fn fn, void *ctx)
{
    share_init(e->share_rng, e->threads, units);
    pi2_pool_run_shared(e->pool, fn, ctx);
}
