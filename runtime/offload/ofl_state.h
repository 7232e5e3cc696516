/* Private to runtime/offload/: the offloader's state and the functions its
 * files share (the room's contract: runtime/offload/offload.h). */
#ifndef PI2_OFL_STATE_H
#define PI2_OFL_STATE_H

#include "runtime/state.h"
#include "runtime/ffn.h"
#include "runtime/ffn_source.h"
#include "runtime/offload/io.h"
#include "runtime/offload/ncache.h"
#include "runtime/planner.h"

#include <pthread.h>
#include <stdatomic.h>


#define OFL_SEQ_REQ (1u << 20)       /* sequential read size */
#define OFL_SEQ_DEPTH 8              /* sequential reads in flight */
#define OFL_WINDOW (4u << 20)        /* prefill window, bytes (whole slots) */
#define OFL_NWIN 3                   /* prefill windows read ahead */
#define OFL_POLL_US 50               /* I/O thread poll while reads are in flight */
#define OFL_SPIN 4000                /* compute thread spins before sleeping */
#define OFL_PF_SETS 8                /* read-ahead sets in flight (MoE: top-k per layer) */

enum { P_FULL = 0, P_GATE = 1, P_UD = 2 };
enum { CH_WAIT = 0, CH_IO, CH_READY, CH_UD_WAIT, CH_UD_IO, CH_UD_READY, CH_DONE };
enum { M_UD = 1, M_DONE = 2 }; /* what a compute step leaves to do */
/* Position flags. F_SPEC: up+down read along with the gate; F_PFWAIT: the
 * part is being read by the prefetch, which hands it over on landing. */
enum { F_GMISS = 1, F_GHELD = 2, F_UMISS = 4, F_UHELD = 8, F_SPEC = 16, F_PFWAIT = 32 };
enum { J_DEC = 0, J_PF = 1 }; /* which list a read serves */

typedef struct ofl_chunk {
    uint32_t k0, k1;  /* positions in the selected list */
    uint32_t n_fired; /* two-phase: fired positions in fired[k0 .. k0 + n_fired) */
    int state;
    int pending;      /* reads outstanding */
    bool has_out;
} ofl_chunk;

/* A read to make: decode parts of one bundle group, or a piece of a
 * prefill window. */
typedef struct ofl_rd {
    int32_t win;        /* >= 0: stream window (dst set); -1: decode or prefetch */
    uint8_t job;        /* J_DEC or J_PF */
    uint32_t fi;
    uint32_t chunk;
    uint8_t part;       /* P_FULL, P_GATE, P_UD */
    uint32_t a, b;      /* positions (P_UD: fired indexes) covered, inclusive */
    uint64_t span;      /* member offset of the first byte read */
    uint32_t len;
    uint64_t file_off;
    uint8_t *dst;       /* stream: destination */
} ofl_rd;

typedef struct ofl_req {
    pi2_io_req io;
    ofl_rd rd;
    uint8_t *staging;
} ofl_req;

/* A prefill window of one FFN. */
typedef struct ofl_win {
    uint32_t fi;
    uint64_t off, len; /* member range */
} ofl_win;

struct ofl_pstream;

