/* pi2 direct I/O: aligned reads of one file that bypass the page cache.
 *
 * The file is opened with O_DIRECT; every read's offset, length and buffer
 * must be multiples of PI2_IO_ALIGN (a bundled container keeps every FFN
 * slot aligned: bundle/layout.h). Reads are asynchronous: submit requests,
 * then reap completions. Two backends:
 *   uring   io_uring through liburing, one ring of `depth` entries;
 *   pread   `threads` threads calling pread(2): the fallback when io_uring
 *           cannot be set up (old kernel, seccomp, ENOMEM for the ring) or
 *           when asked for; same semantics.
 * Backend "auto" tries uring first and falls back to pread, saying why in
 * pi2_io_backend_note.
 *
 * Failures are per request (req->result < 0 is a -errno) and are also
 * reported by pi2_io_wait as an error naming the file, offset and cause.
 * A short read is retried for the remainder; a read that hits end of file
 * (the file was truncated after open) fails with PI2_EIO "truncated". The
 * file's identity (device, inode, size) is recorded at open and
 * pi2_io_check reports a replaced or resized file.
 *
 * Fault injection (tests): pi2_io_inject makes the next matching reads
 * fail with an errno, come back short, or makes io_uring setup fail.
 *
 * Not thread-safe: one thread submits and reaps (the runtime's I/O
 * thread); the pread backend's own threads are internal.
 */
#ifndef PI2_IO_H
#define PI2_IO_H

#include "formats/common.h"

#include <stdint.h>

#define PI2_IO_ALIGN 4096u

typedef enum pi2_io_backend {
    PI2_IO_AUTO = 0,
    PI2_IO_URING = 1,
    PI2_IO_PREAD = 2,
} pi2_io_backend;

typedef struct pi2_io_opts {
    pi2_io_backend backend; /* default auto */
    int depth;              /* requests in flight (default 64, 1..4096) */
    int threads;            /* pread backend threads (default 4, 1..64) */
    bool buffered;          /* no O_DIRECT (filesystems without it; tests) */
} pi2_io_opts;

typedef struct pi2_io_req {
    uint64_t off;  /* file offset, aligned */
    uint32_t len;  /* bytes, aligned, > 0 */
    void *buf;     /* aligned, len bytes */
    void *user;    /* caller's tag */
    int32_t result; /* after completion: len, or -errno */
    uint32_t done; /* bytes read so far (internal for retries) */
} pi2_io_req;

typedef struct pi2_io pi2_io;

void pi2_io_defaults(pi2_io_opts *o);
/* Open path for direct reads. PI2_EIO (open/stat failure, naming the
 * path), PI2_ENOMEM. */
int pi2_io_open(pi2_io **out, const char *path, const pi2_io_opts *o, pi2_err *err);
/* Waits for requests in flight, then closes. NULL is a no-op. */
void pi2_io_close(pi2_io *io);
/* Register n (1 .. PI2_IO_MAX_FIXED) buffers [bufs[i], bufs[i] + lens[i])
 * with the ring, replacing any registered before: a later read wholly
 * inside one of them goes as a fixed-buffer read, whose pages the kernel
 * pinned once instead of at every read (less CPU a read: runtime/PERF.md). Advisory:
 * false when nothing was registered (pread backend, reads in flight, the
 * locked-memory limit, an old kernel), and reads work the same either way.
 * The buffers must stay allocated until pi2_io_close or the next call. */
enum { PI2_IO_MAX_FIXED = 8 };
bool pi2_io_register(pi2_io *io, void *const *bufs, const size_t *lens, int n);
pi2_io_backend pi2_io_backend_used(const pi2_io *io);
/* Why the backend is what it is (e.g. "io_uring unavailable: ...");
 * empty when the requested one was used. */
const char *pi2_io_backend_note(const pi2_io *io);
const char *pi2_io_backend_name(pi2_io_backend b);

/* Queue n requests (each checked for alignment and range: PI2_EINVAL;
 * PI2_ERANGE when more than `depth` would be in flight). Nothing is queued
 * on error. */
