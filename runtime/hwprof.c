/* pi2 hardware profile, the model: the strict JSON cache (reader, writer,
 * cache lookup) and the cost-model helpers. The measurements are in
 * runtime/hwprof_probe.c; see runtime/hwprof.h.
 *
 * The writer prints the tree with a small emitter (one line per record) and
 * parses its own output with the reader, so the checks live in one place. */
#include "runtime/hwprof.h"
#include "runtime/hwprof_probe.h"
#include "formats/jsonread.h"
#include "formats/jsonutil.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const uint32_t PI2_HW_IO_SIZES[PI2_HW_NSIZES] = { 4096, 8192, 16384, 32768, 65536, 131072, 262144 };
const int PI2_HW_IO_DEPTHS[PI2_HW_NDEPTHS] = { 1, 4, 16, 32, 64 };
const int PI2_HW_ROW_LENS[PI2_HW_NLEN] = { 1024, 4096 };

#define HW_MAX_JSON (1u << 20) /* a profile is a few KB */

/* ---------------- JSON reader ---------------- */

/* Every member is read through formats/jsonread (c names the file and holds
 * the error); the figures are finite and > 0, overlap a share in [0, 1]. */
static int get_num(pi2_jr *c, json_t *o, const char *w, const char *k, bool unit, double *out)
{
    return unit ? pi2_jr_real(c, o, w, k, 0, 1, 0, out) : pi2_jr_real(c, o, w, k, 0, DBL_MAX, PI2_JR_LO_OPEN, out);
}

/* [x at PI2_HW_ROW_LENS[0], x at [1]], each > 0. */
static int get_pair(pi2_jr *c, json_t *o, const char *w, const char *k, double out[PI2_HW_NLEN])
{
    json_t *a = json_object_get(o, k);
    if (!json_is_array(a))
        return pi2_jr_fail(c, PI2_EFORMAT, w, k, "expected an array, got %s", pi2_json_type_name(a));
    if (json_array_size(a) != PI2_HW_NLEN)
        return pi2_jr_fail(c, PI2_EFORMAT, w, k, "%zu entries, expected %d (ns per row at n = %d and %d)",
                           json_array_size(a), PI2_HW_NLEN, PI2_HW_ROW_LENS[0], PI2_HW_ROW_LENS[1]);
    char path[176];
    for (size_t i = 0; i < PI2_HW_NLEN; i++) {
        snprintf(path, sizeof path, "%s%s%s[%zu]", w, *w ? "." : "", k, i);
        int rc = pi2_jr_real_val(c, json_array_get(a, i), path, NULL, 0, DBL_MAX, PI2_JR_LO_OPEN, &out[i]);
        if (rc)
            return rc;
    }
    return 0;
}

/* "YYYY-MM-DDTHH:MM:SSZ" */
static bool utc_stamp(const char *s)
{
    static const char pat[] = "dddd-dd-ddTdd:dd:ddZ";
    size_t i = 0;
    for (; pat[i]; i++) {
        if (pat[i] == 'd' ? !(s[i] >= '0' && s[i] <= '9') : s[i] != pat[i])
            return false;
    }
    return s[i] == 0;
}

