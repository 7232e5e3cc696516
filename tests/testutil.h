/* Shared helpers for the cmocka tests: temp dirs, the shared golden models,
 * small file utilities and a hash. Header-only so each test stays one file. */
#ifndef PI2_TESTUTIL_H
#define PI2_TESTUTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Directory of ../shared (env PI2_SHARED overrides), or NULL. */
static inline const char *pi2t_shared(void)
{
    const char *s = getenv("PI2_SHARED");
    if (!s || !*s)
        s = "../shared";
    struct stat st;
    return stat(s, &st) == 0 && S_ISDIR(st.st_mode) ? s : NULL;
}

/* Path of a shared model dir into buf, or skip the test with a message. */
#define PI2T_SHARED_MODEL(buf, name)                                                                \
    do {                                                                                            \
        const char *sh_ = pi2t_shared();                                                            \
        if (sh_)                                                                                    \
            snprintf((buf), sizeof(buf), "%s/models/%s", sh_, (name));                              \
        struct stat st_;                                                                            \
        if (!sh_ || stat((buf), &st_) != 0) {                                                       \
            fprintf(stderr, "skip: shared model %s not found (set PI2_SHARED to the shared dir)\n", \
                    (name));                                                                        \
            skip();                                                                                 \
        }                                                                                           \
    } while (0)

/* Fresh temp dir "/tmp/pi2t.XXXXXX" into buf (cap >= 32). */
static inline void pi2t_tmpdir(char *buf, size_t cap)
{
    const char *base = getenv("TMPDIR");
    snprintf(buf, cap, "%s/pi2t.XXXXXX", base && *base ? base : "/tmp");
    assert_non_null(mkdtemp(buf));
}

/* rm -rf of a temp dir made by pi2t_tmpdir. */
static inline void pi2t_rmtree(const char *dir)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static inline void pi2t_write(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static inline int pi2t_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Entries of a directory, "." and ".." not counted. */
static inline int pi2t_count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            n++;
    closedir(d);
    return n;
}

/* Byte-for-byte copy of a file. */
static inline void pi2t_copy_file(const char *from, const char *to)
{
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    assert_non_null(a);
    assert_non_null(b);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, a)) > 0)
        assert_int_equal(fwrite(buf, 1, n, b), n);
    assert_int_equal(ferror(a), 0);
    fclose(a);
    assert_int_equal(fclose(b), 0);
}

/* 64-bit FNV-1a of n bytes: a fingerprint of logits or of a name. */
static inline uint64_t pi2t_fnv(const void *p, size_t n)
{
    const unsigned char *s = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 1099511628211ull;
    return h;
}

/* qsort comparator: floats in descending order. */
static inline int pi2t_cmp_float_desc(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* Whether the mapping holding p lists flag (two letters, e.g. "hg" for
 * MADV_HUGEPAGE) in /proc/self/smaps VmFlags: 1 yes, 0 no, -1 when smaps
 * or the mapping cannot be read. */
static inline int pi2t_vma_flag(const void *p, const char *flag)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return -1;
    char line[512];
    int in = 0, found = -1;
    while (found < 0 && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
            continue;
        }
        if (in && strncmp(line, "VmFlags:", 8) == 0) {
            found = 0;
            for (char *t = strtok(line + 8, " \n"); t; t = strtok(NULL, " \n"))
                found = found || strcmp(t, flag) == 0;
        }
    }
    fclose(f);
    return found;
}

/* Whether this kernel has transparent huge pages (MADV_HUGEPAGE is honoured). */
static inline int pi2t_have_thp(void)
{
    return pi2t_exists("/sys/kernel/mm/transparent_hugepage/enabled");
}

#endif