int pi2_io_submit(pi2_io *io, pi2_io_req *const *reqs, int n, pi2_err *err);
/* Reap completions: waits until at least min_done have completed (0:
 * don't wait), stores up to max of them in done[] and returns how many
 * (>= 0). A failed request is returned like the others with result < 0;
 * the first failure is also written to err (file, offset, cause) so the
 * caller can stop with a clear message. */
int pi2_io_wait(pi2_io *io, int min_done, pi2_io_req **done, int max, pi2_err *err);
/* pi2_io_wait that gives up after timeout_us microseconds without
 * min_done completions, returning what it has (possibly 0). */
int pi2_io_wait_timeout(pi2_io *io, int min_done, pi2_io_req **done, int max, long timeout_us, pi2_err *err);
/* Requests submitted and not yet reaped. */
int pi2_io_inflight(const pi2_io *io);

/* Synchronous read through the same path (start-up loads). */
int pi2_io_read(pi2_io *io, void *buf, uint64_t off, uint32_t len, pi2_err *err);

/* PI2_EIO when the file at the path is no longer the one opened (another
 * inode, or another size). */
int pi2_io_check(const pi2_io *io, pi2_err *err);

/* PI2_EIO when the open file (this descriptor, whatever is at the path now)
 * no longer has the size it had at open: truncated or grown in place. */
int pi2_io_check_size(const pi2_io *io, pi2_err *err);

/* Aligned buffer (PI2_IO_ALIGN) for reads; free with pi2_io_free_buf. NULL
 * when out of memory. From 4 MiB on it starts on a 2 MiB boundary and its
 * whole 2 MiB pages are advised huge (MADV_HUGEPAGE). */
void *pi2_io_alloc_buf(size_t n);
void pi2_io_free_buf(void *p);
/* Fault in n buffers (bufs[i], lens[i] bytes) for writing, on up to
 * `threads` threads (PI2_IO_PREFAULT_MAX at most), keeping their contents;
 * first(arg), when first is not NULL, runs on the calling thread before it
 * joins the helpers (work to overlap with the faults).
 * Memory fresh from the system costs a page fault and the kernel's zeroing
 * per page at first touch; a direct read into it takes those faults one by
 * one in the reading thread. Under a hypervisor that backs guest memory
 * lazily that is 0.4-0.55 GB/s on one thread here, 0.8 on two. Best
 * effort: a helper thread that cannot start leaves its share to the
 * caller. */
#define PI2_IO_PREFAULT_MAX 16
void pi2_io_prefault(uint8_t *const *bufs, const uint64_t *lens, int n, int threads, void (*first)(void *), void *arg);

/* ---- storage probe ---- */
typedef struct pi2_io_bench_result {
    uint64_t reads, bytes;
    double seconds;
    double bytes_per_s, iops;
    double lat_us; /* mean time from submit to completion */
    double cpu_us; /* process CPU time per read (submitting, reaping, the
                      kernel's part charged to the process) */
} pi2_io_bench_result;
/* Random aligned reads of `size` bytes over the whole file (or one pass of
 * sequential reads when sequential), `depth` in flight, for about `seconds`.
 * size a multiple of PI2_IO_ALIGN and at most the file size; depth at most
 * the reader's. PI2_EINVAL for bad sizes; read errors as pi2_io_wait. */
int pi2_io_bench(pi2_io *io, uint32_t size, int depth, bool sequential, double seconds, pi2_io_bench_result *out,
                 pi2_err *err);

/* ---- fault injection (tests) ---- */
typedef enum pi2_io_fault {
    PI2_IO_FAULT_NONE = 0,
    PI2_IO_FAULT_ERRNO = 1,   /* the read fails with `errnum` */
    PI2_IO_FAULT_SHORT = 2,   /* the read returns half its length (retried) */
    PI2_IO_FAULT_NO_URING = 3 /* io_uring setup fails (process-wide, at open) */
} pi2_io_fault;
/* Apply `fault` to the next `count` reads (after skipping `after` reads),
 * process-wide; count 0 clears. */
void pi2_io_inject(pi2_io_fault fault, int errnum, int after, int count);

#endif
