/* pi2-run probe: the int8 peak and memory bandwidth (hw), a storage probe (io), the
 * planner's hardware profile (profile). */
#include "runtime/cli/run.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct probe_job {
    const uint8_t *buf;
    size_t per;
    double fig[256];
    double t0[256], t1[256];
    bool do_peak;
} probe_job;

static void *probe_thread(void *arg);

/* The largest read of the probe: its sequential pass (1 MiB at a time). */
#define IO_PROBE_MIN ((uint64_t)1 << 20)

/* Storage probe on a file (the filesystem that holds the model), of at
 * least IO_PROBE_MIN bytes: refused before anything is printed. */
int run_io_probe(const run_opts *o)
{
    struct stat st;
    if (stat(o->io_probe, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size < IO_PROBE_MIN) {
        fprintf(stderr,
                "pi2-run: %s: too small to probe (%lld bytes): the probe reads up to 1 MB at a time; give a file "
                "of at least 1 MB (1048576 bytes) on the storage to measure, such as the model\n",
                o->io_probe, (long long)st.st_size);
        return 1;
    }
    pi2_io_opts io;
    pi2_io_defaults(&io);
    io.backend = (pi2_io_backend)o->io_backend;
    io.depth = 32;
    pi2_io *r = NULL;
    pi2_err err = {0};
    if (pi2_io_open(&r, o->io_probe, &io, &err))
        return fail(&err);
    static const uint32_t sizes[] = {4096, 8192, 16384, 32768, 65536, 131072, 262144};
    static const int depths[] = {1, 8, 32};
    printf("{\"file\":\"%s\",\"io\":\"%s\",\"random\":[", o->io_probe, pi2_io_backend_name(pi2_io_backend_used(r)));
    int first = 1, rc = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes && !rc; si++)
        for (size_t di = 0; di < sizeof depths / sizeof *depths && !rc; di++) {
            pi2_io_bench_result b;
            if ((rc = pi2_io_bench(r, sizes[si], depths[di], false, 0.25, &b, &err)) != 0)
                break;
            printf("%s{\"size\":%u,\"depth\":%d,\"bytes_per_s\":%.4g,\"iops\":%.4g,\"lat_us\":%.1f,"
                   "\"cpu_us\":%.2f}",
                   first ? "" : ",", sizes[si], depths[di], b.bytes_per_s, b.iops, b.lat_us, b.cpu_us);
            first = 0;
        }
    pi2_io_bench_result sq = {0};
    if (!rc)
        rc = pi2_io_bench(r, 1u << 20, 8, true, 1.0, &sq, &err);
    printf("],\"sequential_bytes_per_s\":%.4g}\n", sq.bytes_per_s);
    pi2_io_close(r);
    if (rc)
        return fail(&err);
    return 0;
}

int run_hw_probe(const run_opts *o)
{
    int nt = o->threads > 0 ? o->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (nt < 1)
        nt = 1;
    if (nt > 64)
        nt = 64;
    pi2_isa isa = pi2_k_get_isa();
    double peak1 = pi2_k_probe_int8_peak(isa, 0.3);
    size_t per = (size_t)256 << 20;
    uint8_t *buf = malloc(per * (size_t)nt);
    if (!buf) {
        fprintf(stderr, "pi2-run: --hw-probe: out of memory for a %zu MB buffer\n", per * (size_t)nt >> 20);
        return 1;
    }
    /* distinct bytes on every page: pages of one value can be merged into
     * one physical page (same-page merging), whose reads then come from
     * cache and overstate the bandwidth (81 GB/s seen on a ~30 GB/s VM) */
    pi2_rng rng;
    pi2_rng_seed(&rng, 0x9e3779b97f4a7c15ull);
    for (size_t i = 0; i + 8 <= per * (size_t)nt; i += 8) {
        uint64_t v = pi2_rng_u64(&rng);
        memcpy(buf + i, &v, 8);
    }
    probe_job pj = {.buf = buf, .per = per};
    pthread_t th[64];
    struct {
        probe_job *j;
        int i;
    } args[64];
    double bw1 = pi2_k_probe_read_bw(buf, per, 0.5), bw = 0, peak = 0;
    for (int pass = 0; pass < 2; pass++) {
        pj.do_peak = pass == 1;
        for (int i = 0; i < nt; i++) {
            args[i].j = &pj;
            args[i].i = i;
            pthread_create(&th[i], NULL, probe_thread, &args[i]);
        }
        for (int i = 0; i < nt; i++)
            pthread_join(th[i], NULL);
        double rate = pi2_k_probe_combine(pj.fig, pj.t0, pj.t1, nt);
        if (pj.do_peak)
            peak = rate;
        else
            bw = rate;
    }
    printf("{\"isa\":\"%s\",\"threads\":%d,\"int8_macs_per_s_1t\":%.4g,\"int8_macs_per_s\":%.4g,"
           "\"read_bytes_per_s_1t\":%.4g,\"read_bytes_per_s\":%.4g}\n",
           pi2_k_isa_name(isa), nt, peak1, peak, bw1, bw);
    free(buf);
    return 0;
}

