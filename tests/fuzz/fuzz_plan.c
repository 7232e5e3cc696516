/* Fuzz target: the planner's files (runtime/plan_json.c): the input as a
 * plan (pi2_plan_load) and as a model calibration (pi2_plan_cal_load). A
 * plan read must write back (pi2_plan_json) and read back the same; a
 * calibration read must save and load back the same figures. */
#include "runtime/planner.h"
#include "tests/fuzz/fuzz_util.h"

#include <string.h>

/* The plan p written, read back and compared. */
static void plan_round_trip(const pi2_plan *p)
{
    char path[64];
    char *js = pi2_plan_json(p, "fuzz.pi2");
    if (!js)
        return;
    pi2_plan q;
    pi2_err e = {0};
    if (fuzz_tmpfile((const uint8_t *)js, strlen(js), path) == 0) {
        if (pi2_plan_load(path, &q, &e) != 0) {
            fprintf(stderr, "a written plan does not read back: %s\n", e.msg);
            abort();
        }
        if (q.n_ffn != p->n_ffn || q.mem_limit != p->mem_limit || q.threads != p->threads ||
            q.io_depth != p->io_depth || q.gate_first != p->gate_first ||
            memcmp(q.hot_groups, p->hot_groups, p->n_ffn * sizeof *p->hot_groups) != 0 ||
            memcmp(q.gate_groups, p->gate_groups, p->n_ffn * sizeof *p->gate_groups) != 0) {
            fprintf(stderr, "plan round trip differs\n");
            abort();
        }
        pi2_plan_free(&q);
        unlink(path);
    }
    free(js);
}

/* The calibration c saved, loaded back and compared. */
static void cal_round_trip(const pi2_plan_cal *c)
{
    char path[64];
    if (fuzz_tmpfile((const uint8_t *)"", 0, path) != 0)
        return;
    pi2_plan_cal d;
    pi2_err e = {0};
    if (pi2_plan_cal_save(c, path, &e) != 0 || pi2_plan_cal_load(path, &d, &e) != 0) {
        fprintf(stderr, "a read calibration does not save and load back: %s\n", e.msg);
        abort();
    }
    if (d.runs != c->runs) {
        fprintf(stderr, "calibration round trip differs\n");
        abort();
    }
    unlink(path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    if (fuzz_tmpfile(data, size, path) != 0)
        return 0;
    pi2_plan p;
    pi2_err err = {0};
    if (pi2_plan_load(path, &p, &err) == 0) {
        plan_round_trip(&p);
        pi2_plan_free(&p);
    } else if (!err.msg[0] || !strstr(err.msg, path)) {
        fprintf(stderr, "a refused plan's message does not name the file: %s\n", err.msg);
        abort();
    }
    pi2_plan_cal c;
    pi2_err e2 = {0};
    if (pi2_plan_cal_load(path, &c, &e2) == 0)
        cal_round_trip(&c);
    unlink(path);
    return 0;
}
