/* The zip layer of PyTorch checkpoints: the reader's walk and the writer's
 * emitter. The contract and the file layout are in torchzip.h; zip.h is
 * this layer's private interface to pickle.c and torchzip.c.
 *
 * Reader: the image is walked through the bounded cursor: end records,
 * central directory, each local header checked against its central entry.
 *
 * Writer: emits what miniz writes for torch (see torchzip.h), so that
 * Python's zipfile accepts it. */
#include "formats/zip.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- little helpers ---- */

static bool take16(pi2_cursor *c, uint16_t *v)
{
    const uint8_t *p;
    if (!pi2_cursor_take(c, 2, &p))
        return false;
    *v = rd16(p);
    return true;
}

/* A name from a hostile file, shown on one short line. */

shown tz_show_n(const void *ptr, size_t len)
{
    const unsigned char *s = ptr;
    shown r;
    size_t i = 0;
    for (; i < len && i < 96; i++)
        r.s[i] = s[i] < 0x20 || s[i] >= 0x7f ? '?' : (char)s[i];
    if (i < len) {
        memcpy(r.s + i, "...", 3);
        i += 3;
    }
    r.s[i] = 0;
    return r;
}

shown tz_show(const char *s) { return tz_show_n(s, s ? strlen(s) : 0); }

bool tz_utf8_valid(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        size_t k;
        uint32_t cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xe0) == 0xc0) {
            k = 1, cp = c & 0x1f;
        } else if ((c & 0xf0) == 0xe0) {
            k = 2, cp = c & 0x0f;
        } else if ((c & 0xf8) == 0xf0) {
            k = 3, cp = c & 0x07;
        } else {
            return false;
        }
        if (n - i <= k)
            return false;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xc0) != 0x80)
                return false;
            cp = cp << 6 | (s[i + j] & 0x3f);
        }
        /* overlong forms and values past U+10FFFF; surrogates pass, as
         * Python's pickle encodes with 'surrogatepass' */
        if ((k == 1 && cp < 0x80) || (k == 2 && cp < 0x800) || (k == 3 && (cp < 0x10000 || cp > 0x10ffff)))
            return false;
        i += k + 1;
    }
    return true;
}

/* ======================= zip walker ======================= */

enum {
    SIG_LFH = 0x04034b50u, SIG_CDH = 0x02014b50u, SIG_EOCD = 0x06054b50u,
    SIG_EOCD64 = 0x06064b50u, SIG_LOC64 = 0x07064b50u, SIG_DD = 0x08074b50u,
    LFH_LEN = 30, CDH_LEN = 46, EOCD_LEN = 22, EOCD64_LEN = 56, LOC64_LEN = 20,
    ZIP64_ID = 0x0001,
    FLAG_ENCRYPTED = 0x0001, FLAG_DESCRIPTOR = 0x0008, FLAG_STRONG = 0x0040, FLAG_UTF8 = 0x0800,
};
#define U16_SAT 0xffffu
#define U32_SAT 0xffffffffu

/* The extra field's records must tile it; *z64 gets the zip64 record's body
 * (NULL if none). false if they do not tile or zip64 appears twice. */
static bool extra_records(const uint8_t *x, size_t xlen, const uint8_t **z64, size_t *z64len)
{
    pi2_cursor c = { x, xlen };
    *z64 = NULL;
    *z64len = 0;
    while (c.left) {
        uint16_t id, l;
        const uint8_t *body;
        if (!take16(&c, &id) || !take16(&c, &l) || !pi2_cursor_take(&c, l, &body))
            return false;
        if (id == ZIP64_ID) {
            if (*z64)
                return false;
            *z64 = body;
            *z64len = l;
        }
    }
    return true;
}

/* The next u64 of a zip64 record body, for a saturated field. */
static bool z64_next(pi2_cursor *c, uint64_t *v) { return pi2_cursor_u64le(c, v); }

static int cmp_u64(uint64_t a, uint64_t b) { return a < b ? -1 : a > b; }

int tz_name_cmp(const uint8_t *a, size_t al, const uint8_t *b, size_t bl)
{
    int r = memcmp(a, b, al < bl ? al : bl);
    return r ? r : cmp_u64(al, bl);
}

