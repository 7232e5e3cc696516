/* Fuzz target: the hardware profile reader (pi2_hwprof_load). A profile
 * read must save (pi2_hwprof_save) and load back the same figures, and
 * the planner's lookups run over it. */
#include "runtime/hwprof.h"
#include "tests/fuzz/fuzz_util.h"

#include <string.h>

static void round_trip(const pi2_hwprof *p)
{
    char path[64];
    if (fuzz_tmpfile((const uint8_t *)"", 0, path) != 0)
        return;
    pi2_hwprof q;
    pi2_err e = {0};
    if (pi2_hwprof_save(p, path, &e) != 0 || pi2_hwprof_load(path, &q, &e) != 0) {
        fprintf(stderr, "a read profile does not save and load back: %s\n", e.msg);
        abort();
    }
    if (q.threads != p->threads || strcmp(q.cpu, p->cpu) != 0 || strcmp(q.device, p->device) != 0) {
        fprintf(stderr, "profile round trip differs\n");
        abort();
    }
    unlink(path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    if (fuzz_tmpfile(data, size, path) != 0)
        return 0;
    pi2_hwprof *p = malloc(sizeof *p);
    pi2_err err = {0};
    if (p && pi2_hwprof_load(path, p, &err) == 0) {
        for (int t = 0; t <= PI2_HW_MAX_THREADS + 1; t++)
            (void)pi2_hwprof_compute(p, t);
        for (uint32_t sz = 2048; sz <= (1u << 20); sz *= 2)
            for (int d = 0; d <= 128; d = d ? d * 2 : 1)
                (void)pi2_hwprof_io_at(p, sz, d);
        round_trip(p);
    } else if (p && (!err.msg[0] || !strstr(err.msg, path))) {
        fprintf(stderr, "a refused profile's message does not name the file: %s\n", err.msg);
        abort();
    }
    free(p);
    unlink(path);
    return 0;
}
