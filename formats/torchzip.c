/* PyTorch zip checkpoints: zip walker, restricted pickle interpreter, writer.
 * The contract and the file layout are in torchzip.h; this file explains why.
 *
 * Reader: the image is walked twice through the bounded cursor, first the
 * zip (end records, central directory, each local header checked against
 * its central entry), then data.pkl by an interpreter that builds inert
 * values only: strings stay (offset, length) pairs in the image, tuples
 * and dicts are indices into flat arrays, a REDUCE is a table lookup that
 * validates a tensor's arguments; nothing is called, imported or copied
 * but the names. Freeing is one free() per array, so no value graph is
 * ever walked recursively and nesting costs no C stack.
 *
 * Writer: emits what miniz writes for torch (see torchzip.h), with the
 * pickle serialized the way Python's pickler serializes the state dict
 * (memo indices in the same order, batches of 1000 SETITEMS), so that
 * Python's own unpickler and zipfile accept it. */
#include "formats/torchzip.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- little helpers ---- */

static inline uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }

static bool take16(pi2_cursor *c, uint16_t *v)
{
    const uint8_t *p;
    if (!pi2_cursor_take(c, 2, &p))
        return false;
    *v = rd16(p);
    return true;
}

/* A name from a hostile file, shown on one short line. */
typedef struct shown {
    char s[104];
} shown;

static shown show_n(const void *ptr, size_t len)
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

static shown show(const char *s) { return show_n(s, s ? strlen(s) : 0); }

static bool utf8_valid(const uint8_t *s, size_t n)
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

typedef struct zmem {
    const uint8_t *name; /* inside the central directory; not NUL-terminated */
    uint32_t nlen;
    uint16_t flags, method;
    uint32_t crc;
    uint64_t csize, usize;
    uint64_t lho; /* local header offset */
    uint64_t off; /* data offset */
} zmem;

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

static int name_cmp(const uint8_t *a, size_t al, const uint8_t *b, size_t bl)
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
    return name_cmp(a->name, a->nlen, b->name, b->nlen);
}

/* Walk the zip image; *out gets its members in central directory order and
 * *by_name their indices sorted by name (both freed by the caller). */
static int zip_walk(const uint8_t *buf, size_t len, const char *path, zmem **out, size_t *count, uint32_t **sorted,
                    pi2_err *err)
{
    *out = NULL;
    *count = 0;
    *sorted = NULL;
    if (len < EOCD_LEN)
        return pi2_err_set(err, PI2_EFORMAT, "%s: %zu bytes, too short for a zip (no end of central directory)", path,
                           len);
    /* The end record, with its comment, ends the file. */
    size_t lo = len - EOCD_LEN > U16_SAT ? len - EOCD_LEN - U16_SAT : 0, pos = SIZE_MAX;
    for (size_t p = len - EOCD_LEN;; p--) {
        if (rd32(buf + p) == SIG_EOCD && (size_t)rd16(buf + p + 20) == len - EOCD_LEN - p) {
            pos = p;
            break;
        }
        if (p == lo)
            break;
    }
    if (pos == SIZE_MAX)
        return pi2_err_set(err, PI2_EFORMAT,
                           "%s: no zip end of central directory record at the end of the file (not a zip, or "
                           "truncated)",
                           path);
    const uint8_t *e = buf + pos;
    uint32_t disk = rd16(e + 4), cd_disk = rd16(e + 6);
    uint64_t n_disk = rd16(e + 8), n = rd16(e + 10), cd_size = rd32(e + 12), cd_off = rd32(e + 16);
    uint64_t cd_end = pos;
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
        if ((disk != U16_SAT && disk != d64) || (cd_disk != U16_SAT && cd_disk != cd64) ||
            (n_disk != U16_SAT && n_disk != nd64) || (n != U16_SAT && n != n64) ||
            (cd_size != U32_SAT && cd_size != sz64) || (cd_off != U32_SAT && cd_off != off64))
            return pi2_err_set(err, PI2_EFORMAT, "%s: zip64 end record disagrees with the end of central directory",
                               path);
        disk = d64, cd_disk = cd64, n_disk = nd64, n = n64, cd_size = sz64, cd_off = off64;
        cd_end = z;
    } else if (disk == U16_SAT || cd_disk == U16_SAT || n_disk == U16_SAT || n == U16_SAT || cd_size == U32_SAT ||
               cd_off == U32_SAT) {
        return pi2_err_set(err, PI2_EFORMAT, "%s: end of central directory has zip64 markers but no zip64 locator",
                           path);
    }
    if (disk != 0 || cd_disk != 0)
        return pi2_err_set(err, PI2_EUNSUPPORTED, "%s: multi-disk zip (disk %u, directory on disk %u)", path, disk,
                           cd_disk);
    if (n_disk != n)
        return pi2_err_set(err, PI2_EFORMAT, "%s: %llu members on this disk but %llu in all", path,
                           (unsigned long long)n_disk, (unsigned long long)n);
    if (n == 0)
        return pi2_err_set(err, PI2_EFORMAT, "%s: the zip has no members", path);
    if (n > PI2_TZ_MAX_MEMBERS)
        return pi2_err_set(err, PI2_ERANGE, "%s: %llu zip members (limit %u)", path, (unsigned long long)n,
                           (unsigned)PI2_TZ_MAX_MEMBERS);
    if (cd_off > cd_end || cd_end - cd_off != cd_size)
        return pi2_err_set(err, PI2_EFORMAT,
                           "%s: central directory (%llu bytes at byte %llu) does not end where the end records start "
                           "(byte %llu)",
                           path, (unsigned long long)cd_size, (unsigned long long)cd_off, (unsigned long long)cd_end);
    if (n > cd_size / CDH_LEN)
        return pi2_err_set(err, PI2_EFORMAT, "%s: a central directory of %llu bytes cannot hold %llu entries", path,
                           (unsigned long long)cd_size, (unsigned long long)n);

    zmem *m = pi2_calloc_array((size_t)n, sizeof *m);
    uint32_t *idx = pi2_malloc_array((size_t)n, sizeof *idx);
    if (!m || !idx) {
        free(m);
        free(idx);
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory for %llu zip members", path, (unsigned long long)n);
    }
    int rc = 0;
    zkey *keys = NULL;
    pi2_cursor c = { buf + cd_off, (size_t)cd_size };
    for (size_t i = 0; i < n; i++) {
        size_t at = (size_t)(cd_off + (cd_size - c.left));
        const uint8_t *p, *name, *extra, *comment;
        if (!pi2_cursor_take(&c, CDH_LEN, &p)) {
            rc = pi2_err_set(err, PI2_EFORMAT, "%s: central directory entry %zu (byte %zu) is truncated", path, i, at);
            goto out;
        }
        if (rd32(p) != SIG_CDH) {
            rc = pi2_err_set(err, PI2_EFORMAT, "%s: central directory entry %zu (byte %zu) has a bad signature", path,
                             i, at);
            goto out;
        }
        zmem *z = &m[i];
        z->flags = rd16(p + 8);
        z->method = rd16(p + 10);
        z->crc = rd32(p + 16);
        z->csize = rd32(p + 20);
        z->usize = rd32(p + 24);
        uint16_t nlen = rd16(p + 28), xlen = rd16(p + 30), clen = rd16(p + 32);
        uint32_t dstart = rd16(p + 34);
        z->lho = rd32(p + 42);
        if (!pi2_cursor_take(&c, nlen, &name) || !pi2_cursor_take(&c, xlen, &extra) ||
            !pi2_cursor_take(&c, clen, &comment)) {
            rc = pi2_err_set(err, PI2_EFORMAT, "%s: central directory entry %zu (byte %zu) runs past the directory",
                             path, i, at);
            goto out;
        }
        z->name = name;
        z->nlen = nlen;
        if (nlen == 0 || nlen > PI2_TZ_MAX_NAME || memchr(name, 0, nlen)) {
            rc = pi2_err_set(err, PI2_EFORMAT, "%s: central directory entry %zu: %s", path, i,
                             nlen == 0 ? "empty name" : nlen > PI2_TZ_MAX_NAME ? "name too long" : "name holds a NUL");
            goto out;
        }
        shown sn = show_n(name, nlen);
        const uint8_t *z64;
        size_t z64len;
        if (!extra_records(extra, xlen, &z64, &z64len)) {
            rc = pi2_err_set(err, PI2_EFORMAT, "%s: member '%s': malformed extra field in the central directory",
                             path, sn.s);
            goto out;
        }
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
        if (!ok) {
            rc = pi2_err_set(err, PI2_EFORMAT, "%s: member '%s': zip64 value missing from its extra field", path,
                             sn.s);
            goto out;
        }
        if (dstart != 0) {
            rc = pi2_err_set(err, PI2_EUNSUPPORTED, "%s: member '%s' starts on disk %u (multi-disk zip)", path, sn.s,
                             dstart);
            goto out;
        }
        if (z->flags & (FLAG_ENCRYPTED | FLAG_STRONG)) {
            rc = pi2_err_set(err, PI2_EUNSUPPORTED, "%s: member '%s' is encrypted", path, sn.s);
            goto out;
        }
        if (z->method == 0 && z->csize != z->usize) {
            rc = pi2_err_set(err, PI2_EFORMAT, "%s: stored member '%s' has %llu bytes in the file but a size of %llu",
                             path, sn.s, (unsigned long long)z->csize, (unsigned long long)z->usize);
            goto out;
        }
    }
    if (c.left) {
        rc = pi2_err_set(err, PI2_EFORMAT, "%s: %zu bytes left in the central directory after its %llu entries", path,
                         c.left, (unsigned long long)n);
        goto out;
    }

    /* Local headers: each must say what its central entry says. */
    for (size_t i = 0; i < n; i++) {
        zmem *z = &m[i];
        shown sn = show_n(z->name, z->nlen);
        if (z->lho > cd_off || cd_off - z->lho < LFH_LEN || rd32(buf + z->lho) != SIG_LFH) {
            rc = pi2_err_set(err, PI2_EFORMAT, "%s: member '%s': no local header at byte %llu", path, sn.s,
                             (unsigned long long)z->lho);
            goto out;
        }
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
        if (why) {
            rc = pi2_err_set(err, PI2_EFORMAT, "%s: member '%s': local header (byte %llu) disagrees with the central "
                             "directory on its %s", path, sn.s, (unsigned long long)z->lho, why);
            goto out;
        }
        z->off = hdr_end;
        if (z->csize > cd_off - hdr_end) {
            rc = pi2_err_set(err, PI2_EFORMAT,
                             "%s: member '%s': %llu data bytes at byte %llu run past the central directory (byte %llu)",
                             path, sn.s, (unsigned long long)z->csize, (unsigned long long)hdr_end,
                             (unsigned long long)cd_off);
            goto out;
        }
    }
    /* No two members share bytes, no two share a name. */
    keys = pi2_malloc_array((size_t)n, sizeof *keys);
    if (!keys) {
        rc = pi2_err_set(err, PI2_ENOMEM, "%s: out of memory for %llu zip members", path, (unsigned long long)n);
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        keys[i] = (zkey){ .name = m[i].name, .lho = m[i].lho, .nlen = m[i].nlen, .i = (uint32_t)i };
    qsort(keys, (size_t)n, sizeof *keys, key_by_lho);
    for (size_t i = 1; i < n; i++) {
        const zmem *a = &m[keys[i - 1].i], *b = &m[keys[i].i];
        if (a->off + a->csize > b->lho) {
            rc = pi2_err_set(err, PI2_EFORMAT, "%s: members '%s' and '%s' overlap", path, show_n(a->name, a->nlen).s,
                             show_n(b->name, b->nlen).s);
            goto out;
        }
    }
    qsort(keys, (size_t)n, sizeof *keys, key_by_name);
    for (size_t i = 0; i < n; i++) {
        idx[i] = keys[i].i;
        if (i > 0 && key_by_name(&keys[i - 1], &keys[i]) == 0) {
            rc = pi2_err_set(err, PI2_EFORMAT, "%s: two members named '%s'", path,
                             show_n(keys[i].name, keys[i].nlen).s);
            goto out;
        }
    }
out:
    free(keys);
    if (rc != 0) {
        free(m);
        free(idx);
        return rc;
    }
    *out = m;
    *count = (size_t)n;
    *sorted = idx;
    return 0;
}

