/* model.pi2 container: written with libarchive, read by our own ustar parser.
 *
 * Why our own reader: the runtime needs the exact file offset of each
 * member's data (mmap + O_DIRECT) and a strict verdict on hostile input.
 * libarchive's reader streams entries, reports only where a header starts
 * (archive_read_header_position) and is lenient by design (GNU, pax, old
 * formats, recovery from damage). A 512-byte ustar header is simple enough to
 * validate completely through a bounded cursor.
 *
 * Why the writer can predict offsets: in plain ustar (no pax/GNU extension
 * headers, which short names and sizes below 8 GiB never trigger) every
 * member is exactly one 512-byte header plus its data rounded up to 512.
 * The writer keeps that running position itself and inserts a padding member
 * whenever the next header would not sit 512 bytes before a 4 KiB boundary.
 * libarchive blocks its output in 4096-byte records and pads the last one,
 * which 4 KiB-aligns the end of the file. finish() cross-checks the predicted
 * size against the bytes actually written. */
#include "formats/container.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <archive.h>
#include <archive_entry.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK 512u
_Static_assert(PI2_CTR_ALIGN % BLOCK == 0, "alignment must be a multiple of the tar block");
_Static_assert(PI2_CTR_ALIGN <= 32768, "libarchive block size");

/* ustar header fields: offset, length */
enum {
    H_NAME = 0, H_NAME_LEN = 100,
    H_MODE = 100, H_UID = 108, H_GID = 116, H_ID_LEN = 8,
    H_SIZE = 124, H_SIZE_LEN = 12,
    H_MTIME = 136, H_MTIME_LEN = 12,
    H_CHKSUM = 148, H_CHKSUM_LEN = 8,
    H_TYPE = 156,
    H_MAGIC = 257, H_VERSION = 263,
    H_PREFIX = 345, H_PREFIX_LEN = 155,
};
_Static_assert(PI2_CTR_NAME_MAX == H_NAME_LEN, "names fit the ustar name field");

static const uint8_t zeros[PI2_CTR_ALIGN];

static uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/* NULL if name is acceptable for a member (padding or not), else why not. */
static const char *name_problem(const char *name, size_t len)
{
    if (len == 0)
        return "empty name";
    if (len >= PI2_CTR_NAME_MAX)
        return "name is 100 bytes or longer (plain ustar headers only)";
    if (name[0] == '/')
        return "absolute name";
    if (name[len - 1] == '/')
        return "name ends with '/'";
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)name[i] < 0x21 || (unsigned char)name[i] > 0x7e)
            return "name has a byte outside printable ASCII (or a space)";
    for (size_t i = 0; i < len;) {
        size_t j = i;
        while (j < len && name[j] != '/')
            j++;
        size_t cl = j - i;
        if (cl == 0 || (cl == 1 && name[i] == '.') || (cl == 2 && name[i] == '.' && name[i + 1] == '.'))
            return "name has an empty, '.' or '..' path component";
        i = j + 1;
    }
    return NULL;
}

static bool is_pad_name(const char *name)
{
    return strncmp(name, PI2_CTR_PAD_PREFIX, sizeof PI2_CTR_PAD_PREFIX - 1) == 0;
}

/* ---- name index: open addressing over indices into the caller's array ---- */

typedef const char *(*name_of_fn)(const void *ctx, uint32_t i);

typedef struct name_index {
    uint32_t *slot; /* index + 1; 0 = empty */
    size_t cap;     /* power of two, or 0 */
} name_index;

static uint64_t name_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* Index of name, or -1. */
static int64_t nidx_find(const name_index *x, const char *name, name_of_fn f, const void *ctx)
{
    if (x->cap == 0)
        return -1;
    for (size_t k = (size_t)name_hash(name) & (x->cap - 1);; k = (k + 1) & (x->cap - 1)) {
        if (x->slot[k] == 0)
            return -1;
        if (strcmp(f(ctx, x->slot[k] - 1), name) == 0)
            return x->slot[k] - 1;
    }
}

static void nidx_put(name_index *x, uint32_t i, name_of_fn f, const void *ctx)
{
    size_t k = (size_t)name_hash(f(ctx, i)) & (x->cap - 1);
    while (x->slot[k] != 0)
        k = (k + 1) & (x->cap - 1);
    x->slot[k] = i + 1;
}

/* Make room for n entries (load <= 1/2), re-inserting indices 0..n-1 if the
 * table grows. */
static bool nidx_reserve(name_index *x, size_t n, name_of_fn f, const void *ctx)
{
    if (n * 2 <= x->cap)
        return true;
    size_t cap = 64;
    while (cap < n * 2)
        cap *= 2;
    uint32_t *s = pi2_calloc_array(cap, sizeof *s);
    if (!s)
        return false;
    free(x->slot);
    x->slot = s;
    x->cap = cap;
    for (size_t i = 0; i + 1 < n; i++) /* entry n-1 is about to be inserted */
        nidx_put(x, (uint32_t)i, f, ctx);
    return true;
}

