/* pi2 hardware profile, the measurements: the runtime's own kernels, pool
 * and direct reader on this machine. See runtime/hwprof.h.
 *
 * Why it is measured the way it is:
 * - One arena of weights, sized well past the last-level cache, holds every
 *   matrix the kernels walk, so each figure is paid in memory traffic as in
 *   decode. Its 32-bit words are floats in +-[0.5, 1): random bytes for the
 *   int8 kernels (no zero blocks to skip) and normal floats for sgemv (no
 *   denormal slow paths). Scales are small finite fp16 values.
 * - Every compute figure runs jobs through the pool the way the engine does:
 *   a job is one matrix (or one sparse layer's rows), split over the threads
 *   with pi2_pool_split, walked in 128-row chunks with per-thread pointer
 *   arrays. Consecutive jobs move on through the arena, so a matrix is never
 *   still cached when it comes round again.
 * - Dense weight bytes count the payload and the fp16 scales (what a model's
 *   matrix occupies); sparse figures are wall-clock ns per row at t threads.
 *   Each is the best of three slices of its time, so a burst of other work
 *   on the machine slows one slice rather than the figure.
 * - The storage figures use the engine's reader settings (pi2_io_defaults,
 *   depth 64), so a pread fallback is profiled as the engine would get it.
 *   The scratch file is unlinked as soon as the reader has it open: nothing
 *   is left behind whatever happens after that.
 * - Figures are rounded (rates to whole units, small values to 1/1024) so
 *   the JSON stays readable while reading back bit for bit.
 */
#include "runtime/hwprof.h"
#include "runtime/hwprof_probe.h"
#include "runtime/offload/io.h"
#include "runtime/kernels.h"
#include "formats/pool.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define HW_DEF_FILE_MB 1024
#define HW_MAX_FILE_MB (1 << 20)
#define HW_MAX_POINT 60.0
#define HW_CHUNK 128           /* rows per kernel call (the engine's decode chunk) */
#define HW_GRAIN 16            /* rows per partition unit */
#define HW_T 64                /* tokens of the prefill figure */
#define HW_NMAX 4096           /* longest row */
#define HW_NIDX (1u << 18)     /* random row numbers for the sparse figures */
#define HW_OUT (HW_CHUNK * HW_T) /* floats of per-thread output (>= HW_NMAX) */
#define HW_OVL_SIZE 16384u     /* overlap reads: 16 KiB at depth 32 */
#define HW_OVL_DEPTH 32
#define HW_IO_DEPTH 64
#define HW_FILE_CHUNK (4u << 20)
#define HW_SLICES 3 /* a figure is the best of this many slices */

/* ---------------- small helpers ---------------- */

int pi2_hw_resolve_threads(int t)
{
    if (t != 0)
        return t;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > PI2_HW_MAX_THREADS ? PI2_HW_MAX_THREADS : (int)n;
}

/* This machine's CPU name: the first "model name" of /proc/cpuinfo,
 * trimmed, control characters replaced; "unknown" without one. */
void pi2_hwprof_cpu_name(char *dst, size_t cap)
{
    snprintf(dst, cap, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0)
            continue;
        char *v = strchr(line, ':');
        if (!v)
            continue;
        v++;
        while (*v == ' ' || *v == '\t')
            v++;
        size_t n = strlen(v);
        while (n > 0 && (v[n - 1] == '\n' || v[n - 1] == '\r' || v[n - 1] == ' ' || v[n - 1] == '\t'))
            v[--n] = 0;
        for (char *p = v; *p; p++)
            if ((unsigned char)*p < 0x20 || *p == 0x7f)
                *p = '?';
        if (n > 0) {
            if (n >= cap)
                v[cap - 1] = 0;
            snprintf(dst, cap, "%s", v);
        }
        break;
    }
    fclose(f);
}

const char *pi2_hw_isa_now(void) { return pi2_k_isa_name(pi2_k_get_isa()); }

/* Largest cache of the highest level (bytes), 0 when unknown. */
static uint64_t llc_bytes(void)
{
    uint64_t best = 0;
    int best_level = 0;
    for (int i = 0; i < 16; i++) {
        char path[96], buf[64];
        int level = 0;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        FILE *f = fopen(path, "r");
        if (!f)
            break;
        if (fscanf(f, "%d", &level) != 1)
            level = 0;
        fclose(f);
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        if (!(f = fopen(path, "r")))
            continue;
        unsigned long long v = 0;
        char unit = 0;
        if (fgets(buf, sizeof buf, f) && sscanf(buf, "%llu%c", &v, &unit) >= 1) {
            uint64_t b = v * (unit == 'K' ? 1024ull : unit == 'M' ? 1048576ull : 1ull);
            if (level > best_level || (level == best_level && b > best)) {
                best_level = level;
                best = b;
            }
        }
        fclose(f);
    }
    return best;
}

