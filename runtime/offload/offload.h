/* pi2 engine, flash offloading (pi2_engine_opts.offload.mem_limit > 0): run
 * a model whose FFN weights do not fit in memory, reading from the bundle
 * only the neurons that fire, through a neuron cache, with the reads
 * overlapping compute. This is the room's contract; the design's
 * reasoning and every figure behind it are in runtime/PERF.md ("Flash
 * offloading").
 *
 * What it promises
 *   memory   the footprint (resident set plus the page cache it causes) is
 *            planned at open to stay under mem_limit, by the planner's
 *            memory plan (pi2_plan_memory_make, runtime/plan_mem.c):
 *            the resident region, the KV cache for the context at open,
 *            buffers, an overhead share, and the rest for the FFN weights
 *            (a hot segment kept in memory, neuron caches for the others).
 *            This room runs that plan as made. A limit that cannot hold
 *            the smallest cache fails the open with PI2_ENOMEM saying how
 *            much is needed; a context longer than the one planned is
 *            refused later with PI2_ERANGE. pi2_engine_offload_info_get
 *            reports the plan and the counters. When the plan streams the
 *            predictors (q8/q4 ones) or the attention of some layers (only
 *            when the limit cannot hold them: runtime/planner.h), open
 *            reads the resident region without their pages and hashes them
 *            through their ring, and each pass reads a streamed layer's
 *            into the ring a layer ahead of use (prefill: its attention).
 *   bits     decode and prefill give the same bits as the same model all
 *            in memory, whatever the limit, the plan, what is cached and
 *            when reads land: a decode FFN is cut into the memory source's
 *            chunks (runtime/ffn.h, FFN_CHUNK), each chunk's neurons and
 *            their order do not depend on the cache, and the chunks' outputs
 *            are summed in chunk order; prefill windows are cut at the
 *            prefill FFN's tiles (ENG_TILE), so each thread runs the same
 *            tiles in the same order.
 *   reads    every read after start goes through the descriptor opened at
 *            start (a container renamed over later is not seen), whose FFN
 *            payloads were checked against the signed manifest then (unless
 *            verify_ffn is off), with direct I/O where the filesystem has
 *            it (else buffered, said in the stats' note).
 *   faults   a failed read (EIO, a file truncated under the reader) fails
 *            the step with PI2_EIO naming the file, offset and cause; short
 *            reads are retried; io_uring setup failure falls back to pread
 *            threads (noted). After a failed step every reservation and
 *            hold is released and the engine can run the next one.
 *   threads  one I/O thread ("pi2-io") owns the reader and the caches; the
 *            compute threads are the engine's pool. It may be pinned to a
 *            CPU of its own and raise its priority as far as the process
 *            may; close joins it and gives the caller its CPU mask back.
 *            With a core of its own it also makes the read-ahead's guess
 *            (dense models), a few predictor units between two rounds of
 *            reads.
 *
 * Who owns what: the engine's FFN row tables belong to the active source
 * (runtime/ffn_source.h); while offloading, ofl_set_rows is their one
 * writer. The engine reaches the room through eng_ofl_* (below)
 * and the eng_ffn_flash source (ffn_source.h).
 *
 * The files
 *   offload.c          open and close: the memory plan's execution
 *                      (hot segment, kept gates, caches, buffers), the
 *                      start-up loads and check, the I/O thread's start,
 *                      the reports
 *   pipeline.c         the decode job: chunks admitted against the caches,
 *                      their reads queued, each chunk computed as soon as
 *                      its reads land, the outputs reduced in order
 *   iothread.c         the I/O thread: take queued reads, submit, reap,
 *                      copy into the reserved slots, hand each read over
 *   readahead.c        before a layer's attention: guess its FFN's neurons
 *                      (on the I/O thread where it has a core; on MoE its
 *                      experts first, on the compute threads) and start
 *                      reading them
 *   prefill_stream.c   prefill: every FFN's windows streamed in order, a
 *                      few ahead, across layers
 *   pstream.c          the streamed ring (predictors, attention): the
 *                      resident read without them, their check, the ring
 *                      the passes read them into
 *   ncache.c / .h      the neuron cache (LRU of neuron parts, with holds)
 *   io.c / .h          the reader (io_uring, or pread threads)
 *   ofl_state.h        the state those files share (private)
 */
#ifndef PI2_ENGINE_OFFLOAD_H
#define PI2_ENGINE_OFFLOAD_H

#include "runtime/state.h"

/* The engine's entry points (offload.c). */
struct pi2_plan_memory;
/* The offloader's own buffers for a model: their shapes, and their bytes
 * at I/O depth 0 and per read in flight (pi2_plan_bufs). */
typedef struct eng_ofl_bufs {
    uint32_t max_sel, max_ch;  /* neurons and chunks a decode job can hold */
    uint32_t win_neurons;      /* neurons per prefill window: whole prefill tiles, or the FFN */
    uint32_t win_groups;       /* slots a prefill window reads at most */
    uint64_t staging_bytes;    /* per read in flight */
    uint64_t wbuf_bytes;       /* per prefill window */
    size_t rq_cap, ready_cap;  /* queued reads, ready chunks */
    uint64_t bytes, per_depth;
    uint64_t slot_bytes[2];    /* a cache slot with its record: gates (whole neurons one-phase), up+down */
} eng_ofl_bufs;
void eng_ofl_buffers(const pi2_model_desc *d, const pi2_bundle_layout *bl, eng_ofl_bufs *out);
/* Makes e->ofl, opens the reader on e->path and reads the resident region
 * (everything before the first FFN member) into e->res, checked against
 * the signed manifest. On failure e->ofl stays for eng_ofl_close. */
int eng_ofl_load_resident(pi2_engine *e, const pi2_engine_opts *o, pi2_err *err);
/* Runs the memory plan m (pi2_plan_memory_make), whose plan it takes
 * over: the hot segments and kept gates read, the caches and buffers
 * made, the I/O thread started. */
int eng_ofl_open(pi2_engine *e, const pi2_engine_opts *o, struct pi2_plan_memory *m, pi2_err *err);
/* Stops the I/O thread and frees e->ofl; nothing when e->ofl is NULL. */
void eng_ofl_close(pi2_engine *e);
/* Zeroes the counters pi2_engine_offload_info_get reports. */
void eng_ofl_stats_reset(pi2_engine *e);

#endif
