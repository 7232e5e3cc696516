/* Direct reads: io_uring (liburing) or a pread thread pool. */
#include "runtime/offload/io.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- fault injection ---- */

static atomic_int g_fault, g_errnum, g_after, g_count;

void pi2_io_inject(pi2_io_fault fault, int errnum, int after, int count)
{
    atomic_store(&g_count, 0);
    atomic_store(&g_fault, (int)fault);
    atomic_store(&g_errnum, errnum);
    atomic_store(&g_after, after);
    atomic_store(&g_count, count);
}

/* The fault for this read (ERRNO or SHORT), or NONE. */
static pi2_io_fault take_fault(void)
{
    int f = atomic_load(&g_fault);
    if (f != PI2_IO_FAULT_ERRNO && f != PI2_IO_FAULT_SHORT)
        return PI2_IO_FAULT_NONE;
    if (atomic_load(&g_count) <= 0)
        return PI2_IO_FAULT_NONE;
    if (atomic_fetch_sub(&g_after, 1) > 0)
        return PI2_IO_FAULT_NONE;
    if (atomic_fetch_sub(&g_count, 1) <= 0)
        return PI2_IO_FAULT_NONE;
    return (pi2_io_fault)f;
}

/* ---- state ---- */

struct pi2_io {
    char path[4096];
    int fd;
    pi2_io_opts o;
    pi2_io_backend used;
    char note[256];
    dev_t dev;
    ino_t ino;
    off_t size;
    int inflight; /* submitted, not reaped */

    /* uring */
    struct io_uring ring;
    bool ring_ok;
    pi2_io_req **instant; /* completed without a read (injected errors) */
    int n_instant;
    struct iovec fixed[PI2_IO_MAX_FIXED]; /* registered buffers (pi2_io_register) */
    int n_fixed;

    /* pread */
    pthread_t *th;
    int n_th;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    pi2_io_req **q, **dq; /* work and done rings, depth entries each */
    int qh, qn, dh, dn;
    bool stop;
};

/* A ring whose completions' task work runs when the reader next enters
 * the kernel, where it waits for them anyway, rather than interrupting it
 * wherever it is (COOP_TASKRUN, Linux 5.19); every wait here asks for at
 * least one completion, so none is left unseen. Older kernels: without.
 * Figures: runtime/PERF.md. */
static int ring_init(unsigned depth, struct io_uring *ring)
{
    int r = io_uring_queue_init(depth, ring, IORING_SETUP_COOP_TASKRUN);
    return r == -EINVAL ? io_uring_queue_init(depth, ring, 0) : r;
}

const char *pi2_io_backend_name(pi2_io_backend b)
{
    return b == PI2_IO_URING ? "io_uring" : b == PI2_IO_PREAD ? "pread" : "auto";
}

void pi2_io_defaults(pi2_io_opts *o)
{
    memset(o, 0, sizeof *o);
    o->backend = PI2_IO_AUTO;
    o->depth = 64;
    o->threads = 4;
}

enum { HUGE_MIN = 4u << 20, HUGE_PAGE = 2u << 20 };

void *pi2_io_alloc_buf(size_t n)
{
    void *p = NULL;
    if (n == 0)
        n = PI2_IO_ALIGN;
    size_t len = (n + PI2_IO_ALIGN - 1) / PI2_IO_ALIGN * PI2_IO_ALIGN;
    if (len < HUGE_MIN)
        return posix_memalign(&p, PI2_IO_ALIGN, len) == 0 ? p : NULL;
    /* large (resident region, hot segment, stream windows): start on a
     * huge page and ask for huge pages over the whole ones inside, so
     * weights streamed every token take one TLB entry per 2 MiB; the tail
     * keeps small pages, so nothing past len is ever backed */
    if (posix_memalign(&p, HUGE_PAGE, len) != 0)
        return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, len / HUGE_PAGE * HUGE_PAGE, MADV_HUGEPAGE); /* advisory: failure is harmless */
#endif
    return p;
}

