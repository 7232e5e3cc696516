/* Flash offloading (runtime/offload/offload.h): generated models of every
 * FFN kind (dReLU two-phase and one-phase, ReGLU q8 and SwiGLU one-phase, MoE) run with a
 * generous and a tiny memory limit must give bit-identical logits and the
 * same tokens, bit-identical to the all-in-memory engine too (--dense
 * decode: close); faults (EIO, short reads,
 * io_uring unavailable, a file truncated or replaced under the reader, a
 * memory limit below the resident part, a corrupt payload) give clear errors
 * or the documented fallback; tinystories golden ids through the offloaded
 * path. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "bundle/bundle.h"
#include "convert/convert.h"
#include "convert/synth.h"
#include "runtime/engine.h"
#include "runtime/offload/io.h"
#include "runtime/planner.h"
#include "runtime/sample.h"
#include "formats/pool.h"
#include "tests/testhw.h"
#include "tests/testjson.h"
#include "tests/testmodel.h"
#include "tests/testutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

/* K_PRED_Q8: dReLU with large q8 predictors (rank > hidden/4) and q4
 * attention, embeddings and head: the kind whose predictors stream */
typedef enum kind { K_DRELU, K_RELU_Q8, K_SILU, K_MOE, K_PRED_Q8, K_COUNT } kind;
static const char *const kind_name[K_COUNT] = {"drelu", "relu-q8", "silu", "moe", "pred-q8"};

static char g_dir[64];
static char g_pi2[K_COUNT][128];
static pi2_sign_key *g_key, *g_pubkey;

enum { STEPS = 24, PROMPT = 10, CTX = 64 };

static int make_model(kind k, pi2_err *e)
{
    char src[160];
    snprintf(src, sizeof src, "%s/%s", g_dir, kind_name[k]);
    pi2_synth_opts so;
    if (pi2_synth_preset("small", &so, e))
        return -1;
    so.threads = 2;
    so.desc.n_layers = k == K_PRED_Q8 ? 5 : 3; /* a ring of two slots over five layers */
    so.predictors = k != K_SILU;
    if (k == K_SILU || k == K_RELU_Q8) {
        so.desc.arch = PI2_ARCH_LLAMA;
        so.desc.act = k == K_SILU ? PI2_ACT_SILU : PI2_ACT_RELU;
    }
    if (k == K_MOE) {
        so.desc.arch = PI2_ARCH_TURBOSPARSE_MIXTRAL;
        so.desc.n_experts = 4;
        so.desc.n_experts_used = 2;
        so.desc.n_ff = 512;
    }
    if (k == K_PRED_Q8)
        so.plant_rank = so.desc.hidden / 8; /* predictor rank 2r + 1 > hidden / 4 */
    if (pi2_synth_write(src, &so, NULL, NULL, e))
        return -1;
    /* small I/O units: many reads per token on these small shapes; dReLU
     * and MoE two-phase, the dReLU kind with q8 predictors at the default
     * layout (one-phase) */
    char out[1200];
    bool q8p = k == K_PRED_Q8;
    bool two = k == K_DRELU || k == K_MOE;
    return pi2t_convert_bundle_lay(src, g_dir, kind_name[k], k == K_RELU_Q8 ? PI2_QT_Q8 : PI2_QT_Q4,
                                   q8p ? PI2_QT_Q4 : PI2_QT_Q8, q8p ? PI2_QT_Q8 : PI2_QT_F32, false, 4096, two, g_key,
                                   out, sizeof out, e)
               ? -1
               : 0;
}

static int group_setup(void **state)
{
    (void)state;
    pi2_err e = {0};
    pi2t_tmpdir(g_dir, sizeof g_dir);
    if (pi2t_keypair(g_dir, "k", &g_key, &g_pubkey, &e))
        return fprintf(stderr, "keys: %s\n", e.msg), -1;
    double t0 = pi2_now();
    for (int k = 0; k < K_COUNT; k++) {
        snprintf(g_pi2[k], sizeof g_pi2[k], "%s/%s.pi2", g_dir, kind_name[k]);
        if (make_model((kind)k, &e))
            return fprintf(stderr, "%s: %s\n", kind_name[k], e.msg), -1;
    }
    fprintf(stderr, "  [fixtures in %.1f s]\n", pi2_now() - t0);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    pi2_io_inject(PI2_IO_FAULT_NONE, 0, 0, 0);
    pi2_sign_key_free(g_key);
    pi2_sign_key_free(g_pubkey);
    pi2t_rmtree(g_dir);
    return 0;
}

static int clear_faults(void **state)
{
    (void)state;
    pi2_io_inject(PI2_IO_FAULT_NONE, 0, 0, 0);
    return 0;
}

/* The options every open here shares: path, the test key, g_threads, CTX
 * and mem_limit (0: all in memory). */
static int g_threads = 2; /* compute threads */
static pi2_engine_opts base_opts(const char *path, uint64_t limit)
{
    pi2_engine_opts o;
    pi2_engine_defaults(&o);
    o.path = path;
    o.pubkey = g_pubkey;
    o.threads = g_threads;
    o.ctx = CTX;
    o.offload.mem_limit = limit;
    return o;
}

/* Open path with mem_limit (0: all in memory); NULL with *rc and err on
 * failure. */
static bool g_gate_first; /* open with gate_first */
static bool g_kv_f16;     /* open with an fp16 KV cache */

static pi2_engine *try_open(const char *path, uint64_t limit, double hot_share, bool dense, int *rc, pi2_err *err)
{
    pi2_engine_opts o = base_opts(path, limit);
    o.offload.gate_first = g_gate_first;
    o.kv_f16 = g_kv_f16;
    o.dense = dense;
    o.offload.hot_share = hot_share;
    pi2_engine *eng = NULL;
    *rc = pi2_engine_open(&eng, &o, err);
    return eng;
}

static pi2_engine *open_at(const char *path, uint64_t limit, double hot_share, bool dense)
{
    pi2_err e = {0};
    int rc;
    pi2_engine *eng = try_open(path, limit, hot_share, dense, &rc, &e);
    if (rc)
        fail_msg("open %s (limit %llu): %s", path, (unsigned long long)limit, e.msg);
    return eng;
}

/* The nice value of this process's thread named `name` (INT_MIN: none). */
static int thread_nice(const char *name)
{
    int nice = INT_MIN;
    DIR *d = opendir("/proc/self/task");
    assert_non_null(d);
    for (struct dirent *de; nice == INT_MIN && (de = readdir(d)) != NULL;) {
        if (de->d_name[0] == '.')
            continue;
        char p[300], buf[1024] = "";
        snprintf(p, sizeof p, "/proc/self/task/%s/comm", de->d_name);
        FILE *f = fopen(p, "r");
        if (!f)
            continue;
        bool match = fgets(buf, sizeof buf, f) && strncmp(buf, name, strlen(name)) == 0 && buf[strlen(name)] == '\n';
        fclose(f);
        snprintf(p, sizeof p, "/proc/self/task/%s/stat", de->d_name);
        if (!match || !(f = fopen(p, "r")))
            continue;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        char *t = strrchr(buf, ')'); /* then: state ppid ... priority nice (fields 3..19) */
        assert_non_null(t);
        t += 2;
        for (int k = 0; k < 16; k++) {
            t = strchr(t, ' ');
            assert_non_null(t);
            t++;
        }
        nice = atoi(t);
    }
    closedir(d);
    return nice;
}

/* How many nice levels a thread of this process may gain, found in a
 * thread of its own (the change ends with it). */
static void *try_raise(void *arg)
{
    *(int *)arg = pi2_thread_raise_priority(PI2_IO_THREAD_NICE);
    return NULL;
}

/* The I/O thread runs above the compute threads by as many nice levels as
 * the process may raise a thread (none without the privilege). */
