/* pi2 container (model.pi2): writer (libarchive) and strict mmap reader.
 *
 * A container is an uncompressed POSIX ustar archive, so `tar tvf model.pi2`
 * lists it, in which the DATA of every member starts on a 4096-byte boundary
 * of the file: the runtime maps it and reads members with O_DIRECT. What the
 * members hold (manifest JSON, tokenizer, weight sections, signature) is the
 * caller's business; this module only stores named byte ranges.
 *
 * File layout (offsets from the start of the file; blocks are 512 bytes):
 *   for each member, in order:
 *     [padding member]   only when needed: a ustar header named ".pad/NNNNNN"
 *                        followed by 0..3072 zero bytes (a multiple of 512)
 *                        so that the next header lands at an offset
 *                        = 3584 (mod 4096)
 *     header             one 512-byte ustar header
 *     data               `size` bytes at an offset = 0 (mod 4096)
 *     fill               zero bytes up to the next multiple of 512
 *   end of archive       two zero blocks (1024 bytes)
 *   fill                 zero bytes up to the next multiple of 4096, which is
 *                        the file size
 *
 * ustar header (POSIX.1-1988). Numeric fields are octal ASCII digits,
 * optionally led by spaces and ended by NUL or space:
 *   off  len  field     pi2 rule
 *     0  100  name      NUL-terminated, 1..99 bytes, see names below
 *   100    8  mode      octal (writer: 0644)
 *   108    8  uid       octal (writer: 0)
 *   116    8  gid       octal (writer: 0)
 *   124   12  size      octal, at most PI2_CTR_MAX_SIZE (no base-256)
 *   136   12  mtime     octal (writer: 0, so output is reproducible)
 *   148    8  chksum    octal unsigned sum of the 512 header bytes with this
 *                       field counted as 8 spaces
 *   156    1  typeflag  '0' or NUL (regular file); anything else is refused
 *   157  100  linkname  ignored (covered by the checksum)
 *   257    6  magic     "ustar\0"
 *   263    2  version   "00"
 *   265   32  uname     ignored (writer: empty)
 *   297   32  gname     ignored (writer: empty)
 *   329   16  devmajor, devminor: ignored
 *   345  155  prefix    must be empty (no split names, no pax/GNU headers)
 *   500   12  unused
 * Names: printable ASCII without space (0x21..0x7e), not starting with '/',
 * no empty, "." or ".." path components, no trailing '/'. Names starting with
 * ".pad/" are padding: the writer reserves them, the reader skips them (their
 * data must be zero and shorter than 4096 bytes) and does not list them.
 * Headers are deterministic: the same members written in the same order give
 * a byte-identical file.
 *
 * Reader checks (pi2_ctr_open), each failure a PI2_EFORMAT naming the file,
 * the header offset and the member: magic and version, checksum, octal
 * fields, name NUL-terminated and valid, empty prefix, regular typeflag,
 * data (and its fill) inside the file, member data 4096-aligned, padding
 * data zero, no duplicate names, two zero blocks ending the archive, only
 * zero bytes after them, file size a multiple of 4096. Members are read in
 * order, so they cannot overlap. More than PI2_CTR_MAX_MEMBERS members gives
 * PI2_ERANGE. Open/map failures: PI2_ENOTFOUND / PI2_EIO.
 *
 * Libraries: libarchive (writer only; -larchive) and, through formats/sign.h,
 * libcrypto for SHA-256 (-lcrypto).
 */
#ifndef PI2_CONTAINER_H
#define PI2_CONTAINER_H

#include "formats/common.h"
#include "formats/sign.h"

#define PI2_CTR_ALIGN 4096u                    /* data alignment and file-size multiple */
#define PI2_CTR_NAME_MAX 100                   /* names are shorter than this (bytes) */
#define PI2_CTR_MAX_SIZE 077777777777ull       /* 8 GiB - 1: largest plain ustar size */
#define PI2_CTR_MAX_MEMBERS (1u << 16)         /* members per container (not counting padding) */
#define PI2_CTR_PAD_PREFIX ".pad/"

/* ---- writer ---- */

typedef struct pi2_ctr_writer pi2_ctr_writer;

/* A finished member as recorded by the writer. */
typedef struct pi2_ctr_section {
    char name[PI2_CTR_NAME_MAX];
    uint64_t offset; /* of the data in the file; a multiple of PI2_CTR_ALIGN */
    uint64_t size;
    uint8_t sha256[PI2_SHA256_LEN];
} pi2_ctr_section;

/* Start a container at path. Output goes to "<path>.tmp.XXXXXX" (pi2_afile)
 * and only reaches path in pi2_ctr_writer_finish (fsync + rename). Caller
 * owns *out and must release it with pi2_ctr_writer_free.
 *
 * Errors are sticky: after any writer call fails (bad name, too much or too
 * little data, write error, ENOSPC, misuse), every later call including
 * finish returns the same code, and no file appears at path. */
int pi2_ctr_writer_create(pi2_ctr_writer **out, const char *path, pi2_err *err);

/* Start a member of exactly `size` bytes (at most PI2_CTR_MAX_SIZE) named
 * `name` (rules above; PI2_EINVAL for a bad, reserved or duplicate name or
 * for calling it while a member is open; PI2_ERANGE for too large a size or
 * too many members). Writes a padding member first when needed. */
int pi2_ctr_writer_begin(pi2_ctr_writer *w, const char *name, uint64_t size, pi2_err *err);
/* Append n bytes to the open member; streamed to the file (never buffered
 * whole) and hashed on the fly. PI2_EINVAL if this exceeds the declared
 * size or no member is open. */
