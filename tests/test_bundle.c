/* Tests for pi2-bundle: geometry and neuron order on handmade inputs; the
 * round trip (every tensor, predictor and profile array read back from the
 * bundle through the permutation equals the converted one, byte for byte and
 * dequantized) for dReLU, SiLU, ReGLU q8 and MoE models; the documented
 * layout (alignment, slots, regions, zero padding, member order); the tamper
 * matrix (a flipped byte in each section, the manifest and the signature,
 * truncations, another key, duplicate and reordered members, offsets outside
 * the file or overlapping, unsigned containers); a few hundred seeded
 * mutations of containers and of the bundle object; bad inputs to the
 * bundler (each with its exact code and nothing left behind). */
#include "tests/testmodel.h"
#include "tests/testutil.h"

#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>

#include "bundle/bundle.h"
#include "bundle/layout.h"
#include "bundle/order.h"
#include "bundle/report_svg.h"
#include "convert/convert.h"
#include "convert/synth.h"
#include "formats/container.h"
#include "formats/manifest.h"

/* ------------------------------------------------------------------ */
/* Fixtures: generated models, converted, and keys, made once          */
/* ------------------------------------------------------------------ */

static char g_dir[64];
static char g_pub2[128];
static char g_drelu[128], g_silu[128], g_q8[128], g_moe[128]; /* converted */
static char g_signed[128];                                     /* g_drelu bundled, signed, io 4K */
static char g_unsigned[128];                                   /* g_drelu bundled, unsigned, io 4K */
static pi2_sign_key *g_key, *g_pubkey, *g_key2;

typedef enum { M_DRELU, M_SILU, M_Q8_RELU, M_MOE } model_kind;

static int make_converted(model_kind k, const char *out)
{
    char dir[160];
    snprintf(dir, sizeof dir, "%s.src", out);
    pi2_synth_opts so;
    pi2_err e = { 0 };
    if (pi2_synth_preset("tiny", &so, &e))
        return fprintf(stderr, "%s\n", e.msg), -1;
    so.threads = 2;
    so.predictors = k == M_DRELU || k == M_MOE;
    if (k == M_SILU || k == M_Q8_RELU) {
        so.desc.arch = PI2_ARCH_LLAMA;
        so.desc.act = k == M_SILU ? PI2_ACT_SILU : PI2_ACT_RELU;
    }
    if (k == M_MOE) {
        so.desc.arch = PI2_ARCH_TURBOSPARSE_MIXTRAL;
        so.desc.n_experts = 4;
        so.desc.n_experts_used = 2;
    }
    if (pi2_synth_write(dir, &so, NULL, NULL, &e))
        return fprintf(stderr, "synth: %s\n", e.msg), -1;
    pi2_convert_opts co;
    pi2_convert_defaults(&co);
    co.model_dir = dir;
    co.out_path = out;
    co.calib_tokens = 512;
    co.quiet = true;
    co.threads = 2;
    co.q_ffn = k == M_Q8_RELU ? PI2_QT_Q8 : PI2_QT_Q4;
    co.train_predictors = k == M_Q8_RELU;
    if (pi2_convert(&co, NULL, &e))
        return fprintf(stderr, "convert: %s\n", e.msg), -1;
    return 0;
}

static int group_setup(void **state)
{
    (void)state;
    pi2_err e = { 0 };
    pi2t_tmpdir(g_dir, sizeof g_dir);
    snprintf(g_pub2, sizeof g_pub2, "%s/k2.pub", g_dir);
    snprintf(g_drelu, sizeof g_drelu, "%s/drelu.pi2c", g_dir);
    snprintf(g_silu, sizeof g_silu, "%s/silu.pi2c", g_dir);
    snprintf(g_q8, sizeof g_q8, "%s/q8.pi2c", g_dir);
    snprintf(g_moe, sizeof g_moe, "%s/moe.pi2c", g_dir);
    snprintf(g_signed, sizeof g_signed, "%s/signed.pi2", g_dir);
    snprintf(g_unsigned, sizeof g_unsigned, "%s/unsigned.pi2", g_dir);
    double t0 = pi2_now();
    if (make_converted(M_DRELU, g_drelu) || make_converted(M_SILU, g_silu) || make_converted(M_Q8_RELU, g_q8) ||
        make_converted(M_MOE, g_moe))
        return -1;
    if (pi2t_keypair(g_dir, "k", &g_key, &g_pubkey, &e) || pi2t_keypair(g_dir, "k2", &g_key2, NULL, &e))
        return fprintf(stderr, "keys: %s\n", e.msg), -1;
    if (pi2t_bundle(g_drelu, g_signed, 4096, true, g_key, &e) ||
        pi2t_bundle(g_drelu, g_unsigned, 4096, true, NULL, &e))
        return fprintf(stderr, "bundle: %s\n", e.msg), -1;
    fprintf(stderr, "  [fixtures in %.1f s]\n", pi2_now() - t0);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    pi2_sign_key_free(g_key);
    pi2_sign_key_free(g_pubkey);
    pi2_sign_key_free(g_key2);
    pi2t_rmtree(g_dir);
    return 0;
}

static int reset_fail_hook(void **state)
{
    (void)state;
    pi2_afile_fail_after(-1);
    return 0;
}

/* ------------------------------------------------------------------ */
/* Helpers                                                            */
/* ------------------------------------------------------------------ */

static const pi2_ctr_member *member(const pi2_ctr *c, const char *name)
{
    const pi2_ctr_member *m = pi2_ctr_find(c, name);
    if (!m)
        fail_msg("member %s missing", name);
    return m;
}

static pi2_bundle *open_signed(const char *path)
{
    pi2_bundle_open_opts o = { .pubkey = g_pubkey };
    pi2_bundle *b = NULL;
    pi2_err e = { 0 };
    if (pi2_bundle_open(&b, path, &o, &e))
        fail_msg("%s", e.msg);
    return b;
}

static uint64_t file_size(const char *path)
{
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return (uint64_t)st.st_size;
}

static void xor_byte(const char *path, uint64_t off, uint8_t x)
{
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    uint8_t b;
    assert_int_equal(pread(fd, &b, 1, (off_t)off), 1);
    b ^= x;
    assert_int_equal(pwrite(fd, &b, 1, (off_t)off), 1);
    close(fd);
}

/* Open (signed: with the test key; unsigned: allow_unsigned) and verify
 * every section. Returns the code; message in *e. */
static int open_verify(const char *path, bool allow_unsigned, const pi2_sign_key *pub, pi2_err *e)
{
    pi2_bundle_open_opts o = { .pubkey = pub, .allow_unsigned = allow_unsigned };
    pi2_bundle *b = NULL;
    int rc = pi2_bundle_open(&b, path, &o, e);
    if (rc == 0)
        rc = pi2_bundle_verify(b, false, NULL, e);
    pi2_bundle_close(b);
    return rc;
}

static void expect_fail(const char *path, const pi2_sign_key *pub, bool allow, int code, const char *needle)
{
    pi2_err e = { 0 };
    int rc = open_verify(path, allow, pub, &e);
    if (rc != code || (needle && !strstr(e.msg, needle)))
        fail_msg("%s: got %d (%s), want %d with \"%s\"", path, rc, e.msg, code, needle ? needle : "");
    assert_null(strchr(e.msg, '\n'));
}

/* Rewrite a container: the same members in order (or with positions a and
 * b swapped when a != b), then `manifest` (len bytes) and, when sig is
 * non-NULL, a manifest.sig. */
static void rewrite(const char *src, const char *dst, size_t a, size_t b, const char *manifest, size_t len,
                    const uint8_t *sig)
{
    pi2_ctr *c;
    pi2_ctr_writer *w;
    pi2_err e = { 0 };
    if (pi2_ctr_open(&c, src, &e) || pi2_ctr_writer_create(&w, dst, &e))
        fail_msg("%s", e.msg);
    size_t n = pi2_ctr_count(c);
    for (size_t i = 0; i < n; i++) {
        size_t k = i == a ? b : i == b ? a : i;
        const pi2_ctr_member *m = pi2_ctr_at(c, k);
        if (strcmp(m->name, PI2_MF_NAME) == 0 || strcmp(m->name, PI2_MF_SIG_NAME) == 0)
            continue;
        if (pi2_ctr_writer_add(w, m->name, m->data, (size_t)m->size, &e))
            fail_msg("%s", e.msg);
    }
    if (pi2_ctr_writer_add(w, PI2_MF_NAME, manifest, len, &e) ||
        (sig && pi2_ctr_writer_add(w, PI2_MF_SIG_NAME, sig, PI2_SIG_LEN, &e)) || pi2_ctr_writer_finish(w, &e))
        fail_msg("%s", e.msg);
    pi2_ctr_writer_free(w);
    pi2_ctr_close(c);
}

/* The manifest of a container as a jansson tree. */
static json_t *manifest_json(const char *path)
{
    pi2_ctr *c;
    pi2_err e = { 0 };
    if (pi2_ctr_open(&c, path, &e))
        fail_msg("%s", e.msg);
    const pi2_ctr_member *m = member(c, PI2_MF_NAME);
    json_error_t je;
    json_t *j = json_loadb((const char *)m->data, (size_t)m->size, 0, &je);
    pi2_ctr_close(c);
    assert_non_null(j);
    return j;
}

/* Sign the JSON tree's text with key (NULL: unsigned) and write a copy of
 * src with it as the manifest. */
static void rewrite_manifest(const char *src, const char *dst, json_t *j, const pi2_sign_key *key)
{
    char *text = json_dumps(j, JSON_PRESERVE_ORDER | JSON_INDENT(1));
    assert_non_null(text);
    uint8_t sig[PI2_SIG_LEN];
    pi2_err e = { 0 };
    if (key && pi2_sign(key, text, strlen(text), sig, &e))
        fail_msg("%s", e.msg);
    rewrite(src, dst, 0, 0, text, strlen(text), key ? sig : NULL);
    free(text);
}

static int count_tmp_files(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        n += strstr(de->d_name, ".tmp.") != NULL;
    closedir(d);
    return n;
}

/* ------------------------------------------------------------------ */
/* Geometry and order on handmade inputs                               */
/* ------------------------------------------------------------------ */

static pi2_model_desc desc(int hidden, int n_ff, pi2_act act)
{
    pi2_model_desc d = { 0 };
    d.hidden = hidden;
    d.n_ff = n_ff;
    d.act = act;
    return d;
}