void pi2_io_free_buf(void *p) { free(p); }

/* ---- prefault ---- */

typedef struct prefault_job {
    uint8_t *const *bufs;
    const uint64_t *lens;
    int n;
    atomic_size_t next; /* next HUGE_PAGE piece, counted over all buffers */
} prefault_job;

static void *prefault_run(void *arg)
{
    prefault_job *j = arg;
    for (;;) {
        size_t k = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        int b = 0;
        size_t pieces;
        while (b < j->n && k >= (pieces = (j->lens[b] + HUGE_PAGE - 1) / HUGE_PAGE)) {
            k -= pieces;
            b++;
        }
        if (b == j->n)
            break;
        uint8_t *p = j->bufs[b] + k * HUGE_PAGE;
        size_t len = (size_t)(j->lens[b] - k * HUGE_PAGE < HUGE_PAGE ? j->lens[b] - k * HUGE_PAGE : HUGE_PAGE);
        /* a write fault per page (a read would map the zero page); or
         * with 0 keeps what is there */
        for (size_t i = 0; i < len; i += PI2_IO_ALIGN)
            __atomic_fetch_or(p + i, (uint8_t)0, __ATOMIC_RELAXED);
    }
    return NULL;
}

void pi2_io_prefault(uint8_t *const *bufs, const uint64_t *lens, int n, int threads, void (*first)(void *), void *arg)
{
    prefault_job j = {bufs, lens, n, 0};
    pthread_t th[PI2_IO_PREFAULT_MAX];
    int started = 0;
    if (threads > PI2_IO_PREFAULT_MAX)
        threads = PI2_IO_PREFAULT_MAX;
    while (started + 1 < threads && pthread_create(&th[started], NULL, prefault_run, &j) == 0)
        started++; /* fewer helpers than asked: the caller does more */
    if (first)
        first(arg);
    prefault_run(&j);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
}

/* One pread request to completion (short reads retried); sets result. */
static void pread_req(const pi2_io *io, pi2_io_req *r)
{
    while (r->done < r->len) {
        pi2_io_fault f = take_fault();
        if (f == PI2_IO_FAULT_ERRNO) {
            r->result = -atomic_load(&g_errnum);
            return;
        }
        uint32_t want = r->len - r->done;
        if (f == PI2_IO_FAULT_SHORT && want > PI2_IO_ALIGN)
            want = want / 2 / PI2_IO_ALIGN * PI2_IO_ALIGN;
        ssize_t got = pread(io->fd, (uint8_t *)r->buf + r->done, want, (off_t)(r->off + r->done));
        if (got < 0) {
            if (errno == EINTR)
                continue;
            r->result = -errno;
            return;
        }
        if (got == 0) {
            r->result = -ENODATA; /* end of file: truncated */
            return;
        }
        r->done += (uint32_t)got;
    }
    r->result = (int32_t)r->len;
}

static void *pread_worker(void *arg)
{
    pi2_io *io = arg;
    pthread_mutex_lock(&io->mu);
    for (;;) {
        while (!io->stop && io->qn == 0)
            pthread_cond_wait(&io->cv_work, &io->mu);
        if (io->stop && io->qn == 0)
            break;
        pi2_io_req *r = io->q[io->qh];
        io->qh = (io->qh + 1) % io->o.depth;
        io->qn--;
        pthread_mutex_unlock(&io->mu);
        pread_req(io, r);
        pthread_mutex_lock(&io->mu);
        io->dq[(io->dh + io->dn) % io->o.depth] = r;
        io->dn++;
        pthread_cond_broadcast(&io->cv_done);
    }
    pthread_mutex_unlock(&io->mu);
    return NULL;
}

