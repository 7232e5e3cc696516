/* runtime/hwprof: the JSON cache round-trips bit for bit and refuses
 * broken or hostile files with the file and JSON path named; the cost-model
 * helpers interpolate, round and clamp as documented; the cache is used
 * when it matches this machine; one short real measurement gives finite
 * positive figures and leaves no scratch file behind. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "runtime/hwprof.h"
#include "runtime/kernels.h"
#include "tests/testjson.h"
#include "tests/testutil.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[64];

static int setup(void **state)
{
    (void)state;
    pi2t_tmpdir(g_dir, sizeof g_dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    pi2t_rmtree(g_dir);
    return 0;
}

static int online_threads(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > PI2_HW_MAX_THREADS ? PI2_HW_MAX_THREADS : (int)n;
}

/* A profile with distinct, awkward values everywhere (thirds do not have
 * short decimal forms), matching this machine for `dir` and t threads. */
static void make_profile(pi2_hwprof *p, const char *dir, int threads)
{
    memset(p, 0, sizeof *p);
    pi2_hwprof_cpu_name(p->cpu, sizeof p->cpu);
    snprintf(p->isa, sizeof p->isa, "%s", pi2_k_isa_name(pi2_k_get_isa()));
    snprintf(p->device, sizeof p->device, "%s", dir);
    snprintf(p->io_backend, sizeof p->io_backend, "io_uring");
    snprintf(p->measured_at, sizeof p->measured_at, "2025-03-01T12:34:56Z");
    struct stat st;
    assert_int_equal(stat(dir, &st), 0);
    p->dev = (uint64_t)st.st_dev;
    p->threads = threads;
    p->seconds = 21.0 / 3.0 + 1e-9;
    for (int t = 0; t < threads; t++) {
        pi2_hw_compute *c = &p->compute[t];
        double k = t + 1;
        c->mem_bw = 1.1e10 * k / 3;
        c->int8_peak = 4.0e11 * k / 7;
        c->gemv_q8 = 9.0e9 * k / 3;
        c->gemv_q4 = 1.2e10 * k / 3;
        c->matmul_q8 = 8.0e10 * k / 3;
        c->matmul_q4 = 7.5e10 * k / 3;
        c->sgemv = 2.0e10 * k / 3;
        for (int l = 0; l < PI2_HW_NLEN; l++) {
            c->gather_q8_ns[l] = (100.0 + 100 * l) / k / 3;
            c->gather_q4_ns[l] = (80.0 + 70 * l) / k / 3;
            c->down_q8_ns[l] = (120.0 + 300 * l) / k / 3;
            c->down_q4_ns[l] = (90.0 + 150 * l) / k / 3;
        }
        c->overlap = t == 0 ? 1.0 / 3 : t == 1 ? 0.0 : 1.0;
    }
    for (int s = 0; s < PI2_HW_NSIZES; s++)
        for (int d = 0; d < PI2_HW_NDEPTHS; d++) {
            double iops = 10000.0 * (d + 1) / (s + 1) / 3;
            p->io[s][d] = (pi2_hw_io){ iops, iops * PI2_HW_IO_SIZES[s], 30.0 * (d + 1) * (s + 1) / 7 };
        }
    p->seq_bps = 2.0e9 / 3;
}