static void test_geometry(void **state)
{
    (void)state;
    pi2_bl_ffn f;
    pi2_err e = { 0 };
    /* 7B shape, q4: R = 2048 payload + 256 scales */
    pi2_model_desc d = desc(4096, 14336, PI2_ACT_RELU);
    assert_int_equal(pi2_bl_row_bytes(PI2_QT_Q4, 4096), 2304);
    assert_int_equal(pi2_bl_row_bytes(PI2_QT_Q8, 4096), 4352);
    assert_int_equal(pi2_bl_row_bytes(PI2_QT_F32, 4096), 0);
    assert_int_equal(pi2_bl_geometry(&d, PI2_QT_Q4, 16384, d.act == PI2_ACT_DRELU, &f, &e), 0);
    assert_int_equal(f.group, 2);
    assert_int_equal(f.bundle_bytes, 6912);
    assert_int_equal(f.gate_part, 0);
    assert_int_equal(f.slot_bytes, 16384);
    assert_int_equal(f.groups, 7168);
    assert_int_equal(f.gate_bytes, 0);
    /* two-phase: up+down payloads only (2P = 4096, one page a neuron), the
     * gate unit with every scale (R + 2C = 2816): 4 neurons in 12K + 16K */
    d.act = PI2_ACT_DRELU;
    assert_int_equal(pi2_bl_geometry(&d, PI2_QT_Q4, 16384, d.act == PI2_ACT_DRELU, &f, &e), 0);
    assert_int_equal(f.group, 4);
    assert_int_equal(f.bundle_bytes, 4096);
    assert_int_equal(f.gate_bytes, 2816);
    assert_int_equal(f.gate_part, 12288);
    assert_int_equal(f.slot_bytes, 28672);
    assert_int_equal(f.groups, 14336 / 4);
    /* a row wider than the unit: one neuron per group, reads exceed it
     * (q8: gate unit 4096 + 3 * 256, up+down 8192) */
    assert_int_equal(pi2_bl_geometry(&d, PI2_QT_Q8, 4096, d.act == PI2_ACT_DRELU, &f, &e), 0);
    assert_int_equal(f.group, 1);
    assert_int_equal(f.gate_bytes, 4864);
    assert_int_equal(f.gate_part, 8192);
    assert_int_equal(f.slot_bytes, 8192 + 8192);
    /* 256K, one-phase q8: R = 4352, g = 20, slot roundup(20 * 13056) */
    d.act = PI2_ACT_SILU;
    assert_int_equal(pi2_bl_geometry(&d, PI2_QT_Q8, 262144, d.act == PI2_ACT_DRELU, &f, &e), 0);
    assert_int_equal(f.group, 20);
    assert_int_equal(f.slot_bytes, 262144);
    assert_int_equal(f.groups, (14336 + 19) / 20);
    /* the group never exceeds the FFN */
    d = desc(64, 40, PI2_ACT_DRELU);
    assert_int_equal(pi2_bl_geometry(&d, PI2_QT_Q4, 262144, d.act == PI2_ACT_DRELU, &f, &e), 0);
    assert_int_equal(f.group, 40);
    assert_int_equal(f.groups, 1);
    /* hot regions (R = 32 + 4) */
    d = desc(64, 256, PI2_ACT_RELU);
    assert_int_equal(pi2_bl_geometry(&d, PI2_QT_Q4, 4096, d.act == PI2_ACT_DRELU, &f, &e), 0);
    assert_int_equal(f.group, 37);
    assert_int_equal(f.groups, 7);
    pi2_bl_set_hot(&f, 2);
    assert_int_equal(f.hot_neurons, 74);
    assert_int_equal(f.hot_size, 8192);
    assert_int_equal(f.cold_offset, 8192);
    assert_int_equal(f.cold_size, 5 * 4096);
    pi2_bl_set_hot(&f, 99);
    assert_int_equal(f.hot_groups, 7);
    assert_int_equal(f.hot_neurons, 256);
    assert_int_equal(f.cold_size, 0);
    /* offsets: one-phase neuron 43 = slot 1, position 6; each row's
     * scales after its 32-byte payload */
    pi2_bl_rows at;
    pi2_bl_neuron_rows(&f, 36, 32, false, 43, &at);
    for (int r = 0; r < 3; r++) {
        assert_int_equal(at.pay[r], 4096 + 6 * 108 + 36 * r);
        assert_int_equal(at.sc[r], 4096 + 6 * 108 + 36 * r + 32);
    }
    /* two-phase (P = 32, C = 4): gate units of 44, up+down units of 64 */
    d.act = PI2_ACT_DRELU;
    assert_int_equal(pi2_bl_geometry(&d, PI2_QT_Q4, 4096, d.act == PI2_ACT_DRELU, &f, &e), 0);
    assert_int_equal(f.group, 64);
    assert_int_equal(f.gate_bytes, 44);
    assert_int_equal(f.bundle_bytes, 64);
    assert_int_equal(f.slot_bytes, 8192);
    pi2_bl_neuron_rows(&f, 36, 32, true, 73, &at); /* slot 1 (8192), position 9 */
    assert_int_equal(at.pay[0], 8192 + 9 * 44);
    assert_int_equal(at.sc[0], 8192 + 9 * 44 + 32);
    assert_int_equal(at.sc[1], 8192 + 9 * 44 + 36);
    assert_int_equal(at.sc[2], 8192 + 9 * 44 + 40);
    assert_int_equal(at.pay[1], 8192 + 4096 + 9 * 64);
    assert_int_equal(at.pay[2], 8192 + 4096 + 9 * 64 + 32);
    /* bad units and quant */
    assert_int_equal(pi2_bl_geometry(&d, PI2_QT_Q4, 2048, d.act == PI2_ACT_DRELU, &f, &e), PI2_EINVAL);
    assert_int_equal(pi2_bl_geometry(&d, PI2_QT_Q4, 12288, d.act == PI2_ACT_DRELU, &f, &e), PI2_EINVAL);
    assert_int_equal(pi2_bl_geometry(&d, PI2_QT_Q4, 524288, d.act == PI2_ACT_DRELU, &f, &e), PI2_EINVAL);
    assert_int_equal(pi2_bl_geometry(&d, PI2_QT_F32, 4096, d.act == PI2_ACT_DRELU, &f, &e), PI2_EINVAL);
}

/* Padding of a slot: the share of its bytes that hold no neuron. */
static double slot_waste(const pi2_model_desc *d, pi2_qtype q, uint32_t u, bool *fits)
{
    pi2_bl_ffn f;
    pi2_err e = { 0 };
    assert_int_equal(pi2_bl_geometry(d, q, u, d->act == PI2_ACT_DRELU, &f, &e), 0);
    *fits = (uint64_t)f.group * f.bundle_bytes <= u && (uint64_t)f.group * f.gate_bytes <= u;
    return 1.0 - (double)f.group * 3.0 * (double)pi2_bl_row_bytes(q, d->hidden) / (double)f.slot_bytes;
}

static void test_auto_io_unit(void **state)
{
    (void)state;
    pi2_bl_ffn f;
    pi2_err e = { 0 };
    /* 7B shape, dReLU q4 (R = 2304, up+down 4096, gate unit 2816): 8K
     * holds 2 neurons in 16K (5/32 padding), 16K 4 (gates 12K, up+down
     * 16K, 1/28 padding) */
    pi2_model_desc d = desc(4096, 14336, PI2_ACT_DRELU);
    assert_int_equal(pi2_bl_auto_io_unit(&d, PI2_QT_Q4, d.act == PI2_ACT_DRELU), 16384);
    assert_int_equal(pi2_bl_geometry(&d, PI2_QT_Q4, 16384, d.act == PI2_ACT_DRELU, &f, &e), 0);
    assert_int_equal(f.group, 4);
    assert_int_equal(f.slot_bytes, 28672);
    /* ... q8 (up+down 8192, gate unit 4864): 8K holds 1 (0.2 padding), 16K
     * 2 in 12K + 16K (0.09) */
    assert_int_equal(pi2_bl_auto_io_unit(&d, PI2_QT_Q8, d.act == PI2_ACT_DRELU), 16384);
    /* one-phase 6.75K neurons (dReLU's default layout too): 8K and 16K are
     * 5/32 padding, 32K holds 4 in 28K */
    assert_int_equal(pi2_bl_auto_io_unit(&d, PI2_QT_Q4, false), 32768);
    assert_int_equal(pi2_bl_geometry(&d, PI2_QT_Q4, 32768, false, &f, &e), 0);
    assert_true(f.group == 4 && f.slot_bytes == 28672 && f.gate_part == 0 && f.bundle_bytes == 3 * 2304);
    d.act = PI2_ACT_RELU;
    assert_int_equal(pi2_bl_auto_io_unit(&d, PI2_QT_Q4, d.act == PI2_ACT_DRELU), 32768);
    assert_int_equal(pi2_bl_geometry(&d, PI2_QT_Q4, 32768, true, &f, &e), PI2_EINVAL); /* two-phase: drelu only */
    /* 1B shape, ReGLU q4 (3.375K neurons): 32K holds 9 (1/20 padding) */
    d = desc(2048, 5632, PI2_ACT_RELU);
    assert_int_equal(pi2_bl_auto_io_unit(&d, PI2_QT_Q4, d.act == PI2_ACT_DRELU), 32768);
    assert_int_equal(pi2_bl_geometry(&d, PI2_QT_Q4, 32768, d.act == PI2_ACT_DRELU, &f, &e), 0);
    assert_int_equal(f.group, 9);
    /* rows wider than every unit but the largest: the unit that fits */
    d = desc(65536, 64, PI2_ACT_SILU);
    assert_int_equal(pi2_bl_auto_io_unit(&d, PI2_QT_Q8, d.act == PI2_ACT_DRELU), 262144);
    /* dimensions the geometry refuses: the fixed default (the geometry reports) */
    d = desc(0, 64, PI2_ACT_SILU);
    assert_int_equal(pi2_bl_auto_io_unit(&d, PI2_QT_Q4, d.act == PI2_ACT_DRELU), PI2_BL_IO_DEFAULT);
    assert_int_equal(pi2_bl_auto_io_unit(&d, PI2_QT_F32, d.act == PI2_ACT_DRELU), PI2_BL_IO_DEFAULT);

    /* against the rule, on random shapes: the smallest unit from 8K whose
     * reads fit and whose slot is at most 1/8 padding, else the least padded */
    pi2_rng r;
    pi2_rng_seed(&r, 11);
    static const pi2_act acts[3] = { PI2_ACT_RELU, PI2_ACT_DRELU, PI2_ACT_SILU };
    for (int it = 0; it < 400; it++) {
        d = desc(32 * (1 + (int)(pi2_rng_uniform(&r) * 512)), 1 + (int)(pi2_rng_uniform(&r) * 20000),
                 acts[it % 3]);
        pi2_qtype q = it & 4 ? PI2_QT_Q8 : PI2_QT_Q4;
        uint32_t want = PI2_BL_IO_DEFAULT;
        double least = INFINITY;
        for (uint32_t u = 8192; u <= PI2_BL_IO_MAX; u *= 2) {
            bool fits;
            double w = slot_waste(&d, q, u, &fits);
            if (!fits)
                continue;
            if (w <= 0.125 + 1e-12) {
                want = u;
                break;
            }
            if (w < least) {
                least = w;
                want = u;
            }
        }
        uint32_t got = pi2_bl_auto_io_unit(&d, q, d.act == PI2_ACT_DRELU);
        if (got != want)
            fail_msg("hidden %d n_ff %d act %d %s: auto %u, rule %u", d.hidden, d.n_ff, (int)d.act,
                     pi2_q_type_name(q), got, want);
    }
}

