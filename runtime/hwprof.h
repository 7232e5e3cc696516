/* pi2 hardware profile: what this machine does with pi2's own kernels and
 * with the storage that holds the model, measured once and cached as JSON.
 * The planner (runtime/planner.h) turns it, with a model profile, into
 * predicted speeds.
 *
 * ---- What is measured (pi2_hwprof_measure, under a minute) ----
 * For every compute thread count t in 1..threads (work split with the
 * runtime's pool, buffers far larger than the last-level cache, weights
 * random so nothing is skipped):
 *   mem_bw        read bandwidth, bytes/s (pi2_k_probe_read_bw per thread);
 *   int8_peak     int8 multiply-accumulates/s (pi2_k_probe_int8_peak);
 *   gemv          dense matrix x one token (pi2_k_matmul, T = 1) over
 *                 contiguous rows, weight bytes/s, for Q8 and Q4 (decode:
 *                 attention, output head; --dense FFN);
 *   matmul        dense matrix x 64 tokens (pi2_k_matmul, T = 64), int8
 *                 MACs/s, Q8 and Q4 (prefill);
 *   sgemv         f32 matrix x vector (pi2_k_sgemv), weight bytes/s
 *                 (predictors);
 *   gather        sparse rows: pi2_k_matmul (T = 1) over rows picked at
 *                 random from a large matrix, ns per row, Q8 and Q4, at two
 *                 row lengths n = 1024 and 4096 (the cost model fits a + b n);
 *   down          pi2_k_down_rows (T = 1) over random rows, ns per row, same
 *                 grid;
 *   overlap       how well compute hides reads: compute alone (gemv Q4 on t
 *                 threads) for Tc, reads alone (16 KiB random O_DIRECT reads
 *                 at depth 32 on the storage file, one I/O thread) for Ti,
 *                 then both at once for Tb, the I/O thread placed as the
 *                 offloading engine places it (on the CPUs the t compute
 *                 threads leave free, when there are any); overlap =
 *                 clamp((Tc + Ti - Tb) / min(Tc, Ti), 0, 1): 1 = fully
 *                 hidden, 0 = serialised.
 * Storage, on a scratch file of `file_mb` MiB written (and fsynced) in
 * device_dir and removed after, every read O_DIRECT through runtime/offload/io.h:
 *   io[s][d]      random reads of PI2_HW_IO_SIZES[s] bytes at depth
 *                 PI2_HW_IO_DEPTHS[d] (one I/O thread, io_uring or the pread
 *                 fallback): IOPS, bytes/s, mean latency;
 *   seq_bps       sequential 1 MiB reads at depth 8.
 *
 * ---- Cache ----
 * pi2_hwprof_get returns the profile cached at `path` when it matches this
 * machine (same cpu string and isa, measured up to at least the thread
 * count asked for, and the device of device_dir) and measures, then saves, otherwise. Default path:
 *   $PI2_HW_PROFILE, else ${XDG_CACHE_HOME:-$HOME/.cache}/pi2/hw-<dev>.json
 * where <dev> is the hex st_dev of device_dir. Saving is atomic
 * (temporary file, fsync, rename).
 *
 * ---- JSON (version 1), keys in this order ----
 * { "version": 1, "cpu": str, "isa": str, "threads": int, "device": str
 *   (device_dir), "dev": int (st_dev), "io_backend": str,
 *   "measured_at": str (UTC ISO 8601), "seconds": number,
 *   "compute": [ { "threads": t, "mem_bw": x, "int8_peak": x,
 *                  "gemv_q8": x, "gemv_q4": x, "matmul_q8": x,
 *                  "matmul_q4": x, "sgemv": x,
 *                  "gather_q8_ns": [n1024, n4096], "gather_q4_ns": [..],
 *                  "down_q8_ns": [..], "down_q4_ns": [..],
 *                  "overlap": x }, ... ]            (t = 1..threads),
 *   "storage": { "random": [ { "size": s, "depth": d, "iops": x,
 *                              "bytes_per_s": x, "lat_us": x }, ... ]
 *                          (size-major over the grid below),
 *                "seq_bps": x } }
 * pi2_hwprof_load refuses anything else (exact keys, types, grid, every
 * number finite and > 0, overlap in [0, 1]) with PI2_EFORMAT / PI2_ERANGE
 * naming the file and the JSON path.
 */
#ifndef PI2_HWPROF_H
#define PI2_HWPROF_H

#include "formats/common.h"

#include <stdint.h>
#include <stdio.h>

