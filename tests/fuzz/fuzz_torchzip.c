/* Fuzz target: PyTorch zip reader, through pi2_st_open_buffer (zip walker,
 * pickle machine, views), tensor lookup and conversion of small tensors.
 *
 * An input that starts with "PK" is a whole zip image. Any other input is
 * taken as a data.pkl and wrapped here in a zip whose storages A/data/0..3
 * hold 24, 64, 0 and 256 bytes, so mutations reach the pickle machine
 * without having to keep a zip consistent; the pickle seeds describe
 * F32[2, 3], F16[4, 8], BF16[0, 5] and U8[16, 16] over those storages. */
#include "formats/safetensors.h"
#include "formats/torchzip.h"
#include "tests/fuzz/fuzz_util.h"

#include <string.h>

#define MAX_CONVERT_ELEMS (1u << 16) /* bound the work per input */

static void put16(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void put32(uint8_t *p, uint32_t v)
{
    put16(p, v & 0xffff);
    put16(p + 2, v >> 16);
}

/* A stored zip (no descriptors, no zip64) of the pickle and the storages. */
static uint8_t *wrap_pickle(const uint8_t *pkl, size_t n, size_t *len)
{
    static const size_t st_size[4] = { 24, 64, 0, 256 };
    const char *names[6] = { "A/data.pkl", "A/data/0", "A/data/1", "A/data/2", "A/data/3", "A/version" };
    static uint8_t storage[256];
    const uint8_t *data[6] = { pkl, storage, storage, storage, storage, (const uint8_t *)"3\n" };
    size_t sizes[6] = { n, st_size[0], st_size[1], st_size[2], st_size[3], 2 };
    size_t total = 22;
    for (int i = 0; i < 6; i++)
        total += 30 + 46 + 2 * strlen(names[i]) + sizes[i];
    uint8_t *b = calloc(1, total);
    if (!b)
        return NULL;
    for (size_t i = 0; i < sizeof storage; i++)
        storage[i] = (uint8_t)(i * 7 + 1);
    size_t pos = 0, lho[6];
    for (int i = 0; i < 6; i++) {
        size_t nl = strlen(names[i]);
        lho[i] = pos;
        put32(b + pos, 0x04034b50);
        put32(b + pos + 18, (uint32_t)sizes[i]);
        put32(b + pos + 22, (uint32_t)sizes[i]);
        put16(b + pos + 26, (uint32_t)nl);
        memcpy(b + pos + 30, names[i], nl);
        if (sizes[i])
            memcpy(b + pos + 30 + nl, data[i], sizes[i]);
        pos += 30 + nl + sizes[i];
    }
    size_t cd = pos;
    for (int i = 0; i < 6; i++) {
        size_t nl = strlen(names[i]);
        put32(b + pos, 0x02014b50);
        put32(b + pos + 20, (uint32_t)sizes[i]);
        put32(b + pos + 24, (uint32_t)sizes[i]);
        put16(b + pos + 28, (uint32_t)nl);
        put32(b + pos + 42, (uint32_t)lho[i]);
        memcpy(b + pos + 46, names[i], nl);
        pos += 46 + nl;
    }
    put32(b + pos, 0x06054b50);
    put16(b + pos + 8, 6);
    put16(b + pos + 10, 6);
    put32(b + pos + 12, (uint32_t)(pos - cd));
    put32(b + pos + 16, (uint32_t)cd);
    *len = pos + 22;
    return b;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *buf;
    size_t len = size;
    if (size >= 2 && data[0] == 'P' && data[1] == 'K') {
        /* A private copy so a read past `size` is caught by ASan. */
        buf = malloc(size ? size : 1);
        if (buf)
            memcpy(buf, data, size);
    } else {
        if (size > PI2_TZ_MAX_PICKLE)
            return 0;
        buf = wrap_pickle(data, size, &len);
    }
    if (!buf)
        return 0;
    pi2_st *st = NULL;
    pi2_err err = { 0 };
    if (pi2_st_open_buffer(&st, buf, len, "fuzz.pt", &err) == 0) {
        size_t n = pi2_st_count(st);
        for (size_t i = 0; i < n; i++) {
            const pi2_st_tensor *t = pi2_st_at(st, i);
            size_t nelem = 1;
            for (int d = 0; d < t->ndim; d++)
                nelem *= (size_t)t->shape[d];
            /* the reader's own guarantees */
            if (pi2_st_find(st, t->name) != t || t->ndim < 0 || t->ndim > PI2_ST_MAX_DIMS ||
                nelem != t->nelem || t->nbytes != t->nelem * pi2_dtype_size(t->dtype) ||
                (const uint8_t *)t->data < buf || t->nbytes > len ||
                (size_t)((const uint8_t *)t->data - buf) > len - t->nbytes)
                abort();
            if (i < 8 && t->nelem <= MAX_CONVERT_ELEMS) {
                float *f = malloc((t->nelem ? t->nelem : 1) * sizeof(float));
                if (f) {
                    (void)pi2_st_to_f32(t, f, t->nelem, &err);
                    free(f);
                }
            }
        }
        (void)pi2_st_find(st, "fc1.weight");
        pi2_st_close(st);
    } else if (err.code == 0 || strncmp(err.msg, "fuzz.pt: ", 9) != 0 || strchr(err.msg, '\n')) {
        abort(); /* every failure leaves one line naming the file */
    }
    free(buf);
    return 0;
}