static void test_check_perm(void **state)
{
    (void)state;
    pi2_err e = { 0 };
    uint32_t ok[4] = { 2, 0, 3, 1 }, out[4] = { 2, 0, 4, 1 }, dup[4] = { 2, 0, 2, 1 };
    assert_int_equal(pi2_bl_check_perm(ok, 4, "p", &e), 0);
    assert_int_equal(pi2_bl_check_perm(out, 4, "p", &e), PI2_EFORMAT);
    assert_non_null(strstr(e.msg, "entry 2"));
    pi2_err e2 = { 0 };
    assert_int_equal(pi2_bl_check_perm(dup, 4, "p", &e2), PI2_EFORMAT);
    assert_non_null(strstr(e2.msg, "repeats neuron 2"));
}

static void test_hot_count(void **state)
{
    (void)state;
    float f[8] = { 0.9f, 0.1f, 0.5f, NAN, 2.0f, -1.0f, 0.49f, 0.0f };
    assert_int_equal(pi2_order_hot_count(f, 8, 0.5, NAN), 3); /* 0.9, 0.5, 2.0 (clamped to 1) */
    assert_int_equal(pi2_order_hot_count(f, 8, NAN, 0.25), 2);
    assert_int_equal(pi2_order_hot_count(f, 8, NAN, 0.3), 3);
    assert_int_equal(pi2_order_hot_count(f, 8, NAN, 1.0), 8);
    assert_int_equal(pi2_order_hot_count(f, 8, NAN, 0.0), 0);
    assert_int_equal(pi2_order_hot_count(NULL, 8, 0.5, NAN), 0);
}

/* 64 neurons in 16 planted clusters of 4 that fire together on disjoint
 * sample sets, scattered over the index range with interleaved frequencies:
 * the cold groups must be exactly the clusters. */
static void test_order_planted(void **state)
{
    (void)state;
    enum { N = 64, G = 4, S = 512 };
    float freq[N];
    uint64_t bits[S]; /* one word per sample: N = 64 */
    memset(bits, 0, sizeof bits);
    int cluster[N];
    for (int i = 0; i < N; i++)
        cluster[i] = (i * 7) % 16; /* scatter: neuron i belongs to cluster (7i mod 16) */
    for (int s = 0; s < S; s++) {
        int k = s % 17; /* sample s fires cluster k (k = 16: none) */
        for (int i = 0; i < N && k < 16; i++)
            if (cluster[i] == k)
                bits[s] |= 1ull << i;
    }
    for (int i = 0; i < N; i++) {
        int cnt = 0;
        for (int s = 0; s < S; s++)
            cnt += (int)((bits[s] >> i) & 1);
        freq[i] = (float)cnt / S + 1e-4f * (float)(i % 5); /* break ties across clusters */
    }
    uint32_t perm[N], perm2[N];
    pi2_order_stats st;
    pi2_err e = { 0 };
    pi2_order_in in = { N, freq, bits, S, G, 0 };
    assert_int_equal(pi2_order_neurons(&in, perm, &st, &e), 0);
    assert_int_equal(pi2_bl_check_perm(perm, N, "perm", &e), 0);
    assert_true(st.grouped);
    for (int k = 0; k < N; k += G)
        for (int j = 1; j < G; j++)
            assert_int_equal(cluster[perm[k + j]], cluster[perm[k]]);
    assert_true(fabs(st.read_eff - 1.0) < 1e-12);
    assert_true(st.read_eff_freq < 0.5);
    /* deterministic */
    assert_int_equal(pi2_order_neurons(&in, perm2, NULL, &e), 0);
    assert_memory_equal(perm, perm2, sizeof perm);
    /* hot prefix: the 8 most frequent, in frequency order */
    in.hot = 8;
    assert_int_equal(pi2_order_neurons(&in, perm, &st, &e), 0);
    for (int i = 1; i < 8; i++)
        assert_true(freq[perm[i - 1]] >= freq[perm[i]]);
    for (int i = 8; i < N; i++)
        assert_true(freq[perm[7]] >= freq[perm[i]]);
    /* no bits: plain frequency order; no freq: identity */
    in = (pi2_order_in){ N, freq, NULL, 0, G, 0 };
    assert_int_equal(pi2_order_neurons(&in, perm, &st, &e), 0);
    assert_false(st.grouped);
    assert_true(isnan(st.read_eff));
    for (int i = 1; i < N; i++)
        assert_true(freq[perm[i - 1]] >= freq[perm[i]]);
    in.freq = NULL;
    assert_int_equal(pi2_order_neurons(&in, perm, &st, &e), 0);
    for (int i = 0; i < N; i++)
        assert_int_equal(perm[i], i);
    /* all hot, one neuron, group 1 */
    in = (pi2_order_in){ N, freq, bits, S, G, N };
    assert_int_equal(pi2_order_neurons(&in, perm, &st, &e), 0);
    in = (pi2_order_in){ 1, freq, bits, S, 1, 0 };
    assert_int_equal(pi2_order_neurons(&in, perm, &st, &e), 0);
    assert_int_equal(perm[0], 0);
    in = (pi2_order_in){ N, freq, bits, S, 1, 0 };
    assert_int_equal(pi2_order_neurons(&in, perm, &st, &e), 0);
    assert_int_equal(pi2_bl_check_perm(perm, N, "perm", &e), 0);
    /* bad arguments */
    in = (pi2_order_in){ N, freq, NULL, 5, G, 0 };
    assert_int_equal(pi2_order_neurons(&in, perm, &st, &e), PI2_EINVAL);
    in = (pi2_order_in){ N, freq, bits, S, G, N + 1 };
    assert_int_equal(pi2_order_neurons(&in, perm, &st, &e), PI2_EINVAL);
}

/* Random activation bits: the POPCNT grouping and its generic twin give the
 * same permutation, for several group sizes and sample counts. */
static void test_order_twins(void **state)
{
    (void)state;
    enum { N = 300 };
    pi2_rng r;
    pi2_rng_seed(&r, 7);
    float freq[N];
    uint64_t *bits = calloc(700 * 5, sizeof *bits);
    assert_non_null(bits);
    for (int i = 0; i < N; i++)
        freq[i] = (float)pi2_rng_uniform(&r);
    for (int s = 0; s < 700; s++)
        for (int i = 0; i < N; i++)
            if (pi2_rng_uniform(&r) < freq[i] * 0.3)
                bits[s * 5 + i / 64] |= 1ull << (i % 64);
    uint64_t samples[3] = { 1, 64, 700 };
    uint32_t groups[3] = { 2, 3, 17 };
    for (int a = 0; a < 3; a++)
        for (int k = 0; k < 3; k++) {
            uint32_t p1[N], p2[N];
            pi2_order_stats s1, s2;
            pi2_err e = { 0 };
            pi2_order_in in = { N, freq, bits, samples[a], groups[k], groups[k] * 2 };
            assert_int_equal(pi2_order_neurons(&in, p1, &s1, &e), 0);
            pi2_order_force_generic(true);
            assert_int_equal(pi2_order_neurons(&in, p2, &s2, &e), 0);
            pi2_order_force_generic(false);
            assert_memory_equal(p1, p2, sizeof p1);
            assert_true(s1.read_eff == s2.read_eff);
            assert_int_equal(pi2_bl_check_perm(p1, N, "perm", &e), 0);
            if (samples[a] > 1)
                assert_true(s1.read_eff >= s1.read_eff_freq);
        }
    free(bits);
}

/* ------------------------------------------------------------------ */
/* Round trip and layout                                               */
/* ------------------------------------------------------------------ */

/* Every byte of an FFN member not covered by a neuron row is zero; the
 * rows of each neuron sit where bundle/layout.h says (recomputed here from
 * the formulas, not through pi2_bl_neuron_offsets). */
static void check_ffn_member(const pi2_bundle_layout *l, const pi2_bl_ffn *f, const pi2_ctr_member *m)
{
    uint64_t R = l->row_bytes, P = l->pay_bytes, C = R - P, g = f->group;
    uint8_t *covered = calloc((size_t)m->size, 1);
    assert_non_null(covered);
    assert_int_equal(m->size, (uint64_t)f->groups * f->slot_bytes);
    assert_int_equal(f->slot_bytes % 4096, 0);
    assert_int_equal(f->gate_part % 4096, 0);
    assert_int_equal(f->groups, (f->neurons + g - 1) / g);
    assert_int_equal(f->bundle_bytes, l->two_phase ? 2 * P : 3 * R);
    assert_int_equal(f->gate_bytes, l->two_phase ? R + 2 * C : 0);
    if (g > 1)
        assert_true(g * (l->two_phase ? 2 * P : 3 * R) <= l->io_unit && g * f->gate_bytes <= l->io_unit);
    for (uint32_t i = 0; i < f->neurons; i++) {
        uint64_t k = i / g, j = i % g, want[3], wsc[3];
        pi2_bl_rows at;
        pi2_bl_neuron_rows(f, R, P, l->two_phase, i, &at);
        if (l->two_phase) { /* gate unit: gate payload, gate, up, down scales; up+down unit: payloads */
            uint64_t u = k * f->slot_bytes + j * (R + 2 * C);
            want[0] = u;
            want[1] = k * f->slot_bytes + f->gate_part + 2 * j * P;
            want[2] = want[1] + P;
            wsc[0] = u + P;
            wsc[1] = u + R;
            wsc[2] = u + R + C;
            assert_true(u + R + 2 * C <= k * f->slot_bytes + f->gate_part); /* the gate part holds the scales */
        } else {
            want[0] = k * f->slot_bytes + 3 * j * R;
            want[1] = want[0] + R;
            want[2] = want[0] + 2 * R;
            for (int r = 0; r < 3; r++)
                wsc[r] = want[r] + P;
        }
        for (int r = 0; r < 3; r++) {
            assert_int_equal(at.pay[r], want[r]);
            assert_int_equal(at.sc[r], wsc[r]);
            assert_true(want[r] + P <= m->size && wsc[r] + C <= m->size);
            for (uint64_t b = 0; b < P + C; b++) {
                uint64_t o = b < P ? want[r] + b : wsc[r] + b - P;
                assert_int_equal(covered[o], 0); /* rows and scales never overlap */
                covered[o] = 1;
            }
        }
    }
    for (uint64_t b = 0; b < m->size; b++)
        if (!covered[b] && m->data[b] != 0)
            fail_msg("%s: padding byte %llu is not zero", m->name, (unsigned long long)b);
    free(covered);
}

