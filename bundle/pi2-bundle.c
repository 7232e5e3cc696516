/* pi2-bundle: converted model -> signed model.pi2 (neuron order, row-column
 * bundles, flash layout); key generation, verification and inspection. */
#include "bundle/bundle.h"
#include "bundle/report_svg.h"
#include "runtime/version.h"

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Print the error; returns `code` for main's exit status. */
static int die(const pi2_err *e, int code)
{
    fprintf(stderr, "pi2-bundle: %s\n", e->msg);
    return code;
}

/* getopt's '?' or ':': name the flag in our own single line. */
static int bad_flag(const char *cmd, char **argv, int c)
{
    char tool[32];
    snprintf(tool, sizeof tool, "pi2-bundle%s%s", cmd ? " " : "", cmd ? cmd : "");
    return pi2_cli_bad_option(tool, argv, c);
}

static int usage_error(const char *msg)
{
    fprintf(stderr, "pi2-bundle: %s; see --help\n", msg);
    return 2;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: pi2-bundle CONVERTED -o MODEL.pi2 (--key PRIV.pem | --unsigned) [options]\n"
            "       pi2-bundle keygen --private PRIV.pem --public PUB.pem\n"
            "       pi2-bundle verify MODEL.pi2 (--pubkey PUB.pem | --allow-unsigned)\n"
            "       pi2-bundle inspect MODEL.pi2 [--svg FILE]\n"
            "\n"
            "Lay a converted model (pi2-convert output) out for flash: order each FFN's neurons\n"
            "hot to cold by profiled activation frequency, group cold neurons that fire together,\n"
            "store each neuron's gate row, up row and down column, each with its scales, as one\n"
            "bundle, pack groups into aligned I/O units, keep embeddings, attention, norms and\n"
            "predictors in a resident region, and sign the manifest with Ed25519. The output\n"
            "appears only when complete.\n"
            "\n"
            "bundle:\n"
            "  -o, --output FILE    model.pi2 to write (never the input)\n"
            "  --force              replace FILE when it exists (else refused)\n"
            "  --key PRIV.pem       Ed25519 private key to sign with (pi2-bundle keygen)\n"
            "  --unsigned           write an unsigned container (reported as unsigned everywhere)\n"
            "  --io-unit SIZE|auto  largest read of a neuron group: 4K..256K, a power of two\n"
            "                       (default auto: the smallest from 8K that packs whole\n"
            "                       neurons with at most 1/8 padding)\n"
            "  --layout L           FFN layout: one-phase (default; each neuron's gate, up and\n"
            "                       down together: one read a neuron) or two-phase (dReLU only:\n"
            "                       a group's gates with all their scales, then up+down, for\n"
            "                       plans that read gates first and up+down of the fired)\n"
            "  --hot-share F        hot neurons: this share of each FFN (0..1) ...\n"
            "  --hot-freq F         ... or those firing on at least this share of tokens\n"
            "                       (default 0.5)\n"
            "  -t, --threads N      threads for neuron ordering (default: all cores)\n"
            "  -q, --quiet          nothing on stdout or stderr but errors (no progress, no summary)\n"
            "keygen:\n"
            "  --private FILE       private key to create (PEM, mode 0600; must not exist: keys are\n"
            "                       never replaced)\n"
            "  --public FILE        public key to create (PEM; must not exist)\n"
            "verify (signature, then every section's SHA-256; names the first bad section):\n"
            "  --pubkey PUB.pem     public key the container must be signed with\n"
            "  --allow-unsigned     accept an unsigned container (still checks every digest)\n"
            "inspect: config, quant, region sizes, signature status, predictors, profile\n"
            "  --svg FILE           also write a self-contained SVG chart: activation frequency\n"
            "                       per FFN (hot to cold) and predictor recall / active fractions\n"
            "  --force              replace the --svg FILE when it exists (else refused)\n"
            "  -h, --help           this help\n"
            "  --version            version, build and kernel paths\n"
            "\n"
            "exit status: 0 ok, 1 failure (bad input, bad signature or digest), 2 bad usage\n"
            "\n"
            "example:\n"
            "  pi2-bundle keygen --private priv.pem --public pub.pem\n"
            "  pi2-bundle model.pi2c -o model.pi2 --key priv.pem\n"
            "  pi2-bundle verify model.pi2 --pubkey pub.pem\n"
            "  pi2-bundle inspect model.pi2 --svg model.svg\n");
}

