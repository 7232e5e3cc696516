/* pi2-run: generate text with a bundled model.pi2 (the sparse engine), or
 * with the dense fp32 reference over a Hugging Face directory; the
 * command line and the choice of subcommand (runtime/cli/run_*.c). */
#include "runtime/cli/run.h"
#include "runtime/version.h"

#include <getopt.h>
#include <pthread.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: pi2-run [generate] MODEL.pi2 [-p TEXT] [-n N] [-t N] [sampling options] [--stats]\n"
            "       pi2-run generate --reference HF_DIR [-p TEXT] [-n N] [sampling options]\n"
            "       pi2-run bench MODEL.pi2 [--bench-pp N] [--bench-tg N] [-t N] [--dense]\n"
            "       pi2-run ppl MODEL.pi2 TEXTFILE [--ppl-tokens N] [--dense]\n"
            "       pi2-run plan MODEL.pi2 [--mem-limit SIZE] [--min-speed X] [--no-plan]\n"
            "       pi2-run probe hw [-t N]\n"
            "       pi2-run probe io FILE\n"
            "       pi2-run probe profile [MODEL.pi2] [--device-path DIR] [--hw-profile FILE] [-t N]\n"
            "       pi2-run chat MODEL.pi2 [--system TEXT] [--chat-drop-oldest] [run options]\n"
            "       pi2-run serve MODEL.pi2 [--host ADDR] [--port N] [--api-key KEY] [--max-queue N]\n"
            "(the older forms --bench, --ppl FILE, --plan-only, --hw-probe, --io-probe FILE,\n"
            "--profile-hw, --chat and --serve select the same subcommands)\n"
            "\n");
    fprintf(f,
            "Generate text with a bundled, signed model (pi2-bundle output). The container is\n"
            "memory-mapped and checked at load: its signature, then the SHA-256 of every member.\n"
            "Prompts run as dense batches; each generated token runs the sparse FFN: the\n"
            "predictor picks the neurons likely to fire and only their weights are read.\n"
            "Text streams to stdout as it is generated; greedy decoding unless --temp is given.\n"
            "\n"
            "  -m, --model FILE   the model (MODEL.pi2; also given as the first argument)\n"
            "  -p, --prompt T     prompt text (default: empty, generation starts after BOS); - reads it\n"
            "                     from stdin\n"
            "  -f, --file FILE    the prompt from FILE (one trailing newline dropped, as for -p -)\n"
            "  -n, --n-predict N  tokens to generate (default 64); stops earlier at an end of turn\n"
            "                     (the model's EOS ids, with its generation and tokenizer configs') or BOS\n"
            "  -t, --threads N    compute threads (default: all cores)\n"
            "  --temp T           sampling temperature (default 0 = greedy)\n"
            "  --top-k K          keep the K most likely tokens (default 0 = all)\n"
            "  --top-p P          keep the smallest set with probability mass P (default 1)\n"
            "  --seed S           sampling seed (default 1)\n"
            "  --dense            exact mode: no predictors, every neuron computed\n"
            "  --pubkey PUB.pem   key the model must be signed with (default: $PI2_PUBKEY,\n"
            "                     else ~/.config/pi2/pubkey.pem when it exists)\n"
            "  --trust-unsigned   run an unsigned container\n"
            "  --no-verify-ffn    hash only the resident members at load, not the FFN payloads\n"
    );
    fprintf(f, /* ISO C caps a string literal at 4095 bytes */
            "  --mem-limit SIZE   offload: keep the whole footprint (RSS plus the page cache it\n"
            "                     causes) under SIZE (e.g. 3G, 512M); FFN weights are read from\n"
            "                     the file with direct I/O into a neuron cache as they are needed\n"
            "  --hot-share F      offload: share of the FFN memory for the hot segment (default 1: all\n"
            "                     but the smallest neuron cache)\n"
            "  --io NAME          offload: reader, auto, uring or pread (default auto)\n"
            "  --io-depth N       offload: reads in flight (default 64)\n"
            "  --no-mlock         offload: do not pin the hot segment (pinned where permitted)\n"
            "  --gate-first       offload, dReLU: read up/down rows only once the gate fired\n"
            "                     (default: in the same read as a missing gate)\n"
            "  --no-read-ahead    offload: do not read the next layer's likely neurons (MoE: experts) during attention\n"
            "  --stream-attn N    offload: read the attention of the last N layers from the file each\n"
            "                     token, a layer ahead, instead of keeping it; auto (default): the\n"
            "                     fewest layers the limit needs; off: never\n"
            "  --plan-only        offload: print the plan for --mem-limit (JSON: hot and gate-only\n"
            "                     groups per FFN, threads, I/O depth, memory, predicted speeds) and stop;\n"
            "                     without --mem-limit, the least memory and a table of limits\n"
            "  --plan FILE        offload: run this plan (a saved --plan-only output)\n"
            "  --no-plan          offload: the fixed split (--hot-share, --io-depth), not the planner's\n"
            "  --min-speed X      offload: refuse a --mem-limit whose best plan decodes below X tok/s\n"
            "  -c, --ctx N        KV cache positions (default: prompt + -n)\n"
            "  --kv-type T        KV cache element type: f32 (default) or f16 (half the memory and\n"
            "                     the bytes attention reads; keys and values rounded to fp16)\n"
            "  --isa NAME         force the kernels: scalar, avx2, avx512vnni (x86-64), neon, dotprod,\n"
            "                     i8mm (arm64) (default: best; --version lists this build's)\n"
            "  --stats            print speed, latency percentiles, sparsity and memory to stderr\n"
            "  --ids              print the prompt and generated token ids to stderr\n"
            "  --bench            fixed workload: prompt processing then generation; prints one\n"
            "                     JSON line (like llama-bench -p 128 -n 64)\n"
            "  --bench-pp N       prompt tokens of --bench (default 128)\n"
            "  --bench-tg N       generated tokens of --bench (default 64)\n"
            "  --ppl FILE         perplexity of a text file, token by token on the decode path\n"
            "  --ppl-tokens N     at most N tokens of it (default 512)\n"
            "  --reference DIR    run the dense fp32 reference over a Hugging Face directory\n");
    fprintf(f, /* in two parts: ISO C caps a string literal at 4095 bytes */
            "  --hw-probe         measure int8 dot peak and memory read bandwidth; print JSON\n"
            "  --io-probe FILE    measure direct-read throughput and latency on FILE (random\n"
            "                     reads of 4K..256K at depths 1, 8, 32, and sequential 1M ones: FILE\n"
            "                     holds 1 MB at least); print JSON\n"
            "  --profile-hw       measure this machine for the planner, under a minute: pi2's kernels\n"
            "                     on 1..-t threads (default: all cores, at most 16) and direct reads of\n"
            "                     a scratch file in --device-path; save to --hw-profile, print JSON\n"
            "  --device-path DIR  the storage to measure: where the models live (default: the\n"
            "                     directory of MODEL.pi2 when given, else .)\n"
            "  --hw-profile FILE  the hardware profile (default: $PI2_HW_PROFILE, else\n"
            "                     ${XDG_CACHE_HOME:-~/.cache}/pi2/hw-<device>.json)\n"
            "  --profile-seconds X  seconds per --profile-hw figure (default: chosen to finish\n"
            "                     under a minute; small values for tests)\n"
            "  --force            --profile-hw: replace a --hw-profile FILE that is not a hardware\n"
            "                     profile (a profile is refreshed; the model is never overwritten)\n"
            "  -q, --quiet        nothing on stderr but errors and what --stats or --ids ask for\n"
            "                     (no plan summary, no --profile-hw progress, no warnings)\n"
            "  -h, --help         this help\n"
            "  --version          version, build and kernel paths\n");
    fprintf(f,
            "\n"
            "chat: a conversation, from a terminal or one message per line of stdin; the reply\n"
            "streams to stdout, then a newline. /reset, /quit, /help. -n is per reply.\n"
            "  --system TEXT      the system prompt\n"
            "  --chat-template T  chat and serve: the chat format, a Jinja chat template: a built-in\n"
            "                     (chatml, llama2, mistral, vicuna), the model's tokenizer_config.json\n"
            "                     (or the HF directory holding it), or a template file (default: the\n"
            "                     model's own when its container keeps one, else chatml)\n"
            "  --chat-drop-oldest when the conversation outgrows the context, drop its oldest\n"
            "                     turns (default: say so and keep the conversation as it is)\n"
            "serve: an OpenAI-compatible HTTP server (POST /v1/chat/completions, /v1/completions,\n"
            "GET /v1/models, /health); requests run one at a time in arrival order.\n"
            "  --host ADDR        address to listen on (default 127.0.0.1: this machine only)\n"
            "  --port N           port (default 8080; 0: any free port, printed at start)\n"
            "  --api-key KEY      require \"Authorization: Bearer KEY\"\n"
            "  --max-queue N      requests waiting at most (default 16; more get 503)\n");
    fprintf(f,
            "\n"
            "exit status: 0 ok, 1 failure (bad input, refused container, failed write), 2 bad usage\n"
            "\n"
            "examples:\n"
            "  pi2-run model.pi2 --pubkey pub.pem -p \"Once upon a time\" -n 48 --stats\n"
            "  pi2-run bench model.pi2 --pubkey pub.pem -t 2\n"
            "  pi2-run model.pi2 --pubkey pub.pem --mem-limit 3G -p \"Once upon a time\" --stats\n"
            "  pi2-run probe profile model.pi2 -t 2\n"
            "  pi2-run chat model.pi2 --pubkey pub.pem --system \"You are helpful.\" -n 256\n"
            "  pi2-run serve model.pi2 --pubkey pub.pem --port 8080 --mem-limit 3G\n"
            "  pi2-run plan model.pi2 --pubkey pub.pem   # least memory; speeds up to all in memory\n"
            "  pi2-run plan model.pi2 --pubkey pub.pem --mem-limit 3G --min-speed 5 > plan.json\n"
            "  pi2-run --reference ../shared/models/tinystories-656k -p \"Once upon a time, there was a\" -n 48\n");
}