static int start_pread(pi2_io *io, pi2_err *err)
{
    pthread_mutex_init(&io->mu, NULL);
    pthread_cond_init(&io->cv_work, NULL);
    pthread_cond_init(&io->cv_done, NULL);
    io->q = calloc((size_t)io->o.depth, sizeof *io->q);
    io->dq = calloc((size_t)io->o.depth, sizeof *io->dq);
    io->th = calloc((size_t)io->o.threads, sizeof *io->th);
    if (!io->q || !io->dq || !io->th)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory for the I/O queue", io->path);
    for (int i = 0; i < io->o.threads; i++) {
        int rc = pthread_create(&io->th[i], NULL, pread_worker, io);
        if (rc != 0)
            return pi2_err_set(err, rc == EAGAIN ? PI2_ENOMEM : PI2_EIO, "%s: cannot start an I/O thread: %s",
                               io->path, strerror(rc));
        io->n_th++;
    }
    io->used = PI2_IO_PREAD;
    return 0;
}

int pi2_io_open(pi2_io **out, const char *path, const pi2_io_opts *o, pi2_err *err)
{
    *out = NULL;
    pi2_io_opts def;
    if (!o) {
        pi2_io_defaults(&def);
        o = &def;
    }
    if (o->depth < 1 || o->depth > 4096 || o->threads < 1 || o->threads > 64)
        return pi2_err_set(err, PI2_EINVAL, "%s: I/O depth %d or threads %d out of range", path, o->depth,
                           o->threads);
    pi2_io *io = calloc(1, sizeof *io);
    if (!io)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", path);
    snprintf(io->path, sizeof io->path, "%s", path);
    io->o = *o;
    io->fd = open(path, O_RDONLY | O_CLOEXEC | (o->buffered ? 0 : O_DIRECT));
    if (io->fd < 0 && !o->buffered && errno == EINVAL) /* filesystem without O_DIRECT */
        return free(io), pi2_err_set(err, PI2_EIO, "%s: the filesystem does not support direct I/O (O_DIRECT)",
                                     path);
    struct stat st;
    if (io->fd < 0 || fstat(io->fd, &st) != 0) {
        int e = errno;
        if (io->fd >= 0)
            close(io->fd);
        free(io);
        return pi2_err_set(err, PI2_EIO, "%s: %s", path, strerror(e));
    }
    io->dev = st.st_dev;
    io->ino = st.st_ino;
    io->size = st.st_size;
    int rc = 0;
    if (o->backend != PI2_IO_PREAD) {
        int r = atomic_load(&g_fault) == PI2_IO_FAULT_NO_URING ? -ENOSYS : ring_init((unsigned)o->depth, &io->ring);
        if (r == 0) {
            io->ring_ok = true;
            io->used = PI2_IO_URING;
            if (!(io->instant = calloc((size_t)o->depth, sizeof *io->instant)))
                rc = pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", path);
        } else if (o->backend == PI2_IO_URING) {
            rc = pi2_err_set(err, PI2_EIO, "%s: io_uring setup failed: %s", path, strerror(-r));
        } else {
            snprintf(io->note, sizeof io->note, "io_uring unavailable (%s): using pread threads", strerror(-r));
        }
    }
    if (rc == 0 && !io->ring_ok)
        rc = start_pread(io, err);
    if (rc) {
        pi2_io_close(io);
        return rc;
    }
    *out = io;
    return 0;
}

pi2_io_backend pi2_io_backend_used(const pi2_io *io) { return io->used; }
const char *pi2_io_backend_note(const pi2_io *io) { return io->note; }
int pi2_io_inflight(const pi2_io *io) { return io->inflight; }

static int check_req(const pi2_io *io, const pi2_io_req *r, pi2_err *err)
{
    if (!r || !r->buf || r->len == 0 || r->off % PI2_IO_ALIGN || r->len % PI2_IO_ALIGN ||
        (uintptr_t)r->buf % PI2_IO_ALIGN)
        return pi2_err_set(err, PI2_EINVAL, "%s: unaligned or empty read request", io->path);
    if (r->off > UINT64_MAX - r->len)
        return pi2_err_set(err, PI2_ERANGE, "%s: read offset overflows", io->path);
    return 0;
}