int pi2_ctr_writer_data(pi2_ctr_writer *w, const void *buf, size_t n, pi2_err *err);
/* Close the open member; PI2_EINVAL if fewer bytes than declared were
 * written. On success the member is added to the section list. */
int pi2_ctr_writer_end(pi2_ctr_writer *w, pi2_err *err);
/* begin + data + end for a member held in memory. */
int pi2_ctr_writer_add(pi2_ctr_writer *w, const char *name, const void *buf, size_t n, pi2_err *err);

/* Finished members so far, in file order; *count gets their number. The
 * array is owned by the writer and valid until the next begin/end/free. */
const pi2_ctr_section *pi2_ctr_writer_sections(const pi2_ctr_writer *w, size_t *count);
/* Look up a finished member by name; NULL if absent. Same lifetime. */
const pi2_ctr_section *pi2_ctr_writer_section(const pi2_ctr_writer *w, const char *name);

/* End the archive (end marker, pad to 4096), fsync and rename onto path.
 * PI2_EINVAL if a member is still open. The writer must still be freed;
 * its section list stays readable until then. */
int pi2_ctr_writer_finish(pi2_ctr_writer *w, pi2_err *err);
/* Release the writer. If finish has not succeeded, the temporary file is
 * removed and nothing is left at path. NULL is a no-op. */
void pi2_ctr_writer_free(pi2_ctr_writer *w);

/* ---- reader ---- */

typedef struct pi2_ctr pi2_ctr;

/* A member of an open container. Valid until pi2_ctr_close. */
typedef struct pi2_ctr_member {
    const char *name;    /* NUL-terminated copy owned by the container */
    const uint8_t *data; /* inside the read-only mapping */
    uint64_t offset;     /* of the data in the file; a multiple of PI2_CTR_ALIGN */
    uint64_t size;
} pi2_ctr_member;

/* Map path read-only and validate its whole structure (see the top of this
 * header). Member data is not hashed here; see pi2_ctr_verify_member.
 * Caller closes *out with pi2_ctr_close. */
int pi2_ctr_open(pi2_ctr **out, const char *path, pi2_err *err);
/* The same, with huge pages asked for behind the mapping (MADV_HUGEPAGE)
 * before the structure walk reads anything: data read into the page cache
 * then comes in 2 MiB folios where the kernel and the filesystem allow it,
 * mapped with one TLB entry each (runs that use the members in place).
 * Advisory: pages already cached stay as they are, and a kernel without
 * it ignores it. */
int pi2_ctr_open_huge(pi2_ctr **out, const char *path, pi2_err *err);
/* Number of members (padding excluded). */
size_t pi2_ctr_count(const pi2_ctr *c);
/* Member i in file order; NULL if i >= count. */
const pi2_ctr_member *pi2_ctr_at(const pi2_ctr *c, size_t i);
/* Member by exact name; NULL if absent. */
const pi2_ctr_member *pi2_ctr_find(const pi2_ctr *c, const char *name);
/* Path the container was opened from. */
const char *pi2_ctr_path(const pi2_ctr *c);
/* The file shrank under the mapping and a read past its new end was
 * answered with zeros (pi2_map_changed, formats/common.h). */
bool pi2_ctr_changed(const pi2_ctr *c);
/* Hash the member's data and compare with expected: 0 if equal, PI2_ESIG
 * with a message naming the file and member (and both digests) if not. */
int pi2_ctr_verify_member(const pi2_ctr *c, const pi2_ctr_member *m, const uint8_t expected[PI2_SHA256_LEN],
                          pi2_err *err);
/* The same, hashing the member a window at a time (file offsets
 * [k window, (k + 1) window); window 0: all at once, nothing dropped) and
 * dropping each window's pages once hashed: from this process, and from
 * the page cache through fd (the container's file; -1: not). A member of
 * any size then adds at most one window to the footprint. window: a
 * multiple of the page size. */
int pi2_ctr_verify_member_dropping(const pi2_ctr *c, const pi2_ctr_member *m, const uint8_t expected[PI2_SHA256_LEN],
                                   int fd, size_t window, pi2_err *err);
/* Unmap and free. NULL is a no-op. */
void pi2_ctr_close(pi2_ctr *c);

/* Drop the mapping's pages from this process and, where no one else maps
 * them, from the page cache (the offloading runtime, once it has read what
 * it keeps). The mapping stays valid: a later access reads the file again. */
void pi2_ctr_drop_pages(const pi2_ctr *c);
/* Bytes of the file in the page cache now (mincore over the mapping). */
uint64_t pi2_ctr_cached_bytes(const pi2_ctr *c);
/* Of the mapping's pages in this process: bytes present (*rss) and bytes
 * mapped as 2 MiB pages (*huge), from /proc/self/smaps. PI2_EIO when that
 * cannot be read (then both are 0). */
int pi2_ctr_mapped_bytes(const pi2_ctr *c, uint64_t *rss, uint64_t *huge, pi2_err *err);
/* When at least min_bytes of the mapping are present and fewer than half
 * of them in 2 MiB pages (the page cache held the file in 4 KiB pages, as
 * a writer or a reader without MADV_HUGEPAGE left it), and this kernel
 * caches the file afresh in 2 MiB pages (tried on one 2 MiB window, mapped
 * apart), drop the pages (pi2_ctr_drop_pages): later accesses read the
 * file again, in 2 MiB pages. Returns true when it dropped them. */
bool pi2_ctr_rehuge(const pi2_ctr *c, uint64_t min_bytes);

#endif