/* Subcommands, in the order of run_mode. */
typedef enum { RUN_NONE, RUN_GENERATE, RUN_BENCH, RUN_PPL, RUN_PLAN, RUN_PROBE, RUN_CHAT, RUN_SERVE } run_mode;
static const char *const mode_names[] = {"generate", "bench", "ppl", "plan", "probe", "chat", "serve"};

/* Turn a subcommand and its positional arguments (argv[*optind..]) into the
 * options the older flag forms set: bench = --bench, ppl MODEL TEXT = --ppl
 * TEXT, plan = --plan-only, probe hw|io FILE|profile [MODEL] = --hw-probe,
 * --io-probe FILE, --profile-hw. 0, or the exit status of a usage error. */
static int apply_mode(run_mode mode, run_opts *o, int *argc, char **argv, int *optind_)
{
    int i = *optind_, n = *argc - i;
    switch (mode) {
    case RUN_NONE:
    case RUN_GENERATE: break;
    case RUN_CHAT:
    case RUN_SERVE: break;
    case RUN_BENCH: o->bench = true; break;
    case RUN_PLAN: o->plan_only = true; break;
    case RUN_PPL:
        if (!o->ppl) {
            if (n < 2) {
                fprintf(stderr, "pi2-run: usage: pi2-run ppl MODEL.pi2 TEXTFILE (see --help)\n");
                return 2;
            }
            o->ppl = argv[i + 1];
            argv[i + 1] = argv[*argc - 1];
            (*argc)--;
        }
        break;
    case RUN_PROBE: {
        const char *kind = n > 0 ? argv[i] : "";
        if (strcmp(kind, "hw") == 0 && n == 1)
            o->hw_probe = true;
        else if (strcmp(kind, "io") == 0 && n == 2)
            o->io_probe = argv[i + 1];
        else if (strcmp(kind, "profile") == 0 && n <= 2)
            o->profile_hw = true;
        else {
            fprintf(stderr, "pi2-run: usage: pi2-run probe hw | io FILE | profile [MODEL.pi2] (see --help)\n");
            return 2;
        }
        (*optind_)++;
        break;
    }
    }
    return 0;
}