/* ======================= writer ======================= */

enum { W_IDLE, W_MEMBER, W_DONE };

struct pi2_ctr_writer {
    char *path;
    pi2_afile *af;
    struct archive *ar;
    pi2_sha256_ctx *sha;
    int state;
    bool discard; /* write callback drops output (failed or abandoned) */
    pi2_err fail; /* sticky error; fail.code != 0 once failed */
    pi2_err io;   /* set by the write callback */
    uint64_t pos; /* predicted offset of the next header */
    uint32_t npad;
    char cur_name[PI2_CTR_NAME_MAX];
    uint64_t cur_off, cur_size, cur_done;
    pi2_ctr_section *secs;
    size_t nsec, capsec;
    name_index idx;
};

static const char *sec_name(const void *ctx, uint32_t i)
{
    return ((const pi2_ctr_writer *)ctx)->secs[i].name;
}

/* Record the first failure, stop output and report it. */
static int wfail(pi2_ctr_writer *w, pi2_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int wfail(pi2_ctr_writer *w, pi2_err *err, int code, const char *fmt, ...)
{
    if (w->fail.code == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(w->fail.msg, sizeof w->fail.msg, fmt, ap);
        va_end(ap);
        w->fail.code = code;
    }
    w->discard = true;
    return pi2_err_set(err, w->fail.code, "%s", w->fail.msg);
}

/* A libarchive call failed: prefer the write callback's own error. */
static int wfail_ar(pi2_ctr_writer *w, pi2_err *err, const char *what)
{
    if (w->io.code != 0)
        return wfail(w, err, w->io.code, "%s", w->io.msg);
    const char *s = archive_error_string(w->ar);
    return wfail(w, err, PI2_EIO, "%s: %s: %s", w->path, what, s ? s : "libarchive error");
}

/* After a libarchive call that reported `ok`: 0, or the sticky error (a
 * write error kept by the callback counts even when libarchive saw none). */
static int ar_check(pi2_ctr_writer *w, bool ok, pi2_err *err, const char *what)
{
    if (ok && w->io.code == 0)
        return 0;
    return wfail_ar(w, err, what);
}

static int wcheck(pi2_ctr_writer *w, pi2_err *err)
{
    if (w->fail.code != 0)
        return pi2_err_set(err, w->fail.code, "%s", w->fail.msg);
    if (w->state == W_DONE)
        return wfail(w, err, PI2_EINVAL, "%s: container already finished", w->path);
    return 0;
}

/* Never reports failure to libarchive: a failed write callback puts the
 * archive in its FATAL state, in which libarchive 3.6 leaks its output
 * buffer. Instead the error is kept in w->io (checked after every libarchive
 * call) and later output is swallowed. */
static la_ssize_t write_cb(struct archive *a, void *client, const void *buf, size_t n)
{
    (void)a;
    pi2_ctr_writer *w = client;
    if (!w->discard && w->af && w->io.code == 0 && pi2_afile_write(w->af, buf, n, &w->io) != 0)
        w->discard = true;
    return (la_ssize_t)n;
}

int pi2_ctr_writer_create(pi2_ctr_writer **out, const char *path, pi2_err *err)
{
    *out = NULL;
    pi2_ctr_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->path = pi2_strdup(path))) {
        free(w);
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", path);
    }
    int rc = pi2_sha256_init(&w->sha, err);
    if (rc == 0)
        rc = pi2_afile_open(&w->af, path, err);
    if (rc == 0 && !(w->ar = archive_write_new()))
        rc = pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", path);
    if (rc == 0 && (archive_write_set_format_ustar(w->ar) != ARCHIVE_OK ||
                    archive_write_add_filter_none(w->ar) != ARCHIVE_OK ||
                    archive_write_set_bytes_per_block(w->ar, 1 << 20) != ARCHIVE_OK || /* fewer write calls */
                    archive_write_set_bytes_in_last_block(w->ar, (int)PI2_CTR_ALIGN) != ARCHIVE_OK ||
                    archive_write_open(w->ar, w, NULL, write_cb, NULL) != ARCHIVE_OK))
        rc = wfail_ar(w, err, "cannot start the tar writer");
    if (rc != 0) {
        pi2_ctr_writer_free(w);
        return rc;
    }
    *out = w;
    return 0;
}

/* One ustar member header through libarchive; advances pos by its block. */
static int put_header(pi2_ctr_writer *w, const char *name, uint64_t size, pi2_err *err)
{
    struct archive_entry *e = archive_entry_new();
    if (!e)
        return wfail(w, err, PI2_ENOMEM, "%s: out of memory", w->path);
    archive_entry_set_pathname(e, name);
    archive_entry_set_size(e, (la_int64_t)size);
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 0644);
    archive_entry_set_mtime(e, 0, 0);
    archive_entry_set_uid(e, 0);
    archive_entry_set_gid(e, 0);
    int r = archive_write_header(w->ar, e);
    archive_entry_free(e);
    int rc = ar_check(w, r == ARCHIVE_OK, err, "cannot write a tar header");
    if (rc)
        return rc;
    w->pos += BLOCK;
    return 0;
}

