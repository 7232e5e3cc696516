/* runtime/ncache: hits and misses, LRU order against a reference model,
 * pinned entries never evicted, reserved slots never reused, aborts, and
 * bad calls. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "runtime/offload/ncache.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static pi2_ncache *make(uint32_t slots, size_t bytes)
{
    static const uint32_t neurons[3] = {100, 7, 50};
    pi2_ncache *c = NULL;
    pi2_err e = {0};
    assert_int_equal(pi2_ncache_create(&c, 3, neurons, bytes, slots, &e), 0);
    return c;
}

static uint8_t *fill(pi2_ncache *c, uint32_t f, uint32_t n, bool pin)
{
    uint32_t slot;
    pi2_err e = {0};
    uint8_t *b = pi2_ncache_reserve(c, f, n, pin, &slot, &e);
    assert_non_null(b);
    memset(b, (int)(f * 31 + n), 32);
    pi2_ncache_commit(c, slot);
    return b;
}

static void test_basic(void **state)
{
    (void)state;
    pi2_ncache *c = make(4, 4096);
    assert_null(pi2_ncache_get(c, 0, 5));
    uint8_t *b = fill(c, 0, 5, false);
    assert_int_equal((uintptr_t)b % 4096, 0);
    assert_ptr_equal(pi2_ncache_get(c, 0, 5), b);
    assert_int_equal(b[31], (uint8_t)5);
    pi2_ncache_stats st;
    pi2_ncache_stats_get(c, &st);
    assert_int_equal(st.hits, 1);
    assert_int_equal(st.misses, 1);
    assert_int_equal(st.used, 1);
    assert_true(pi2_ncache_footprint(c) >= 4 * 4096);
    /* out-of-range lookups are plain misses */
    assert_null(pi2_ncache_get(c, 1, 7));
    assert_null(pi2_ncache_get(c, 3, 0));
    pi2_ncache_free(c);
}

/* Random traffic against a reference LRU (array of keys, most recent
 * first). */
static void test_lru_model(void **state)
{
    (void)state;
    enum { SLOTS = 16 };
    pi2_ncache *c = make(SLOTS, 100);
    uint32_t model[SLOTS];
    int n = 0;
    pi2_rng r;
    pi2_rng_seed(&r, 5);
    for (int it = 0; it < 20000; it++) {
        uint32_t f = (uint32_t)(pi2_rng_u64(&r) % 3), nn = f == 1 ? 7 : f == 0 ? 100 : 50;
        uint32_t ne = (uint32_t)(pi2_rng_u64(&r) % (nn < 30 ? nn : 30));
        uint32_t key = f << 16 | ne;
        int at = -1;
        for (int i = 0; i < n; i++)
            if (model[i] == key)
                at = i;
        uint8_t *b = pi2_ncache_get(c, f, ne);
        assert_int_equal(b != NULL, at >= 0);
        if (b) {
            assert_int_equal(b[0], (uint8_t)(f * 31 + ne));
            memmove(model + 1, model, (size_t)at * sizeof *model);
            model[0] = key;
            continue;
        }
        if (n == SLOTS) { /* the model's least recent must be what goes */
            uint32_t victim = model[SLOTS - 1];
            fill(c, f, ne, false);
            assert_false(pi2_ncache_contains(c, victim >> 16, victim & 0xffff));
            n--;
        } else {
            fill(c, f, ne, false);
        }
        memmove(model + 1, model, (size_t)n * sizeof *model);
        model[0] = key;
        n++;
    }
    pi2_ncache_stats st;
    pi2_ncache_stats_get(c, &st);
    assert_int_equal(st.used, SLOTS);
    assert_true(st.evictions > 0);
    pi2_ncache_free(c);
}

static void test_pinned_and_reserved(void **state)
{
    (void)state;
    pi2_ncache *c = make(3, 64);
    fill(c, 0, 1, true);
    fill(c, 0, 2, true);
    uint32_t s1, s2;
    pi2_err e = {0};
    uint8_t *b = pi2_ncache_reserve(c, 2, 9, false, &s1, &e);
    assert_non_null(b);
    assert_int_equal((uintptr_t)b % 64, 0);
    assert_false(pi2_ncache_contains(c, 2, 9)); /* in flight: not visible */
    assert_null(pi2_ncache_get(c, 2, 9));
    /* every slot pinned or in flight: no slot */
    assert_null(pi2_ncache_reserve(c, 2, 10, false, &s2, &e));
    assert_int_equal(e.code, PI2_ERANGE);
    /* the same key twice */
    pi2_err e2 = {0};
    assert_null(pi2_ncache_reserve(c, 2, 9, false, &s2, &e2));
    assert_int_equal(e2.code, PI2_EINVAL);
    pi2_ncache_abort(c, s1); /* the read failed: slot free again */
    assert_false(pi2_ncache_contains(c, 2, 9));
    fill(c, 2, 10, false);
    fill(c, 2, 11, false); /* evicts (2, 10), never the pinned ones */
    assert_true(pi2_ncache_contains(c, 0, 1));
    assert_true(pi2_ncache_contains(c, 0, 2));
    assert_false(pi2_ncache_contains(c, 2, 10));
    assert_true(pi2_ncache_contains(c, 2, 11));
    pi2_ncache_stats st;
    pi2_ncache_stats_get(c, &st);
    assert_int_equal(st.pinned, 2);
    assert_int_equal(st.reserved, 0);
    pi2_ncache_free(c);
}

