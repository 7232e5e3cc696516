/* runtime/io: direct reads through io_uring and the pread fallback, with
 * injected faults (errors, short reads, io_uring setup failure) and a file
 * truncated or replaced under an open reader. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "runtime/offload/io.h"
#include "tests/testutil.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define FILE_BYTES (1u << 20)

static char g_dir[64], g_path[128];

static uint8_t pattern(uint64_t i) { return (uint8_t)((i * 2654435761u) >> 13); }

static void write_pattern(const char *path, size_t n)
{
    uint8_t *b = malloc(n);
    for (size_t i = 0; i < n; i++)
        b[i] = pattern(i);
    pi2t_write(path, b, n);
    free(b);
}

static int setup(void **state)
{
    (void)state;
    pi2t_tmpdir(g_dir, sizeof g_dir);
    snprintf(g_path, sizeof g_path, "%s/data.bin", g_dir);
    write_pattern(g_path, FILE_BYTES);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    pi2_io_inject(PI2_IO_FAULT_NONE, 0, 0, 0);
    pi2t_rmtree(g_dir);
    return 0;
}

static int clear_faults(void **state)
{
    (void)state;
    pi2_io_inject(PI2_IO_FAULT_NONE, 0, 0, 0);
    write_pattern(g_path, FILE_BYTES);
    return 0;
}

static pi2_io *open_io(pi2_io_backend b)
{
    pi2_io_opts o;
    pi2_io_defaults(&o);
    o.backend = b;
    o.depth = 16;
    o.threads = 3;
    pi2_io *io = NULL;
    pi2_err e = {0};
    if (pi2_io_open(&io, g_path, &o, &e))
        fail_msg("open: %s", e.msg);
    return io;
}

/* 40 random aligned reads, at most 16 in flight; every byte checked.
 * Read i lands in arena + i * 64 KiB when arena is given, else in a buffer
 * of its own. Returns the number of failed requests; the first error goes
 * to err. */
static int random_reads(pi2_io *io, uint64_t seed, uint8_t *arena, pi2_err *err)
{
    pi2_rng r;
    pi2_rng_seed(&r, seed);
    enum { N = 40 };
    pi2_io_req req[N];
    for (int i = 0; i < N; i++) {
        uint32_t len = (uint32_t)(1 + pi2_rng_u64(&r) % 16) * PI2_IO_ALIGN;
        uint64_t off = pi2_rng_u64(&r) % ((FILE_BYTES - len) / PI2_IO_ALIGN + 1) * PI2_IO_ALIGN;
        req[i] = (pi2_io_req){.off = off, .len = len, .buf = arena ? arena + (size_t)i * 65536 : pi2_io_alloc_buf(len),
                              .user = &req[i]};
        if (arena)
            memset(req[i].buf, 0, len);
        assert_non_null(req[i].buf);
    }
    int next = 0, reaped = 0, failed = 0;
    while (reaped < N) {
        while (next < N && pi2_io_inflight(io) < 16) {
            pi2_io_req *p = &req[next++];
            assert_int_equal(pi2_io_submit(io, &p, 1, err), 0);
        }
        pi2_io_req *done[16];
        int got = pi2_io_wait(io, 1, done, 16, err);
        assert_true(got >= 1);
        for (int k = 0; k < got; k++) {
            pi2_io_req *q = done[k];
            assert_ptr_equal(q->user, q);
            if (q->result < 0) {
                failed++;
                continue;
            }
            assert_int_equal(q->result, (int)q->len);
            const uint8_t *b = q->buf;
            for (uint32_t j = 0; j < q->len; j++)
                if (b[j] != pattern(q->off + j))
                    fail_msg("byte %llu differs", (unsigned long long)(q->off + j));
        }
        reaped += got;
    }
    assert_int_equal(pi2_io_inflight(io), 0);
    for (int i = 0; i < N && !arena; i++)
        pi2_io_free_buf(req[i].buf);
    return failed;
}

