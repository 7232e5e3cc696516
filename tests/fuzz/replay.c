/* Regression replay of a fuzz target without libFuzzer: run
 * LLVMFuzzerTestOneInput on every file of the given directories (missing
 * directories are skipped) and print "fuzz-replay <target>: N inputs ok".
 * Built with the normal compiler (and under SAN=1), linked with one target.
 * Usage: replay TARGET DIR... ; exit 1 if a file cannot be read. A crash
 * of the target is a crash of this process (the caller counts it). */
#include "tests/fuzz/fuzz_util.h"

#include <dirent.h>
#include <string.h>
#include <sys/stat.h>

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: %s: cannot open\n", path);
        return -1;
    }
    size_t cap = 4096, len = 0;
    uint8_t *buf = malloc(cap);
    size_t r;
    while (buf && (r = fread(buf + len, 1, cap - len, f)) > 0) {
        len += r;
        if (len == cap) {
            uint8_t *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    int bad = ferror(f) || !buf;
    fclose(f);
    if (bad) {
        free(buf);
        fprintf(stderr, "replay: %s: read failed\n", path);
        return -1;
    }
    /* An exact-size copy so ASan sees reads past the end of the input. */
    uint8_t *exact = malloc(len ? len : 1);
    if (!exact) {
        free(buf);
        return -1;
    }
    memcpy(exact, buf, len);
    free(buf);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s TARGET DIR...\n", argv[0]);
        return 2;
    }
    size_t ok = 0;
    int failed = 0;
    for (int a = 2; a < argc; a++) {
        DIR *d = opendir(argv[a]);
        if (!d)
            continue;
        char **names = NULL;
        size_t n = 0, cap = 0;
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.')
                continue;
            if (n == cap) {
                cap = cap ? cap * 2 : 64;
                char **nn = realloc(names, cap * sizeof *names);
                if (!nn)
                    break;
                names = nn;
            }
            names[n++] = strdup(e->d_name);
        }
        closedir(d);
        if (n)
            qsort(names, n, sizeof *names, cmp_str);
        for (size_t i = 0; i < n; i++) {
            char path[4096];
            struct stat st;
            snprintf(path, sizeof path, "%s/%s", argv[a], names[i] ? names[i] : "");
            if (names[i] && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
                if (run_file(path) == 0)
                    ok++;
                else
                    failed = 1;
            }
            free(names[i]);
        }
        free(names);
    }
    if (failed)
        return 1;
    printf("fuzz-replay %s: %zu inputs ok\n", argv[1], ok);
    return 0;
}
