/* Private to runtime/hwprof*.c: what the cache (hwprof.c) shares with the
 * measurements (hwprof_probe.c). */
#ifndef PI2_HWPROF_PROBE_H
#define PI2_HWPROF_PROBE_H

#include <stdio.h>

/* t, or the online CPUs capped at PI2_HW_MAX_THREADS when t is 0. */
int pi2_hw_resolve_threads(int t);
/* The kernels' ISA in use, as profiles record it. */
const char *pi2_hw_isa_now(void);
/* "hwprof: <fmt>\n" to log (flushed); nothing when log is NULL. */
__attribute__((format(printf, 2, 3))) void pi2_hw_logf(FILE *log, const char *fmt, ...);

#endif