/* Sort keys for the overlap and duplicate checks (qsort has no context). */
typedef struct zkey {
    const uint8_t *name;
    uint64_t lho;
    uint32_t nlen, i;
} zkey;

static int key_by_lho(const void *pa, const void *pb)
{
    const zkey *a = pa, *b = pb;
    return cmp_u64(a->lho, b->lho);
}

static int key_by_name(const void *pa, const void *pb)
{
    const zkey *a = pa, *b = pb;
    return tz_name_cmp(a->name, a->nlen, b->name, b->nlen);
}

/* Where the central directory is, from the end records. */
typedef struct zdir {
    uint64_t n;               /* members */
    uint64_t cd_off, cd_size; /* the central directory */
    uint64_t cd_end;          /* where the end records start */
} zdir;

/* The end of central directory record: at pos, the comment after it
 * ending the file; SIZE_MAX if none. */
static size_t find_eocd(const uint8_t *buf, size_t len)
{
    size_t lo = len - EOCD_LEN > U16_SAT ? len - EOCD_LEN - U16_SAT : 0;
    for (size_t p = len - EOCD_LEN;; p--) {
        if (rd32(buf + p) == SIG_EOCD && (size_t)rd16(buf + p + 20) == len - EOCD_LEN - p)
            return p;
        if (p == lo)
            return SIZE_MAX;
    }
}

/* The fields of the end record at pos, replaced by the zip64 end record's
 * when a zip64 locator precedes it (saturated fields must agree). */
static int read_end_records(const uint8_t *buf, size_t pos, const char *path, uint32_t *disk, uint32_t *cd_disk,
                            uint64_t *n_disk, zdir *d, pi2_err *err)
{
    const uint8_t *e = buf + pos;
    *disk = rd16(e + 4), *cd_disk = rd16(e + 6);
    *n_disk = rd16(e + 8), d->n = rd16(e + 10), d->cd_size = rd32(e + 12), d->cd_off = rd32(e + 16);
    d->cd_end = pos;
    if (pos >= LOC64_LEN && rd32(e - LOC64_LEN) == SIG_LOC64) {
        const uint8_t *l = e - LOC64_LEN;
        uint64_t z = rd64(l + 8), lim = pos - LOC64_LEN;
        if (rd32(l + 4) != 0 || rd32(l + 16) > 1)
            return pi2_err_set(err, PI2_EUNSUPPORTED, "%s: multi-disk zip (zip64 locator names disk %u of %u)", path,
                               rd32(l + 4), rd32(l + 16));
        if (z > lim || lim - z < EOCD64_LEN || rd32(buf + z) != SIG_EOCD64)
            return pi2_err_set(err, PI2_EFORMAT, "%s: zip64 locator points at byte %llu, where no zip64 end record is",
                               path, (unsigned long long)z);
        const uint8_t *r = buf + z;
        uint64_t rec = rd64(r + 4);
        if (rec < EOCD64_LEN - 12 || rec > lim - z - 12)
            return pi2_err_set(err, PI2_EFORMAT, "%s: zip64 end record claims %llu bytes (room for %llu)", path,
                               (unsigned long long)rec, (unsigned long long)(lim - z - 12));
        uint32_t d64 = rd32(r + 16), cd64 = rd32(r + 20);
        uint64_t nd64 = rd64(r + 24), n64 = rd64(r + 32), sz64 = rd64(r + 40), off64 = rd64(r + 48);
        if ((*disk != U16_SAT && *disk != d64) || (*cd_disk != U16_SAT && *cd_disk != cd64) ||
            (*n_disk != U16_SAT && *n_disk != nd64) || (d->n != U16_SAT && d->n != n64) ||
            (d->cd_size != U32_SAT && d->cd_size != sz64) || (d->cd_off != U32_SAT && d->cd_off != off64))
            return pi2_err_set(err, PI2_EFORMAT, "%s: zip64 end record disagrees with the end of central directory",
                               path);
        *disk = d64, *cd_disk = cd64, *n_disk = nd64, d->n = n64, d->cd_size = sz64, d->cd_off = off64;
        d->cd_end = z;
    } else if (*disk == U16_SAT || *cd_disk == U16_SAT || *n_disk == U16_SAT || d->n == U16_SAT ||
               d->cd_size == U32_SAT || d->cd_off == U32_SAT) {
        return pi2_err_set(err, PI2_EFORMAT, "%s: end of central directory has zip64 markers but no zip64 locator",
                           path);
    }
    return 0;
}