static inline uint64_t xs64(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    *s = x;
    return x * 0x2545f4914f6cdd1dull;
}

/* Words of floats in +-[0.5, 1): random sign and mantissa, fixed exponent. */
static void fill_floats(uint32_t *w, size_t n, uint64_t seed)
{
    uint64_t s = seed | 1;
    for (size_t i = 0; i + 1 < n; i += 2) {
        uint64_t r = xs64(&s);
        w[i] = ((uint32_t)r & 0x807fffffu) | 0x3f000000u;
        w[i + 1] = ((uint32_t)(r >> 32) & 0x807fffffu) | 0x3f000000u;
    }
    if (n & 1)
        w[n - 1] = 0x3f000000u;
}

/* Round for the JSON: rates to whole units, small values to 1/1024 (kept
 * as they are when that would make them 0). */
static double tidy(double x)
{
    if (!isfinite(x))
        return x;
    double r = fabs(x) >= 1e4 ? round(x) : round(x * 1024.0) / 1024.0;
    return r == 0.0 ? x : r;
}

/* ---------------- compute measurement ---------------- */

typedef enum jkind { J_BW, J_PEAK, J_GEMV, J_MATMUL, J_SGEMV, J_GATHER, J_DOWN } jkind;

typedef struct hw_tls {
    const uint8_t *pp[HW_CHUNK];
    const uint16_t *ps[HW_CHUNK];
    float *out; /* [HW_OUT] */
    double fig, t0, t1; /* a probe's rate and when it ran */
    char pad[64];
} hw_tls;

typedef struct hw_bench {
    pi2_pool *pool;
    int nt;
    pi2_isa isa;
    uint8_t *w; /* arena, wbytes */
    size_t wbytes;
    uint16_t *s; /* scales, ns */
    size_t ns;
    uint32_t *idx;  /* [HW_NIDX] random */
    float *x;       /* [HW_T][HW_NMAX] activations */
    float *ascale;  /* [HW_T][HW_NMAX / 32] */
    int8_t *aq;     /* [HW_T][HW_NMAX] */
    int32_t *asum;  /* [HW_T][HW_NMAX / 32] */
    float coef[HW_CHUNK];
    hw_tls *tls; /* [nt] */
    /* the current job */
    jkind kind;
    pi2_qtype qt;
    int64_t n, rows, jrows, r0;
    size_t rb; /* payload bytes per row */
    int T;
    double seconds; /* probes */
} hw_bench;

/* Row r of the current matrix into the thread's pointer arrays. */
static inline void put_row(const hw_bench *b, hw_tls *t, int k, int64_t r)
{
    t->pp[k] = b->w + (size_t)r * b->rb;
    t->ps[k] = b->s + (size_t)r * (size_t)(b->n / 32);
}

/* Batches of Q4 rows: the superblock GEMM, as the engine's prefill runs
 * its gate and up projections (runtime/ffn.h, ffn_sb). */
static bool hw_sb(const hw_bench *b)
{
    return b->kind == J_MATMUL && b->qt == PI2_QT_Q4;
}