/* Queue the remainder of r on the ring (injected faults applied). */
static void uring_queue(pi2_io *io, pi2_io_req *r)
{
    pi2_io_fault f = take_fault();
    if (f == PI2_IO_FAULT_ERRNO) {
        r->result = -atomic_load(&g_errnum);
        io->instant[io->n_instant++] = r;
        return;
    }
    uint32_t want = r->len - r->done;
    if (f == PI2_IO_FAULT_SHORT && want > PI2_IO_ALIGN)
        want = want / 2 / PI2_IO_ALIGN * PI2_IO_ALIGN;
    struct io_uring_sqe *sqe = io_uring_get_sqe(&io->ring);
    if (!sqe) { /* cannot happen: at most depth requests in flight */
        r->result = -EAGAIN;
        io->instant[io->n_instant++] = r;
        return;
    }
    uint8_t *dst = (uint8_t *)r->buf + r->done;
    int k = 0;
    while (k < io->n_fixed && !(dst >= (uint8_t *)io->fixed[k].iov_base &&
                                 (size_t)(dst - (uint8_t *)io->fixed[k].iov_base) + want <= io->fixed[k].iov_len))
        k++;
    if (k < io->n_fixed)
        io_uring_prep_read_fixed(sqe, io->fd, dst, want, r->off + r->done, k);
    else
        io_uring_prep_read(sqe, io->fd, dst, want, r->off + r->done);
    io_uring_sqe_set_data(sqe, r);
}

bool pi2_io_register(pi2_io *io, void *const *bufs, const size_t *lens, int n)
{
    if (!io->ring_ok || io->inflight > 0 || n < 1 || n > PI2_IO_MAX_FIXED)
        return false;
    if (io->n_fixed > 0) {
        io_uring_unregister_buffers(&io->ring);
        io->n_fixed = 0;
    }
    struct iovec v[PI2_IO_MAX_FIXED];
    for (int i = 0; i < n; i++) {
        if (!bufs[i] || lens[i] == 0)
            return false;
        v[i] = (struct iovec){.iov_base = bufs[i], .iov_len = lens[i]};
    }
    if (io_uring_register_buffers(&io->ring, v, (unsigned)n) != 0)
        return false;
    memcpy(io->fixed, v, sizeof(struct iovec) * (size_t)n);
    io->n_fixed = n;
    return true;
}

int pi2_io_submit(pi2_io *io, pi2_io_req *const *reqs, int n, pi2_err *err)
{
    if (n < 0 || io->inflight + n > io->o.depth)
        return pi2_err_set(err, PI2_ERANGE, "%s: %d reads would exceed the queue depth %d", io->path,
                           io->inflight + n, io->o.depth);
    for (int i = 0; i < n; i++)
        if (check_req(io, reqs[i], err))
            return err->code;
    for (int i = 0; i < n; i++) {
        reqs[i]->done = 0;
        reqs[i]->result = 0;
    }
    if (io->ring_ok) {
        for (int i = 0; i < n; i++)
            uring_queue(io, reqs[i]);
        int r = io_uring_submit(&io->ring);
        if (r < 0) /* the queued entries stay in the ring and go with the next submit */
            return pi2_err_set(err, PI2_EIO, "%s: io_uring submit failed: %s", io->path, strerror(-r));
    } else {
        pthread_mutex_lock(&io->mu);
        for (int i = 0; i < n; i++) {
            io->q[(io->qh + io->qn) % io->o.depth] = reqs[i];
            io->qn++;
        }
        pthread_cond_broadcast(&io->cv_work);
        pthread_mutex_unlock(&io->mu);
    }
    io->inflight += n;
    return 0;
}

static void fail_msg(const pi2_io *io, const pi2_io_req *r, pi2_err *err)
{
    if (r->result == -ENODATA)
        pi2_err_set(err, PI2_EIO, "%s: truncated: end of file inside the read of %u bytes at offset %llu "
                                  "(was the file changed after it was opened?)",
                    io->path, r->len, (unsigned long long)r->off);
    else
        pi2_err_set(err, PI2_EIO, "%s: read of %u bytes at offset %llu failed: %s", io->path, r->len,
                    (unsigned long long)r->off, strerror(-r->result));
}

