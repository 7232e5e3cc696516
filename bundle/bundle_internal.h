/* The bundle writer's private interface (bundle/bundle.h is the contract):
 * the converted input, the per-FFN state, the jobs of the plan and the
 * writer's context shared by bundle.c, bundle_plan.c and bundle_write.c. */
#ifndef PI2_BUNDLE_INTERNAL_H
#define PI2_BUNDLE_INTERNAL_H

#include "bundle/bundle.h"

#include "bundle/order.h"
#include "formats/pool.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#define COPY_CHUNK (8u << 20)        /* bytes per chunk of a plain copy */
#define MAX_AHEAD 3                  /* jobs the loader may hold ready */
#define MAX_INFLIGHT (768ull << 20)  /* bytes the loader may hold ready (a bigger job still goes alone) */
#define OUT_CHUNK (8u << 20)         /* FFN member bytes laid out per write */
#define MAX_THREADS 16

typedef struct input {
    const char *path;
    int fd;
    pi2_ctr *ctr;
    pi2_manifest *mf;
} input;

typedef struct ffn_state {
    int layer, expert;         /* expert -1 on dense models */
    int e;                     /* expert index in member names (0 on dense) */
    const pi2_mf_tensor *t[3]; /* gate, up, down */
    const pi2_mf_profile *prof;
    pi2_bl_ffn lay;
    uint32_t *perm;
    pi2_order_stats st;
} ffn_state;

typedef enum jkind { J_COPY, J_ROWS, J_BITS, J_PERM, J_FFN } jkind;

typedef struct jpart {
    const pi2_ctr_section *sec;
    uint64_t off, len; /* range of the member */
} jpart;

typedef struct job {
    jkind kind;
    int ffn;            /* permutation to apply (J_ROWS, J_BITS, J_PERM, J_FFN) */
    char out[PI2_CTR_NAME_MAX];
    int nparts;
    jpart part[6];      /* J_FFN: gate, up, down payloads, then their scales */
    uint64_t row_bytes; /* J_ROWS */
    uint8_t *buf;       /* filled by the loader */
} job;

typedef struct bctx {
    const pi2_bundle_opts *o;
    input in;
    const pi2_model_desc *d;
    ffn_state *ffn;
    size_t n_ffn;
    uint64_t row_bytes; /* an FFN row in a slot: payload then scales */
    uint64_t pay_bytes; /* its payload */
    uint32_t io_unit; /* the options' or, for 0, pi2_bl_auto_io_unit's */
    bool two_phase;
    job *jobs;
    size_t n_jobs, cap_jobs;
    pi2_ctr_writer *w;
    /* loader hand-off; job i is read into pool[i % (MAX_AHEAD + 1)], whose
     * previous job has been consumed by then (the loader stays less than
     * MAX_AHEAD jobs ahead),
     * so big buffers are allocated (and their pages zeroed) once */
    uint8_t *pool[MAX_AHEAD + 1];
    uint64_t pool_cap[MAX_AHEAD + 1];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t loaded, consumed;
    uint64_t inflight;
    bool stop, loader_failed;
    pi2_err loader_err;
    /* progress */
    bool tty;
    double t0, last;
    uint64_t written, total;
} bctx;

/* bundle_plan.c */
int bw_pread_full(const input *in, void *buf, size_t n, uint64_t off, const char *what, pi2_err *err);
void bw_in_drop(const input *in, uint64_t off, uint64_t len);
int bw_digest_check(const input *in, const pi2_ctr_section *s, const uint8_t got[PI2_SHA256_LEN], pi2_err *err);
int bw_in_load(const input *in, const char *name, uint64_t want_size, uint8_t **buf, size_t *len, pi2_err *err);
int bw_set_name(char dst[PI2_CTR_NAME_MAX], pi2_err *err, const char *fmt, int l, int e);
int bw_find_ffn(const bctx *b, int layer, int expert);
int bw_plan(bctx *b, pi2_err *err);

/* bundle_write.c */
int bw_take(bctx *b, size_t i, pi2_err *err);
int bw_run_jobs(bctx *b, pi2_err *err);

#endif