static void job_fn(void *ctx, int tid, int nt)
{
    hw_bench *b = ctx;
    hw_tls *t = &b->tls[tid];
    int64_t lo, hi;
    switch (b->kind) {
    case J_BW: {
        size_t per = b->wbytes / (size_t)nt / 4096 * 4096;
        t->t0 = pi2_now();
        t->fig = pi2_k_probe_read_bw(b->w + (size_t)tid * per, per, b->seconds);
        t->t1 = pi2_now();
        return;
    }
    case J_PEAK:
        t->t0 = pi2_now();
        t->fig = pi2_k_probe_int8_peak(b->isa, b->seconds);
        t->t1 = pi2_now();
        return;
    default: break;
    }
    pi2_pool_split(b->jrows, HW_GRAIN, tid, nt, &lo, &hi);
    for (int64_t c = lo; c < hi; c += HW_CHUNK) {
        int m = (int)(hi - c < HW_CHUNK ? hi - c : HW_CHUNK);
        switch (b->kind) {
        case J_GEMV:
        case J_MATMUL:
            for (int k = 0; k < m; k++)
                put_row(b, t, k, b->r0 + c + k);
            if (hw_sb(b))
                pi2_k_matmul_sb(b->n, m, t->pp, t->ps, b->ascale, b->aq, b->asum, b->T, t->out, HW_CHUNK);
            else
                pi2_k_matmul(b->qt, b->n, m, t->pp, t->ps, b->ascale, b->aq, b->asum, b->T, t->out, HW_CHUNK);
            break;
        case J_SGEMV:
            pi2_k_sgemv((const float *)(const void *)b->w + (size_t)(b->r0 + c) * (size_t)b->n, b->n, b->n, m, b->x,
                        t->out);
            break;
        case J_GATHER:
        case J_DOWN:
            for (int k = 0; k < m; k++) {
                uint32_t v = b->idx[(uint64_t)(b->r0 + c + k) & (HW_NIDX - 1)];
                put_row(b, t, k, (int64_t)(((uint64_t)v * (uint64_t)b->rows) >> 32));
            }
            if (b->kind == J_GATHER)
                pi2_k_matmul(b->qt, b->n, m, t->pp, t->ps, b->ascale, b->aq, b->asum, 1, t->out, 1);
            else
                pi2_k_down_rows(b->qt, b->n, m, b->coef, HW_CHUNK, t->pp, t->ps, 1, t->out, b->n);
            break;
        default: break;
        }
    }
}

/* One job, then move on to the next rows. */
static void run_job(hw_bench *b)
{
    pi2_pool_run(b->pool, job_fn, b);
    b->r0 += b->jrows;
    if (b->kind == J_GATHER || b->kind == J_DOWN)
        b->r0 &= HW_NIDX - 1;
    else if (b->r0 + b->jrows > b->rows)
        b->r0 = 0;
}

/* Set up job `kind` over rows of length n (activations quantized for T). */
static void set_job(hw_bench *b, jkind kind, pi2_qtype qt, int64_t n, int T, int64_t jrows)
{
    b->kind = kind;
    b->qt = qt;
    b->n = n;
    b->T = T;
    b->r0 = 0;
    if (kind == J_SGEMV) {
        b->rb = (size_t)n * sizeof(float);
        b->rows = (int64_t)(b->wbytes / b->rb);
    } else {
        b->rb = pi2_q_payload_row_bytes(qt, n);
        int64_t by_w = (int64_t)(b->wbytes / b->rb), by_s = (int64_t)(b->ns / (size_t)(n / 32));
        b->rows = by_w < by_s ? by_w : by_s;
        if (hw_sb(b))
            pi2_k_act_quantize_sb(b->x, n, T, n, b->ascale, b->aq, b->asum);
        else
            pi2_k_act_quantize(b->x, n, T, n, b->ascale, b->aq, b->asum);
    }
    b->jrows = jrows < b->rows ? jrows : b->rows;
}

/* Run jobs for `seconds` (at least one) after one untimed job (count ==
 * 0), or exactly `count` jobs; returns the jobs timed, their seconds in *el. */
static int64_t run_jobs(hw_bench *b, double seconds, int64_t count, double *el)
{
    if (count == 0)
        run_job(b);
    int64_t k = 0;
    double t0 = pi2_now(), now;
    do {
        run_job(b);
        k++;
        now = pi2_now();
    } while (count > 0 ? k < count : now - t0 < seconds);
    *el = now - t0;
    return k;
}

/* Per-thread probes combined over the span they ran in. */
static double run_probe(hw_bench *b, jkind kind, double seconds)
{
    b->kind = kind;
    b->seconds = seconds;
    pi2_pool_run(b->pool, job_fn, b);
    double rate[PI2_HW_MAX_THREADS], t0[PI2_HW_MAX_THREADS], t1[PI2_HW_MAX_THREADS];
    for (int i = 0; i < b->nt; i++) {
        rate[i] = b->tls[i].fig;
        t0[i] = b->tls[i].t0;
        t1[i] = b->tls[i].t1;
    }
    return pi2_k_probe_combine(rate, t0, t1, b->nt);
}

/* Jobs per second of the current job: the best of HW_SLICES slices of
 * pt / HW_SLICES seconds, so a burst of other work on the machine does not
 * end up in the profile. */