typedef struct eng_ofl {
    pi2_engine *e;
    pi2_io *io;
    pi2_io_backend io_backend; /* asked for */
    bool buffered;          /* no direct I/O on the container's filesystem */
    struct ofl_pstream *ps; /* streamed predictors (pstream.c); NULL: resident */
    uint64_t ps_bytes0;     /* their bytes read at the last stats reset */
    int depth;              /* reads in flight (the plan's, or the options') */
    int ring_depth;         /* the reader's capacity (>= depth) */
    char note[256];
    pi2_engine_offload_info info;

    /* plan */
    uint32_t n_ffn, E;
    const pi2_bl_ffn **bl;  /* [n_ffn] */
    uint64_t *file_off;     /* [n_ffn] file offset of each ffn member */
    uint8_t **hot;          /* [n_ffn] hot segment: the member's first hot_groups slots */
    uint64_t *hot_len;
    uint32_t *hot_n;        /* hot neurons */
    uint32_t *ghot_n;       /* neurons whose gate is in memory (>= hot_n; two-phase plans) */
    uint8_t **ghot;         /* [n_ffn] gate parts of slots [hot groups, gate groups) */
    uint64_t *ghot_len;
    pi2_plan plan;          /* the plan run (n_ffn 0: none) */
    bool two_phase;
    bool spec;              /* two-phase: read up+down along with a missing gate */
    bool read_ahead;        /* decode: read ahead during attention */
    uint64_t R, P, S, Pg;   /* row bytes (payload and scales), payload bytes, slot bytes, gate part */
    uint64_t Gb;            /* two-phase: a neuron's gate unit, gate row and up and down scales (R + 2C) */
    uint32_t g;             /* neurons per group */
    pi2_ncache *cg, *cu;    /* one-phase: cg holds whole neurons; two-phase: gates, up+down */

    /* reads (under mu). Sized by the memory plan: depth requests of
     * staging_bytes, a queue of rq_cap reads. */
    size_t staging_bytes;
    size_t rq_cap;
    struct ofl_reads {
        ofl_req *reqs;
        ofl_req **free;         /* requests not in use */
        int n_free;
        uint8_t *staging;       /* [depth][staging_bytes] */
        ofl_rd *rq;             /* FIFO of reads waiting for a request */
        size_t head, n;
        ofl_req **subs;         /* I/O thread: requests taken this round */
    } q;

    /* The decode job. Everything in it is under mu, except the compute on
     * a chunk a thread has taken (its positions' data is stable then) and
     * the I/O thread's copy into slots it reserved. Sized by the memory
     * plan: max_ch chunks, ready_cap entries of the ready queue. */
    uint32_t max_ch;
    uint32_t ready_cap;
    struct ofl_job {
        const eng_ffn *f;
        uint32_t fi;
        ffn_dec dec;            /* what the job's chunks share */
        const uint32_t *sel;
        uint32_t n_sel, n_ch, next_admit, n_done;
        ofl_chunk *ch;
        uint32_t *ud_wait, ud_head, ud_n;
        uint32_t *gslot, *uslot, *fired;
        float *gval;
        uint8_t *flag;
        float *parts;           /* [max_ch][D] */
        uint32_t *out_rows;     /* [max_ch] the chunks with an output, in order */
        uint32_t n_out;
        bool fail, finished;
        pi2_err fail_err;
        uint32_t running;       /* chunk steps being computed */
        uint32_t n_sub;         /* decode reads submitted, not landed */
        uint32_t *ready, ready_head, ready_n;
        int n_sleeping;         /* compute threads waiting on cv_compute */
        atomic_uint hint;       /* set when there is something for compute threads */
    } job;

    pthread_mutex_t mu;
    pthread_cond_t cv_io, cv_compute, cv_stream;
    pthread_t th;
    bool th_started, stop;
    bool io_up;      /* the I/O thread has set its priority (info.io_nice) */
    bool pinned;     /* threads placed by pi2_cpus_split: restore at close */
    pi2_cpus cpus;

    /* prefill stream (under mu, but cursor). The window geometry stays
     * with the memory plan: win_neurons neurons per window, in at most
     * win_groups slots, wbuf_bytes. */
    uint32_t win_neurons;
    uint32_t win_groups;
    uint64_t wbuf_bytes;
    struct ofl_stream {
        ofl_win *win;           /* streamed windows, in consumption order */
        uint32_t n;
        uint32_t *first;        /* [n_ffn + 1]: first window index of each FFN in win[] */
        uint8_t *buf[OFL_NWIN];
        bool active, cancel, failed;
        pi2_err err;
        uint32_t next;          /* next window to read */
        uint32_t consumed;      /* windows released by the main thread */
        int32_t ready[OFL_NWIN];   /* window held ready in each buffer, or -1 */
        int pending[OFL_NWIN];     /* reads outstanding per buffer */
        uint32_t sub;           /* stream reads submitted, not landed */
        uint32_t cursor;        /* main thread: next window to consume */
    } st;

    /* read-ahead (decode, under mu): the likely neurons of the FFN about
     * to run, read while its attention computes; entries land in the
     * caches unheld, or are handed to the decode positions waiting for
     * them */
    struct ofl_ra {
        struct ofl_pf {
            uint32_t fi;          /* FFN of this prefetch (UINT32_MAX: none) */
            uint32_t *sel, n;     /* neurons being prefetched */
            uint32_t *gslot, *uslot;
            uint8_t *flag;
            uint32_t *pos;        /* [n_ff]: neuron -> prefetch position + 1 while in flight */
            uint32_t *wait;       /* [n_ff]: neuron -> decode position + 1 waiting for it */
            uint32_t sub;         /* reads queued or in flight */
        } set[OFL_PF_SETS];       /* a ring, so one layer's late reads don't hold up the next */
        int cur;
        uint32_t sub;             /* reads of all sets */
        float *in;                /* normed residual [D] */
        uint32_t *list;           /* predictor output [n_ff] */
        uint32_t room_g, room_u;  /* cache entries the running read-ahead may still reserve */
        /* the guess the I/O thread makes (ofl_ra_step), a step a round */
        int want;                 /* its layer (-1: none running) */
        int64_t step, units;      /* next fc2 unit (-1: fc1 first), fc2's units */
        uint64_t bytes;           /* predictor bytes its guesses read, not yet in the step's count */
    } ra;

    /* counters (under mu) */
    struct ofl_counts {
        uint64_t parts, hot, hit, read, reads, bytes, pre_bytes, pf, pfwait;
        double wait;
    } cnt;
} eng_ofl;