/* io_uring: up to max completions into done, at least min_done unless
 * timeout_us (>= 0) passes first; transient failures and short reads are
 * read again. The count, or a negative code when the ring failed. */
static int uring_wait(pi2_io *io, int min_done, pi2_io_req **done, int max, long timeout_us, pi2_err *err)
{
    int got = 0;
    while (got < max) {
        if (io->n_instant > 0) {
            done[got++] = io->instant[--io->n_instant];
            io->inflight--;
            continue;
        }
        struct io_uring_cqe *cqe = NULL;
        int r;
        if (got >= min_done) {
            r = io_uring_peek_cqe(&io->ring, &cqe);
        } else if (timeout_us >= 0) {
            struct __kernel_timespec ts = {.tv_sec = timeout_us / 1000000, .tv_nsec = timeout_us % 1000000 * 1000};
            r = io_uring_wait_cqe_timeout(&io->ring, &cqe, &ts);
            if (r == -ETIME)
                break;
        } else {
            r = io_uring_wait_cqe(&io->ring, &cqe);
        }
        if (r == -EINTR)
            continue;
        if (r < 0 || !cqe) {
            if (got < min_done && r < 0 && r != -EAGAIN)
                return pi2_err_set(err, PI2_EIO, "%s: io_uring wait failed: %s", io->path, strerror(-r));
            break;
        }
        pi2_io_req *q = io_uring_cqe_get_data(cqe);
        int res = cqe->res;
        io_uring_cqe_seen(&io->ring, cqe);
        if (res == -EINTR || res == -EAGAIN) { /* transient: read again */
            uring_queue(io, q);
            io_uring_submit(&io->ring);
            continue;
        }
        if (res < 0) {
            q->result = res;
        } else if (res == 0) {
            q->result = -ENODATA;
        } else {
            q->done += (uint32_t)res;
            if (q->done < q->len) { /* short read: the rest */
                uring_queue(io, q);
                int s = io_uring_submit(&io->ring);
                if (s < 0) {
                    q->result = s;
                } else {
                    continue;
                }
            } else {
                q->result = (int32_t)q->len;
            }
        }
        done[got++] = q;
        io->inflight--;
    }
    return got;
}

/* The pread threads: as uring_wait, from their done ring. */
static int pread_wait(pi2_io *io, int min_done, pi2_io_req **done, int max, long timeout_us)
{
    int got = 0;
    struct timespec until = {0};
    if (timeout_us >= 0) {
        clock_gettime(CLOCK_REALTIME, &until);
        long long ns = (long long)until.tv_nsec + (long long)timeout_us * 1000;
        until.tv_sec += (time_t)(ns / 1000000000);
        until.tv_nsec = (long)(ns % 1000000000);
    }
    pthread_mutex_lock(&io->mu);
    while (got < max) {
        bool timed_out = false;
        while (io->dn == 0 && got < min_done && !timed_out)
            if (timeout_us < 0)
                pthread_cond_wait(&io->cv_done, &io->mu);
            else
                timed_out = pthread_cond_timedwait(&io->cv_done, &io->mu, &until) == ETIMEDOUT;
        if (io->dn == 0)
            break;
        done[got++] = io->dq[io->dh];
        io->dh = (io->dh + 1) % io->o.depth;
        io->dn--;
        io->inflight--;
    }
    pthread_mutex_unlock(&io->mu);
    return got;
}

/* timeout_us < 0: wait as long as it takes for min_done completions. */
static int io_wait(pi2_io *io, int min_done, pi2_io_req **done, int max, long timeout_us, pi2_err *err)
{
    if (min_done > io->inflight)
        min_done = io->inflight;
    if (min_done > max)
        min_done = max;
    int got = io->ring_ok ? uring_wait(io, min_done, done, max, timeout_us, err)
                          : pread_wait(io, min_done, done, max, timeout_us);
    if (got < 0)
        return got;
    for (int i = 0; i < got; i++)
        if (done[i]->result < 0) {
            fail_msg(io, done[i], err);
            break;
        }
    return got;
}

