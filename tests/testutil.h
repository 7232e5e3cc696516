/* Shared helpers for the cmocka tests: temp dirs, the shared golden models,
 * and small file utilities. Header-only so each test stays one file. */
#ifndef PI2_TESTUTIL_H
#define PI2_TESTUTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

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
