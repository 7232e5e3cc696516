#!/bin/sh
# Check the Debian packages the build needs; install the missing ones with
# apt-get when running as root, else print the exact command and fail.
set -u
need=""
. "$(dirname "$0")/deps_libs.sh"
lib_needs "${CC:-cc}" ""
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
