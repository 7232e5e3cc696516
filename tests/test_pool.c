/* runtime/pool: every thread runs each job exactly once, jobs do not
 * overlap, static partitions cover a range exactly once, shared jobs
 * finish every unit before returning and go on without a worker that
 * cannot run, and the pool survives many short jobs, idle sleeps and bad
 * sizes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "formats/pool.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <time.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

typedef struct job {
    atomic_int calls;
    atomic_int seen[8];
    int nthreads;
    int64_t n, grain;
    unsigned char *covered; /* [n] */
} job;

static void count_fn(void *ctx, int tid, int nt)
{
    job *j = ctx;
    if (tid == 0)
        j->nthreads = nt;
    atomic_fetch_add(&j->calls, 1);
    atomic_fetch_add(&j->seen[tid], 1);
}

static void cover_fn(void *ctx, int tid, int nt)
{
    job *j = ctx;
    int64_t b, e;
    pi2_pool_split(j->n, j->grain, tid, nt, &b, &e);
    assert_true(b <= e);
    if (e < j->n)
        assert_int_equal(e % j->grain, 0);
    for (int64_t i = b; i < e; i++)
        j->covered[i]++; /* disjoint ranges: no two threads write one byte */
}

static void test_each_thread_once(void **state)
{
    (void)state;
    for (int n = 1; n <= 4; n++) {
        pi2_pool *p = NULL;
        pi2_err e = {0};
        assert_int_equal(pi2_pool_create(&p, n, &e), 0);
        assert_int_equal(pi2_pool_size(p), n);
        for (int it = 0; it < 2000; it++) {
            job j;
            memset(&j, 0, sizeof j);
            pi2_pool_run(p, count_fn, &j);
            assert_int_equal(atomic_load(&j.calls), n); /* all returned before run did */
            for (int t = 0; t < n; t++)
                assert_int_equal(atomic_load(&j.seen[t]), 1);
            assert_int_equal(j.nthreads, n);
        }
        pi2_pool_free(p);
    }
}

static void test_partitions(void **state)
{
    (void)state;
    pi2_pool *p = NULL;
    pi2_err e = {0};
    assert_int_equal(pi2_pool_create(&p, 3, &e), 0);
    static const int64_t ns[] = {0, 1, 2, 15, 16, 17, 100, 1000, 4097};
    static const int64_t grains[] = {1, 4, 16, 64};
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (size_t g = 0; g < sizeof grains / sizeof grains[0]; g++) {
            job j;
            memset(&j, 0, sizeof j);
            j.n = ns[a];
            j.grain = grains[g];
            j.covered = calloc((size_t)j.n + 1, 1);
            pi2_pool_run(p, cover_fn, &j);
            for (int64_t i = 0; i < j.n; i++)
                assert_int_equal(j.covered[i], 1);
            free(j.covered);
        }
    /* more threads than units: one part holds the unit, the others are empty */
    int64_t b, en;
    pi2_pool_split(3, 16, 0, 3, &b, &en);
    assert_true(b == en);
    pi2_pool_split(3, 16, 2, 3, &b, &en);
    assert_true(b == 0 && en == 3);
    pi2_pool_free(p);
}

/* Jobs after the workers went to sleep (idle longer than the spin) still
 * run on every thread. */
static void test_after_idle(void **state)
{
    (void)state;
    pi2_pool *p = NULL;
    pi2_err e = {0};
    assert_int_equal(pi2_pool_create(&p, 2, &e), 0);
    for (int it = 0; it < 3; it++) {
        usleep(30000);
        job j;
        memset(&j, 0, sizeof j);
        pi2_pool_run(p, count_fn, &j);
        assert_int_equal(atomic_load(&j.calls), 2);
    }
    pi2_pool_free(p);
}

/* A shared job: units taken from one counter, each marked done only
 * after a short spin, so a worker is often still in its last unit when
 * the caller runs out. */
typedef struct shared_job {
    atomic_int next, calls, by[8];
    int n;
    atomic_int done[64];
} shared_job;

