#include "runtime/version.h"

#include "runtime/kernels.h"

#ifndef PI2_VERSION
#define PI2_VERSION "unknown"
#endif
#ifndef PI2_BUILD_DATE
#define PI2_BUILD_DATE "unknown"
#endif

void pi2_version_print(FILE *f, const char *tool)
{
    fprintf(f, "%s (pi2) %s, built %s\n", tool, PI2_VERSION, PI2_BUILD_DATE);
    fprintf(f, "kernels compiled in:");
    for (int i = PI2_ISA_SCALAR; i < PI2_ISA_COUNT; i++)
        if (pi2_k_isa_compiled((pi2_isa)i))
            fprintf(f, " %s", pi2_k_isa_name((pi2_isa)i));
    fprintf(f, "; this CPU runs %s\n", pi2_k_isa_name(pi2_k_isa_best()));
}