enum {
    O_REF = 256, O_TEMP, O_TOPK, O_TOPP, O_SEED, O_STATS, O_IDS, O_DENSE, O_PUBKEY, O_TRUST, O_NOVERIFY,
    O_CTX, O_ISA, O_BENCH, O_BPP, O_BTG, O_PPL, O_PPLN, O_PROBE, O_MEM, O_HOT, O_IO, O_IODEPTH, O_MLOCK,
    O_IOPROBE, O_PLAN, O_GATEFIRST, O_PROFHW, O_DEVPATH, O_HWPROF, O_PROFSEC, O_PLANFILE, O_NOPLAN, O_MINSPEED,
    O_NORA, O_FORCE, O_VERSION, O_STREAMATTN, O_KVTYPE
};

/* chat and serve */
enum { O_SYSTEM = 512, O_DROPOLD, O_HOST, O_PORT, O_APIKEY, O_MAXQ, O_CHATTMPL, O_CHAT, O_SERVE };

static int take_chat_flag(int c, run_opts *o, pi2_err *err)
{
    long long v = 0;
    int rc = 0;
    switch (c) {
    case O_SYSTEM: o->system = optarg; break;
    case O_CHAT: o->chat = true; break;
    case O_SERVE: o->serve = true; break;
    case O_CHATTMPL: o->chat_template = optarg; break;
    case O_DROPOLD: o->chat_drop_oldest = true; break;
    case O_HOST: o->host = optarg; break;
    case O_PORT: rc = pi2_parse_int("--port", optarg, 0, 65535, &v, err); o->port = (int)v; break;
    case O_APIKEY: o->api_key = optarg; break;
    case O_MAXQ: rc = pi2_parse_int("--max-queue", optarg, 1, 4096, &v, err); o->max_queue = (int)v; break;
    default: rc = pi2_err_set(err, PI2_EINVAL, "unknown option; see --help");
    }
    return rc;
}

