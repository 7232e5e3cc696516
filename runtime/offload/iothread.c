/* pi2 offloading: the I/O thread (runtime/offload/offload.h). It owns the
 * reader: it takes reads from the queue, submits them, copies the landed
 * bytes into their slots outside the lock and hands each read to whoever
 * asked for it (the decode job, the read-ahead or the prefill stream). */
#include "runtime/offload/ofl_state.h"

#include <errno.h>

#define IO_BATCH 64 /* reads submitted or reaped per call */

/* Under mu: take queued reads into requests (subs[0..m)); the reads of a
 * failed decode job are dropped. */
static int take_reads(eng_ofl *x, ofl_req **subs)
{
    int m = 0;
    while (x->q.n > 0 && x->q.n_free > 0) {
        const ofl_rd *head = &x->q.rq[x->q.head];
        if (head->win < 0 && head->job == J_DEC && x->job.fail) { /* the job failed: drop its reads */
            x->q.head = (x->q.head + 1) % x->rq_cap;
            x->q.n--;
            if (--x->job.n_sub == 0)
                pthread_cond_broadcast(&x->cv_compute);
            continue;
        }
        ofl_req *r = x->q.free[--x->q.n_free];
        r->rd = *head;
        x->q.head = (x->q.head + 1) % x->rq_cap;
        x->q.n--;
        if (r->rd.win >= 0)
            x->st.sub++;
        subs[m++] = r;
    }
    return m;
}

/* Outside mu: submit subs[0..m); the index of the first not queued (with
 * *ser set), or -1 when all were. All taken at once: one system call for
 * the lot (a read each cost one, the I/O thread's main cost on a core it
 * shares). */
static int submit_reads(eng_ofl *x, ofl_req **subs, int m, pi2_err *ser)
{
    pi2_io_req *ps[IO_BATCH];
    for (int i0 = 0; i0 < m; i0 += IO_BATCH) {
        int k = m - i0 < IO_BATCH ? m - i0 : IO_BATCH;
        for (int i = 0; i < k; i++) {
            ofl_req *r = subs[i0 + i];
            r->io = (pi2_io_req){.off = r->rd.file_off, .len = r->rd.len,
                                 .buf = r->rd.win >= 0 ? r->rd.dst : r->staging, .user = r};
            ps[i] = &r->io;
        }
        if (pi2_io_submit(x->io, ps, k, ser) != 0)
            return i0; /* nothing of this batch was queued */
    }
    return -1;
}

/* Outside mu: wait a little (unless !wait) for reads to land and copy the decode and
 * read-ahead parts into their reserved slots (only this read writes
 * them). The number landed, into done[]. */
static int reap_reads(eng_ofl *x, pi2_io_req **done, bool wait, pi2_err *er)
{
    if (pi2_io_inflight(x->io) == 0)
        return 0;
    int n = wait ? pi2_io_wait_timeout(x->io, 1, done, IO_BATCH, OFL_POLL_US, er)
                 : pi2_io_wait(x->io, 0, done, IO_BATCH, er);
    if (n < 0)
        n = 0; /* the ring itself failed: the requests report it one by one */
    for (int i = 0; i < n; i++) {
        ofl_req *r = done[i]->user;
        if (r->rd.win < 0 && r->io.result >= 0) {
            if (r->rd.job == J_PF)
                ofl_pf_copy(x, r);
            else
                ofl_decode_copy(x, r);
        }
    }
    return n;
}

/* Under mu: a decode read failed with er (or, without a code, at its
 * offset). */
static void decode_failed(eng_ofl *x, const ofl_req *r, const pi2_err *er)
{
    pi2_err fe = *er;
    if (!fe.code)
        pi2_err_set(&fe, PI2_EIO, "%s: read at offset %llu failed", x->e->path, (unsigned long long)r->rd.file_off);
    x->job.n_sub--;
    ofl_job_fail(x, &fe);
    if (x->job.n_sub == 0)
        pthread_cond_broadcast(&x->cv_compute);
}

/* Under mu: hand read r (failed when its result is negative) to whoever
 * asked for it, and give its request back. */
static void land(eng_ofl *x, ofl_req *r, const pi2_err *er)
{
    if (r->rd.win >= 0)
        ofl_stream_landed(x, r, er);
    else if (r->rd.job == J_PF)
        ofl_pf_landed(x, &r->rd, r->io.result >= 0, er);
    else if (r->io.result < 0)
        decode_failed(x, r, er);
    else
        ofl_decode_landed(x, &r->rd);
    x->q.free[x->q.n_free++] = r;
}

void *ofl_io_main(void *arg)
{
    eng_ofl *x = arg;
    ofl_req **subs = x->q.subs;
    pi2_io_req *done[IO_BATCH];
    int gained = pi2_thread_raise_priority(PI2_IO_THREAD_NICE);
    pthread_mutex_lock(&x->mu);
    x->info.io_nice = gained;
    x->io_up = true;
    pthread_cond_broadcast(&x->cv_compute);
    for (;;) {
        while (!x->stop && x->q.n == 0 && pi2_io_inflight(x->io) == 0 && !ofl_stream_wants(x) && x->ra.want < 0)
            pthread_cond_wait(&x->cv_io, &x->mu);
        if (x->stop)
            break;
        bool guessing = x->ra.want >= 0;
        if (guessing) /* first: its reads are the next the decode wants */
            ofl_ra_step(x);
        ofl_stream_fill(x);
        int m = take_reads(x, subs);
        pthread_mutex_unlock(&x->mu);

        pi2_err ser = {0}, er = {0};
        int bad = submit_reads(x, subs, m, &ser);
        int n = reap_reads(x, done, !guessing, &er);

        pthread_mutex_lock(&x->mu);
        for (int i = bad; i >= 0 && i < m; i++) { /* not submitted: fail as reads */
            subs[i]->io.result = -EIO;
            land(x, subs[i], &ser);
        }
        for (int i = 0; i < n; i++)
            land(x, done[i]->user, &er);
    }
    pthread_mutex_unlock(&x->mu);
    return NULL;
}