static void check_io_priority(const pi2_engine_offload_info *in)
{
    int may = 0;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, try_raise, &may), 0);
    pthread_join(th, NULL);
    assert_int_equal(in->io_nice, may);
    assert_int_equal(thread_nice("pi2-io"), getpriority(PRIO_PROCESS, 0) - may);
}

/* The smallest limit a model opens with (from a generous open). */
/* The least limit of path with the predictors and the attention streamed
 * as pred_stream and attn_stream say (0: where they can, as by default;
 * -1: never). */
static uint64_t least_with(const char *path, int pred_stream, int attn_stream)
{
    pi2_engine_opts o = base_opts(path, 1ull << 40);
    o.offload.hot_share = 0.5;
    o.offload.pred_stream = pred_stream;
    o.offload.attn_stream = attn_stream;
    pi2_engine *eng = NULL;
    pi2_err e = {0};
    if (pi2_engine_open(&eng, &o, &e))
        fail_msg("open %s: %s", path, e.msg);
    pi2_engine_offload_info in;
    pi2_engine_offload_info_get(eng, &in);
    assert_true(in.on && in.attn_stream == 0 && !in.pred_stream); /* everything fits: nothing streams */
    pi2_engine_close(eng);
    return in.minimum;
}

static uint64_t minimum_of(const char *path)
{
    pi2_engine *eng = open_at(path, 1ull << 40, 0.5, false);
    pi2_engine_offload_info in;
    pi2_engine_offload_info_get(eng, &in);
    assert_true(in.on);
    assert_true(in.minimum > 0 && in.minimum <= in.planned);
    assert_true(in.offloaded == 0.0); /* everything fits: all hot */
    pi2_engine_close(eng);
    return in.minimum;
}

/* Greedy run: prompt of PROMPT ids (BOS then a fixed pattern), then STEPS
 * decode steps; logits of every step into lg [STEPS+1][V], ids into ids. */
static int run_greedy(pi2_engine *eng, float *lg, int32_t *ids, pi2_err *e)
{
    const pi2_model_desc *d = pi2_engine_desc(eng);
    int V = d->vocab;
    int32_t p[PROMPT];
    p[0] = 1;
    for (int i = 1; i < PROMPT; i++)
        p[i] = 3 + (int32_t)((i * 7919) % (V - 3));
    int rc = pi2_engine_prefill(eng, p, PROMPT, 0, lg, e);
    if (rc)
        return rc;
    for (int s = 0; s < STEPS; s++) {
        ids[s] = pi2_argmax(lg + (size_t)s * V, V);
        if ((rc = pi2_engine_decode(eng, ids[s], PROMPT + s, lg + (size_t)(s + 1) * V, e)) != 0)
            return rc;
    }
    ids[STEPS] = pi2_argmax(lg + (size_t)STEPS * V, V);
    return 0;
}

static double rel_diff(const float *a, const float *b, size_t n)
{
    double m = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        m = fmax(m, fabs((double)a[i] - b[i]));
        r = fmax(r, fabs((double)b[i]));
    }
    return r > 0 ? m / r : m;
}

/* ---- generous vs tiny: bit-identical; vs in memory: bit-identical but --dense decode, close ---- */

static void same_tokens(kind k, bool dense)
{
    const char *path = g_pi2[k];
    uint64_t minimum = minimum_of(path);
    pi2_engine *mem = open_at(path, 0, 0.5, dense);
    int V = pi2_engine_desc(mem)->vocab;
    size_t n = (size_t)(STEPS + 1) * (size_t)V;
    float *lm = malloc(n * sizeof(float)), *lg = malloc(n * sizeof(float)), *lt = malloc(n * sizeof(float));
    int32_t im[STEPS + 1], ig[STEPS + 1], it[STEPS + 1];
    pi2_err e = {0};
    assert_int_equal(run_greedy(mem, lm, im, &e), 0);
    pi2_engine_close(mem);

    pi2_engine *gen = open_at(path, 1ull << 40, 0.5, dense);
    pi2_engine_stats_reset(gen);
    assert_int_equal(run_greedy(gen, lg, ig, &e), 0);
    pi2_engine_offload_info a;
    pi2_engine_offload_info_get(gen, &a);
    assert_int_equal(a.bytes_read, 0); /* everything hot: no reads after start */
    assert_true(a.parts > 0 && a.parts_hot == a.parts);
    pi2_engine_close(gen);

    /* tiny: no hot segment, the smallest cache plus a little */
    pi2_engine *tiny = open_at(path, minimum + 4096, 0.0, dense);
    pi2_engine_stats_reset(tiny);
    assert_int_equal(run_greedy(tiny, lt, it, &e), 0);
    pi2_engine_offload_info b;
    pi2_engine_offload_info_get(tiny, &b);
    assert_true(b.offloaded > 0.99);
    assert_true(b.bytes_read > 0 && b.parts_read > 0);
    assert_true(b.planned <= minimum + 4096);
    if (k == K_MOE && !dense) { /* the read-ahead guessed experts by the router */
        const pi2_model_desc *d = pi2_engine_desc(tiny);
        pi2_engine_stats st;
        pi2_engine_stats_get(tiny, &st);
        assert_int_equal(st.moe_choices, st.tokens * (uint64_t)d->n_layers * (uint64_t)d->n_experts_used);
        assert_int_equal(st.moe_guesses, st.moe_choices);
        assert_true(st.moe_guessed > 0 && st.moe_guessed <= st.moe_guesses);
        assert_true(st.moe_reused <= st.moe_choices);
        assert_true(b.parts_prefetched > 0);
        fprintf(stderr, "  moe: %.0f%% of expert choices guessed before attention, %.0f%% reused from the last token\n",
                100.0 * (double)st.moe_guessed / (double)st.moe_guesses,
                100.0 * (double)st.moe_reused / (double)st.moe_choices);
    }
    pi2_engine_close(tiny);

    double rel = rel_diff(lg, lm, n);
    int agree = 0;
    while (agree <= STEPS && ig[agree] == im[agree])
        agree++;
    fprintf(stderr,
            "  %s%s: tiny limit read %.2f MB in %llu reads (hit rate %.1f%%); generous = tiny bit for bit; vs in "
            "memory rel %.1e, %d/%d ids\n",
            kind_name[k], dense ? " dense" : "", b.bytes_read / 1e6, (unsigned long long)b.reads,
            100.0 * (double)(b.parts_hit + b.parts_hot) / (double)b.parts, rel, agree, STEPS + 1);
    assert_memory_equal(lg, lt, n * sizeof(float));
    assert_memory_equal(ig, it, sizeof ig);
    if (k == K_DRELU || k == K_MOE) { /* up+down read only once the gate fired: the same */
        g_gate_first = true;
        pi2_engine *gf = open_at(path, minimum + 4096, 0.0, dense);
        assert_int_equal(run_greedy(gf, lt, it, &e), 0);
        pi2_engine_close(gf);
        g_gate_first = false;
        assert_memory_equal(lg, lt, n * sizeof(float));
    }
    if (!dense) { /* one compute thread: the I/O thread has a core of its own and makes the
                   * read-ahead's guesses (runtime/offload/readahead.c); as in memory, bit for bit */
        float *l1 = malloc(n * sizeof(float));
        int32_t i1[STEPS + 1];
        g_threads = 1;
        pi2_engine *one = open_at(path, minimum + 4096, 0.0, false), *one_mem = open_at(path, 0, 0.5, false);
        g_threads = 2;
        pi2_engine_stats_reset(one);
        assert_int_equal(run_greedy(one, lt, it, &e), 0);
        assert_int_equal(run_greedy(one_mem, l1, i1, &e), 0);
        pi2_engine_offload_info_get(one, &b);
        pi2_engine_close(one);
        pi2_engine_close(one_mem);
        assert_memory_equal(l1, lt, n * sizeof(float));
        assert_true(k == K_SILU || b.parts_prefetched > 0);
        free(l1);
    }
    /* vs in memory: the prefill's logits bit for bit (its windows are
     * whole tiles, run by the same threads in the same order), and sparse
     * decode's too (the same chunks of 128 predicted neurons, kernels and
     * order of sums); --dense decode's sums go in another order (in
     * memory: aligned groups of 16 columns, zeros included) */
    assert_memory_equal(lg, lm, (size_t)V * sizeof(float));
    if (!dense)
        assert_memory_equal(lg, lm, n * sizeof(float));
    assert_true(rel < 2e-2);
    assert_true(agree >= 8);
    free(lm);
    free(lg);
    free(lt);
}

