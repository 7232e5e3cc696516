/* The kernels' ISA state: which instruction sets this CPU runs (cpuid,
 * once) and whether the GFNI variants are on. */
#include "runtime/kernels/internal.h"

#include <stdatomic.h>

#ifdef PI2_K_X86

/* Bit i set when pi2_isa i runs here; computed once (cpuid is slow in a VM
 * and the *_isa variants check on every call). Racing first calls store
 * the same value. */
static _Atomic int g_isa_mask = -1;

bool pi2_ki_isa_ok(pi2_isa isa)
{
    int m = atomic_load_explicit(&g_isa_mask, memory_order_relaxed);
    if (m < 0) {
        m = 0;
        for (int i = PI2_ISA_SCALAR; i <= PI2_ISA_AVX512; i++)
            if (pi2_q_isa_supported((pi2_isa)i))
                m |= 1 << i;
        atomic_store_explicit(&g_isa_mask, m, memory_order_relaxed);
    }
    return (unsigned)isa <= PI2_ISA_AVX512 && (m >> isa & 1);
}

pi2_isa pi2_ki_isa_pick(pi2_isa isa) { return pi2_ki_isa_ok(isa) ? isa : PI2_ISA_SCALAR; }

/* GFNI, for the AVX-512 Q4 one-token kernel: -1 until first asked, then 0
 * or 1 (pi2_k_set_gfni turns it off and on). */
static _Atomic int g_gfni = -1;

static bool gfni_supported(void)
{
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (c >> 8 & 1);
}

bool pi2_ki_gfni(void)
{
    int g = atomic_load_explicit(&g_gfni, memory_order_relaxed);
    if (g < 0) {
        g = gfni_supported();
        atomic_store_explicit(&g_gfni, g, memory_order_relaxed);
    }
    return g;
}

#endif /* PI2_K_X86 */

int pi2_k_set_gfni(bool on)
{
#ifdef PI2_K_X86
    if (on && !gfni_supported())
        return -1;
    atomic_store_explicit(&g_gfni, on, memory_order_relaxed);
    return 0;
#else
    return on ? -1 : 0;
#endif
}
