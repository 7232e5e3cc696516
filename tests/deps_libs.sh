# Sourced by tests/deps.sh and tests/arm64.sh. lib_needs CC SUFFIX appends
# to $need each library's -dev package (named with SUFFIX, e.g. ":arm64")
# whose header does not compile and link with CC: a header alone is not
# enough, another package may provide it (libblas-dev also installs
# cblas.h). A CC that does not exist needs them all.
lib_needs() {
    # links C [LIBS]: the program C compiles and links with $1
    links() { printf '%b' "$2" | $1 -x c - -o /dev/null $3 >/dev/null 2>&1; }
    main='int main(void) { return 0; }\n'
    links "$1" "#include <jansson.h>\n$main" -ljansson || need="$need libjansson-dev$2"
    links "$1" "#include <archive.h>\n$main" -larchive || need="$need libarchive-dev$2"
    links "$1" "#include <openssl/evp.h>\n$main" -lcrypto || need="$need libssl-dev$2"
    links "$1" "#include <cblas.h>\n$main" -lopenblas || need="$need libopenblas-dev$2"
    links "$1" "#include <liburing.h>\n$main" -luring || need="$need liburing-dev$2"
    links "$1" "#include <stdarg.h>\n#include <stdint.h>\n#include <sys/types.h>\n#include <sys/socket.h>\n#include <microhttpd.h>\nint main(void) { return MHD_is_feature_supported(MHD_FEATURE_THREADS) ? 0 : 1; }\n" \
        -lmicrohttpd || need="$need libmicrohttpd-dev$2"
    links "$1" "#include <stdarg.h>\n#include <stddef.h>\n#include <setjmp.h>\n#include <stdint.h>\n#include <cmocka.h>\n$main" \
        -lcmocka || need="$need libcmocka-dev$2"
}
