/* pi2-convert: Hugging Face model dir -> converted model; and `synth`, the
 * model generator for tests, demos and benchmarks. */
#include "convert/convert.h"
#include "convert/family.h"
#include "convert/synth.h"
#include "runtime/version.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Print the error; returns `code` for main's exit status. */
static int die(const char *what, const pi2_err *e, int code)
{
    fprintf(stderr, "pi2-convert: %s%s%s\n", what ? what : "", what ? ": " : "", e->msg);
    return code;
}

/* The library says what is wrong with a conversion; the flag that fixes
 * it is the tool's to name, chosen from what the conversion needs. */
static void flag_hint(pi2_convert_need need, pi2_err *err)
{
    const char *hint = need == PI2_CONVERT_NEED_PREDICTORS ? "; give --predictors PATH, or --train-predictors to "
                                                             "train new ones"
                       : need == PI2_CONVERT_NEED_CALIB    ? "; give more --calib-tokens"
                                                           : NULL;
    if (!hint)
        return;
    pi2_err in = *err, fresh = {0};
    *err = fresh;
    pi2_err_set(err, in.code, "%s%s", in.msg, hint);
}

static void usage_synth(FILE *f)
{
    fprintf(f,
            "usage: pi2-convert synth --preset NAME -o DIR [options]\n"
            "       pi2-convert synth --family NAME -o DIR [--seed S] [-q]\n"
            "\n"
            "Write a Hugging Face model directory (config.json, tokenizer.json, safetensors,\n"
            "sharded with an index past --shard-size) whose FFNs have planted, predictable\n"
            "activation sparsity. Streams to disk: memory use stays small at any size.\n"
            "\n"
            "  --preset NAME      tiny | small | 1b | 7b | moe (shapes below can override)\n"
            "  -o, --output DIR   output directory (must not exist; appears only when complete)\n"
            "  --hidden N         hidden size\n"
            "  --ff N             FFN width (per expert for MoE)\n"
            "  --layers N         number of layers\n"
            "  --heads N          attention heads\n"
            "  --kv-heads N       key/value heads (must divide --heads)\n"
            "  --vocab N          vocabulary size (>= 300)\n"
            "  --tokenizer-size N ids the tokenizer defines (300..--vocab; default all): fewer makes a\n"
            "                     padded vocabulary, as TurboSparse-Mistral's 32002 of 32064, whose\n"
            "                     padding rows would win every step if they were not masked\n"
            "  --experts N        experts per layer (0 = dense)\n"
            "  --experts-used K   experts chosen per token (top-k)\n"
            "  --act A            drelu (bamboo / turbosparsemixtral) | relu (ReGLU) | silu (SwiGLU) |\n"
            "                     fatrelu (ProSparse's sparsellama; mixtral with --experts)\n"
            "  --act-param T      fatrelu's threshold: a neuron fires when its gate exceeds T (default 0.01)\n"
            "  --dtype T          f32 | f16 | bf16\n"
            "  --active F         mean share of FFN neurons active per token (default 0.10)\n"
            "  --hot F            share of hot neurons that fire for most tokens (default 0.03)\n"
            "  --rank R           rank of the planted activation structure (default min(32, hidden/4))\n"
            "  --predictors       also write predictors under the TurboSparse tensor names\n"
            "  --norm-spread S    FFN norm weights exp(S * N(0,1)) with gate/up compensated: the\n"
            "                     planted predictors then read the pre-norm residual (default 0)\n"
            "  --tied             tie the output head to the embeddings (stored once)\n"
            "  --seed S           seed (default 1); the same seed gives the same bytes\n"
            "  --shard-size SIZE  shard limit, e.g. 4G (default 4G)\n"
            "  -t, --threads N    generator threads (default: all cores)\n"
            "  -q, --quiet        nothing on stdout or stderr but errors\n"
            "  -h, --help         this help\n"
            "\n"
            "exit status: 0 ok, 1 failure (the output exists, a failed write), 2 bad usage\n"
            "\n"
            "--family writes a tiny replica of a published sparse checkpoint instead: its files as\n"
            "published (config fields, tensor names and dtypes, shards, predictor files, tokenizer\n"
            "and generation configs, padded vocabulary) around a planted-sparsity model of a few MB:\n"
            "  turbosparse-mistral  bamboo, predictors in the checkpoint, ChatML, vocab 32064\n"
            "  turbosparse-mixtral  8 experts, predictors per expert in the checkpoint, vocab 57024\n"
            "  bamboo               bamboo; predictors in DIR-predictor/model_{L}.pt (+ config.json)\n"
            "  prosparse            sparsellama, FATReLU 0.01; predictors in DIR-predictor/\n"
            "  relullama            llama + relu, float32 pytorch_model-*.bin shards; DIR-predictor/\n"
            "\n"
            "example:\n"
            "  pi2-convert synth --preset tiny -o /tmp/tiny\n"
            "  pi2-convert synth --family bamboo -o /tmp/bamboo   # and /tmp/bamboo-predictor\n"
            "  pi2-convert synth --preset 7b --layers 4 -o /tmp/7b-4layers\n"
            "  pi2-convert synth --preset tiny --act fatrelu --act-param 0.05 -o /tmp/prosparse\n");
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: pi2-convert MODEL_DIR -o OUT [options]\n"
            "       pi2-convert synth --preset NAME -o DIR [options]   (see pi2-convert synth --help)\n"
            "       pi2-convert export CONVERTED -o DIR [-q]   (dequantize back to an F32 HF dir: the\n"
            "                                                   quantized reference for pi2-run --reference)\n"
            "\n"
            "Convert a Hugging Face model directory (config.json, tokenizer.json, safetensors)\n"
            "into a pi2 converted model: quantized weights (FFN scales stored apart from the\n"
            "4-bit payloads), activation predictors (imported from the checkpoint or trained),\n"
            "an activation profile and a quality report. The output appears only when complete.\n"
            "\n"
            "  -o, --output OUT        converted model file to write (not inside MODEL_DIR)\n"
            "  --force                 replace OUT when it exists (else refused)\n"
            "  --quant q4|q8           FFN weights (default q4)\n"
            "  --other-quant q8|q4     attention, embeddings, output head (default q8)\n"
            "  --embed-quant q8|q4     the embedding table alone (default: as --other-quant); a tied\n"
            "                          model's head is its embedding table, so this sets both\n"
            "  --head-quant q8|q4      an untied output head alone (default: as --other-quant)\n"
            "  --kvo-quant q8|q4       the attention's key, value and output projections (default: as\n"
            "                          --other-quant); q8 with --other-quant q4 keeps most of the quality\n"
            "  --pred-quant q8|q4|f16  predictors as stored (default q8): q8/q4 are the rows the runtime\n"
            "                          runs, used in place; f16 is quantized to q8 at open\n"
            "  --train-predictors      train predictors when the model comes with none\n"
            "  --predictors PATH       import predictors: a safetensors file or dir (the checkpoint's\n"
            "                          predictor names), or a PowerInfer repo dir (model_{L}.pt files,\n"
            "                          config.json with an optional sparse_threshold). Without it, the\n"
            "                          checkpoint's own predictors are used, else predictor files beside\n"
            "                          the weights (predictor.safetensors, predictor/, model_0.pt, ...)\n"
            "  --predictor-input prenorm|normed\n"
            "                          the vector predictors read: the residual before the FFN's norm\n"
            "                          (the published convention: the default for imported ones) or\n"
            "                          the normed FFN input (the default for trained ones)\n"
            "  --calib FILE            calibration text (default: text the model generates itself)\n"
            "  --calib-tokens N        calibration tokens (default: 32768 below 100M parameters,\n"
            "                          4096 from 100M up: each costs a forward pass)\n"
            "  --recall R              target recall of trained predictors' thresholds (default 0.99);\n"
            "                          given, it also calibrates imported ones (else they keep the\n"
            "                          published threshold: a neuron fires when its score is > 0)\n"
            "  --sparsity S            SiLU models: share of neurons the threshold mode drops (default 0.5)\n"
            "  -t, --threads N         threads (default: all cores)\n"
            "  --seed S                seed for calibration text and training (default 1)\n"
            "  --per-layer             also report the per-layer activation profile\n"
            "  -q, --quiet             no progress lines\n"
            "  -h, --help              this help\n"
            "  --version               version, build and kernel paths\n"
            "\n"
            "exit status: 0 ok, 1 failure (bad input, refused output, failed write), 2 bad usage\n"
            "\n"
            "example:\n"
            "  pi2-convert ../shared/models/tinystories-656k-drelu -o /tmp/ts.pi2c --train-predictors\n");
}