static void test_same_tokens(void **state)
{
    (void)state;
    for (int k = 0; k < K_COUNT; k++)
        same_tokens((kind)k, false);
}

static void test_same_tokens_dense(void **state)
{
    (void)state;
    same_tokens(K_DRELU, true);
    same_tokens(K_SILU, true);
}

/* The same converted dReLU model bundled one-phase (each neuron's gate, up
 * and down together): at the tiny limit, where gate-first is refused for
 * want of a gate part and every read is of whole neurons, its logits are
 * its in-memory logits bit for bit; against the two-phase bundle, close and
 * the same ids (the group size differs, so the neuron order and with it
 * the down projection's 32-neuron quantization blocks do too). */
static void test_layouts_agree(void **state)
{
    (void)state;
    char conv[160], one[160];
    snprintf(conv, sizeof conv, "%s/%s.pi2c", g_dir, kind_name[K_DRELU]);
    snprintf(one, sizeof one, "%s/drelu-one.pi2", g_dir);
    pi2_err e = {0};
    if (pi2t_bundle(conv, one, 4096, false, g_key, &e))
        fail_msg("%s", e.msg);
    pi2_engine *two = open_at(g_pi2[K_DRELU], 0, 0.5, false);
    int V = pi2_engine_desc(two)->vocab;
    size_t n = (size_t)(STEPS + 1) * (size_t)V;
    float *l[3] = {malloc(n * sizeof(float)), malloc(n * sizeof(float)), malloc(n * sizeof(float))};
    int32_t ids[3][STEPS + 1];
    assert_int_equal(run_greedy(two, l[2], ids[2], &e), 0);
    pi2_engine_close(two);
    uint64_t limits[2] = {0, minimum_of(one) + 4096};
    for (int k = 0; k < 2; k++) {
        g_gate_first = true;
        pi2_engine *eng = open_at(one, limits[k], 0.0, false);
        g_gate_first = false;
        pi2_engine_stats_reset(eng);
        assert_int_equal(run_greedy(eng, l[k], ids[k], &e), 0);
        pi2_engine_offload_info b;
        pi2_engine_offload_info_get(eng, &b);
        pi2_engine_close(eng);
        assert_false(b.gate_first);
        assert_true(k == 0 || (b.offloaded > 0.99 && b.parts_read > 0 && b.gate_hot == 0));
    }
    assert_memory_equal(l[1], l[0], n * sizeof(float));
    int agree = 0;
    while (agree <= STEPS && ids[0][agree] == ids[2][agree])
        agree++;
    double rel = rel_diff(l[0], l[2], n);
    fprintf(stderr, "  drelu one-phase: tiny limit = in memory bit for bit; vs two-phase rel %.1e, %d/%d ids\n", rel,
            agree, STEPS + 1);
    assert_true(rel < 2e-2);
    assert_true(agree >= 8);
    for (int k = 0; k < 3; k++)
        free(l[k]);
}

/* An fp16 KV cache: in memory and at the tiny limit the same bits (its
 * rows are rounded once, when stored, and read back exactly: every ISA's
 * conversion is checked in test_kernels); against the f32 cache close, not
 * equal (it is in use); the plan counts the cache at 2 bytes an element and
 * each thread's block of rows as f32. */
static void test_kv_f16(void **state)
{
    (void)state;
    const char *path = g_pi2[K_DRELU];
    pi2_engine *mem = open_at(path, 1ull << 40, 0.5, false);
    pi2_engine_offload_info i32, i16;
    pi2_engine_offload_info_get(mem, &i32);
    const pi2_model_desc dm = *pi2_engine_desc(mem);
    int V = dm.vocab, hd = dm.head_dim;
    size_t n = (size_t)(STEPS + 1) * (size_t)V;
    float *lm = malloc(n * sizeof(float)), *lt = malloc(n * sizeof(float)), *l32 = malloc(n * sizeof(float));
    int32_t im[STEPS + 1], it[STEPS + 1], ids32[STEPS + 1];
    pi2_err e = {0};
    assert_int_equal(run_greedy(mem, l32, ids32, &e), 0);
    pi2_engine_close(mem);
    g_kv_f16 = true;
    mem = open_at(path, 1ull << 40, 0.5, false);
    pi2_engine_offload_info_get(mem, &i16);
    assert_int_equal(run_greedy(mem, lm, im, &e), 0);
    pi2_engine_close(mem);
    pi2_engine *tiny = open_at(path, i16.minimum + 4096, 0.0, false);
    assert_int_equal(run_greedy(tiny, lt, it, &e), 0);
    pi2_engine_close(tiny);
    g_kv_f16 = false;
    assert_memory_equal(lm, lt, n * sizeof(float));
    assert_memory_equal(im, it, sizeof im);
    double rel = rel_diff(lm, l32, n);
    int agree = 0;
    while (agree <= STEPS && im[agree] == ids32[agree])
        agree++;
    fprintf(stderr, "  fp16 KV: the plan's KV cache, scores and rows %llu bytes (f32 %llu); vs f32 rel %.1e, %d/%d ids\n",
            (unsigned long long)i16.kv, (unsigned long long)i32.kv, rel, agree, STEPS + 1);
    /* the cache at 2 bytes an element (a quarter less with the scores and
     * the rows below), plus each of the 2 threads' unit's keys and values
     * as f32, per position */
    uint64_t cache32 = 2ull * (uint64_t)dm.n_layers * (uint64_t)dm.n_kv_heads * (uint64_t)hd * 4 * CTX,
             rows = 2ull * 2 * (uint64_t)hd * 4 * CTX;
    assert_int_equal(i32.kv - i16.kv, cache32 / 2 - rows);
    assert_int_equal(i16.buffers, i32.buffers);
    assert_true(rel > 0 && rel < 1e-2);
    assert_true(agree >= 8);
    free(lm);
    free(lt);
    free(l32);
}

static int clear_kv_f16(void **state)
{
    g_kv_f16 = false;
    return clear_faults(state);
}

/* Prefill windows whose tiles do not end on a slot: an FFN of 12288
 * neurons in groups of 56 (16 KiB unit) streams windows of 9472 neurons,
 * and the slot astride two windows is read by both. In memory, generous
 * and tiny: the same logits, bit for bit, prefill and sparse decode. */