static inline uint32_t ffn_index(const eng_ofl *x, const eng_ffn *f)
{
    return (uint32_t)f->layer * x->E + (uint32_t)f->expert;
}

static inline const eng_ffn *ffn_at(const pi2_engine *e, const eng_ofl *x, uint32_t fi)
{
    return &e->layers[fi / x->E].ffn[fi % x->E];
}

/* Bytes of one cache slot of a part kind: a whole neuron (three rows, each
 * payload then scales), a gate unit as the member stores it (gate row, up
 * and down scales), or an up+down entry (up row, down row, each payload
 * then scales: the scales come from the gate unit, the member's up+down
 * unit holding payloads only). */
static inline uint64_t part_unit(const eng_ofl *x, int part)
{
    return part == P_FULL ? 3 * x->R : part == P_GATE ? x->Gb : 2 * x->R;
}
/* Bytes of one neuron's part in the member (bundle/layout.h). */
static inline uint64_t file_unit(const eng_ofl *x, int part)
{
    return part == P_UD ? 2 * x->P : part_unit(x, part);
}
static inline uint64_t stride_of(uint64_t unit) { return unit % 4096 == 0 ? unit : (unit + 63) / 64 * 64; }

/* Which row tables of a neuron ofl_set_rows writes (payload and scales). */
enum { R_GATE = 1, R_UP = 2, R_DOWN = 4, R_ALL = 7 };
/* The one writer of FFN f's row tables while offloading: for neuron i,
 * the tables named in `which` (gate, up, down) get base + at->pay[k] and
 * base + at->sc[k] (base NULL: no row in memory). The tables belong to the
 * active source (runtime/ffn_source.h); the offloader writes them here
 * only, so where its rows point is decided in one place. */
static inline void ofl_set_rows(const eng_ffn *f, uint32_t i, unsigned which, const uint8_t *base,
                                const pi2_bl_rows *at)
{
    const eng_mat *m[3] = {&f->gate, &f->up, &f->down};
    for (int k = 0; k < 3; k++)
        if (which & (1u << k)) {
            m[k]->rp[i] = base ? base + at->pay[k] : NULL;
            m[k]->rs[i] = base ? (const uint16_t *)(const void *)(base + at->sc[k]) : NULL;
        }
}

/* Neuron i's rows of part `part` in a cache slot at buf (part_unit). */
static inline void set_ptr(const eng_ofl *x, const eng_ffn *f, int part, uint32_t i, const uint8_t *buf)
{
    uint64_t R = x->R, P = x->P;
    pi2_bl_rows at = {.pay = {0, R, 2 * R}, .sc = {P, R + P, 2 * R + P}};
    if (part == P_FULL)
        ofl_set_rows(f, i, R_ALL, buf, &at);
    else if (part == P_GATE)
        ofl_set_rows(f, i, R_GATE, buf, &at);
    else {
        at = (pi2_bl_rows){.pay = {0, 0, R}, .sc = {0, P, R + P}};
        ofl_set_rows(f, i, R_UP | R_DOWN, buf, &at);
    }
}

static inline uint64_t part_base(const eng_ofl *x, int part, uint32_t q)
{
    return (uint64_t)q * x->S + (part == P_UD ? x->Pg : 0);
}

static inline pi2_ncache *cache_of(const eng_ofl *x, int part) { return part == P_UD ? x->cu : x->cg; }

/* Positions list of a part: sel positions, or fired indexes for P_UD. */
static inline uint32_t pos_at(const eng_ofl *x, int part, uint32_t idx)
{
    return part == P_UD ? x->job.fired[idx] : idx;
}

/* A list of positions: neuron of index idx is sel[map ? map[idx] : idx],
 * its flags flag[...] likewise. */
typedef struct plist {
    const uint32_t *sel, *map;
    const uint8_t *flag;
} plist;
static inline uint32_t pl_k(const plist *l, uint32_t idx) { return l->map ? l->map[idx] : idx; }

/* The decode job's pipeline (pipeline.c; under mu unless said). */
void ofl_job_fail(eng_ofl *x, const pi2_err *er);
void ofl_rq_push(eng_ofl *x, const ofl_rd *rd);
void ofl_make_ready(eng_ofl *x, uint32_t c);
int ofl_queue_reads(eng_ofl *x, const plist *l, uint8_t job, uint32_t fi, uint32_t c, int part, uint32_t a,
                uint32_t b);
void ofl_admit(eng_ofl *x);
void ofl_decode_landed(eng_ofl *x, const ofl_rd *rd);
void ofl_decode_copy(eng_ofl *x, const ofl_req *r);
/* Outside mu: neuron i's part from a landed read (staging holds the
 * member's bytes from offset span) into its cache slot buf; with ud, its
 * up+down read along (F_SPEC) into the up+down slot ud. */