static const struct option opts[] = {
    {"reference", required_argument, 0, O_REF},   {"prompt", required_argument, 0, 'p'},
    {"n-predict", required_argument, 0, 'n'},     {"threads", required_argument, 0, 't'},
    {"temp", required_argument, 0, O_TEMP},       {"top-k", required_argument, 0, O_TOPK},
    {"top-p", required_argument, 0, O_TOPP},      {"seed", required_argument, 0, O_SEED},
    {"stats", no_argument, 0, O_STATS},           {"ids", no_argument, 0, O_IDS},
    {"dense", no_argument, 0, O_DENSE},           {"pubkey", required_argument, 0, O_PUBKEY},
    {"trust-unsigned", no_argument, 0, O_TRUST},  {"no-verify-ffn", no_argument, 0, O_NOVERIFY},
    {"ctx", required_argument, 0, O_CTX},         {"isa", required_argument, 0, O_ISA},
    {"model", required_argument, 0, 'm'},
    {"bench", no_argument, 0, O_BENCH},           {"bench-pp", required_argument, 0, O_BPP},
    {"bench-tg", required_argument, 0, O_BTG},    {"ppl", required_argument, 0, O_PPL},
    {"ppl-tokens", required_argument, 0, O_PPLN}, {"hw-probe", no_argument, 0, O_PROBE},
    {"mem-limit", required_argument, 0, O_MEM},   {"hot-share", required_argument, 0, O_HOT},
    {"io", required_argument, 0, O_IO},           {"io-depth", required_argument, 0, O_IODEPTH},
    {"no-mlock", no_argument, 0, O_MLOCK},        {"gate-first", no_argument, 0, O_GATEFIRST},
    {"io-probe", required_argument, 0, O_IOPROBE}, {"no-read-ahead", no_argument, 0, O_NORA},
    {"stream-attn", required_argument, 0, O_STREAMATTN}, {"kv-type", required_argument, 0, O_KVTYPE},
    {"profile-hw", no_argument, 0, O_PROFHW},     {"device-path", required_argument, 0, O_DEVPATH},
    {"hw-profile", required_argument, 0, O_HWPROF}, {"profile-seconds", required_argument, 0, O_PROFSEC},
    {"plan", required_argument, 0, O_PLANFILE},   {"no-plan", no_argument, 0, O_NOPLAN},
    {"min-speed", required_argument, 0, O_MINSPEED},
    {"plan-only", no_argument, 0, O_PLAN},        {"help", no_argument, 0, 'h'},
    {"force", no_argument, 0, O_FORCE},           {"file", required_argument, 0, 'f'},
    {"version", no_argument, 0, O_VERSION},       {"quiet", no_argument, 0, 'q'},
    /* chat and serve */
    {"system", required_argument, 0, O_SYSTEM},   {"chat-drop-oldest", no_argument, 0, O_DROPOLD},
    {"chat-template", required_argument, 0, O_CHATTMPL},
    {"chat", no_argument, 0, O_CHAT},             {"serve", no_argument, 0, O_SERVE},
    {"host", required_argument, 0, O_HOST},       {"port", required_argument, 0, O_PORT},
    {"api-key", required_argument, 0, O_APIKEY},  {"max-queue", required_argument, 0, O_MAXQ},
    {0, 0, 0, 0}};