static void test_reads(void **state)
{
    (void)state;
    for (int b = PI2_IO_URING; b <= PI2_IO_PREAD; b++) {
        pi2_io *io = open_io((pi2_io_backend)b);
        assert_int_equal(pi2_io_backend_used(io), b);
        pi2_err e = {0};
        assert_int_equal(random_reads(io, 7 + (uint64_t)b, NULL, &e), 0);
        assert_int_equal(e.code, 0);
        /* the synchronous helper */
        uint8_t *buf = pi2_io_alloc_buf(8192);
        assert_int_equal(pi2_io_read(io, buf, 4096 * 9, 8192, &e), 0);
        for (int j = 0; j < 8192; j++)
            assert_int_equal(buf[j], pattern(4096 * 9 + (uint64_t)j));
        pi2_io_free_buf(buf);
        assert_int_equal(pi2_io_check(io, &e), 0);
        pi2_io_close(io);
    }
}

static void test_short_reads(void **state)
{
    (void)state;
    for (int b = PI2_IO_URING; b <= PI2_IO_PREAD; b++) {
        pi2_io *io = open_io((pi2_io_backend)b);
        pi2_io_inject(PI2_IO_FAULT_SHORT, 0, 3, 25);
        pi2_err e = {0};
        assert_int_equal(random_reads(io, 9, NULL, &e), 0); /* retried: every byte still right */
        pi2_io_inject(PI2_IO_FAULT_NONE, 0, 0, 0);
        pi2_io_close(io);
    }
}

/* Registered buffers: reads inside them go as fixed-buffer reads, reads
 * straddling their end or outside them as plain ones, every byte right,
 * short reads retried; nothing registers on the pread backend or with
 * reads in flight, and a second registration replaces the first. */
static void test_fixed_buffers(void **state)
{
    (void)state;
    size_t len = 40 * 65536;
    uint8_t *arena = pi2_io_alloc_buf(len), *other = pi2_io_alloc_buf(8192);
    assert_non_null(arena);
    pi2_io *io = open_io(PI2_IO_PREAD);
    void *bufs[2] = {arena, other};
    size_t lens[2] = {len / 2, 8192}; /* reads 20 .. 39 are not inside a registered buffer */
    assert_false(pi2_io_register(io, bufs, lens, 2));
    pi2_io_close(io);
    io = open_io(PI2_IO_URING);
    assert_false(pi2_io_register(io, bufs, lens, 0));
    assert_false(pi2_io_register(io, bufs, lens, PI2_IO_MAX_FIXED + 1));
    if (!pi2_io_register(io, bufs, lens, 2)) {
        pi2_io_close(io);
        pi2_io_free_buf(arena);
        pi2_io_free_buf(other);
        skip(); /* the locked-memory limit: the reads are the plain ones tested above */
    }
    pi2_err e = {0};
    assert_int_equal(random_reads(io, 21, arena, &e), 0);
    pi2_io_inject(PI2_IO_FAULT_SHORT, 0, 2, 30);
    assert_int_equal(random_reads(io, 23, arena, &e), 0);
    pi2_io_inject(PI2_IO_FAULT_NONE, 0, 0, 0);
    assert_int_equal(pi2_io_read(io, other, 4096 * 5, 8192, &e), 0);
    for (int j = 0; j < 8192; j++)
        assert_int_equal(other[j], pattern(4096 * 5 + (uint64_t)j));
    /* in flight: no registration */
    pi2_io_req r = {.off = 0, .len = 4096, .buf = arena}, *rp = &r, *d[1];
    assert_int_equal(pi2_io_submit(io, &rp, 1, &e), 0);
    assert_false(pi2_io_register(io, bufs, lens, 1));
    assert_int_equal(pi2_io_wait(io, 1, d, 1, &e), 1);
    assert_int_equal(r.result, 4096);
    lens[0] = len; /* now the whole arena */
    assert_true(pi2_io_register(io, bufs, lens, 1));
    assert_int_equal(random_reads(io, 25, arena, &e), 0);
    pi2_io_close(io);
    pi2_io_free_buf(arena);
    pi2_io_free_buf(other);
}