static int cmd_convert(int argc, char **argv)
{
    enum { O_QUANT = 256, O_OQUANT, O_EQUANT, O_HQUANT, O_KQUANT, O_PQUANT, O_TRAIN, O_PRED, O_CALIB, O_CTOK, O_RECALL,
           O_SPARSITY, O_THREADS, O_SEED, O_PERLAYER,
           O_PIN, O_FORCE };
    static const struct option opts[] = {
        {"output", required_argument, 0, 'o'},       {"per-layer", no_argument, 0, O_PERLAYER},       {"quant", required_argument, 0, O_QUANT},
        {"other-quant", required_argument, 0, O_OQUANT}, {"train-predictors", no_argument, 0, O_TRAIN},
        {"pred-quant", required_argument, 0, O_PQUANT}, {"embed-quant", required_argument, 0, O_EQUANT},
        {"head-quant", required_argument, 0, O_HQUANT}, {"kvo-quant", required_argument, 0, O_KQUANT},
        {"predictors", required_argument, 0, O_PRED}, {"calib", required_argument, 0, O_CALIB},
        {"calib-tokens", required_argument, 0, O_CTOK}, {"recall", required_argument, 0, O_RECALL},
        {"sparsity", required_argument, 0, O_SPARSITY}, {"threads", required_argument, 0, O_THREADS},
        {"seed", required_argument, 0, O_SEED},       {"quiet", no_argument, 0, 'q'},
        {"predictor-input", required_argument, 0, O_PIN}, {"force", no_argument, 0, O_FORCE},
        {"help", no_argument, 0, 'h'},               {0, 0, 0, 0}};
    pi2_convert_opts o;
    pi2_convert_defaults(&o);
    o.q_pred = PI2_QT_Q8; /* the tool stores what the runtime runs; the library keeps f16 unless asked */
    pi2_err err = {0};
    int c, rc = 0;
    long long v;
    double dv;
    while (rc == 0 && (c = getopt_long(argc, argv, ":o:t:qh", opts, NULL)) != -1) {
        switch (c) {
        case 'o': o.out_path = optarg; break;
        case O_QUANT:
            rc = pi2_q_type_parse(optarg, &o.q_ffn, NULL);
            if (rc != 0 || o.q_ffn == PI2_QT_F32)
                rc = pi2_err_set(&err, PI2_EINVAL, "--quant '%s': expected q4 or q8", optarg);
            break;
        case O_OQUANT:
            rc = pi2_q_type_parse(optarg, &o.q_other, NULL);
            if (rc != 0 || o.q_other == PI2_QT_F32)
                rc = pi2_err_set(&err, PI2_EINVAL, "--other-quant '%s': expected q8 or q4", optarg);
            break;
        case O_EQUANT:
        case O_HQUANT:
        case O_KQUANT: {
            pi2_qtype *q = c == O_EQUANT ? &o.q_embed : c == O_HQUANT ? &o.q_head : &o.q_kvo;
            rc = pi2_q_type_parse(optarg, q, NULL);
            if (rc != 0 || *q == PI2_QT_F32)
                rc = pi2_err_set(&err, PI2_EINVAL, "--%s-quant '%s': expected q8 or q4",
                                 c == O_EQUANT ? "embed" : c == O_HQUANT ? "head" : "kvo", optarg);
            break;
        }
        case O_PQUANT:
            if (!strcmp(optarg, "f16"))
                o.q_pred = PI2_QT_F32;
            else if (pi2_q_type_parse(optarg, &o.q_pred, NULL) != 0 || o.q_pred == PI2_QT_F32)
                rc = pi2_err_set(&err, PI2_EINVAL, "--pred-quant '%s': expected f16, q8 or q4", optarg);
            break;
        case O_TRAIN: o.train_predictors = true; break;
        case O_PRED: o.predictors_dir = optarg; break;
        case O_CALIB: o.calib_path = optarg; break;
        case O_CTOK: rc = pi2_parse_int("--calib-tokens", optarg, 64, 1 << 22, &v, &err); o.calib_tokens = (int)v; break;
        case O_RECALL:
            rc = pi2_parse_double("--recall", optarg, 0.5, 1.0, &dv, &err);
            o.recall = dv;
            o.recall_set = true;
            break;
        case O_PIN:
            if (strcmp(optarg, "prenorm") == 0)
                o.pred_input = PI2_PRED_IN_PRENORM;
            else if (strcmp(optarg, "normed") == 0)
                o.pred_input = PI2_PRED_IN_NORMED;
            else
                rc = pi2_err_set(&err, PI2_EINVAL, "--predictor-input '%s': expected prenorm or normed", optarg);
            break;
        case O_SPARSITY: rc = pi2_parse_double("--sparsity", optarg, 0.0, 0.99, &dv, &err); o.silu_sparsity = dv; break;
        case 't':
        case O_THREADS: rc = pi2_parse_int("--threads", optarg, 1, 256, &v, &err); o.threads = (int)v; break;
        case O_SEED: rc = pi2_parse_int("--seed", optarg, 0, INT64_MAX, &v, &err); o.seed = (uint64_t)v; break;
        case 'q': o.quiet = true; break;
        case O_FORCE: o.force = true; break;
        case O_PERLAYER: o.per_layer = true; break;
        case 'h': usage(stdout); return 0;
        default: return pi2_cli_bad_option("pi2-convert", argv, c);
        }
    }
    if (rc)
        return die(NULL, &err, 2);
    if (optind + 1 != argc) {
        fprintf(stderr, "pi2-convert: expected exactly one MODEL_DIR; see --help\n");
        return 2;
    }
    o.model_dir = argv[optind];
    if (!o.out_path) {
        fprintf(stderr, "pi2-convert: -o OUT is required; see --help\n");
        return 2;
    }
    double t0 = pi2_now();
    pi2_convert_need need;
    if (pi2_convert_run(&o, stdout, &need, &err)) {
        flag_hint(need, &err);
        pi2_cli_force_hint(&err);
        return die(NULL, &err, 1);
    }
    printf("wrote %s in %.1f s, peak RSS %.0f MB\n", o.out_path, pi2_now() - t0, pi2_peak_rss() / 1048576.0);
    return 0;
}