static int parse_compute(pi2_jr *c, json_t *arr, int i, pi2_hw_compute *x)
{
    static const char *const keys[] = { "threads",      "mem_bw",       "int8_peak",  "gemv_q8",    "gemv_q4",
                                        "matmul_q8",    "matmul_q4",    "sgemv",      "gather_q8_ns",
                                        "gather_q4_ns", "down_q8_ns",   "down_q4_ns", "overlap" };
    char w[32];
    snprintf(w, sizeof w, "compute[%d]", i);
    json_t *e;
    long long t;
    int rc;
    if ((rc = pi2_jr_elem_obj(c, arr, (size_t)i, w, &e)) || (rc = PI2_JR_KEYS(c, e, w, keys, true)) ||
        (rc = pi2_jr_int(c, e, w, "threads", 1, PI2_HW_MAX_THREADS, &t)))
        return rc;
    if (t != i + 1)
        return pi2_jr_fail(c, PI2_EFORMAT, w, "threads", "%lld, expected %d (entries are 1..threads in order)", t,
                           i + 1);
    if ((rc = get_num(c, e, w, "mem_bw", false, &x->mem_bw)) ||
        (rc = get_num(c, e, w, "int8_peak", false, &x->int8_peak)) ||
        (rc = get_num(c, e, w, "gemv_q8", false, &x->gemv_q8)) || (rc = get_num(c, e, w, "gemv_q4", false, &x->gemv_q4)) ||
        (rc = get_num(c, e, w, "matmul_q8", false, &x->matmul_q8)) ||
        (rc = get_num(c, e, w, "matmul_q4", false, &x->matmul_q4)) || (rc = get_num(c, e, w, "sgemv", false, &x->sgemv)) ||
        (rc = get_pair(c, e, w, "gather_q8_ns", x->gather_q8_ns)) ||
        (rc = get_pair(c, e, w, "gather_q4_ns", x->gather_q4_ns)) ||
        (rc = get_pair(c, e, w, "down_q8_ns", x->down_q8_ns)) || (rc = get_pair(c, e, w, "down_q4_ns", x->down_q4_ns)) ||
        (rc = get_num(c, e, w, "overlap", true, &x->overlap)))
        return rc;
    return 0;
}

static int parse_storage(pi2_jr *c, json_t *root, pi2_hwprof *p)
{
    static const char *const keys[] = { "random", "seq_bps" };
    static const char *const rkeys[] = { "size", "depth", "iops", "bytes_per_s", "lat_us" };
    json_t *st;
    int rc;
    if ((rc = pi2_jr_obj(c, root, "", "storage", false, &st)) || (rc = PI2_JR_KEYS(c, st, "storage", keys, true)))
        return rc;
    json_t *a = json_object_get(st, "random");
    if (!json_is_array(a))
        return pi2_jr_fail(c, PI2_EFORMAT, "storage", "random", "expected an array, got %s", pi2_json_type_name(a));
    if (json_array_size(a) != PI2_HW_NSIZES * PI2_HW_NDEPTHS)
        return pi2_jr_fail(c, PI2_EFORMAT, "storage", "random", "%zu entries, expected %d (%d sizes x %d depths)",
                           json_array_size(a), PI2_HW_NSIZES * PI2_HW_NDEPTHS, PI2_HW_NSIZES, PI2_HW_NDEPTHS);
    for (int i = 0; i < PI2_HW_NSIZES * PI2_HW_NDEPTHS; i++) {
        int s = i / PI2_HW_NDEPTHS, d = i % PI2_HW_NDEPTHS;
        char w[48];
        snprintf(w, sizeof w, "storage.random[%d]", i);
        json_t *e;
        long long size, depth;
        if ((rc = pi2_jr_elem_obj(c, a, (size_t)i, w, &e)) || (rc = PI2_JR_KEYS(c, e, w, rkeys, true)) ||
            (rc = pi2_jr_int(c, e, w, "size", 1, INT32_MAX, &size)) ||
            (rc = pi2_jr_int(c, e, w, "depth", 1, INT32_MAX, &depth)))
            return rc;
        if (size != PI2_HW_IO_SIZES[s])
            return pi2_jr_fail(c, PI2_EFORMAT, w, "size", "%lld, expected %u (the grid is size-major)", size,
                               PI2_HW_IO_SIZES[s]);
        if (depth != PI2_HW_IO_DEPTHS[d])
            return pi2_jr_fail(c, PI2_EFORMAT, w, "depth", "%lld, expected %d (the grid is size-major)", depth,
                               PI2_HW_IO_DEPTHS[d]);
        pi2_hw_io *x = &p->io[s][d];
        if ((rc = get_num(c, e, w, "iops", false, &x->iops)) ||
            (rc = get_num(c, e, w, "bytes_per_s", false, &x->bytes_per_s)) ||
            (rc = get_num(c, e, w, "lat_us", false, &x->lat_us)))
            return rc;
    }
    return get_num(c, st, "storage", "seq_bps", false, &p->seq_bps);
}

