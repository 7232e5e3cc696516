/* The guard of read-only file mappings (common.h): a SIGBUS inside a
 * registered mapping, the file having shrunk under it, is answered with a
 * page of zeros mapped over the faulting page and a mark on the mapping;
 * the faulting thread carries on and its owner checks the mark
 * (pi2_map_changed) when the work that read the bytes is done.
 *
 * Why not sigsetjmp: the bytes are read by every thread of the compute
 * pool, and a jump out of one of them would leave the others at a
 * barrier. A page of zeros keeps every thread going to the end of the
 * step; its results are thrown away. */
#include "formats/common.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

enum { GUARD_SLOTS = 64 };

/* One registered mapping: [lo, hi), and whether a fault was answered
 * in it. A free slot has lo == 0. */
static struct guard_slot {
    _Atomic uintptr_t lo, hi;
    atomic_int faulted;
} slots[GUARD_SLOTS];

static atomic_int installed;
static struct sigaction prev_bus;
static uintptr_t page_size; /* read at install: sysconf is not async-signal-safe */

static struct guard_slot *slot_of(uintptr_t a)
{
    for (int i = 0; i < GUARD_SLOTS; i++) {
        uintptr_t lo = atomic_load(&slots[i].lo);
        if (lo && a >= lo && a < atomic_load(&slots[i].hi))
            return &slots[i];
    }
    return NULL;
}

/* Async-signal-safe: atomics and one mmap. A fault outside every
 * registered mapping goes to the handler there was before (by default,
 * the process ends with SIGBUS as it would have). */
static void on_bus(int sig, siginfo_t *si, void *uc)
{
    uintptr_t a = (uintptr_t)si->si_addr;
    struct guard_slot *s = slot_of(a);
    if (s) {
        uintptr_t page = page_size;
        void *p = mmap((void *)(a & ~(page - 1)), page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        if (p != MAP_FAILED) {
            atomic_store(&s->faulted, 1);
            return; /* the instruction runs again and reads zeros */
        }
    }
    if (prev_bus.sa_flags & SA_SIGINFO)
        prev_bus.sa_sigaction(sig, si, uc);
    else if (prev_bus.sa_handler != SIG_DFL && prev_bus.sa_handler != SIG_IGN)
        prev_bus.sa_handler(sig);
    else {
        signal(SIGBUS, SIG_DFL); /* the fault repeats on return: the default action */
    }
}

int pi2_map_guard_install(pi2_err *err)
{
    if (atomic_exchange(&installed, 1))
        return 0;
    long ps = sysconf(_SC_PAGESIZE);
    page_size = ps > 0 ? (uintptr_t)ps : 4096;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_bus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, &prev_bus) != 0) {
        atomic_store(&installed, 0);
        return pi2_err_errno(err, PI2_EIO, errno, "cannot install the SIGBUS handler");
    }
    return 0;
}

void pi2_map_guard_add(const pi2_map *m)
{
    if (!m->data)
        return;
    uintptr_t lo = (uintptr_t)m->data;
    for (int i = 0; i < GUARD_SLOTS; i++) {
        uintptr_t free_lo = 0;
        if (atomic_compare_exchange_strong(&slots[i].lo, &free_lo, lo)) {
            /* hi is 0 until now: the range [lo, 0) holds no address */
            atomic_store(&slots[i].faulted, 0);
            atomic_store(&slots[i].hi, lo + m->size);
            return;
        }
    }
    /* more than GUARD_SLOTS mappings at once: this one goes unguarded */
}

void pi2_map_guard_remove(const pi2_map *m)
{
    struct guard_slot *s = m->data ? slot_of((uintptr_t)m->data) : NULL;
    if (s) {
        atomic_store(&s->hi, 0);
        atomic_store(&s->lo, 0);
    }
}

bool pi2_map_changed(const pi2_map *m)
{
    struct guard_slot *s = m->data ? slot_of((uintptr_t)m->data) : NULL;
    return s && atomic_load(&s->faulted);
}
