/* Neuron cache: per-FFN slot indexes, an LRU list of committed unpinned
 * entries, a free list. */
#include "runtime/offload/ncache.h"

#include <stdlib.h>
#include <string.h>

enum { S_FREE = 0, S_RESERVED = 1, S_COLD = 2, S_PINNED = 3 };

typedef struct slot {
    uint32_t ffn, neuron;
    uint32_t prev, next; /* LRU (cold) or free list links */
    uint32_t hold; /* holders; a held cold entry is off the LRU list */
    uint8_t state;
    uint8_t pin; /* reserved for the pinned segment */
} slot;

struct pi2_ncache {
    uint32_t n_ffn;
    uint32_t **index; /* [ffn][neuron] -> slot, PI2_NCACHE_NONE */
    uint32_t *n_neurons;
    slot *s;
    uint32_t n_slots;
    size_t slot_bytes, stride;
    uint8_t *arena;
    uint32_t lru_head, lru_tail; /* head: most recent */
    uint32_t free_head;
    uint32_t n_free, n_lru; /* lengths of the free and LRU lists */
    pi2_ncache_stats st;
    uint64_t index_bytes;
};

static void lru_unlink(pi2_ncache *c, uint32_t i)
{
    slot *x = &c->s[i];
    if (x->prev != PI2_NCACHE_NONE)
        c->s[x->prev].next = x->next;
    else
        c->lru_head = x->next;
    if (x->next != PI2_NCACHE_NONE)
        c->s[x->next].prev = x->prev;
    else
        c->lru_tail = x->prev;
    x->prev = x->next = PI2_NCACHE_NONE;
    c->n_lru--;
}

static void lru_push_front(pi2_ncache *c, uint32_t i)
{
    slot *x = &c->s[i];
    x->prev = PI2_NCACHE_NONE;
    x->next = c->lru_head;
    if (c->lru_head != PI2_NCACHE_NONE)
        c->s[c->lru_head].prev = i;
    c->lru_head = i;
    if (c->lru_tail == PI2_NCACHE_NONE)
        c->lru_tail = i;
    c->n_lru++;
}

static void free_push(pi2_ncache *c, uint32_t i)
{
    c->s[i].state = S_FREE;
    c->s[i].next = c->free_head;
    c->s[i].prev = PI2_NCACHE_NONE;
    c->free_head = i;
    c->n_free++;
}

int pi2_ncache_create(pi2_ncache **out, uint32_t n_ffn, const uint32_t *neurons, size_t slot_bytes, uint32_t slots,
                      pi2_err *err)
{
    *out = NULL;
    if (n_ffn == 0 || !neurons || slot_bytes == 0 || slots == 0 || slots == PI2_NCACHE_NONE)
        return pi2_err_set(err, PI2_EINVAL, "neuron cache: empty or invalid sizes");
    size_t align = slot_bytes % 4096 == 0 ? 4096 : 64;
    size_t stride = (slot_bytes + align - 1) / align * align, arena;
    if (!pi2_mul_size(stride, slots, &arena))
        return pi2_err_set(err, PI2_ERANGE, "neuron cache: %u slots of %zu bytes overflow", slots, slot_bytes);
    pi2_ncache *c = calloc(1, sizeof *c);
    if (!c)
        return pi2_err_set(err, PI2_ENOMEM, "neuron cache: out of memory");
    c->n_ffn = n_ffn;
    c->n_slots = slots;
    c->slot_bytes = slot_bytes;
    c->stride = stride;
    c->index = calloc(n_ffn, sizeof *c->index);
    c->n_neurons = pi2_malloc_array(n_ffn, sizeof *c->n_neurons);
    c->s = pi2_malloc_array(slots, sizeof *c->s);
    void *a = NULL;
    if (!c->index || !c->n_neurons || !c->s || posix_memalign(&a, align, arena) != 0) {
        pi2_ncache_free(c);
        return pi2_err_set(err, PI2_ENOMEM, "neuron cache: out of memory for %u slots of %zu bytes (%.1f MB)", slots,
                           slot_bytes, (double)arena / 1e6);
    }
    c->arena = a;
    for (uint32_t f = 0; f < n_ffn; f++) {
        c->n_neurons[f] = neurons[f];
        if (!(c->index[f] = pi2_malloc_array(neurons[f] ? neurons[f] : 1, sizeof **c->index))) {
            pi2_ncache_free(c);
            return pi2_err_set(err, PI2_ENOMEM, "neuron cache: out of memory for the index");
        }
        memset(c->index[f], 0xff, (size_t)neurons[f] * sizeof **c->index);
        c->index_bytes += (uint64_t)neurons[f] * sizeof **c->index;
    }
    c->lru_head = c->lru_tail = PI2_NCACHE_NONE;
    c->free_head = PI2_NCACHE_NONE;
    for (uint32_t i = slots; i-- > 0;)
        free_push(c, i);
    c->st.slots = slots;
    *out = c;
    return 0;
}

void pi2_ncache_free(pi2_ncache *c)
{
    if (!c)
        return;
    if (c->index)
        for (uint32_t f = 0; f < c->n_ffn; f++)
            free(c->index[f]);
    free(c->index);
    free(c->n_neurons);
    free(c->s);
    free(c->arena);
    free(c);
}