static int parse_root(pi2_jr *c, json_t *root, pi2_hwprof *p)
{
    static const char *const keys[] = { "version",    "cpu",         "isa",     "threads", "device",  "dev",
                                        "io_backend", "measured_at", "seconds", "compute", "storage" };
    if (!json_is_object(root))
        return pi2_jr_fail(c, PI2_EFORMAT, "", NULL, "expected an object, got %s", pi2_json_type_name(root));
    long long v;
    int rc;
    if ((rc = PI2_JR_KEYS(c, root, "", keys, true)) ||
        (rc = pi2_jr_int(c, root, "", "version", INT64_MIN, INT64_MAX, &v)))
        return rc;
    if (v != PI2_HW_VERSION)
        return pi2_jr_fail(c, PI2_EFORMAT, "", "version", "%lld is not supported (this build reads %d)", v,
                           PI2_HW_VERSION);
    if ((rc = pi2_jr_text(c, root, "", "cpu", p->cpu, sizeof p->cpu)) ||
        (rc = pi2_jr_text(c, root, "", "isa", p->isa, sizeof p->isa)) ||
        (rc = pi2_jr_i32(c, root, "", "threads", 1, PI2_HW_MAX_THREADS, &p->threads)) ||
        (rc = pi2_jr_text(c, root, "", "device", p->device, sizeof p->device)) ||
        (rc = pi2_jr_u64(c, root, "", "dev", INT64_MAX, &p->dev)) ||
        (rc = pi2_jr_text(c, root, "", "io_backend", p->io_backend, sizeof p->io_backend)) ||
        (rc = pi2_jr_text(c, root, "", "measured_at", p->measured_at, sizeof p->measured_at)))
        return rc;
    if (!utc_stamp(p->measured_at)) {
        char b[40];
        return pi2_jr_fail(c, PI2_EFORMAT, "", "measured_at", "\"%s\" is not a UTC time like 2025-01-31T12:00:00Z",
                           pi2_jr_clean(p->measured_at, b, sizeof b));
    }
    if ((rc = get_num(c, root, "", "seconds", false, &p->seconds)))
        return rc;
    json_t *a = json_object_get(root, "compute");
    if (!json_is_array(a))
        return pi2_jr_fail(c, PI2_EFORMAT, "", "compute", "expected an array, got %s", pi2_json_type_name(a));
    if (json_array_size(a) != (size_t)p->threads)
        return pi2_jr_fail(c, PI2_EFORMAT, "", "compute", "%zu entries, expected one per thread count 1..%d",
                           json_array_size(a), p->threads);
    for (int i = 0; i < p->threads; i++)
        if ((rc = parse_compute(c, a, i, &p->compute[i])))
            return rc;
    return parse_storage(c, root, p);
}

static int parse_text(const char *text, size_t len, const char *name, pi2_hwprof *out, pi2_err *err)
{
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        char b[100];
        return pi2_err_set(err, PI2_EFORMAT, "%.240s: not valid JSON at line %d column %d: %s", name, je.line,
                           je.column, pi2_jr_clean(je.text, b, sizeof b));
    }
    pi2_hwprof *p = calloc(1, sizeof *p);
    pi2_jr c = { name, err };
    int rc = p ? parse_root(&c, root, p) : pi2_err_set(err, PI2_ENOMEM, "%.240s: out of memory", name);
    json_decref(root);
    if (rc == 0)
        *out = *p;
    free(p);
    return rc;
}

int pi2_hwprof_load(const char *path, pi2_hwprof *out, pi2_err *err)
{
    char *text = NULL;
    size_t len = 0;
    int rc = pi2_read_file(path, HW_MAX_JSON, &text, &len, err);
    if (rc)
        return rc;
    rc = parse_text(text, len, path, out, err);
    free(text);
    return rc;
}

/* ---------------- JSON writer ---------------- */


/* A record that may go on one line: no objects inside, arrays of scalars
 * only (and then it must fit in 120 columns). */
