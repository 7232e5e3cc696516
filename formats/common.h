/* pi2 common: error codes, error messages, checked size arithmetic,
 * half-precision conversions, a bounded read cursor, read-only file
 * mappings and atomic file writers.
 *
 * Every library function in pi2 returns 0 or a negative PI2_E* code and, when
 * given a non-NULL pi2_err, fills it with a one-line message that names the
 * file (or object) and the problem. Library code never exits or aborts on bad
 * input; only a tool's main turns an error into a message and exit status.
 */
#ifndef PI2_COMMON_H
#define PI2_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum {
    PI2_OK = 0,
    PI2_EINVAL = -1,       /* bad argument or flag */
    PI2_EIO = -2,          /* read/write/open failed (errno-level) */
    PI2_EFORMAT = -3,      /* malformed or hostile file contents */
    PI2_ENOMEM = -4,       /* allocation failed */
    PI2_ERANGE = -5,       /* size/count/index out of range or overflow */
    PI2_EUNSUPPORTED = -6, /* well-formed but not supported (dtype, arch) */
    PI2_ENOTFOUND = -7,    /* missing file, tensor, token, key */
    PI2_ESHAPE = -8,       /* tensor shape does not match the model */
    PI2_ESIG = -9,         /* signature or digest does not verify */
    PI2_ENOSPC = -10,      /* disk full */
    PI2_EEXIST = -11,      /* the output exists (a tool may offer to replace it) */
};

/* Message buffer filled by failing functions. `code` repeats the return value. */
typedef struct pi2_err {
    int code;
    char msg[512];
} pi2_err;

/* Name of an error code ("format error", ...). Never NULL. */
const char *pi2_strerror(int code);

/* Fill *e (if non-NULL) with code and a printf-style message; returns code.
 * The first error set wins: later calls do not overwrite a set message, so a
 * low-level cause is not replaced by a vaguer caller message. */