uint64_t pi2_ncache_footprint(const pi2_ncache *c)
{
    return (uint64_t)c->stride * c->n_slots + (uint64_t)c->n_slots * sizeof(slot) + c->index_bytes;
}

static uint32_t lookup(const pi2_ncache *c, uint32_t ffn, uint32_t neuron)
{
    if (ffn >= c->n_ffn || neuron >= c->n_neurons[ffn])
        return PI2_NCACHE_NONE;
    return c->index[ffn][neuron];
}

uint8_t *pi2_ncache_get(pi2_ncache *c, uint32_t ffn, uint32_t neuron)
{
    uint32_t i = lookup(c, ffn, neuron);
    if (i == PI2_NCACHE_NONE || c->s[i].state == S_RESERVED) {
        c->st.misses++;
        return NULL;
    }
    c->st.hits++;
    if (c->s[i].state == S_COLD && c->s[i].hold == 0 && c->lru_head != i) {
        lru_unlink(c, i);
        lru_push_front(c, i);
    }
    return c->arena + (size_t)i * c->stride;
}

bool pi2_ncache_contains(const pi2_ncache *c, uint32_t ffn, uint32_t neuron)
{
    uint32_t i = lookup(c, ffn, neuron);
    return i != PI2_NCACHE_NONE && c->s[i].state != S_RESERVED;
}

uint8_t *pi2_ncache_reserve(pi2_ncache *c, uint32_t ffn, uint32_t neuron, bool pin, uint32_t *slot_out,
                            pi2_err *err)
{
    if (ffn >= c->n_ffn || neuron >= c->n_neurons[ffn]) {
        pi2_err_set(err, PI2_EINVAL, "neuron cache: FFN %u neuron %u out of range", ffn, neuron);
        return NULL;
    }
    if (c->index[ffn][neuron] != PI2_NCACHE_NONE) {
        pi2_err_set(err, PI2_EINVAL, "neuron cache: FFN %u neuron %u is already cached or in flight", ffn, neuron);
        return NULL;
    }
    uint32_t i = c->free_head;
    if (i != PI2_NCACHE_NONE) {
        c->free_head = c->s[i].next;
        c->n_free--;
    } else {
        i = c->lru_tail; /* least recently used committed cold entry */
        if (i == PI2_NCACHE_NONE) {
            pi2_err_set(err, PI2_ERANGE, "neuron cache: all %u slots are pinned or in flight", c->n_slots);
            return NULL;
        }
        lru_unlink(c, i);
        c->index[c->s[i].ffn][c->s[i].neuron] = PI2_NCACHE_NONE;
        c->st.evictions++;
        c->st.used--;
    }
    slot *x = &c->s[i];
    x->ffn = ffn;
    x->neuron = neuron;
    x->state = S_RESERVED;
    x->prev = x->next = PI2_NCACHE_NONE;
    x->pin = pin;
    x->hold = 0;
    c->index[ffn][neuron] = i;
    c->st.reserved++;
    *slot_out = i;
    return c->arena + (size_t)i * c->stride;
}

void pi2_ncache_commit(pi2_ncache *c, uint32_t i)
{
    slot *x = &c->s[i];
    c->st.reserved--;
    c->st.used++;
    if (x->pin) {
        x->state = S_PINNED;
        c->st.pinned++;
    } else {
        x->state = S_COLD;
        lru_push_front(c, i);
    }
}

void pi2_ncache_commit_hold(pi2_ncache *c, uint32_t i)
{
    slot *x = &c->s[i];
    c->st.reserved--;
    c->st.used++;
    x->hold = 1;
    c->st.held++;
    if (x->pin) {
        x->state = S_PINNED;
        c->st.pinned++;
    } else {
        x->state = S_COLD; /* held: joins the LRU list on its last release */
    }
}

uint8_t *pi2_ncache_hold(pi2_ncache *c, uint32_t ffn, uint32_t neuron, uint32_t *slot_out)
{
    uint32_t i = lookup(c, ffn, neuron);
    if (i == PI2_NCACHE_NONE || c->s[i].state == S_RESERVED) {
        c->st.misses++;
        return NULL;
    }
    c->st.hits++;
    slot *x = &c->s[i];
    if (x->hold++ == 0) {
        c->st.held++;
        if (x->state == S_COLD)
            lru_unlink(c, i);
    }
    *slot_out = i;
    return c->arena + (size_t)i * c->stride;
}

void pi2_ncache_release(pi2_ncache *c, uint32_t i)
{
    slot *x = &c->s[i];
    if (x->hold == 0)
        return;
    if (--x->hold == 0) {
        c->st.held--;
        if (x->state == S_COLD)
            lru_push_front(c, i);
    }
}

uint32_t pi2_ncache_evictable(const pi2_ncache *c) { return c->n_free + c->n_lru; }

uint8_t *pi2_ncache_slot_buf(const pi2_ncache *c, uint32_t i) { return c->arena + (size_t)i * c->stride; }

void pi2_ncache_abort(pi2_ncache *c, uint32_t i)
{
    slot *x = &c->s[i];
    c->index[x->ffn][x->neuron] = PI2_NCACHE_NONE;
    c->st.reserved--;
    free_push(c, i);
}

void pi2_ncache_stats_get(const pi2_ncache *c, pi2_ncache_stats *out) { *out = c->st; }

void pi2_ncache_stats_reset(pi2_ncache *c)
{
    c->st.hits = c->st.misses = c->st.evictions = 0;
}