static double best_jobs_per_s(hw_bench *b, double pt)
{
    double best = 0, el;
    for (int i = 0; i < HW_SLICES; i++) {
        int64_t k = run_jobs(b, pt / HW_SLICES, 0, &el);
        double r = el > 0 ? (double)k / el : 0;
        best = r > best ? r : best;
    }
    return best;
}

static double dense_rate(hw_bench *b, jkind kind, pi2_qtype qt, int64_t jrows, int T, double pt, double *jobs_per_s)
{
    set_job(b, kind, qt, HW_NMAX, T, jrows);
    double jps = best_jobs_per_s(b, pt), rows = jps * (double)b->jrows;
    if (jobs_per_s)
        *jobs_per_s = jps;
    if (kind == J_MATMUL)
        return rows * (double)b->n * T;
    if (kind == J_SGEMV)
        return rows * (double)b->rb;
    return rows * (double)(b->rb + (size_t)(b->n / 32) * 2);
}

static double sparse_ns(hw_bench *b, jkind kind, pi2_qtype qt, int64_t n, double pt)
{
    set_job(b, kind, qt, n, 1, 2048);
    return 1e9 / (best_jobs_per_s(b, pt) * (double)b->jrows);
}

/* ---------------- storage ---------------- */

/* `count` random reads of `size` bytes at `depth` (the overlap figure's
 * fixed amount of I/O). */
static int read_n(pi2_io *io, uint64_t fsize, uint32_t size, int depth, int64_t count, uint8_t *buf, uint64_t *seed,
                  pi2_err *err)
{
    pi2_io_req req[HW_OVL_DEPTH], *free_r[HW_OVL_DEPTH], *done[HW_OVL_DEPTH];
    int n_free = 0, rc = 0;
    for (int i = 0; i < depth; i++) {
        req[i] = (pi2_io_req){ .len = size, .buf = buf + (size_t)i * size };
        free_r[n_free++] = &req[i];
    }
    uint64_t slots = (fsize - size) / PI2_IO_ALIGN + 1;
    int64_t issued = 0, finished = 0;
    while (rc == 0 && finished < count) {
        while (n_free > 0 && issued < count) {
            pi2_io_req *p = free_r[--n_free];
            p->off = xs64(seed) % slots * PI2_IO_ALIGN;
            if ((rc = pi2_io_submit(io, &p, 1, err)) != 0)
                break;
            issued++;
        }
        if (rc)
            break;
        int n = pi2_io_wait(io, 1, done, depth, err);
        if (n < 0) {
            rc = n;
            break;
        }
        for (int k = 0; k < n; k++) {
            if (done[k]->result < 0 && rc == 0)
                rc = err && err->code ? err->code : PI2_EIO;
            free_r[n_free++] = done[k];
            finished++;
        }
    }
    while (pi2_io_inflight(io) > 0) { /* after an error: drain */
        pi2_err de = { 0 };
        if (pi2_io_wait(io, 1, done, depth, &de) <= 0)
            break;
    }
    return rc;
}

typedef struct rd_thread {
    pi2_io *io;
    uint64_t fsize, seed;
    int64_t count;
    uint8_t *buf;
    double end;
    int rc;
    pi2_err err;
} rd_thread;

static void *rd_main(void *arg)
{
    rd_thread *r = arg;
    pi2_thread_raise_priority(PI2_IO_THREAD_NICE); /* as the offloading engine's reader */
    r->rc = read_n(r->io, r->fsize, HW_OVL_SIZE, HW_OVL_DEPTH, r->count, r->buf, &r->seed, &r->err);
    r->end = pi2_now();
    return NULL;
}

/* Create, fill and fsync the scratch file: a unique name in dir, removed
 * on failure. */
