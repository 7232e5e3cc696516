/* pi2 compute thread pool: n threads (the caller is thread 0) that run one
 * function at a time over static partitions.
 *
 * pi2_pool_run(p, fn, ctx) calls fn(ctx, tid, n) once on every thread
 * tid in [0, n) and returns when all calls have returned; work is split by
 * the callee, typically with pi2_pool_split. Workers spin briefly between
 * jobs (decode issues a few hundred small jobs per token) and then sleep
 * on a condition variable, so an idle pool costs no CPU.
 *
 * Not reentrant: fn must not call pi2_pool_run on the same pool, and one
 * thread at a time drives a pool.
 */
#ifndef PI2_POOL_H
#define PI2_POOL_H

#include "formats/common.h"

#include <pthread.h>
#include <sched.h>

typedef struct pi2_pool pi2_pool;
typedef void (*pi2_pool_fn)(void *ctx, int tid, int nthreads);

/* A pool of n threads (1..256; 1 runs everything on the caller).
 * PI2_ERANGE for a bad n, PI2_ENOMEM / PI2_EIO when threads cannot be
 * started. Caller frees *out with pi2_pool_free. */
int pi2_pool_create(pi2_pool **out, int n, pi2_err *err);
/* Stop and join the workers. NULL is a no-op. */
void pi2_pool_free(pi2_pool *p);
int pi2_pool_size(const pi2_pool *p);
/* Run fn on every thread and wait (see above). */
void pi2_pool_run(pi2_pool *p, pi2_pool_fn fn, void *ctx);
/* The same for a job whose work the calls share out dynamically, so that
 * any call returns only once no work is left to take: when the caller's
 * own call returns, a worker that has not started the job yet skips it,
 * and this returns as soon as the workers that did start have finished.
 * A worker the kernel has not scheduled (another task holds its CPU) then
 * costs nothing instead of the whole job's wait. fn may be called on any
 * subset of the threads that includes the caller: per-thread results must
 * be initialized by whoever calls this, not by fn. */
void pi2_pool_run_shared(pi2_pool *p, pi2_pool_fn fn, void *ctx);

/* CPU placement for a pool and one I/O thread (Linux affinity masks).
 * When the calling thread's allowed CPUs outnumber the pool's threads,
 * pi2_cpus_split gives the pool the first n of them and the I/O thread
 * the rest, and returns true; otherwise (or when the mask cannot be read)
 * false and nothing to do. Left to the scheduler, the I/O thread woke on
 * whichever CPU took the disk's interrupt and time-shared a compute
 * thread's core while the other core idled (runtime/PERF.md, "Threads"). */
typedef struct pi2_cpus {
    cpu_set_t all, pool, io;
} pi2_cpus;
bool pi2_cpus_split(int n, pi2_cpus *out);
/* Pin every pool thread, the caller (thread 0) included, to `cpus`; false
 * if any could not be pinned. */
bool pi2_pool_pin(pi2_pool *p, const cpu_set_t *cpus);
/* Pin one thread, or restore the caller's mask (cpus: &pi2_cpus.all). */
bool pi2_thread_pin(pthread_t thread, const cpu_set_t *cpus);
/* Raise the calling thread's priority by up to `levels` nice levels, as
 * far as the process may (root, CAP_SYS_NICE or RLIMIT_NICE; otherwise not
 * at all); returns the levels gained. For an I/O thread sharing CPUs with
 * compute threads: at equal priority it reaped and resubmitted late. */
int pi2_thread_raise_priority(int levels);
#define PI2_IO_THREAD_NICE 10 /* the levels the offloading reader (and the profile's) asks for */

/* One round of a wait for another pool thread inside a job: a pause for
 * the first PI2_SPIN_ROUNDS rounds (*round counts them), then the CPU
 * yielded, so that a thread the scheduler took away (a busy machine) can
 * run and finish what is waited for. */
enum { PI2_SPIN_ROUNDS = 1 << 14 };
static inline void pi2_pool_spin(long *round)
{
    if ((*round)++ < PI2_SPIN_ROUNDS) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    } else {
        sched_yield();
    }
}

/* Static partition of [0, n) into nt nearly equal parts whose boundaries
 * are multiples of `grain` (>= 1) except the last: part tid is
 * [*begin, *end), possibly empty. */
void pi2_pool_split(int64_t n, int64_t grain, int tid, int nt, int64_t *begin, int64_t *end);

#endif