static int put_data(pi2_ctr_writer *w, const void *buf, size_t n, pi2_err *err)
{
    const uint8_t *p = buf;
    while (n > 0) {
        size_t chunk = n > (1u << 30) ? (1u << 30) : n;
        la_ssize_t r = archive_write_data(w->ar, p, chunk);
        int rc = ar_check(w, r > 0 && (size_t)r <= chunk, err, "cannot write member data");
        if (rc)
            return rc;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

/* Insert a padding member if the next header would not put its data on a
 * PI2_CTR_ALIGN boundary. */
static int put_padding(pi2_ctr_writer *w, pi2_err *err)
{
    uint64_t in = w->pos % PI2_CTR_ALIGN;
    if (in == PI2_CTR_ALIGN - BLOCK)
        return 0;
    /* header at pos, pad bytes, next header at = ALIGN - BLOCK (mod ALIGN) */
    uint64_t pad = (2 * PI2_CTR_ALIGN - 2 * BLOCK - in) % PI2_CTR_ALIGN;
    char name[32];
    snprintf(name, sizeof name, PI2_CTR_PAD_PREFIX "%06u", (unsigned)++w->npad);
    int rc = put_header(w, name, pad, err);
    if (rc == 0)
        rc = put_data(w, zeros, (size_t)pad, err);
    if (rc == 0)
        rc = ar_check(w, archive_write_finish_entry(w->ar) == ARCHIVE_OK, err, "cannot finish a padding member");
    if (rc == 0)
        w->pos += pad;
    return rc;
}

int pi2_ctr_writer_begin(pi2_ctr_writer *w, const char *name, uint64_t size, pi2_err *err)
{
    int rc = wcheck(w, err);
    if (rc)
        return rc;
    if (w->state == W_MEMBER)
        return wfail(w, err, PI2_EINVAL, "%s: member '%s' begun while '%s' is still open", w->path, name,
                     w->cur_name);
    size_t len = strnlen(name, PI2_CTR_NAME_MAX + 1);
    const char *why = name_problem(name, len);
    if (why)
        return wfail(w, err, PI2_EINVAL, "%s: member '%.*s': %s", w->path, (int)(len > 120 ? 120 : len), name,
                     why);
    if (is_pad_name(name))
        return wfail(w, err, PI2_EINVAL, "%s: member '%s': names starting with '" PI2_CTR_PAD_PREFIX
                     "' are reserved for padding", w->path, name);
    if (nidx_find(&w->idx, name, sec_name, w) >= 0)
        return wfail(w, err, PI2_EINVAL, "%s: member '%s' written twice", w->path, name);
    if (size > PI2_CTR_MAX_SIZE)
        return wfail(w, err, PI2_ERANGE, "%s: member '%s': %llu bytes exceeds the ustar limit of %llu", w->path,
                     name, (unsigned long long)size, (unsigned long long)PI2_CTR_MAX_SIZE);
    if (w->nsec >= PI2_CTR_MAX_MEMBERS)
        return wfail(w, err, PI2_ERANGE, "%s: more than %u members", w->path, PI2_CTR_MAX_MEMBERS);
    if ((rc = put_padding(w, err)) != 0 || (rc = put_header(w, name, size, err)) != 0)
        return rc;
    memcpy(w->cur_name, name, len + 1);
    w->cur_off = w->pos;
    w->cur_size = size;
    w->cur_done = 0;
    w->state = W_MEMBER;
    return 0;
}

int pi2_ctr_writer_data(pi2_ctr_writer *w, const void *buf, size_t n, pi2_err *err)
{
    int rc = wcheck(w, err);
    if (rc)
        return rc;
    if (w->state != W_MEMBER)
        return wfail(w, err, PI2_EINVAL, "%s: data written with no member open", w->path);
    if (n > w->cur_size - w->cur_done)
        return wfail(w, err, PI2_EINVAL, "%s: member '%s': more data than the %llu bytes declared", w->path,
                     w->cur_name, (unsigned long long)w->cur_size);
    if (n == 0)
        return 0;
    pi2_err herr = {0};
    if (pi2_sha256_update(w->sha, buf, n, &herr) != 0)
        return wfail(w, err, herr.code, "%s", herr.msg);
    if ((rc = put_data(w, buf, n, err)) != 0)
        return rc;
    w->cur_done += n;
    return 0;
}

int pi2_ctr_writer_end(pi2_ctr_writer *w, pi2_err *err)
{
    int rc = wcheck(w, err);
    if (rc)
        return rc;
    if (w->state != W_MEMBER)
        return wfail(w, err, PI2_EINVAL, "%s: end with no member open", w->path);
    if (w->cur_done != w->cur_size)
        return wfail(w, err, PI2_EINVAL, "%s: member '%s': %llu bytes written but %llu declared", w->path,
                     w->cur_name, (unsigned long long)w->cur_done, (unsigned long long)w->cur_size);
    if ((rc = ar_check(w, archive_write_finish_entry(w->ar) == ARCHIVE_OK, err, "cannot finish a member")) != 0)
        return rc;
    w->pos += round_up(w->cur_size, BLOCK);
    if (w->nsec == w->capsec) {
        size_t cap = w->capsec ? w->capsec * 2 : 16;
        pi2_ctr_section *s = NULL;
        size_t bytes;
        if (pi2_mul_size(cap, sizeof *s, &bytes))
            s = realloc(w->secs, bytes);
        if (!s)
            return wfail(w, err, PI2_ENOMEM, "%s: out of memory", w->path);
        w->secs = s;
        w->capsec = cap;
    }
    pi2_ctr_section *s = &w->secs[w->nsec];
    memset(s, 0, sizeof *s);
    memcpy(s->name, w->cur_name, sizeof s->name);
    s->offset = w->cur_off;
    s->size = w->cur_size;
    pi2_err herr = {0};
    if (pi2_sha256_final(w->sha, s->sha256, &herr) != 0)
        return wfail(w, err, herr.code, "%s", herr.msg);
    if (!nidx_reserve(&w->idx, w->nsec + 1, sec_name, w))
        return wfail(w, err, PI2_ENOMEM, "%s: out of memory", w->path);
    nidx_put(&w->idx, (uint32_t)w->nsec, sec_name, w);
    w->nsec++;
    w->state = W_IDLE;
    return 0;
}

int pi2_ctr_writer_add(pi2_ctr_writer *w, const char *name, const void *buf, size_t n, pi2_err *err)
{
    int rc = pi2_ctr_writer_begin(w, name, n, err);
    if (rc == 0)
        rc = pi2_ctr_writer_data(w, buf, n, err);
    if (rc == 0)
        rc = pi2_ctr_writer_end(w, err);
    return rc;
}

const pi2_ctr_section *pi2_ctr_writer_sections(const pi2_ctr_writer *w, size_t *count)
{
    *count = w->nsec;
    return w->secs;
}

const pi2_ctr_section *pi2_ctr_writer_section(const pi2_ctr_writer *w, const char *name)
{
    int64_t i = nidx_find(&w->idx, name, sec_name, w);
    return i < 0 ? NULL : &w->secs[i];
}

int pi2_ctr_writer_finish(pi2_ctr_writer *w, pi2_err *err)
{
    int rc = wcheck(w, err);
    if (rc)
        return rc;
    if (w->state == W_MEMBER)
        return wfail(w, err, PI2_EINVAL, "%s: member '%s' still open at finish", w->path, w->cur_name);
    if ((rc = ar_check(w, archive_write_close(w->ar) == ARCHIVE_OK, err, "cannot finish the tar archive")) != 0)
        return rc;
    uint64_t want = round_up(w->pos + 2 * BLOCK, PI2_CTR_ALIGN);
    if (pi2_afile_size(w->af) != want)
        return wfail(w, err, PI2_EIO, "%s: tar layout differs from the one predicted (%llu bytes, expected %llu)",
                     w->path, (unsigned long long)pi2_afile_size(w->af), (unsigned long long)want);
    pi2_afile *af = w->af;
    w->af = NULL; /* commit frees it, success or not */
    pi2_err cerr = {0};
    if ((rc = pi2_afile_commit(af, &cerr)) != 0)
        return wfail(w, err, rc, "%s", cerr.msg);
    w->state = W_DONE;
    return 0;
}

void pi2_ctr_writer_free(pi2_ctr_writer *w)
{
    if (!w)
        return;
    /* Unless finished, libarchive closes the archive on free, padding an
     * open member to its declared size; discard makes that output a no-op
     * (CPU only, ~0.2 s for the 8 GiB maximum). */
    w->discard = true;
    if (w->ar)
        archive_write_free(w->ar);
    pi2_afile_abort(w->af);
    pi2_sha256_free(w->sha);
    free(w->secs);
    free(w->idx.slot);
    free(w->path);
    free(w);
}

/* ======================= reader ======================= */

typedef struct ctr_entry {
    pi2_ctr_member m;
    char name[PI2_CTR_NAME_MAX];
} ctr_entry;

struct pi2_ctr {
    char *path;
    pi2_map map;
    ctr_entry *ent;
    size_t n, cap;
    name_index idx;
};

static const char *ent_name(const void *ctx, uint32_t i)
{
    return ((const pi2_ctr *)ctx)->ent[i].name;
}

static bool all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return false;
    return true;
}

/* Octal field: optional leading spaces, at least one digit, then only NUL or
 * space to the end of the field. */
static bool parse_octal(const uint8_t *f, size_t n, uint64_t *out)
{
    size_t i = 0, digits = 0;
    uint64_t v = 0;
    while (i < n && f[i] == ' ')
        i++;
    for (; i < n && f[i] >= '0' && f[i] <= '7'; i++, digits++) {
        if (v > (UINT64_MAX >> 3))
            return false;
        v = v << 3 | (uint64_t)(f[i] - '0');
    }
    if (digits == 0)
        return false;
    for (; i < n; i++)
        if (f[i] != 0 && f[i] != ' ')
            return false;
    *out = v;
    return true;
}

/* Validate one non-zero header block; fills name (NUL-terminated) and size. */
static int parse_header(const pi2_ctr *c, const uint8_t *h, size_t pos, char name[PI2_CTR_NAME_MAX],
                        uint64_t *size, pi2_err *err)
{
    const char *path = c->path;
    if (memcmp(h + H_MAGIC, "ustar\0", 6) != 0 || memcmp(h + H_VERSION, "00", 2) != 0) {
        if (pos == 0)
            return pi2_err_set(err, PI2_EFORMAT, "%s: not a pi2 container (no POSIX ustar header at offset 0)",
                               path);
        return pi2_err_set(err, PI2_EFORMAT, "%s: header at offset %zu: bad ustar magic", path, pos);
    }
    uint64_t want;
    if (!parse_octal(h + H_CHKSUM, H_CHKSUM_LEN, &want))
        return pi2_err_set(err, PI2_EFORMAT, "%s: header at offset %zu: checksum field is not octal", path, pos);
    uint64_t sum = 0;
    for (size_t i = 0; i < BLOCK; i++)
        sum += (i >= H_CHKSUM && i < H_CHKSUM + H_CHKSUM_LEN) ? (uint64_t)' ' : h[i];
    if (sum != want)
        return pi2_err_set(err, PI2_EFORMAT, "%s: header at offset %zu: checksum mismatch (corrupt header)", path,
                           pos);
    const uint8_t *nul = memchr(h + H_NAME, 0, H_NAME_LEN);
    if (!nul)
        return pi2_err_set(err, PI2_EFORMAT, "%s: header at offset %zu: name is not NUL-terminated", path, pos);
    size_t len = (size_t)(nul - (h + H_NAME));
    memcpy(name, h + H_NAME, len);
    name[len] = 0;
    const char *why = name_problem(name, len);
    if (why) {
        /* the name may be hostile: print only what passes as text */
        for (size_t i = 0; i < len; i++)
            if ((unsigned char)name[i] < 0x20 || (unsigned char)name[i] > 0x7e)
                name[i] = '?';
        return pi2_err_set(err, PI2_EFORMAT, "%s: header at offset %zu: member '%s': %s", path, pos, name, why);
    }
    if (h[H_TYPE] != '0' && h[H_TYPE] != 0) {
        unsigned char t = h[H_TYPE];
        return pi2_err_set(err, PI2_EFORMAT,
                           "%s: header at offset %zu: member '%s' has type '%c' (only regular files are allowed)",
                           path, pos, name, t >= 0x20 && t < 0x7f ? t : '?');
    }
    if (h[H_PREFIX] != 0)
        return pi2_err_set(err, PI2_EFORMAT, "%s: header at offset %zu: member '%s' uses the ustar name prefix",
                           path, pos, name);
    uint64_t v;
    static const struct {
        int off, len;
        const char *what;
    } num[] = {{H_MODE, H_ID_LEN, "mode"}, {H_UID, H_ID_LEN, "uid"}, {H_GID, H_ID_LEN, "gid"},
               {H_MTIME, H_MTIME_LEN, "mtime"}};
    for (size_t i = 0; i < sizeof num / sizeof num[0]; i++)
        if (!parse_octal(h + num[i].off, (size_t)num[i].len, &v))
            return pi2_err_set(err, PI2_EFORMAT, "%s: header at offset %zu: member '%s': %s field is not octal",
                               path, pos, name, num[i].what);
    if (!parse_octal(h + H_SIZE, H_SIZE_LEN, size))
        return pi2_err_set(err, PI2_EFORMAT, "%s: header at offset %zu: member '%s': size field is not octal",
                           path, pos, name);
    if (*size > PI2_CTR_MAX_SIZE)
        return pi2_err_set(err, PI2_EFORMAT, "%s: header at offset %zu: member '%s': size %llu exceeds %llu", path,
                           pos, name, (unsigned long long)*size, (unsigned long long)PI2_CTR_MAX_SIZE);
    return 0;
}

static int add_entry(pi2_ctr *c, const char *name, size_t off, uint64_t size, size_t hpos, pi2_err *err)
{
    if (c->n >= PI2_CTR_MAX_MEMBERS)
        return pi2_err_set(err, PI2_ERANGE, "%s: more than %u members", c->path, PI2_CTR_MAX_MEMBERS);
    if (nidx_find(&c->idx, name, ent_name, c) >= 0)
        return pi2_err_set(err, PI2_EFORMAT, "%s: header at offset %zu: duplicate member name '%s'", c->path, hpos,
                           name);
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 16;
        size_t bytes;
        ctr_entry *e = NULL;
        if (pi2_mul_size(cap, sizeof *e, &bytes))
            e = realloc(c->ent, bytes);
        if (!e)
            return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", c->path);
        c->ent = e;
        c->cap = cap;
    }
    ctr_entry *e = &c->ent[c->n];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->m.data = c->map.data + off;
    e->m.offset = off;
    e->m.size = size;
    if (!nidx_reserve(&c->idx, c->n + 1, ent_name, c))
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", c->path);
    nidx_put(&c->idx, (uint32_t)c->n, ent_name, c);
    c->n++;
    return 0;
}

