#!/bin/sh
# Check the Debian packages the build needs; install the missing ones with
# apt-get when running as root, else print the exact command and fail.
set -u
need=""
# A header alone is not enough: another package may provide it (libblas-dev
# also installs cblas.h), so each library must also link.
have_lib() {
    printf '#include <%s>\nint main(void) { return 0; }\n' "$1" \
        | ${CC:-cc} -x c - -o /dev/null "$2" >/dev/null 2>&1
}
have_lib jansson.h -ljansson || need="$need libjansson-dev"
have_lib archive.h -larchive || need="$need libarchive-dev"
have_lib openssl/evp.h -lcrypto || need="$need libssl-dev"
have_lib cblas.h -lopenblas || need="$need libopenblas-dev"
have_lib liburing.h -luring || need="$need liburing-dev"
printf '#include <stdarg.h>\n#include <stdint.h>\n#include <sys/types.h>\n#include <sys/socket.h>\n#include <microhttpd.h>\nint main(void) { return MHD_is_feature_supported(MHD_FEATURE_THREADS) ? 0 : 1; }\n' \
    | ${CC:-cc} -x c - -o /dev/null -lmicrohttpd >/dev/null 2>&1 || need="$need libmicrohttpd-dev"
printf '#include <stdarg.h>\n#include <stddef.h>\n#include <setjmp.h>\n#include <stdint.h>\n#include <cmocka.h>\n' \
    | ${CC:-cc} -E -x c - >/dev/null 2>&1 || need="$need libcmocka-dev"
command -v ${CC:-cc} >/dev/null 2>&1 || need="$need gcc"
command -v make >/dev/null 2>&1 || need="$need make"
# The tests' clients and oracles (never the tools'): curl and jq drive the
# server, python3-jinja2 checks the chat-template renderer byte for byte.
command -v curl >/dev/null 2>&1 || need="$need curl"
command -v jq >/dev/null 2>&1 || need="$need jq"
/usr/bin/python3 -c 'import jinja2' >/dev/null 2>&1 || need="$need python3-jinja2"
# `sh tests/deps.sh fuzz` (make fuzz): clang with libFuzzer and its sanitizer runtimes.
if [ "${1:-}" = fuzz ]; then
    command -v ${FUZZ_CC:-clang} >/dev/null 2>&1 || need="$need clang"
    printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n);\nint LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; return (int)(n & 0); }\n' \
        | ${FUZZ_CC:-clang} -fsanitize=fuzzer,address,undefined -x c - -o /dev/null >/dev/null 2>&1 \
        || need="$need libclang-rt-14-dev"
fi
[ -z "$need" ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing:$need"
    export DEBIAN_FRONTEND=noninteractive
    (apt-get install -y -q $need || { apt-get update -q && apt-get install -y -q $need; }) >/dev/null || {
        echo "error: apt-get install$need failed" >&2; exit 1; }
    exit 0
fi
echo "error: missing packages:$need" >&2
echo "run: sudo apt-get install -y$need" >&2
exit 1