/* io 0: the unit pi2_bl_auto_io_unit picks for the model; two: the
 * layout bundled (two-phase or one-phase) */
static void check_roundtrip(const char *conv, const char *bpath, bool sign, uint32_t io, bool two)
{
    pi2_ctr *cc;
    pi2_manifest *cm;
    pi2t_open_manifest(conv, &cc, &cm);
    pi2_bundle_open_opts oo = { .pubkey = sign ? g_pubkey : NULL, .allow_unsigned = !sign };
    pi2_bundle *b = NULL;
    pi2_err e = { 0 };
    if (pi2_bundle_open(&b, bpath, &oo, &e) || pi2_bundle_verify(b, false, NULL, &e))
        fail_msg("%s", e.msg);
    assert_int_equal(pi2_bundle_sig_status(b), sign ? PI2_BUNDLE_SIG_VERIFIED : PI2_BUNDLE_SIG_UNSIGNED);
    const pi2_manifest *bm = pi2_bundle_manifest(b);
    const pi2_bundle_layout *l = pi2_bundle_layout_get(b);
    const pi2_ctr *bc = pi2_bundle_container(b);
    const pi2_model_desc *d = &bm->config;
    assert_int_equal(bm->kind, PI2_MF_BUNDLED);
    assert_int_equal(l->io_unit, io ? io : pi2_bl_auto_io_unit(d, bm->quant_ffn, l->two_phase));
    assert_int_equal(l->two_phase, two);
    assert_int_equal(l->row_bytes, pi2_q_payload_row_bytes(bm->quant_ffn, d->hidden) + (size_t)d->hidden / 16);
    assert_int_equal(strlen(l->signer), sign ? 64 : 0);
    json_t *bj = json_loads(bm->bundle_json, 0, NULL); /* layout 3 as written */
    assert_non_null(bj);
    assert_int_equal(json_integer_value(json_object_get(bj, "version")), 3);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(json_object_get(bj, "ffn"), 0), "gate_bytes")),
                     l->two_phase ? l->row_bytes + 2 * (l->row_bytes - l->pay_bytes) : 0);
    json_decref(bj);
    size_t E = pi2_desc_is_moe(d) ? (size_t)d->n_experts : 1;
    assert_int_equal(l->n_ffn, (size_t)d->n_layers * E);

    /* member order and alignment: resident (as listed), ffn members, manifest, signature */
    size_t n = pi2_ctr_count(bc), k = 0;
    assert_int_equal(n, bm->n_sections + 1 + (sign ? 1 : 0));
    for (size_t i = 0; i < l->n_resident; i++, k++)
        assert_string_equal(pi2_ctr_at(bc, k)->name, l->resident[i]);
    for (size_t i = 0; i < l->n_ffn; i++, k++)
        assert_string_equal(pi2_ctr_at(bc, k)->name, l->ffn[i].ffn);
    assert_string_equal(pi2_ctr_at(bc, k++)->name, PI2_MF_NAME);
    if (sign)
        assert_string_equal(pi2_ctr_at(bc, k)->name, PI2_MF_SIG_NAME);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(pi2_ctr_at(bc, i)->offset % 4096, 0);

    /* non-FFN tensors: same members, same bytes */
    for (size_t t = 0; t < cm->n_tensors; t++) {
        const pi2_mf_tensor *ct = &cm->tensors[t];
        const pi2_mf_tensor *bt = pi2_manifest_find_tensor(bm, ct->role, ct->layer, ct->expert);
        assert_non_null(bt);
        assert_string_equal(bt->name, ct->name);
        assert_int_equal(bt->rows, ct->rows);
        assert_int_equal(bt->cols, ct->cols);
        assert_int_equal(bt->qtype, ct->qtype);
        bool ffn = ct->role == PI2_T_GATE || ct->role == PI2_T_UP || ct->role == PI2_T_DOWN;
        if (!ffn) {
            const pi2_ctr_member *a = member(cc, ct->payload), *z = member(bc, bt->payload);
            assert_int_equal(a->size, z->size);
            assert_memory_equal(a->data, z->data, (size_t)a->size);
            if (ct->scales[0]) {
                a = member(cc, ct->scales);
                z = member(bc, bt->scales);
                assert_int_equal(a->size, z->size);
                assert_memory_equal(a->data, z->data, (size_t)a->size);
            }
        }
    }

    /* FFNs: every neuron's three rows and scales through the permutation,
     * each row's scales where the layout puts them (after its payload
     * one-phase, in the gate unit two-phase); no FFN scale
     * member left in the container (nor in the resident region) */
    static const pi2_tname roles[3] = { PI2_T_GATE, PI2_T_UP, PI2_T_DOWN };
    size_t R = pi2_q_payload_row_bytes(bm->quant_ffn, d->hidden), sc = (size_t)d->hidden / 32;
    assert_int_equal(l->row_bytes, R + 2 * sc);
    float *x = malloc((size_t)d->hidden * sizeof *x), *y = malloc((size_t)d->hidden * sizeof *y);
    assert_non_null(x);
    assert_non_null(y);
    for (size_t fi = 0; fi < l->n_ffn; fi++) {
        const pi2_bl_ffn *f = &l->ffn[fi];
        const uint32_t *perm = pi2_bundle_perm(b, fi);
        check_ffn_member(l, f, member(bc, f->ffn));
        const pi2_ctr_member *cp[3], *cs[3];
        for (int r = 0; r < 3; r++) {
            const pi2_mf_tensor *ct = pi2_manifest_find_tensor(cm, roles[r], f->layer, f->expert);
            assert_non_null(ct);
            cp[r] = member(cc, ct->payload);
            cs[r] = member(cc, ct->scales);
            const pi2_mf_tensor *bt = pi2_manifest_find_tensor(bm, roles[r], f->layer, f->expert);
            assert_string_equal(bt->payload, f->ffn);
            assert_string_equal(bt->scales, f->ffn);
            assert_null(pi2_ctr_find(bc, ct->scales));
            for (size_t i = 0; i < l->n_resident; i++)
                assert_string_not_equal(l->resident[i], ct->scales);
        }
        for (uint32_t i = 0; i < f->neurons; i++) {
            pi2_bundle_neuron nr;
            assert_int_equal(pi2_bundle_get_neuron(b, fi, i, &nr, &e), 0);
            assert_int_equal(nr.original, perm[i]);
            for (int r = 0; r < 3; r++) {
                const uint8_t *cpay = cp[r]->data + (size_t)perm[i] * R;
                const uint16_t *cscl = (const uint16_t *)(const void *)cs[r]->data + (size_t)perm[i] * sc;
                assert_memory_equal(nr.payload[r], cpay, R);
                assert_memory_equal(nr.scales[r], cscl, sc * 2);
                if (l->two_phase) /* all three behind the gate payload */
                    assert_ptr_equal((const uint8_t *)nr.scales[r], nr.payload[0] + R + (size_t)r * sc * 2);
                else
                    assert_ptr_equal((const uint8_t *)nr.scales[r], nr.payload[r] + R);
                pi2_q_dequantize_row(bm->quant_ffn, cscl, cpay, d->hidden, x);
                pi2_q_dequantize_row(bm->quant_ffn, nr.scales[r], nr.payload[r], d->hidden, y);
                assert_memory_equal(x, y, (size_t)d->hidden * sizeof *x);
            }
        }
        assert_int_equal(pi2_bundle_get_neuron(b, fi, f->neurons, &(pi2_bundle_neuron){ 0 }, &e), PI2_ERANGE);

        /* profile: frequencies and bits permuted; hot prefix = the hottest */
        const pi2_mf_profile *cpf = pi2_manifest_find_profile(cm, f->layer, f->expert);
        const pi2_mf_profile *bpf = pi2_manifest_find_profile(bm, f->layer, f->expert);
        assert_non_null(cpf);
        assert_non_null(bpf);
        const float *cf = (const float *)(const void *)member(cc, cpf->freq)->data;
        const float *bf = (const float *)(const void *)member(bc, bpf->freq)->data;
        uint32_t above = 0;
        for (uint32_t i = 0; i < f->neurons; i++) {
            assert_memory_equal(&bf[i], &cf[perm[i]], sizeof *bf);
            above += cf[i] >= 0.5f;
        }
        assert_int_equal(f->hot_groups, (above + f->group - 1) / f->group);
        for (uint32_t i = 1; i < f->hot_neurons; i++)
            assert_true(bf[i - 1] >= bf[i]);
        for (uint32_t i = f->hot_neurons; f->hot_neurons && i < f->neurons; i++)
            assert_true(bf[f->hot_neurons - 1] >= bf[i]);
        bool grouped = cpf->bit_samples && f->group > 1 && f->hot_neurons < f->neurons;
        assert_int_equal(f->order, grouped ? PI2_BL_ORDER_COACTIVATION : PI2_BL_ORDER_FREQUENCY);
        if (cpf->bits[0]) {
            size_t W = (f->neurons + 63) / 64;
            const uint64_t *cb = (const uint64_t *)(const void *)member(cc, cpf->bits)->data;
            const uint64_t *bb = (const uint64_t *)(const void *)member(bc, bpf->bits)->data;
            for (uint64_t s = 0; s < cpf->bit_samples; s++)
                for (uint32_t i = 0; i < f->neurons; i++)
                    assert_int_equal((bb[s * W + i / 64] >> (i % 64)) & 1,
                                     (cb[s * W + perm[i] / 64] >> (perm[i] % 64)) & 1);
        }

        /* predictor: fc1 unchanged, fc2 rows permuted */
        const pi2_mf_layer *cl = pi2_manifest_find_layer(cm, f->layer, f->expert);
        const pi2_mf_layer *bl = pi2_manifest_find_layer(bm, f->layer, f->expert);
        assert_non_null(cl);
        assert_non_null(bl);
        assert_int_equal(cl->has_predictor, bl->has_predictor);
        if (cl->has_predictor) {
            const pi2_ctr_member *a = member(cc, cl->predictor.fc1), *z = member(bc, bl->predictor.fc1);
            assert_memory_equal(a->data, z->data, (size_t)a->size);
            size_t row = (size_t)cl->predictor.rank * pi2_mf_pred_elem(cl->predictor.dtype);
            a = member(cc, cl->predictor.fc2);
            z = member(bc, bl->predictor.fc2);
            for (uint32_t i = 0; i < f->neurons; i++)
                assert_memory_equal(z->data + i * row, a->data + (size_t)perm[i] * row, row);
        }
    }
    free(x);
    free(y);
    pi2_bundle_close(b);
    pi2_manifest_free(cm);
    pi2_ctr_close(cc);
}

