/* pi2 offloading: the I/O thread (runtime/offload/offload.h). */
#include "runtime/offload/offload_internal.h"

#include <errno.h>

/* ---------------- the I/O thread ---------------- */

void *io_main(void *arg)
{
    eng_ofl *x = arg;
    ofl_req **subs = x->subs;
    pi2_io_req *done[64];
    int gained = pi2_thread_raise_priority(PI2_IO_THREAD_NICE);
    pthread_mutex_lock(&x->mu);
    x->info.io_nice = gained;
    x->io_up = true;
    pthread_cond_broadcast(&x->cv_compute);
    for (;;) {
        while (!x->stop && x->rq_n == 0 && pi2_io_inflight(x->io) == 0 && !stream_wants(x))
            pthread_cond_wait(&x->cv_io, &x->mu);
        if (x->stop)
            break;
        stream_fill(x);
        int m = 0;
        while (x->rq_n > 0 && x->n_free > 0) {
            const ofl_rd *head = &x->rq[x->rq_head];
            if (head->win < 0 && head->job == J_DEC && x->fail) { /* the job failed: drop its reads */
                x->rq_head = (x->rq_head + 1) % x->rq_cap;
                x->rq_n--;
                if (--x->n_sub == 0)
                    pthread_cond_broadcast(&x->cv_compute);
                continue;
            }
            ofl_req *r = x->free_req[--x->n_free];
            r->rd = *head;
            x->rq_head = (x->rq_head + 1) % x->rq_cap;
            x->rq_n--;
            if (r->rd.win >= 0)
                x->s_sub++;
            subs[m++] = r;
        }
        pthread_mutex_unlock(&x->mu);

        /* all taken at once: one system call for the lot (a read each cost
         * one, the I/O thread's main cost on a core it shares) */
        int bad = -1;
        pi2_err ser = {0};
        pi2_io_req *ps[64];
        for (int i0 = 0; i0 < m && bad < 0; i0 += 64) {
            int k = m - i0 < 64 ? m - i0 : 64;
            for (int i = 0; i < k; i++) {
                ofl_req *r = subs[i0 + i];
                r->io = (pi2_io_req){.off = r->rd.file_off, .len = r->rd.len,
                                     .buf = r->rd.win >= 0 ? r->rd.dst : r->staging, .user = r};
                ps[i] = &r->io;
            }
            if (pi2_io_submit(x->io, ps, k, &ser) != 0)
                bad = i0; /* nothing of this batch was queued */
        }
        int n = 0;
        pi2_err er = {0};
        if (pi2_io_inflight(x->io) > 0) {
            n = pi2_io_wait_timeout(x->io, 1, done, 64, OFL_POLL_US, &er);
            if (n < 0)
                n = 0; /* the ring itself failed: the requests report it one by one */
            for (int i = 0; i < n; i++) {
                ofl_req *r = done[i]->user;
                if (r->rd.win < 0 && r->io.result >= 0) {
                    if (r->rd.job == J_PF)
                        pf_copy(x, r);
                    else
                        decode_copy(x, r);
                }
            }
        }

        pthread_mutex_lock(&x->mu);
        for (int i = bad; i >= 0 && i < m; i++) { /* not submitted: fail as reads */
            ofl_req *r = subs[i];
            r->io.result = -EIO;
            if (r->rd.win >= 0) {
                stream_landed(x, r, &ser);
            } else if (r->rd.job == J_PF) {
                pf_landed(x, &r->rd, false, &ser);
            } else {
                x->n_sub--;
                job_fail(x, &ser);
                if (x->n_sub == 0)
                    pthread_cond_broadcast(&x->cv_compute);
            }
            x->free_req[x->n_free++] = r;
        }
        for (int i = 0; i < n; i++) {
            ofl_req *r = done[i]->user;
            if (r->rd.win >= 0) {
                stream_landed(x, r, &er);
            } else if (r->rd.job == J_PF) {
                pf_landed(x, &r->rd, r->io.result >= 0, &er);
            } else if (r->io.result < 0) {
                pi2_err fe = er;
                if (!fe.code)
                    pi2_err_set(&fe, PI2_EIO, "%s: read at offset %llu failed", x->e->path,
                                (unsigned long long)r->rd.file_off);
                x->n_sub--;
                job_fail(x, &fe);
                if (x->n_sub == 0)
                    pthread_cond_broadcast(&x->cv_compute);
            } else {
                decode_landed(x, &r->rd);
            }
            x->free_req[x->n_free++] = r;
        }
    }
    pthread_mutex_unlock(&x->mu);
    return NULL;
}
