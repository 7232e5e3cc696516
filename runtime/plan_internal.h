/* pi2 execution planner: what its files share (planner.c: the model
 * profile, the cost model and calibration; plan_solve.c: the solver and the
 * fixed split; plan_json.c: plan and calibration files; plan_mem.c: the
 * memory model). Not part of the public API. */
#ifndef PI2_PLAN_INTERNAL_H
#define PI2_PLAN_INTERNAL_H

#include "runtime/planner.h"

#define CAL_K_MIN 0.5 /* the factors' ranges (a file's figures may round past them by 1e-6) */
#define CAL_K_MAX 4.0
#define CAL_F_MIN 0.25
#define CAL_F_MAX 4.0

/* A configuration the cost model prices: compute threads, I/O depth,
 * gate-first. */
typedef struct cfg {
    int t, depth;
    bool gf;
    double k, f; /* the learned compute and read-time factors at t (plan_cfg_make) */
} cfg;

/* Static-hot reads of FFN fi at (h, g) from suffix sums. */
typedef struct suffix {
    double *P, *B0, *BG, *Q, *BU; /* [groups + 1] */
} suffix;

uint64_t plan_hot_bytes_of(const pi2_mprof *mp, uint32_t h, uint32_t g);
uint64_t plan_min_cache(const pi2_mprof *mp, const pi2_plan_mem *mem);
cfg plan_cfg_make(const pi2_mprof *mp, int t, int depth, bool gf);
double plan_item_time(const pi2_mprof *mp, const pi2_hwprof *hw, const cfg *c, uint32_t fi, double n1, double b1,
                 double n2, double b2);
void plan_static_reads(const pi2_mprof *mp, const suffix *x, bool gf, uint32_t h, uint32_t g, double *n1, double *b1,
                  double *n2, double *b2);
void plan_add_extra(const pi2_mprof *mp, double cold, double extra, double *n1, double *b1);
double plan_cold_share(const pi2_mprof *mp, const pi2_mprof_ffn *F, uint32_t h, uint32_t g);
int plan_suffix_build(const pi2_mprof_ffn *F, suffix *x);

#endif
