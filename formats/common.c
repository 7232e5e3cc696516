#include "formats/common.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

const char *pi2_strerror(int code)
{
    switch (code) {
    case PI2_OK: return "success";
    case PI2_EINVAL: return "invalid argument";
    case PI2_EIO: return "I/O error";
    case PI2_EFORMAT: return "format error";
    case PI2_ENOMEM: return "out of memory";
    case PI2_ERANGE: return "out of range";
    case PI2_EUNSUPPORTED: return "unsupported";
    case PI2_ENOTFOUND: return "not found";
    case PI2_ESHAPE: return "shape mismatch";
    case PI2_ESIG: return "signature or digest mismatch";
    case PI2_ENOSPC: return "no space left on device";
    case PI2_EEXIST: return "output exists";
    default: return "unknown error";
    }
}

static void err_vset(pi2_err *e, int code, const char *fmt, va_list ap)
{
    if (!e || e->code != 0)
        return;
    e->code = code;
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
}

int pi2_err_set(pi2_err *e, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    err_vset(e, code, fmt, ap);
    va_end(ap);
    return code;
}

int pi2_err_errno(pi2_err *e, int code, int errnum, const char *fmt, ...)
{
    if (errnum == ENOSPC || errnum == EDQUOT)
        code = PI2_ENOSPC;
    else if (errnum == ENOMEM)
        code = PI2_ENOMEM;
    if (!e || e->code != 0)
        return code;
    va_list ap;
    va_start(ap, fmt);
    err_vset(e, code, fmt, ap);
    va_end(ap);
    size_t n = strlen(e->msg);
    snprintf(e->msg + n, sizeof e->msg - n, ": %s", strerror(errnum));
    return code;
}

void pi2_err_clear(pi2_err *e)
{
    if (e) {
        e->code = 0;
        e->msg[0] = 0;
    }
}

void *pi2_malloc_array(size_t n, size_t size)
{
    size_t total;
    if (!pi2_mul_size(n, size, &total))
        return NULL;
    return malloc(total ? total : 1);
}

void *pi2_calloc_array(size_t n, size_t size)
{
    size_t total;
    if (!pi2_mul_size(n, size, &total))
        return NULL;
    return calloc(n ? n : 1, size ? size : 1);
}

int pi2_grow(void *arr, size_t *cap, size_t n, size_t elem, size_t min_cap)
{
    if (n < *cap)
        return 0;
    void **pp = arr;
    size_t nc = *cap ? *cap : min_cap, bytes;
    if (*cap && !pi2_mul_size(nc, 2, &nc))
        return PI2_ENOMEM;
    void *p = pi2_mul_size(nc, elem, &bytes) ? realloc(*pp, bytes) : NULL;
    if (!p)
        return PI2_ENOMEM;
    *pp = p;
    *cap = nc;
    return 0;
}

char *pi2_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

/* ---- half precision ---- */

float pi2_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    union { uint32_t u; float f; } v;
    if (exp == 0) {
        /* zero or subnormal: value = man * 2^-24 */
        float f = (float)man * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    if (exp == 31)
        v.u = sign | 0x7f800000u | (man << 13);
    else
        v.u = sign | ((exp + 112) << 23) | (man << 13);
    return v.f;
}

uint16_t pi2_f32_to_f16(float f)
{
    union { float f; uint32_t u; } v = { .f = f };
    uint32_t sign = (v.u >> 16) & 0x8000;
    uint32_t absu = v.u & 0x7fffffffu;
    if (absu >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00 | (absu > 0x7f800000u ? 0x200 : 0));
    if (absu >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00);
    if (absu < 0x38800000u) {
        /* subnormal half (or zero): round abs * 2^24 to nearest even integer */
        union { uint32_t u; float f; } a = { .u = absu };
        float scaled = a.f * 16777216.0f;
        float r = nearbyintf(scaled); /* default rounding mode: ties to even */
        return (uint16_t)(sign | (uint32_t)r);
    }
    uint32_t exp = (absu >> 23) - 112;
    uint32_t man = absu & 0x7fffff;
    uint32_t h = (exp << 10) | (man >> 13);
    uint32_t rest = man & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1)))
        h++; /* carry into exponent is correct rounding */
    return (uint16_t)(sign | h);
}


/* ---- cursor ---- */

bool pi2_cursor_take(pi2_cursor *c, size_t n, const uint8_t **out)
{
    if (n > c->left)
        return false;
    *out = c->p;
    c->p += n;
    c->left -= n;
    return true;
}

bool pi2_cursor_u32le(pi2_cursor *c, uint32_t *v)
{
    const uint8_t *p;
    if (!pi2_cursor_take(c, 4, &p))
        return false;
    *v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    return true;
}

bool pi2_cursor_u64le(pi2_cursor *c, uint64_t *v)
{
    uint32_t lo, hi;
    pi2_cursor save = *c;
    if (!pi2_cursor_u32le(c, &lo) || !pi2_cursor_u32le(c, &hi)) {
        *c = save;
        return false;
    }
    *v = (uint64_t)hi << 32 | lo;
    return true;
}

/* ---- mapping ---- */