static void shared_fn(void *ctx, int tid, int nt)
{
    (void)nt;
    shared_job *j = ctx;
    atomic_fetch_add(&j->calls, 1);
    for (int u; (u = atomic_fetch_add(&j->next, 1)) < j->n;) {
        for (volatile int k = 0; k < 200 * (u % 5); k++)
            ;
        atomic_fetch_add(&j->done[u], 1);
        atomic_fetch_add(&j->by[tid], 1);
    }
}

static void run_shared_once(pi2_pool *p, int n, shared_job *j)
{
    memset(j, 0, sizeof *j);
    j->n = n;
    pi2_pool_run_shared(p, shared_fn, j);
    for (int u = 0; u < n; u++) /* every unit finished before the call returned */
        assert_int_equal(atomic_load(&j->done[u]), 1);
    assert_true(atomic_load(&j->calls) >= 1 && atomic_load(&j->calls) <= pi2_pool_size(p));
}

/* Shared jobs of 0..63 units, interleaved with plain ones: every unit runs
 * exactly once and is done when the call returns; plain jobs still run on
 * every thread after workers skipped shared ones. */
static void test_shared(void **state)
{
    (void)state;
    for (int n = 1; n <= 4; n++) {
        pi2_pool *p = NULL;
        pi2_err e = {0};
        assert_int_equal(pi2_pool_create(&p, n, &e), 0);
        for (int it = 0; it < 3000; it++) {
            shared_job j;
            run_shared_once(p, it % 64, &j);
            if (it % 7 == 0) {
                job c;
                memset(&c, 0, sizeof c);
                pi2_pool_run(p, count_fn, &c);
                for (int t = 0; t < n; t++)
                    assert_int_equal(atomic_load(&c.seen[t]), 1);
            }
        }
        pi2_pool_free(p);
    }
}

/* A worker that cannot run (held in a signal handler, as if another task
 * held its CPU) does not hold up shared jobs: the caller does every unit.
 * Released, it takes part again. */
static pthread_t g_worker;
static atomic_int g_held, g_release;

static void worker_fn(void *ctx, int tid, int nt)
{
    (void)ctx;
    (void)nt;
    if (tid == 1)
        g_worker = pthread_self();
}

static void hold_handler(int sig)
{
    (void)sig;
    atomic_store(&g_held, 1);
    struct timespec ms = {0, 1000000};
    while (!atomic_load(&g_release))
        nanosleep(&ms, NULL);
}

static void test_shared_stalled_worker(void **state)
{
    (void)state;
    pi2_pool *p = NULL;
    pi2_err e = {0};
    assert_int_equal(pi2_pool_create(&p, 2, &e), 0);
    pi2_pool_run(p, worker_fn, NULL);
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = hold_handler;
    sigemptyset(&sa.sa_mask);
    assert_int_equal(sigaction(SIGUSR1, &sa, &old), 0);
    atomic_store(&g_held, 0);
    atomic_store(&g_release, 0);
    assert_int_equal(pthread_kill(g_worker, SIGUSR1), 0);
    for (int i = 0; i < 2000 && !atomic_load(&g_held); i++)
        usleep(1000);
    if (atomic_load(&g_held)) {
        for (int it = 0; it < 200; it++) {
            shared_job j;
            run_shared_once(p, 1 + it % 63, &j);
            assert_int_equal(atomic_load(&j.calls), 1); /* the caller alone */
            assert_int_equal(atomic_load(&j.by[0]), j.n);
        }
    } else {
        print_message("the held worker never ran its signal handler here: the stall is not checked\n");
    }
    atomic_store(&g_release, 1);
    for (int it = 0; it < 50; it++) {
        job c;
        memset(&c, 0, sizeof c);
        pi2_pool_run(p, count_fn, &c);
        assert_int_equal(atomic_load(&c.seen[1]), 1);
        shared_job j;
        run_shared_once(p, 63, &j);
    }
    sigaction(SIGUSR1, &old, NULL);
    pi2_pool_free(p);
}

/* Each thread's CPU mask, taken inside a job. */
static cpu_set_t g_masks[8];
static void mask_fn(void *ctx, int tid, int nt)
{
    (void)ctx;
    (void)nt;
    sched_getaffinity(0, sizeof g_masks[tid], &g_masks[tid]);
}

