/* pi2-run plan: the memory plan at --mem-limit, as JSON. */
#include "runtime/cli/run.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* --plan-only: the memory plan for --mem-limit, as one JSON line. */
int run_plan(const run_opts *o)
{
    pi2_err err = {0};
    pi2_engine *e = NULL;
    if (!o->mem_limit) {
        fprintf(stderr, "pi2-run: plan needs --mem-limit SIZE\n");
        return 2;
    }
    long long ctx = o->ctx > 0 ? o->ctx
                    : o->bench ? o->bench_pp + o->bench_tg
                               : (long long)strlen(o->prompt) + 4 + o->n_predict;
    if (open_engine(o, (int)(ctx < (1 << 20) ? ctx : 1 << 20), &e, &err) != 0)
        return fail(&err);
    pi2_engine_offload_info in;
    pi2_engine_offload_info_get(e, &in);
    char mem[1536];
    snprintf(mem, sizeof mem,
             "{\"ctx\":%d,\"threads\":%d,\"mem_limit\":%llu,\"minimum_bytes\":%llu,"
             "\"planned_bytes\":%llu,\"resident_bytes\":%llu,\"kv_bytes\":%llu,\"buffer_bytes\":%llu,"
             "\"overhead_bytes\":%llu,\"hot_bytes\":%llu,\"gate_hot_bytes\":%llu,\"cache_bytes\":%llu,"
             "\"cache_slots\":%u,\"ffn_bytes\":%llu,\"offloaded\":%.4f,\"io\":\"%s\",\"io_depth\":%d}",
             pi2_engine_ctx(e), pi2_engine_threads(e), (unsigned long long)in.mem_limit, (unsigned long long)in.minimum,
             (unsigned long long)in.planned, (unsigned long long)in.resident, (unsigned long long)in.kv,
             (unsigned long long)in.buffers, (unsigned long long)in.overhead, (unsigned long long)in.hot,
             (unsigned long long)in.gate_hot, (unsigned long long)in.cache, in.cache_slots,
             (unsigned long long)in.ffn_total, in.offloaded, in.backend, in.io_depth);
    if (in.plan) { /* the plan, loadable with --plan, with the memory it makes */
        char *pj = pi2_plan_json(in.plan, o->model);
        if (!pj) {
            pi2_engine_close(e);
            fprintf(stderr, "pi2-run: out of memory\n");
            return 1;
        }
        size_t n = strlen(pj);
        printf("%.*s,\"source\":\"%s\",\"memory\":%s}\n", (int)(n - 1), pj, in.plan_source, mem);
        free(pj);
    } else {
        printf("{\"model\":\"%s\",\"source\":\"%s\",\"note\":\"%s\",\"memory\":%s}\n", o->model, in.plan_source,
               o->st->hw_note, mem);
    }
    pi2_engine_close(e);
    return 0;
}