int pi2_io_wait(pi2_io *io, int min_done, pi2_io_req **done, int max, pi2_err *err)
{
    return io_wait(io, min_done, done, max, -1, err);
}

int pi2_io_wait_timeout(pi2_io *io, int min_done, pi2_io_req **done, int max, long timeout_us, pi2_err *err)
{
    return io_wait(io, min_done, done, max, timeout_us < 0 ? 0 : timeout_us, err);
}

int pi2_io_read(pi2_io *io, void *buf, uint64_t off, uint32_t len, pi2_err *err)
{
    pi2_io_req r = {.off = off, .len = len, .buf = buf};
    pi2_io_req *rp = &r, *d[1];
    if (io->inflight > 0)
        return pi2_err_set(err, PI2_EINVAL, "%s: synchronous read while reads are in flight", io->path);
    int rc = pi2_io_submit(io, &rp, 1, err);
    if (rc)
        return rc;
    pi2_err e2 = {0};
    int n = pi2_io_wait(io, 1, d, 1, &e2);
    if (n < 0 || r.result < 0) {
        if (!e2.code)
            fail_msg(io, &r, &e2);
        *err = err->code ? *err : e2;
        return e2.code ? e2.code : PI2_EIO;
    }
    return 0;
}

int pi2_io_check(const pi2_io *io, pi2_err *err)
{
    struct stat st;
    if (stat(io->path, &st) != 0)
        return pi2_err_set(err, PI2_EIO, "%s: %s (was it removed after it was opened?)", io->path, strerror(errno));
    if (st.st_dev != io->dev || st.st_ino != io->ino)
        return pi2_err_set(err, PI2_EIO, "%s: the file was replaced after it was opened", io->path);
    if (st.st_size != io->size)
        return pi2_err_set(err, PI2_EIO, "%s: the file changed size after it was opened (%lld -> %lld bytes)",
                           io->path, (long long)io->size, (long long)st.st_size);
    return 0;
}

int pi2_io_check_size(const pi2_io *io, pi2_err *err)
{
    struct stat st;
    if (fstat(io->fd, &st) != 0)
        return pi2_err_set(err, PI2_EIO, "%s: %s", io->path, strerror(errno));
    if (st.st_size != io->size)
        return pi2_err_set(err, PI2_EIO, "%s: the file changed size after it was opened (%lld -> %lld bytes)",
                           io->path, (long long)io->size, (long long)st.st_size);
    return 0;
}

void pi2_io_close(pi2_io *io)
{
    if (!io)
        return;
    if (io->ring_ok) {
        pi2_io_req *d[64];
        pi2_err e = {0};
        while (io->inflight > 0 && pi2_io_wait(io, 1, d, 64, &e) > 0) {
        }
        io_uring_queue_exit(&io->ring);
    }
    if (io->th) {
        pthread_mutex_lock(&io->mu);
        io->stop = true;
        pthread_cond_broadcast(&io->cv_work);
        pthread_mutex_unlock(&io->mu);
        for (int i = 0; i < io->n_th; i++)
            pthread_join(io->th[i], NULL);
        pthread_mutex_destroy(&io->mu);
        pthread_cond_destroy(&io->cv_work);
        pthread_cond_destroy(&io->cv_done);
    }
    free(io->th);
    free(io->q);
    free(io->dq);
    free(io->instant);
    if (io->fd >= 0)
        close(io->fd);
    free(io);
}

/* CPU seconds used by the whole process (its pread threads too). */
static double cpu_now(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0)
        return 0;
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The probe's next offset: in order from 0 (false past the end), or
 * xorshift-random among the aligned slots. */