static void test_roundtrip_drelu(void **state)
{
    (void)state;
    check_roundtrip(g_drelu, g_signed, true, 4096, true);
    check_roundtrip(g_drelu, g_unsigned, false, 4096, true);
    /* the automatic unit, 16K (a tiny FFN is then a single group) and the
     * largest, two-phase; the default layout (one-phase) at 4K and auto */
    static const struct { uint32_t io; bool two; } runs[] = {
        { 0, true }, { PI2_BL_IO_DEFAULT, true }, { PI2_BL_IO_MAX, true },
        { 4096, false },   { 0, false },
    };
    char p[160];
    pi2_err e = { 0 };
    snprintf(p, sizeof p, "%s/drelu16.pi2", g_dir);
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
        unlink(p);
        if (pi2t_bundle(g_drelu, p, runs[k].io, runs[k].two, g_key, &e))
            fail_msg("%s", e.msg);
        check_roundtrip(g_drelu, p, true, runs[k].io, runs[k].two);
    }
}

/* SwiGLU, ReGLU q8 and MoE at the default layout (one-phase); MoE two-phase
 * too; a two-phase layout asked of a SwiGLU model is refused */
static void test_roundtrip_silu_q8_moe(void **state)
{
    (void)state;
    const char *in[4] = { g_silu, g_q8, g_moe, g_moe };
    for (int k = 0; k < 4; k++) {
        char p[160];
        pi2_err e = { 0 };
        snprintf(p, sizeof p, "%s/rt%d.pi2", g_dir, k);
        if (pi2t_bundle(in[k], p, 4096, k == 3, g_key, &e))
            fail_msg("%s: %s", in[k], e.msg);
        check_roundtrip(in[k], p, true, 4096, k == 3);
    }
    char p[160];
    pi2_err e = { 0 };
    snprintf(p, sizeof p, "%s/rt-silu2.pi2", g_dir);
    assert_int_equal(pi2t_bundle(g_silu, p, 4096, true, g_key, &e), PI2_EINVAL);
    assert_non_null(strstr(e.msg, "two-phase layout is for drelu only (activation silu)"));
    assert_int_equal(access(p, F_OK), -1);
}

/* --hot-share: each FFN's hot prefix is ceil(share * n) rounded up to whole
 * groups; the bundle is identical whatever the thread count; bundling the
 * same input twice gives the same bytes (Ed25519 signatures are
 * deterministic). */
static void test_hot_share_determinism(void **state)
{
    (void)state;
    char a[160], b2[160];
    pi2_err e = { 0 };
    snprintf(a, sizeof a, "%s/share1.pi2", g_dir);
    snprintf(b2, sizeof b2, "%s/share2.pi2", g_dir);
    pi2_bundle_opts o;
    pi2_bundle_defaults(&o);
    o.in_path = g_drelu;
    o.out_path = a;
    o.key = g_key;
    o.io_unit = 4096;
    o.hot_share = 0.3;
    o.threads = 1;
    o.quiet = true;
    if (pi2_bundle_create(&o, NULL, &e))
        fail_msg("%s", e.msg);
    o.out_path = b2;
    o.threads = 2;
    if (pi2_bundle_create(&o, NULL, &e))
        fail_msg("%s", e.msg);
    pi2_map x = { 0 }, y = { 0 };
    assert_int_equal(pi2_map_open(&x, a, &e), 0);
    assert_int_equal(pi2_map_open(&y, b2, &e), 0);
    assert_int_equal(x.size, y.size);
    assert_memory_equal(x.data, y.data, x.size);
    pi2_map_close(&x);
    pi2_map_close(&y);
    pi2_bundle *b = open_signed(a);
    const pi2_bundle_layout *l = pi2_bundle_layout_get(b);
    assert_true(isnan(l->hot_min_freq));
    assert_true(l->hot_share == 0.3);
    for (size_t i = 0; i < l->n_ffn; i++) {
        uint32_t want = (uint32_t)ceil(0.3 * l->ffn[i].neurons);
        assert_int_equal(l->ffn[i].hot_groups, (want + l->ffn[i].group - 1) / l->ffn[i].group);
    }
    pi2_bundle_close(b);
}

static void test_inspect(void **state)
{
    (void)state;
    pi2_bundle_open_opts o = { .allow_unsigned = true, .skip_signature = true };
    const char *paths[2] = { g_signed, g_unsigned };
    for (int k = 0; k < 2; k++) {
        pi2_bundle *b = NULL;
        pi2_err e = { 0 };
        if (pi2_bundle_open(&b, paths[k], &o, &e))
            fail_msg("%s", e.msg);
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        assert_non_null(f);
        assert_int_equal(pi2_bundle_inspect(b, f, &e), 0);
        fclose(f);
        assert_non_null(strstr(buf, "bamboo (drelu)"));
        /* end of turn with its text from the container's tokenizer; BOS ends it too */
        assert_non_null(strstr(buf, "\ntokens:     end of turn 2 \"</s>\"; BOS 1 \"<s>\" ends it too; tokenizer "));
        assert_null(strstr(buf, "padded rows"));
        assert_non_null(strstr(buf, "two-phase"));
        assert_non_null(strstr(buf, "predictors: 2"));
        assert_non_null(strstr(buf, "profile:"));
        assert_non_null(strstr(buf, k == 0 ? "not checked here" : "UNSIGNED"));
        free(buf);
        pi2_bundle_close(b);
    }
}

/* Whole file as a NUL-terminated string (NULL if absent). */
static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t cap = 0, n = 0, r;
    do {
        if (n + 4096 + 1 > cap) {
            cap = 2 * cap + 8192;
            buf = realloc(buf, cap);
            assert_non_null(buf);
        }
        r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
    } while (r > 0);
    fclose(f);
    buf[n] = 0;
    *len = n;
    return buf;
}

static size_t count_str(const char *s, const char *needle)
{
    size_t n = 0;
    for (const char *p = s; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

/* A temporary sibling of path (pi2_afile's "<path>.tmp.") left in dir? */
static bool tmp_left(const char *dir, const char *base)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    bool found = false;
    size_t n = strlen(base);
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (strncmp(e->d_name, base, n) == 0 && strstr(e->d_name, ".tmp."))
            found = true;
    closedir(d);
    return found;
}

static void test_inspect_svg(void **state)
{
    (void)state;
    pi2_bundle_open_opts o = { .allow_unsigned = true, .skip_signature = true };
    pi2_bundle *b = NULL;
    pi2_err e = { 0 };
    if (pi2_bundle_open(&b, g_signed, &o, &e))
        fail_msg("%s", e.msg);
    const pi2_bundle_layout *l = pi2_bundle_layout_get(b);
    char out[160];
    snprintf(out, sizeof out, "%s/report.svg", g_dir);
    if (pi2_bundle_report_svg_write(b, out, &e))
        fail_msg("%s", e.msg);
    size_t len = 0;
    char *svg = slurp(out, &len);
    assert_non_null(svg);
    assert_true(len > 1000);
    assert_int_equal(strncmp(svg, "<svg ", 5), 0);
    assert_string_equal(svg + len - 7, "</svg>\n");
    assert_int_equal(count_str(svg, "<svg"), 1);
    assert_int_equal(count_str(svg, "<polyline"), l->n_ffn); /* one curve per FFN, nothing else */
    assert_int_equal(count_str(svg, "<polyline"), count_str(svg, "</polyline>"));
    assert_int_equal(count_str(svg, "<g"), count_str(svg, "</g>"));
    for (size_t i = 0; i < l->n_ffn; i++) {
        char lab[32];
        snprintf(lab, sizeof lab, ">layer %d<", l->ffn[i].layer); /* legend entry */
        assert_non_null(strstr(svg, lab));
        snprintf(lab, sizeof lab, "<title>layer %d:", l->ffn[i].layer); /* the curve's title */
        assert_non_null(strstr(svg, lab));
    }
    assert_non_null(strstr(svg, "recall"));
    assert_non_null(strstr(svg, "ffn q4, other q8"));
    assert_null(strstr(svg, "nan"));
    assert_null(strstr(svg, "inf"));
    assert_null(strstr(svg, "NaN"));
    assert_null(strstr(svg, "<script"));
    assert_null(strstr(svg, "href"));
    free(svg);

    /* manifest text is escaped: a source with every XML special character */
    pi2_manifest *m = (pi2_manifest *)pi2_bundle_manifest(b); /* a plain struct; tests may edit it */
    char saved[PI2_MF_STR_MAX];
    memcpy(saved, m->source, sizeof saved);
    snprintf(m->source, sizeof m->source, "a<&>\"'b");
    char *buf = NULL;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    assert_int_equal(pi2_bundle_report_svg(b, f, &e), 0);
    fclose(f);
    assert_non_null(strstr(buf, "a&lt;&amp;&gt;&quot;&apos;b"));
    assert_null(strstr(buf, "a<&"));
    free(buf);
    memcpy(m->source, saved, sizeof saved);

    /* an unwritable path: the error names it, nothing is left behind */
    char bad[200];
    snprintf(bad, sizeof bad, "%s/no-such-dir/r.svg", g_dir);
    assert_int_equal(pi2_bundle_report_svg_write(b, bad, &e), PI2_EIO);
    assert_non_null(strstr(e.msg, bad));
    assert_false(pi2t_exists(bad));
    /* a full disk part way: nothing at the path, no temporary left */
    snprintf(bad, sizeof bad, "%s/full.svg", g_dir);
    pi2_err_clear(&e);
    pi2_afile_fail_after(100);
    assert_int_equal(pi2_bundle_report_svg_write(b, bad, &e), PI2_ENOSPC);
    pi2_afile_fail_after(-1);
    assert_non_null(strstr(e.msg, bad));
    assert_false(pi2t_exists(bad));
    assert_false(tmp_left(g_dir, "full.svg"));
    assert_false(tmp_left(g_dir, "report.svg"));
    pi2_bundle_close(b);
}

/* ------------------------------------------------------------------ */
/* Tamper matrix                                                        */
/* ------------------------------------------------------------------ */

static void test_tamper_each_section(void **state)
{
    (void)state;
    char p[160];
    snprintf(p, sizeof p, "%s/tamper.pi2", g_dir);
    pi2_ctr *c;
    pi2_err e = { 0 };
    if (pi2_ctr_open(&c, g_signed, &e))
        fail_msg("%s", e.msg);
    size_t n = pi2_ctr_count(c);
    for (size_t i = 0; i < n; i++) {
        const pi2_ctr_member *m = pi2_ctr_at(c, i);
        pi2t_copy_file(g_signed, p);
        xor_byte(p, m->offset + m->size / 2, 0x01);
        /* a section names itself; the manifest and signature fail the signature */
        bool meta = strcmp(m->name, PI2_MF_NAME) == 0 || strcmp(m->name, PI2_MF_SIG_NAME) == 0;
        expect_fail(p, g_pubkey, false, PI2_ESIG, meta ? PI2_MF_SIG_NAME : m->name);
        /* and a flipped byte of its tar header breaks the structure */
        pi2t_copy_file(g_signed, p);
        xor_byte(p, m->offset - 512 + (i * 37) % 512, 0x40);
        expect_fail(p, g_pubkey, false, PI2_EFORMAT, NULL);
    }
    pi2_ctr_close(c);
}

/* verify(resident_only) hashes the resident region only: a flipped FFN
 * byte passes it and fails the full check; a flipped resident byte fails
 * both. */
static void test_verify_resident_only(void **state)
{
    (void)state;
    char p[160];
    snprintf(p, sizeof p, "%s/resident.pi2", g_dir);
    pi2_ctr *c;
    pi2_err e = { 0 };
    assert_int_equal(pi2_ctr_open(&c, g_signed, &e), 0);
    const char *names[2] = { "ffn/1.0", "w/model.layers.1.self_attn.o_proj.weight.s" };
    for (int k = 0; k < 2; k++) {
        const pi2_ctr_member *m = member(c, names[k]);
        pi2t_copy_file(g_signed, p);
        xor_byte(p, m->offset + 5, 0x80);
        pi2_bundle *b = open_signed(p);
        uint64_t done = 0;
        pi2_err e1 = { 0 }, e2 = { 0 };
        int r1 = pi2_bundle_verify(b, true, &done, &e1), r2 = pi2_bundle_verify(b, false, NULL, &e2);
        assert_int_equal(r1, k == 0 ? 0 : PI2_ESIG);
        assert_int_equal(r2, PI2_ESIG);
        assert_non_null(strstr(e2.msg, names[k]));
        if (k == 0) {
            uint64_t resident = 0;
            const pi2_bundle_layout *l = pi2_bundle_layout_get(b);
            for (size_t i = 0; i < l->n_resident; i++)
                resident += member(c, l->resident[i])->size;
            assert_int_equal(done, resident);
        }
        pi2_bundle_close(b);
    }
    pi2_ctr_close(c);
}

/* verify_copy checks the resident members in a copy of the file read
 * apart: the copy as read passes; a flipped byte of a resident member
 * fails naming it (an FFN byte is not looked at, nor one of a member
 * verify_copy_except skips); a copy that stops inside the last resident
 * member is a format error. */
static void test_verify_copy(void **state)
{
    (void)state;
    pi2_bundle *b = open_signed(g_signed);
    const pi2_ctr *c = pi2_bundle_container(b);
    const pi2_bundle_layout *l = pi2_bundle_layout_get(b);
    uint64_t end = 0;
    for (size_t i = 0; i < l->n_resident; i++) {
        const pi2_ctr_member *m = member(c, l->resident[i]);
        end = m->offset + m->size > end ? m->offset + m->size : end;
    }
    const pi2_ctr_member *ffn = member(c, l->ffn[0].ffn);
    uint64_t len = ffn->offset + ffn->size;
    uint8_t *copy = malloc((size_t)len);
    assert_non_null(copy);
    int fd = open(g_signed, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, copy, (size_t)len, 0), (ssize_t)len);
    close(fd);
    pi2_err e = { 0 };
    assert_int_equal(pi2_bundle_verify_copy(b, copy, len, &e), 0);
    copy[ffn->offset + 7] ^= 0x10;
    assert_int_equal(pi2_bundle_verify_copy(b, copy, len, &e), 0);
    const pi2_ctr_member *r = member(c, "w/model.layers.1.self_attn.o_proj.weight.s");
    copy[r->offset + r->size / 2] ^= 0x01;
    assert_int_equal(pi2_bundle_verify_copy(b, copy, len, &e), PI2_ESIG);
    assert_non_null(strstr(e.msg, r->name));
    assert_non_null(strstr(e.msg, "SHA-256"));
    /* a member left to the caller (streamed predictors) is not looked at;
     * the others still are */
    const char *skip[1] = { r->name };
    pi2_err e3 = { 0 };
    assert_int_equal(pi2_bundle_verify_copy_except(b, copy, len, skip, 1, &e3), 0);
    const pi2_ctr_member *r2 = member(c, "w/model.layers.0.self_attn.q_proj.weight.s");
    copy[r2->offset] ^= 0x01;
    assert_int_equal(pi2_bundle_verify_copy_except(b, copy, len, skip, 1, &e3), PI2_ESIG);
    assert_non_null(strstr(e3.msg, r2->name));
    copy[r2->offset] ^= 0x01;
    copy[r->offset + r->size / 2] ^= 0x01;
    pi2_err e2 = { 0 };
    assert_int_equal(pi2_bundle_verify_copy(b, copy, end - 1, &e2), PI2_EFORMAT);
    assert_non_null(strstr(e2.msg, "past"));
    free(copy);
    pi2_bundle_close(b);
}