static bool one_line(json_t *v)
{
    if (!json_is_object(v) && !json_is_array(v))
        return true;
    const char *k;
    size_t i;
    json_t *x, *y;
    if (json_is_object(v)) {
        json_object_foreach(v, k, x) {
            if (json_is_object(x))
                return false;
            if (json_is_array(x))
                json_array_foreach(x, i, y) if (json_is_object(y) || json_is_array(y)) return false;
        }
        return true;
    }
    json_array_foreach(v, i, x) if (json_is_object(x) || json_is_array(x)) return false;
    return true;
}

#define HW_DUMP_FLAGS (JSON_ENCODE_ANY | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17))

static void emit(pi2_sbuf *b, json_t *v, int depth)
{
    if (one_line(v)) {
        char *s = json_dumps(v, HW_DUMP_FLAGS);
        if (!s) {
            b->failed = true;
            return;
        }
        bool fits = strlen(s) + 2 * (size_t)depth <= 120 || !(json_is_object(v) || json_is_array(v));
        if (fits)
            pi2_sb_str(b, s);
        free(s);
        if (fits)
            return;
    }
    bool obj = json_is_object(v);
    pi2_sb_str(b, obj ? "{\n" : "[\n");
    size_t n = obj ? json_object_size(v) : json_array_size(v), i = 0;
    if (obj) {
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) {
            pi2_sb_indent(b, depth + 1);
            pi2_sb_str(b, "\"");
            pi2_sb_str(b, k); /* our own key names: nothing to escape */
            pi2_sb_str(b, "\": ");
            emit(b, x, depth + 1);
            pi2_sb_str(b, ++i < n ? ",\n" : "\n");
        }
    } else {
        json_t *x;
        size_t j;
        json_array_foreach(v, j, x) {
            pi2_sb_indent(b, depth + 1);
            emit(b, x, depth + 1);
            pi2_sb_str(b, j + 1 < n ? ",\n" : "\n");
        }
    }
    pi2_sb_indent(b, depth);
    pi2_sb_str(b, obj ? "}" : "]");
}

/* Set o[k] = v, remembering a failure (v NULL: out of memory, bad UTF-8). */
static void jset(json_t *o, const char *k, json_t *v, bool *ok)
{
    if (json_object_set_new(o, k, v) != 0)
        *ok = false;
}

static json_t *jpair(const double x[PI2_HW_NLEN], bool *ok)
{
    json_t *a = json_array();
    for (int i = 0; a && i < PI2_HW_NLEN; i++)
        if (json_array_append_new(a, pi2_json_num(x[i])) != 0)
            *ok = false;
    if (!a)
        *ok = false;
    return a;
}