int pi2_map_open(pi2_map *m, const char *path, pi2_err *err)
{
    m->data = NULL;
    m->size = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return pi2_err_errno(err, errno == ENOENT ? PI2_ENOTFOUND : PI2_EIO, errno, "%s: cannot open", path);
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return pi2_err_errno(err, PI2_EIO, e, "%s: cannot stat", path);
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return pi2_err_set(err, PI2_EIO, "%s: not a regular file", path);
    }
    if (st.st_size == 0) {
        close(fd);
        return 0;
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        return pi2_err_set(err, PI2_ERANGE, "%s: file too large to map", path);
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED)
        return pi2_err_errno(err, PI2_EIO, e, "%s: cannot map", path);
    m->data = p;
    m->size = (size_t)st.st_size;
    pi2_map_guard_add(m);
    return 0;
}

void pi2_map_close(pi2_map *m)
{
    if (m && m->data) {
        pi2_map_guard_remove(m);
        munmap((void *)m->data, m->size);
    }
    if (m) {
        m->data = NULL;
        m->size = 0;
    }
}

int pi2_read_file(const char *path, size_t max_bytes, char **out, size_t *len, pi2_err *err)
{
    *out = NULL;
    if (len)
        *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return pi2_err_errno(err, errno == ENOENT ? PI2_ENOTFOUND : PI2_EIO, errno, "%s: cannot open", path);
    size_t cap = max_bytes < 4096 ? max_bytes : 4096, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf) {
        fclose(f);
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", path);
    }
    for (;;) {
        if (n == cap) {
            if (cap >= max_bytes) {
                if (fgetc(f) == EOF && !ferror(f))
                    break; /* exactly max_bytes */
                free(buf);
                fclose(f);
                return pi2_err_set(err, PI2_ERANGE, "%s: larger than %zu bytes", path, max_bytes);
            }
            size_t ncap = cap * 2 > max_bytes ? max_bytes : cap * 2;
            char *nb = realloc(buf, ncap + 1);
            if (!nb) {
                free(buf);
                fclose(f);
                return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", path);
            }
            buf = nb;
            cap = ncap;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) {
            if (ferror(f)) {
                int e = errno;
                free(buf);
                fclose(f);
                return pi2_err_errno(err, PI2_EIO, e, "%s: read failed", path);
            }
            break;
        }
    }
    fclose(f);
    buf[n] = 0;
    *out = buf;
    if (len)
        *len = n;
    return 0;
}

int pi2_hex_digit(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

bool pi2_path_join(char *buf, size_t cap, const char *dir, const char *name)
{
    int n = snprintf(buf, cap, "%s/%s", dir, name);
    return n >= 0 && (size_t)n < cap;
}

bool pi2_is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* ---- rng ---- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void pi2_rng_seed(pi2_rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t pi2_rng_u64(pi2_rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double pi2_rng_uniform(pi2_rng *r) { return (double)(pi2_rng_u64(r) >> 11) * 0x1.0p-53; }

double pi2_rng_normal(pi2_rng *r)
{
    double u1 = pi2_rng_uniform(r), u2 = pi2_rng_uniform(r);
    if (u1 < 1e-300)
        u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

int pi2_parse_int(const char *flag, const char *s, long long lo, long long hi, long long *out, pi2_err *err)
{
    char *end;
    errno = 0;
    long long v = s ? strtoll(s, &end, 10) : 0;
    if (!s || !*s || *end || errno == ERANGE || v < lo || v > hi)
        return pi2_err_set(err, PI2_EINVAL, "%s '%s': expected an integer in [%lld, %lld]", flag, s ? s : "",
                           lo, hi);
    *out = v;
    return 0;
}

int pi2_parse_double(const char *flag, const char *s, double lo, double hi, double *out, pi2_err *err)
{
    char *end;
    errno = 0;
    double v = s ? strtod(s, &end) : 0;
    if (!s || !*s || *end || errno == ERANGE || !(v >= lo && v <= hi))
        return pi2_err_set(err, PI2_EINVAL, "%s '%s': expected a number in [%g, %g]", flag, s ? s : "", lo, hi);
    *out = v;
    return 0;
}

int pi2_parse_size(const char *flag, const char *s, uint64_t *out, pi2_err *err)
{
    char *end;
    errno = 0;
    if (!s || !*s || *s == '-')
        return pi2_err_set(err, PI2_EINVAL, "%s '%s': expected a size such as 512M or 4G", flag, s ? s : "");
    double v = strtod(s, &end);
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1024.0 * 1024; end++; break;
    case 'g': case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
    case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (*end == 'i' && mul > 1)
        end++;
    if (*end == 'B' || *end == 'b')
        end++;
    if (end == s || *end || errno == ERANGE || !(v >= 0) || v * mul >= 1.8e19)
        return pi2_err_set(err, PI2_EINVAL, "%s '%s': expected a size such as 512M or 4G", flag, s);
    *out = (uint64_t)(v * mul);
    return 0;
}

double pi2_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

uint64_t pi2_peak_rss(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return 0;
    char line[256];
    uint64_t kb = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "VmHWM:", 6) == 0) {
            kb = strtoull(line + 6, NULL, 10);
            break;
        }
    }
    fclose(f);
    return kb * 1024;
}