static void test_tamper_truncate(void **state)
{
    (void)state;
    char p[160];
    snprintf(p, sizeof p, "%s/trunc.pi2", g_dir);
    uint64_t size = file_size(g_signed);
    uint64_t cuts[] = { 0, 1, 511, 512, 4096, size / 3, size / 2, size - 4096, size - 1024, size - 1 };
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        pi2t_copy_file(g_signed, p);
        assert_int_equal(truncate(p, (off_t)cuts[i]), 0);
        pi2_err e = { 0 };
        int rc = open_verify(p, false, g_pubkey, &e);
        if (rc != PI2_EFORMAT)
            fail_msg("cut at %llu: %d %s", (unsigned long long)cuts[i], rc, e.msg);
        assert_non_null(strstr(e.msg, p));
    }
}

static void test_tamper_keys(void **state)
{
    (void)state;
    /* another key */
    pi2_sign_key *pub2 = NULL;
    pi2_err e = { 0 };
    assert_int_equal(pi2_sign_key_load_public(&pub2, g_pub2, &e), 0);
    expect_fail(g_signed, pub2, false, PI2_ESIG, "another key");
    expect_fail(g_signed, pub2, true, PI2_ESIG, "another key");
    /* re-signed with the other key: fails with the first, passes with it */
    char p[160];
    snprintf(p, sizeof p, "%s/resigned.pi2", g_dir);
    json_t *j = manifest_json(g_signed);
    rewrite_manifest(g_signed, p, j, g_key2);
    expect_fail(p, g_pubkey, false, PI2_ESIG, "does not verify");
    pi2_err e2 = { 0 };
    assert_int_equal(open_verify(p, false, pub2, &e2), 0);
    json_decref(j);
    /* unsigned: refused unless allowed, reported as unsigned */
    expect_fail(g_unsigned, g_pubkey, false, PI2_ESIG, "unsigned");
    assert_int_equal(open_verify(g_unsigned, true, g_pubkey, &e), 0);
    assert_int_equal(open_verify(g_unsigned, true, NULL, &e), 0);
    /* the signature stripped from a signed container */
    snprintf(p, sizeof p, "%s/stripped.pi2", g_dir);
    pi2_ctr *c;
    assert_int_equal(pi2_ctr_open(&c, g_signed, &e), 0);
    const pi2_ctr_member *mj = member(c, PI2_MF_NAME);
    rewrite(g_signed, p, 0, 0, (const char *)mj->data, (size_t)mj->size, NULL);
    pi2_ctr_close(c);
    expect_fail(p, g_pubkey, false, PI2_ESIG, "unsigned");
    /* a signed container opened without a key and without skip_signature */
    pi2_bundle *b = NULL;
    pi2_bundle_open_opts o = { 0 };
    assert_int_equal(pi2_bundle_open(&b, g_signed, &o, &e), PI2_EINVAL);
    assert_null(b);
    pi2_sign_key_free(pub2);
}

static void test_tamper_members(void **state)
{
    (void)state;
    char p[160];
    pi2_err e = { 0 };
    snprintf(p, sizeof p, "%s/members.pi2", g_dir);
    pi2_ctr *c;
    assert_int_equal(pi2_ctr_open(&c, g_signed, &e), 0);
    const pi2_ctr_member *mj = member(c, PI2_MF_NAME), *ms = member(c, PI2_MF_SIG_NAME);
    /* reordered members under the original, validly signed manifest */
    rewrite(g_signed, p, 1, 2, (const char *)mj->data, (size_t)mj->size, ms->data);
    expect_fail(p, g_pubkey, false, PI2_EFORMAT, "manifest says offset");
    /* a duplicate member name: rename member 2's header to member 1's */
    pi2t_copy_file(g_signed, p);
    {
        const pi2_ctr_member *m1 = pi2_ctr_at(c, 1), *m2 = pi2_ctr_at(c, 2);
        uint8_t h[512];
        int fd = open(p, O_RDWR);
        assert_true(fd >= 0);
        assert_int_equal(pread(fd, h, 512, (off_t)(m2->offset - 512)), 512);
        memset(h, 0, 100);
        memcpy(h, m1->name, strlen(m1->name));
        memset(h + 148, ' ', 8);
        unsigned sum = 0;
        for (int i = 0; i < 512; i++)
            sum += h[i];
        snprintf((char *)h + 148, 8, "%06o", sum);
        h[155] = ' ';
        assert_int_equal(pwrite(fd, h, 512, (off_t)(m2->offset - 512)), 512);
        close(fd);
    }
    expect_fail(p, g_pubkey, false, PI2_EFORMAT, "duplicate");
    /* an extra member the manifest does not list */
    {
        pi2_ctr_writer *w;
        assert_int_equal(pi2_ctr_writer_create(&w, p, &e), 0);
        for (size_t i = 0; i < pi2_ctr_count(c); i++) {
            const pi2_ctr_member *m = pi2_ctr_at(c, i);
            if (strcmp(m->name, PI2_MF_NAME) == 0)
                assert_int_equal(pi2_ctr_writer_add(w, "extra", "x", 1, &e), 0);
            assert_int_equal(pi2_ctr_writer_add(w, m->name, m->data, (size_t)m->size, &e), 0);
        }
        assert_int_equal(pi2_ctr_writer_finish(w, &e), 0);
        pi2_ctr_writer_free(w);
    }
    expect_fail(p, g_pubkey, false, PI2_EFORMAT, "extra");
    pi2_ctr_close(c);

    /* offsets outside the file and overlapping, in a validly signed manifest */
    json_t *j = manifest_json(g_signed);
    json_t *secs = json_object_get(j, "sections");
    size_t ns = json_array_size(secs);
    json_t *last = json_array_get(secs, ns - 1);
    json_object_set_new(last, "offset", json_integer((json_int_t)(file_size(g_signed) + 40960)));
    rewrite_manifest(g_signed, p, j, g_key);
    expect_fail(p, g_pubkey, false, PI2_EFORMAT, "points outside the file");
    json_decref(j);
    j = manifest_json(g_signed);
    secs = json_object_get(j, "sections");
    size_t k = 1;
    while (k < ns && json_integer_value(json_object_get(json_array_get(secs, k - 1), "size")) <= 4096)
        k++;
    assert_true(k < ns);
    json_t *prev = json_array_get(secs, k - 1);
    json_object_set_new(json_array_get(secs, k), "offset",
                        json_integer(json_integer_value(json_object_get(prev, "offset")) + 4096));
    rewrite_manifest(g_signed, p, j, g_key);
    expect_fail(p, g_pubkey, false, PI2_EFORMAT, "overlaps");
    json_decref(j);
    /* a permutation that is not one (re-signed, digest updated) */
    j = manifest_json(g_signed);
    secs = json_object_get(j, "sections");
    assert_int_equal(pi2_ctr_open(&c, g_signed, &e), 0);
    {
        pi2_ctr_writer *w;
        const char *pname = "perm/1.0";
        const pi2_ctr_member *pm = member(c, pname);
        uint32_t *bad = malloc((size_t)pm->size);
        assert_non_null(bad);
        memcpy(bad, pm->data, (size_t)pm->size);
        bad[3] = bad[4];
        uint8_t dg[PI2_SHA256_LEN];
        char hex[PI2_SHA256_HEX_LEN];
        assert_int_equal(pi2_sha256(bad, (size_t)pm->size, dg, &e), 0);
        pi2_sha256_hex(dg, hex);
        for (size_t i = 0; i < ns; i++)
            if (strcmp(json_string_value(json_object_get(json_array_get(secs, i), "name")), pname) == 0)
                json_object_set_new(json_array_get(secs, i), "sha256", json_string(hex));
        char *text = json_dumps(j, JSON_PRESERVE_ORDER);
        uint8_t sig[PI2_SIG_LEN];
        assert_int_equal(pi2_sign(g_key, text, strlen(text), sig, &e), 0);
        assert_int_equal(pi2_ctr_writer_create(&w, p, &e), 0);
        for (size_t i = 0; i < pi2_ctr_count(c); i++) {
            const pi2_ctr_member *m = pi2_ctr_at(c, i);
            if (strcmp(m->name, PI2_MF_NAME) == 0 || strcmp(m->name, PI2_MF_SIG_NAME) == 0)
                continue;
            const void *data = strcmp(m->name, pname) == 0 ? (const void *)bad : (const void *)m->data;
            assert_int_equal(pi2_ctr_writer_add(w, m->name, data, (size_t)m->size, &e), 0);
        }
        assert_int_equal(pi2_ctr_writer_add(w, PI2_MF_NAME, text, strlen(text), &e), 0);
        assert_int_equal(pi2_ctr_writer_add(w, PI2_MF_SIG_NAME, sig, sizeof sig, &e), 0);
        assert_int_equal(pi2_ctr_writer_finish(w, &e), 0);
        pi2_ctr_writer_free(w);
        free(text);
        free(bad);
    }
    pi2_ctr_close(c);
    json_decref(j);
    expect_fail(p, g_pubkey, false, PI2_EFORMAT, "not a permutation");
}