typedef struct progress_state {
    bool tty;
    double t0, last;
} progress_state;

static void on_progress(void *ctx, uint64_t done, uint64_t total)
{
    progress_state *p = ctx;
    if (!p->tty)
        return;
    double now = pi2_now();
    if (now - p->last < 0.2 && done < total)
        return;
    p->last = now;
    double el = now - p->t0;
    fprintf(stderr, "\r  writing %5.1f%%  %.2f / %.2f GB  %.0f MB/s   ", total ? 100.0 * done / total : 100.0,
            done / 1e9, total / 1e9, el > 0 ? done / el / 1e6 : 0.0);
    if (done >= total)
        fputc('\n', stderr);
}


/* pi2-convert synth --family NAME -o DIR [--seed S] [-q] */
/* fam names one of the families pi2_family_write knows. */
static bool family_known(const char *fam)
{
    for (const char *const *n = pi2_family_names; *n; n++)
        if (strcmp(*n, fam) == 0)
            return true;
    return false;
}

static int synth_family(int argc, char **argv, const char *fam)
{
    const char *out = NULL;
    long long seed = 1;
    bool quiet = false;
    pi2_err err = {0};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--family") == 0 && i + 1 < argc) {
            i++;
        } else if (strcmp(argv[i], "-q") == 0 || strcmp(argv[i], "--quiet") == 0) {
            quiet = true;
        } else if ((strcmp(argv[i], "-o") == 0 || strcmp(argv[i], "--output") == 0) && i + 1 < argc) {
            out = argv[++i];
        } else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) {
            if (pi2_parse_int("--seed", argv[++i], 0, INT64_MAX, &seed, &err))
                return die("synth", &err, 2);
        } else {
            fprintf(stderr, "pi2-convert synth: --family takes only -o DIR, --seed S and -q; '%s' is not one\n",
                    argv[i]);
            return 2;
        }
    }
    if (!out) {
        fprintf(stderr, "pi2-convert synth: -o DIR is required; see --help\n");
        return 2;
    }
    if (pi2_out_check(out, NULL, 0, PI2_OUT_DIR, 0, &err))
        return die("synth", &err, 1);
    if (pi2_family_write(out, fam, (uint64_t)seed, 0, &err))
        return die("synth", &err, family_known(fam) ? 1 : 2); /* an unknown name: a usage error */
    if (!quiet)
        printf("wrote %s (a tiny %s replica)\n", out, fam);
    return 0;
}