/* Held entries are never evicted; the last release makes them most
 * recently used; evictable counts free plus unheld cold entries. */
static void test_hold_release(void **state)
{
    (void)state;
    pi2_ncache *c = make(3, 64);
    pi2_err e = {0};
    assert_int_equal(pi2_ncache_evictable(c), 3);
    fill(c, 0, 1, false);
    fill(c, 0, 2, false);
    uint32_t s1, s2, s3, r;
    uint8_t *b1 = pi2_ncache_hold(c, 0, 1, &s1);
    assert_non_null(b1);
    assert_ptr_equal(pi2_ncache_hold(c, 0, 1, &s2), b1); /* twice */
    assert_int_equal(s1, s2);
    assert_int_equal(pi2_ncache_evictable(c), 2); /* the free slot and (0,2) */
    assert_null(pi2_ncache_hold(c, 2, 9, &s3));   /* miss */
    /* a reserve committed with a hold */
    uint8_t *b3 = pi2_ncache_reserve(c, 1, 3, false, &s3, &e);
    assert_non_null(b3);
    assert_ptr_equal(pi2_ncache_slot_buf(c, s3), b3);
    pi2_ncache_commit_hold(c, s3);
    assert_int_equal(pi2_ncache_evictable(c), 1);
    /* the next reserve can only evict (0,2) */
    assert_non_null(pi2_ncache_reserve(c, 2, 4, false, &r, &e));
    pi2_ncache_commit(c, r);
    assert_false(pi2_ncache_contains(c, 0, 2));
    assert_true(pi2_ncache_contains(c, 0, 1));
    pi2_ncache_stats st;
    pi2_ncache_stats_get(c, &st);
    assert_int_equal(st.held, 2);
    /* (2,4) is the only unheld entry: evict it; then nothing is evictable */
    assert_non_null(pi2_ncache_reserve(c, 2, 5, false, &r, &e));
    assert_int_equal(pi2_ncache_evictable(c), 0);
    assert_null(pi2_ncache_reserve(c, 2, 6, false, &r, &e));
    assert_int_equal(e.code, PI2_ERANGE);
    pi2_err_clear(&e);
    pi2_ncache_commit(c, r); /* (2,5): r is unchanged by the failed reserve */
    /* get on a held entry does not disturb it */
    assert_ptr_equal(pi2_ncache_get(c, 0, 1), b1);
    pi2_ncache_release(c, s1);
    assert_int_equal(pi2_ncache_evictable(c), 1); /* still held once */
    pi2_ncache_release(c, s1);
    pi2_ncache_release(c, s3);
    assert_int_equal(pi2_ncache_evictable(c), 3);
    pi2_ncache_release(c, s3); /* extra release: no-op */
    assert_int_equal(pi2_ncache_evictable(c), 3);
    /* LRU after releases: (0,1) released before (1,3) -> (0,1) goes first */
    assert_non_null(pi2_ncache_reserve(c, 2, 7, false, &r, &e)); /* evicts (2,5) */
    pi2_ncache_commit(c, r);
    assert_non_null(pi2_ncache_reserve(c, 2, 8, false, &r, &e));
    pi2_ncache_commit(c, r);
    assert_false(pi2_ncache_contains(c, 0, 1));
    assert_true(pi2_ncache_contains(c, 1, 3));
    pi2_ncache_free(c);
}

static void test_bad(void **state)
{
    (void)state;
    uint32_t n = 10;
    pi2_ncache *c = NULL;
    pi2_err e = {0};
    assert_int_equal(pi2_ncache_create(&c, 1, &n, 0, 4, &e), PI2_EINVAL);
    pi2_err e2 = {0};
    assert_int_equal(pi2_ncache_create(&c, 1, &n, (size_t)1 << 40, 1u << 30, &e2), PI2_ERANGE);
    assert_null(c);
    c = make(2, 64);
    uint32_t s;
    pi2_err e3 = {0};
    assert_null(pi2_ncache_reserve(c, 1, 7, false, &s, &e3));
    assert_int_equal(e3.code, PI2_EINVAL);
    pi2_ncache_free(c);
    pi2_ncache_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_basic),
        cmocka_unit_test(test_lru_model),
        cmocka_unit_test(test_pinned_and_reserved),
        cmocka_unit_test(test_hold_release),
        cmocka_unit_test(test_bad),
    };
    return cmocka_run_group_tests_name("ncache", tests, NULL, NULL);
}