/* The end records: a single disk, a member count within the limit, a
 * central directory that ends where they start. */
static int zip_end(const uint8_t *buf, size_t len, const char *path, zdir *d, pi2_err *err)
{
    if (len < EOCD_LEN)
        return pi2_err_set(err, PI2_EFORMAT, "%s: %zu bytes, too short for a zip (no end of central directory)", path,
                           len);
    /* The end record, with its comment, ends the file. */
    size_t pos = find_eocd(buf, len);
    if (pos == SIZE_MAX)
        return pi2_err_set(err, PI2_EFORMAT,
                           "%s: no zip end of central directory record at the end of the file (not a zip, or "
                           "truncated)",
                           path);
    uint32_t disk, cd_disk;
    uint64_t n_disk;
    int rc = read_end_records(buf, pos, path, &disk, &cd_disk, &n_disk, d, err);
    if (rc != 0)
        return rc;
    if (disk != 0 || cd_disk != 0)
        return pi2_err_set(err, PI2_EUNSUPPORTED, "%s: multi-disk zip (disk %u, directory on disk %u)", path, disk,
                           cd_disk);
    if (n_disk != d->n)
        return pi2_err_set(err, PI2_EFORMAT, "%s: %llu members on this disk but %llu in all", path,
                           (unsigned long long)n_disk, (unsigned long long)d->n);
    if (d->n == 0)
        return pi2_err_set(err, PI2_EFORMAT, "%s: the zip has no members", path);
    if (d->n > PI2_TZ_MAX_MEMBERS)
        return pi2_err_set(err, PI2_ERANGE, "%s: %llu zip members (limit %u)", path, (unsigned long long)d->n,
                           (unsigned)PI2_TZ_MAX_MEMBERS);
    if (d->cd_off > d->cd_end || d->cd_end - d->cd_off != d->cd_size)
        return pi2_err_set(err, PI2_EFORMAT,
                           "%s: central directory (%llu bytes at byte %llu) does not end where the end records start "
                           "(byte %llu)",
                           path, (unsigned long long)d->cd_size, (unsigned long long)d->cd_off,
                           (unsigned long long)d->cd_end);
    if (d->n > d->cd_size / CDH_LEN)
        return pi2_err_set(err, PI2_EFORMAT, "%s: a central directory of %llu bytes cannot hold %llu entries", path,
                           (unsigned long long)d->cd_size, (unsigned long long)d->n);
    return 0;
}

/* The saturated fields of central entry z (and its disk, *dstart) from
 * its zip64 record; then the entry's own checks. */
static int central_zip64(zmem *z, const uint8_t *extra, uint16_t xlen, uint32_t dstart, const char *path,
                         pi2_err *err)
{
    shown sn = tz_show_n(z->name, z->nlen);
    const uint8_t *z64;
    size_t z64len;
    if (!extra_records(extra, xlen, &z64, &z64len))
        return pi2_err_set(err, PI2_EFORMAT, "%s: member '%s': malformed extra field in the central directory", path,
                           sn.s);
    pi2_cursor zc = { z64, z64len };
    bool ok = true;
    uint64_t v;
    if (z->usize == U32_SAT)
        ok = ok && z64_next(&zc, &v) && ((z->usize = v), true);
    if (z->csize == U32_SAT)
        ok = ok && z64_next(&zc, &v) && ((z->csize = v), true);
    if (z->lho == U32_SAT)
        ok = ok && z64_next(&zc, &v) && ((z->lho = v), true);
    if (dstart == U16_SAT) {
        uint32_t d;
        ok = ok && pi2_cursor_u32le(&zc, &d) && ((dstart = d), true);
    }
    if (!ok)
        return pi2_err_set(err, PI2_EFORMAT, "%s: member '%s': zip64 value missing from its extra field", path, sn.s);
    if (dstart != 0)
        return pi2_err_set(err, PI2_EUNSUPPORTED, "%s: member '%s' starts on disk %u (multi-disk zip)", path, sn.s,
                           dstart);
    if (z->flags & (FLAG_ENCRYPTED | FLAG_STRONG))
        return pi2_err_set(err, PI2_EUNSUPPORTED, "%s: member '%s' is encrypted", path, sn.s);
    if (z->method == 0 && z->csize != z->usize)
        return pi2_err_set(err, PI2_EFORMAT, "%s: stored member '%s' has %llu bytes in the file but a size of %llu",
                           path, sn.s, (unsigned long long)z->csize, (unsigned long long)z->usize);
    return 0;
}