static int take_isa(const char *arg, pi2_err *err)
{
    pi2_isa isa = (pi2_isa)-1;
    for (int i = PI2_ISA_SCALAR; i < PI2_ISA_COUNT; i++)
        if (strcmp(arg, pi2_k_isa_name((pi2_isa)i)) == 0)
            isa = (pi2_isa)i;
    if ((int)isa < 0)
        return pi2_err_set(err, PI2_EINVAL,
                           "--isa: '%s' is not one of scalar, avx2, avx512vnni (x86-64), neon, dotprod, i8mm (arm64)", arg);
    if (pi2_k_set_isa(isa) != 0)
        return pi2_err_set(err, PI2_EUNSUPPORTED, "--isa %s: this CPU does not support it", arg);
    return 0;
}

static int take_io(const char *arg, int *backend, pi2_err *err)
{
    static const char *const names[] = {"auto", "uring", "pread"};
    for (int i = 0; i < 3; i++)
        if (strcmp(arg, names[i]) == 0) {
            *backend = i;
            return 0;
        }
    return pi2_err_set(err, PI2_EINVAL, "--io: '%s' is not one of auto, uring, pread", arg);
}

/* --stream-attn N|auto|off into the engine's attn_stream (N, 0, -1). */
static int take_stream_attn(const char *arg, int *out, pi2_err *err)
{
    long long v;
    if (strcmp(arg, "auto") == 0 || strcmp(arg, "off") == 0) {
        *out = arg[0] == 'a' ? 0 : -1;
        return 0;
    }
    int rc = pi2_parse_int("--stream-attn", arg, 1, 1 << 20, &v, err);
    if (rc) {
        pi2_err_clear(err);
        return pi2_err_set(err, PI2_EINVAL, "--stream-attn: '%s' is not a layer count, auto or off", arg);
    }
    *out = (int)v;
    return 0;
}

/* One parsed option c (getopt_long's value; its argument in optarg) into o:
 * 0 or a PI2_E* code with err filled. */
static int take_flag(int c, run_opts *o, pi2_err *err)
{
    long long v;
    double dv;
    int rc = 0;
    switch (c) {
    case O_REF: o->ref = optarg; break;
    case 'm':
        if (o->model)
            return pi2_err_set(err, PI2_EINVAL, "-m: the model is given twice");
        o->model = optarg;
        break;
    case 'p': o->prompt = optarg; break;
    case 'f': o->prompt_file = optarg; break;
    case 'q': o->quiet = true; break;
    case 'n': rc = pi2_parse_int("-n", optarg, 0, 1 << 24, &o->n_predict, err); break;
    case 't': rc = pi2_parse_int("-t", optarg, 1, 256, &v, err); o->threads = (int)v; break;
    case O_TEMP: rc = pi2_parse_double("--temp", optarg, 0, 1e4, &dv, err); o->so.temperature = (float)dv; break;
    case O_TOPK: rc = pi2_parse_int("--top-k", optarg, 0, 1 << 30, &v, err); o->so.top_k = (int)v; break;
    case O_TOPP:
        rc = pi2_parse_double("--top-p", optarg, 1e-9, 1, &dv, err);
        o->so.top_p = (float)dv;
        break;
    case O_SEED: rc = pi2_parse_int("--seed", optarg, 0, INT64_MAX, &v, err); o->so.seed = (uint64_t)v; break;
    case O_STATS: o->stats = true; break;
    case O_IDS: o->show_ids = true; break;
    case O_DENSE: o->dense = true; break;
    case O_PUBKEY: o->pubkey = optarg; break;
    case O_TRUST: o->trust_unsigned = true; break;
    case O_NOVERIFY: o->verify_ffn = false; break;
    case 'c':
    case O_CTX: rc = pi2_parse_int("--ctx", optarg, 1, 1 << 20, &v, err); o->ctx = (int)v; break;
    case O_ISA: return take_isa(optarg, err);
    case O_BENCH: o->bench = true; break;
    case O_BPP: rc = pi2_parse_int("--bench-pp", optarg, 1, 1 << 16, &o->bench_pp, err); break;
    case O_BTG: rc = pi2_parse_int("--bench-tg", optarg, 1, 1 << 16, &o->bench_tg, err); break;
    case O_PPL: o->ppl = optarg; break;
    case O_PPLN: rc = pi2_parse_int("--ppl-tokens", optarg, 2, 1 << 20, &o->ppl_tokens, err); break;
    case O_PROBE: o->hw_probe = true; break;
    case O_MEM:
        rc = pi2_parse_size("--mem-limit", optarg, &o->mem_limit, err);
        if (rc == 0 && o->mem_limit == 0)
            rc = pi2_err_set(err, PI2_EINVAL, "--mem-limit: give a size above zero, e.g. 3G or 512M");
        break;
    case O_HOT: rc = pi2_parse_double("--hot-share", optarg, 0, 1, &o->hot_share, err); break;
    case O_IO: return take_io(optarg, &o->io_backend, err);
    case O_IODEPTH: rc = pi2_parse_int("--io-depth", optarg, 1, 4096, &v, err); o->io_depth = (int)v; break;
    case O_MLOCK: o->no_mlock = true; break;
    case O_GATEFIRST: o->gate_first = true; break;
    case O_NORA: o->no_read_ahead = true; break;
    case O_STREAMATTN: return take_stream_attn(optarg, &o->stream_attn, err);
    case O_KVTYPE:
        if (strcmp(optarg, "f16") != 0 && strcmp(optarg, "f32") != 0)
            return pi2_err_set(err, PI2_EINVAL, "--kv-type: '%s' is not f16 or f32", optarg);
        o->kv_f16 = strcmp(optarg, "f16") == 0;
        break;
    case O_IOPROBE: o->io_probe = optarg; break;
    case O_PLAN: o->plan_only = true; break;
    case O_PROFHW: o->profile_hw = true; break;
    case O_DEVPATH: o->device_path = optarg; break;
    case O_HWPROF: o->hw_profile = optarg; break;
    case O_PROFSEC: rc = pi2_parse_double("--profile-seconds", optarg, 0.001, 60, &o->profile_seconds, err); break;
    case O_PLANFILE: o->plan_file = optarg; break;
    case O_NOPLAN: o->no_plan = true; break;
    case O_FORCE: o->force = true; break;
    case O_MINSPEED: rc = pi2_parse_double("--min-speed", optarg, 1e-6, 1e9, &o->min_speed, err); break;
    default: rc = take_chat_flag(c, o, err);
    }
    return rc;
}