static void test_windows_astride(void **state)
{
    (void)state;
    char src[160], path[1200];
    pi2_err e = {0};
    pi2_synth_opts so;
    assert_int_equal(pi2_synth_preset("small", &so, &e), 0);
    so.threads = 2;
    so.desc.n_layers = 2;
    so.desc.n_ff = 12288;
    so.predictors = true;
    snprintf(src, sizeof src, "%s/wide", g_dir);
    if (pi2_synth_write(src, &so, NULL, NULL, &e) ||
        pi2t_convert_bundle(src, g_dir, "wide", PI2_QT_Q4, 16384, g_key, path, sizeof path, &e))
        fail_msg("wide model: %s", e.msg);
    uint64_t minimum = minimum_of(path);
    pi2_engine *mem = open_at(path, 0, 0.5, false);
    int V = pi2_engine_desc(mem)->vocab;
    size_t n = (size_t)(STEPS + 1) * (size_t)V;
    float *lm = malloc(n * sizeof(float)), *lt = malloc(n * sizeof(float));
    int32_t im[STEPS + 1], it[STEPS + 1];
    assert_int_equal(run_greedy(mem, lm, im, &e), 0);
    pi2_engine_close(mem);
    for (int k = 0; k < 2; k++) {
        pi2_engine *eng = open_at(path, k ? minimum + 4096 : 1ull << 40, k ? 0.0 : 0.5, false);
        pi2_engine_stats_reset(eng);
        assert_int_equal(run_greedy(eng, lt, it, &e), 0);
        pi2_engine_offload_info in;
        pi2_engine_offload_info_get(eng, &in);
        assert_true(k ? in.offloaded > 0.99 : in.offloaded == 0.0);
        pi2_engine_close(eng);
        assert_memory_equal(lm, lt, n * sizeof(float));
        assert_memory_equal(im, it, sizeof im);
    }
    free(lm);
    free(lt);
}

/* Streamed predictors (q8, a ring of two layers of five; the attention
 * kept resident) pick what resident ones pick: the same logits bit for bit
 * at one limit, streamed or not, and at the least limit, which only
 * streaming reaches; each decode step reads every layer's predictors
 * once. */
static void test_streamed_predictors(void **state)
{
    (void)state;
    const char *path = g_pi2[K_PRED_Q8];
    uint64_t least = least_with(path, 0, -1);
    pi2_engine *mem = open_at(path, 0, 0.5, false);
    int V = pi2_engine_desc(mem)->vocab;
    size_t n = (size_t)(STEPS + 1) * (size_t)V;
    float *lm = malloc(n * sizeof(float)), *lr = malloc(n * sizeof(float)), *ls = malloc(n * sizeof(float));
    int32_t im[STEPS + 1], ir[STEPS + 1], is[STEPS + 1];
    pi2_err e = {0};
    assert_int_equal(run_greedy(mem, lm, im, &e), 0);
    pi2_engine_close(mem);
    uint64_t limits[2] = {least + (8u << 20), least + 4096};
    for (int li = 0; li < 2; li++) {
        for (int mode = -1; mode <= 1; mode += 2) {
            if (li == 1 && mode < 0)
                continue; /* the least limit holds them streamed only */
            pi2_engine_opts o = base_opts(path, limits[li]);
            o.offload.hot_share = 0.0;
            o.offload.pred_stream = mode;
            o.offload.attn_stream = -1;
            pi2_engine *eng = NULL;
            int rc = pi2_engine_open(&eng, &o, &e);
            if (rc)
                fail_msg("open at %llu, pred_stream %d: %s", (unsigned long long)limits[li], mode, e.msg);
            pi2_engine_stats_reset(eng);
            float *lg = mode < 0 ? lr : ls;
            assert_int_equal(run_greedy(eng, lg, mode < 0 ? ir : is, &e), 0);
            pi2_engine_offload_info in;
            pi2_engine_offload_info_get(eng, &in);
            assert_true(in.pred_stream == (mode > 0));
            assert_true(in.planned <= limits[li]);
            uint64_t per_token = pi2_engine_pred_bytes(eng); /* every layer's, page-rounded: at least */
            if (mode > 0)
                assert_true(in.pred_bytes_read >= (uint64_t)(STEPS - 1) * per_token &&
                            in.pred_bytes_read <= (uint64_t)(STEPS + 2) * (per_token + (64u << 10)));
            else
                assert_int_equal(in.pred_bytes_read, 0);
            pi2_engine_close(eng);
        }
        if (li == 0) {
            assert_memory_equal(lr, ls, n * sizeof(float));
            assert_memory_equal(ir, is, sizeof ir);
        }
        assert_memory_equal(lm, ls, n * sizeof(float)); /* sparse decode: as in memory, bit for bit */
        assert_memory_equal(im, is, sizeof im);
    }
    /* kept resident, the least limit cannot run: refused at open */
    {
        pi2_engine_opts o = base_opts(path, least + 4096);
        o.offload.pred_stream = -1;
        o.offload.attn_stream = -1;
        pi2_engine *eng = NULL;
        pi2_err er = {0};
        assert_int_equal(pi2_engine_open(&eng, &o, &er), PI2_ENOMEM);
        assert_null(eng);
        assert_non_null(strstr(er.msg, "cannot hold the resident part"));
        assert_non_null(strstr(er.msg, "predictors "));
    }
    /* where the limit holds them, they stay resident by default */
    pi2_engine *gen = open_at(path, 1ull << 40, 0.5, false);
    pi2_engine_offload_info in;
    pi2_engine_offload_info_get(gen, &in);
    assert_false(in.pred_stream);
    pi2_engine_close(gen);
    fprintf(stderr, "  pred-q8: least limit %.1f MB with the predictors streamed; same ids and logits as resident\n",
            (double)least / 1048576.0);
    free(lm);
    free(lr);
    free(ls);
}

/* Bytes a pass reads through the ring of path when it streams the
 * predictors (pred) and the attention of the last attn layers: every
 * streamed member, page-rounded (the planner's count). */
static uint64_t ring_pass_bytes(const char *path, bool pred, int attn)
{
    pi2_bundle *b = NULL;
    pi2_bundle_open_opts bo = {.pubkey = g_pubkey};
    pi2_err e = {0};
    uint64_t skipped = 0, slot = 0;
    assert_int_equal(pi2_bundle_open(&b, path, &bo, &e), 0);
    assert_true(pi2_plan_stream_sizes(pi2_bundle_manifest(b), pi2_bundle_layout_get(b), pred, attn, &skipped, &slot));
    pi2_bundle_close(b);
    return skipped;
}

/* Streamed attention (the last N of five layers, with the predictors
 * streamed in the same slots or resident) computes what resident
 * attention does: prefill and sparse decode bit for bit as in memory,
 * dense decode as the offloaded run that keeps it; each pass reads every
 * streamed layer once (prefill: the attention alone). The least limit
 * streams it all; the attention kept resident, that limit is refused. */
