/* libarchive's reading of a PyTorch zip, beside the walker's (zip.c).
 *
 * The walker gives what libarchive cannot (torchzip.h says why): the data
 * offset of each member, so tensors point into the mapping, and a strict
 * verdict on hostile input. Once it has accepted an image, libarchive (the
 * project's archive library) reads the same bytes through its seekable zip
 * reader, and both must agree: every entry libarchive lists is one of the
 * walker's members, with the same size, listed once, and none is missing.
 * data.pkl is taken from libarchive, which checks its CRC-32, and must equal
 * the bytes at the walker's offset. Storages are skipped by seeking, so a
 * 9 GB shard costs a walk of its directory and local headers. */
#include "formats/zip.h"

#include <archive.h>
#include <archive_entry.h>
#include <stdlib.h>
#include <string.h>

int64_t tz_find(const zmem *m, size_t nm, const uint32_t *sorted, const uint8_t *name, size_t nlen)
{
    size_t lo = 0, hi = nm;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const zmem *z = &m[sorted[mid]];
        int c = tz_name_cmp(z->name, z->nlen, name, nlen);
        if (c == 0)
            return sorted[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

typedef struct ar {
    struct archive *a;
    const char *path;
    pi2_err *err;
} ar;

static int ar_fail(ar *x, const char *what)
{
    const char *s = archive_error_string(x->a);
    return pi2_err_set(x->err, PI2_EFORMAT, "%s: libarchive %s: %s", x->path, what, s ? s : "no reason given");
}

/* Member i's bytes through libarchive, into a new buffer of its size. */
static int ar_take(ar *x, const zmem *z, uint8_t **out)
{
    size_t n = (size_t)z->usize;
    uint8_t *b = malloc(n ? n : 1);
    if (!b)
        return pi2_err_set(x->err, PI2_ENOMEM, "%s: out of memory for member '%s'", x->path,
                           tz_show_n(z->name, z->nlen).s);
    size_t got = 0;
    for (;;) {
        uint8_t extra; /* a read past the size finds the end (and the CRC check) */
        la_ssize_t r = archive_read_data(x->a, got < n ? b + got : &extra, got < n ? n - got : 1);
        if (r < 0) {
            free(b);
            return ar_fail(x, "reading data.pkl");
        }
        if (r == 0)
            break;
        if (got == n) {
            free(b);
            return pi2_err_set(x->err, PI2_EFORMAT, "%s: libarchive reads member '%s' longer than its %zu bytes",
                               x->path, tz_show_n(z->name, z->nlen).s, n);
        }
        got += (size_t)r;
    }
    if (got != n) {
        free(b);
        return pi2_err_set(x->err, PI2_EFORMAT, "%s: libarchive reads %zu of member '%s''s %zu bytes", x->path, got,
                           tz_show_n(z->name, z->nlen).s, n);
    }
    *out = b;
    return 0;
}

/* One entry: a walker member of the same size, not seen before; the
 * pickle's bytes taken. */
static int ar_entry(ar *x, struct archive_entry *ent, const zmem *m, size_t nm, const uint32_t *sorted, uint8_t *seen,
                    size_t pkl, uint8_t **pkl_out)
{
    const char *name = archive_entry_pathname_utf8(ent);
    if (!name)
        name = archive_entry_pathname(ent);
    if (!name)
        return pi2_err_set(x->err, PI2_EFORMAT, "%s: libarchive lists an entry without a name", x->path);
    int64_t i = tz_find(m, nm, sorted, (const uint8_t *)name, strlen(name));
    if (i < 0)
        return pi2_err_set(x->err, PI2_EFORMAT, "%s: libarchive lists member '%s', which the central directory does not",
                           x->path, tz_show(name).s);
    if (seen[i]++)
        return pi2_err_set(x->err, PI2_EFORMAT, "%s: libarchive lists member '%s' twice", x->path, tz_show(name).s);
    if (!archive_entry_size_is_set(ent) || archive_entry_size(ent) < 0 ||
        (uint64_t)archive_entry_size(ent) != m[i].usize)
        return pi2_err_set(x->err, PI2_EFORMAT, "%s: member '%s': libarchive and the central directory disagree on its size",
                           x->path, tz_show(name).s);
    if ((size_t)i != pkl)
        return 0;
    return ar_take(x, &m[i], pkl_out);
}

int tz_archive_read(const uint8_t *img, size_t len, const char *path, const zmem *m, size_t nm, const uint32_t *sorted,
                    size_t pkl, uint8_t **pkl_out, pi2_err *err)
{
    *pkl_out = NULL;
    ar x = { archive_read_new(), path, err };
    uint8_t *seen = calloc(nm ? nm : 1, 1);
    int rc = 0;
    if (!x.a || !seen) {
        rc = pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", path);
        goto out;
    }
    if (archive_read_support_format_zip_seekable(x.a) != ARCHIVE_OK || archive_read_open_memory(x.a, img, len) != ARCHIVE_OK) {
        rc = ar_fail(&x, "open");
        goto out;
    }
    struct archive_entry *ent;
    int r;
    while (rc == 0 && (r = archive_read_next_header(x.a, &ent)) == ARCHIVE_OK)
        rc = ar_entry(&x, ent, m, nm, sorted, seen, pkl, pkl_out);
    if (rc == 0 && r != ARCHIVE_EOF)
        rc = ar_fail(&x, "listing members");
    for (size_t i = 0; rc == 0 && i < nm; i++)
        if (!seen[i])
            rc = pi2_err_set(err, PI2_EFORMAT, "%s: libarchive does not list member '%s'", path,
                             tz_show_n(m[i].name, m[i].nlen).s);
    if (rc == 0 && pkl < nm && memcmp(*pkl_out, img + m[pkl].off, (size_t)m[pkl].usize) != 0)
        rc = pi2_err_set(err, PI2_EFORMAT, "%s: member '%s' reads differently through libarchive", path,
                         tz_show_n(m[pkl].name, m[pkl].nlen).s);
out:
    if (rc) {
        free(*pkl_out);
        *pkl_out = NULL;
    }
    free(seen);
    if (x.a)
        archive_read_free(x.a);
    return rc;
}