/* Handcrafted bundle objects: each edit of the real one must fail with its
 * exact code (the manifest around it is re-signed, so only the layout
 * reader stands in the way). */
typedef struct bl_case {
    const char *what;
    int code;
    const char *needle;
} bl_case;

static int edit_layout(json_t *bl, int which)
{
    json_t *f0 = json_array_get(json_object_get(bl, "ffn"), 0), *f1 = json_array_get(json_object_get(bl, "ffn"), 1);
    json_t *res = json_object_get(bl, "resident");
#define IADD(o, k, v) json_object_set_new((o), (k), json_integer(json_integer_value(json_object_get((o), (k))) + (v)))
    switch (which) {
    case 0: return json_object_set_new(bl, "extra", json_true());
    case 1: return json_object_del(bl, "io_unit");
    case 2: return json_object_set_new(bl, "version", json_integer(4));
    case 3: return json_object_set_new(bl, "io_unit", json_integer(2048));
    case 4: return json_object_set_new(bl, "io_unit", json_integer(12288));
    case 5: return IADD(bl, "row_bytes", 1);
    case 6: return json_object_set_new(bl, "two_phase", json_false());
    case 7: return json_object_set_new(json_object_get(bl, "hot_rule"), "min_freq", json_null());
    case 8: return json_object_set_new(bl, "signer", json_string("abc"));
    case 9: return json_array_remove(json_object_get(bl, "ffn"), 1);
    case 10: return json_object_set_new(f0, "group", json_integer(1000));
    case 11: return IADD(f0, "slot_bytes", 4096);
    case 12: return IADD(f0, "hot_groups", 1);
    case 13: return json_object_set_new(f0, "perm", json_string("perm/9.0"));
    case 14: return json_object_set_new(f0, "perm", json_string(json_string_value(json_object_get(f0, "ffn"))));
    case 15: return json_array_remove(res, 0);
    case 16: {
        json_t *a = json_deep_copy(json_array_get(res, 0));
        json_array_set(res, 0, json_array_get(res, 1));
        return json_array_set_new(res, 1, a);
    }
    case 17: return json_object_set_new(f0, "order", json_string("random"));
    case 18: return json_object_set_new(f0, "read_efficiency", json_real(2.0));
    case 19: return json_object_set_new(f0, "layer", json_integer(1)), json_object_set_new(f1, "layer", json_integer(0));
    case 20: return json_object_set_new(f0, "hot", json_pack("[ii]", 0, 1));
    case 21: return json_object_set_new(f0, "cold", json_string("x"));
    case 22: return json_object_set_new(f0, "neurons", json_integer(255));
    case 23: return json_object_set_new(f0, "perm", json_string(json_string_value(json_object_get(f1, "perm"))));
    case 24: return json_object_set_new(bl, "align", json_integer(512));
    case 25: return json_object_set_new(f0, "group", json_integer(65)); /* a read of 65 * 64 > 4096 */
    case 26: return json_object_set_new(bl, "version", json_integer(1)); /* scales apart: older writers */
    case 27: return json_object_set_new(bl, "version", json_integer(2)); /* scales beside every row */
    /* a gate unit too small for the up and down scales (version 2's R) */
    case 28: return json_object_set_new(f0, "gate_bytes", json_integer(36));
    case 29: return IADD(f0, "gate_part", -4096); /* no room for the gate units */
    case 30: return json_object_set_new(f0, "bundle_bytes", json_integer(72)); /* version 2's 2R */
    case 31: return json_object_del(f0, "gate_bytes");
    case 32: return json_object_set_new(f1, "gate_bytes", json_integer(0)); /* one-phase's, on a dReLU model */
    }
#undef IADD
    return -1;
}

static void test_layout_errors(void **state)
{
    (void)state;
    static const bl_case cases[] = {
        { "unknown key", PI2_EFORMAT, "extra: unknown key" },
        { "missing key", PI2_ENOTFOUND, "io_unit: required" },
        { "version", PI2_EUNSUPPORTED, "version" },
        { "io unit range", PI2_ERANGE, "io_unit" },
        { "io unit power", PI2_ERANGE, "power of two" },
        { "row bytes", PI2_ESHAPE, "row_bytes" },
        { "two phase", PI2_ESHAPE, "a read of 6912 bytes exceeds io_unit 4096" },
        { "hot rule", PI2_EFORMAT, "exactly one" },
        { "signer", PI2_EFORMAT, "signer" },
        { "ffn count", PI2_ESHAPE, "one per layer" },
        { "group", PI2_ESHAPE, "group 1000" },
        { "slot", PI2_ESHAPE, "slot_bytes" },
        { "hot groups", PI2_ESHAPE, "hot_neurons" },
        { "perm missing", PI2_ENOTFOUND, "perm/9.0" },
        { "perm = ffn", PI2_ESHAPE, "uint32 [256]" },
        { "resident missing", PI2_ESHAPE, "resident" },
        { "resident order", PI2_EFORMAT, "next non-FFN section" },
        { "order", PI2_EUNSUPPORTED, "order: unknown value \"random\"" },
        { "efficiency", PI2_ERANGE, "read_efficiency" },
        { "ffn order", PI2_EFORMAT, "out of order" },
        { "hot region", PI2_ESHAPE, "hot region" },
        { "cold type", PI2_EFORMAT, "cold" },
        { "neurons", PI2_ESHAPE, "neurons 255" },
        { "shared perm", PI2_EFORMAT, "used by two entries" },
        { "align", PI2_EUNSUPPORTED, "align" },
        { "group read", PI2_ESHAPE, "exceeds io_unit" },
        { "version 1", PI2_EUNSUPPORTED, "layout.pi2:manifest.json: bundle.version: layout 1 (FFN scales resident)" },
        { "version 2", PI2_EUNSUPPORTED, "bundle.version: layout 2 (scales beside every row) is no longer read "
                                         "(this build reads 3, two-phase up and down scales in the gate part): "
                                         "bundle the converted model again" },
        { "gate unit", PI2_ESHAPE, "bundle.ffn[0]: gate_bytes 36, expected 44 (the gate row and the up and down "
                                   "scales)" },
        { "gate part", PI2_ESHAPE, "bundle.ffn[0]: gate_part 0, expected 4096" },
        { "up+down", PI2_ESHAPE, "bundle.ffn[0]: bundle_bytes 72, expected 64" },
        { "gate bytes key", PI2_ENOTFOUND, "gate_bytes: required" },
        { "gate bytes 0", PI2_ESHAPE, "bundle.ffn[1]: gate_bytes 0, expected 44" },
    };
    char p[160];
    snprintf(p, sizeof p, "%s/layout.pi2", g_dir);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *j = manifest_json(g_signed);
        assert_int_equal(edit_layout(json_object_get(j, "bundle"), (int)i), 0);
        rewrite_manifest(g_signed, p, j, g_key);
        json_decref(j);
        pi2_err e = { 0 };
        int rc = open_verify(p, false, g_pubkey, &e);
        if (rc != cases[i].code || !strstr(e.msg, cases[i].needle))
            fail_msg("case %zu (%s): got %d (%s), want %d with \"%s\"", i, cases[i].what, rc, e.msg, cases[i].code,
                     cases[i].needle);
    }
    /* two-phase claimed by a SwiGLU model's bundle */
    char silu[160];
    pi2_err se = { 0 };
    snprintf(silu, sizeof silu, "%s/layout-silu.pi2", g_dir);
    if (pi2t_bundle(g_silu, silu, 4096, false, g_key, &se))
        fail_msg("%s", se.msg);
    json_t *js = manifest_json(silu);
    json_object_set_new(json_object_get(js, "bundle"), "two_phase", json_true());
    rewrite_manifest(silu, p, js, g_key);
    json_decref(js);
    assert_int_equal(open_verify(p, false, g_pubkey, &se), PI2_EFORMAT);
    assert_non_null(strstr(se.msg, "two_phase: true for activation silu (two-phase is for drelu only)"));
    /* an FFN tensor whose scales are not its slots: refused by the layout */
    json_t *j = manifest_json(g_signed), *ts = json_object_get(j, "tensors");
    bool edited = false;
    for (size_t i = 0; i < json_array_size(ts) && !edited; i++) {
        json_t *t = json_array_get(ts, i);
        if (strcmp(json_string_value(json_object_get(t, "role")), "up") == 0)
            edited = json_object_set_new(t, "scales", json_string("perm/0.0")) == 0;
    }
    assert_true(edited);
    rewrite_manifest(g_signed, p, j, g_key);
    json_decref(j);
    pi2_err e = { 0 };
    assert_int_equal(open_verify(p, false, g_pubkey, &e), PI2_EFORMAT);
    assert_non_null(strstr(e.msg, "scales are \"perm/0.0\", not the FFN member"));
}

