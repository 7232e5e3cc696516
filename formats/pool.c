/* Thread pool: a generation counter announces a job, a countdown reports
 * its end; workers spin on the counter for a short while, then sleep.
 * Each worker claims the job it runs (claim[tid] = its generation, by
 * compare-and-swap); for a shared job the caller, once its own call has
 * returned, claims the job for every worker that has not, and those
 * workers skip it. Exactly one of the two swaps succeeds. */
#include "formats/pool.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>


struct pi2_pool {
    int n;
    pthread_t *threads;
    int started; /* workers running */
    pthread_mutex_t mu;
    pthread_cond_t wake;
    atomic_uint gen;     /* bumped for each job (and to stop) */
    atomic_int pending;  /* workers still in the current job */
    atomic_int sleepers; /* workers waiting on `wake` */
    atomic_bool stop;
    _Atomic unsigned *claim; /* [n], cache lines apart: the last job each worker took or was skipped for */
    pi2_pool_fn fn;
    void *ctx;
};

enum { CLAIM_STRIDE = 64 / sizeof(unsigned) };

/* Take job g for worker tid (true), or find it, or a later one, taken
 * for it (false). Claims only move forward: a worker that read a job's
 * generation and then lost its CPU until the caller had skipped it and
 * moved on must not take that old job (it would run the current job's
 * function once too often). */
static bool claim_job(pi2_pool *p, int tid, unsigned g)
{
    _Atomic unsigned *c = &p->claim[tid * CLAIM_STRIDE];
    unsigned v = atomic_load_explicit(c, memory_order_acquire);
    return (int)(v - g) < 0 &&
           atomic_compare_exchange_strong_explicit(c, &v, g, memory_order_acq_rel, memory_order_acquire);
}

typedef struct worker_arg {
    pi2_pool *p;
    int tid;
} worker_arg;

static unsigned wait_gen(pi2_pool *p, unsigned seen)
{
    unsigned g;
    for (long i = 0; i < PI2_SPIN_ROUNDS;) {
        if ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) != seen)
            return g;
        pi2_pool_spin(&i);
    }
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->sleepers, 1);
    while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen)
        pthread_cond_wait(&p->wake, &p->mu);
    atomic_fetch_sub(&p->sleepers, 1);
    pthread_mutex_unlock(&p->mu);
    return g;
}

static void *worker(void *arg)
{
    worker_arg wa = *(worker_arg *)arg;
    free(arg);
    pi2_pool *p = wa.p;
    unsigned seen = 0;
    for (;;) {
        seen = wait_gen(p, seen);
        if (atomic_load_explicit(&p->stop, memory_order_acquire))
            return NULL;
        if (!claim_job(p, wa.tid, seen)) /* skipped: the caller finished the shared job */
            continue;
        p->fn(p->ctx, wa.tid, p->n);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel);
    }
}

/* Bump the generation and wake the sleepers; returns the new generation. */
static unsigned announce(pi2_pool *p)
{
    unsigned g = atomic_fetch_add_explicit(&p->gen, 1, memory_order_acq_rel) + 1;
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mu);
    }
    return g;
}

int pi2_pool_create(pi2_pool **out, int n, pi2_err *err)
{
    *out = NULL;
    if (n < 1 || n > 256)
        return pi2_err_set(err, PI2_ERANGE, "threads: %d is out of range (1..256)", n);
    pi2_pool *p = calloc(1, sizeof *p);
    if (!p || !(p->threads = calloc((size_t)n, sizeof *p->threads)) ||
        !(p->claim = aligned_alloc(64, (size_t)n * CLAIM_STRIDE * sizeof *p->claim))) {
        if (p)
            free(p->threads);
        free(p);
        return pi2_err_set(err, PI2_ENOMEM, "threads: out of memory");
    }
    p->n = n;
    for (int i = 0; i < n * CLAIM_STRIDE; i++)
        atomic_init(&p->claim[i], 0u);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    for (int i = 1; i < n; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        int rc = ENOMEM;
        if (wa) {
            wa->p = p;
            wa->tid = i;
            rc = pthread_create(&p->threads[i], NULL, worker, wa);
        }
        if (rc != 0) {
            free(wa);
            pi2_pool_free(p);
            return pi2_err_set(err, rc == ENOMEM || rc == EAGAIN ? PI2_ENOMEM : PI2_EIO,
                               "threads: cannot start thread %d: %s", i, strerror(rc));
        }
        p->started++;
    }
    *out = p;
    return 0;
}

void pi2_pool_free(pi2_pool *p)
{
    if (!p)
        return;
    atomic_store(&p->stop, true);
    (void)announce(p);
    for (int i = 1; i <= p->started; i++)
        pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->mu);
    free(p->threads);
    free((void *)p->claim);
    free(p);
}

int pi2_pool_size(const pi2_pool *p) { return p->n; }

static void run(pi2_pool *p, pi2_pool_fn fn, void *ctx, bool shared)
{
    if (p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_release);
    unsigned g = announce(p);
    fn(ctx, 0, p->n);
    if (shared) /* the work is all taken: skip the workers that have not started */
        for (int t = 1; t < p->n; t++)
            if (claim_job(p, t, g))
                atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel);
    /* Spin while the workers finish, then yield (pi2_pool_spin) so a
     * preempted worker (a busy or oversubscribed machine) can run. */
    for (long i = 0; atomic_load_explicit(&p->pending, memory_order_acquire) > 0;)
        pi2_pool_spin(&i);
}

void pi2_pool_run(pi2_pool *p, pi2_pool_fn fn, void *ctx) { run(p, fn, ctx, false); }

void pi2_pool_run_shared(pi2_pool *p, pi2_pool_fn fn, void *ctx) { run(p, fn, ctx, true); }

bool pi2_cpus_split(int n, pi2_cpus *out)
{
    memset(out, 0, sizeof *out);
    if (n < 1 || sched_getaffinity(0, sizeof out->all, &out->all) != 0 || CPU_COUNT(&out->all) <= n)
        return false;
    for (int c = 0, k = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &out->all))
            CPU_SET(c, k++ < n ? &out->pool : &out->io);
    return true;
}

bool pi2_thread_pin(pthread_t thread, const cpu_set_t *cpus)
{
    return pthread_setaffinity_np(thread, sizeof *cpus, cpus) == 0;
}

int pi2_thread_raise_priority(int levels)
{
    id_t tid = (id_t)syscall(SYS_gettid);
    errno = 0;
    int cur = getpriority(PRIO_PROCESS, tid);
    if (levels <= 0 || (cur == -1 && errno != 0))
        return 0;
    for (int n = cur - levels < -20 ? -20 : cur - levels; n < cur; n++)
        if (setpriority(PRIO_PROCESS, tid, n) == 0)
            return cur - n;
    return 0;
}

bool pi2_pool_pin(pi2_pool *p, const cpu_set_t *cpus)
{
    bool ok = pi2_thread_pin(pthread_self(), cpus);
    for (int i = 1; i <= p->started; i++)
        ok = pi2_thread_pin(p->threads[i], cpus) && ok;
    return ok;
}

void pi2_pool_split(int64_t n, int64_t grain, int tid, int nt, int64_t *begin, int64_t *end)
{
    if (grain < 1)
        grain = 1;
    int64_t units = (n + grain - 1) / grain;
    int64_t b = units * tid / nt * grain, e = units * (tid + 1) / nt * grain;
    *begin = b < n ? b : n;
    *end = e < n ? e : n;
}