static void test_round_trip(void **state)
{
    (void)state;
    pi2_hwprof p, q;
    char path[128];
    snprintf(path, sizeof path, "%s/sub/dir/hw.json", g_dir); /* parents are made */
    make_profile(&p, g_dir, 3);
    pi2_err e = { 0 };
    if (pi2_hwprof_save(&p, path, &e))
        fail_msg("save: %s", e.msg);
    memset(&q, 0xab, sizeof q);
    if (pi2_hwprof_load(path, &q, &e))
        fail_msg("load: %s", e.msg);
    assert_memory_equal(&p, &q, sizeof p);
    assert_true(q.compute[0].overlap == 1.0 / 3);
    assert_true(q.io[6][4].lat_us == 30.0 * 5 * 7 / 7);

    /* keys in the documented order, the grid size-major */
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(pi2_read_file(path, 1 << 20, &text, &len, &e), 0);
    static const char *const order[] = { "\"version\"", "\"cpu\"",        "\"isa\"",     "\"threads\"",
                                         "\"device\"",  "\"dev\"",        "\"io_backend\"", "\"measured_at\"",
                                         "\"seconds\"", "\"compute\"",    "\"storage\"",  "\"random\"",
                                         "\"seq_bps\"" };
    const char *at = text;
    for (size_t i = 0; i < sizeof order / sizeof *order; i++) {
        const char *hit = strstr(at, order[i]);
        if (!hit)
            fail_msg("%s missing or out of order", order[i]);
        at = hit;
    }
    json_t *root = load_json(path), *grid = json_object_get(json_object_get(root, "storage"), "random");
    assert_int_equal(json_array_size(grid), PI2_HW_NSIZES * PI2_HW_NDEPTHS);
    for (int i = 0; i < PI2_HW_NSIZES * PI2_HW_NDEPTHS; i++) {
        json_t *g = json_array_get(grid, (size_t)i);
        assert_int_equal(json_integer_value(json_object_get(g, "size")), PI2_HW_IO_SIZES[i / PI2_HW_NDEPTHS]);
        assert_int_equal(json_integer_value(json_object_get(g, "depth")), PI2_HW_IO_DEPTHS[i % PI2_HW_NDEPTHS]);
    }
    json_decref(root);
    assert_non_null(strstr(text, "\"version\": 1,"));
    /* no temporary files next to it */
    char dir[128];
    snprintf(dir, sizeof dir, "%s/sub/dir", g_dir);
    DIR *dp = opendir(dir);
    assert_non_null(dp);
    int files = 0;
    for (struct dirent *de; (de = readdir(dp));)
        files += de->d_name[0] != '.';
    closedir(dp);
    assert_int_equal(files, 1);
    free(text);

    /* saving refuses what loading would refuse, and writes nothing */
    p.compute[1].gemv_q4 = NAN;
    snprintf(path, sizeof path, "%s/bad.json", g_dir);
    pi2_err_clear(&e);
    assert_int_equal(pi2_hwprof_save(&p, path, &e), PI2_EFORMAT);
    assert_non_null(strstr(e.msg, "compute[1].gemv_q4"));
    assert_false(pi2t_exists(path));
    make_profile(&p, g_dir, 3);
    p.compute[0].overlap = 1.5;
    pi2_err_clear(&e);
    assert_int_equal(pi2_hwprof_save(&p, path, &e), PI2_ERANGE);
    assert_false(pi2t_exists(path));
}

/* ---- the reader against broken files ---- */

typedef void (*mutate_fn)(json_t *root);

/* root[a][i] */
static json_t *at_path(json_t *root, const char *a, int i) { return json_array_get(json_object_get(root, a), (size_t)i); }

static void m_del_cpu(json_t *r) { json_object_del(r, "cpu"); }
static void m_del_seq(json_t *r) { json_object_del(json_object_get(r, "storage"), "seq_bps"); }
static void m_unknown(json_t *r) { json_object_set_new(r, "extra", json_integer(1)); }
static void m_unknown_inner(json_t *r) { json_object_set_new(at_path(r, "compute", 1), "turbo", json_true()); }
static void m_short_grid(json_t *r)
{
    json_t *a = json_object_get(json_object_get(r, "storage"), "random");
    json_array_remove(a, json_array_size(a) - 1);
}
static void m_depth(json_t *r)
{
    json_t *a = json_object_get(json_object_get(r, "storage"), "random");
    json_object_set_new(json_array_get(a, 3), "depth", json_integer(8));
}
static void m_size(json_t *r)
{
    json_t *a = json_object_get(json_object_get(r, "storage"), "random");
    json_object_set_new(json_array_get(a, 7), "size", json_integer(4096));
}
static void m_neg(json_t *r) { json_object_set_new(at_path(r, "compute", 0), "mem_bw", json_real(-5.0)); }
static void m_zero_pair(json_t *r)
{
    json_array_set_new(json_object_get(at_path(r, "compute", 1), "gather_q4_ns"), 1, json_integer(0));
}
static void m_pair_len(json_t *r)
{
    json_array_append_new(json_object_get(at_path(r, "compute", 2), "down_q8_ns"), json_real(1.0));
}
static void m_overlap(json_t *r) { json_object_set_new(at_path(r, "compute", 0), "overlap", json_real(1.5)); }
static void m_overlap_neg(json_t *r) { json_object_set_new(at_path(r, "compute", 2), "overlap", json_real(-0.25)); }
static void m_threads0(json_t *r) { json_object_set_new(r, "threads", json_integer(0)); }
static void m_threads99(json_t *r) { json_object_set_new(r, "threads", json_integer(99)); }
static void m_threads_len(json_t *r) { json_object_set_new(r, "threads", json_integer(2)); }
static void m_entry_threads(json_t *r) { json_object_set_new(at_path(r, "compute", 2), "threads", json_integer(5)); }
static void m_version(json_t *r) { json_object_set_new(r, "version", json_integer(2)); }
static void m_seconds_str(json_t *r) { json_object_set_new(r, "seconds", json_string("fast")); }
static void m_iops_null(json_t *r)
{
    json_t *a = json_object_get(json_object_get(r, "storage"), "random");
    json_object_set_new(json_array_get(a, 0), "iops", json_null());
}
static void m_cpu_empty(json_t *r) { json_object_set_new(r, "cpu", json_string("")); }
static void m_cpu_long(json_t *r)
{
    char s[300];
    memset(s, 'x', sizeof s - 1);
    s[sizeof s - 1] = 0;
    json_object_set_new(r, "cpu", json_string(s));
}
static void m_cpu_ctl(json_t *r) { json_object_set_new(r, "cpu", json_string("AMD\nEPYC")); }
static void m_stamp(json_t *r) { json_object_set_new(r, "measured_at", json_string("yesterday")); }
static void m_dev_neg(json_t *r) { json_object_set_new(r, "dev", json_integer(-1)); }
static void m_dev_real(json_t *r) { json_object_set_new(r, "dev", json_real(3.5)); }
static void m_compute_obj(json_t *r) { json_object_set_new(r, "compute", json_object()); }
static void m_storage_arr(json_t *r) { json_object_set_new(r, "storage", json_array()); }
static void m_entry_arr(json_t *r) { json_array_set_new(json_object_get(r, "compute"), 1, json_array()); }
static void m_root_arr(json_t *r) { json_array_append_new(json_object_get(r, "compute"), json_integer(1)); }