/* Seeded mutations: random byte flips anywhere in a signed container, in tar
 * headers, truncations (all must fail: every byte is covered by the
 * structure, a digest or the signature); byte flips in the manifest of an
 * unsigned one; and random edits of the bundle object's text and numbers.
 * The reader must never crash (ASan/UBSan builds run this too). */
static void test_mutations(void **state)
{
    (void)state;
    char p[160];
    snprintf(p, sizeof p, "%s/mut.pi2", g_dir);
    pi2_rng rng;
    pi2_rng_seed(&rng, 20240611);
    uint64_t size = file_size(g_signed);
    pi2_ctr *c, *cu;
    pi2_err e = { 0 };
    assert_int_equal(pi2_ctr_open(&c, g_signed, &e), 0);
    assert_int_equal(pi2_ctr_open(&cu, g_unsigned, &e), 0);
    size_t nm = pi2_ctr_count(c);
    const pi2_ctr_member *umj = member(cu, PI2_MF_NAME);
    int failed[4] = { 0 }, tried[4] = { 0 };
    for (int it = 0; it < 240; it++) {
        int kind = it % 4;
        const char *src = kind == 3 ? g_unsigned : g_signed;
        pi2t_copy_file(src, p);
        if (kind == 0) { /* anywhere */
            int flips = 1 + (int)(pi2_rng_u64(&rng) % 4);
            for (int f = 0; f < flips; f++)
                xor_byte(p, pi2_rng_u64(&rng) % size, (uint8_t)(1 + pi2_rng_u64(&rng) % 255));
        } else if (kind == 1) { /* a tar header */
            const pi2_ctr_member *m = pi2_ctr_at(c, pi2_rng_u64(&rng) % nm);
            uint64_t off = m->offset - 512 + pi2_rng_u64(&rng) % 512;
            uint8_t x = (uint8_t)(1 + pi2_rng_u64(&rng) % 255);
            if (off % 512 >= 148 && off % 512 < 156) /* chksum: NUL and space end it alike */
                x = 0x01;
            xor_byte(p, off, x);
        } else if (kind == 2) { /* truncate */
            assert_int_equal(truncate(p, (off_t)(pi2_rng_u64(&rng) % size)), 0);
        } else { /* the unsigned manifest's text */
            int flips = 1 + (int)(pi2_rng_u64(&rng) % 3);
            for (int f = 0; f < flips; f++)
                xor_byte(p, umj->offset + pi2_rng_u64(&rng) % umj->size, (uint8_t)(1 + pi2_rng_u64(&rng) % 255));
        }
        pi2_err me = { 0 };
        int rc = open_verify(p, kind == 3, kind == 3 ? NULL : g_pubkey, &me);
        tried[kind]++;
        failed[kind] += rc != 0;
        if (rc != 0)
            assert_true(strlen(me.msg) > 0);
        if (kind != 3 && rc == 0)
            fail_msg("mutation %d (kind %d) was not detected", it, kind);
    }
    fprintf(stderr, "  [container mutations: %d/%d %d/%d %d/%d %d/%d rejected]\n", failed[0], tried[0], failed[1],
            tried[1], failed[2], tried[2], failed[3], tried[3]);
    pi2_ctr_close(cu);
    pi2_ctr_close(c);

    /* the bundle object itself: text and number edits */
    pi2_bundle *b = open_signed(g_signed);
    const pi2_manifest *bm = pi2_bundle_manifest(b);
    pi2_manifest *m2 = NULL;
    char *text;
    size_t len;
    assert_int_equal(pi2_manifest_to_json(bm, &text, &len, &e), 0);
    assert_int_equal(pi2_manifest_parse(text, len, "m", &m2, &e), 0);
    free(text);
    char *orig = pi2_strdup(m2->bundle_json);
    size_t olen = strlen(orig);
    int rejected = 0;
    for (int it = 0; it < 200; it++) {
        char *t = pi2_strdup(orig);
        if (it % 2 == 0) {
            int flips = 1 + (int)(pi2_rng_u64(&rng) % 3);
            for (int f = 0; f < flips; f++) {
                size_t at = pi2_rng_u64(&rng) % olen;
                t[at] = (char)(0x20 + pi2_rng_u64(&rng) % 0x5f);
            }
        } else {
            json_t *j = json_loads(t, 0, NULL);
            assert_non_null(j);
            json_t *ffn = json_object_get(j, "ffn");
            json_t *f = json_array_get(ffn, pi2_rng_u64(&rng) % json_array_size(ffn));
            const char *keys[] = { "neurons", "group", "bundle_bytes", "gate_bytes", "gate_part", "slot_bytes",
                                   "groups", "hot_groups", "hot_neurons", "layer", "expert" };
            const char *k = keys[pi2_rng_u64(&rng) % 11];
            long long deltas[] = { 1, -1, 4096, -4096, 1ll << 40, -(1ll << 40) };
            long long v = json_integer_value(json_object_get(f, k)) + deltas[pi2_rng_u64(&rng) % 6];
            json_object_set_new(f, k, json_integer(v));
            free(t);
            t = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
            json_decref(j);
        }
        free(m2->bundle_json);
        m2->bundle_json = t;
        pi2_bundle_layout *l = NULL;
        pi2_err le = { 0 };
        int rc = pi2_bundle_layout_parse(m2, "m", &l, &le);
        rejected += rc != 0;
        if (rc)
            assert_null(l);
        pi2_bl_free(l);
    }
    fprintf(stderr, "  [bundle object mutations: %d/200 rejected]\n", rejected);
    free(orig);
    pi2_manifest_free(m2);
    pi2_bundle_close(b);
}

/* ------------------------------------------------------------------ */
/* Bad input to the bundler                                             */
/* ------------------------------------------------------------------ */

static void expect_create_error(pi2_bundle_opts *o, int code, const char *needle)
{
    pi2_err e = { 0 };
    o->quiet = true;
    int rc = pi2_bundle_create(o, NULL, &e);
    if (rc != code || (needle && !strstr(e.msg, needle)))
        fail_msg("got %d (%s), want %d with \"%s\"", rc, e.msg, code, needle ? needle : "");
    assert_false(pi2t_exists(o->out_path));
    assert_int_equal(count_tmp_files(g_dir), 0);
}

static void test_bad_inputs(void **state)
{
    (void)state;
    char out[160], bad[160], nope[160];
    snprintf(out, sizeof out, "%s/bad-out.pi2", g_dir);
    snprintf(bad, sizeof bad, "%s/bad.pi2c", g_dir);
    snprintf(nope, sizeof nope, "%s/nope.pi2c", g_dir);
    pi2_bundle_opts o;
    pi2_bundle_defaults(&o);
    o.in_path = g_drelu;
    o.out_path = out;
    expect_create_error(&o, PI2_EINVAL, "no signing key");
    o.key = g_pubkey;
    expect_create_error(&o, PI2_EINVAL, "public key");
    o.key = g_key;
    o.io_unit = 3000;
    expect_create_error(&o, PI2_EINVAL, "3000");
    o.io_unit = 4096;
    o.hot_share = 1.5;
    expect_create_error(&o, PI2_EINVAL, "hot rule");
    o.hot_share = NAN;
    o.in_path = nope;
    expect_create_error(&o, PI2_ENOTFOUND, "nope.pi2c");
    o.in_path = g_signed; /* already bundled */
    expect_create_error(&o, PI2_EINVAL, "not a converted model");
    /* a corrupt byte in a converted member is caught by its digest */
    pi2_ctr *c;
    pi2_manifest *mf;
    pi2t_open_manifest(g_drelu, &c, &mf);
    const pi2_mf_tensor *t = pi2_manifest_find_tensor(mf, PI2_T_UP, 1, -1);
    assert_non_null(t);
    const pi2_ctr_member *m = member(c, t->payload);
    pi2t_copy_file(g_drelu, bad);
    xor_byte(bad, m->offset + 100, 0x10);
    o.in_path = bad;
    expect_create_error(&o, PI2_ESIG, t->payload);
    pi2t_copy_file(g_drelu, bad);
    m = member(c, mf->profile[0].bits);
    xor_byte(bad, m->offset + 7, 0x10);
    expect_create_error(&o, PI2_ESIG, mf->profile[0].bits);
    pi2_manifest_free(mf);
    pi2_ctr_close(c);
    /* not a container at all */
    pi2t_write(bad, "hello", 5);
    expect_create_error(&o, PI2_EFORMAT, "bad.pi2c");
}

static void test_disk_full(void **state)
{
    (void)state;
    char out[160];
    snprintf(out, sizeof out, "%s/full.pi2", g_dir);
    uint64_t size = file_size(g_signed);
    uint64_t at[] = { 1000, size / 2, size - 8192 };
    for (size_t i = 0; i < 3; i++) {
        pi2_bundle_opts o;
        pi2_bundle_defaults(&o);
        o.in_path = g_drelu;
        o.out_path = out;
        o.key = g_key;
        o.io_unit = 4096;
        o.two_phase = true; /* g_signed's layout, so its size */
        pi2_afile_fail_after((int64_t)at[i]);
        expect_create_error(&o, PI2_ENOSPC, NULL);
        pi2_afile_fail_after(-1);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_geometry),
        cmocka_unit_test(test_auto_io_unit),
        cmocka_unit_test(test_check_perm),
        cmocka_unit_test(test_hot_count),
        cmocka_unit_test(test_order_planted),
        cmocka_unit_test(test_order_twins),
        cmocka_unit_test(test_roundtrip_drelu),
        cmocka_unit_test(test_roundtrip_silu_q8_moe),
        cmocka_unit_test(test_hot_share_determinism),
        cmocka_unit_test(test_inspect),
        cmocka_unit_test_teardown(test_inspect_svg, reset_fail_hook),
        cmocka_unit_test(test_tamper_each_section),
        cmocka_unit_test(test_verify_resident_only),
        cmocka_unit_test(test_verify_copy),
        cmocka_unit_test(test_tamper_truncate),
        cmocka_unit_test(test_tamper_keys),
        cmocka_unit_test(test_tamper_members),
        cmocka_unit_test(test_layout_errors),
        cmocka_unit_test(test_mutations),
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test_teardown(test_disk_full, reset_fail_hook),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