static void test_streamed_attention(void **state)
{
    (void)state;
    const char *path = g_pi2[K_PRED_Q8];
    uint64_t least = minimum_of(path), kept = least_with(path, 0, -1);
    assert_true(least < kept);
    pi2_engine *mem = open_at(path, 0, 0.5, false);
    int V = pi2_engine_desc(mem)->vocab, L = pi2_engine_desc(mem)->n_layers;
    size_t n = (size_t)(STEPS + 1) * (size_t)V;
    float *lm = malloc(n * sizeof(float)), *ls = malloc(n * sizeof(float)), *ld = malloc(n * sizeof(float));
    int32_t im[STEPS + 1], is[STEPS + 1], id[STEPS + 1];
    pi2_err e = {0};
    assert_int_equal(run_greedy(mem, lm, im, &e), 0);
    pi2_engine_close(mem);
    const struct {
        int pred, attn;
        uint64_t limit;
        bool dense;
    } runs[] = {{-1, 2, 1ull << 40, false}, {-1, L, 1ull << 40, false}, {1, 1, 1ull << 40, false},
                {1, 3, 1ull << 40, false},  {0, 0, least + 4096, false},  {-1, -1, 1ull << 40, true},
                {-1, 3, 1ull << 40, true}};
    for (size_t r = 0; r < sizeof runs / sizeof *runs; r++) {
        pi2_engine_opts o = base_opts(path, runs[r].limit);
        o.offload.hot_share = 0.0;
        o.offload.pred_stream = runs[r].pred;
        o.offload.attn_stream = runs[r].attn;
        o.dense = runs[r].dense;
        pi2_engine *eng = NULL;
        if (pi2_engine_open(&eng, &o, &e))
            fail_msg("open (pred %d, attn %d): %s", runs[r].pred, runs[r].attn, e.msg);
        pi2_engine_stats_reset(eng);
        float *lg = runs[r].dense ? ld : ls;
        int32_t *ids = runs[r].dense ? id : is;
        if (runs[r].dense && runs[r].attn < 0) { /* the reference of the dense runs */
            assert_int_equal(run_greedy(eng, lg, ids, &e), 0);
            pi2_engine_close(eng);
            continue;
        }
        float *lt = runs[r].dense ? ls : lg; /* a dense run after its reference: into ls */
        int32_t it[STEPS + 1];
        if (run_greedy(eng, lt, runs[r].dense ? it : ids, &e))
            fail_msg("run (pred %d, attn %d): %s", runs[r].pred, runs[r].attn, e.msg);
        pi2_engine_offload_info in;
        pi2_engine_offload_info_get(eng, &in);
        int attn = runs[r].attn > 0 ? runs[r].attn : L; /* the least limit streams every layer's */
        assert_int_equal(in.attn_stream, attn);
        assert_true(in.pred_stream == (runs[r].pred >= 0));
        assert_true(in.planned <= runs[r].limit);
        /* the prefill's pass reads the streamed attention, each decode
         * step's every streamed layer; the ring holds two of them across
         * steps at most */
        uint64_t step = ring_pass_bytes(path, in.pred_stream, attn), pre = ring_pass_bytes(path, false, attn);
        if (in.pred_bytes_read < pre + (uint64_t)STEPS * step - 2 * step ||
            in.pred_bytes_read > pre + (uint64_t)STEPS * step + 2 * step)
            fail_msg("pred %d, attn %d: the ring read %llu bytes, %llu a step", runs[r].pred, attn,
                     (unsigned long long)in.pred_bytes_read, (unsigned long long)step);
        pi2_engine_close(eng);
        if (runs[r].dense) {
            assert_memory_equal(ld, lt, n * sizeof(float));
            assert_memory_equal(id, it, sizeof it);
        } else { /* prefill and sparse decode: as in memory, bit for bit */
            assert_memory_equal(lm, ls, n * sizeof(float));
            assert_memory_equal(im, is, sizeof im);
        }
    }
    /* the attention kept resident, the least limit cannot run */
    pi2_engine_opts o = base_opts(path, least + 4096);
    o.offload.attn_stream = -1;
    pi2_engine *eng = NULL;
    pi2_err er = {0};
    assert_int_equal(pi2_engine_open(&eng, &o, &er), PI2_ENOMEM);
    assert_non_null(strstr(er.msg, "attention "));
    fprintf(stderr, "  pred-q8: least limit %.1f MB with the attention streamed (%.1f MB kept); same ids and logits\n",
            (double)least / 1048576.0, (double)kept / 1048576.0);
    free(lm);
    free(ls);
    free(ld);
}

/* A ring read that fails fails the step waiting for it (prefill, decode)
 * and no other: the attention alone streams (every FFN hot, so the ring
 * is the only reader), its reads fail, the step gives PI2_EIO naming the
 * file; once they succeed again, the same step gives the same logits. */
static void test_attention_ring_eio(void **state)
{
    (void)state;
    const char *path = g_pi2[K_PRED_Q8];
    pi2_engine_opts o = base_opts(path, 1ull << 40);
    o.offload.attn_stream = 4;
    pi2_engine *eng = NULL;
    pi2_err e = {0};
    assert_int_equal(pi2_engine_open(&eng, &o, &e), 0);
    int V = pi2_engine_desc(eng)->vocab;
    size_t n = (size_t)(STEPS + 1) * (size_t)V;
    float *ref = malloc(n * sizeof(float)), *lg = malloc(n * sizeof(float));
    int32_t ids[STEPS + 1], p[PROMPT];
    assert_int_equal(run_greedy(eng, ref, ids, &e), 0);
    p[0] = 1;
    for (int i = 1; i < PROMPT; i++)
        p[i] = 3 + (int32_t)((i * 7919) % (V - 3));
    for (int at = 0; at < 2; at++) { /* the fault in the prefill, then in a decode step */
        assert_int_equal(pi2_engine_prefill(eng, p, PROMPT, 0, lg, &e), 0);
        pi2_io_inject(PI2_IO_FAULT_ERRNO, EIO, 0, 1000000);
        pi2_err fe = {0};
        int rc = at == 0 ? pi2_engine_prefill(eng, p, PROMPT, 0, lg, &fe)
                         : pi2_engine_decode(eng, ids[0], PROMPT, lg, &fe);
        assert_int_equal(rc, PI2_EIO);
        assert_non_null(strstr(fe.msg, path));
        pi2_io_inject(PI2_IO_FAULT_NONE, 0, 0, 0);
        if (at == 0) {
            assert_int_equal(pi2_engine_prefill(eng, p, PROMPT, 0, lg, &e), 0);
            assert_memory_equal(lg, ref, (size_t)V * sizeof(float));
        } else {
            assert_int_equal(pi2_engine_decode(eng, ids[0], PROMPT, lg, &e), 0);
            assert_memory_equal(lg, ref + V, (size_t)V * sizeof(float));
        }
    }
    /* one read failing, in a layer read ahead: read again when needed, no
     * step fails */
    pi2_io_inject(PI2_IO_FAULT_ERRNO, EIO, 1, 1);
    assert_int_equal(pi2_engine_decode(eng, ids[1], PROMPT + 1, lg, &e), 0);
    assert_memory_equal(lg, ref + (size_t)2 * V, (size_t)V * sizeof(float));
    pi2_io_inject(PI2_IO_FAULT_NONE, 0, 0, 0);
    pi2_engine_offload_info in;
    pi2_engine_offload_info_get(eng, &in);
    assert_int_equal(in.bytes_read, 0); /* every FFN hot: the ring alone read */
    pi2_engine_close(eng);
    free(ref);
    free(lg);
}

/* Several caches between tiny and generous, and both readers: identical. */
static void test_limits_and_readers(void **state)
{
    (void)state;
    const char *path = g_pi2[K_DRELU];
    uint64_t minimum = minimum_of(path);
    float *ref = NULL;
    int V = 0;
    double shares[4] = {0.0, 0.3, 0.7, 1.0};
    for (int i = 0; i < 4; i++)
        for (int be = 1; be <= 2; be++) {
            pi2_engine_opts o = base_opts(path, minimum + (uint64_t)(i + 1) * (1u << 20) / 4);
            o.offload.hot_share = shares[i];
            o.offload.io_backend = be;
            o.offload.io_depth = i == 0 ? 1 : 64;
            pi2_engine *eng = NULL;
            pi2_err e = {0};
            if (pi2_engine_open(&eng, &o, &e))
                fail_msg("open: %s", e.msg);
            V = pi2_engine_desc(eng)->vocab;
            size_t n = (size_t)(STEPS + 1) * (size_t)V;
            float *lg = malloc(n * sizeof(float));
            int32_t ids[STEPS + 1];
            assert_int_equal(run_greedy(eng, lg, ids, &e), 0);
            pi2_engine_offload_info in;
            pi2_engine_offload_info_get(eng, &in);
            assert_string_equal(in.backend, be == 1 ? "io_uring" : "pread");
            check_io_priority(&in);
            if (!ref)
                ref = lg;
            else {
                assert_memory_equal(ref, lg, n * sizeof(float));
                free(lg);
            }
            pi2_engine_close(eng);
        }
    free(ref);
}

