/* pi2 tools: --version. The version is the git description of the source
 * and the date of its commit, given at build time (Makefile: PI2_VERSION,
 * PI2_BUILD_DATE; "unknown" outside a git checkout). Linked into the tools
 * only, not the library, so a new commit relinks three binaries, not every
 * test. */
#ifndef PI2_VERSION_H
#define PI2_VERSION_H

#include <stdio.h>

/* "TOOL (pi2) VERSION, built DATE" and the kernel paths: those compiled in
 * and the one this CPU takes. */
void pi2_version_print(FILE *f, const char *tool);

#endif