static int write_scratch(const char *dir, uint64_t bytes, char *path, size_t cap, pi2_err *err)
{
    struct statvfs vfs;
    if (!pi2_path_join(path, cap, dir, ".pi2-hwprof.XXXXXX"))
        return pi2_err_set(err, PI2_ERANGE, "%.400s: path too long for the scratch file", dir);
    if (statvfs(dir, &vfs) == 0 && (uint64_t)vfs.f_bavail * vfs.f_frsize < bytes + (64u << 20))
        return pi2_err_set(err, PI2_EIO, "%.400s: no space for a %llu MiB scratch file (%llu MiB free)", dir,
                           (unsigned long long)(bytes >> 20),
                           (unsigned long long)((uint64_t)vfs.f_bavail * vfs.f_frsize >> 20));
    int fd = mkostemp(path, O_CLOEXEC);
    if (fd < 0)
        return pi2_err_set(err, PI2_EIO, "%.400s: cannot create the scratch file: %s", path, strerror(errno));
    /* direct writes: faster than through the page cache (runtime/PERF.md),
     * and they leave nothing cached for the reads (buffered where refused) */
    int fl = fcntl(fd, F_GETFL);
    bool direct = fl >= 0 && fcntl(fd, F_SETFL, fl | O_DIRECT) == 0;
    uint64_t *buf = pi2_io_alloc_buf(HW_FILE_CHUNK);
    if (!buf) {
        close(fd);
        unlink(path);
        return pi2_err_set(err, PI2_ENOMEM, "%.400s: out of memory", path);
    }
    uint64_t seed = 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
    int rc = 0;
    for (uint64_t off = 0; off < bytes && rc == 0;) {
        size_t n = bytes - off < HW_FILE_CHUNK ? (size_t)(bytes - off) : HW_FILE_CHUNK;
        for (size_t i = 0; i < n / 8; i++)
            buf[i] = xs64(&seed);
        for (size_t done = 0; done < n;) {
            ssize_t w = write(fd, (const uint8_t *)buf + done, n - done);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0) {
                int e = w < 0 ? errno : ENOSPC;
                rc = pi2_err_set(err, PI2_EIO, "%.400s: cannot write the scratch file: %s", path, strerror(e));
                break;
            }
            done += (size_t)w;
        }
        off += n;
    }
    pi2_io_free_buf(buf);
    if (rc == 0 && fsync(fd) != 0)
        rc = pi2_err_set(err, PI2_EIO, "%.400s: cannot write the scratch file (fsync): %s", path, strerror(errno));
    if (rc == 0 && !direct)
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED); /* reads must come from the device */
    if (close(fd) != 0 && rc == 0)
        rc = pi2_err_set(err, PI2_EIO, "%.400s: cannot write the scratch file (close): %s", path, strerror(errno));
    if (rc)
        unlink(path);
    return rc;
}

void pi2_hw_logf(FILE *log, const char *fmt, ...)
{
    if (!log)
        return;
    va_list ap;
    va_start(ap, fmt);
    fputs("hwprof: ", log);
    vfprintf(log, fmt, ap);
    fputc('\n', log);
    fflush(log);
    va_end(ap);
}

static int grid_index(uint32_t size, int depth, int *si, int *di)
{
    *si = *di = -1;
    for (int s = 0; s < PI2_HW_NSIZES; s++)
        if (PI2_HW_IO_SIZES[s] == size)
            *si = s;
    for (int d = 0; d < PI2_HW_NDEPTHS; d++)
        if (PI2_HW_IO_DEPTHS[d] == depth)
            *di = d;
    return *si >= 0 && *di >= 0;
}