static void test_eio(void **state)
{
    (void)state;
    for (int b = PI2_IO_URING; b <= PI2_IO_PREAD; b++) {
        pi2_io *io = open_io((pi2_io_backend)b);
        pi2_io_inject(PI2_IO_FAULT_ERRNO, EIO, 5, 2);
        pi2_err e = {0};
        assert_int_equal(random_reads(io, 11, NULL, &e), 2);
        assert_int_equal(e.code, PI2_EIO);
        assert_non_null(strstr(e.msg, g_path));
        assert_non_null(strstr(e.msg, "offset"));
        assert_non_null(strstr(e.msg, strerror(EIO)));
        pi2_io_inject(PI2_IO_FAULT_NONE, 0, 0, 0);
        pi2_io_close(io);
    }
}

static void test_no_uring(void **state)
{
    (void)state;
    pi2_io_inject(PI2_IO_FAULT_NO_URING, 0, 0, 1);
    pi2_io *io = open_io(PI2_IO_AUTO);
    assert_int_equal(pi2_io_backend_used(io), PI2_IO_PREAD);
    assert_non_null(strstr(pi2_io_backend_note(io), "io_uring unavailable"));
    pi2_err e = {0};
    assert_int_equal(random_reads(io, 13, NULL, &e), 0);
    pi2_io_close(io);
    pi2_io_opts o;
    pi2_io_defaults(&o);
    o.backend = PI2_IO_URING;
    assert_int_equal(pi2_io_open(&io, g_path, &o, &e), PI2_EIO);
    assert_null(io);
    assert_non_null(strstr(e.msg, "io_uring"));
    pi2_io_inject(PI2_IO_FAULT_NONE, 0, 0, 0);
}

static void test_truncated_and_replaced(void **state)
{
    (void)state;
    for (int b = PI2_IO_URING; b <= PI2_IO_PREAD; b++) {
        pi2_io *io = open_io((pi2_io_backend)b);
        assert_int_equal(truncate(g_path, FILE_BYTES / 2), 0);
        uint8_t *buf = pi2_io_alloc_buf(8192);
        pi2_err e = {0};
        assert_int_equal(pi2_io_read(io, buf, FILE_BYTES - 8192, 8192, &e), PI2_EIO);
        assert_non_null(strstr(e.msg, "truncated"));
        pi2_err e2 = {0};
        assert_int_equal(pi2_io_check(io, &e2), PI2_EIO);
        assert_non_null(strstr(e2.msg, "size"));
        /* replaced by another file of the original size */
        char other[160];
        snprintf(other, sizeof other, "%s/other.bin", g_dir);
        write_pattern(other, FILE_BYTES);
        assert_int_equal(rename(other, g_path), 0);
        pi2_err e3 = {0};
        assert_int_equal(pi2_io_check(io, &e3), PI2_EIO);
        assert_non_null(strstr(e3.msg, "replaced"));
        pi2_io_free_buf(buf);
        pi2_io_close(io);
    }
}

/* A timed wait returns 0 when nothing is in flight to complete in time,
 * and the completions once they are there. */
static void test_wait_timeout(void **state)
{
    (void)state;
    for (int b = PI2_IO_URING; b <= PI2_IO_PREAD; b++) {
        pi2_io *io = open_io((pi2_io_backend)b);
        pi2_err e = {0};
        pi2_io_req *done[4];
        assert_int_equal(pi2_io_wait_timeout(io, 1, done, 4, 1000, &e), 0);
        uint8_t *buf = pi2_io_alloc_buf(16384);
        pi2_io_req r = {.off = 8192, .len = 16384, .buf = buf}, *p = &r;
        assert_int_equal(pi2_io_submit(io, &p, 1, &e), 0);
        int got = 0;
        for (int tries = 0; got == 0 && tries < 100000; tries++)
            got = pi2_io_wait_timeout(io, 1, done, 4, 100, &e);
        assert_int_equal(got, 1);
        assert_ptr_equal(done[0], &r);
        assert_int_equal(r.result, 16384);
        assert_int_equal(buf[100], pattern(8192 + 100));
        assert_int_equal(pi2_io_inflight(io), 0);
        pi2_io_free_buf(buf);
        pi2_io_close(io);
    }
}