static int cmd_keygen(int argc, char **argv)
{
    enum { O_PRIV = 256, O_PUB };
    static const struct option opts[] = { { "private", required_argument, 0, O_PRIV },
                                          { "public", required_argument, 0, O_PUB },
                                          { "help", no_argument, 0, 'h' },
                                          { 0, 0, 0, 0 } };
    const char *priv = NULL, *pub = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case O_PRIV: priv = optarg; break;
        case O_PUB: pub = optarg; break;
        case 'h': usage(stdout); return 0;
        default: return bad_flag("keygen", argv, c);
        }
    }
    if (optind < argc)
        return usage_error("keygen: unexpected argument");
    if (!priv || !pub)
        return usage_error("keygen needs --private FILE and --public FILE");
    pi2_err err = { 0 };
    if (strcmp(priv, pub) == 0)
        return usage_error("keygen: --private and --public name the same file");
    struct stat st;
    for (int i = 0; i < 2; i++)
        if (stat(i ? pub : priv, &st) == 0) {
            fprintf(stderr, "pi2-bundle: %s already exists: keys are never replaced; remove it or choose another name\n",
                    i ? pub : priv);
            return 1;
        }
    const char *inputs[] = { priv };
    if (pi2_out_check(priv, NULL, 0, 0, 0, &err) || pi2_out_check(pub, inputs, 1, 0, 0, &err))
        return die(&err, 1);
    if (pi2_sign_keygen(priv, pub, &err))
        return die(&err, 1);
    pi2_sign_key *k = NULL;
    uint8_t raw[PI2_SIGN_PUBKEY_LEN];
    char fp[17] = "?";
    if (pi2_sign_key_load_public(&k, pub, NULL) == 0 && pi2_sign_key_raw_public(k, raw, NULL) == 0)
        pi2_bundle_key_fingerprint(raw, fp);
    pi2_sign_key_free(k);
    printf("wrote %s (private, mode 0600) and %s (public), key %s\n", priv, pub, fp);
    return 0;
}

static int cmd_verify(int argc, char **argv)
{
    enum { O_PUBKEY = 256, O_ALLOW };
    static const struct option opts[] = { { "pubkey", required_argument, 0, O_PUBKEY },
                                          { "allow-unsigned", no_argument, 0, O_ALLOW },
                                          { "help", no_argument, 0, 'h' },
                                          { 0, 0, 0, 0 } };
    const char *pubpath = NULL;
    bool allow = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case O_PUBKEY: pubpath = optarg; break;
        case O_ALLOW: allow = true; break;
        case 'h': usage(stdout); return 0;
        default: return bad_flag("verify", argv, c);
        }
    }
    if (optind + 1 != argc)
        return usage_error("verify takes exactly one MODEL.pi2");
    if (!pubpath && !allow)
        return usage_error("verify needs --pubkey PUB.pem (or --allow-unsigned for an unsigned container)");
    const char *path = argv[optind];
    pi2_err err = { 0 };
    pi2_sign_key *key = NULL;
    if (pubpath && pi2_sign_key_load_public(&key, pubpath, &err))
        return die(&err, 1);
    pi2_bundle_open_opts o = { .pubkey = key, .allow_unsigned = allow };
    pi2_bundle *b = NULL;
    double t0 = pi2_now();
    int rc = pi2_bundle_open(&b, path, &o, &err);
    uint64_t bytes = 0;
    if (rc == 0)
        rc = pi2_bundle_verify(b, false, &bytes, &err);
    if (rc == 0) {
        double el = pi2_now() - t0;
        char fp[17] = "";
        uint8_t raw[PI2_SIGN_PUBKEY_LEN];
        if (key && pi2_sign_key_raw_public(key, raw, NULL) == 0)
            pi2_bundle_key_fingerprint(raw, fp);
        if (pi2_bundle_sig_status(b) == PI2_BUNDLE_SIG_VERIFIED)
            printf("%s: signature ok (Ed25519 key %s); ", path, fp);
        else
            printf("%s: UNSIGNED (accepted with --allow-unsigned; nothing vouches for it); ", path);
        printf("%zu sections ok, %.2f GB hashed in %.1f s\n", pi2_bundle_manifest(b)->n_sections, bytes / 1e9, el);
    }
    pi2_bundle_close(b);
    pi2_sign_key_free(key);
    return rc ? die(&err, 1) : 0;
}