/* The memory plan: under the limit at every limit, more hot bytes and less
 * offloaded as the limit grows, everything hot once it holds all of it. */
static void test_plan(void **state)
{
    (void)state;
    for (int k = 0; k < K_COUNT; k++) {
        const char *path = g_pi2[k];
        /* the least limit streams what it can; a larger one keeps it
         * resident as soon as it fits (a resident byte serves every
         * token), before the FFNs get more: so what is held in memory
         * grows with the limit, the hot segment alone not always */
        uint64_t minimum = minimum_of(path), ffn = 0, last_held = 0, kept = least_with(path, -1, -1);
        int last_attn = INT_MAX;
        double last_off = 2.0;
        for (int step = 0; step <= 10; step++) {
            pi2_engine_opts o = base_opts(path, step < 10 ? minimum + (step == 0 ? 0 : ffn * (uint64_t)step / 8 + 1)
                                                          : kept + ffn + ffn / 255 + 1);
            pi2_engine *eng = NULL;
            pi2_err e = {0};
            if (pi2_engine_open(&eng, &o, &e))
                fail_msg("plan %d: %s", step, e.msg);
            pi2_engine_offload_info in;
            pi2_engine_offload_info_get(eng, &in);
            pi2_engine_close(eng);
            ffn = in.ffn_total;
            assert_true(in.planned <= in.mem_limit);
            assert_true(in.resident + in.kv + in.buffers + in.files + in.overhead + in.hot + in.cache == in.planned);
            assert_true(in.resident + in.hot >= last_held);
            assert_true(in.attn_stream <= last_attn);
            /* all of the FFN plus the overhead's share of the limit (1/256) */
            if (o.offload.mem_limit >= kept + ffn + ffn / 255 + 1)
                assert_true(in.offloaded == 0.0 && in.hot == ffn && in.attn_stream == 0 && !in.pred_stream);
            last_held = in.resident + in.hot;
            last_attn = in.attn_stream;
            last_off = in.offloaded;
        }
        assert_true(last_off == 0.0);
    }
}

/* ---- plans (runtime/planner.h) ---- */

/* Open with a plan or a hardware profile; NULL with *rc on failure. */
static pi2_engine *open_plan(const char *path, uint64_t limit, const pi2_plan *plan, const pi2_hwprof *hw, double min_speed,
                             int *rc, pi2_err *err)
{
    pi2_engine_opts o = base_opts(path, limit);
    o.offload.plan = plan;
    o.offload.hw = hw;
    o.offload.min_speed = min_speed;
    pi2_engine *eng = NULL;
    *rc = pi2_engine_open(&eng, &o, err);
    return eng;
}

/* Given plans (random hot and gate-only groups per FFN, depth, gate-first)
 * give the same logits as the fixed split, bit for bit, on every FFN kind;
 * the gates kept without their up+down are served from memory. */
static void test_given_plans(void **state)
{
    (void)state;
    kind kinds[3] = {K_DRELU, K_RELU_Q8, K_MOE};
    for (int ki = 0; ki < 3; ki++) {
        const char *path = g_pi2[kinds[ki]];
        uint64_t minimum = minimum_of(path);
        pi2_engine *ref = open_at(path, minimum + 4096, 0.0, false);
        int V = pi2_engine_desc(ref)->vocab;
        size_t n = (size_t)(STEPS + 1) * (size_t)V;
        float *lr = malloc(n * sizeof(float)), *lp = malloc(n * sizeof(float));
        int32_t ir[STEPS + 1], ip[STEPS + 1];
        pi2_err e = {0};
        assert_int_equal(run_greedy(ref, lr, ir, &e), 0);
        pi2_engine_offload_info in;
        pi2_engine_offload_info_get(ref, &in);
        uint64_t ffn_total = in.ffn_total;
        pi2_engine_close(ref);
        /* the geometry, from a plan the solver makes */
        pi2_hwprof hw;
        pi2t_fake_hw(&hw, 2);
        int rc;
        pi2_engine *pe = open_plan(path, minimum + ffn_total / 2, NULL, &hw, 0, &rc, &e);
        if (rc)
            fail_msg("%s: planned open: %s", kind_name[kinds[ki]], e.msg);
        pi2_engine_offload_info_get(pe, &in);
        assert_true(strncmp(in.plan_source, "planned", 7) == 0); /* the solver's, or the fixed split it kept */
        assert_non_null(in.plan);
        assert_true(in.planned <= in.mem_limit);
        assert_true(in.plan->pred.decode_tok_s > 0 && in.plan->pred.prefill_tok_s > 0);
        uint32_t n_ffn = in.plan->n_ffn;
        pi2_engine_close(pe);
        pi2_rng r;
        pi2_rng_seed(&r, 11 + (uint64_t)ki);
        for (int trial = 0; trial < 3; trial++) {
            pi2_plan p;
            assert_int_equal(pi2_plan_alloc(&p, n_ffn, &e), 0);
            p.threads = 2;
            p.io_depth = trial == 0 ? 16 : 64;
            p.gate_first = trial == 2;
            uint32_t groups = 0;
            {   /* groups per FFN: from a plan with everything hot */
                pi2_engine *all = open_plan(path, 1ull << 40, NULL, &hw, 0, &rc, &e);
                assert_int_equal(rc, 0);
                pi2_engine_offload_info a;
                pi2_engine_offload_info_get(all, &a);
                groups = a.plan->hot_groups[0];
                pi2_engine_close(all);
            }
            uint64_t gate_groups_total = 0;
            for (uint32_t i = 0; i < n_ffn; i++) {
                uint32_t h = (uint32_t)(pi2_rng_uniform(&r) * groups / 3);
                uint32_t g = kinds[ki] == K_RELU_Q8 ? h : h + (uint32_t)(pi2_rng_uniform(&r) * (groups - h));
                p.hot_groups[i] = h;
                p.gate_groups[i] = g;
                gate_groups_total += g - h;
            }
            pi2_engine *eng = open_plan(path, minimum + ffn_total, &p, NULL, 0, &rc, &e);
            if (rc)
                fail_msg("%s trial %d: %s", kind_name[kinds[ki]], trial, e.msg);
            pi2_engine_stats_reset(eng);
            assert_int_equal(run_greedy(eng, lp, ip, &e), 0);
            pi2_engine_offload_info_get(eng, &in);
            assert_string_equal(in.plan_source, "given");
            assert_int_equal(in.io_depth, p.io_depth);
            assert_true(in.gate_first == (p.gate_first && kinds[ki] != K_RELU_Q8));
            assert_true((in.gate_hot > 0) == (gate_groups_total > 0));
            assert_true(in.planned <= in.mem_limit);
            assert_true(in.parts_read > 0);
            pi2_engine_close(eng);
            assert_memory_equal(lr, lp, n * sizeof(float));
            assert_memory_equal(ir, ip, sizeof ir);
            /* a plan that does not fit the limit, or the model */
            for (uint32_t i = 0; i < n_ffn; i++)
                p.hot_groups[i] = p.gate_groups[i] = groups;
            pi2_err_clear(&e);
            assert_null(open_plan(path, minimum + ffn_total / 2, &p, NULL, 0, &rc, &e));
            assert_int_equal(rc, PI2_ENOMEM);
            assert_non_null(strstr(e.msg, "the plan needs"));
            p.gate_groups[0] = groups + 1;
            if (p.hot_groups[0] > p.gate_groups[0])
                p.hot_groups[0] = p.gate_groups[0];
            pi2_err_clear(&e);
            assert_null(open_plan(path, minimum + ffn_total, &p, NULL, 0, &rc, &e));
            assert_int_equal(rc, PI2_ESHAPE);
            assert_non_null(strstr(e.msg, path));
            pi2_plan_free(&p);
        }
        /* one thread: runs with one; a plan for another model is refused */
        pi2_plan p;
        assert_int_equal(pi2_plan_alloc(&p, n_ffn + 1, &e), 0);
        p.threads = 1;
        p.io_depth = 32;
        pi2_err_clear(&e);
        assert_null(open_plan(path, minimum + ffn_total, &p, NULL, 0, &rc, &e));
        assert_int_equal(rc, PI2_ESHAPE);
        assert_non_null(strstr(e.msg, "FFNs"));
        pi2_plan_free(&p);
        assert_int_equal(pi2_plan_alloc(&p, n_ffn, &e), 0);
        p.threads = 1;
        p.io_depth = 32;
        pi2_engine *one = open_plan(path, minimum + ffn_total, &p, NULL, 0, &rc, &e);
        assert_int_equal(rc, 0);
        assert_int_equal(pi2_engine_threads(one), 1);
        assert_int_equal(run_greedy(one, lp, ip, &e), 0);
        int agree = 0;
        while (agree <= STEPS && ip[agree] == ir[agree])
            agree++;
        assert_true(agree >= 8);
        pi2_engine_close(one);
        pi2_plan_free(&p);
        /* a minimum speed no plan reaches */
        pi2_err_clear(&e);
        assert_null(open_plan(path, minimum + ffn_total / 4, NULL, &hw, 1e9, &rc, &e));
        assert_int_equal(rc, PI2_ERANGE);
        assert_non_null(strstr(e.msg, "infeasible"));
        assert_non_null(strstr(e.msg, path));
        fprintf(stderr, "  %s: given plans (hot + gate-only groups, depths, gate-first) = fixed split, bit for bit\n",
                kind_name[kinds[ki]]);
        free(lr);
        free(lp);
    }
}