/* Central directory entry i, at the cursor, into *z. */
static int central_entry(pi2_cursor *c, const zdir *d, size_t i, zmem *z, const char *path, pi2_err *err)
{
    size_t at = (size_t)(d->cd_off + (d->cd_size - c->left));
    const uint8_t *p, *name, *extra, *comment;
    if (!pi2_cursor_take(c, CDH_LEN, &p))
        return pi2_err_set(err, PI2_EFORMAT, "%s: central directory entry %zu (byte %zu) is truncated", path, i, at);
    if (rd32(p) != SIG_CDH)
        return pi2_err_set(err, PI2_EFORMAT, "%s: central directory entry %zu (byte %zu) has a bad signature", path,
                           i, at);
    z->flags = rd16(p + 8);
    z->method = rd16(p + 10);
    z->crc = rd32(p + 16);
    z->csize = rd32(p + 20);
    z->usize = rd32(p + 24);
    uint16_t nlen = rd16(p + 28), xlen = rd16(p + 30), clen = rd16(p + 32);
    uint32_t dstart = rd16(p + 34);
    z->lho = rd32(p + 42);
    if (!pi2_cursor_take(c, nlen, &name) || !pi2_cursor_take(c, xlen, &extra) || !pi2_cursor_take(c, clen, &comment))
        return pi2_err_set(err, PI2_EFORMAT, "%s: central directory entry %zu (byte %zu) runs past the directory",
                           path, i, at);
    z->name = name;
    z->nlen = nlen;
    if (nlen == 0 || nlen > PI2_TZ_MAX_NAME || memchr(name, 0, nlen))
        return pi2_err_set(err, PI2_EFORMAT, "%s: central directory entry %zu: %s", path, i,
                           nlen == 0 ? "empty name" : nlen > PI2_TZ_MAX_NAME ? "name too long" : "name holds a NUL");
    return central_zip64(z, extra, xlen, dstart, path, err);
}

/* Member z's local header must say what its central entry says; sets
 * z->off, where its data starts. */
static int local_header(const uint8_t *buf, uint64_t cd_off, zmem *z, const char *path, pi2_err *err)
{
    shown sn = tz_show_n(z->name, z->nlen);
    if (z->lho > cd_off || cd_off - z->lho < LFH_LEN || rd32(buf + z->lho) != SIG_LFH)
        return pi2_err_set(err, PI2_EFORMAT, "%s: member '%s': no local header at byte %llu", path, sn.s,
                           (unsigned long long)z->lho);
    const uint8_t *p = buf + z->lho;
    uint16_t lflags = rd16(p + 6), lmethod = rd16(p + 8), lnlen = rd16(p + 26), lxlen = rd16(p + 28);
    uint32_t lcrc = rd32(p + 14), lcs = rd32(p + 18), lus = rd32(p + 22);
    uint64_t hdr_end = z->lho + LFH_LEN + lnlen + (uint64_t)lxlen;
    const char *why = NULL;
    const uint8_t *lz64 = NULL;
    size_t lz64len = 0;
    if (lflags != z->flags)
        why = "flags";
    else if (lmethod != z->method)
        why = "compression method";
    else if (hdr_end > cd_off)
        why = "length (it runs into the central directory)";
    else if (lnlen != z->nlen || memcmp(p + LFH_LEN, z->name, lnlen) != 0)
        why = "name";
    else if (!extra_records(p + LFH_LEN + lnlen, lxlen, &lz64, &lz64len))
        why = "extra field (malformed)";
    if (!why) {
        if (z->flags & FLAG_DESCRIPTOR) {
            /* sizes and CRC follow the data: here 0 (miniz) or the real ones */
            if ((lcrc && lcrc != z->crc) || (lcs && lcs != (z->csize < U32_SAT ? z->csize : U32_SAT)) ||
                (lus && lus != (z->usize < U32_SAT ? z->usize : U32_SAT)))
                why = "CRC or sizes";
        } else {
            pi2_cursor zc = { lz64, lz64len };
            uint64_t us = lus, cs = lcs;
            bool ok = (lus != U32_SAT || z64_next(&zc, &us)) && (lcs != U32_SAT || z64_next(&zc, &cs));
            if (!ok || lcrc != z->crc || us != z->usize || cs != z->csize)
                why = "CRC or sizes";
        }
    }
    if (why)
        return pi2_err_set(err, PI2_EFORMAT, "%s: member '%s': local header (byte %llu) disagrees with the central "
                           "directory on its %s", path, sn.s, (unsigned long long)z->lho, why);
    z->off = hdr_end;
    if (z->csize > cd_off - hdr_end)
        return pi2_err_set(err, PI2_EFORMAT,
                           "%s: member '%s': %llu data bytes at byte %llu run past the central directory (byte %llu)",
                           path, sn.s, (unsigned long long)z->csize, (unsigned long long)hdr_end,
                           (unsigned long long)cd_off);
    return 0;
}