/* Everything measured at t threads into c (the storage figures are in). */
static int measure_threads(hw_bench *b, int t, double pt, pi2_io *io, uint64_t fsize, const pi2_hwprof *p,
                           pi2_hw_compute *c, pi2_err *err)
{
    int rc = pi2_pool_create(&b->pool, t, err);
    if (rc)
        return rc;
    b->nt = t;
    c->mem_bw = run_probe(b, J_BW, pt);
    c->int8_peak = run_probe(b, J_PEAK, pt);
    double q4_jobs_per_s = 0;
    c->gemv_q8 = dense_rate(b, J_GEMV, PI2_QT_Q8, HW_NMAX, 1, pt, NULL);
    c->gemv_q4 = dense_rate(b, J_GEMV, PI2_QT_Q4, HW_NMAX, 1, pt, &q4_jobs_per_s);
    c->matmul_q8 = dense_rate(b, J_MATMUL, PI2_QT_Q8, 512, HW_T, pt, NULL);
    c->matmul_q4 = dense_rate(b, J_MATMUL, PI2_QT_Q4, 512, HW_T, pt, NULL);
    c->sgemv = dense_rate(b, J_SGEMV, PI2_QT_F32, 1024, 1, pt, NULL);
    for (int l = 0; l < PI2_HW_NLEN; l++) {
        c->gather_q8_ns[l] = sparse_ns(b, J_GATHER, PI2_QT_Q8, PI2_HW_ROW_LENS[l], pt);
        c->gather_q4_ns[l] = sparse_ns(b, J_GATHER, PI2_QT_Q4, PI2_HW_ROW_LENS[l], pt);
        c->down_q8_ns[l] = sparse_ns(b, J_DOWN, PI2_QT_Q8, PI2_HW_ROW_LENS[l], pt);
        c->down_q4_ns[l] = sparse_ns(b, J_DOWN, PI2_QT_Q4, PI2_HW_ROW_LENS[l], pt);
    }

    /* overlap: fixed amounts of compute and of reads, each about pt alone */
    int si, di;
    grid_index(HW_OVL_SIZE, HW_OVL_DEPTH, &si, &di);
    int64_t n_reads = (int64_t)(p->io[si][di].iops * pt), n_jobs = (int64_t)(q4_jobs_per_s * pt);
    n_reads = n_reads < 2 * HW_OVL_DEPTH ? 2 * HW_OVL_DEPTH : n_reads;
    n_jobs = n_jobs < 1 ? 1 : n_jobs;
    uint8_t *buf = pi2_io_alloc_buf((size_t)HW_OVL_SIZE * HW_OVL_DEPTH);
    if (!buf) {
        pi2_pool_free(b->pool);
        b->pool = NULL;
        return pi2_err_set(err, PI2_ENOMEM, "hardware profile: out of memory for read buffers");
    }
    /* placed as the offloading engine places its threads: the reader on
     * the CPUs the compute threads leave free, if any (formats/pool.h) */
    pi2_cpus cpus;
    bool pinned = pi2_cpus_split(t, &cpus) && pi2_pool_pin(b->pool, &cpus.pool);
    pthread_attr_t attr;
    bool attr_ok = pthread_attr_init(&attr) == 0;
    if (attr_ok && pinned)
        pthread_attr_setaffinity_np(&attr, sizeof cpus.io, &cpus.io);
    set_job(b, J_GEMV, PI2_QT_Q4, HW_NMAX, 1, HW_NMAX);
    double tc, ti;
    run_jobs(b, 0, n_jobs, &tc);
    rd_thread rd = { .io = io, .fsize = fsize, .seed = 0x51ed270b27a9f3e1ull + (uint64_t)t, .count = n_reads,
                     .buf = buf };
    double t0 = pi2_now();
    rc = read_n(io, fsize, HW_OVL_SIZE, HW_OVL_DEPTH, n_reads, buf, &rd.seed, err);
    ti = pi2_now() - t0;
    if (rc == 0) {
        /* A thread of its own, not the pool: it is the I/O side whose
         * overlap with the compute jobs this step measures. */
        pthread_t th;
        t0 = pi2_now();
        int e = pthread_create(&th, attr_ok ? &attr : NULL, rd_main, &rd);
        if (e != 0) {
            rc = pi2_err_set(err, e == EAGAIN ? PI2_ENOMEM : PI2_EIO, "hardware profile: cannot start the I/O thread: %s",
                             strerror(e));
        } else {
            double tj;
            run_jobs(b, 0, n_jobs, &tj);
            double c_end = pi2_now();
            pthread_join(th, NULL);
            double tb = (rd.end > c_end ? rd.end : c_end) - t0;
            if (rd.rc)
                rc = pi2_err_set(err, rd.rc, "%s", rd.err.msg);
            double mn = tc < ti ? tc : ti, ov = mn > 0 ? (tc + ti - tb) / mn : 0;
            c->overlap = ov < 0 ? 0 : ov > 1 ? 1 : ov;
        }
    }
    if (attr_ok)
        pthread_attr_destroy(&attr);
    if (pinned) /* the workers go with the pool; the caller gets its mask back */
        pi2_thread_pin(pthread_self(), &cpus.all);
    pi2_io_free_buf(buf);
    pi2_pool_free(b->pool);
    b->pool = NULL;
    return rc;
}

static void bench_free(hw_bench *b)
{
    if (b->tls)
        for (int i = 0; i < PI2_HW_MAX_THREADS; i++)
            free(b->tls[i].out);
    free(b->tls);
    free(b->w);
    free(b->s);
    free(b->idx);
    free(b->x);
    free(b->ascale);
    free(b->aq);
    free(b->asum);
}