/* Walk the archive with a cursor over the mapping: every header and data
 * range is taken from the remaining budget, so nothing is read past the end. */
static int ctr_walk(pi2_ctr *c, pi2_err *err)
{
    const char *path = c->path;
    const size_t fsize = c->map.size;
    if (fsize == 0)
        return pi2_err_set(err, PI2_EFORMAT, "%s: empty file, not a pi2 container", path);
    pi2_cursor cur = {c->map.data, fsize};
    size_t headers = 0;
    for (;;) {
        size_t pos = fsize - cur.left;
        const uint8_t *h;
        if (!pi2_cursor_take(&cur, BLOCK, &h)) {
            if (pos == 0)
                return pi2_err_set(err, PI2_EFORMAT, "%s: not a pi2 container (%zu bytes, shorter than a tar header)",
                                   path, fsize);
            return pi2_err_set(err, PI2_EFORMAT,
                               "%s: truncated: ends at offset %zu where a tar header or the end-of-archive marker "
                               "should be",
                               path, pos);
        }
        if (all_zero(h, BLOCK)) {
            const uint8_t *h2;
            if (!pi2_cursor_take(&cur, BLOCK, &h2) || !all_zero(h2, BLOCK))
                return pi2_err_set(err, PI2_EFORMAT,
                                   "%s: offset %zu: lone zero block (corrupt or truncated end-of-archive marker)",
                                   path, pos);
            break;
        }
        if (++headers > 2 * (size_t)PI2_CTR_MAX_MEMBERS + 1)
            return pi2_err_set(err, PI2_ERANGE, "%s: more than %u members", path, PI2_CTR_MAX_MEMBERS);
        char name[PI2_CTR_NAME_MAX];
        uint64_t msize;
        int rc = parse_header(c, h, pos, name, &msize, err);
        if (rc)
            return rc;
        size_t off = pos + BLOCK;
        const uint8_t *data, *fill;
        size_t padded;
        if (msize > cur.left || !pi2_add_size((size_t)msize, BLOCK - 1, &padded))
            return pi2_err_set(err, PI2_EFORMAT,
                               "%s: member '%s' (header at offset %zu): size %llu runs past the end of the file "
                               "(%zu bytes)",
                               path, name, pos, (unsigned long long)msize, fsize);
        padded = padded / BLOCK * BLOCK;
        if (padded > cur.left || !pi2_cursor_take(&cur, (size_t)msize, &data) ||
            !pi2_cursor_take(&cur, padded - (size_t)msize, &fill))
            return pi2_err_set(err, PI2_EFORMAT, "%s: member '%s' (header at offset %zu): block fill runs past the "
                               "end of the file (truncated?)", path, name, pos);
        if (!all_zero(fill, padded - (size_t)msize))
            return pi2_err_set(err, PI2_EFORMAT, "%s: member '%s': nonzero bytes in the fill after its data", path,
                               name);
        if (is_pad_name(name)) {
            if (msize >= PI2_CTR_ALIGN || !all_zero(data, (size_t)msize))
                return pi2_err_set(err, PI2_EFORMAT,
                                   "%s: padding member '%s' at offset %zu is not %u zero bytes or fewer", path,
                                   name, pos, PI2_CTR_ALIGN - 1);
            continue;
        }
        if (off % PI2_CTR_ALIGN != 0)
            return pi2_err_set(err, PI2_EFORMAT, "%s: member '%s': data at offset %zu is not %u-byte aligned", path,
                               name, off, PI2_CTR_ALIGN);
        if ((rc = add_entry(c, name, off, msize, pos, err)) != 0)
            return rc;
    }
    size_t end = fsize - cur.left;
    if (!all_zero(c->map.data + end, cur.left))
        return pi2_err_set(err, PI2_EFORMAT, "%s: nonzero bytes after the end-of-archive marker at offset %zu", path,
                           end - 2 * BLOCK);
    if (fsize % PI2_CTR_ALIGN != 0)
        return pi2_err_set(err, PI2_EFORMAT, "%s: file size %zu is not a multiple of %u (truncated?)", path, fsize,
                           PI2_CTR_ALIGN);
    for (size_t i = 0; i < c->n; i++)
        c->ent[i].m.name = c->ent[i].name; /* entries no longer move */
    return 0;
}