/* After the options: the subcommand's arguments, the checks between
 * options, and the run they select. The exit status. */
static int dispatch(run_opts *o, run_mode mode, int argc, char **argv, int optind_)
{
    int rc;
    if (mode != RUN_NONE && (rc = apply_mode(mode, o, &argc, argv, &optind_)) != 0)
        return rc;
    if (o->hw_probe)
        return run_hw_probe(o);
    if (o->profile_hw)
        return run_profile_hw(o, argc - optind_, argv + optind_);
    if (o->io_probe)
        return run_io_probe(o);
    if (optind_ < argc && !o->model)
        o->model = argv[optind_++];
    if (optind_ < argc) {
        fprintf(stderr, "pi2-run: unexpected argument '%s'; see --help\n", argv[optind_]);
        return 2;
    }
    if (o->ref && o->model) {
        fprintf(stderr, "pi2-run: give either MODEL.pi2 or --reference HF_DIR, not both\n");
        return 2;
    }
    bool chat = mode == RUN_CHAT || o->chat, serve = mode == RUN_SERVE || o->serve;
    if ((chat && serve) || ((chat || serve) && (o->bench || o->ppl || o->plan_only))) {
        fprintf(stderr, "pi2-run: chat, serve, bench, ppl and plan are separate runs; give one\n");
        return 2;
    }
    mode = chat ? RUN_CHAT : serve ? RUN_SERVE : mode;
    if (o->ref && (mode == RUN_CHAT || mode == RUN_SERVE)) {
        fprintf(stderr, "pi2-run: chat and serve run a bundled model, not --reference\n");
        return 2;
    }
    if (o->ref && o->bench) {
        fprintf(stderr, "pi2-run: bench runs a bundled model; --reference generates or scores (--ppl FILE)\n");
        return 2;
    }
    if (o->ref)
        return o->ppl ? run_reference_ppl(o) : run_reference(o);
    if (!o->model) {
        fprintf(stderr, "pi2-run: no model given; usage: pi2-run MODEL.pi2 -p TEXT (see --help)\n");
        return 2;
    }
    if (!o->mem_limit && (o->plan_file || (o->no_plan && !o->plan_only) || o->min_speed > 0)) {
        fprintf(stderr, "pi2-run: %s plans offloading: give --mem-limit SIZE too\n",
                o->plan_file ? "--plan" : o->no_plan ? "--no-plan" : "--min-speed");
        return 2;
    }
    if (o->plan_file && o->no_plan) {
        fprintf(stderr, "pi2-run: give either --plan FILE or --no-plan, not both\n");
        return 2;
    }
    if (mode == RUN_CHAT || mode == RUN_SERVE)
        return mode == RUN_CHAT ? run_chat(o) : run_serve(o);
    if (o->plan_only)
        return run_plan(o);
    if (o->bench && o->ppl) {
        fprintf(stderr, "pi2-run: --bench and --ppl are separate runs; give one\n");
        return 2;
    }
    if (o->bench)
        return run_bench(o);
    if (o->ppl)
        return run_ppl(o);
    return run_generate(o);
}