static int bench_init(hw_bench *b, pi2_err *err)
{
    uint64_t llc = llc_bytes();
    size_t wb = llc ? (size_t)(8 * llc) : ((size_t)256 << 20);
    wb = wb < ((size_t)64 << 20) ? ((size_t)64 << 20) : wb > ((size_t)256 << 20) ? ((size_t)256 << 20) : wb;
    b->wbytes = wb;
    b->ns = wb / 16; /* Q4 rows of 4096 need 2 scale bytes per 64 payload bytes */
    b->isa = pi2_k_get_isa();
    b->w = malloc(wb);
    b->s = pi2_malloc_array(b->ns, sizeof *b->s);
    b->idx = pi2_malloc_array(HW_NIDX, sizeof *b->idx);
    b->x = pi2_malloc_array((size_t)HW_T * HW_NMAX, sizeof *b->x);
    b->ascale = pi2_malloc_array((size_t)HW_T * HW_NMAX / 32, sizeof *b->ascale);
    b->aq = pi2_malloc_array((size_t)HW_T * HW_NMAX, sizeof *b->aq);
    b->asum = pi2_malloc_array((size_t)HW_T * HW_NMAX / 32, sizeof *b->asum);
    b->tls = calloc(PI2_HW_MAX_THREADS, sizeof *b->tls);
    bool ok = b->w && b->s && b->idx && b->x && b->ascale && b->aq && b->asum && b->tls;
    for (int i = 0; ok && i < PI2_HW_MAX_THREADS; i++)
        ok = (b->tls[i].out = pi2_calloc_array(HW_OUT, sizeof(float))) != NULL;
    if (!ok)
        return pi2_err_set(err, PI2_ENOMEM, "hardware profile: out of memory for %zu MiB of test weights", wb >> 20);
    fill_floats((uint32_t *)(void *)b->w, wb / 4, 0x243f6a8885a308d3ull);
    uint64_t s = 0x13198a2e03707344ull;
    for (size_t i = 0; i < b->ns; i++)
        b->s[i] = (uint16_t)(0x2000u | (xs64(&s) & 0x3ffu)); /* 2^-7 .. 2^-6 */
    for (size_t i = 0; i < HW_NIDX; i++)
        b->idx[i] = (uint32_t)(xs64(&s) >> 32);
    fill_floats((uint32_t *)(void *)b->x, (size_t)HW_T * HW_NMAX, 0xa4093822299f31d0ull);
    fill_floats((uint32_t *)(void *)b->coef, HW_CHUNK, 0x082efa98ec4e6c89ull);
    return 0;
}

/* The storage grid and the sequential figure into p. */
static int measure_storage(pi2_io *io, uint64_t fsize, double pt, pi2_hwprof *p, pi2_err *err)
{
    int rc = 0;
    for (int s = 0; s < PI2_HW_NSIZES && rc == 0; s++)
        for (int d = 0; d < PI2_HW_NDEPTHS && rc == 0; d++) {
            pi2_io_bench_result r;
            if ((rc = pi2_io_bench(io, PI2_HW_IO_SIZES[s], PI2_HW_IO_DEPTHS[d], false, pt, &r, err)) == 0)
                p->io[s][d] = (pi2_hw_io){ r.iops, r.bytes_per_s, r.lat_us };
        }
    pi2_io_bench_result sq;
    if (rc == 0 && (rc = pi2_io_bench(io, 1u << 20 < fsize ? 1u << 20 : (uint32_t)fsize, 8, true, 2 * pt, &sq, err)) == 0)
        p->seq_bps = sq.bytes_per_s;
    return rc;
}

/* Every figure of p rounded for the JSON (see tidy). */
static void tidy_profile(pi2_hwprof *p)
{
    for (int t = 0; t < p->threads; t++) {
        pi2_hw_compute *c = &p->compute[t];
        double *f[] = { &c->mem_bw, &c->int8_peak, &c->gemv_q8, &c->gemv_q4, &c->matmul_q8, &c->matmul_q4, &c->sgemv,
                        &c->overlap };
        for (size_t i = 0; i < sizeof f / sizeof *f; i++)
            *f[i] = tidy(*f[i]);
        for (int l = 0; l < PI2_HW_NLEN; l++) {
            c->gather_q8_ns[l] = tidy(c->gather_q8_ns[l]);
            c->gather_q4_ns[l] = tidy(c->gather_q4_ns[l]);
            c->down_q8_ns[l] = tidy(c->down_q8_ns[l]);
            c->down_q4_ns[l] = tidy(c->down_q4_ns[l]);
        }
    }
    for (int s = 0; s < PI2_HW_NSIZES; s++)
        for (int d = 0; d < PI2_HW_NDEPTHS; d++) {
            pi2_hw_io *x = &p->io[s][d];
            *x = (pi2_hw_io){ tidy(x->iops), tidy(x->bytes_per_s), tidy(x->lat_us) };
        }
    p->seq_bps = tidy(p->seq_bps);
}

