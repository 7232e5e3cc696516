/* pi2-run's subcommands (runtime/cli/run_*.c) and what they share.
 *
 * main (runtime/pi2-run.c) parses the command line into one run_opts and
 * hands it to one subcommand; nothing lives at file scope. What a run learns
 * on the way (the hardware-profile note, the model's calibration) sits in a
 * run_state that main owns and run_opts points to.
 *
 * Every run_* function returns the tool's exit status (0, 1 on a failure
 * already printed, 2 on a usage error). */
#ifndef PI2_CLI_RUN_H
#define PI2_CLI_RUN_H

#include "formats/tokenizer.h"
#include "runtime/chat_format.h"
#include "runtime/engine.h"
#include "runtime/hwprof.h"
#include "runtime/offload/io.h"
#include "runtime/kernels.h"
#include "runtime/planner.h"
#include "runtime/reference.h"
#include "runtime/sample.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* What a run learns on the way, owned by main and reached through run_opts. */
typedef struct run_state {
    char hw_note[4400];   /* why there is no hardware profile (for --stats and plan), or "" */
    pi2_plan_cal cal;     /* the model's learned planning factors */
    char cal_path[4400];  /* and where they live ("": none) */
} run_state;

typedef struct run_opts {
    run_state *st;
    const char *model, *ref, *prompt, *pubkey, *ppl, *io_probe, *device_path, *hw_profile, *plan_file;
    long long n_predict;
    int threads, ctx;
    bool stats, show_ids, dense, trust_unsigned, verify_ffn, bench, hw_probe, no_mlock, plan_only, gate_first;
    bool no_read_ahead;
    bool profile_hw, no_plan;
    bool force; /* --force: replace an output file that exists */
    bool quiet; /* -q: nothing on stderr but errors, --stats and --ids */
    const char *prompt_file; /* -f FILE: read into prompt by main */
    double profile_seconds, min_speed;
    uint64_t mem_limit;
    double hot_share;
    int io_backend, io_depth;
    int stream_attn; /* --stream-attn: the engine's offload.attn_stream */
    bool kv_f16;     /* --kv-type f16 */
    long long bench_pp, bench_tg, ppl_tokens;
    pi2_sample_opts so;
    /* chat and serve (run_chat.c, run_serve.c) */
    const char *system, *host, *api_key;
    const char *chat_template; /* --chat-template: a built-in name or a file (chat_format.h) */
    bool chat_drop_oldest;
    bool chat, serve; /* --chat, --serve: the chat and serve subcommands */
    int port, max_queue;
} run_opts;

/* One forward step of whichever model runs: token at pos -> logits. */
typedef int (*step_fn)(void *ctx, int32_t token, int pos, float *logits, pi2_err *err);

typedef struct gen_stats {
    double *lat; /* per generated token, seconds */
    size_t n_lat;
    double *reads; /* offloading: per generated token, reads from flash */
    size_t n_reads;
    double t_prefill;
    int n_prefill;
} gen_stats;

/* run_common.c */
int fail(const pi2_err *e); /* prints "pi2-run: MSG", returns 1 */
int cmp_double(const void *a, const void *b);
/* One warning line when the prompt's ids hold the tokenizer's unk token
 * (characters outside the vocabulary, which print as nothing). */
void warn_unknown(const pi2_tok *tok, const int32_t *ids, size_t n);
double pct(const double *v, size_t n, double p);
int generate_loop(const run_opts *o, const pi2_model_desc *d, const pi2_tok *tok, pi2_sampler *smp,
                  pi2_tok_stream *ts, float *logits, int pos, step_fn step, void *ctx, double *lat, size_t *n_lat,
                  long long *sampled, pi2_err *err);

/* Perplexity of the text (len bytes of o->ppl's file) under whichever
 * model step runs, the tokens both paths score alike: the first
 * min(tokens, o->ppl_tokens, max_pos - 1), the first step on BOS (or on
 * the first token, then not scored), each next token scored against the
 * softmax of the rows the tokenizer defines (a padded vocabulary's rows
 * are never output). *ppl, the tokens scored and the seconds they took. */
typedef struct ppl_result {
    double ppl, secs;
    size_t scored;
} ppl_result;
int ppl_run(const run_opts *o, const pi2_model_desc *d, const pi2_tok *tok, const char *text, size_t len, int max_pos,
            step_fn step, void *ctx, ppl_result *r, pi2_err *err);

/* run_engine.c */
int load_hw(const run_opts *o, pi2_hwprof **out, pi2_err *err);
/* The engine's options for a run with ctx positions, and what they point
 * to (the key, the hardware profile, a given plan; the model's calibration
 * lives in o->st): freed with run_engine_opts_free. */
typedef struct run_engine_opts {
    pi2_engine_opts eo;
    pi2_sign_key *key;
    pi2_hwprof *hw;
    pi2_plan plan;
} run_engine_opts;
int run_opts_engine(const run_opts *o, int ctx, run_engine_opts *r, pi2_err *err);
void run_engine_opts_free(run_engine_opts *r);
/* The flag that fixes a refused container (a key, --trust-unsigned), by
 * error code: err rewritten to name it. */
void run_flag_hint(const run_opts *o, bool have_key, int rc, pi2_err *err);
int open_engine(const run_opts *o, int ctx, pi2_engine **e, pi2_err *err);
/* After pi2_engine_set_ctx(ctx) failed with rc: name --ctx when the memory
 * plan is what refused it. */
void run_ctx_hint(const run_opts *o, int rc, int ctx, pi2_err *err);
void learn(const run_opts *o, pi2_engine *e, double tok_s, size_t tokens);
uint64_t reads_so_far(const pi2_engine *e);
void reads_pcts(double *v, size_t n, double out[3]);
/* changed: the resident members' digests differ from those verified at
 * load (pi2_engine_recheck): said after the signature. */
void print_stats(const run_opts *o, pi2_engine *e, const gen_stats *g, double t_load, bool changed, FILE *f);

/* the subcommands */
int run_generate(const run_opts *o);
int run_reference(const run_opts *o);
int run_reference_ppl(const run_opts *o);
int run_bench(const run_opts *o);
int run_ppl(const run_opts *o);
int run_plan(const run_opts *o);
int run_hw_probe(const run_opts *o);
int run_io_probe(const run_opts *o);
int run_profile_hw(const run_opts *o, int nargs, char **args);
int run_chat(const run_opts *o);
/* The context chat and serve run with: --ctx, else up to 2048 positions
 * (the model's at most) when the memory plan allows them. */
/* The chat format of a chat or serve run into *t (its storage *cc, freed
 * with pi2_jinja_config_free): --chat-template when given, else the
 * model's own when its container keeps one, else ChatML (*use NULL). */
int run_chat_template(const run_opts *o, const pi2_engine *e, pi2_chat_template *t, pi2_chat_config *cc,
                      const pi2_chat_template **use, pi2_err *err);
void run_chat_ctx(const run_opts *o, pi2_engine *e);
int run_serve(const run_opts *o);

#endif