/* ---- faults ---- */

/* EIO on a decode read: the step fails with the file named; after the fault
 * clears, the same step gives the same logits as a run without faults. */
static void eio_and_recovery(kind k)
{
    const char *path = g_pi2[k];
    uint64_t minimum = minimum_of(path);
    pi2_engine *eng = open_at(path, minimum + 4096, 0.0, false);
    int V = pi2_engine_desc(eng)->vocab;
    size_t n = (size_t)(STEPS + 1) * (size_t)V;
    float *ref = malloc(n * sizeof(float)), *lg = malloc(n * sizeof(float));
    int32_t ids[STEPS + 1];
    pi2_err e = {0};
    assert_int_equal(run_greedy(eng, ref, ids, &e), 0);
    /* replay: prefill again, then decode with a fault in the middle */
    int32_t p[PROMPT];
    p[0] = 1;
    for (int i = 1; i < PROMPT; i++)
        p[i] = 3 + (int32_t)((i * 7919) % (V - 3));
    assert_int_equal(pi2_engine_prefill(eng, p, PROMPT, 0, lg, &e), 0);
    assert_int_equal(pi2_engine_decode(eng, ids[0], PROMPT, lg, &e), 0);
    pi2_io_inject(PI2_IO_FAULT_ERRNO, EIO, 2, 1000000);
    pi2_err fe = {0};
    int rc = pi2_engine_decode(eng, ids[1], PROMPT + 1, lg, &fe);
    assert_int_equal(rc, PI2_EIO);
    assert_non_null(strstr(fe.msg, path));
    assert_non_null(strstr(fe.msg, "Input/output error"));
    pi2_io_inject(PI2_IO_FAULT_NONE, 0, 0, 0);
    if (pi2_engine_decode(eng, ids[1], PROMPT + 1, lg, &e) != 0)
        fail_msg("%s: the step after the fault: %s", kind_name[k], e.msg);
    assert_memory_equal(lg, ref + (size_t)2 * V, (size_t)V * sizeof(float));
    /* short reads are retried: same result */
    pi2_io_inject(PI2_IO_FAULT_SHORT, 0, 0, 1000000);
    assert_int_equal(pi2_engine_decode(eng, ids[2], PROMPT + 2, lg, &e), 0);
    assert_memory_equal(lg, ref + (size_t)3 * V, (size_t)V * sizeof(float));
    pi2_io_inject(PI2_IO_FAULT_NONE, 0, 0, 0);
    /* EIO in the prefill stream */
    pi2_io_inject(PI2_IO_FAULT_ERRNO, EIO, 0, 1000000);
    pi2_err pe = {0};
    assert_int_equal(pi2_engine_prefill(eng, p, PROMPT, 0, lg, &pe), PI2_EIO);
    assert_non_null(strstr(pe.msg, path));
    pi2_io_inject(PI2_IO_FAULT_NONE, 0, 0, 0);
    assert_int_equal(pi2_engine_prefill(eng, p, PROMPT, 0, lg, &e), 0);
    assert_memory_equal(lg, ref, (size_t)V * sizeof(float));
    pi2_engine_close(eng);
    free(ref);
    free(lg);
}

/* (K_PRED_Q8 at its least limit: the predictors' reads fail too, and the
 * ring starts afresh after) */
static void test_eio_and_recovery(void **state)
{
    (void)state;
    eio_and_recovery(K_DRELU);
    eio_and_recovery(K_PRED_Q8);
}

/* io_uring cannot be set up: the pread threads take over, same logits. */
static void test_no_uring(void **state)
{
    (void)state;
    const char *path = g_pi2[K_RELU_Q8];
    uint64_t minimum = minimum_of(path);
    pi2_engine *a = open_at(path, minimum + 4096, 0.0, false);
    int V = pi2_engine_desc(a)->vocab;
    size_t n = (size_t)(STEPS + 1) * (size_t)V;
    float *la = malloc(n * sizeof(float)), *lb = malloc(n * sizeof(float));
    int32_t ia[STEPS + 1], ib[STEPS + 1];
    pi2_err e = {0};
    assert_int_equal(run_greedy(a, la, ia, &e), 0);
    pi2_engine_close(a);
    pi2_io_inject(PI2_IO_FAULT_NO_URING, 0, 0, 0);
    pi2_engine *b = open_at(path, minimum + 4096, 0.0, false);
    pi2_engine_offload_info in;
    pi2_engine_offload_info_get(b, &in);
    assert_string_equal(in.backend, "pread");
    assert_non_null(strstr(in.note, "io_uring unavailable"));
    assert_int_equal(run_greedy(b, lb, ib, &e), 0);
    assert_memory_equal(la, lb, n * sizeof(float));
    pi2_engine_close(b);
    free(la);
    free(lb);
}

/* Truncated under the reader: a clear error, no crash. Replaced (renamed
 * over): the descriptor opened at start keeps serving the verified bytes. */
static void test_truncated_and_replaced(void **state)
{
    (void)state;
    char path[160], other[160];
    snprintf(path, sizeof path, "%s/victim.pi2", g_dir);
    snprintf(other, sizeof other, "%s/other.pi2", g_dir);
    pi2t_copy_file(g_pi2[K_DRELU], path);
    uint64_t minimum = minimum_of(path);
    pi2_engine *eng = open_at(path, minimum + 4096, 0.0, false);
    int V = pi2_engine_desc(eng)->vocab;
    size_t n = (size_t)(STEPS + 1) * (size_t)V;
    float *ref = malloc(n * sizeof(float)), *lg = malloc(n * sizeof(float));
    int32_t ids[STEPS + 1], ids2[STEPS + 1];
    pi2_err e = {0};
    assert_int_equal(run_greedy(eng, ref, ids, &e), 0);
    /* replaced: another file renamed over the path */
    pi2t_copy_file(g_pi2[K_SILU], other);
    assert_int_equal(rename(other, path), 0);
    assert_int_equal(run_greedy(eng, lg, ids2, &e), 0);
    assert_memory_equal(ref, lg, n * sizeof(float));
    pi2_engine_close(eng);
    /* truncated in place */
    pi2t_copy_file(g_pi2[K_DRELU], path);
    eng = open_at(path, minimum + 4096, 0.0, false);
    assert_int_equal(run_greedy(eng, lg, ids2, &e), 0);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(truncate(path, st.st_size / 2), 0);
    pi2_err te = {0};
    int rc = run_greedy(eng, lg, ids2, &te);
    assert_int_equal(rc, PI2_EIO);
    assert_non_null(strstr(te.msg, path));
    assert_non_null(strstr(te.msg, "size"));
    pi2_engine_close(eng);
    free(ref);
    free(lg);
}