int pi2_hwprof_measure(const pi2_hwprof_opts *o, pi2_hwprof *out, pi2_err *err)
{
    pi2_hwprof_opts def = { 0 };
    if (!o)
        o = &def;
    const char *dir = o->device_dir ? o->device_dir : ".";
    int threads = pi2_hw_resolve_threads(o->threads);
    if (threads < 1 || threads > PI2_HW_MAX_THREADS)
        return pi2_err_set(err, PI2_ERANGE, "hardware profile: %d threads is out of range (1..%d)", o->threads,
                           PI2_HW_MAX_THREADS);
    int file_mb = o->file_mb ? o->file_mb : HW_DEF_FILE_MB;
    if (file_mb < 1 || file_mb > HW_MAX_FILE_MB)
        return pi2_err_set(err, PI2_ERANGE, "hardware profile: scratch file of %d MiB is out of range (1..%d)",
                           o->file_mb, HW_MAX_FILE_MB);
    double pt = o->point_seconds;
    if (!(pt >= 0 && pt <= HW_MAX_POINT))
        return pi2_err_set(err, PI2_ERANGE, "hardware profile: %g seconds per measurement is out of range (0..%g)",
                           pt, HW_MAX_POINT);
    if (pt == 0) { /* 18 figures per thread count and 36 of storage, in about half a minute */
        pt = 30.0 / (18.0 * threads + 40.0);
        pt = pt < 0.05 ? 0.05 : pt > 0.2 ? 0.2 : pt;
    }
    if (strlen(dir) >= sizeof out->device)
        return pi2_err_set(err, PI2_ERANGE, "%.200s...: directory name too long", dir);
    struct stat st;
    if (stat(dir, &st) != 0)
        return pi2_err_set(err, PI2_EIO, "%.400s: cannot use as the device directory: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return pi2_err_set(err, PI2_EIO, "%.400s: not a directory (give the directory that holds the model)", dir);

    double t_start = pi2_now();
    pi2_hwprof p;
    memset(&p, 0, sizeof p);
    pi2_hwprof_cpu_name(p.cpu, sizeof p.cpu);
    snprintf(p.isa, sizeof p.isa, "%s", pi2_hw_isa_now());
    snprintf(p.device, sizeof p.device, "%s", dir);
    p.threads = threads;
    p.dev = (uint64_t)st.st_dev;

    char path[4200];
    uint64_t fsize = (uint64_t)file_mb << 20;
    pi2_hw_logf(o->log, "writing a %d MiB scratch file in %s", file_mb, dir);
    int rc = write_scratch(dir, fsize, path, sizeof path, err);
    if (rc)
        return rc;
    pi2_io_opts io_o;
    pi2_io_defaults(&io_o);
    io_o.depth = HW_IO_DEPTH;
    pi2_io *io = NULL;
    rc = pi2_io_open(&io, path, &io_o, err);
    unlink(path); /* the reader holds the file from here on */
    if (rc)
        return rc;
    snprintf(p.io_backend, sizeof p.io_backend, "%s", pi2_io_backend_name(pi2_io_backend_used(io)));

    pi2_hw_logf(o->log, "storage: random reads of 4K..256K at depths 1..64 (%s), %.2f s each", p.io_backend, pt);
    rc = measure_storage(io, fsize, pt, &p, err);

    hw_bench b;
    memset(&b, 0, sizeof b);
    if (rc == 0)
        rc = bench_init(&b, err);
    for (int t = 1; t <= threads && rc == 0; t++) {
        pi2_hw_logf(o->log, "compute: %d thread%s, %.2f s per figure", t, t > 1 ? "s" : "", pt);
        rc = measure_threads(&b, t, pt, io, fsize, &p, &p.compute[t - 1], err);
    }
    bench_free(&b);
    pi2_io_close(io);
    if (rc)
        return rc;
    tidy_profile(&p);
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(p.measured_at, sizeof p.measured_at, "%Y-%m-%dT%H:%M:%SZ", &tm);
    p.seconds = tidy(pi2_now() - t_start);
    pi2_hw_logf(o->log, "done in %.1f s", p.seconds);
    *out = p;
    return 0;
}