enum { SY_PRESET = 256, SY_HIDDEN, SY_FF, SY_LAYERS, SY_HEADS, SY_KV, SY_VOCAB, SY_EXPERTS, SY_EUSED, SY_ACT, SY_DTYPE,
       SY_ACTIVE, SY_HOT, SY_RANK, SY_PRED, SY_TIED, SY_SEED, SY_SHARD, SY_THREADS, SY_NSPREAD, SY_ACTP, SY_TOKS };

static const struct option synth_opts[] = {
    {"preset", required_argument, 0, SY_PRESET}, {"output", required_argument, 0, 'o'},
    {"hidden", required_argument, 0, SY_HIDDEN}, {"ff", required_argument, 0, SY_FF},
    {"layers", required_argument, 0, SY_LAYERS}, {"heads", required_argument, 0, SY_HEADS},
    {"kv-heads", required_argument, 0, SY_KV},   {"vocab", required_argument, 0, SY_VOCAB},
    {"experts", required_argument, 0, SY_EXPERTS}, {"experts-used", required_argument, 0, SY_EUSED},
    {"act", required_argument, 0, SY_ACT},       {"dtype", required_argument, 0, SY_DTYPE},
    {"active", required_argument, 0, SY_ACTIVE}, {"hot", required_argument, 0, SY_HOT},
    {"rank", required_argument, 0, SY_RANK},     {"predictors", no_argument, 0, SY_PRED},
    {"tied", no_argument, 0, SY_TIED},           {"seed", required_argument, 0, SY_SEED},
    {"shard-size", required_argument, 0, SY_SHARD}, {"threads", required_argument, 0, SY_THREADS},
    {"norm-spread", required_argument, 0, SY_NSPREAD}, {"quiet", no_argument, 0, 'q'},
    {"act-param", required_argument, 0, SY_ACTP}, {"tokenizer-size", required_argument, 0, SY_TOKS},
    {"help", no_argument, 0, 'h'},              {0, 0, 0, 0}};