static void *probe_thread(void *arg)
{
    struct {
        probe_job *j;
        int i;
    } *a = arg;
    probe_job *j = a->j;
    j->t0[a->i] = pi2_now();
    if (j->do_peak)
        j->fig[a->i] = pi2_k_probe_int8_peak(pi2_k_get_isa(), 0.3);
    else
        j->fig[a->i] = pi2_k_probe_read_bw(j->buf + (size_t)a->i * j->per, j->per, 0.5);
    j->t1[a->i] = pi2_now();
    return NULL;
}

/* The output rule for the profile at path: never the model, and an
 * existing file is replaced only when it is a hardware profile (the cache
 * --profile-hw refreshes) or with --force. */
static int profile_out_check(const run_opts *o, const char *path, const char *model, pi2_err *err)
{
    const char *inputs[] = {model};
    struct stat st;
    bool replace = o->force;
    if (!replace && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
        pi2_hwprof *old = malloc(sizeof *old);
        replace = old && pi2_hwprof_load(path, old, NULL) == 0;
        free(old);
        if (!replace)
            return pi2_err_set(err, PI2_EINVAL, "%s exists and is not a hardware profile: give --force to replace it, "
                               "or another --hw-profile", path);
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir)
        *slash = 0;
    if (slash && !pi2_is_dir(dir))
        return 0; /* the cache's directory, created by the save: nothing there to overwrite */
    int rc = pi2_out_check(path, inputs, 1, replace ? PI2_OUT_FORCE : 0, 0, err);
    pi2_cli_force_hint(err);
    return rc;
}

/* Hardware profile for the planner: measure, save where the planner looks
 * (or --hw-profile), print the saved JSON. args: the optional model. */
int run_profile_hw(const run_opts *o, int nargs, char **args)
{
    if (nargs > 1) {
        fprintf(stderr, "pi2-run: unexpected argument '%s'; see --help\n", args[1]);
        return 2;
    }
    if (o->threads > PI2_HW_MAX_THREADS) {
        fprintf(stderr, "pi2-run: -t %d: --profile-hw measures at most %d threads\n", o->threads, PI2_HW_MAX_THREADS);
        return 2;
    }
    char dir[4096] = ".";
    if (o->device_path) {
        snprintf(dir, sizeof dir, "%s", o->device_path);
    } else if (nargs == 1 && pi2_is_dir(args[0])) {
        snprintf(dir, sizeof dir, "%s", args[0]);
    } else if (nargs == 1 && strrchr(args[0], '/')) {
        snprintf(dir, sizeof dir, "%s", args[0]);
        char *slash = strrchr(dir, '/');
        slash[slash == dir] = 0; /* "/m.pi2" -> "/" */
    }
    pi2_hwprof_opts ho = {.threads = o->threads, .device_dir = dir, .point_seconds = o->profile_seconds,
                          .log = isatty(2) && !o->quiet ? stderr : NULL};
    pi2_err err = {0};
    char path[4096];
    char *text = NULL;
    pi2_hwprof *p = malloc(sizeof *p);
    int rc;
    if (!p)
        rc = pi2_err_set(&err, PI2_ENOMEM, "out of memory");
    else if (o->hw_profile)
        rc = snprintf(path, sizeof path, "%s", o->hw_profile) < (int)sizeof path
                 ? 0
                 : pi2_err_set(&err, PI2_ERANGE, "--hw-profile: path too long");
    else
        rc = pi2_hwprof_default_path(dir, path, sizeof path, &err);
    if (rc == 0)
        rc = profile_out_check(o, path, nargs == 1 ? args[0] : NULL, &err);
    if (rc == 0 && (rc = pi2_hwprof_measure(&ho, p, &err)) == 0 && (rc = pi2_hwprof_save(p, path, &err)) == 0 &&
        (rc = pi2_read_file(path, 1u << 20, &text, NULL, &err)) == 0) {
        fputs(text, stdout);
        fflush(stdout);
        if (!o->quiet)
            fprintf(stderr, "pi2-run: hardware profile (%.1f s) saved to %s\n", p->seconds, path);
    }
    free(text);
    free(p);
    return rc ? fail(&err) : 0;
}