/* The storage probe: random and sequential passes count what they read. */
static void test_bench(void **state)
{
    (void)state;
    pi2_io *io = open_io(PI2_IO_AUTO);
    pi2_io_bench_result r;
    pi2_err e = {0};
    assert_int_equal(pi2_io_bench(io, 16384, 8, false, 0.05, &r, &e), 0);
    assert_true(r.reads > 0 && r.bytes == r.reads * 16384 && r.bytes_per_s > 0 && r.lat_us > 0 && r.cpu_us > 0);
    assert_int_equal(pi2_io_bench(io, 65536, 4, true, 10, &r, &e), 0);
    assert_int_equal(r.bytes, FILE_BYTES); /* one pass */
    assert_int_equal(pi2_io_inflight(io), 0);
    assert_int_equal(pi2_io_bench(io, 1000, 4, false, 0.01, &r, &e), PI2_EINVAL);
    pi2_err e2 = {0};
    assert_int_equal(pi2_io_bench(io, 4096, 17, false, 0.01, &r, &e2), PI2_EINVAL);
    pi2_io_inject(PI2_IO_FAULT_ERRNO, EIO, 3, 1);
    pi2_err e3 = {0};
    assert_int_equal(pi2_io_bench(io, 4096, 4, false, 0.05, &r, &e3), PI2_EIO);
    assert_int_equal(pi2_io_inflight(io), 0);
    pi2_io_close(io);
}

/* Buffers: aligned for O_DIRECT; from 4 MiB on on a huge page boundary
 * with their whole huge pages advised, smaller ones left alone. */
static void test_alloc_buf(void **state)
{
    (void)state;
    uint8_t *small = pi2_io_alloc_buf(64 << 10), *big = pi2_io_alloc_buf((5u << 20) + 123);
    assert_non_null(small);
    assert_non_null(big);
    assert_int_equal((uintptr_t)small % PI2_IO_ALIGN, 0);
    assert_int_equal((uintptr_t)big % (2u << 20), 0);
    memset(big, 0x5a, (5u << 20) + 123); /* all of it usable */
    memset(small, 0xa5, 64 << 10);
    if (pi2t_have_thp()) {
        assert_int_equal(pi2t_vma_flag(big, "hg"), 1);
        assert_int_equal(pi2t_vma_flag(big + (4u << 20) - 1, "hg"), 1);
        assert_int_equal(pi2t_vma_flag(big + (4u << 20), "hg"), 0); /* the tail keeps small pages */
    }
    assert_int_equal(big[(5u << 20) + 122], 0x5a);
    pi2_io_free_buf(small);
    pi2_io_free_buf(big);
    void *zero = pi2_io_alloc_buf(0);
    assert_non_null(zero);
    pi2_io_free_buf(zero);
}

/* Resident pages of the process (statm). */
static long resident_pages(void)
{
    long size = 0, res = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    assert_non_null(f);
    assert_int_equal(fscanf(f, "%ld %ld", &size, &res), 2);
    fclose(f);
    return res;
}

static void note_caller(void *arg) { *(pthread_t *)arg = pthread_self(); }

/* Every page of every buffer is faulted in (the process's resident set
 * grows by them, and mincore sees each), contents are kept, on 1..3
 * threads, with the caller's task run on the caller. The buffers are
 * fresh mappings (freed heap memory would already be resident); the
 * resident count is approximate per CPU, hence the slack. */