/* One synth option c into o (and the activation's name and parameter, set
 * after the loop): 0 or a PI2_E* code with err filled. */
static int synth_take_flag(int c, pi2_synth_opts *o, const char **out, const char **act, double *act_param,
                           pi2_err *err)
{
    pi2_model_desc *d = &o->desc;
    long long v;
    double dv;
    int rc = 0;
    switch (c) {
    case SY_PRESET: break;
    case 'o': *out = optarg; break;
    case SY_HIDDEN: rc = pi2_parse_int("--hidden", optarg, 8, 1 << 16, &v, err); d->hidden = (int)v; break;
    case SY_FF: rc = pi2_parse_int("--ff", optarg, 1, 1 << 18, &v, err); d->n_ff = (int)v; break;
    case SY_LAYERS: rc = pi2_parse_int("--layers", optarg, 1, 1024, &v, err); d->n_layers = (int)v; break;
    case SY_HEADS: rc = pi2_parse_int("--heads", optarg, 1, 1024, &v, err); d->n_heads = (int)v; break;
    case SY_KV: rc = pi2_parse_int("--kv-heads", optarg, 1, 1024, &v, err); d->n_kv_heads = (int)v; break;
    case SY_VOCAB: rc = pi2_parse_int("--vocab", optarg, 300, 1 << 20, &v, err); d->vocab = (int)v; break;
    case SY_EXPERTS: rc = pi2_parse_int("--experts", optarg, 0, 256, &v, err); d->n_experts = (int)v; break;
    case SY_EUSED: rc = pi2_parse_int("--experts-used", optarg, 1, 256, &v, err); d->n_experts_used = (int)v; break;
    case SY_ACT: *act = optarg; break;
    case SY_ACTP: rc = pi2_parse_double("--act-param", optarg, 0, 1e3, act_param, err); break;
    case SY_TOKS: rc = pi2_parse_int("--tokenizer-size", optarg, 300, 1 << 20, &v, err); o->n_tokens = (int)v; break;
    case SY_DTYPE:
        if (strcmp(optarg, "f32") == 0) o->dtype = PI2_DT_F32;
        else if (strcmp(optarg, "f16") == 0) o->dtype = PI2_DT_F16;
        else if (strcmp(optarg, "bf16") == 0) o->dtype = PI2_DT_BF16;
        else rc = pi2_err_set(err, PI2_EINVAL, "--dtype '%s': expected f32, f16 or bf16", optarg);
        break;
    case SY_ACTIVE: rc = pi2_parse_double("--active", optarg, 0.001, 0.9, &dv, err); o->active_frac = dv; break;
    case SY_HOT: rc = pi2_parse_double("--hot", optarg, 0, 0.5, &dv, err); o->hot_frac = dv; break;
    case SY_RANK: rc = pi2_parse_int("--rank", optarg, 1, 4096, &v, err); o->plant_rank = (int)v; break;
    case SY_PRED: o->predictors = true; break;
    case SY_NSPREAD: rc = pi2_parse_double("--norm-spread", optarg, 0, 2, &dv, err); o->norm_spread = dv; break;
    case SY_TIED: d->tie_embeddings = true; break;
    case SY_SEED: rc = pi2_parse_int("--seed", optarg, 0, INT64_MAX, &v, err); o->seed = (uint64_t)v; break;
    case SY_SHARD: {
        uint64_t sz;
        rc = pi2_parse_size("--shard-size", optarg, &sz, err);
        if (rc == 0 && sz < (1u << 20))
            rc = pi2_err_set(err, PI2_EINVAL, "--shard-size '%s': must be at least 1M", optarg);
        o->shard_bytes = sz;
        break;
    }
    case 't':
    case SY_THREADS: rc = pi2_parse_int("--threads", optarg, 1, 64, &v, err); o->threads = (int)v; break;
    default: rc = pi2_err_set(err, PI2_EINVAL, "unknown option; see --help");
    }
    return rc;
}