/* -f FILE or -p -: the prompt read from the file or stdin into *buf (the
 * caller frees it), one trailing newline dropped. */
static int read_prompt(run_opts *o, char **buf, pi2_err *err)
{
    bool from_stdin = strcmp(o->prompt, "-") == 0;
    if (o->prompt_file && (*o->prompt || from_stdin))
        return pi2_err_set(err, PI2_EINVAL, "give either -p TEXT or -f FILE, not both");
    if (!o->prompt_file && !from_stdin)
        return 0;
    const char *path = o->prompt_file ? o->prompt_file : "/dev/stdin";
    size_t len = 0;
    int rc = pi2_read_file(path, 64u << 20, buf, &len, err);
    if (rc)
        return rc;
    if (strlen(*buf) != len)
        return pi2_err_set(err, PI2_EINVAL, "%s: the prompt holds a NUL byte; give text", o->prompt_file ? path : "stdin");
    if (len > 0 && (*buf)[len - 1] == '\n')
        (*buf)[--len] = 0;
    o->prompt = *buf;
    return 0;
}

static int tool_main(int argc, char **argv)
{
    run_opts o = {.prompt = "", .n_predict = 64, .verify_ffn = true, .bench_pp = 128, .bench_tg = 64,
                  .hot_share = 1.0, .io_depth = 64,
                  .port = 8080, .max_queue = 16,
                  .ppl_tokens = 512, .so = {.temperature = 0, .top_k = 0, .top_p = 1, .seed = 1}};
    run_state st = {0};
    o.st = &st;
    pi2_err err = {0};
    int c, rc = 0;
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    /* The subcommand, when given (none: generate, or the mode a flag names). */
    run_mode mode = RUN_NONE;
    for (int i = 0; i < (int)(sizeof mode_names / sizeof *mode_names); i++)
        if (strcmp(argv[1], mode_names[i]) == 0)
            mode = (run_mode)(i + 1);
    if (mode != RUN_NONE) {
        argv[1] = argv[0];
        argv++, argc--;
    }
    opterr = 0; /* one line per error: ours */
    while (rc == 0 && (c = getopt_long(argc, argv, ":p:f:n:t:m:c:hq", opts, NULL)) != -1) {
        if (c == 'h') {
            usage(stdout);
            return 0;
        }
        if (c == O_VERSION) {
            pi2_version_print(stdout, "pi2-run");
            return 0;
        }
        if (c == '?' || c == ':')
            return pi2_cli_bad_option("pi2-run", argv, c);
        rc = take_flag(c, &o, &err);
    }
    if (rc) {
        fail(&err);
        return 2;
    }
    char *prompt = NULL;
    if ((rc = read_prompt(&o, &prompt, &err)) != 0) {
        fail(&err);
        return rc == PI2_EINVAL ? 2 : 1;
    }
    rc = dispatch(&o, mode, argc, argv, optind);
    free(prompt);
    return rc;
}

int main(int argc, char **argv)
{
    pi2_tmp_cleanup_on_signals(); /* an interrupt leaves no temporary output behind */
    pi2_err err = {0};
    if (pi2_map_guard_install(&err) != 0) /* a model cut short under the run: one line, not a SIGBUS */
        fprintf(stderr, "pi2-run: %s (a model cut short while in use ends the run without a message)\n", err.msg);
    return pi2_exit_stdout("pi2-run", tool_main(argc, argv));
}