static void write_tree(json_t *root, const char *path)
{
    assert_int_equal(json_dump_file(root, path, JSON_INDENT(1)), 0);
}

static void expect_refused(const char *path, int code, const char *where)
{
    pi2_hwprof q;
    pi2_err e = { 0 };
    int rc = pi2_hwprof_load(path, &q, &e);
    if (rc != code || strncmp(e.msg, path, strlen(path)) != 0 || (where && !strstr(e.msg, where)) ||
        strchr(e.msg, '\n'))
        fail_msg("%s: expected %d naming '%s', got %d: %s", where ? where : "?", code, where ? where : "", rc, e.msg);
}

static void test_load_refuses(void **state)
{
    (void)state;
    pi2_hwprof p;
    char good[128], bad[128];
    snprintf(good, sizeof good, "%s/good.json", g_dir);
    snprintf(bad, sizeof bad, "%s/bad.json", g_dir);
    make_profile(&p, g_dir, 3);
    pi2_err e = { 0 };
    assert_int_equal(pi2_hwprof_save(&p, good, &e), 0);

    static const struct {
        mutate_fn fn;
        int code;
        const char *where;
    } cases[] = {
        { m_del_cpu, PI2_EFORMAT, "cpu: required key is missing" },
        { m_del_seq, PI2_EFORMAT, "storage.seq_bps: required key is missing" },
        { m_unknown, PI2_EFORMAT, "extra: unknown key" },
        { m_unknown_inner, PI2_EFORMAT, "compute[1].turbo: unknown key" },
        { m_short_grid, PI2_EFORMAT, "storage.random: 34 entries" },
        { m_depth, PI2_EFORMAT, "storage.random[3].depth" },
        { m_size, PI2_EFORMAT, "storage.random[7].size" },
        { m_neg, PI2_ERANGE, "compute[0].mem_bw: -5 is out of range" },
        { m_zero_pair, PI2_ERANGE, "compute[1].gather_q4_ns[1]" },
        { m_pair_len, PI2_EFORMAT, "compute[2].down_q8_ns" },
        { m_overlap, PI2_ERANGE, "compute[0].overlap: 1.5 is out of range [0, 1]" },
        { m_overlap_neg, PI2_ERANGE, "compute[2].overlap" },
        { m_threads0, PI2_ERANGE, "threads: 0 is out of range" },
        { m_threads99, PI2_ERANGE, "threads: 99 is out of range" },
        { m_threads_len, PI2_EFORMAT, "compute: 3 entries" },
        { m_entry_threads, PI2_EFORMAT, "compute[2].threads" },
        { m_version, PI2_EFORMAT, "version: 2 is not supported" },
        { m_seconds_str, PI2_EFORMAT, "seconds: expected a finite number, got a string" },
        { m_iops_null, PI2_EFORMAT, "storage.random[0].iops" },
        { m_cpu_empty, PI2_EFORMAT, "cpu: empty string" },
        { m_cpu_long, PI2_ERANGE, "cpu: string of 299 bytes" },
        { m_cpu_ctl, PI2_EFORMAT, "cpu: string holds a control character" },
        { m_stamp, PI2_EFORMAT, "measured_at" },
        { m_dev_neg, PI2_ERANGE, "dev" },
        { m_dev_real, PI2_EFORMAT, "dev: expected an integer" },
        { m_compute_obj, PI2_EFORMAT, "compute: expected an array" },
        { m_storage_arr, PI2_EFORMAT, "storage: expected an object" },
        { m_entry_arr, PI2_EFORMAT, "compute[1]: expected an object" },
        { m_root_arr, PI2_EFORMAT, "compute: 4 entries" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        json_t *root = load_json(good);
        cases[i].fn(root);
        write_tree(root, bad);
        json_decref(root);
        expect_refused(bad, cases[i].code, cases[i].where);
    }

    /* raw text: not JSON, truncated, empty, NaN, overflow, duplicates, too big */
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(pi2_read_file(good, 1 << 20, &text, &len, &e), 0);
    pi2t_write(bad, text, len / 2);
    expect_refused(bad, PI2_EFORMAT, "not valid JSON");
    pi2t_write(bad, "", 0);
    expect_refused(bad, PI2_EFORMAT, "not valid JSON");
    pi2t_write(bad, "hello", 5);
    expect_refused(bad, PI2_EFORMAT, "not valid JSON");
    pi2t_write(bad, "[1, 2]", 6);
    expect_refused(bad, PI2_EFORMAT, "top level: expected an object, got an array");
    pi2t_write(bad, "{\"version\": 1, \"version\": 1}", 28);
    expect_refused(bad, PI2_EFORMAT, "not valid JSON");
    /* NaN and a number past double range in place of seq_bps */
    const char *k = strstr(text, "\"seq_bps\": ");
    assert_non_null(k);
    size_t head = (size_t)(k - text) + strlen("\"seq_bps\": ");
    const char *tail = strchr(text + head, '\n');
    static const char *const hostile[] = { "NaN", "1e999", "-Infinity", "0x10" };
    for (size_t i = 0; i < sizeof hostile / sizeof *hostile; i++) {
        char *t = malloc(len + 32);
        int n = snprintf(t, len + 32, "%.*s%s%s", (int)head, text, hostile[i], tail);
        pi2t_write(bad, t, (size_t)n);
        expect_refused(bad, PI2_EFORMAT, "not valid JSON");
        free(t);
    }
    /* the same splice with a good number loads (the splicing is sound) */
    {
        char *t = malloc(len + 32);
        int n = snprintf(t, len + 32, "%.*s%s%s", (int)head, text, "12.5", tail);
        pi2t_write(bad, t, (size_t)n);
        pi2_hwprof q;
        pi2_err_clear(&e);
        if (pi2_hwprof_load(bad, &q, &e))
            fail_msg("%s", e.msg);
        assert_true(q.seq_bps == 12.5);
        free(t);
    }
    /* a NUL byte inside */
    text[10] = 0;
    pi2t_write(bad, text, len);
    expect_refused(bad, PI2_EFORMAT, "not valid JSON");
    free(text);
    /* larger than any profile */
    size_t big = (2u << 20);
    char *huge = malloc(big);
    memset(huge, ' ', big);
    pi2t_write(bad, huge, big);
    free(huge);
    expect_refused(bad, PI2_ERANGE, "larger than");
    /* missing */
    char none[128];
    snprintf(none, sizeof none, "%s/none.json", g_dir);
    pi2_hwprof q;
    pi2_err_clear(&e);
    assert_int_equal(pi2_hwprof_load(none, &q, &e), PI2_ENOTFOUND);
    assert_non_null(strstr(e.msg, none));
}

/* ---- cost-model helpers ---- */

static void expect_io(pi2_hw_io got, pi2_hw_io want)
{
    assert_true(got.iops == want.iops);
    assert_true(got.bytes_per_s == want.bytes_per_s);
    assert_true(got.lat_us == want.lat_us);
}

static void near(double got, double want)
{
    if (!(fabs(got - want) <= 1e-9 * fabs(want) + 1e-12))
        fail_msg("got %.17g, want %.17g", got, want);
}

static void test_io_at(void **state)
{
    (void)state;
    pi2_hwprof p;
    make_profile(&p, g_dir, 1);
    /* exact at every grid point */
    for (int s = 0; s < PI2_HW_NSIZES; s++)
        for (int d = 0; d < PI2_HW_NDEPTHS; d++)
            expect_io(pi2_hwprof_io_at(&p, PI2_HW_IO_SIZES[s], PI2_HW_IO_DEPTHS[d]), p.io[s][d]);
    /* log-linear between sizes: halfway in log size is the mean */
    for (int s = 0; s + 1 < PI2_HW_NSIZES; s++) {
        uint32_t lo = PI2_HW_IO_SIZES[s], hi = PI2_HW_IO_SIZES[s + 1];
        uint32_t mid = (uint32_t)lrint(sqrt((double)lo * hi));
        double f = log((double)mid / lo) / log((double)hi / lo);
        pi2_hw_io g = pi2_hwprof_io_at(&p, mid, 16), a = p.io[s][2], b = p.io[s + 1][2];
        near(g.iops, a.iops + f * (b.iops - a.iops));
        near(g.bytes_per_s, a.bytes_per_s + f * (b.bytes_per_s - a.bytes_per_s));
        near(g.lat_us, a.lat_us + f * (b.lat_us - a.lat_us));
        assert_true(fabs(f - 0.5) < 1e-4);
        /* one byte above a grid point is just above it, not at the next */
        pi2_hw_io j = pi2_hwprof_io_at(&p, lo + 1, 16);
        assert_true(fabs(j.iops - a.iops) < 1e-3 * fabs(b.iops - a.iops));
    }
    /* 6144 = 1.5 x 4096 */
    pi2_hw_io g = pi2_hwprof_io_at(&p, 6144, 1);
    near(g.iops, p.io[0][0].iops + (log(1.5) / log(2.0)) * (p.io[1][0].iops - p.io[0][0].iops));
    /* clamped outside the grid */
    expect_io(pi2_hwprof_io_at(&p, 512, 4), p.io[0][1]);
    expect_io(pi2_hwprof_io_at(&p, 0, 4), p.io[0][1]);
    expect_io(pi2_hwprof_io_at(&p, 1u << 20, 32), p.io[PI2_HW_NSIZES - 1][3]);
    expect_io(pi2_hwprof_io_at(&p, UINT32_MAX, 64), p.io[PI2_HW_NSIZES - 1][4]);
    /* depth: the nearest grid depth not above it, at least the smallest */
    static const int depth[][2] = { { -5, 0 }, { 0, 0 },  { 1, 0 },  { 3, 0 },  { 4, 1 },     { 15, 1 },
                                    { 16, 2 }, { 31, 2 }, { 32, 3 }, { 63, 3 }, { 64, 4 }, { 100000, 4 } };
    for (size_t i = 0; i < sizeof depth / sizeof *depth; i++)
        expect_io(pi2_hwprof_io_at(&p, 16384, depth[i][0]), p.io[2][depth[i][1]]);
    /* a dip at a deeper depth (the probe's noise) takes the shallower best:
     * throughput never falls with depth; latency stays the depth's own */
    pi2_hw_io d32 = p.io[2][3];
    p.io[2][4].iops = d32.iops * 0.8;
    p.io[2][4].bytes_per_s = d32.bytes_per_s * 0.8;
    p.io[2][4].lat_us = 999.0;
    pi2_hw_io dip = pi2_hwprof_io_at(&p, 16384, 64);
    assert_true(dip.iops == d32.iops && dip.bytes_per_s == d32.bytes_per_s && dip.lat_us == 999.0);
    pi2_hw_io mid = pi2_hwprof_io_at(&p, 20000, 64), lo = pi2_hwprof_io_at(&p, 20000, 32);
    assert_true(mid.iops >= lo.iops && mid.bytes_per_s >= lo.bytes_per_s);
}

static void test_row_ns(void **state)
{
    (void)state;
    const double ns[PI2_HW_NLEN] = { 100.0, 250.0 };
    near(pi2_hwprof_row_ns(ns, PI2_HW_ROW_LENS[0]), 100.0);
    near(pi2_hwprof_row_ns(ns, PI2_HW_ROW_LENS[1]), 250.0);
    near(pi2_hwprof_row_ns(ns, 2560), 175.0);
    near(pi2_hwprof_row_ns(ns, 8192), 100.0 + 150.0 / 3072.0 * (8192 - 1024));
    near(pi2_hwprof_row_ns(ns, 0), 50.0);
    /* a fit that falls with n is clamped at zero, never negative */
    const double falling[PI2_HW_NLEN] = { 100.0, 10.0 };
    near(pi2_hwprof_row_ns(falling, 2048), 100.0 - 90.0 / 3072.0 * 1024);
    assert_true(pi2_hwprof_row_ns(falling, 8192) == 0.0);
    assert_true(pi2_hwprof_row_ns(falling, INT64_MAX / 2) == 0.0);

    pi2_hwprof p;
    make_profile(&p, g_dir, 3);
    assert_ptr_equal(pi2_hwprof_compute(&p, 1), &p.compute[0]);
    assert_ptr_equal(pi2_hwprof_compute(&p, 3), &p.compute[2]);
    assert_ptr_equal(pi2_hwprof_compute(&p, 0), &p.compute[0]);
    assert_ptr_equal(pi2_hwprof_compute(&p, -4), &p.compute[0]);
    assert_ptr_equal(pi2_hwprof_compute(&p, 99), &p.compute[2]);
}

static void test_matches(void **state)
{
    (void)state;
    pi2_hwprof p;
    make_profile(&p, g_dir, 2);
    pi2_hwprof_opts o = { .threads = 2, .device_dir = g_dir };
    assert_true(pi2_hwprof_matches(&p, &o));
    pi2_hwprof q = p;
    snprintf(q.cpu, sizeof q.cpu, "Some Other CPU");
    assert_false(pi2_hwprof_matches(&q, &o));
    q = p;
    snprintf(q.isa, sizeof q.isa, "%s", pi2_k_get_isa() == PI2_ISA_SCALAR ? "avx2" : "scalar");
    assert_false(pi2_hwprof_matches(&q, &o));
    q = p;
    q.dev ^= 1;
    assert_false(pi2_hwprof_matches(&q, &o));
    o.threads = 1; /* a profile measured up to more threads covers fewer */
    assert_true(pi2_hwprof_matches(&p, &o));
    o.threads = 3;
    assert_false(pi2_hwprof_matches(&p, &o));
    /* 0 threads: the online CPUs, at most PI2_HW_MAX_THREADS */
    o.threads = 0;
    make_profile(&q, g_dir, online_threads());
    assert_true(pi2_hwprof_matches(&q, &o));
    o.threads = 2;
    o.device_dir = "/nonexistent/pi2-hw";
    assert_false(pi2_hwprof_matches(&p, &o));
    /* NULL device_dir is "." */
    make_profile(&q, ".", 2);
    o.device_dir = NULL;
    assert_true(pi2_hwprof_matches(&q, &o));
}

static void test_get_cached(void **state)
{
    (void)state;
    pi2_hwprof p, q;
    char path[128];
    snprintf(path, sizeof path, "%s/hw.json", g_dir);
    make_profile(&p, g_dir, 1);
    pi2_err e = { 0 };
    assert_int_equal(pi2_hwprof_save(&p, path, &e), 0);
    pi2_hwprof_opts o = { .threads = 1, .device_dir = g_dir, .file_mb = 1, .point_seconds = 0.001 };
    bool measured = true;
    for (int measure = 0; measure < 2; measure++) {
        memset(&q, 0, sizeof q);
        measured = true;
        if (pi2_hwprof_get(&o, path, measure, &q, &measured, &e))
            fail_msg("get: %s", e.msg);
        assert_false(measured);
        assert_memory_equal(&p, &q, sizeof p);
    }
    /* missing, without measuring */
    char none[128];
    snprintf(none, sizeof none, "%s/none.json", g_dir);
    pi2_err_clear(&e);
    assert_int_equal(pi2_hwprof_get(&o, none, false, &q, &measured, &e), PI2_ENOTFOUND);
    assert_non_null(strstr(e.msg, none));
    assert_non_null(strstr(e.msg, "no hardware profile at"));
    assert_null(strstr(e.msg, "--")); /* the tool names its flags, not the library */
    assert_false(pi2t_exists(none));
    /* another setup, without measuring */
    o.threads = 2;
    pi2_err_clear(&e);
    assert_int_equal(pi2_hwprof_get(&o, path, false, &q, &measured, &e), PI2_ENOTFOUND);
    assert_non_null(strstr(e.msg, path));
    assert_non_null(strstr(e.msg, "threads"));
    o.threads = 1;
    /* corrupt, without measuring: the reader's error */
    char bad[128];
    snprintf(bad, sizeof bad, "%s/bad.json", g_dir);
    pi2t_write(bad, "{}", 2);
    pi2_err_clear(&e);
    assert_int_equal(pi2_hwprof_get(&o, bad, false, &q, &measured, &e), PI2_EFORMAT);
    assert_non_null(strstr(e.msg, bad));

    /* default path: $PI2_HW_PROFILE, else $XDG_CACHE_HOME/pi2/hw-<dev>.json */
    char buf[256], want[256], env[128];
    snprintf(env, sizeof env, "%s/env.json", g_dir);
    setenv("PI2_HW_PROFILE", env, 1);
    assert_int_equal(pi2_hwprof_default_path(g_dir, buf, sizeof buf, &e), 0);
    assert_string_equal(buf, env);
    unsetenv("PI2_HW_PROFILE");
    char cache[128];
    snprintf(cache, sizeof cache, "%s/cache", g_dir);
    setenv("XDG_CACHE_HOME", cache, 1);
    assert_int_equal(pi2_hwprof_default_path(g_dir, buf, sizeof buf, &e), 0);
    snprintf(want, sizeof want, "%s/pi2/hw-%llx.json", cache, (unsigned long long)p.dev);
    assert_string_equal(buf, want);
    pi2_err_clear(&e);
    assert_int_equal(pi2_hwprof_default_path(g_dir, buf, 20, &e), PI2_ERANGE);
    pi2_err_clear(&e);
    assert_int_equal(pi2_hwprof_default_path("/nonexistent/pi2-hw", buf, sizeof buf, &e), PI2_EIO);
    assert_non_null(strstr(e.msg, "/nonexistent/pi2-hw"));
    /* get with the default path: saved there (directories made), found there */
    assert_int_equal(pi2_hwprof_save(&p, want, &e), 0);
    memset(&q, 0, sizeof q);
    measured = true;
    pi2_err_clear(&e);
    if (pi2_hwprof_get(&o, NULL, false, &q, &measured, &e))
        fail_msg("get: %s", e.msg);
    assert_false(measured);
    assert_memory_equal(&p, &q, sizeof p);
    unsetenv("XDG_CACHE_HOME");
}

/* ---- one real measurement ---- */

static void positive(double x, const char *what, int i)
{
    if (!(isfinite(x) && x > 0))
        fail_msg("%s[%d] = %g", what, i, x);
}

static void test_measure(void **state)
{
    (void)state;
    char dev[128];
    snprintf(dev, sizeof dev, "%s/dev", g_dir);
    assert_int_equal(mkdir(dev, 0755), 0);
    pi2_hwprof_opts o = { .threads = 1, .device_dir = dev, .file_mb = 8, .point_seconds = 0.02 };
    pi2_hwprof p;
    pi2_err e = { 0 };
    double t0 = pi2_now();
    int rc = pi2_hwprof_measure(&o, &p, &e);
    if (rc == PI2_EIO && strstr(e.msg, "direct I/O")) {
        assert_int_equal(pi2t_count_entries(dev), 0);
        fprintf(stderr, "skip: %s\n", e.msg);
        skip();
    }
    if (rc)
        fail_msg("measure: %s", e.msg);
    double took = pi2_now() - t0;
    assert_int_equal(pi2t_count_entries(dev), 0); /* the scratch file is gone */
    char cpu[128];
    pi2_hwprof_cpu_name(cpu, sizeof cpu);
    assert_string_equal(p.cpu, cpu);
    assert_string_equal(p.isa, pi2_k_isa_name(pi2_k_get_isa()));
    assert_string_equal(p.device, dev);
    assert_int_equal(p.threads, 1);
    struct stat st;
    assert_int_equal(stat(dev, &st), 0);
    assert_true(p.dev == (uint64_t)st.st_dev);
    assert_true(p.io_backend[0] != 0);
    assert_int_equal(strlen(p.measured_at), 20);
    assert_true(p.measured_at[19] == 'Z');
    positive(p.seconds, "seconds", 0);
    assert_true(p.seconds <= took + 0.01);
    const pi2_hw_compute *c = &p.compute[0];
    const double f[] = { c->mem_bw, c->int8_peak, c->gemv_q8, c->gemv_q4, c->matmul_q8, c->matmul_q4, c->sgemv };
    for (int i = 0; i < (int)(sizeof f / sizeof *f); i++)
        positive(f[i], "compute figure", i);
    for (int l = 0; l < PI2_HW_NLEN; l++) {
        positive(c->gather_q8_ns[l], "gather_q8_ns", l);
        positive(c->gather_q4_ns[l], "gather_q4_ns", l);
        positive(c->down_q8_ns[l], "down_q8_ns", l);
        positive(c->down_q4_ns[l], "down_q4_ns", l);
    }
    assert_true(c->overlap >= 0 && c->overlap <= 1);
    for (int s = 0; s < PI2_HW_NSIZES; s++)
        for (int d = 0; d < PI2_HW_NDEPTHS; d++) {
            positive(p.io[s][d].iops, "iops", s * PI2_HW_NDEPTHS + d);
            positive(p.io[s][d].bytes_per_s, "bytes_per_s", s * PI2_HW_NDEPTHS + d);
            positive(p.io[s][d].lat_us, "lat_us", s * PI2_HW_NDEPTHS + d);
        }
    positive(p.seq_bps, "seq_bps", 0);
    /* a real profile matches this setup and survives the strict reader */
    assert_true(pi2_hwprof_matches(&p, &o));
    char path[128];
    snprintf(path, sizeof path, "%s/hw.json", g_dir);
    pi2_hwprof q;
    if (pi2_hwprof_save(&p, path, &e) || pi2_hwprof_load(path, &q, &e))
        fail_msg("%s", e.msg);
    assert_memory_equal(&p, &q, sizeof p);
}

static void test_measure_bad(void **state)
{
    (void)state;
    pi2_hwprof p;
    pi2_err e = { 0 };
    pi2_hwprof_opts o = { .threads = 1, .device_dir = "/nonexistent/pi2-hw", .file_mb = 8, .point_seconds = 0.02 };
    assert_int_equal(pi2_hwprof_measure(&o, &p, &e), PI2_EIO);
    assert_non_null(strstr(e.msg, "/nonexistent/pi2-hw"));
    /* a file is not a directory */
    char file[128];
    snprintf(file, sizeof file, "%s/plain", g_dir);
    pi2t_write(file, "x", 1);
    o.device_dir = file;
    pi2_err_clear(&e);
    assert_int_equal(pi2_hwprof_measure(&o, &p, &e), PI2_EIO);
    assert_non_null(strstr(e.msg, file));
    /* bad options */
    o.device_dir = g_dir;
    static const int threads[] = { -1, PI2_HW_MAX_THREADS + 1, 99 };
    for (size_t i = 0; i < sizeof threads / sizeof *threads; i++) {
        o.threads = threads[i];
        pi2_err_clear(&e);
        assert_int_equal(pi2_hwprof_measure(&o, &p, &e), PI2_ERANGE);
    }
    o.threads = 1;
    o.point_seconds = -1;
    pi2_err_clear(&e);
    assert_int_equal(pi2_hwprof_measure(&o, &p, &e), PI2_ERANGE);
    o.point_seconds = NAN;
    pi2_err_clear(&e);
    assert_int_equal(pi2_hwprof_measure(&o, &p, &e), PI2_ERANGE);
    o.point_seconds = 0.02;
    o.file_mb = -3;
    pi2_err_clear(&e);
    assert_int_equal(pi2_hwprof_measure(&o, &p, &e), PI2_ERANGE);
    /* get measuring into a directory that does not exist fails the same way */
    o.file_mb = 8;
    o.device_dir = "/nonexistent/pi2-hw";
    char path[128];
    snprintf(path, sizeof path, "%s/never.json", g_dir);
    bool measured = true;
    pi2_err_clear(&e);
    assert_int_equal(pi2_hwprof_get(&o, path, true, &p, &measured, &e), PI2_EIO);
    assert_false(measured);
    assert_false(pi2t_exists(path));
    assert_int_equal(pi2t_count_entries(g_dir), 1); /* only "plain" */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_refuses, setup, teardown),
        cmocka_unit_test_setup_teardown(test_io_at, setup, teardown),
        cmocka_unit_test_setup_teardown(test_row_ns, setup, teardown),
        cmocka_unit_test_setup_teardown(test_matches, setup, teardown),
        cmocka_unit_test_setup_teardown(test_get_cached, setup, teardown),
        cmocka_unit_test_setup_teardown(test_measure, setup, teardown),
        cmocka_unit_test_setup_teardown(test_measure_bad, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