/* The rest of d after the options: the experts used, the activation
 * (--act, default the preset's) and the architecture it implies, the head
 * size. 0, or 2 after a usage message. */
static int synth_finish_desc(pi2_model_desc *d, const char *act, double act_param)
{
    bool moe = d->n_experts > 0;
    if (moe && d->n_experts_used == 0)
        d->n_experts_used = d->n_experts < 2 ? d->n_experts : 2;
    if (!moe)
        d->n_experts_used = 0;
    if (!act)
        act = pi2_act_name(d->act);
    d->act_param = 0.0f;
    if (strcmp(act, "drelu") == 0) {
        d->act = PI2_ACT_DRELU;
        d->arch = moe ? PI2_ARCH_TURBOSPARSE_MIXTRAL : PI2_ARCH_BAMBOO;
    } else if (strcmp(act, "relu") == 0 || strcmp(act, "silu") == 0) {
        d->act = act[0] == 'r' ? PI2_ACT_RELU : PI2_ACT_SILU;
        d->arch = moe ? PI2_ARCH_MIXTRAL : PI2_ARCH_LLAMA;
    } else if (strcmp(act, "fatrelu") == 0) {
        d->act = PI2_ACT_FATRELU;
        d->act_param = act_param >= 0 ? (float)act_param : 0.01f; /* ProSparse's */
        d->arch = moe ? PI2_ARCH_MIXTRAL : PI2_ARCH_SPARSELLAMA;
    } else {
        fprintf(stderr, "pi2-convert synth: --act '%s': expected drelu, relu, silu or fatrelu\n", act);
        return 2;
    }
    if (act_param >= 0 && d->act != PI2_ACT_FATRELU) {
        fprintf(stderr, "pi2-convert synth: --act-param is fatrelu's threshold; give --act fatrelu\n");
        return 2;
    }
    d->head_dim = d->n_heads > 0 ? d->hidden / d->n_heads : 0;
    if (d->n_heads <= 0 || d->hidden % d->n_heads != 0) {
        fprintf(stderr, "pi2-convert synth: --heads %d must divide --hidden %d\n", d->n_heads, d->hidden);
        return 2;
    }
    return 0;
}