/* No two members share bytes, no two share a name; idx gets the member
 * indices sorted by name. */
static int check_members(const zmem *m, size_t n, uint32_t *idx, const char *path, pi2_err *err)
{
    zkey *keys = pi2_malloc_array(n, sizeof *keys);
    if (!keys)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory for %llu zip members", path, (unsigned long long)n);
    int rc = 0;
    for (size_t i = 0; i < n; i++)
        keys[i] = (zkey){ .name = m[i].name, .lho = m[i].lho, .nlen = m[i].nlen, .i = (uint32_t)i };
    qsort(keys, n, sizeof *keys, key_by_lho);
    for (size_t i = 1; i < n && rc == 0; i++) {
        const zmem *a = &m[keys[i - 1].i], *b = &m[keys[i].i];
        if (a->off + a->csize > b->lho)
            rc = pi2_err_set(err, PI2_EFORMAT, "%s: members '%s' and '%s' overlap", path, tz_show_n(a->name, a->nlen).s,
                             tz_show_n(b->name, b->nlen).s);
    }
    if (rc == 0)
        qsort(keys, n, sizeof *keys, key_by_name);
    for (size_t i = 0; i < n && rc == 0; i++) {
        idx[i] = keys[i].i;
        if (i > 0 && key_by_name(&keys[i - 1], &keys[i]) == 0)
            rc = pi2_err_set(err, PI2_EFORMAT, "%s: two members named '%s'", path,
                             tz_show_n(keys[i].name, keys[i].nlen).s);
    }
    free(keys);
    return rc;
}

/* Walk the zip image; *out gets its members in central directory order and
 * *by_name their indices sorted by name (both freed by the caller). */
int tz_zip_walk(const uint8_t *buf, size_t len, const char *path, zmem **out, size_t *count, uint32_t **sorted,
                pi2_err *err)
{
    *out = NULL;
    *count = 0;
    *sorted = NULL;
    zdir d = { 0 };
    int rc = zip_end(buf, len, path, &d, err);
    if (rc != 0)
        return rc;
    size_t n = (size_t)d.n;
    zmem *m = pi2_calloc_array(n, sizeof *m);
    uint32_t *idx = pi2_malloc_array(n, sizeof *idx);
    if (!m || !idx) {
        free(m);
        free(idx);
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory for %llu zip members", path, (unsigned long long)n);
    }
    pi2_cursor c = { buf + d.cd_off, (size_t)d.cd_size };
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = central_entry(&c, &d, i, &m[i], path, err);
    if (rc == 0 && c.left)
        rc = pi2_err_set(err, PI2_EFORMAT, "%s: %zu bytes left in the central directory after its %llu entries", path,
                         c.left, (unsigned long long)n);
    /* Local headers: each must say what its central entry says. */
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = local_header(buf, d.cd_off, &m[i], path, err);
    if (rc == 0)
        rc = check_members(m, n, idx, path, err);
    if (rc != 0) {
        free(m);
        free(idx);
        return rc;
    }
    *out = m;
    *count = n;
    *sorted = idx;
    return 0;
}