static int cmd_inspect(int argc, char **argv)
{
    enum { O_SVG = 256, O_FORCE };
    static const struct option opts[] = { { "svg", required_argument, 0, O_SVG },
                                          { "force", no_argument, 0, O_FORCE },
                                          { "help", no_argument, 0, 'h' },
                                          { 0, 0, 0, 0 } };
    const char *svg = NULL;
    bool force = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case O_SVG: svg = optarg; break;
        case O_FORCE: force = true; break;
        case 'h': usage(stdout); return 0;
        default: return bad_flag("inspect", argv, c);
        }
    }
    if (optind + 1 != argc)
        return usage_error("inspect takes exactly one MODEL.pi2");
    if (svg && !*svg)
        return usage_error("inspect: --svg needs a file name");
    pi2_err err = { 0 };
    const char *inputs[] = { argv[optind] };
    if (svg && pi2_out_check(svg, inputs, 1, force ? PI2_OUT_FORCE : 0, 0, &err)) {
        pi2_cli_force_hint(&err);
        return die(&err, 1);
    }
    pi2_bundle_open_opts o = { .allow_unsigned = true, .skip_signature = true };
    pi2_bundle *b = NULL;
    int rc = pi2_bundle_open(&b, argv[optind], &o, &err);
    /* The chart first: if it cannot be written, fail before any report. */
    if (rc == 0 && svg)
        rc = pi2_bundle_report_svg_write(b, svg, &err);
    if (rc == 0)
        rc = pi2_bundle_inspect(b, stdout, &err);
    if (rc == 0 && svg)
        printf("chart:      %s\n", svg);
    /* the library says the signature went unchecked; the command that checks it is the tool's to name */
    if (rc == 0 && pi2_bundle_sig_status(b) == PI2_BUNDLE_SIG_UNCHECKED)
        printf("verify:     pi2-bundle verify %s --pubkey PUB.pem\n", argv[optind]);
    pi2_bundle_close(b);
    return rc ? die(&err, 1) : 0;
}

/* The output rule before any work (formats/common.h): never the input or
 * the key, never over a file without --force, room for about the
 * converted model's size. */
static int bundle_out_check(const pi2_bundle_opts *o, const char *keypath, bool force, pi2_err *err)
{
    const char *inputs[] = { o->in_path, keypath };
    struct stat st;
    uint64_t need = stat(o->in_path, &st) == 0 ? (uint64_t)st.st_size + (1u << 20) : 0;
    int rc = pi2_out_check(o->out_path, inputs, 2, force ? PI2_OUT_FORCE : 0, need, err);
    pi2_cli_force_hint(err);
    return rc;
}

static int parse_layout(const char *s, bool *two_phase, pi2_err *err)
{
    if (strcmp(s, "one-phase") == 0 || strcmp(s, "two-phase") == 0) {
        *two_phase = strcmp(s, "two-phase") == 0;
        return 0;
    }
    return pi2_err_set(err, PI2_EINVAL, "--layout '%s': expected one-phase or two-phase", s);
}