static int ctr_parse(pi2_ctr *c, pi2_err *err)
{
    /* headers are spread over the file: without this each one's page fault
     * reads the device's read-ahead window around it (8 MiB on some disks:
     * GBs of page cache for a model of a thousand members) */
    if (c->map.size > 0)
        madvise((void *)(uintptr_t)c->map.data, c->map.size, MADV_RANDOM);
    int rc = ctr_walk(c, err);
    if (c->map.size > 0)
        madvise((void *)(uintptr_t)c->map.data, c->map.size, MADV_NORMAL);
    return rc;
}

static void ctr_advise_huge(const pi2_ctr *c)
{
#ifdef MADV_HUGEPAGE
    if (c->map.size > 0)
        madvise((void *)(uintptr_t)c->map.data, c->map.size, MADV_HUGEPAGE); /* advisory: failure is harmless */
#else
    (void)c;
#endif
}

static int ctr_open(pi2_ctr **out, const char *path, bool huge, pi2_err *err)
{
    *out = NULL;
    pi2_ctr *c = calloc(1, sizeof *c);
    if (!c || !(c->path = pi2_strdup(path))) {
        free(c);
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", path);
    }
    int rc = pi2_map_open(&c->map, path, err);
    if (rc == 0 && huge)
        ctr_advise_huge(c); /* before the walk: its pages would keep their ranges small */
    if (rc == 0)
        rc = ctr_parse(c, err);
    if (rc != 0) {
        pi2_ctr_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

int pi2_ctr_open(pi2_ctr **out, const char *path, pi2_err *err) { return ctr_open(out, path, false, err); }

int pi2_ctr_open_huge(pi2_ctr **out, const char *path, pi2_err *err) { return ctr_open(out, path, true, err); }

size_t pi2_ctr_count(const pi2_ctr *c) { return c->n; }

const pi2_ctr_member *pi2_ctr_at(const pi2_ctr *c, size_t i) { return i < c->n ? &c->ent[i].m : NULL; }

const pi2_ctr_member *pi2_ctr_find(const pi2_ctr *c, const char *name)
{
    int64_t i = nidx_find(&c->idx, name, ent_name, c);
    return i < 0 ? NULL : &c->ent[i].m;
}

const char *pi2_ctr_path(const pi2_ctr *c) { return c->path; }

bool pi2_ctr_changed(const pi2_ctr *c) { return pi2_map_changed(&c->map); }


/* File window [off, off + n) of c out of this process and (fd >= 0) out of
 * the page cache. */
static void drop_window(const pi2_ctr *c, int fd, uint64_t off, uint64_t n)
{
    if (off >= c->map.size)
        return;
    if (n > c->map.size - off)
        n = c->map.size - off;
    madvise((void *)(uintptr_t)(c->map.data + off), (size_t)n, MADV_DONTNEED);
    if (fd >= 0)
        posix_fadvise(fd, (off_t)off, (off_t)n, POSIX_FADV_DONTNEED);
}

int pi2_ctr_verify_member_dropping(const pi2_ctr *c, const pi2_ctr_member *m, const uint8_t expected[PI2_SHA256_LEN],
                                   int fd, size_t window, pi2_err *err)
{
    uint8_t got[PI2_SHA256_LEN];
    pi2_sha256_ctx *h;
    int rc = pi2_sha256_init(&h, err);
    /* windows at multiples of `window` in the file, dropped whole: the page
     * cache keeps a file mapped with huge pages in 2 MiB folios, and drops
     * none that a range only partly covers */
    for (uint64_t at = 0, n; rc == 0 && at < m->size; at += n) {
        uint64_t off = m->offset + at;
        n = m->size - at;
        if (window && window - off % window < n)
            n = window - off % window;
        rc = pi2_sha256_update(h, m->data + at, (size_t)n, err);
        if (window)
            drop_window(c, fd, off - off % window, window);
    }
    if (rc == 0)
        rc = pi2_sha256_final(h, got, err);
    pi2_sha256_free(h);
    if (rc)
        return rc;
    if (memcmp(got, expected, PI2_SHA256_LEN) != 0) {
        char hg[PI2_SHA256_HEX_LEN], he[PI2_SHA256_HEX_LEN];
        pi2_sha256_hex(got, hg);
        pi2_sha256_hex(expected, he);
        return pi2_err_set(err, PI2_ESIG, "%s: member '%s': SHA-256 mismatch (expected %s, got %s)", c->path,
                           m->name, he, hg);
    }
    return 0;
}

int pi2_ctr_verify_member(const pi2_ctr *c, const pi2_ctr_member *m, const uint8_t expected[PI2_SHA256_LEN],
                          pi2_err *err)
{
    return pi2_ctr_verify_member_dropping(c, m, expected, -1, 0, err);
}

void pi2_ctr_close(pi2_ctr *c)
{
    if (!c)
        return;
    pi2_map_close(&c->map);
    free(c->ent);
    free(c->idx.slot);
    free(c->path);
    free(c);
}

void pi2_ctr_drop_pages(const pi2_ctr *c)
{
    if (!c || !c->map.data)
        return;
    /* unmap our references first: the page cache only drops unmapped pages */
    madvise((void *)(uintptr_t)c->map.data, c->map.size, MADV_DONTNEED);
    int fd = open(c->path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
}

/* Sums of Rss and FilePmdMapped over the mappings inside [lo, hi)
 * (/proc/self/smaps; madvise may have split one mapping: every part
 * counts). PI2_EIO when smaps cannot be read. */
static int smaps_bytes(uintptr_t lo, uintptr_t hi, uint64_t *rss, uint64_t *huge, pi2_err *err)
{
    *rss = *huge = 0;
    FILE *f = fopen("/proc/self/smaps", "re");
    if (!f)
        return pi2_err_errno(err, PI2_EIO, errno, "/proc/self/smaps: cannot open");
    char line[512];
    bool in = false;
    while (fgets(line, sizeof line, f)) {
        unsigned long a, b;
        unsigned long long kb;
        char sep;
        /* a mapping's header ("start-end perms ..."), or one of its fields ("Name: n kB") */
        if (sscanf(line, "%lx-%lx%c", &a, &b, &sep) == 3 && sep == ' ')
            in = a >= lo && b <= hi;
        else if (in && sscanf(line, "Rss: %llu kB", &kb) == 1)
            *rss += kb * 1024;
        else if (in && sscanf(line, "FilePmdMapped: %llu kB", &kb) == 1)
            *huge += kb * 1024;
    }
    bool bad = ferror(f);
    fclose(f);
    if (bad) {
        *rss = *huge = 0;
        return pi2_err_set(err, PI2_EIO, "/proc/self/smaps: read failed");
    }
    return 0;
}

int pi2_ctr_mapped_bytes(const pi2_ctr *c, uint64_t *rss, uint64_t *huge, pi2_err *err)
{
    *rss = *huge = 0;
    if (!c || !c->map.data || c->map.size == 0)
        return 0;
    uintptr_t lo = (uintptr_t)c->map.data;
    return smaps_bytes(lo, lo + c->map.size, rss, huge, err);
}

#define HUGE_2M ((size_t)2 << 20)

/* Drop file window [off, off + 2 MiB) from the page cache, map it alone
 * at a 2 MiB-aligned address with MADV_HUGEPAGE, touch it: true when it
 * comes back as one 2 MiB page. */
static bool huge_refault_works(const pi2_ctr *c, int fd, size_t off)
{
#ifdef MADV_HUGEPAGE
    madvise((void *)(uintptr_t)(c->map.data + off), HUGE_2M, MADV_DONTNEED);
    posix_fadvise(fd, (off_t)off, (off_t)HUGE_2M, POSIX_FADV_DONTNEED);
    uint8_t *res = mmap(NULL, 2 * HUGE_2M, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (res == MAP_FAILED)
        return false;
    uint8_t *w = (uint8_t *)(((uintptr_t)res + HUGE_2M - 1) & ~(uintptr_t)(HUGE_2M - 1));
    bool ok = false;
    if (mmap(w, HUGE_2M, PROT_READ, MAP_SHARED | MAP_FIXED, fd, (off_t)off) == w) {
        madvise(w, HUGE_2M, MADV_HUGEPAGE);
        volatile uint8_t sink = 0;
        for (size_t o = 0; o < HUGE_2M; o += 4096)
            sink += w[o];
        (void)sink;
        uint64_t rss, huge;
        pi2_err e = {0};
        ok = smaps_bytes((uintptr_t)w, (uintptr_t)w + HUGE_2M, &rss, &huge, &e) == 0 && huge >= HUGE_2M;
    }
    munmap(res, 2 * HUGE_2M);
    return ok;
#else
    (void)c, (void)fd, (void)off;
    return false;
#endif
}

bool pi2_ctr_rehuge(const pi2_ctr *c, uint64_t min_bytes)
{
    uint64_t rss, huge;
    pi2_err e = {0};
    if (!c || c->map.size < 2 * HUGE_2M || pi2_ctr_mapped_bytes(c, &rss, &huge, &e) != 0 || rss < min_bytes ||
        huge >= rss / 2)
        return false;
    int fd = open(c->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    /* the window: 2 MiB-aligned in the file, in the middle of it */
    size_t off = c->map.size / 2 / HUGE_2M * HUGE_2M;
    bool works = huge_refault_works(c, fd, off);
    close(fd);
    if (works)
        pi2_ctr_drop_pages(c);
    return works;
}

uint64_t pi2_ctr_cached_bytes(const pi2_ctr *c)
{
    if (!c || !c->map.data)
        return 0;
    long page = sysconf(_SC_PAGESIZE);
    size_t pages = (c->map.size + (size_t)page - 1) / (size_t)page, step = (size_t)1 << 20, n = 0;
    unsigned char *v = malloc(step);
    if (!v)
        return 0;
    for (size_t p0 = 0; p0 < pages; p0 += step) {
        size_t cnt = pages - p0 < step ? pages - p0 : step;
        if (mincore((void *)(uintptr_t)(c->map.data + p0 * (size_t)page), cnt * (size_t)page, v) != 0)
            break;
        for (size_t i = 0; i < cnt; i++)
            n += v[i] & 1;
    }
    free(v);
    return (uint64_t)n * (uint64_t)page;
}