static json_t *build(const pi2_hwprof *p, bool *ok)
{
    json_t *root = json_object();
    if (!root) {
        *ok = false;
        return NULL;
    }
    jset(root, "version", json_integer(PI2_HW_VERSION), ok);
    jset(root, "cpu", json_string(p->cpu), ok);
    jset(root, "isa", json_string(p->isa), ok);
    jset(root, "threads", json_integer(p->threads), ok);
    jset(root, "device", json_string(p->device), ok);
    jset(root, "dev", json_integer((json_int_t)p->dev), ok);
    jset(root, "io_backend", json_string(p->io_backend), ok);
    jset(root, "measured_at", json_string(p->measured_at), ok);
    jset(root, "seconds", pi2_json_num(p->seconds), ok);
    json_t *ca = json_array();
    int nt = p->threads < 0 ? 0 : p->threads > PI2_HW_MAX_THREADS ? PI2_HW_MAX_THREADS : p->threads;
    for (int t = 0; ca && t < nt; t++) {
        const pi2_hw_compute *c = &p->compute[t];
        json_t *e = json_object();
        if (!e) {
            *ok = false;
            break;
        }
        jset(e, "threads", json_integer(t + 1), ok);
        jset(e, "mem_bw", pi2_json_num(c->mem_bw), ok);
        jset(e, "int8_peak", pi2_json_num(c->int8_peak), ok);
        jset(e, "gemv_q8", pi2_json_num(c->gemv_q8), ok);
        jset(e, "gemv_q4", pi2_json_num(c->gemv_q4), ok);
        jset(e, "matmul_q8", pi2_json_num(c->matmul_q8), ok);
        jset(e, "matmul_q4", pi2_json_num(c->matmul_q4), ok);
        jset(e, "sgemv", pi2_json_num(c->sgemv), ok);
        jset(e, "gather_q8_ns", jpair(c->gather_q8_ns, ok), ok);
        jset(e, "gather_q4_ns", jpair(c->gather_q4_ns, ok), ok);
        jset(e, "down_q8_ns", jpair(c->down_q8_ns, ok), ok);
        jset(e, "down_q4_ns", jpair(c->down_q4_ns, ok), ok);
        jset(e, "overlap", pi2_json_num(c->overlap), ok);
        if (json_array_append_new(ca, e) != 0)
            *ok = false;
    }
    jset(root, "compute", ca, ok);
    json_t *st = json_object(), *ra = json_array();
    for (int s = 0; ra && s < PI2_HW_NSIZES; s++)
        for (int d = 0; d < PI2_HW_NDEPTHS; d++) {
            json_t *e = json_object();
            if (!e) {
                *ok = false;
                break;
            }
            jset(e, "size", json_integer(PI2_HW_IO_SIZES[s]), ok);
            jset(e, "depth", json_integer(PI2_HW_IO_DEPTHS[d]), ok);
            jset(e, "iops", pi2_json_num(p->io[s][d].iops), ok);
            jset(e, "bytes_per_s", pi2_json_num(p->io[s][d].bytes_per_s), ok);
            jset(e, "lat_us", pi2_json_num(p->io[s][d].lat_us), ok);
            if (json_array_append_new(ra, e) != 0)
                *ok = false;
        }
    if (st) {
        jset(st, "random", ra, ok);
        jset(st, "seq_bps", pi2_json_num(p->seq_bps), ok);
    } else {
        json_decref(ra);
    }
    jset(root, "storage", st, ok);
    return root;
}

/* mkdir -p of the directory part of path. */
static int make_parents(const char *path, pi2_err *err)
{
    char dir[4096];
    if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir)
        return pi2_err_set(err, PI2_ERANGE, "%.400s...: path too long", path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir)
        return 0;
    *slash = 0;
    for (char *q = dir + 1;; q++) {
        bool end = *q == 0;
        if (*q == '/' || end) {
            *q = 0;
            if (mkdir(dir, 0755) != 0 && errno != EEXIST)
                return pi2_err_set(err, PI2_EIO, "%.400s: cannot create the directory: %s", dir, strerror(errno));
            if (end)
                break;
            *q = '/';
        }
    }
    return 0;
}

int pi2_hwprof_save(const pi2_hwprof *p, const char *path, pi2_err *err)
{
    if (p->dev > (uint64_t)INT64_MAX)
        return pi2_err_set(err, PI2_ERANGE, "%.400s: dev: %llu does not fit a JSON integer", path,
                           (unsigned long long)p->dev);
    bool ok = true;
    json_t *root = build(p, &ok);
    pi2_sbuf sb = { 0 };
    if (ok) {
        emit(&sb, root, 0);
        pi2_sb_str(&sb, "\n");
    }
    json_decref(root);
    if (!ok || sb.failed) {
        free(sb.p);
        return pi2_err_set(err, PI2_ENOMEM, "%.400s: cannot encode the profile (out of memory, or a string that is "
                                            "not UTF-8)", path);
    }
    /* the reader's checks, on exactly the bytes to be written */
    pi2_hwprof *chk = malloc(sizeof *chk);
    int rc = chk ? parse_text(sb.p, sb.len, path, chk, err) : pi2_err_set(err, PI2_ENOMEM, "%.400s: out of memory", path);
    free(chk);
    pi2_afile *f = NULL;
    if (rc == 0 && (rc = make_parents(path, err)) == 0 && (rc = pi2_afile_open(&f, path, err)) == 0) {
        if ((rc = pi2_afile_write(f, sb.p, sb.len, err)) == 0)
            rc = pi2_afile_commit(f, err);
        else
            pi2_afile_abort(f);
    }
    free(sb.p);
    return rc;
}