/* ======================= pickle interpreter ======================= */

/* Pickle opcodes (Python's Lib/pickle.py); those handled are marked. */
enum {
    OP_MARK = '(', OP_STOP = '.', OP_POP = '0', OP_POP_MARK = '1', OP_DUP = '2', OP_FLOAT = 'F', OP_INT = 'I',
    OP_BININT = 'J' /* handled */, OP_BININT1 = 'K' /* handled */, OP_LONG = 'L', OP_BININT2 = 'M' /* handled */,
    OP_NONE = 'N' /* handled */, OP_PERSID = 'P', OP_BINPERSID = 'Q' /* handled */, OP_REDUCE = 'R' /* handled */,
    OP_STRING = 'S', OP_BINSTRING = 'T', OP_SHORT_BINSTRING = 'U', OP_UNICODE = 'V',
    OP_BINUNICODE = 'X' /* handled */, OP_APPEND = 'a' /* handled */, OP_BUILD = 'b' /* handled */,
    OP_GLOBAL = 'c' /* handled */, OP_DICT = 'd', OP_EMPTY_DICT = '}' /* handled */, OP_APPENDS = 'e' /* handled */,
    OP_GET = 'g', OP_BINGET = 'h' /* handled */, OP_INST = 'i', OP_LONG_BINGET = 'j' /* handled */, OP_LIST = 'l',
    OP_EMPTY_LIST = ']' /* handled */, OP_OBJ = 'o', OP_PUT = 'p', OP_BINPUT = 'q' /* handled */,
    OP_LONG_BINPUT = 'r' /* handled */, OP_SETITEM = 's' /* handled */, OP_TUPLE = 't' /* handled */,
    OP_EMPTY_TUPLE = ')' /* handled */, OP_SETITEMS = 'u' /* handled */, OP_BINFLOAT = 'G',
    OP_PROTO = 0x80 /* handled */, OP_NEWOBJ = 0x81, OP_EXT1 = 0x82, OP_EXT2 = 0x83, OP_EXT4 = 0x84,
    OP_TUPLE1 = 0x85 /* handled */, OP_TUPLE2 = 0x86 /* handled */, OP_TUPLE3 = 0x87 /* handled */,
    OP_NEWTRUE = 0x88 /* handled */, OP_NEWFALSE = 0x89 /* handled */, OP_LONG1 = 0x8a /* handled */,
    OP_LONG4 = 0x8b, OP_BINBYTES = 'B', OP_SHORT_BINBYTES = 'C', OP_SHORT_BINUNICODE = 0x8c /* handled */,
    OP_BINUNICODE8 = 0x8d /* handled */, OP_BINBYTES8 = 0x8e, OP_EMPTY_SET = 0x8f, OP_ADDITEMS = 0x90,
    OP_FROZENSET = 0x91, OP_NEWOBJ_EX = 0x92, OP_STACK_GLOBAL = 0x93 /* handled */, OP_MEMOIZE = 0x94 /* handled */,
    OP_FRAME = 0x95 /* handled */, OP_BYTEARRAY8 = 0x96, OP_NEXT_BUFFER = 0x97, OP_READONLY_BUFFER = 0x98,
};

static const struct {
    uint8_t op;
    const char *name;
} op_names[] = {
    { OP_MARK, "MARK" }, { OP_STOP, "STOP" }, { OP_POP, "POP" }, { OP_POP_MARK, "POP_MARK" }, { OP_DUP, "DUP" },
    { OP_FLOAT, "FLOAT" }, { OP_INT, "INT" }, { OP_BININT, "BININT" }, { OP_BININT1, "BININT1" },
    { OP_LONG, "LONG" }, { OP_BININT2, "BININT2" }, { OP_NONE, "NONE" }, { OP_PERSID, "PERSID" },
    { OP_BINPERSID, "BINPERSID" }, { OP_REDUCE, "REDUCE" }, { OP_STRING, "STRING" }, { OP_BINSTRING, "BINSTRING" },
    { OP_SHORT_BINSTRING, "SHORT_BINSTRING" }, { OP_UNICODE, "UNICODE" }, { OP_BINUNICODE, "BINUNICODE" },
    { OP_APPEND, "APPEND" }, { OP_BUILD, "BUILD" }, { OP_GLOBAL, "GLOBAL" }, { OP_DICT, "DICT" },
    { OP_EMPTY_DICT, "EMPTY_DICT" }, { OP_APPENDS, "APPENDS" }, { OP_GET, "GET" }, { OP_BINGET, "BINGET" },
    { OP_INST, "INST" }, { OP_LONG_BINGET, "LONG_BINGET" }, { OP_LIST, "LIST" }, { OP_EMPTY_LIST, "EMPTY_LIST" },
    { OP_OBJ, "OBJ" }, { OP_PUT, "PUT" }, { OP_BINPUT, "BINPUT" }, { OP_LONG_BINPUT, "LONG_BINPUT" },
    { OP_SETITEM, "SETITEM" }, { OP_TUPLE, "TUPLE" }, { OP_EMPTY_TUPLE, "EMPTY_TUPLE" }, { OP_SETITEMS, "SETITEMS" },
    { OP_BINFLOAT, "BINFLOAT" }, { OP_PROTO, "PROTO" }, { OP_NEWOBJ, "NEWOBJ" }, { OP_EXT1, "EXT1" },
    { OP_EXT2, "EXT2" }, { OP_EXT4, "EXT4" }, { OP_TUPLE1, "TUPLE1" }, { OP_TUPLE2, "TUPLE2" },
    { OP_TUPLE3, "TUPLE3" }, { OP_NEWTRUE, "NEWTRUE" }, { OP_NEWFALSE, "NEWFALSE" }, { OP_LONG1, "LONG1" },
    { OP_LONG4, "LONG4" }, { OP_BINBYTES, "BINBYTES" }, { OP_SHORT_BINBYTES, "SHORT_BINBYTES" },
    { OP_SHORT_BINUNICODE, "SHORT_BINUNICODE" }, { OP_BINUNICODE8, "BINUNICODE8" }, { OP_BINBYTES8, "BINBYTES8" },
    { OP_EMPTY_SET, "EMPTY_SET" }, { OP_ADDITEMS, "ADDITEMS" }, { OP_FROZENSET, "FROZENSET" },
    { OP_NEWOBJ_EX, "NEWOBJ_EX" }, { OP_STACK_GLOBAL, "STACK_GLOBAL" }, { OP_MEMOIZE, "MEMOIZE" },
    { OP_FRAME, "FRAME" }, { OP_BYTEARRAY8, "BYTEARRAY8" }, { OP_NEXT_BUFFER, "NEXT_BUFFER" },
    { OP_READONLY_BUFFER, "READONLY_BUFFER" },
};

static const char *op_name(uint8_t op)
{
    for (size_t i = 0; i < sizeof op_names / sizeof op_names[0]; i++)
        if (op_names[i].op == op)
            return op_names[i].name;
    return NULL;
}

enum { PV_NONE, PV_BOOL, PV_INT, PV_STR, PV_GLOBAL, PV_TUPLE, PV_LIST, PV_DICT, PV_STORAGE, PV_TENSOR };
static const char *const kind_name[] = { "None", "bool", "int", "str", "global", "tuple", "list", "dict", "storage",
                                         "tensor" };

/* The allowed globals; a storage type is G_STORAGE + its pi2_dtype. */
enum { G_ODICT = 1, G_REBUILD_V2, G_REBUILD_PARAM, G_STORAGE };

/* A pickle value. Containers are references (indices), as in Python. */
typedef struct pv {
    uint8_t kind;
    uint8_t g;  /* PV_GLOBAL: G_* */
    uint32_t n; /* PV_STR: byte length; PV_TUPLE: item count */
    uint64_t u; /* PV_INT: value bits; PV_BOOL: 0/1; PV_STR: offset in data.pkl; PV_TUPLE: first item in
                 * kids; PV_DICT, PV_STORAGE, PV_TENSOR: index into their arrays */
} pv;

typedef struct pdict {
    uint32_t nitems;
    bool ordered; /* made by collections.OrderedDict(): BUILD may set its attributes */
} pdict;

typedef struct pitem {
    uint32_t dict;
    pv k, v;
} pitem;

typedef struct pstor {
    uint32_t member;
    pi2_dtype dt;
    uint64_t numel;
} pstor;

typedef struct ptens {
    uint32_t stor;
    int ndim;
    int64_t shape[PI2_ST_MAX_DIMS];
    size_t nelem;
    uint64_t offset; /* elements into the storage */
} ptens;

/* the heap bound stated in torchzip.h */
_Static_assert(sizeof(pv) == 16 && sizeof(pitem) <= 40 && sizeof(pdict) <= 40 && sizeof(pstor) <= 40 &&
                   sizeof(ptens) <= 88,
               "pickle object sizes as torchzip.h states them");

static const struct {
    const char *name;
    pi2_dtype dt;
} storage_types[] = {
    { "FloatStorage", PI2_DT_F32 }, { "HalfStorage", PI2_DT_F16 }, { "BFloat16Storage", PI2_DT_BF16 },
    { "CharStorage", PI2_DT_I8 },   { "ByteStorage", PI2_DT_U8 },  { "IntStorage", PI2_DT_I32 },
    { "LongStorage", PI2_DT_I64 },
};

static const char *storage_name(pi2_dtype dt)
{
    for (size_t i = 0; i < sizeof storage_types / sizeof storage_types[0]; i++)
        if (storage_types[i].dt == dt)
            return storage_types[i].name;
    return "?";
}