/* A limit below the resident part; a context beyond the plan; a corrupt
 * FFN payload or resident member. */
static void test_bad_limits_and_corruption(void **state)
{
    (void)state;
    const char *path = g_pi2[K_DRELU];
    uint64_t minimum = minimum_of(path);
    pi2_err e = {0};
    int rc;
    pi2_engine *eng = try_open(path, minimum - 1, 0.5, false, &rc, &e);
    assert_null(eng);
    assert_int_equal(rc, PI2_ENOMEM);
    assert_non_null(strstr(e.msg, "needs at least"));
    assert_non_null(strstr(e.msg, path));
    eng = open_at(path, minimum, 0.5, false);
    pi2_err ce = {0};
    assert_int_equal(pi2_engine_set_ctx(eng, CTX * 2, &ce), PI2_ERANGE);
    assert_non_null(strstr(ce.msg, "memory plan was made for")); /* the library names no flag */
    assert_null(strstr(ce.msg, "--"));
    assert_int_equal(pi2_engine_set_ctx(eng, CTX / 2, &ce), 0); /* smaller is fine */
    pi2_engine_close(eng);

    char bad[160];
    snprintf(bad, sizeof bad, "%s/corrupt.pi2", g_dir);
    for (int where = 0; where < 2; where++) {
        pi2t_copy_file(path, bad);
        /* where 0: a byte near the end of the file (the last FFN member, before
         * the manifest); 1: a byte of the first member (the tokenizer, resident) */
        int fd = open(bad, O_RDWR);
        assert_true(fd >= 0);
        pi2_bundle *b = NULL;
        pi2_bundle_open_opts bo = {.pubkey = g_pubkey};
        assert_int_equal(pi2_bundle_open(&b, bad, &bo, &e), 0);
        const pi2_bundle_layout *bl = pi2_bundle_layout_get(b);
        const pi2_ctr_member *m =
            pi2_ctr_find(pi2_bundle_container(b), where == 0 ? bl->ffn[bl->n_ffn - 1].ffn : bl->resident[0]);
        off_t at = (off_t)(m->offset + m->size / 2);
        pi2_bundle_close(b);
        uint8_t c;
        assert_int_equal(pread(fd, &c, 1, at), 1);
        c ^= 0x5a;
        assert_int_equal(pwrite(fd, &c, 1, at), 1);
        close(fd);
        pi2_err ve = {0};
        eng = try_open(bad, 1ull << 40, 0.5, false, &rc, &ve);
        assert_null(eng);
        assert_int_equal(rc, PI2_ESIG);
        assert_non_null(strstr(ve.msg, "SHA-256"));
    }
}

/* ---- golden: tinystories-656k (SiLU, q8) through the offloaded path ---- */

static void golden_offload(const char *name, bool must_agree)
{
    char dir[1024], path[1200];
    PI2T_SHARED_MODEL(dir, name);
    snprintf(path, sizeof path, "%s/EXPECTED.json", dir);
    json_t *exp = load_json(path);
    json_t *cases = json_object_get(exp, "cases");
    pi2_err e = {0};
    char out[1200];
    if (pi2t_convert_bundle(dir, g_dir, name, PI2_QT_Q8, 4096, g_key, out, sizeof out, &e))
        fail_msg("%s: %s", name, e.msg);
    uint64_t minimum = minimum_of(out);
    uint64_t limits[2] = {1ull << 40, minimum + 4096};
    int32_t first[8][64];
    for (int li = 0; li < 2; li++) {
        pi2_engine *eng = open_at(out, limits[li], li ? 0.0 : 0.5, true);
        const pi2_model_desc *d = pi2_engine_desc(eng);
        float *lg = malloc(sizeof(float) * d->vocab);
        pi2_engine_stats_reset(eng);
        for (size_t ci = 0; ci < json_array_size(cases) && ci < 8; ci++) {
            json_t *c = json_array_get(cases, ci);
            json_t *p = json_object_get(c, "prompt_ids"), *g = json_object_get(c, "generated_ids");
            size_t np = json_array_size(p), ng = json_array_size(g);
            int32_t ids[CTX];
            ids[0] = 1;
            for (size_t i = 0; i < np && i + 1 < CTX; i++)
                ids[i + 1] = (int32_t)jint(p, i);
            assert_int_equal(pi2_engine_prefill(eng, ids, (int)np + 1, 0, lg, &e), 0);
            size_t agree = 0, steps = ng < 16 ? ng : 16;
            int pos = (int)np + 1;
            for (size_t s = 0; s < steps && pos < CTX; s++) {
                int next = pi2_argmax(lg, d->vocab);
                if (li == 0)
                    first[ci][s] = next;
                else
                    assert_int_equal(next, first[ci][s]); /* tiny = generous */
                agree += agree == s && next == jint(g, s);
                assert_int_equal(pi2_engine_decode(eng, next, pos++, lg, &e), 0);
            }
            if (li == 1)
                fprintf(stderr, "  %s q8 offloaded (tiny limit) case %zu: %zu/%zu greedy ids as expected\n", name,
                        ci, agree, steps);
            if (must_agree && agree < steps)
                fail_msg("%s case %zu diverges at step %zu (< 16)", name, ci, agree);
        }
        if (li == 1) {
            pi2_engine_offload_info in;
            pi2_engine_offload_info_get(eng, &in);
            assert_true(in.bytes_read > 0);
        }
        free(lg);
        pi2_engine_close(eng);
    }
    json_decref(exp);
}

static void test_golden_tinystories(void **state)
{
    (void)state;
    golden_offload("tinystories-656k", true);
}

static void test_golden_tinystories_drelu(void **state)
{
    (void)state;
    golden_offload("tinystories-656k-drelu", false);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_kv_f16, clear_kv_f16),
        cmocka_unit_test_teardown(test_same_tokens, clear_faults),
        cmocka_unit_test_teardown(test_same_tokens_dense, clear_faults),
        cmocka_unit_test_teardown(test_layouts_agree, clear_faults),
        cmocka_unit_test_teardown(test_windows_astride, clear_faults),
        cmocka_unit_test_teardown(test_streamed_predictors, clear_faults),
        cmocka_unit_test_teardown(test_streamed_attention, clear_faults),
        cmocka_unit_test_teardown(test_attention_ring_eio, clear_faults),
        cmocka_unit_test_teardown(test_limits_and_readers, clear_faults),
        cmocka_unit_test_teardown(test_plan, clear_faults),
        cmocka_unit_test_teardown(test_given_plans, clear_faults),
        cmocka_unit_test_teardown(test_eio_and_recovery, clear_faults),
        cmocka_unit_test_teardown(test_no_uring, clear_faults),
        cmocka_unit_test_teardown(test_truncated_and_replaced, clear_faults),
        cmocka_unit_test_teardown(test_bad_limits_and_corruption, clear_faults),
        cmocka_unit_test_teardown(test_golden_tinystories, clear_faults),
        cmocka_unit_test_teardown(test_golden_tinystories_drelu, clear_faults),
    };
    return cmocka_run_group_tests_name("offload", tests, group_setup, group_teardown);
}