static int cmd_bundle(int argc, char **argv)
{
    enum { O_KEY = 256, O_UNSIGNED, O_IO, O_LAYOUT, O_SHARE, O_FREQ, O_THREADS, O_FORCE };
    static const struct option opts[] = {
        { "output", required_argument, 0, 'o' },     { "key", required_argument, 0, O_KEY },
        { "unsigned", no_argument, 0, O_UNSIGNED },   { "io-unit", required_argument, 0, O_IO },
        { "hot-share", required_argument, 0, O_SHARE }, { "hot-freq", required_argument, 0, O_FREQ },
        { "threads", required_argument, 0, O_THREADS }, { "quiet", no_argument, 0, 'q' },
        { "force", no_argument, 0, O_FORCE },         { "layout", required_argument, 0, O_LAYOUT },
        { "help", no_argument, 0, 'h' },            { 0, 0, 0, 0 }
    };
    pi2_bundle_opts o;
    pi2_bundle_defaults(&o);
    const char *keypath = NULL;
    bool share_set = false, freq_set = false, force = false;
    pi2_err err = { 0 };
    int c, rc = 0;
    long long v;
    double dv;
    uint64_t sz;
    optind = 1;
    while (rc == 0 && (c = getopt_long(argc, argv, ":o:t:qh", opts, NULL)) != -1) {
        switch (c) {
        case 'o': o.out_path = optarg; break;
        case O_KEY: keypath = optarg; break;
        case O_UNSIGNED: o.allow_unsigned = true; break;
        case O_IO:
            if (strcmp(optarg, "auto") == 0) {
                o.io_unit = 0;
                break;
            }
            rc = pi2_parse_size("--io-unit", optarg, &sz, &err);
            if (rc == 0 && (sz < PI2_BL_IO_MIN || sz > PI2_BL_IO_MAX || (sz & (sz - 1)) != 0))
                rc = pi2_err_set(&err, PI2_EINVAL, "--io-unit '%s': expected a power of two from 4K to 256K, or auto",
                                 optarg);
            o.io_unit = (uint32_t)sz;
            break;
        case O_LAYOUT: rc = parse_layout(optarg, &o.two_phase, &err); break;
        case O_SHARE:
            rc = pi2_parse_double("--hot-share", optarg, 0, 1, &dv, &err);
            o.hot_share = dv;
            share_set = true;
            break;
        case O_FREQ:
            rc = pi2_parse_double("--hot-freq", optarg, 0, 1, &dv, &err);
            o.hot_min_freq = dv;
            freq_set = true;
            break;
        case 't':
        case O_THREADS: rc = pi2_parse_int("--threads", optarg, 1, 256, &v, &err); o.threads = (int)v; break;
        case 'q': o.quiet = true; break;
        case O_FORCE: force = true; break;
        case 'h': usage(stdout); return 0;
        default: return bad_flag(NULL, argv, c);
        }
    }
    if (rc) {
        fprintf(stderr, "pi2-bundle: %s\n", err.msg);
        return 2;
    }
    if (optind + 1 != argc)
        return usage_error("expected exactly one CONVERTED model");
    o.in_path = argv[optind];
    if (!o.out_path)
        return usage_error("-o MODEL.pi2 is required");
    if (share_set && freq_set)
        return usage_error("--hot-share and --hot-freq are alternatives; give one");
    if (keypath && o.allow_unsigned)
        return usage_error("--key and --unsigned are alternatives; give one");
    if (!keypath && !o.allow_unsigned)
        return usage_error("--key PRIV.pem is required (or --unsigned, explicitly, for an unsigned container)");
    if (bundle_out_check(&o, keypath, force, &err))
        return die(&err, 1);
    pi2_sign_key *key = NULL;
    if (keypath && pi2_sign_key_load_private(&key, keypath, &err))
        return die(&err, 1);
    o.key = key;
    double t0 = pi2_now();
    rc = pi2_bundle_create(&o, o.quiet ? NULL : stdout, &err);
    pi2_sign_key_free(key);
    if (rc)
        return die(&err, 1);
    if (!o.quiet)
        printf("done in %.1f s, peak RSS %.0f MB\n", pi2_now() - t0, pi2_peak_rss() / 1048576.0);
    return 0;
}

static int tool_main(int argc, char **argv)
{
    opterr = 0; /* one line per error: ours */
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        pi2_version_print(stdout, "pi2-bundle");
        return 0;
    }
    if (strcmp(argv[1], "keygen") == 0)
        return cmd_keygen(argc - 1, argv + 1);
    if (strcmp(argv[1], "verify") == 0)
        return cmd_verify(argc - 1, argv + 1);
    if (strcmp(argv[1], "inspect") == 0)
        return cmd_inspect(argc - 1, argv + 1);
    return cmd_bundle(argc, argv);
}

int main(int argc, char **argv)
{
    pi2_tmp_cleanup_on_signals(); /* an interrupt leaves no temporary output behind */
    return pi2_exit_stdout("pi2-bundle", tool_main(argc, argv));
}
