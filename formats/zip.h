/* The zip layer of PyTorch checkpoints (torchzip.h has the file layout):
 * a reader that walks a zip image in memory and a writer that emits
 * miniz's zip64 layout through an atomic file. Private to formats/zip.c,
 * formats/pickle.c and formats/torchzip.c. */
#ifndef PI2_FORMATS_ZIP_H
#define PI2_FORMATS_ZIP_H

#include "formats/torchzip.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

static inline uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }

static inline void wr16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void wr32(uint8_t *p, uint32_t v)
{
    wr16(p, (uint16_t)v);
    wr16(p + 2, (uint16_t)(v >> 16));
}
static inline void wr64(uint8_t *p, uint64_t v)
{
    wr32(p, (uint32_t)v);
    wr32(p + 4, (uint32_t)(v >> 32));
}

/* A name from a hostile file, shown on one short line. */
typedef struct shown {
    char s[104];
} shown;

typedef struct zmem {
    const uint8_t *name; /* inside the central directory; not NUL-terminated */
    uint32_t nlen;
    uint16_t flags, method;
    uint32_t crc;
    uint64_t csize, usize;
    uint64_t lho; /* local header offset */
    uint64_t off; /* data offset */
} zmem;

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

shown tz_show_n(const void *ptr, size_t len);
shown tz_show(const char *s);
bool tz_utf8_valid(const uint8_t *s, size_t n);
int tz_name_cmp(const uint8_t *a, size_t al, const uint8_t *b, size_t bl);
int tz_zip_walk(const uint8_t *buf, size_t len, const char *path, zmem **out, size_t *count, uint32_t **sorted,
                pi2_err *err);
/* Member index of a full name, by binary search over sorted; -1 if none. */
int64_t tz_find(const zmem *m, size_t nm, const uint32_t *sorted, const uint8_t *name, size_t nlen);
/* libarchive's reading of an image the walker accepted (zip_archive.c):
 * the same members and sizes, and member pkl's bytes (CRC-checked) in a
 * new buffer *pkl_out, which the caller frees. */
int tz_archive_read(const uint8_t *img, size_t len, const char *path, const zmem *m, size_t nm, const uint32_t *sorted,
                    size_t pkl, uint8_t **pkl_out, pi2_err *err);
void zw_release(zw *z);
int zw_begin(zw *z, const char *name, uint64_t size, pi2_err *err);
int zw_data(zw *z, const void *p, size_t n, pi2_err *err);
int zw_end(zw *z, pi2_err *err);
int zw_finish(zw *z, pi2_err *err);

#endif