static bool bench_next(bool sequential, uint32_t size, uint64_t fsize, uint64_t slots, uint64_t *seq, uint64_t *x,
                       uint64_t *off)
{
    if (sequential) {
        if (*seq + size > fsize)
            return false;
        *off = *seq;
        *seq += size;
        return true;
    }
    *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
    *off = *x % slots * PI2_IO_ALIGN;
    return true;
}

int pi2_io_bench(pi2_io *io, uint32_t size, int depth, bool sequential, double seconds, pi2_io_bench_result *out,
                 pi2_err *err)
{
    memset(out, 0, sizeof *out);
    uint64_t fsize = (uint64_t)io->size / PI2_IO_ALIGN * PI2_IO_ALIGN;
    if (size == 0 || size % PI2_IO_ALIGN || size > fsize || depth < 1 || depth > io->o.depth || io->inflight)
        return pi2_err_set(err, PI2_EINVAL, "%s: bad probe: %u-byte reads, depth %d", io->path, size, depth);
    pi2_io_req *req = calloc((size_t)depth, sizeof *req);
    pi2_io_req **done = calloc((size_t)depth, sizeof *done);
    pi2_io_req **free_req = calloc((size_t)depth, sizeof *free_req);
    double *t_sub = calloc((size_t)depth, sizeof *t_sub);
    uint8_t *buf = pi2_io_alloc_buf((size_t)size * (size_t)depth);
    int rc = 0, n_free = 0;
    if (!req || !done || !free_req || !t_sub || !buf) {
        rc = pi2_err_set(err, PI2_ENOMEM, "%s: out of memory for the probe", io->path);
        goto out;
    }
    for (int i = depth; i-- > 0;) {
        req[i].user = (void *)(uintptr_t)i;
        req[i].len = size;
        req[i].buf = buf + (size_t)i * size;
        free_req[n_free++] = &req[i];
    }
    uint64_t slots = (fsize - size) / PI2_IO_ALIGN + 1, seq = 0, x = 0x9e3779b97f4a7c15ull;
    double t0 = pi2_now(), lat = 0, c0 = cpu_now();
    bool more = true;
    while (rc == 0 && (more || n_free < depth)) {
        while (rc == 0 && more && n_free > 0) {
            uint64_t off;
            if (!(more = bench_next(sequential, size, fsize, slots, &seq, &x, &off)))
                break;
            pi2_io_req *p = free_req[--n_free];
            p->off = off;
            if ((rc = pi2_io_submit(io, &p, 1, err)) != 0) {
                free_req[n_free++] = p;
                break;
            }
            t_sub[(uintptr_t)p->user] = pi2_now();
        }
        if (n_free == depth)
            break;
        pi2_err we = {0};
        int n = pi2_io_wait(io, 1, done, depth, &we);
        if (n < 0) {
            rc = pi2_err_set(err, we.code ? we.code : PI2_EIO, "%s", we.msg);
            break;
        }
        double now = pi2_now();
        for (int k = 0; k < n; k++) {
            if (done[k]->result < 0 && rc == 0)
                rc = pi2_err_set(err, we.code ? we.code : PI2_EIO, "%s", we.msg);
            out->reads++;
            out->bytes += size;
            lat += now - t_sub[(uintptr_t)done[k]->user];
            free_req[n_free++] = done[k];
        }
        if (now - t0 >= seconds)
            more = false;
    }
    out->seconds = pi2_now() - t0;
    if (out->seconds > 0) {
        out->bytes_per_s = (double)out->bytes / out->seconds;
        out->iops = (double)out->reads / out->seconds;
    }
    out->lat_us = out->reads ? 1e6 * lat / (double)out->reads : 0;
    out->cpu_us = out->reads ? 1e6 * (cpu_now() - c0) / (double)out->reads : 0;
out:
    while (io->inflight > 0) { /* an error with reads in flight: drain them */
        pi2_err de = {0};
        if (pi2_io_wait(io, 1, done, depth, &de) <= 0)
            break;
    }
    free(req);
    free(done);
    free(free_req);
    free(t_sub);
    pi2_io_free_buf(buf);
    return rc;
}