/* ======================= writer ======================= */

/* CRC-32 (IEEE, reflected), four bits at a time: a 16-entry table. */
static uint32_t crc32_update(uint32_t crc, const void *data, size_t n)
{
    static const uint32_t t[16] = { 0x00000000, 0x1db71064, 0x3b6e20c8, 0x26d930ac, 0x76dc4190, 0x6b6b51f4,
                                    0x4db26158, 0x5005713c, 0xedb88320, 0xf00f9344, 0xd6d6a3e8, 0xcb61b38c,
                                    0x9b64c2b0, 0x86d3d2d4, 0xa00ae278, 0xbdbdf21c };
    const uint8_t *p = data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) {
        crc = (crc >> 4) ^ t[(crc ^ p[i]) & 15];
        crc = (crc >> 4) ^ t[(crc ^ (p[i] >> 4)) & 15];
    }
    return ~crc;
}

static uint32_t sat32(uint64_t v) { return v < U32_SAT ? (uint32_t)v : U32_SAT; }

enum { DOS_DATE_1980_01_01 = (0 << 9) | (1 << 5) | 1 };

/* ---- zip emitter: miniz's layout in zip64 mode ---- */

void zw_release(zw *z)
{
    for (size_t i = 0; i < z->n; i++)
        free(z->e[i].name);
    free(z->e);
    z->e = NULL;
    z->n = z->cap = 0;
}

static int zw_put(zw *z, const void *p, size_t n, pi2_err *err)
{
    int rc = pi2_afile_write(z->af, p, n, err);
    if (rc == 0)
        z->pos += n;
    return rc;
}

int zw_begin(zw *z, const char *name, uint64_t size, pi2_err *err)
{
    assert(!z->open);
    size_t nlen = strlen(name);
    if (pi2_grow(&z->e, &z->cap, z->n, sizeof *z->e, 16) != 0)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", z->path);
    zent *e = &z->e[z->n];
    *e = (zent){ .name = pi2_strdup(name), .lho = z->pos, .size = size,
                 .flags = (uint16_t)(FLAG_UTF8 | (size ? FLAG_DESCRIPTOR : 0)) };
    if (!e->name)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", z->path);
    z->n++;
    bool big_size = size >= U32_SAT, big_off = z->pos >= U32_SAT;
    e->z64 = big_size || big_off;
    uint8_t x64[4 + 24];
    size_t x64len = 0;
    if (e->z64) {
        size_t l = 0;
        if (big_size) {
            wr64(x64 + 4 + l, size);
            wr64(x64 + 4 + l + 8, 0); /* the compressed size, not known yet to miniz */
            l += 16;
        }
        if (big_off) {
            wr64(x64 + 4 + l, z->pos);
            l += 8;
        }
        wr16(x64, ZIP64_ID);
        wr16(x64 + 2, (uint16_t)l);
        x64len = 4 + l;
    }
    /* torch's "FB" record pads the data to PI2_TZ_ALIGN */
    uint64_t start = z->pos + LFH_LEN + nlen + x64len + 4;
    size_t pad = (size_t)((PI2_TZ_ALIGN - start % PI2_TZ_ALIGN) % PI2_TZ_ALIGN);
    uint8_t h[LFH_LEN], fb[4 + PI2_TZ_ALIGN];
    memset(h, 0, sizeof h);
    wr32(h, SIG_LFH);
    wr16(h + 6, e->flags);
    wr16(h + 12, DOS_DATE_1980_01_01);
    wr16(h + 26, (uint16_t)nlen);
    wr16(h + 28, (uint16_t)(x64len + 4 + pad));
    fb[0] = 'F';
    fb[1] = 'B';
    wr16(fb + 2, (uint16_t)pad);
    memset(fb + 4, 'Z', pad);
    int rc;
    if ((rc = zw_put(z, h, sizeof h, err)) != 0 || (rc = zw_put(z, name, nlen, err)) != 0 ||
        (rc = zw_put(z, x64, x64len, err)) != 0 || (rc = zw_put(z, fb, 4 + pad, err)) != 0)
        return rc;
    assert(z->pos % PI2_TZ_ALIGN == 0);
    z->open = true;
    z->left = size;
    z->crc = 0;
    return 0;
}

