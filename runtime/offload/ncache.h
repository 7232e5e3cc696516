/* pi2 neuron cache: the FFN neurons held in memory when the FFN payloads
 * live in flash (the offloading runtime; bundle/layout.h describes what a
 * neuron's bytes are).
 *
 * Every FFN (layer, expert) has n neurons in bundled order. The cache holds
 * up to `slots` entries of `slot_bytes` each (one neuron's row bytes, or
 * one part of it in two-phase layouts: the caller decides what a key
 * means and what an entry holds; the offloader's two-phase entries are a
 * gate unit, and an up+down entry that carries the up and down scales it
 * copies from the gate unit, since the member's up+down unit holds
 * payloads only: runtime/offload/ofl_state.h), in one aligned arena
 * allocated at creation: the cache never allocates afterwards, so its
 * footprint is known up front.
 *
 * Two kinds of entries:
 *   pinned  the hot segment: loaded at start-up, never evicted;
 *   cold    everything else, replaced least-recently-used first.
 * A lookup of a cached neuron is O(1) (a per-FFN index of slot numbers)
 * and marks it most recently used. A miss is filled in two steps so the
 * data can arrive asynchronously: pi2_ncache_reserve picks a slot (evicting
 * the least recently used unpinned, unreserved entry), returns its buffer
 * and hides the entry; pi2_ncache_commit makes it visible once the bytes
 * have landed (or pi2_ncache_abort drops it after a failed read). A slot
 * reserved and not yet committed is never handed out again, so an
 * in-flight read can't be overwritten.
 *
 * Not thread-safe: one thread (the I/O scheduler) changes the cache;
 * compute threads read the buffers of entries it reported present.
 */
#ifndef PI2_NCACHE_H
#define PI2_NCACHE_H

#include "formats/common.h"

#include <stdint.h>

#define PI2_NCACHE_NONE UINT32_MAX

typedef struct pi2_ncache pi2_ncache;

typedef struct pi2_ncache_stats {
    uint64_t hits, misses, evictions;
    uint32_t slots, pinned, used, reserved, held;
} pi2_ncache_stats;

/* A cache for n_ffn FFNs of neurons[f] neurons each, with `slots` entries
 * of slot_bytes (each slot aligned to 4096 bytes when slot_bytes is a
 * multiple of it, else to 64). PI2_EINVAL for zero sizes, PI2_ERANGE for
 * sizes that overflow, PI2_ENOMEM. Caller frees *out. */
int pi2_ncache_create(pi2_ncache **out, uint32_t n_ffn, const uint32_t *neurons, size_t slot_bytes, uint32_t slots,
                      pi2_err *err);
/* NULL is a no-op. */
void pi2_ncache_free(pi2_ncache *c);

/* Bytes of the arena (slots x aligned slot size) plus the indexes: what
 * the cache costs in memory. */
uint64_t pi2_ncache_footprint(const pi2_ncache *c);

/* The buffer of a committed entry (marking it most recently used), or NULL
 * on a miss (also for reserved, not yet committed entries). Counts a hit
 * or a miss. */
uint8_t *pi2_ncache_get(pi2_ncache *c, uint32_t ffn, uint32_t neuron);
/* Like get, without counting or reordering. */
bool pi2_ncache_contains(const pi2_ncache *c, uint32_t ffn, uint32_t neuron);

/* Take a slot for (ffn, neuron) and return its buffer to fill, or NULL
 * when every slot is pinned or reserved (PI2_ERANGE in err) or the entry
 * is already present or reserved (PI2_EINVAL). *slot receives the slot
 * number for commit / abort. Evicts the least recently used committed
 * unpinned entry when no slot is free. */
uint8_t *pi2_ncache_reserve(pi2_ncache *c, uint32_t ffn, uint32_t neuron, bool pin, uint32_t *slot, pi2_err *err);
/* Make a reserved slot's entry visible (most recently used). */
void pi2_ncache_commit(pi2_ncache *c, uint32_t slot);
/* Commit a reserved slot and hold it (as pi2_ncache_hold) in one step. */
void pi2_ncache_commit_hold(pi2_ncache *c, uint32_t slot);

/* Holding: an entry in use by compute must not be evicted while a later
 * miss reserves a slot. pi2_ncache_hold is pi2_ncache_get (counting a hit
 * or a miss) that also takes a hold: a held entry leaves the LRU list and
 * cannot be evicted until its last pi2_ncache_release, which makes it the
 * most recently used. *slot receives the slot number for release. */
uint8_t *pi2_ncache_hold(pi2_ncache *c, uint32_t ffn, uint32_t neuron, uint32_t *slot);
void pi2_ncache_release(pi2_ncache *c, uint32_t slot);
/* Slots a reserve can take now: free ones plus committed cold entries that
 * are not held. */
uint32_t pi2_ncache_evictable(const pi2_ncache *c);
/* The buffer of a slot number (reserved or committed). */
uint8_t *pi2_ncache_slot_buf(const pi2_ncache *c, uint32_t slot);

/* Drop a reserved slot (its read failed); the slot is free again. */
void pi2_ncache_abort(pi2_ncache *c, uint32_t slot);

void pi2_ncache_stats_get(const pi2_ncache *c, pi2_ncache_stats *out);
void pi2_ncache_stats_reset(pi2_ncache *c);

#endif