static int cmd_synth(int argc, char **argv)
{
    /* The preset comes first so the other flags override it, whatever the order. */
    const char *preset = NULL, *out = NULL, *fam = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--family") == 0 && i + 1 < argc)
            fam = argv[i + 1];
        else if (strcmp(argv[i], "--preset") == 0 && i + 1 < argc)
            preset = argv[i + 1];
        else if (strncmp(argv[i], "--preset=", 9) == 0)
            preset = argv[i] + 9;
        else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage_synth(stdout);
            return 0;
        }
    }
    pi2_err err = {0};
    pi2_synth_opts o;
    if (fam)
        return synth_family(argc, argv, fam);
    if (!preset) {
        fprintf(stderr, "pi2-convert synth: --preset is required (tiny, small, 1b, 7b, moe); see --help\n");
        return 2;
    }
    if (pi2_synth_preset(preset, &o, &err))
        return die("synth", &err, 2);
    const char *act = NULL;
    double act_param = -1;
    optind = 1;
    int c;
    int rc = 0;
    pi2_model_desc *d = &o.desc;
    bool quiet = false;
    while (rc == 0 && (c = getopt_long(argc, argv, ":o:t:hq", synth_opts, NULL)) != -1) {
        if (c == 'h') {
            usage_synth(stdout);
            return 0;
        }
        if (c == 'q') {
            quiet = true;
            continue;
        }
        if (c == '?' || c == ':')
            return pi2_cli_bad_option("pi2-convert synth", argv, c);
        rc = synth_take_flag(c, &o, &out, &act, &act_param, &err);
    }
    if (rc)
        return die("synth", &err, 2);
    if (optind < argc) {
        fprintf(stderr, "pi2-convert synth: unexpected argument '%s'; see --help\n", argv[optind]);
        return 2;
    }
    if (!out) {
        fprintf(stderr, "pi2-convert synth: -o DIR is required; see --help\n");
        return 2;
    }
    if ((rc = synth_finish_desc(d, act, act_param)) != 0)
        return rc;

    uint64_t total = pi2_synth_weight_bytes(&o);
    if (pi2_out_check(out, NULL, 0, PI2_OUT_DIR, total + (1u << 20), &err))
        return die("synth", &err, 1);
    progress_state ps = {isatty(2) && !quiet, pi2_now(), 0};
    char act_txt[48], vocab_txt[48];
    snprintf(act_txt, sizeof act_txt, d->act == PI2_ACT_FATRELU ? "%s, threshold %g" : "%s", pi2_act_name(d->act),
             (double)d->act_param);
    snprintf(vocab_txt, sizeof vocab_txt, o.n_tokens > 0 && o.n_tokens < d->vocab ? "%d (%d tokens)" : "%d",
             d->vocab, o.n_tokens);
    if (!quiet)
        printf("pi2-convert synth: %s, %s (%s), hidden %d, ffn %d, %d layers, %d experts, vocab %s, %s, %.2f GB\n",
            preset, pi2_arch_name(d->arch), act_txt, d->hidden, d->n_ff, d->n_layers, d->n_experts, vocab_txt,
            pi2_dtype_name(o.dtype), total / 1e9);
    fflush(stdout);
    if (pi2_synth_write(out, &o, on_progress, &ps, &err))
        return die(NULL, &err, 1);
    double el = pi2_now() - ps.t0;
    if (!quiet)
        printf("wrote %s: %.2f GB in %.1f s (%.0f MB/s), peak RSS %.0f MB\n", out, total / 1e9, el,
               el > 0 ? total / el / 1e6 : 0.0, pi2_peak_rss() / 1048576.0);
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
        pi2_version_print(stdout, "pi2-convert");
        return 0;
    }
    if (strcmp(argv[1], "synth") == 0)
        return cmd_synth(argc - 1, argv + 1);
    if (strcmp(argv[1], "export") == 0) {
        const char *in = NULL, *out = NULL;
        bool quiet = false;
        for (int i = 2; i < argc; i++) {
            if ((strcmp(argv[i], "-o") == 0 || strcmp(argv[i], "--output") == 0) && i + 1 < argc)
                out = argv[++i];
            else if (strcmp(argv[i], "-q") == 0 || strcmp(argv[i], "--quiet") == 0)
                quiet = true;
            else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
                usage(stdout);
                return 0;
            } else if (!in && argv[i][0] != '-')
                in = argv[i];
            else {
                fprintf(stderr, "pi2-convert export: unexpected argument '%s'; see --help\n", argv[i]);
                return 2;
            }
        }
        if (!in || !out) {
            fprintf(stderr, "pi2-convert export: usage: pi2-convert export CONVERTED -o DIR\n");
            return 2;
        }
        pi2_err err = {0};
        struct stat st;
        const char *inputs[] = {in};
        /* dequantized to f32: about 4x a q8 model, 7x a q4 one */
        if (pi2_out_check(out, inputs, 1, PI2_OUT_DIR, stat(in, &st) == 0 ? 4 * (uint64_t)st.st_size : 0, &err))
            return die("export", &err, 1);
        if (pi2_convert_export(in, out, &err))
            return die(NULL, &err, 1);
        if (!quiet)
            printf("wrote %s\n", out);
        return 0;
    }
    return cmd_convert(argc, argv);
}

int main(int argc, char **argv)
{
    pi2_tmp_cleanup_on_signals(); /* an interrupt leaves no temporary output behind */
    return pi2_exit_stdout("pi2-convert", tool_main(argc, argv));
}
