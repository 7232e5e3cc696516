/* The one ISA state of the process: which instruction sets this CPU runs
 * (cpuid on x86-64, getauxval's hardware capabilities on arm64; once), the path the kernels take (pi2_k_set_isa / pi2_k_get_isa)
 * and whether the GFNI variants are on. Nothing else keeps one: every
 * kernel call reads it here or is given its `isa`. */
#include "runtime/kernels/internal.h"

#include <stdatomic.h>
#ifdef PI2_K_ARM64
#include <sys/auxv.h>
/* The kernel's bits (arch/arm64/include/uapi/asm/hwcap.h), for older libc headers. */
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1UL << 1)
#endif
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20)
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1UL << 13)
#endif
#endif

/* Bit i set when pi2_isa i runs here; computed once (cpuid is slow in a VM
 * and the *_isa variants check on every call). Racing first calls store
 * the same value. */
static _Atomic int g_isa_mask = -1;

/* The path the kernels take: -1 until first use (then the best), or what
 * pi2_k_set_isa forced. */
static _Atomic int g_isa = -1;

/* GFNI, for the AVX-512 Q4 one-token kernel: -1 until first asked, then 0
 * or 1 (pi2_k_set_gfni turns it off and on). */
static _Atomic int g_gfni = -1;

static bool isa_detect(pi2_isa isa)
{
    if (isa == PI2_ISA_SCALAR)
        return true;
#ifdef PI2_K_X86
    /* libgcc's cpu model also checks XGETBV, so the OS saves the registers. */
    __builtin_cpu_init();
    unsigned eax, ebx, ecx = 0, edx;
    bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C); /* not a cpu_supports name in clang */
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    if (isa == PI2_ISA_AVX2)
        return avx2;
    if (isa == PI2_ISA_AVX512)
        return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#endif
#ifdef PI2_K_ARM64
    /* each level includes the one below, so the best is the highest */
    unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    bool neon = hw & HWCAP_ASIMD, dp = neon && (hw & HWCAP_ASIMDDP);
    if (isa == PI2_ISA_NEON)
        return neon;
    if (isa == PI2_ISA_DOTPROD)
        return dp;
    if (isa == PI2_ISA_I8MM)
        return dp && (hw2 & HWCAP2_I8MM);
#endif
    return false;
}

bool pi2_k_isa_compiled(pi2_isa isa)
{
    switch (isa) {
    case PI2_ISA_SCALAR:
        return true;
    case PI2_ISA_AVX2:
    case PI2_ISA_AVX512:
#ifdef PI2_K_X86
        return true;
#else
        return false;
#endif
    case PI2_ISA_NEON:
    case PI2_ISA_DOTPROD:
    case PI2_ISA_I8MM:
#ifdef PI2_K_ARM64
        return true;
#else
        return false;
#endif
    }
    return false;
}

bool pi2_k_isa_supported(pi2_isa isa)
{
    int m = atomic_load_explicit(&g_isa_mask, memory_order_relaxed);
    if (m < 0) {
        m = 0;
        for (int i = PI2_ISA_SCALAR; i < PI2_ISA_COUNT; i++)
            if (isa_detect((pi2_isa)i))
                m |= 1 << i;
        atomic_store_explicit(&g_isa_mask, m, memory_order_relaxed);
    }
    return (unsigned)isa < PI2_ISA_COUNT && (m >> isa & 1);
}

const char *pi2_k_isa_name(pi2_isa isa)
{
    switch (isa) {
    case PI2_ISA_SCALAR:
        return "scalar";
    case PI2_ISA_AVX2:
        return "avx2";
    case PI2_ISA_AVX512:
        return "avx512vnni";
    case PI2_ISA_NEON:
        return "neon";
    case PI2_ISA_DOTPROD:
        return "dotprod";
    case PI2_ISA_I8MM:
        return "i8mm";
    }
    return "?";
}

pi2_isa pi2_k_isa_best(void)
{
    /* one family runs on a CPU: the highest supported */
    for (int i = PI2_ISA_COUNT - 1; i > PI2_ISA_SCALAR; i--)
        if (pi2_k_isa_supported((pi2_isa)i))
            return (pi2_isa)i;
    return PI2_ISA_SCALAR;
}

pi2_isa pi2_k_get_isa(void)
{
    int isa = atomic_load_explicit(&g_isa, memory_order_relaxed);
    if (isa < 0) {
        isa = (int)pi2_k_isa_best();
        atomic_store_explicit(&g_isa, isa, memory_order_relaxed);
    }
    return (pi2_isa)isa;
}

int pi2_k_set_isa(pi2_isa isa)
{
    if ((unsigned)isa >= PI2_ISA_COUNT)
        return PI2_EINVAL;
    if (!pi2_k_isa_supported(isa))
        return PI2_EUNSUPPORTED;
    atomic_store_explicit(&g_isa, (int)isa, memory_order_relaxed);
    return 0;
}

pi2_isa pi2_ki_isa_pick(pi2_isa isa) { return pi2_k_isa_supported(isa) ? isa : PI2_ISA_SCALAR; }

#ifdef PI2_K_X86

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
    (void)g_gfni;
    return on ? -1 : 0;
#endif
}