int zw_data(zw *z, const void *p, size_t n, pi2_err *err)
{
    assert(z->open && n <= z->left);
    z->crc = crc32_update(z->crc, p, n);
    z->left -= n;
    return zw_put(z, p, n, err);
}

int zw_end(zw *z, pi2_err *err)
{
    assert(z->open && z->left == 0);
    zent *e = &z->e[z->n - 1];
    e->crc = z->crc;
    z->open = false;
    if (e->size == 0)
        return 0;
    uint8_t d[24];
    wr32(d, SIG_DD);
    wr32(d + 4, e->crc);
    if (e->z64) {
        wr64(d + 8, e->size);
        wr64(d + 16, e->size);
        return zw_put(z, d, 24, err);
    }
    wr32(d + 8, (uint32_t)e->size);
    wr32(d + 12, (uint32_t)e->size);
    return zw_put(z, d, 16, err);
}

/* Central directory, zip64 end record and locator, end record. */
int zw_finish(zw *z, pi2_err *err)
{
    assert(!z->open);
    uint64_t cd_off = z->pos;
    int rc = 0;
    for (size_t i = 0; i < z->n && rc == 0; i++) {
        const zent *e = &z->e[i];
        size_t nlen = strlen(e->name), xl = 0;
        uint8_t h[CDH_LEN], x[4 + 24];
        if (e->size >= U32_SAT) {
            wr64(x + 4 + xl, e->size);
            wr64(x + 4 + xl + 8, e->size);
            xl += 16;
        }
        if (e->lho >= U32_SAT) {
            wr64(x + 4 + xl, e->lho);
            xl += 8;
        }
        if (xl) {
            wr16(x, ZIP64_ID);
            wr16(x + 2, (uint16_t)xl);
            xl += 4;
        }
        memset(h, 0, sizeof h);
        wr32(h, SIG_CDH);
        wr16(h + 8, e->flags);
        wr16(h + 14, DOS_DATE_1980_01_01);
        wr32(h + 16, e->crc);
        wr32(h + 20, sat32(e->size));
        wr32(h + 24, sat32(e->size));
        wr16(h + 28, (uint16_t)nlen);
        wr16(h + 30, (uint16_t)xl);
        wr32(h + 42, sat32(e->lho));
        if ((rc = zw_put(z, h, sizeof h, err)) == 0 && (rc = zw_put(z, e->name, nlen, err)) == 0)
            rc = zw_put(z, x, xl, err);
    }
    if (rc != 0)
        return rc;
    uint64_t cd_size = z->pos - cd_off, z64_off = z->pos;
    uint8_t r[EOCD64_LEN + LOC64_LEN + EOCD_LEN];
    memset(r, 0, sizeof r);
    uint8_t *p = r;
    wr32(p, SIG_EOCD64);
    wr64(p + 4, EOCD64_LEN - 12);
    wr16(p + 12, 0x031e); /* made by: Unix, 3.0 (as miniz) */
    wr16(p + 14, 0x002d); /* needed: 4.5, zip64 */
    wr64(p + 24, z->n);
    wr64(p + 32, z->n);
    wr64(p + 40, cd_size);
    wr64(p + 48, cd_off);
    p += EOCD64_LEN;
    wr32(p, SIG_LOC64);
    wr64(p + 8, z64_off);
    wr32(p + 16, 1);
    p += LOC64_LEN;
    wr32(p, SIG_EOCD);
    wr16(p + 8, (uint16_t)(z->n < U16_SAT ? z->n : U16_SAT));
    wr16(p + 10, (uint16_t)(z->n < U16_SAT ? z->n : U16_SAT));
    wr32(p + 12, sat32(cd_size));
    wr32(p + 16, sat32(cd_off));
    return zw_put(z, r, sizeof r, err);
}