/* pi2_cpus_split gives the pool the first n allowed CPUs and the I/O
 * thread the rest (nothing when no CPU is left over); pi2_pool_pin puts
 * every pool thread there, and pi2_thread_pin gives the caller its mask
 * back. */
static void test_cpus(void **state)
{
    (void)state;
    cpu_set_t all;
    assert_int_equal(sched_getaffinity(0, sizeof all, &all), 0);
    int ncpu = CPU_COUNT(&all);
    pi2_cpus c;
    assert_false(pi2_cpus_split(ncpu, &c));
    assert_false(pi2_cpus_split(ncpu + 3, &c));
    assert_false(pi2_cpus_split(0, &c));
    if (ncpu < 2) {
        fprintf(stderr, "  one CPU allowed here: no split to check\n");
        return;
    }
    int n = ncpu - 1 < 2 ? ncpu - 1 : 2;
    assert_true(pi2_cpus_split(n, &c));
    cpu_set_t both, uni;
    assert_int_equal(CPU_COUNT(&c.pool), n);
    assert_int_equal(CPU_COUNT(&c.io), ncpu - n);
    CPU_AND(&both, &c.pool, &c.io);
    assert_int_equal(CPU_COUNT(&both), 0);
    CPU_OR(&uni, &c.pool, &c.io);
    assert_true(CPU_EQUAL(&uni, &all));
    assert_true(CPU_EQUAL(&c.all, &all));

    pi2_pool *p = NULL;
    pi2_err e = {0};
    assert_int_equal(pi2_pool_create(&p, n, &e), 0);
    assert_true(pi2_pool_pin(p, &c.pool));
    pi2_pool_run(p, mask_fn, NULL);
    for (int t = 0; t < n; t++)
        assert_true(CPU_EQUAL(&g_masks[t], &c.pool));
    assert_true(pi2_thread_pin(pthread_self(), &c.all));
    cpu_set_t back;
    assert_int_equal(sched_getaffinity(0, sizeof back, &back), 0);
    assert_true(CPU_EQUAL(&back, &all));
    pi2_pool_free(p);
}

/* In a thread of its own: the levels gained are exactly the change in the
 * thread's nice value, never more than asked, and asking for none changes
 * nothing. */
static void *raise_main(void *arg)
{
    int *r = arg;
    int before = getpriority(PRIO_PROCESS, 0);
    r[0] = pi2_thread_raise_priority(0);
    r[1] = getpriority(PRIO_PROCESS, 0) - before;
    r[2] = pi2_thread_raise_priority(3);
    r[3] = before - getpriority(PRIO_PROCESS, 0);
    return NULL;
}

static void test_raise_priority(void **state)
{
    (void)state;
    int r[4] = {-1, -1, -1, -1}, proc = getpriority(PRIO_PROCESS, 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, raise_main, r), 0);
    pthread_join(th, NULL);
    assert_int_equal(r[0], 0);
    assert_int_equal(r[1], 0);
    assert_true(r[2] >= 0 && r[2] <= 3);
    assert_int_equal(r[2], r[3]);
    assert_int_equal(getpriority(PRIO_PROCESS, 0), proc); /* the caller's own is untouched */
    if (r[2] == 0)
        print_message("raising a thread's priority is not permitted here: only the no-op checked\n");
}

static void test_bad_sizes(void **state)
{
    (void)state;
    pi2_pool *p = (pi2_pool *)&p;
    pi2_err e = {0};
    assert_int_equal(pi2_pool_create(&p, 0, &e), PI2_ERANGE);
    assert_null(p);
    pi2_err e2 = {0};
    assert_int_equal(pi2_pool_create(&p, 257, &e2), PI2_ERANGE);
    assert_non_null(strstr(e2.msg, "threads"));
    pi2_pool_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_thread_once),
        cmocka_unit_test(test_partitions),
        cmocka_unit_test(test_after_idle),
        cmocka_unit_test(test_shared),
        cmocka_unit_test(test_shared_stalled_worker),
        cmocka_unit_test(test_bad_sizes),
        cmocka_unit_test(test_cpus),
        cmocka_unit_test(test_raise_priority),
    };
    return cmocka_run_group_tests_name("pool", tests, NULL, NULL);
}