void ofl_copy_part(const eng_ofl *x, int part, uint32_t i, const uint8_t *staging, uint64_t span, uint8_t *buf,
                   uint8_t *ud);
/* Into an up+down cache entry dst: the member's up+down unit ud (2P
 * payload bytes) and the up and down scales sc (2C bytes, as the gate unit
 * holds them at + R); either NULL: left as it is. */
void ofl_fill_ud(const eng_ofl *x, uint8_t *dst, const uint8_t *ud, const uint8_t *sc);
int ofl_flash_decode(pi2_engine *e, const eng_ffn *f, uint32_t n_sel, int mode, float *out, bool accumulate, float w,
                 pi2_err *err);

/* The job's requests, queue and arrays (pipeline.c): false when out of
 * memory (ofl_job_free frees what was made). */
bool ofl_job_alloc(eng_ofl *x, uint32_t max_sel, uint64_t D);
void ofl_job_free(eng_ofl *x);

/* Read-ahead (readahead.c); its sets' buffers as the job's. */
bool ofl_ra_alloc(eng_ofl *x, uint32_t max_sel, uint64_t D);
void ofl_ra_free(eng_ofl *x);
void ofl_pf_copy(eng_ofl *x, const ofl_req *r);
void ofl_pf_landed(eng_ofl *x, const ofl_rd *rd, bool ok, const pi2_err *er);
int ofl_flash_layer_begin(pi2_engine *e, int l, bool decode, pi2_err *err);
int ofl_flash_layer_ahead(pi2_engine *e, int l, const float *xres, pi2_err *err);
/* I/O thread, under mu, a guess running (x->ra.want >= 0): its next step
 * outside mu (fc1, or the next fc2 units), the picks' reads queued. The
 * compute thread waits for the guess to end before the layer's FFN
 * (ofl_ra_wait: the guess's list and scratch, and the layer's streamed
 * predictors, free again; its predictor bytes join the step's). */
void ofl_ra_step(eng_ofl *x);
void ofl_ra_wait(pi2_engine *e);

/* offload.c: [off, off + len) read into dst (aligned) with up to depth
 * sequential reads in flight; with sha, dst NULL, hashed in order. */
int ofl_seq_read(pi2_io *io, int depth, uint8_t *dst, uint64_t off, uint64_t len, pi2_sha256_ctx *sha,
                 pi2_err *err);

/* pstream.c: the streamed ring (predictors, attention). open: the
 * member table, the ring and its reader (x->ps); load_resident: [0, end)
 * of the file read into e->res without the streamed members' pages,
 * checked, the streamed members hashed in the ring; unbind_all: every
 * streamed row pointer cleared; wants: whether layer l binds a slot
 * before its attention (its attention streams, or preds, a sparse decode,
 * and the predictors do); need: layer l's members read (or waited for)
 * and bound, the layers done before it released, each starting the read
 * of the streamed layer a ring ahead (nothing for a layer that streams
 * nothing); release: that alone (the running layer's predictors have
 * run). Compute thread only. */
int ofl_ps_open(pi2_engine *e, eng_ofl *x, pi2_err *err);
void ofl_ps_free(eng_ofl *x);
int ofl_ps_load_resident(pi2_engine *e, eng_ofl *x, uint64_t end, pi2_err *err);
void ofl_ps_unbind_all(pi2_engine *e, eng_ofl *x);
bool ofl_ps_wants(const eng_ofl *x, int l, bool preds);
int ofl_ps_need(pi2_engine *e, int l, pi2_err *err);
int ofl_ps_release(pi2_engine *e, pi2_err *err);
uint64_t ofl_ps_bytes(const eng_ofl *x); /* read by passes, since open */

/* Prefill stream (prefill_stream.c). ofl_stream_open makes its buffers
 * and windows (every FFN's, in order, but those in the hot segment). */
int ofl_stream_open(pi2_engine *e, eng_ofl *x, pi2_err *err);
void ofl_stream_free(eng_ofl *x);
bool ofl_stream_wants(const eng_ofl *x);
void ofl_stream_fill(eng_ofl *x);
void ofl_stream_landed(eng_ofl *x, const ofl_req *r, const pi2_err *er);
int ofl_flash_prefill(pi2_engine *e, const eng_ffn *f, int T, float *out, bool accumulate, float w, pi2_err *err);
int ofl_flash_skip(pi2_engine *e, const eng_ffn *f, pi2_err *err);
int ofl_flash_begin_pass(pi2_engine *e, bool decode, pi2_err *err);
void ofl_flash_end_pass(pi2_engine *e, bool decode);

/* The I/O thread (iothread.c). */
void *ofl_io_main(void *arg);

#endif