/* ---------------- cache ---------------- */

int pi2_hwprof_default_path(const char *device_dir, char *buf, size_t n, pi2_err *err)
{
    const char *dir = device_dir ? device_dir : ".";
    struct stat st;
    if (stat(dir, &st) != 0)
        return pi2_err_set(err, PI2_EIO, "%.400s: cannot stat the device directory: %s", dir, strerror(errno));
    unsigned long long dev = (unsigned long long)st.st_dev;
    const char *env = getenv("PI2_HW_PROFILE"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int k;
    if (env && *env) {
        k = snprintf(buf, n, "%s", env);
    } else if (xdg && xdg[0] == '/') { /* relative values are ignored, as the XDG spec says */
        k = snprintf(buf, n, "%s/pi2/hw-%llx.json", xdg, dev);
    } else {
        struct passwd pw, *pp = NULL;
        char pwbuf[4096];
        if ((!home || !*home) && getpwuid_r(getuid(), &pw, pwbuf, sizeof pwbuf, &pp) == 0 && pp)
            home = pp->pw_dir;
        if (!home || !*home)
            return pi2_err_set(err, PI2_ENOTFOUND,
                               "no cache directory for the hardware profile: set HOME, XDG_CACHE_HOME or PI2_HW_PROFILE");
        k = snprintf(buf, n, "%s/.cache/pi2/hw-%llx.json", home, dev);
    }
    if (k < 0 || (size_t)k >= n)
        return pi2_err_set(err, PI2_ERANGE, "hardware profile path for %.400s does not fit in %zu bytes", dir, n);
    return 0;
}

/* Why p does not describe this machine for o (into why), or NULL. */
static const char *mismatch(const pi2_hwprof *p, const pi2_hwprof_opts *o, char *why, size_t cap)
{
    pi2_hwprof_opts def = { 0 };
    if (!o)
        o = &def;
    int t = pi2_hw_resolve_threads(o->threads);
    char cpu[sizeof p->cpu];
    pi2_hwprof_cpu_name(cpu, sizeof cpu);
    const char *dir = o->device_dir ? o->device_dir : ".";
    struct stat st;
    if (strcmp(cpu, p->cpu) != 0)
        snprintf(why, cap, "measured on cpu \"%.100s\", this is \"%.100s\"", p->cpu, cpu);
    else if (strcmp(pi2_hw_isa_now(), p->isa) != 0)
        snprintf(why, cap, "measured with isa %s, this run uses %s", p->isa, pi2_hw_isa_now());
    else if (t > p->threads)
        snprintf(why, cap, "measured up to %d threads, this run uses %d", p->threads, t);
    else if (stat(dir, &st) != 0 || (uint64_t)st.st_dev != p->dev)
        snprintf(why, cap, "measured on another device than the one holding %.200s", dir);
    else
        return NULL;
    return why;
}

bool pi2_hwprof_matches(const pi2_hwprof *p, const pi2_hwprof_opts *o)
{
    char why[320];
    return p && !mismatch(p, o, why, sizeof why);
}

int pi2_hwprof_get(const pi2_hwprof_opts *o, const char *path, bool measure, pi2_hwprof *out, bool *measured,
                   pi2_err *err)
{
    pi2_hwprof_opts def = { 0 };
    if (!o)
        o = &def;
    if (measured)
        *measured = false;
    char dpath[4096], why[320];
    int rc;
    if (!path) {
        if ((rc = pi2_hwprof_default_path(o->device_dir, dpath, sizeof dpath, err)))
            return rc;
        path = dpath;
    }
    pi2_hwprof *p = malloc(sizeof *p);
    if (!p)
        return pi2_err_set(err, PI2_ENOMEM, "%.400s: out of memory", path);
    pi2_err le = { 0 };
    rc = pi2_hwprof_load(path, p, &le);
    const char *bad = rc == 0 ? mismatch(p, o, why, sizeof why) : NULL;
    if (rc == 0 && !bad) {
        *out = *p;
        free(p);
        return 0;
    }
    if (!measure) {
        free(p);
        if (rc == PI2_ENOTFOUND)
            return pi2_err_set(err, PI2_ENOTFOUND, "no hardware profile at %.400s", path);
        if (rc)
            return pi2_err_set(err, rc, "%s", le.msg);
        return pi2_err_set(err, PI2_ENOTFOUND, "%.400s: the hardware profile does not describe this setup (%s)", path,
                           bad);
    }
    if (rc && rc != PI2_ENOTFOUND)
        pi2_hw_logf(o->log, "%s; measuring again", le.msg);
    else if (bad)
        pi2_hw_logf(o->log, "%s: %s; measuring again", path, bad);
    if ((rc = pi2_hwprof_measure(o, p, err)) == 0 && (rc = pi2_hwprof_save(p, path, err)) == 0) {
        *out = *p;
        if (measured)
            *measured = true;
    }
    free(p);
    return rc;
}

/* ---------------- cost-model helpers ---------------- */

/* Grid size s at grid depth d, throughput the best of the depths up to d:
 * a deeper queue can do what a shallower one does (the reader need not fill
 * it), so a dip measured at a deeper depth is the probe's noise, and taken
 * as it is it would steer the planner to the shallower depth (runtime/PERF.md,
 * "Hardware profile"). */
static pi2_hw_io io_env(const pi2_hwprof *p, int s, int d)
{
    pi2_hw_io r = p->io[s][d];
    for (int i = 0; i < d; i++) {
        r.iops = p->io[s][i].iops > r.iops ? p->io[s][i].iops : r.iops;
        r.bytes_per_s = p->io[s][i].bytes_per_s > r.bytes_per_s ? p->io[s][i].bytes_per_s : r.bytes_per_s;
    }
    return r;
}

pi2_hw_io pi2_hwprof_io_at(const pi2_hwprof *p, uint32_t size, int depth)
{
    int d = 0;
    for (int i = 0; i < PI2_HW_NDEPTHS; i++)
        if (PI2_HW_IO_DEPTHS[i] <= depth)
            d = i;
    if (size <= PI2_HW_IO_SIZES[0])
        return io_env(p, 0, d);
    if (size >= PI2_HW_IO_SIZES[PI2_HW_NSIZES - 1])
        return io_env(p, PI2_HW_NSIZES - 1, d);
    int s = 0;
    while (PI2_HW_IO_SIZES[s + 1] <= size)
        s++;
    if (PI2_HW_IO_SIZES[s] == size)
        return io_env(p, s, d);
    double f = log((double)size / PI2_HW_IO_SIZES[s]) / log((double)PI2_HW_IO_SIZES[s + 1] / PI2_HW_IO_SIZES[s]);
    pi2_hw_io a = io_env(p, s, d), b = io_env(p, s + 1, d);
    return (pi2_hw_io){ a.iops + f * (b.iops - a.iops), a.bytes_per_s + f * (b.bytes_per_s - a.bytes_per_s),
                        a.lat_us + f * (b.lat_us - a.lat_us) };
}

const pi2_hw_compute *pi2_hwprof_compute(const pi2_hwprof *p, int t)
{
    int n = p->threads < 1 ? 1 : p->threads > PI2_HW_MAX_THREADS ? PI2_HW_MAX_THREADS : p->threads;
    t = t < 1 ? 1 : t > n ? n : t;
    return &p->compute[t - 1];
}

double pi2_hwprof_row_ns(const double ns[PI2_HW_NLEN], int64_t n)
{
    double n0 = PI2_HW_ROW_LENS[0], n1 = PI2_HW_ROW_LENS[1];
    double v = ns[0] + (ns[1] - ns[0]) / (n1 - n0) * ((double)n - n0);
    return v > 0 ? v : 0;
}
