/* Internals shared by the safetensors reader (safetensors.c) and writer
 * (safetensors_write.c); formats/safetensors.h is the contract. */
#ifndef PI2_SAFETENSORS_INTERNAL_H
#define PI2_SAFETENSORS_INTERNAL_H

#include <stdbool.h>
#include <string.h>

/* A hostile name may be long or hold control characters; messages stay one
 * short line. */
typedef struct shown {
    char s[104];
} shown;

static inline shown show(const char *s)
{
    shown r;
    size_t i = 0;
    for (; s && s[i] && i < 96; i++) {
        unsigned char ch = (unsigned char)s[i];
        r.s[i] = ch < 0x20 || ch == 0x7f ? '?' : (char)ch;
    }
    if (s && s[i]) {
        memcpy(r.s + i, "...", 3);
        i += 3;
    }
    r.s[i] = 0;
    return r;
}

/* Shard names in an index, and in pi2_st_write_index: plain file names only. */
static inline bool plain_name(const char *s)
{
    return s && *s && !strchr(s, '/') && !strstr(s, "..") && strcmp(s, ".") != 0;
}

#endif
