/* Helpers shared by the fuzz targets (tests/fuzz/fuzz_*.c): write an input to
 * a private temporary file for the readers that take a path. Header-only so
 * each target stays one .c file for both libFuzzer and the replay driver. */
#ifndef PI2_FUZZ_UTIL_H
#define PI2_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Write data to a new temp file; path gets its name (caller unlinks it).
 * /dev/shm when present keeps the fuzzer off the disk. 0 or -1. */
static inline int fuzz_tmpfile(const uint8_t *data, size_t size, char path[64])
{
    const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(path, 64, "%s/pi2fuzz.XXXXXX", dir);
    int fd = mkstemp(path);
    if (fd < 0)
        return -1;
    size_t off = 0;
    while (off < size) {
        ssize_t w = write(fd, data + off, size - off);
        if (w <= 0) {
            close(fd);
            unlink(path);
            return -1;
        }
        off += (size_t)w;
    }
    close(fd);
    return 0;
}

#endif