int pi2_err_set(pi2_err *e, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Like pi2_err_set but appends ": strerror(errnum)"; maps ENOSPC/EDQUOT to
 * PI2_ENOSPC and ENOMEM to PI2_ENOMEM, other errnos to `code`. */
int pi2_err_errno(pi2_err *e, int code, int errnum, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Reset to "no error". */
void pi2_err_clear(pi2_err *e);

/* Overflow-checked size arithmetic: return false on overflow. */
static inline bool pi2_mul_size(size_t a, size_t b, size_t *out) { return !__builtin_mul_overflow(a, b, out); }
static inline bool pi2_add_size(size_t a, size_t b, size_t *out) { return !__builtin_add_overflow(a, b, out); }

/* Allocation helpers: NULL on overflow or failure (never abort). */
void *pi2_malloc_array(size_t n, size_t size);
void *pi2_calloc_array(size_t n, size_t size);
char *pi2_strdup(const char *s);
/* Make room for element n of the growable array *arr (capacity *cap
 * elements of `elem` bytes): when n == *cap, doubles the capacity (at least
 * `min_cap`) with realloc. *arr and *cap change only on success.
 * 0, or PI2_ENOMEM (also on size overflow). `arr` is a pointer to the array
 * pointer (void * to accept any element type). */
int pi2_grow(void *arr, size_t *cap, size_t n, size_t elem, size_t min_cap);

/* ---- half precision ---- */
float pi2_f16_to_f32(uint16_t h);
uint16_t pi2_f32_to_f16(float f);  /* round to nearest even, saturates to inf */
static inline float pi2_bf16_to_f32(uint16_t b) {
    union { uint32_t u; float f; } v = { .u = (uint32_t)b << 16 };
    return v.f;
}
/* Round to nearest even; NaN stays NaN. Inline: used per element in hot loops. */
static inline uint16_t pi2_f32_to_bf16(float f)
{
    union { float f; uint32_t u; } v = { .f = f };
    if ((v.u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((v.u >> 16) | 0x40); /* quiet NaN */
    uint32_t rounding = 0x7fff + ((v.u >> 16) & 1);
    return (uint16_t)((v.u + rounding) >> 16);
}

/* ---- bounded cursor: every read spends from the remaining budget ---- */
typedef struct pi2_cursor {
    const uint8_t *p;
    size_t left;
} pi2_cursor;

/* Take n bytes: sets *out and advances; false (cursor unchanged) if short. */
bool pi2_cursor_take(pi2_cursor *c, size_t n, const uint8_t **out);
bool pi2_cursor_u32le(pi2_cursor *c, uint32_t *v);
bool pi2_cursor_u64le(pi2_cursor *c, uint64_t *v);

/* ---- read-only whole-file mapping ---- */
typedef struct pi2_map {
    const uint8_t *data; /* NULL when size == 0 */
    size_t size;
} pi2_map;

/* Map `path` read-only. Empty files give data == NULL, size == 0.
 * Release with pi2_map_close (no-op on a zeroed map). */
int pi2_map_open(pi2_map *m, const char *path, pi2_err *err);
void pi2_map_close(pi2_map *m);

/* The guard of mappings whose file shrinks under them (formats/mapguard.c).
 * A file truncated while mapped makes every read of a page past its new
 * end a SIGBUS, which ends the process without a word. Once a tool calls
 * pi2_map_guard_install (once, early, in main: it sets the process's SIGBUS
 * handler), such a read in a mapping of pi2_map_open reads a page of
 * zeros instead and marks the mapping; the mapping's owner asks
 * pi2_map_changed after each piece of work that read it and discards the
 * result when true. Without the install, a SIGBUS ends the process as
 * before. At most 64 mappings at once are guarded (more go unguarded).
 * A SIGBUS outside the mappings goes to the handler installed before.
 * PI2_EIO when the handler cannot be set. */
int pi2_map_guard_install(pi2_err *err);
bool pi2_map_changed(const pi2_map *m);
/* pi2_map_open / pi2_map_close register and release the mapping. */
void pi2_map_guard_add(const pi2_map *m);
void pi2_map_guard_remove(const pi2_map *m);

/* Read a whole (small) file into a NUL-terminated heap buffer of at most
 * `max_bytes`; caller frees *out. */
int pi2_read_file(const char *path, size_t max_bytes, char **out, size_t *len, pi2_err *err);

/* ---- atomic writer: temp file in the target directory, fsync, rename ---- */
typedef struct pi2_afile pi2_afile;

/* Create "<path>.tmp.XXXXXX" next to path. Caller owns the writer and must end
 * it with pi2_afile_commit (rename into place) or pi2_afile_abort (unlink). */
int pi2_afile_open(pi2_afile **out, const char *path, pi2_err *err);
/* Write all n bytes (retries short writes and EINTR). ENOSPC -> PI2_ENOSPC.
 * Written behind in 64 MiB windows: a window is sent to the disk once
 * written, and leaves the page cache once the next one is (the cache holds
 * ~two windows of the file, whose pages it reuses instead of faulting in
 * fresh memory per page; figures in runtime/PERF.md, "Bundler"). */
int pi2_afile_write(pi2_afile *f, const void *buf, size_t n, pi2_err *err);
/* Bytes written so far. */
uint64_t pi2_afile_size(const pi2_afile *f);
/* The file descriptor, for pwrite/ftruncate by callers that need them. */
int pi2_afile_fd(const pi2_afile *f);
/* fsync, drop the file's pages from the page cache (a reader then caches
 * it afresh, in 2 MiB pages where it maps it so), close, rename onto the
 * final path, fsync the directory; frees f. On failure the temp file is
 * removed. */
int pi2_afile_commit(pi2_afile *f, pi2_err *err);
/* Close and unlink the temp file; frees f. NULL is a no-op. */
void pi2_afile_abort(pi2_afile *f);

/* Test hook: after this many more bytes are written through any pi2_afile,
 * writes fail with ENOSPC (simulated full disk). Negative disables. */
void pi2_afile_fail_after(int64_t bytes);

/* ---- atomic directory: a temporary sibling renamed into place ----
 * pi2_dir_begin refuses an existing `dir`, creates "<dir>.tmp.XXXXXX"
 * (mode 0755) and puts its path in tmp (cap >= strlen(dir) + 12).
 * pi2_dir_commit renames it onto dir; pi2_dir_abort removes it and the files
 * directly inside it (callers write flat directories). */
int pi2_dir_begin(const char *dir, char *tmp, size_t cap, pi2_err *err);
int pi2_dir_commit(const char *tmp, const char *dir, pi2_err *err);
void pi2_dir_abort(const char *tmp);

/* ---- the output rule (formats/output.c) ----
 * Every tool checks its output with pi2_out_check before any long stage.
 * `out` is refused when it resolves to one of the n_inputs (NULL entries
 * skipped): the same file (device and inode, or the same resolved path)
 * or a path inside an input directory; when it is an existing directory, or
 * with PI2_OUT_DIR (a directory output) when it exists at all; when it is
 * an existing file and PI2_OUT_FORCE is not given, or not a regular file;
 * when its directory is missing or not writable; and when need_bytes > 0
 * and its file system has less free space than that. Then stale
 * temporaries of `out` are removed (pi2_tmp_sweep). 0, or PI2_EINVAL,
 * PI2_ENOTFOUND, PI2_EIO or PI2_ENOSPC with a message that names `out` and
 * what to do. */
enum { PI2_OUT_FORCE = 1, PI2_OUT_DIR = 2 };
int pi2_out_check(const char *out, const char *const *inputs, size_t n_inputs, unsigned flags, uint64_t need_bytes,
                  pi2_err *err);

/* ---- temporary outputs: removed on a signal, swept after a kill ----
 * pi2_afile_* and pi2_dir_* hold an flock on each temporary while it is
 * written and register its path; pi2_tmp_cleanup_on_signals (called once by
 * a tool's main) installs handlers for SIGINT, SIGTERM and SIGHUP (where they
 * are not ignored or handled already) that remove the registered
 * temporaries and then die of the signal as before. A kill -9 leaves them:
 * pi2_tmp_sweep(path) removes the "<path>.tmp.XXXXXX" siblings whose lock
 * is free (their writer is gone), saying so on stderr; pi2_afile_open,
 * pi2_dir_begin and pi2_out_check call it. Returns how many it removed.
 * The registry is process-wide (a signal handler reaches nothing else):
 * pi2_tmp_register returns a slot (-1 when full: the file is then only not
 * removed on a signal), pi2_tmp_unregister(slot) frees it (-1: no-op). */
void pi2_tmp_cleanup_on_signals(void);
int pi2_tmp_sweep(const char *path);
int pi2_tmp_register(const char *path, int fd, bool is_dir);
void pi2_tmp_unregister(int slot);
int pi2_tmp_find(const char *path); /* the live slot of path, or -1 */
int pi2_tmp_fd(int slot);           /* the descriptor given at registration */

/* A tool's last word: flush and close stdout, so that a write that failed
 * (a full disk, /dev/full) is an error, not a silent exit 0. Prints
 * "TOOL: cannot write to standard output: ERR" when rc is 0 (a failure
 * already reported keeps its message) and returns the exit status: rc, or
 * 1 when it was 0 and stdout failed. */
int pi2_exit_stdout(const char *tool, int rc);

/* A tool's getopt_long (run with opterr = 0 and an optstring that starts
 * with ':') returned c, '?' or ':': print "TOOL: unknown option '--x'; see
 * --help" (or "option '-n' needs a value"), one line, no path. Returns 2. */
int pi2_cli_bad_option(const char *tool, char **argv, int c);
/* A tool that replaces an existing output on request: the refusal of
 * pi2_out_check (PI2_EEXIST) gets " (--force replaces it)" appended; any
 * other error is left as it is. */
void pi2_cli_force_hint(pi2_err *e);

/* Join dir and name into buf ("dir/name"); false if it does not fit. */
/* The value of hex digit ch (either case), or -1. */
int pi2_hex_digit(char ch);
/* fsync the directory holding path (a rename into it made durable);
 * advisory: failures are ignored. */
void pi2_fsync_dir_of(const char *path);
bool pi2_path_join(char *buf, size_t cap, const char *dir, const char *name);
bool pi2_is_dir(const char *path);

/* Deterministic PRNG (splitmix64 seeding + xoshiro256**). No global state. */
typedef struct pi2_rng {
    uint64_t s[4];
} pi2_rng;
void pi2_rng_seed(pi2_rng *r, uint64_t seed);
uint64_t pi2_rng_u64(pi2_rng *r);
double pi2_rng_uniform(pi2_rng *r); /* [0, 1) */
double pi2_rng_normal(pi2_rng *r);  /* standard normal (Box-Muller) */

/* Strict number parsing for flags: the whole string must be a number in
 * [lo, hi]; PI2_EINVAL with a message naming `flag` otherwise. Sizes accept
 * a K/M/G/T suffix (powers of 1024) and an optional trailing "B"/"iB". */
int pi2_parse_int(const char *flag, const char *s, long long lo, long long hi, long long *out, pi2_err *err);
int pi2_parse_double(const char *flag, const char *s, double lo, double hi, double *out, pi2_err *err);
int pi2_parse_size(const char *flag, const char *s, uint64_t *out, pi2_err *err);

/* Monotonic seconds. */
double pi2_now(void);
/* Peak resident set size of this process in bytes (from /proc), 0 if unknown. */
uint64_t pi2_peak_rss(void);

#endif