#define PI2_HW_VERSION 1
#define PI2_HW_MAX_THREADS 16
#define PI2_HW_NSIZES 7
#define PI2_HW_NDEPTHS 5
/* Request sizes (4 KiB .. 256 KiB) and queue depths of the storage grid. */
extern const uint32_t PI2_HW_IO_SIZES[PI2_HW_NSIZES];  /* 4K 8K 16K 32K 64K 128K 256K */
extern const int PI2_HW_IO_DEPTHS[PI2_HW_NDEPTHS];     /* 1 4 16 32 64 */
#define PI2_HW_NLEN 2
extern const int PI2_HW_ROW_LENS[PI2_HW_NLEN]; /* 1024 4096 */

typedef struct pi2_hw_compute {
    double mem_bw, int8_peak;
    double gemv_q8, gemv_q4;     /* weight bytes/s */
    double matmul_q8, matmul_q4; /* int8 MACs/s, 64 tokens */
    double sgemv;                /* f32 weight bytes/s */
    double gather_q8_ns[PI2_HW_NLEN], gather_q4_ns[PI2_HW_NLEN]; /* ns per row at PI2_HW_ROW_LENS */
    double down_q8_ns[PI2_HW_NLEN], down_q4_ns[PI2_HW_NLEN];
    double overlap; /* [0, 1] */
} pi2_hw_compute;

typedef struct pi2_hw_io {
    double iops, bytes_per_s, lat_us;
} pi2_hw_io;

typedef struct pi2_hwprof {
    char cpu[128], isa[16], device[1024], io_backend[16], measured_at[32];
    int threads; /* compute[0 .. threads-1] hold t = 1 .. threads */
    uint64_t dev;
    double seconds;
    pi2_hw_compute compute[PI2_HW_MAX_THREADS];
    pi2_hw_io io[PI2_HW_NSIZES][PI2_HW_NDEPTHS];
    double seq_bps;
} pi2_hwprof;

typedef struct pi2_hwprof_opts {
    int threads;            /* 1..PI2_HW_MAX_THREADS (0: online CPUs, capped) */
    const char *device_dir; /* where the model lives (NULL: ".") */
    int file_mb;            /* scratch file size (0: 1024) */
    double point_seconds;   /* per measurement (0: default, so the whole run stays under a minute) */
    FILE *log;              /* progress lines, or NULL */
} pi2_hwprof_opts;

/* Measure everything above. PI2_EIO (scratch file: cannot create, write,
 * or no space, naming it; it is removed on every path), PI2_ENOMEM,
 * PI2_ERANGE (bad threads). */
int pi2_hwprof_measure(const pi2_hwprof_opts *o, pi2_hwprof *out, pi2_err *err);
/* Write / read the JSON above. save is atomic. */
int pi2_hwprof_save(const pi2_hwprof *p, const char *path, pi2_err *err);
int pi2_hwprof_load(const char *path, pi2_hwprof *out, pi2_err *err);
/* The default cache path for device_dir (see above) into buf. PI2_EIO when
 * device_dir cannot be stat'ed, PI2_ERANGE when it does not fit. */
int pi2_hwprof_default_path(const char *device_dir, char *buf, size_t n, pi2_err *err);
/* Does a loaded profile describe this machine for these options? (cpu,
 * isa, threads at most the profile's, dev of device_dir). */
bool pi2_hwprof_matches(const pi2_hwprof *p, const pi2_hwprof_opts *o);
/* Load from path (NULL: default path) when it matches, else measure and
 * save there (when measure is true; otherwise PI2_ENOTFOUND "no hardware
 * profile at PATH", or that it does not describe this setup, and a
 * profile that cannot be read fails with its own error). *measured tells
 * which. */
int pi2_hwprof_get(const pi2_hwprof_opts *o, const char *path, bool measure, pi2_hwprof *out, bool *measured,
                   pi2_err *err);

/* This machine's cpu string as profiles record it: the first "model name"
 * of /proc/cpuinfo, trimmed; "unknown" without one. */
void pi2_hwprof_cpu_name(char *dst, size_t cap);

/* Interpolation helpers for the cost model. */
/* Random-read figures at request size `size` (bytes, log-linear between
 * grid sizes, clamped at the ends) and depth (nearest grid depth not above
 * it, at least the smallest); IOPS and bytes/s are the best measured at
 * that depth or any shallower one (non-decreasing in depth). */
pi2_hw_io pi2_hwprof_io_at(const pi2_hwprof *p, uint32_t size, int depth);
/* Compute figures for t threads (clamped to 1..threads). */
const pi2_hw_compute *pi2_hwprof_compute(const pi2_hwprof *p, int t);
/* ns per sparse row of length n from a two-point fit (a + b n, clamped so
 * it never goes below zero). */
double pi2_hwprof_row_ns(const double ns[PI2_HW_NLEN], int64_t n);

#endif
