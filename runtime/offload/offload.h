/* pi2 engine, flash offloading (pi2_engine_opts.mem_limit > 0): run a model
 * whose FFN payloads do not fit in memory, reading only the neurons that
 * fire, through a neuron cache, with reads overlapping compute.
 *
 * ---- Memory plan (at open) ----
 * The footprint is planned to stay under mem_limit:
 *   resident   the resident region of the container (everything before the
 *              first ffn/ member: tokenizer, embeddings, attention, norms,
 *              router, predictors, every FFN scale, permutations, profile),
 *              read with O_DIRECT into memory the runtime owns and hashed
 *              there (no page cache, and a container truncated later cannot
 *              fault a mapping), less the f32 predictors: once decode's Q8
 *              copy is made (a buffer) their pages are given back
 *              (7B-shaped model: 150 MB back for 56 MB of Q8 rows);
 *   kv         the KV cache for the context at open (a larger context later
 *              is refused: PI2_ERANGE naming --ctx);
 *   buffers    activation and thread buffers, read staging (io_depth x the
 *              largest read), prefill stream windows (3 x ~4 MiB), per-chunk
 *              partial outputs, cache indexes;
 *   overhead   32 MiB for code, stacks and allocator slack, plus 1/256 of the
 *              limit for page tables and kernel memory charged with it;
 *   FFN        the rest: the hot segment plus the neuron cache.
 * If the rest cannot hold the smallest cache (an eighth of an FFN's neurons,
 * at least a chunk, per cache), open fails with PI2_ENOMEM saying how much
 * is needed. When the rest holds every FFN payload, everything is hot (no
 * reads after start). Otherwise hot_share of what is left after the smallest
 * cache goes to the hot segment (the first whole slots of each FFN, equally
 * per FFN: the hottest neurons, as bundled) and the rest to the cache. The
 * default share is 1: on the generated 7B-shaped model at 50% offload a
 * static hot set by profiled frequency beat any larger LRU share (hit rate
 * 94.5% vs 93.2% at 0.8 and 90.5% at 0.5), the planner may choose otherwise.
 * The hot segment is read at start with sequential O_DIRECT reads and pinned
 * with mlock when lock_hot is set and the limit allows it.
 * Start-up: the resident region and the hot segment are faulted in on every
 * compute thread before they are read (pi2_io_prefault; a direct read would
 * take the faults one by one, and fresh memory costs ~2 s a GB here under
 * the hypervisor), the resident members are hashed on two threads
 * (pi2_bundle_verify_copy), and the FFN payloads' check streams on the main
 * thread while the other threads fault the hot segment in. 7B-shaped model
 * at 50%, 2 threads, 3 alternating pairs: load 11.5 -> 6.9 s (medians;
 * 9.4 -> 6.0 s with --no-verify-ffn).
 *
 * ---- Plans (runtime/planner.h) ----
 * With a hardware profile (pi2_engine_opts.hw) the planner replaces the fixed
 * split: per FFN it chooses H hot slots and, on two-phase models, G >= H
 * slots whose gate parts are kept as well (a gate is needed for every
 * selected neuron, its up+down only when it fires: per byte a gate saves
 * more reads); and the compute threads, the I/O depth and gate-first. A given
 * plan (opts.plan, pi2-run --plan FILE) is checked against the model and the
 * limit and run as is. Gate parts of slots [H, G) are read at start through
 * a window and kept (mlocked with the hot segment); those neurons' up+down
 * come through the cache, read once the gate fired. The I/O ring is opened
 * for the deepest depth the planner may choose (128); the staging buffers
 * follow the plan's depth.
 *
 * ---- Neuron cache ----
 * Global LRU caches (runtime/offload/ncache.h) of neuron parts, keyed (FFN, neuron):
 * one-phase layouts (ReGLU, SwiGLU) cache whole neurons (gate|up|down rows);
 * two-phase layouts (dReLU) cache gates and up+down pairs apart (40% / 60%
 * of the cache budget), so up/down are read only for neurons whose gate fired.
 * Entries in use by a computation are held (never evicted).
 *
 * ---- Read-ahead ----
 * Before each layer's attention (decode, predictor models), that layer's
 * predictor runs on the residual stream (normed with the FFN norm), scoring
 * only the neurons not held in memory (the hot ones' fc2 rows are not read:
 * at 50% offloaded on the generated 7B-shaped model this run cost 8-10% of
 * the decode time), and the missing parts of the neurons it picks are read
 * while attention computes:
 * the FFN input differs from that residual only by the attention output, so
 * the picks mostly agree. On MoE models the layer's router runs on the same
 * input first and the predictors of the top-k experts it picks read ahead
 * (on the generated tests' model 96% of the choices are guessed; the stats
 * report it). Parts still in flight when the FFN step needs them are handed
 * over on landing; the rest join the cache. At most half of what the cache
 * can evict goes to read-ahead; eight sets form a ring so one layer's late
 * reads (or a wrongly guessed expert's) do not hold up the next.
 *
 * ---- Experts ----
 * The neuron cache is global, keyed (layer, expert, neuron): an expert
 * chosen for this token keeps its cold neurons cached for the next tokens
 * that choose it again (the stats report how often the choice repeats), and
 * experts not chosen lately lose their slots first. With a plan the hot
 * segment is split across experts by how often the calibration routed to
 * each (the profile's route_share).
 *
 * ---- Decode FFN: the I/O-compute pipeline ----
 * The selected neurons (predictor, or all in dense / threshold mode) are cut
 * into chunks of 128 in bundled order. One I/O thread owns the caches and the
 * reader (runtime/offload/io.h, io_uring or pread threads); the compute threads (the
 * pool) take ready chunks from a queue. When the compute threads leave an
 * allowed CPU free, the I/O thread is pinned to the free CPUs and the
 * compute threads (the calling thread too, until close) to the others
 * (pi2_cpus_split). The I/O thread ("pi2-io") raises its own priority by
 * up to 10 nice levels, as far as the process may (root, CAP_SYS_NICE or
 * RLIMIT_NICE; the stats report the levels gained). Sharing 2 CPUs with 2
 * compute threads at equal priority, it reaped and resubmitted late: on the
 * 7B-shaped model at 50% offloaded a layer's read-ahead took 2.6-3.2 ms
 * to land (1.6 ms with a CPU of its own), 1 ms past the start of the FFN
 * step, and the I/O wait was 16-27% of decode; raised, 4-7%, and decode
 * went from 7.7 to 8.7 tok/s (medians of 4 alternated runs). On 2 CPUs at
 * 90% offloaded on the 7B-shaped model, 1 compute thread went from 2.4-2.8
 * to 3.5 tok/s (alternated runs); at 75% it ran at 4.2-4.8 against 3.6-3.8
 * for 2 compute threads.
 *   admit    (I/O) hot neurons need nothing; cached ones are held; missing
 *            ones get a reserved slot and one aligned read per bundle group
 *            (the span of the group's missing parts); chunks are admitted in
 *            order while the cache can hold them;
 *   land     (I/O) as each read completes, its parts are copied into their
 *            slots; a chunk whose reads have all landed is ready at once - no
 *            barrier per matrix or per FFN;
 *   compute  one-phase: gate, then up where the gate fired, then the down
 *            rows of the active neurons added into the chunk's own partial
 *            output; two-phase: gates first, then (I/O) up+down of the fired
 *            neurons only, admitted like gates, then up and down. By default
 *            a missing gate's read runs on through its up+down rows (one
 *            read and one round trip instead of two; cached unheld, held by
 *            the up+down step if the gate fires); gate_first reads up+down
 *            only once the gate fired. Measured on the generated 7B-shaped
 *            model (make bench): 25% offloaded 13.5 vs 10.5 tok/s, 50% the
 *            same speed with 2.2x the bytes, 75% 2.50 vs 2.35 tok/s: on this
 *            disk a 16 KiB random read costs little more than a 4 KiB one,
 *            and the second round trip is exposed;
 *   reduce   the chunks' partial outputs are summed in chunk order.
 * Each chunk's neurons and their order do not depend on what was cached, so
 * the result is bit-identical whatever the memory limit.
 *
 * ---- Prefill ----
 * Dense. Every FFN is cut into windows of whole slots (~4 MiB); windows inside
 * the hot segment are computed from memory, the others are streamed by the I/O
 * thread in order (1 MiB reads), up to 3 windows ahead, across layers: the
 * next layer's first windows are read while this layer computes.
 *
 * ---- Faults ----
 * A failed read (EIO, a file truncated under the reader) fails the step with
 * PI2_EIO naming the file, offset and cause; short reads are retried; io_uring
 * setup failure falls back to pread threads (noted in the stats); a container
 * replaced (renamed over) after start is still read through the descriptor
 * opened at start, whose bytes were verified then; out of memory at open is
 * PI2_ENOMEM. After a failed step every reservation and hold is released.
 */
#ifndef PI2_ENGINE_OFFLOAD_H
#define PI2_ENGINE_OFFLOAD_H

#include "runtime/engine.h"

#endif