static void test_prefault(void **state)
{
    (void)state;
    long page = sysconf(_SC_PAGESIZE);
    const uint64_t lens[4] = {5000, 0, (6u << 20) + 123, 9u << 20};
    size_t total = 0;
    for (int i = 0; i < 4; i++)
        total += lens[i];
    for (int threads = 1; threads <= 3; threads++) {
        uint8_t *bufs[4];
        for (int i = 0; i < 4; i++) {
            bufs[i] = mmap(NULL, lens[i] ? lens[i] : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            assert_true(bufs[i] != MAP_FAILED);
        }
        for (size_t k = 0; k < 3000; k++) /* some data already there */
            bufs[0][k] = (uint8_t)(k * 7 + 1);
        long before = resident_pages();
        pthread_t who = 0;
        pi2_io_prefault(bufs, lens, 4, threads, note_caller, &who);
        long grew = resident_pages() - before;
        assert_true(pthread_equal(who, pthread_self()));
        assert_true((size_t)grew * (size_t)page >= total - (1u << 20));
        for (int i = 0; i < 4; i++) {
            unsigned char vec[2560];
            uintptr_t a = (uintptr_t)bufs[i] / (uintptr_t)page * (uintptr_t)page;
            size_t span = (size_t)((uintptr_t)bufs[i] + lens[i] - a), np = (span + (size_t)page - 1) / (size_t)page;
            assert_true(np <= sizeof vec);
            if (lens[i] == 0)
                continue;
            assert_int_equal(mincore((void *)a, span, vec), 0);
            for (size_t k = 0; k < np; k++)
                assert_true(vec[k] & 1);
        }
        for (size_t k = 0; k < 3000; k++)
            assert_int_equal(bufs[0][k], (uint8_t)(k * 7 + 1));
        assert_int_equal(bufs[3][(9u << 20) - 1], 0);
        for (int i = 0; i < 4; i++)
            munmap(bufs[i], lens[i] ? lens[i] : 1);
    }
    /* nothing to do, no task */
    pi2_io_prefault(NULL, NULL, 0, 2, NULL, NULL);
}

static void test_bad_requests(void **state)
{
    (void)state;
    pi2_io *io = open_io(PI2_IO_AUTO);
    uint8_t *buf = pi2_io_alloc_buf(8192);
    pi2_err e = {0};
    pi2_io_req r = {.off = 100, .len = 4096, .buf = buf};
    pi2_io_req *p = &r;
    assert_int_equal(pi2_io_submit(io, &p, 1, &e), PI2_EINVAL);
    pi2_err e2 = {0};
    r = (pi2_io_req){.off = 0, .len = 4096, .buf = buf + 1};
    assert_int_equal(pi2_io_submit(io, &p, 1, &e2), PI2_EINVAL);
    pi2_io_req many[17], *mp[17];
    for (int i = 0; i < 17; i++) {
        many[i] = (pi2_io_req){.off = 0, .len = 4096, .buf = buf};
        mp[i] = &many[i];
    }
    pi2_err e3 = {0};
    assert_int_equal(pi2_io_submit(io, mp, 17, &e3), PI2_ERANGE);
    assert_int_equal(pi2_io_inflight(io), 0);
    pi2_err e4 = {0};
    pi2_io *none = NULL;
    char missing[160];
    snprintf(missing, sizeof missing, "%s/missing.bin", g_dir);
    assert_int_equal(pi2_io_open(&none, missing, NULL, &e4), PI2_EIO);
    assert_non_null(strstr(e4.msg, "missing.bin"));
    pi2_io_free_buf(buf);
    pi2_io_close(io);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_reads, clear_faults),
        cmocka_unit_test_teardown(test_short_reads, clear_faults),
        cmocka_unit_test_teardown(test_fixed_buffers, clear_faults),
        cmocka_unit_test_teardown(test_eio, clear_faults),
        cmocka_unit_test_teardown(test_no_uring, clear_faults),
        cmocka_unit_test_teardown(test_truncated_and_replaced, clear_faults),
        cmocka_unit_test_teardown(test_wait_timeout, clear_faults),
        cmocka_unit_test_teardown(test_bench, clear_faults),
        cmocka_unit_test_teardown(test_bad_requests, clear_faults),
        cmocka_unit_test(test_alloc_buf),
        cmocka_unit_test(test_prefault),
    };
    return cmocka_run_group_tests_name("io", tests, setup, teardown);
}