typedef struct pk {
    const char *path;
    shown pkl;          /* "A/data.pkl", for messages */
    const uint8_t *img; /* the whole file */
    const uint8_t *p0;  /* data.pkl */
    size_t len;
    size_t at; /* offset of the opcode being run */
    pi2_err *err;
    /* zip */
    const zmem *m;
    size_t nm;
    const uint32_t *sorted; /* member indices by name */
    const uint8_t *prefix;  /* archive folder name, without '/' */
    size_t plen;
    uint32_t *mem_stor; /* member -> storage index + 1 */
    /* machine */
    pv *st;
    size_t sp, scap;
    size_t marks[PI2_TZ_MAX_MARKS];
    size_t nmarks;
    pv *memo;
    size_t nmemo, memocap;
    pv *kids;
    size_t nkids, kidcap;
    pdict *dicts;
    size_t ndicts, dictcap;
    pitem *items;
    size_t nitems, itemcap;
    pstor *stors;
    size_t nstors, storcap;
    ptens *tens;
    size_t ntens, tenscap;
    size_t nobj;
} pk;

static int pk_fail(pk *k, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int pk_fail(pk *k, int code, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return pi2_err_set(k->err, code, "%s: %s byte %zu: %s", k->path, k->pkl.s, k->at, msg);
}

static int pk_nomem(pk *k)
{
    return pi2_err_set(k->err, PI2_ENOMEM, "%s: out of memory reading %s", k->path, k->pkl.s);
}

/* Spend n objects of the budget. */
static int pk_spend(pk *k, size_t n)
{
    if (n > PI2_TZ_MAX_OBJECTS - k->nobj)
        return pk_fail(k, PI2_ERANGE, "more than %u pickle objects", (unsigned)PI2_TZ_MAX_OBJECTS);
    k->nobj += n;
    return 0;
}

static shown pk_str(const pk *k, pv v) { return show_n(k->p0 + v.u, v.n); }

static bool pk_str_is(const pk *k, pv v, const char *s)
{
    return v.kind == PV_STR && v.n == strlen(s) && memcmp(k->p0 + v.u, s, v.n) == 0;
}

static size_t pk_base(const pk *k) { return k->nmarks ? k->marks[k->nmarks - 1] : 0; }

/* At least n values above the last MARK. */
static int pk_need(pk *k, uint8_t op, size_t n)
{
    size_t have = k->sp - pk_base(k);
    if (have < n)
        return pk_fail(k, PI2_EFORMAT, "stack underflow: %s needs %zu values, %zu above the last MARK", op_name(op), n,
                       have);
    return 0;
}

static int pk_push(pk *k, pv v)
{
    if (k->sp >= PI2_TZ_MAX_STACK)
        return pk_fail(k, PI2_ERANGE, "more than %u values on the stack", (unsigned)PI2_TZ_MAX_STACK);
    if (pi2_grow(&k->st, &k->scap, k->sp, sizeof *k->st, 64) != 0)
        return pk_nomem(k);
    k->st[k->sp++] = v;
    return 0;
}

/* The values above the last MARK (count n at st[*from]); pops the MARK. */
static int pk_pop_mark(pk *k, uint8_t op, size_t *from, size_t *n)
{
    if (k->nmarks == 0)
        return pk_fail(k, PI2_EFORMAT, "stack underflow: %s without a MARK", op_name(op));
    *from = k->marks[--k->nmarks];
    *n = k->sp - *from;
    return 0;
}

static int pk_tuple(pk *k, size_t from, size_t n, pv *out)
{
    int rc = pk_spend(k, n ? n : 1);
    if (rc != 0)
        return rc;
    /* pi2_grow doubles once per call: a tuple may need several */
    while (k->kidcap < k->nkids + n)
        if (pi2_grow(&k->kids, &k->kidcap, k->kidcap, sizeof *k->kids, 256) != 0)
            return pk_nomem(k);
    if (n)
        memcpy(k->kids + k->nkids, k->st + from, n * sizeof *k->kids);
    *out = (pv){ .kind = PV_TUPLE, .n = (uint32_t)n, .u = k->nkids };
    k->nkids += n;
    return 0;
}

static int pk_new_dict(pk *k, bool ordered, pv *out)
{
    int rc = pk_spend(k, 1);
    if (rc != 0)
        return rc;
    if (pi2_grow(&k->dicts, &k->dictcap, k->ndicts, sizeof *k->dicts, 16) != 0)
        return pk_nomem(k);
    k->dicts[k->ndicts] = (pdict){ .nitems = 0, .ordered = ordered };
    *out = (pv){ .kind = PV_DICT, .u = k->ndicts++ };
    return 0;
}

static int pk_setitem(pk *k, pv d, pv key, pv val)
{
    if (key.kind == PV_DICT || key.kind == PV_LIST)
        return pk_fail(k, PI2_EFORMAT, "unhashable dict key (a %s)", kind_name[key.kind]);
    int rc = pk_spend(k, 1);
    if (rc != 0)
        return rc;
    if (pi2_grow(&k->items, &k->itemcap, k->nitems, sizeof *k->items, 64) != 0)
        return pk_nomem(k);
    k->items[k->nitems++] = (pitem){ .dict = (uint32_t)d.u, .k = key, .v = val };
    k->dicts[d.u].nitems++;
    return 0;
}

/* The member "<prefix>/<a><b>" (b may hold any bytes), or -1. */
static int64_t pk_member(const pk *k, const char *a, const uint8_t *b, size_t blen)
{
    char q[PI2_TZ_MAX_NAME + 1];
    size_t alen = strlen(a);
    if (k->plen + 1 + alen > PI2_TZ_MAX_NAME || blen > PI2_TZ_MAX_NAME - k->plen - 1 - alen)
        return -1;
    memcpy(q, k->prefix, k->plen);
    q[k->plen] = '/';
    memcpy(q + k->plen + 1, a, alen);
    if (blen)
        memcpy(q + k->plen + 1 + alen, b, blen);
    size_t qlen = k->plen + 1 + alen + blen;
    size_t lo = 0, hi = k->nm;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const zmem *z = &k->m[k->sorted[mid]];
        int c = name_cmp(z->name, z->nlen, (const uint8_t *)q, qlen);
        if (c == 0)
            return k->sorted[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

static int pk_global(pk *k, const uint8_t *mod, size_t ml, const uint8_t *name, size_t nl, pv *out)
{
#define IS(p, l, s) ((l) == sizeof(s) - 1 && memcmp((p), (s), (l)) == 0)
    *out = (pv){ .kind = PV_GLOBAL };
    if (IS(mod, ml, "collections") && IS(name, nl, "OrderedDict"))
        out->g = G_ODICT;
    else if (IS(mod, ml, "torch._utils") && IS(name, nl, "_rebuild_tensor_v2"))
        out->g = G_REBUILD_V2;
    else if (IS(mod, ml, "torch._utils") && IS(name, nl, "_rebuild_parameter"))
        out->g = G_REBUILD_PARAM;
    else if (IS(mod, ml, "torch")) {
        for (size_t i = 0; i < sizeof storage_types / sizeof storage_types[0]; i++)
            if (nl == strlen(storage_types[i].name) && memcmp(name, storage_types[i].name, nl) == 0)
                out->g = (uint8_t)(G_STORAGE + storage_types[i].dt);
        if (!out->g && nl > 7 && memcmp(name + nl - 7, "Storage", 7) == 0)
            return pk_fail(k, PI2_EUNSUPPORTED,
                           "storage type torch.%s has no pi2 dtype (pi2 reads Float, Half, BFloat16, Char, Byte, "
                           "Int and Long storages)",
                           show_n(name, nl).s);
    }
#undef IS
    if (!out->g)
        return pk_fail(k, PI2_EUNSUPPORTED, "refused global '%s.%s'", show_n(mod, ml).s, show_n(name, nl).s);
    return 0;
}

static const char *global_name(uint8_t g)
{
    switch (g) {
    case G_ODICT: return "collections.OrderedDict";
    case G_REBUILD_V2: return "torch._utils._rebuild_tensor_v2";
    case G_REBUILD_PARAM: return "torch._utils._rebuild_parameter";
    default: return "a torch storage type";
    }
}

/* BINPERSID: ('storage', torch.<T>Storage, key, location, numel). */
static int pk_storage(pk *k, pv pid, pv *out)
{
    if (pid.kind != PV_TUPLE || pid.n == 0)
        return pk_fail(k, PI2_EUNSUPPORTED, "persistent id is a %s, not a storage tuple", kind_name[pid.kind]);
    const pv *t = k->kids + pid.u;
    if (!pk_str_is(k, t[0], "storage"))
        return pk_fail(k, PI2_EUNSUPPORTED, "persistent id of type '%s', not 'storage'",
                       t[0].kind == PV_STR ? pk_str(k, t[0]).s : kind_name[t[0].kind]);
    if (pid.n != 5)
        return pk_fail(k, PI2_EFORMAT, "storage persistent id has %u fields, not 5", pid.n);
    if (t[1].kind != PV_GLOBAL || t[1].g < G_STORAGE)
        return pk_fail(k, PI2_EFORMAT, "storage type is %s, not a storage class",
                       t[1].kind == PV_GLOBAL ? global_name(t[1].g) : kind_name[t[1].kind]);
    if (t[2].kind != PV_STR || t[3].kind != PV_STR || t[4].kind != PV_INT || (int64_t)t[4].u < 0)
        return pk_fail(k, PI2_EFORMAT, "storage persistent id is not (str, type, str key, str location, numel >= 0)");
    pi2_dtype dt = (pi2_dtype)(t[1].g - G_STORAGE);
    uint64_t numel = t[4].u;
    shown key = pk_str(k, t[2]);
    size_t nbytes;
    if (numel > SIZE_MAX || !pi2_mul_size((size_t)numel, pi2_dtype_size(dt), &nbytes))
        return pk_fail(k, PI2_ERANGE, "storage '%s': %llu elements of %s overflow the byte size", key.s,
                       (unsigned long long)numel, storage_name(dt));
    int64_t mi = pk_member(k, "data/", k->p0 + t[2].u, t[2].n);
    if (mi < 0)
        return pk_fail(k, PI2_EFORMAT, "storage '%s': member '%s/data/%s' is missing", key.s,
                       show_n(k->prefix, k->plen).s, key.s);
    const zmem *z = &k->m[mi];
    if (z->method != 0)
        return pk_fail(k, PI2_EUNSUPPORTED, "storage '%s': member '%s' is compressed (method %u; torch stores "
                       "storages uncompressed)", key.s, show_n(z->name, z->nlen).s, z->method);
    if (z->usize != nbytes)
        return pk_fail(k, PI2_EFORMAT, "storage '%s': %s of %llu elements needs %zu bytes but member '%s' holds %llu",
                       key.s, storage_name(dt), (unsigned long long)numel, nbytes, show_n(z->name, z->nlen).s,
                       (unsigned long long)z->usize);
    uint32_t s = k->mem_stor[mi];
    if (s) {
        const pstor *o = &k->stors[s - 1];
        if (o->dt != dt || o->numel != numel)
            return pk_fail(k, PI2_EFORMAT, "storage '%s' declared again as %s of %llu elements (first %s of %llu)",
                           key.s, storage_name(dt), (unsigned long long)numel, storage_name(o->dt),
                           (unsigned long long)o->numel);
        *out = (pv){ .kind = PV_STORAGE, .u = s - 1 };
        return 0;
    }
    int rc = pk_spend(k, 1);
    if (rc != 0)
        return rc;
    if (pi2_grow(&k->stors, &k->storcap, k->nstors, sizeof *k->stors, 16) != 0)
        return pk_nomem(k);
    k->stors[k->nstors] = (pstor){ .member = (uint32_t)mi, .dt = dt, .numel = numel };
    k->mem_stor[mi] = (uint32_t)++k->nstors;
    *out = (pv){ .kind = PV_STORAGE, .u = k->nstors - 1 };
    return 0;
}

static void fmt_dims(char *buf, size_t cap, const pv *v, uint32_t n)
{
    size_t o = 0;
    o += (size_t)snprintf(buf + o, cap - o, "[");
    for (uint32_t i = 0; i < n && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? ", " : "", (long long)v[i].u);
    if (o < cap)
        snprintf(buf + o, cap - o, "]");
}

static bool empty_dict(const pk *k, pv v) { return v.kind == PV_DICT && k->dicts[v.u].nitems == 0; }

/* torch._utils._rebuild_tensor_v2(storage, storage_offset, size, stride,
 * requires_grad, backward_hooks[, metadata]) */
static int pk_tensor(pk *k, pv args, pv *out)
{
    if (args.n != 6 && args.n != 7)
        return pk_fail(k, PI2_EFORMAT, "_rebuild_tensor_v2 takes 6 or 7 arguments, not %u", args.n);
    const pv *a = k->kids + args.u;
    if (a[0].kind != PV_STORAGE)
        return pk_fail(k, PI2_EFORMAT, "tensor storage is a %s", kind_name[a[0].kind]);
    if (a[1].kind != PV_INT || (int64_t)a[1].u < 0)
        return pk_fail(k, PI2_EFORMAT, "tensor storage_offset is %s", a[1].kind == PV_INT ? "negative" : "not an int");
    if (a[2].kind != PV_TUPLE || a[3].kind != PV_TUPLE)
        return pk_fail(k, PI2_EFORMAT, "tensor size and stride must be tuples (%s, %s)", kind_name[a[2].kind],
                       kind_name[a[3].kind]);
    uint32_t nd = a[2].n;
    if (nd > PI2_ST_MAX_DIMS)
        return pk_fail(k, PI2_ERANGE, "tensor has %u dims (limit %d)", nd, PI2_ST_MAX_DIMS);
    if (a[3].n != nd)
        return pk_fail(k, PI2_EFORMAT, "tensor size has %u dims but its stride %u", nd, a[3].n);
    const pv *size = k->kids + a[2].u, *stride = k->kids + a[3].u;
    const pstor *s = &k->stors[a[0].u];
    ptens t = { .stor = (uint32_t)a[0].u, .ndim = (int)nd, .nelem = 1, .offset = a[1].u };
    for (uint32_t i = 0; i < nd; i++) {
        if (size[i].kind != PV_INT || stride[i].kind != PV_INT)
            return pk_fail(k, PI2_EFORMAT, "tensor size or stride holds a %s",
                           kind_name[size[i].kind != PV_INT ? size[i].kind : stride[i].kind]);
        int64_t d = (int64_t)size[i].u;
        if (d < 0)
            return pk_fail(k, PI2_EFORMAT, "negative tensor size %lld in dim %u", (long long)d, i);
        t.shape[i] = d;
        if ((uint64_t)d > SIZE_MAX || !pi2_mul_size(t.nelem, (size_t)d, &t.nelem))
            return pk_fail(k, PI2_ERANGE, "tensor element count overflows");
    }
    size_t nbytes;
    if (!pi2_mul_size(t.nelem, pi2_dtype_size(s->dt), &nbytes))
        return pk_fail(k, PI2_ERANGE, "tensor byte size overflows");
    if (t.nelem > 0) {
        /* contiguous as torch defines it: dims of size 1 may have any stride */
        uint64_t expect = 1;
        for (uint32_t i = nd; i-- > 0;) {
            if (t.shape[i] == 1)
                continue;
            if ((int64_t)stride[i].u < 0 || stride[i].u != expect) {
                char sz[160], sd[160];
                fmt_dims(sz, sizeof sz, size, nd);
                fmt_dims(sd, sizeof sd, stride, nd);
                return pk_fail(k, PI2_EUNSUPPORTED, "tensor of size %s is not contiguous (stride %s)", sz, sd);
            }
            expect *= (uint64_t)t.shape[i]; /* <= nelem: no overflow */
        }
    }
    if (a[4].kind != PV_BOOL)
        return pk_fail(k, PI2_EFORMAT, "tensor requires_grad is a %s, not a bool", kind_name[a[4].kind]);
    if (a[5].kind != PV_DICT)
        return pk_fail(k, PI2_EFORMAT, "tensor backward_hooks is a %s, not a dict", kind_name[a[5].kind]);
    if (!empty_dict(k, a[5]))
        return pk_fail(k, PI2_EUNSUPPORTED, "tensor has backward hooks");
    if (args.n == 7 && a[6].kind != PV_NONE) {
        if (a[6].kind != PV_DICT)
            return pk_fail(k, PI2_EFORMAT, "tensor metadata is a %s, not a dict", kind_name[a[6].kind]);
        if (!empty_dict(k, a[6]))
            return pk_fail(k, PI2_EUNSUPPORTED, "tensor carries metadata (conjugate or negative bit)");
    }
    if (t.offset > s->numel || t.nelem > s->numel - t.offset) {
        const zmem *z = &k->m[s->member];
        return pk_fail(k, PI2_EFORMAT, "tensor of %zu elements at storage_offset %llu runs past the end of its storage "
                       "'%s' (%llu elements)", t.nelem, (unsigned long long)t.offset, show_n(z->name, z->nlen).s,
                       (unsigned long long)s->numel);
    }
    if (k->ntens >= PI2_ST_MAX_TENSORS)
        return pk_fail(k, PI2_ERANGE, "more than %u tensors", (unsigned)PI2_ST_MAX_TENSORS);
    int rc = pk_spend(k, 1);
    if (rc != 0)
        return rc;
    if (pi2_grow(&k->tens, &k->tenscap, k->ntens, sizeof *k->tens, 16) != 0)
        return pk_nomem(k);
    k->tens[k->ntens] = t;
    *out = (pv){ .kind = PV_TENSOR, .u = k->ntens++ };
    return 0;
}

static int pk_reduce(pk *k, pv fn, pv args, pv *out)
{
    if (fn.kind != PV_GLOBAL)
        return pk_fail(k, PI2_EUNSUPPORTED, "REDUCE of a %s", kind_name[fn.kind]);
    if (args.kind != PV_TUPLE)
        return pk_fail(k, PI2_EFORMAT, "REDUCE arguments are a %s, not a tuple", kind_name[args.kind]);
    const pv *a = args.n ? k->kids + args.u : NULL; /* no items stored yet for () */
    switch (fn.g) {
    case G_ODICT:
        if (args.n != 0)
            return pk_fail(k, PI2_EUNSUPPORTED, "collections.OrderedDict called with %u arguments", args.n);
        return pk_new_dict(k, true, out);
    case G_REBUILD_V2:
        return pk_tensor(k, args, out);
    case G_REBUILD_PARAM:
        if (args.n != 3 || a[0].kind != PV_TENSOR || a[1].kind != PV_BOOL || a[2].kind != PV_DICT)
            return pk_fail(k, PI2_EFORMAT, "_rebuild_parameter takes (tensor, bool, dict)");
        if (!empty_dict(k, a[2]))
            return pk_fail(k, PI2_EUNSUPPORTED, "parameter has backward hooks");
        *out = a[0];
        return 0;
    default:
        return pk_fail(k, PI2_EUNSUPPORTED, "REDUCE of torch.%s", storage_name((pi2_dtype)(fn.g - G_STORAGE)));
    }
}

/* Read one '\n'-terminated GLOBAL operand line. */
static int pk_line(pk *k, pi2_cursor *c, const uint8_t **s, size_t *n)
{
    size_t lim = c->left < PI2_TZ_MAX_STR + 1 ? c->left : PI2_TZ_MAX_STR + 1;
    const uint8_t *nl = memchr(c->p, '\n', lim);
    if (!nl)
        return c->left > PI2_TZ_MAX_STR ? pk_fail(k, PI2_ERANGE, "GLOBAL name longer than %u bytes",
                                                  (unsigned)PI2_TZ_MAX_STR)
                                        : pk_fail(k, PI2_EFORMAT, "GLOBAL operand runs past the end of data.pkl");
    *s = c->p;
    *n = (size_t)(nl - c->p);
    const uint8_t *skip;
    pi2_cursor_take(c, *n + 1, &skip);
    return 0;
}

static int pk_memo_put(pk *k, uint8_t op, uint64_t i)
{
    int rc = pk_need(k, op, 1);
    if (rc != 0)
        return rc;
    if (i < k->nmemo) {
        k->memo[i] = k->st[k->sp - 1];
        return 0;
    }
    if (i > k->nmemo)
        return pk_fail(k, PI2_EFORMAT, "memo index %llu skips past the memo's %zu entries", (unsigned long long)i,
                       k->nmemo);
    if (k->nmemo >= PI2_TZ_MAX_MEMO)
        return pk_fail(k, PI2_ERANGE, "more than %u memo entries", (unsigned)PI2_TZ_MAX_MEMO);
    if (pi2_grow(&k->memo, &k->memocap, k->nmemo, sizeof *k->memo, 64) != 0)
        return pk_nomem(k);
    k->memo[k->nmemo++] = k->st[k->sp - 1];
    return 0;
}

static int pk_memo_get(pk *k, uint64_t i)
{
    if (i >= k->nmemo)
        return pk_fail(k, PI2_EFORMAT, "memo index %llu out of range (%zu entries)", (unsigned long long)i, k->nmemo);
    return pk_push(k, k->memo[i]);
}

/* Run data.pkl to STOP; *result gets the value it returns. */
static int pk_run(pk *k, pv *result)
{
    pi2_cursor c = { k->p0, k->len };
    int rc = 0;
    for (;;) {
        k->at = k->len - c.left;
        const uint8_t *p, *q;
        if (!pi2_cursor_take(&c, 1, &p))
            return pk_fail(k, PI2_EFORMAT, "data.pkl ends without STOP");
        uint8_t op = *p;
        pv v = { 0 };
        /* operand of n bytes */
#define ARG(n)                                                                                                   \
    do {                                                                                                         \
        if (!pi2_cursor_take(&c, (n), &q))                                                                       \
            return pk_fail(k, PI2_EFORMAT, "%s operand runs past the end of data.pkl", op_name(op));             \
    } while (0)
        switch (op) {
        case OP_PROTO:
            ARG(1);
            if (*q > 5)
                return pk_fail(k, PI2_EUNSUPPORTED, "pickle protocol %u (known: 0-5)", *q);
            break;
        case OP_FRAME: {
            ARG(8);
            uint64_t fl = rd64(q);
            if (fl > c.left)
                return pk_fail(k, PI2_EFORMAT, "FRAME of %llu bytes runs past the end of data.pkl",
                               (unsigned long long)fl);
            break;
        }
        case OP_STOP:
            if (k->nmarks)
                return pk_fail(k, PI2_EFORMAT, "STOP with %zu open MARKs", k->nmarks);
            if (k->sp != 1)
                return pk_fail(k, PI2_EFORMAT, "STOP with %zu values on the stack, not 1", k->sp);
            if (c.left)
                return pk_fail(k, PI2_EFORMAT, "%zu bytes after STOP", c.left);
            *result = k->st[0];
            return 0;
        case OP_MARK:
            if (k->nmarks >= PI2_TZ_MAX_MARKS)
                return pk_fail(k, PI2_ERANGE, "more than %d nested MARKs", PI2_TZ_MAX_MARKS);
            k->marks[k->nmarks++] = k->sp;
            break;
        case OP_EMPTY_DICT:
            if ((rc = pk_new_dict(k, false, &v)) != 0 || (rc = pk_push(k, v)) != 0)
                return rc;
            break;
        case OP_EMPTY_LIST:
            if ((rc = pk_push(k, (pv){ .kind = PV_LIST })) != 0)
                return rc;
            break;
        case OP_EMPTY_TUPLE:
            if ((rc = pk_push(k, (pv){ .kind = PV_TUPLE })) != 0)
                return rc;
            break;
        case OP_TUPLE: {
            size_t from = 0, n = 0;
            if ((rc = pk_pop_mark(k, op, &from, &n)) != 0 || (rc = pk_tuple(k, from, n, &v)) != 0)
                return rc;
            k->sp = from;
            if ((rc = pk_push(k, v)) != 0)
                return rc;
            break;
        }
        case OP_TUPLE1:
        case OP_TUPLE2:
        case OP_TUPLE3: {
            size_t n = (size_t)(op - OP_TUPLE1 + 1);
            if ((rc = pk_need(k, op, n)) != 0 || (rc = pk_tuple(k, k->sp - n, n, &v)) != 0)
                return rc;
            k->sp -= n;
            if ((rc = pk_push(k, v)) != 0)
                return rc;
            break;
        }
        case OP_NONE:
            if ((rc = pk_push(k, (pv){ .kind = PV_NONE })) != 0)
                return rc;
            break;
        case OP_NEWTRUE:
        case OP_NEWFALSE:
            if ((rc = pk_push(k, (pv){ .kind = PV_BOOL, .u = op == OP_NEWTRUE })) != 0)
                return rc;
            break;
        case OP_BININT:
            ARG(4);
            v = (pv){ .kind = PV_INT, .u = (uint64_t)((int64_t)(rd32(q) ^ 0x80000000u) - 0x80000000) };
            if ((rc = pk_push(k, v)) != 0)
                return rc;
            break;
        case OP_BININT1:
            ARG(1);
            if ((rc = pk_push(k, (pv){ .kind = PV_INT, .u = *q })) != 0)
                return rc;
            break;
        case OP_BININT2:
            ARG(2);
            if ((rc = pk_push(k, (pv){ .kind = PV_INT, .u = rd16(q) })) != 0)
                return rc;
            break;
        case OP_LONG1: {
            ARG(1);
            size_t n = *q;
            if (n > 8)
                return pk_fail(k, PI2_ERANGE, "integer of %zu bytes (limit 8)", n);
            ARG(n);
            uint64_t u = 0;
            for (size_t i = 0; i < n; i++)
                u |= (uint64_t)q[i] << (8 * i);
            if (n > 0 && n < 8 && (q[n - 1] & 0x80))
                u |= ~(uint64_t)0 << (8 * n); /* sign-extend: two's complement bits */
            if ((rc = pk_push(k, (pv){ .kind = PV_INT, .u = u })) != 0)
                return rc;
            break;
        }
        case OP_BINUNICODE:
        case OP_SHORT_BINUNICODE:
        case OP_BINUNICODE8: {
            uint64_t n;
            if (op == OP_SHORT_BINUNICODE) {
                ARG(1);
                n = *q;
            } else if (op == OP_BINUNICODE) {
                ARG(4);
                n = rd32(q);
            } else {
                ARG(8);
                n = rd64(q);
            }
            if (n > PI2_TZ_MAX_STR)
                return pk_fail(k, PI2_ERANGE, "string of %llu bytes (limit %u)", (unsigned long long)n,
                               (unsigned)PI2_TZ_MAX_STR);
            ARG((size_t)n);
            if (!utf8_valid(q, (size_t)n))
                return pk_fail(k, PI2_EFORMAT, "string is not valid UTF-8");
            v = (pv){ .kind = PV_STR, .n = (uint32_t)n, .u = (uint64_t)(q - k->p0) };
            if ((rc = pk_push(k, v)) != 0)
                return rc;
            break;
        }
        case OP_BINPUT:
            ARG(1);
            if ((rc = pk_memo_put(k, op, *q)) != 0)
                return rc;
            break;
        case OP_LONG_BINPUT:
            ARG(4);
            if ((rc = pk_memo_put(k, op, rd32(q))) != 0)
                return rc;
            break;
        case OP_MEMOIZE:
            if ((rc = pk_memo_put(k, op, k->nmemo)) != 0)
                return rc;
            break;
        case OP_BINGET:
            ARG(1);
            if ((rc = pk_memo_get(k, *q)) != 0)
                return rc;
            break;
        case OP_LONG_BINGET:
            ARG(4);
            if ((rc = pk_memo_get(k, rd32(q))) != 0)
                return rc;
            break;
        case OP_SETITEM: {
            if ((rc = pk_need(k, op, 3)) != 0)
                return rc;
            pv d = k->st[k->sp - 3];
            if (d.kind != PV_DICT)
                return pk_fail(k, PI2_EFORMAT, "SETITEM on a %s", kind_name[d.kind]);
            if ((rc = pk_setitem(k, d, k->st[k->sp - 2], k->st[k->sp - 1])) != 0)
                return rc;
            k->sp -= 2;
            break;
        }
        case OP_SETITEMS:
        case OP_APPENDS: {
            size_t from = 0, n = 0;
            if ((rc = pk_pop_mark(k, op, &from, &n)) != 0)
                return rc;
            if (from <= pk_base(k))
                return pk_fail(k, PI2_EFORMAT, "stack underflow: %s has no %s under its MARK", op_name(op),
                               op == OP_SETITEMS ? "dict" : "list");
            pv d = k->st[from - 1];
            if (d.kind != (op == OP_SETITEMS ? PV_DICT : PV_LIST))
                return pk_fail(k, PI2_EFORMAT, "%s on a %s", op_name(op), kind_name[d.kind]);
            if (op == OP_SETITEMS) {
                if (n % 2)
                    return pk_fail(k, PI2_EFORMAT, "SETITEMS with an odd number (%zu) of values", n);
                for (size_t i = 0; i < n; i += 2)
                    if ((rc = pk_setitem(k, d, k->st[from + i], k->st[from + i + 1])) != 0)
                        return rc;
            }
            k->sp = from; /* list items are not kept: no state dict value lives in a list */
            break;
        }
        case OP_APPEND:
            if ((rc = pk_need(k, op, 2)) != 0)
                return rc;
            if (k->st[k->sp - 2].kind != PV_LIST)
                return pk_fail(k, PI2_EFORMAT, "APPEND on a %s", kind_name[k->st[k->sp - 2].kind]);
            k->sp--;
            break;
        case OP_GLOBAL: {
            const uint8_t *mod, *name;
            size_t ml, nl;
            if ((rc = pk_line(k, &c, &mod, &ml)) != 0 || (rc = pk_line(k, &c, &name, &nl)) != 0 ||
                (rc = pk_global(k, mod, ml, name, nl, &v)) != 0 || (rc = pk_push(k, v)) != 0)
                return rc;
            break;
        }
        case OP_STACK_GLOBAL: {
            if ((rc = pk_need(k, op, 2)) != 0)
                return rc;
            pv mod = k->st[k->sp - 2], name = k->st[k->sp - 1];
            if (mod.kind != PV_STR || name.kind != PV_STR)
                return pk_fail(k, PI2_EFORMAT, "STACK_GLOBAL of a %s and a %s", kind_name[mod.kind],
                               kind_name[name.kind]);
            if ((rc = pk_global(k, k->p0 + mod.u, mod.n, k->p0 + name.u, name.n, &v)) != 0)
                return rc;
            k->sp -= 2;
            if ((rc = pk_push(k, v)) != 0)
                return rc;
            break;
        }
        case OP_REDUCE:
            if ((rc = pk_need(k, op, 2)) != 0 ||
                (rc = pk_reduce(k, k->st[k->sp - 2], k->st[k->sp - 1], &v)) != 0)
                return rc;
            k->sp -= 2;
            if ((rc = pk_push(k, v)) != 0)
                return rc;
            break;
        case OP_BUILD: {
            if ((rc = pk_need(k, op, 2)) != 0)
                return rc;
            pv obj = k->st[k->sp - 2], state = k->st[k->sp - 1];
            if (obj.kind != PV_DICT || !k->dicts[obj.u].ordered)
                return pk_fail(k, PI2_EUNSUPPORTED, "BUILD on a %s", obj.kind == PV_DICT ? "plain dict" :
                               kind_name[obj.kind]);
            if (state.kind != PV_DICT)
                return pk_fail(k, PI2_EUNSUPPORTED, "BUILD of an OrderedDict with a %s state", kind_name[state.kind]);
            k->sp--; /* the state (a module's _metadata) is dropped */
            break;
        }
        case OP_BINPERSID:
            if ((rc = pk_need(k, op, 1)) != 0 || (rc = pk_storage(k, k->st[k->sp - 1], &v)) != 0)
                return rc;
            k->st[k->sp - 1] = v;
            break;
        default: {
            const char *nm = op_name(op);
            return nm ? pk_fail(k, PI2_EUNSUPPORTED, "refused opcode %s (0x%02x)", nm, op)
                      : pk_fail(k, PI2_EUNSUPPORTED, "refused opcode 0x%02x (not a pickle opcode)", op);
        }
        }
#undef ARG
    }
}

typedef struct tkey {
    const uint8_t *s;
    uint32_t n, i;
} tkey;

static int tkey_cmp(const void *pa, const void *pb)
{
    const tkey *a = pa, *b = pb;
    return name_cmp(a->s, a->n, b->s, b->n);
}

/* The top level: a dict of distinct names to tensors, into views. */
static int pk_result(pk *k, pv top, pi2_st_tensor **out, size_t *count, char **names)
{
    if (top.kind != PV_DICT)
        return pk_fail(k, PI2_EUNSUPPORTED, "the pickle holds a %s, not a dict of name -> tensor", kind_name[top.kind]);
    size_t n = k->dicts[top.u].nitems;
    if (n > PI2_ST_MAX_TENSORS)
        return pk_fail(k, PI2_ERANGE, "%zu top-level entries (limit %u tensors)", n, (unsigned)PI2_ST_MAX_TENSORS);
    tkey *keys = pi2_malloc_array(n, sizeof *keys);
    pi2_st_tensor *t = pi2_calloc_array(n, sizeof *t);
    char *arena = NULL;
    int rc = 0;
    if (!keys || !t) {
        rc = pk_nomem(k);
        goto fail;
    }
    size_t j = 0, alen = 0;
    for (size_t i = 0; i < k->nitems && j < n; i++) {
        const pitem *it = &k->items[i];
        if (it->dict != top.u)
            continue;
        if (it->k.kind != PV_STR) {
            rc = pk_fail(k, PI2_EUNSUPPORTED, "top-level key is a %s, not a name", kind_name[it->k.kind]);
            goto fail;
        }
        if (memchr(k->p0 + it->k.u, 0, it->k.n)) {
            rc = pk_fail(k, PI2_EFORMAT, "top-level key '%s' holds a NUL", pk_str(k, it->k).s);
            goto fail;
        }
        if (it->v.kind != PV_TENSOR) {
            rc = pk_fail(k, PI2_EUNSUPPORTED, "entry '%s' is a %s, not a tensor (a checkpoint that nests its state "
                         "dict?)", pk_str(k, it->k).s, kind_name[it->v.kind]);
            goto fail;
        }
        keys[j] = (tkey){ .s = k->p0 + it->k.u, .n = it->k.n, .i = (uint32_t)i };
        alen += it->k.n + 1; /* bounded by data.pkl's size */
        j++;
    }
    assert(j == n);
    qsort(keys, n, sizeof *keys, tkey_cmp);
    for (size_t i = 1; i < n; i++)
        if (tkey_cmp(&keys[i - 1], &keys[i]) == 0) {
            rc = pk_fail(k, PI2_EFORMAT, "duplicate key '%s'", show_n(keys[i].s, keys[i].n).s);
            goto fail;
        }
    arena = malloc(alen ? alen : 1);
    if (!arena) {
        rc = pk_nomem(k);
        goto fail;
    }
    char *a = arena;
    j = 0;
    for (size_t i = 0; i < k->nitems && j < n; i++) {
        const pitem *it = &k->items[i];
        if (it->dict != top.u)
            continue;
        const ptens *pt = &k->tens[it->v.u];
        const pstor *s = &k->stors[pt->stor];
        const zmem *z = &k->m[s->member];
        pi2_st_tensor *o = &t[j++];
        memcpy(a, k->p0 + it->k.u, it->k.n);
        a[it->k.n] = 0;
        o->name = a;
        a += it->k.n + 1;
        o->dtype = s->dt;
        o->ndim = pt->ndim;
        memcpy(o->shape, pt->shape, sizeof o->shape);
        o->nelem = pt->nelem;
        o->nbytes = pt->nelem * pi2_dtype_size(s->dt); /* checked in pk_tensor */
        o->data = k->img + z->off + pt->offset * pi2_dtype_size(s->dt); /* inside the member: checked */
        o->file = k->path;
    }
    free(keys);
    *out = t;
    *count = n;
    *names = arena;
    return 0;
fail:
    free(keys);
    free(t);
    free(arena);
    return rc;
}

static void pk_free(pk *k)
{
    free(k->mem_stor);
    free(k->st);
    free(k->memo);
    free(k->kids);
    free(k->dicts);
    free(k->items);
    free(k->stors);
    free(k->tens);
}

/* ======================= torch layer ======================= */

bool pi2_tz_is_zip(const void *buf, size_t len)
{
    const uint8_t *b = buf;
    return buf && len >= 4 && b[0] == 'P' && b[1] == 'K' && ((b[2] == 3 && b[3] == 4) || (b[2] == 5 && b[3] == 6));
}

/* A small stored member's bytes, or an error naming why not. */
static int small_member(pk *k, int64_t mi, const uint8_t **p, size_t *n)
{
    const zmem *z = &k->m[mi];
    if (z->method != 0)
        return pi2_err_set(k->err, PI2_EUNSUPPORTED, "%s: member '%s' is compressed (method %u)", k->path,
                           show_n(z->name, z->nlen).s, z->method);
    *p = k->img + z->off;
    *n = (size_t)z->usize;
    return 0;
}

int pi2_tz_parse(const void *buf, size_t len, const char *path, pi2_st_tensor **tensors, size_t *count, char **names,
                 pi2_err *err)
{
    if (tensors)
        *tensors = NULL;
    if (count)
        *count = 0;
    if (names)
        *names = NULL;
    if (!path)
        path = "<buffer>";
    if (!tensors || !count || !names || (!buf && len))
        return pi2_err_set(err, PI2_EINVAL, "%s: pi2_tz_parse: NULL argument", path);
    pk k = { .path = path, .img = buf, .err = err };
    zmem *m = NULL;
    uint32_t *sorted = NULL;
    size_t nm;
    int rc = zip_walk(buf, len, path, &m, &nm, &sorted, err);
    if (rc != 0)
        return rc;
    k.m = m;
    k.nm = nm;
    k.sorted = sorted;
    /* One folder holds every member; torch takes its name from the first. */
    const uint8_t *slash = memchr(m[0].name, '/', m[0].nlen);
    if (!slash || slash == m[0].name) {
        rc = pi2_err_set(err, PI2_EFORMAT, "%s: member '%s' is not inside an archive folder", path,
                         show_n(m[0].name, m[0].nlen).s);
        goto out;
    }
    k.prefix = m[0].name;
    k.plen = (size_t)(slash - m[0].name);
    for (size_t i = 0; i < nm; i++) {
        if (m[i].nlen <= k.plen + 1 || memcmp(m[i].name, k.prefix, k.plen + 1) != 0) {
            rc = pi2_err_set(err, PI2_EFORMAT, "%s: member '%s' is outside the archive folder '%s'", path,
                             show_n(m[i].name, m[i].nlen).s, show_n(k.prefix, k.plen).s);
            goto out;
        }
    }
    char pkl[PI2_TZ_MAX_NAME + 16];
    snprintf(pkl, sizeof pkl, "%.*s/data.pkl", (int)k.plen, (const char *)k.prefix);
    k.pkl = show(pkl);
    int64_t mi = pk_member(&k, "data.pkl", NULL, 0);
    if (mi < 0) {
        rc = pi2_err_set(err, PI2_EFORMAT, "%s: no member '%s' (not a torch.save checkpoint)", path, k.pkl.s);
        goto out;
    }
    if ((rc = small_member(&k, mi, &k.p0, &k.len)) != 0)
        goto out;
    if (m[mi].usize > PI2_TZ_MAX_PICKLE) {
        rc = pi2_err_set(err, PI2_ERANGE, "%s: member '%s' is %llu bytes (limit %u)", path, k.pkl.s,
                         (unsigned long long)m[mi].usize, (unsigned)PI2_TZ_MAX_PICKLE);
        goto out;
    }
    /* version: decimal digits, as torch writes and reads it */
    int64_t vi = pk_member(&k, "version", NULL, 0);
    if (vi < 0)
        vi = pk_member(&k, ".data/version", NULL, 0);
    const uint8_t *vp;
    size_t vn;
    if (vi < 0) {
        rc = pi2_err_set(err, PI2_EFORMAT, "%s: no member '%s/version' (not a torch.save checkpoint)", path,
                         show_n(k.prefix, k.plen).s);
        goto out;
    }
    if ((rc = small_member(&k, vi, &vp, &vn)) != 0)
        goto out;
    size_t digits = 0;
    while (digits < vn && vp[digits] >= '0' && vp[digits] <= '9')
        digits++;
    if (digits == 0 || digits > 20 || vn - digits > 1 || (vn > digits && vp[digits] != '\n')) {
        rc = pi2_err_set(err, PI2_EFORMAT, "%s: member '%s' does not hold a version number", path,
                         show_n(m[vi].name, m[vi].nlen).s);
        goto out;
    }
    int64_t bi = pk_member(&k, "byteorder", NULL, 0);
    if (bi >= 0) {
        const uint8_t *bp;
        size_t bn;
        if ((rc = small_member(&k, bi, &bp, &bn)) != 0)
            goto out;
        if (bn == 3 && memcmp(bp, "big", 3) == 0) {
            rc = pi2_err_set(err, PI2_EUNSUPPORTED, "%s: storages are big-endian (byteorder 'big')", path);
            goto out;
        }
        if (bn != 6 || memcmp(bp, "little", 6) != 0) {
            rc = pi2_err_set(err, PI2_EFORMAT, "%s: byteorder member holds '%s', not 'little' or 'big'", path,
                             show_n(bp, bn).s);
            goto out;
        }
    }
    k.mem_stor = pi2_calloc_array(nm, sizeof *k.mem_stor);
    if (!k.mem_stor) {
        rc = pk_nomem(&k);
        goto out;
    }
    pv top = { 0 };
    if ((rc = pk_run(&k, &top)) == 0)
        rc = pk_result(&k, top, tensors, count, names);
out:
    pk_free(&k);
    free(m);
    free(sorted);
    return rc;
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

static void wr16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void wr32(uint8_t *p, uint32_t v)
{
    wr16(p, (uint16_t)v);
    wr16(p + 2, (uint16_t)(v >> 16));
}
static void wr64(uint8_t *p, uint64_t v)
{
    wr32(p, (uint32_t)v);
    wr32(p + 4, (uint32_t)(v >> 32));
}
static uint32_t sat32(uint64_t v) { return v < U32_SAT ? (uint32_t)v : U32_SAT; }

enum { DOS_DATE_1980_01_01 = (0 << 9) | (1 << 5) | 1 };

/* ---- zip emitter: miniz's layout in zip64 mode ---- */

typedef struct zent {
    char *name;
    uint64_t lho, size;
    uint32_t crc;
    uint16_t flags;
    bool z64; /* the local header has a zip64 record: 8-byte descriptor sizes */
} zent;

typedef struct zw {
    const char *path; /* for messages */
    pi2_afile *af;
    uint64_t pos;
    zent *e;
    size_t n, cap;
    bool open;
    uint64_t left; /* bytes still to come in the open member */
    uint32_t crc;
} zw;

static void zw_release(zw *z)
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

static int zw_begin(zw *z, const char *name, uint64_t size, pi2_err *err)
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

static int zw_data(zw *z, const void *p, size_t n, pi2_err *err)
{
    assert(z->open && n <= z->left);
    z->crc = crc32_update(z->crc, p, n);
    z->left -= n;
    return zw_put(z, p, n, err);
}

static int zw_end(zw *z, pi2_err *err)
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
static int zw_finish(zw *z, pi2_err *err)
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

/* ---- pickle emitter: what Python's pickler writes (protocol 2) ---- */

typedef struct pb {
    uint8_t *b;
    size_t n, cap;
    uint32_t memo; /* next memo index */
    bool oom;
} pb;

static void pb_put(pb *b, const void *p, size_t n)
{
    if (b->oom || n == 0)
        return;
    while (b->cap - b->n < n) {
        size_t nc = b->cap ? b->cap * 2 : 4096;
        uint8_t *nb = nc > b->cap ? realloc(b->b, nc) : NULL;
        if (!nb) {
            b->oom = true;
            return;
        }
        b->b = nb;
        b->cap = nc;
    }
    memcpy(b->b + b->n, p, n);
    b->n += n;
}

static void pb_op(pb *b, uint8_t op) { pb_put(b, &op, 1); }

static void pb_op_u32(pb *b, uint8_t op, uint32_t v)
{
    uint8_t x[5] = { op };
    wr32(x + 1, v);
    pb_put(b, x, 5);
}

/* Memoize the value just written; its memo index. */
static uint32_t pb_memoize(pb *b)
{
    uint32_t i = b->memo++;
    if (i < 256) {
        uint8_t x[2] = { OP_BINPUT, (uint8_t)i };
        pb_put(b, x, 2);
    } else {
        pb_op_u32(b, OP_LONG_BINPUT, i);
    }
    return i;
}

static void pb_get(pb *b, uint32_t i)
{
    if (i < 256) {
        uint8_t x[2] = { OP_BINGET, (uint8_t)i };
        pb_put(b, x, 2);
    } else {
        pb_op_u32(b, OP_LONG_BINGET, i);
    }
}

static uint32_t pb_str(pb *b, const char *s, size_t n)
{
    pb_op_u32(b, OP_BINUNICODE, (uint32_t)n);
    pb_put(b, s, n);
    return pb_memoize(b);
}

static uint32_t pb_global(pb *b, const char *mod, const char *name)
{
    pb_op(b, OP_GLOBAL);
    pb_put(b, mod, strlen(mod));
    pb_op(b, '\n');
    pb_put(b, name, strlen(name));
    pb_op(b, '\n');
    return pb_memoize(b);
}

/* As pickle's save_long: BININT1/BININT2/BININT, else LONG1 with the
 * shortest two's complement. */
static void pb_int(pb *b, int64_t v)
{
    uint8_t x[10];
    if (v >= 0 && v <= 0xff) {
        x[0] = OP_BININT1;
        x[1] = (uint8_t)v;
        pb_put(b, x, 2);
    } else if (v >= 0 && v <= 0xffff) {
        x[0] = OP_BININT2;
        wr16(x + 1, (uint16_t)v);
        pb_put(b, x, 3);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
        pb_op_u32(b, OP_BININT, (uint32_t)v);
    } else {
        uint64_t u = (uint64_t)v;
        size_t n = 8;
        /* drop top bytes that are pure sign extension of the byte below */
        while (n > 1 && (((u >> (8 * (n - 1))) & 0xff) == (v < 0 ? 0xff : 0)) &&
               (((u >> (8 * (n - 2))) & 0x80) == (v < 0 ? 0x80u : 0)))
            n--;
        x[0] = OP_LONG1;
        x[1] = (uint8_t)n;
        for (size_t i = 0; i < n; i++)
            x[2 + i] = (uint8_t)(u >> (8 * i));
        pb_put(b, x, 2 + n);
    }
}

/* A tuple of ints as save_tuple writes it (the empty one unmemoized). */
static void pb_int_tuple(pb *b, const int64_t *v, int n)
{
    if (n == 0) {
        pb_op(b, OP_EMPTY_TUPLE);
        return;
    }
    if (n > 3)
        pb_op(b, OP_MARK);
    for (int i = 0; i < n; i++)
        pb_int(b, v[i]);
    pb_op(b, n > 3 ? OP_TUPLE : (uint8_t)(OP_TUPLE1 + n - 1));
    pb_memoize(b);
}

typedef struct wt {
    char *name;
    pi2_dtype dt;
    int ndim;
    int64_t shape[PI2_ST_MAX_DIMS];
    uint64_t nbytes, nelem;
} wt;

/* data.pkl for an OrderedDict of tensors, storage i = tensor i. */
static int pb_state_dict(pb *b, const wt *t, size_t n)
{
    const uint32_t NONE_YET = UINT32_MAX; /* memo index of what is not memoized yet */
    uint32_t m_rebuild = NONE_YET, m_storage = NONE_YET, m_cpu = NONE_YET, m_type[8];
    for (size_t i = 0; i < 8; i++)
        m_type[i] = NONE_YET;
    uint8_t proto[2] = { OP_PROTO, 2 };
    pb_put(b, proto, 2);
    uint32_t m_od = pb_global(b, "collections", "OrderedDict");
    pb_op(b, OP_EMPTY_TUPLE);
    pb_op(b, OP_REDUCE);
    pb_memoize(b);
    for (size_t lo = 0; lo < n; lo += 1000) { /* pickle's _batch_setitems */
        size_t hi = n - lo > 1000 ? lo + 1000 : n;
        if (hi - lo > 1)
            pb_op(b, OP_MARK);
        for (size_t i = lo; i < hi; i++) {
            const wt *e = &t[i];
            pb_str(b, e->name, strlen(e->name));
            if (m_rebuild == NONE_YET)
                m_rebuild = pb_global(b, "torch._utils", "_rebuild_tensor_v2");
            else
                pb_get(b, m_rebuild);
            pb_op(b, OP_MARK); /* the 6 arguments */
            pb_op(b, OP_MARK); /* the persistent id */
            if (m_storage == NONE_YET)
                m_storage = pb_str(b, "storage", 7);
            else
                pb_get(b, m_storage);
            if (m_type[e->dt] == NONE_YET)
                m_type[e->dt] = pb_global(b, "torch", storage_name(e->dt));
            else
                pb_get(b, m_type[e->dt]);
            char key[24];
            int kl = snprintf(key, sizeof key, "%zu", i);
            pb_str(b, key, (size_t)kl);
            if (m_cpu == NONE_YET)
                m_cpu = pb_str(b, "cpu", 3);
            else
                pb_get(b, m_cpu);
            pb_int(b, (int64_t)e->nelem);
            pb_op(b, OP_TUPLE);
            pb_memoize(b);
            pb_op(b, OP_BINPERSID);
            pb_int(b, 0); /* storage_offset */
            int64_t stride[PI2_ST_MAX_DIMS];
            int64_t s = 1;
            for (int d = e->ndim; d-- > 0;) {
                stride[d] = s;
                s *= e->shape[d] ? e->shape[d] : 1; /* torch: strides of an empty tensor as if each dim were >= 1 */
            }
            pb_int_tuple(b, e->shape, e->ndim);
            pb_int_tuple(b, stride, e->ndim);
            pb_op(b, OP_NEWFALSE); /* requires_grad */
            pb_get(b, m_od);       /* backward_hooks: OrderedDict() */
            pb_op(b, OP_EMPTY_TUPLE);
            pb_op(b, OP_REDUCE);
            pb_memoize(b);
            pb_op(b, OP_TUPLE);
            pb_memoize(b);
            pb_op(b, OP_REDUCE);
            pb_memoize(b);
        }
        pb_op(b, hi - lo > 1 ? OP_SETITEMS : OP_SETITEM);
    }
    pb_op(b, OP_STOP);
    return b->oom ? PI2_ENOMEM : 0;
}

/* ---- pi2_tz_writer ---- */

struct pi2_tz_writer {
    char *path;
    char *arch; /* archive folder name */
    zw z;
    wt *t;
    size_t n, cap;
    uint32_t *slots; /* name hash: tensor index + 1 */
    size_t nslots;
    uint64_t total, written;
    size_t cur; /* tensor whose storage member is open */
    bool started;
    int failed;
};

void pi2_tz_writer_free(pi2_tz_writer *w)
{
    if (!w)
        return;
    pi2_afile_abort(w->z.af);
    zw_release(&w->z);
    for (size_t i = 0; i < w->n; i++)
        free(w->t[i].name);
    free(w->t);
    free(w->slots);
    free(w->arch);
    free(w->path);
    free(w);
}

/* torch's archive name: the file name without its last extension. */
static char *archive_name(const char *path)
{
    const char *b = path;
    for (const char *s = path; *s; s++)
        if (*s == '/' || *s == '\\')
            b = s + 1;
    size_t n = strlen(b);
    const char *dot = strrchr(b, '.');
    if (dot)
        n = (size_t)(dot - b);
    if (n == 0)
        return pi2_strdup("archive");
    char *r = malloc(n + 1);
    if (r) {
        memcpy(r, b, n);
        r[n] = 0;
    }
    return r;
}

int pi2_tz_writer_create(pi2_tz_writer **out, const char *path, pi2_err *err)
{
    if (!out || !path)
        return pi2_err_set(err, PI2_EINVAL, "pi2_tz_writer_create: NULL argument");
    *out = NULL;
    pi2_tz_writer *w = calloc(1, sizeof *w);
    if (w) {
        w->path = pi2_strdup(path);
        w->arch = archive_name(path);
    }
    if (!w || !w->path || !w->arch) {
        pi2_tz_writer_free(w);
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", path);
    }
    if (strlen(w->arch) > PI2_TZ_MAX_NAME - 64) {
        pi2_tz_writer_free(w);
        return pi2_err_set(err, PI2_EINVAL, "%s: file name too long for an archive name", path);
    }
    w->z.path = w->path;
    int rc = pi2_afile_open(&w->z.af, path, err);
    if (rc != 0) {
        pi2_tz_writer_free(w);
        return rc;
    }
    *out = w;
    return 0;
}

static uint64_t name_hash(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* Slot of name in the hash (empty slot if absent). */
static size_t w_slot(const pi2_tz_writer *w, const char *name)
{
    size_t s = (size_t)name_hash(name) & (w->nslots - 1);
    while (w->slots[s] && strcmp(w->t[w->slots[s] - 1].name, name) != 0)
        s = (s + 1) & (w->nslots - 1);
    return s;
}

int pi2_tz_writer_add(pi2_tz_writer *w, const char *name, pi2_dtype dt, int ndim, const int64_t *shape, pi2_err *err)
{
    if (!w || !name || (ndim > 0 && !shape))
        return pi2_err_set(err, PI2_EINVAL, "pi2_tz_writer_add: NULL argument");
    if (w->failed)
        return pi2_err_set(err, w->failed, "%s: writer already failed (%s)", w->path, pi2_strerror(w->failed));
    if (w->started)
        return pi2_err_set(err, PI2_EINVAL, "%s: adding a tensor after data was written", w->path);
    size_t nl = strlen(name);
    if (nl == 0 || nl > PI2_TZ_MAX_STR || !utf8_valid((const uint8_t *)name, nl))
        return pi2_err_set(err, PI2_EINVAL, "%s: invalid tensor name '%s' (empty, too long or not UTF-8)", w->path,
                           show(name).s);
    if (!pi2_dtype_name(dt))
        return pi2_err_set(err, PI2_EINVAL, "%s: tensor '%s': invalid dtype %d", w->path, show(name).s, (int)dt);
    if (ndim < 0 || ndim > PI2_ST_MAX_DIMS)
        return pi2_err_set(err, PI2_EINVAL, "%s: tensor '%s': %d dims (limit %d)", w->path, show(name).s, ndim,
                           PI2_ST_MAX_DIMS);
    if (w->n >= PI2_ST_MAX_TENSORS)
        return pi2_err_set(err, PI2_ERANGE, "%s: too many tensors (limit %u)", w->path, (unsigned)PI2_ST_MAX_TENSORS);
    size_t nelem = 1, nbytes;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return pi2_err_set(err, PI2_EINVAL, "%s: tensor '%s': negative dim %lld", w->path, show(name).s,
                               (long long)shape[i]);
        if ((uint64_t)shape[i] > SIZE_MAX || !pi2_mul_size(nelem, (size_t)shape[i], &nelem))
            return pi2_err_set(err, PI2_ERANGE, "%s: tensor '%s': element count overflows", w->path, show(name).s);
    }
    uint64_t total;
    if (!pi2_mul_size(nelem, pi2_dtype_size(dt), &nbytes) || nelem > (uint64_t)INT64_MAX ||
        __builtin_add_overflow(w->total, (uint64_t)nbytes, &total) || total > (uint64_t)INT64_MAX)
        return pi2_err_set(err, PI2_ERANGE, "%s: tensor '%s': size overflows", w->path, show(name).s);
    if (w->nslots < 2 * (w->n + 1)) {
        size_t ns = w->nslots ? w->nslots * 2 : 64;
        uint32_t *s = pi2_calloc_array(ns, sizeof *s);
        if (!s)
            return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", w->path);
        free(w->slots);
        w->slots = s;
        w->nslots = ns;
        for (size_t i = 0; i < w->n; i++)
            w->slots[w_slot(w, w->t[i].name)] = (uint32_t)(i + 1);
    }
    size_t slot = w_slot(w, name);
    if (w->slots[slot])
        return pi2_err_set(err, PI2_EINVAL, "%s: duplicate tensor '%s'", w->path, show(name).s);
    if (pi2_grow(&w->t, &w->cap, w->n, sizeof *w->t, 16) != 0)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", w->path);
    wt *e = &w->t[w->n];
    memset(e, 0, sizeof *e);
    e->name = pi2_strdup(name);
    if (!e->name)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", w->path);
    e->dt = dt;
    e->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        e->shape[i] = shape[i];
    e->nelem = nelem;
    e->nbytes = nbytes;
    w->slots[slot] = (uint32_t)++w->n;
    w->total = total;
    return 0;
}

static int w_small(pi2_tz_writer *w, const char *member, const void *data, size_t n, pi2_err *err)
{
    char name[PI2_TZ_MAX_NAME + 1];
    snprintf(name, sizeof name, "%s/%s", w->arch, member);
    int rc = zw_begin(&w->z, name, n, err);
    if (rc == 0)
        rc = zw_data(&w->z, data, n, err);
    if (rc == 0)
        rc = zw_end(&w->z, err);
    return rc;
}

static int w_begin_storage(pi2_tz_writer *w, pi2_err *err)
{
    char name[PI2_TZ_MAX_NAME + 1];
    snprintf(name, sizeof name, "%s/data/%zu", w->arch, w->cur);
    return zw_begin(&w->z, name, w->t[w->cur].nbytes, err);
}

/* data.pkl and byteorder, then open the first storage. */
static int w_start(pi2_tz_writer *w, pi2_err *err)
{
    w->started = true;
    pb b = { 0 };
    int rc = pb_state_dict(&b, w->t, w->n);
    if (rc != 0)
        rc = pi2_err_set(err, PI2_ENOMEM, "%s: out of memory for data.pkl", w->path);
    if (rc == 0)
        rc = w_small(w, "data.pkl", b.b, b.n, err);
    free(b.b);
    if (rc == 0)
        rc = w_small(w, "byteorder", "little", 6, err);
    w->cur = 0;
    if (rc == 0 && w->n > 0)
        rc = w_begin_storage(w, err);
    return rc;
}

/* Close full storage members and open the next ones until one has room
 * (or all are written). */
static int w_advance(pi2_tz_writer *w, pi2_err *err)
{
    int rc = 0;
    while (rc == 0 && w->cur < w->n && w->z.left == 0) {
        if ((rc = zw_end(&w->z, err)) == 0 && ++w->cur < w->n)
            rc = w_begin_storage(w, err);
    }
    return rc;
}

int pi2_tz_writer_write(pi2_tz_writer *w, const void *data, size_t n, pi2_err *err)
{
    if (!w || (!data && n))
        return pi2_err_set(err, PI2_EINVAL, "pi2_tz_writer_write: NULL argument");
    if (w->failed)
        return pi2_err_set(err, w->failed, "%s: writer already failed (%s)", w->path, pi2_strerror(w->failed));
    int rc = 0;
    if (!w->started && (rc = w_start(w, err)) != 0)
        return w->failed = rc;
    if (n > w->total - w->written)
        return w->failed = pi2_err_set(err, PI2_EINVAL,
                                       "%s: writing %zu bytes at data byte %llu passes the declared total %llu",
                                       w->path, n, (unsigned long long)w->written, (unsigned long long)w->total);
    const uint8_t *p = data;
    while (n > 0) {
        if ((rc = w_advance(w, err)) != 0)
            return w->failed = rc;
        size_t chunk = n < w->z.left ? n : (size_t)w->z.left;
        if ((rc = zw_data(&w->z, p, chunk, err)) != 0)
            return w->failed = rc;
        p += chunk;
        n -= chunk;
        w->written += chunk;
    }
    return 0;
}

int pi2_tz_writer_finish(pi2_tz_writer *w, pi2_err *err)
{
    if (!w)
        return pi2_err_set(err, PI2_EINVAL, "pi2_tz_writer_finish: NULL writer");
    int rc = 0;
    if (w->failed)
        rc = pi2_err_set(err, w->failed, "%s: writer already failed (%s)", w->path, pi2_strerror(w->failed));
    if (rc == 0 && !w->started)
        rc = w_start(w, err);
    if (rc == 0 && w->written != w->total)
        rc = pi2_err_set(err, PI2_EINVAL, "%s: finished after %llu of %llu declared data bytes", w->path,
                         (unsigned long long)w->written, (unsigned long long)w->total);
    if (rc == 0)
        rc = w_advance(w, err); /* closes the last member, opens and closes trailing empty ones */
    if (rc == 0)
        rc = w_small(w, "version", "3\n", 2, err);
    if (rc == 0) {
        /* torch: 20 digits of a hash of the record names, 20 of their CRCs */
        uint64_t h = 0xcbf29ce484222325ull, c = 0;
        for (size_t i = 0; i < w->z.n; i++) {
            h = (h ^ name_hash(w->z.e[i].name)) * 0x100000001b3ull;
            c = c * 31 + w->z.e[i].crc;
        }
        char id[48];
        snprintf(id, sizeof id, "%020llu%020llu", (unsigned long long)h, (unsigned long long)c);
        rc = w_small(w, ".data/serialization_id", id, 40, err);
    }
    if (rc == 0)
        rc = zw_finish(&w->z, err);
    if (rc == 0) {
        rc = pi2_afile_commit(w->z.af, err); /* frees the afile, also on failure */
        w->z.af = NULL;
    }
    pi2_tz_writer_free(w);
    return rc;
}

int pi2_tz_write(const char *path, size_t n, const pi2_tz_item *items, pi2_err *err)
{
    if (!path || (n && !items))
        return pi2_err_set(err, PI2_EINVAL, "pi2_tz_write: NULL argument");
    pi2_tz_writer *w;
    int rc = pi2_tz_writer_create(&w, path, err);
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = pi2_tz_writer_add(w, items[i].name, items[i].dtype, items[i].ndim, items[i].shape, err);
    for (size_t i = 0; i < n && rc == 0; i++) {
        const wt *e = &w->t[i];
        if (e->nbytes && !items[i].data)
            rc = pi2_err_set(err, PI2_EINVAL, "%s: tensor '%s': NULL data", path, show(e->name).s);
        else
            rc = pi2_tz_writer_write(w, items[i].data, (size_t)e->nbytes, err);
    }
    if (rc != 0) {
        pi2_tz_writer_free(w);
        return rc;
    }
    return pi2_tz_writer_finish(w, err);
}

static int cstr_cmp(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

int pi2_tz_write_members(const char *path, size_t n, const char *const *names, const void *const *data,
                         const size_t *sizes, pi2_err *err)
{
    if (!path || (n && (!names || !data || !sizes)))
        return pi2_err_set(err, PI2_EINVAL, "pi2_tz_write_members: NULL argument");
    const char **sorted = pi2_malloc_array(n, sizeof *sorted);
    if (!sorted)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", path);
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (!names[i] || !*names[i] || strlen(names[i]) > PI2_TZ_MAX_NAME || (sizes[i] && !data[i]))
            rc = pi2_err_set(err, PI2_EINVAL, "%s: member %zu: NULL, empty or too long name, or NULL data", path, i);
        sorted[i] = names[i];
    }
    if (rc == 0) {
        qsort(sorted, n, sizeof *sorted, cstr_cmp);
        for (size_t i = 1; i < n && rc == 0; i++)
            if (strcmp(sorted[i - 1], sorted[i]) == 0)
                rc = pi2_err_set(err, PI2_EINVAL, "%s: duplicate member '%s'", path, show(sorted[i]).s);
    }
    free(sorted);
    if (rc != 0)
        return rc;
    zw z = { .path = path };
    rc = pi2_afile_open(&z.af, path, err);
    for (size_t i = 0; i < n && rc == 0; i++) {
        rc = zw_begin(&z, names[i], sizes[i], err);
        if (rc == 0)
            rc = zw_data(&z, data[i], sizes[i], err);
        if (rc == 0)
            rc = zw_end(&z, err);
    }
    if (rc == 0)
        rc = zw_finish(&z, err);
    if (rc == 0) {
        rc = pi2_afile_commit(z.af, err);
        z.af = NULL;
    }
    pi2_afile_abort(z.af);
    zw_release(&z);
    return rc;
}
