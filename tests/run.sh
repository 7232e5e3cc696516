#!/bin/sh
# Run the cmocka test binaries given as arguments, then the fuzz replays and
# the end-to-end tests; print one closing line "N passed, N failed, N skipped".
#   TEST_TIMEOUT  seconds each binary (and e2e.sh) may run; past it the binary
#                 counts as one failure, named (default 600)
#   TEST_JOBS     unit binaries run at once (default 2); each one's output is
#                 printed whole, in argument order
#   PI2_UNIT_ONLY set: the binaries given only (make unit, the TSan run)
set -u
TEST_TIMEOUT=${TEST_TIMEOUT:-600}
TEST_JOBS=${TEST_JOBS:-2}
pass=0 fail=0 skip=0
dir=$(mktemp -d "${TMPDIR:-/tmp}/pi2run.XXXXXX")
trap 'rm -rf "$dir"' EXIT

# timed CMD...: CMD under the timeout (a second signal 10 s later if it
# ignores the first); the status of CMD, or 124 when it ran out of time.
timed() {
    timeout -k 10 "$TEST_TIMEOUT" "$@"
    rc=$?
    [ "$rc" -eq 137 ] && rc=124
    return "$rc"
}
# status NAME RC: a line for a binary that timed out or exited non-zero.
status() {
    if [ "$2" -eq 124 ]; then echo "$1: timed out after $TEST_TIMEOUT s"
    else echo "$1: exited with status $2"; fi
}

# Each unit binary i writes its output to $dir/i.log and its status to $dir/i.rc.
i=0
for t in "$@"; do
    i=$((i + 1))
    printf '%s\n%s\n' "$i" "$t"
done | xargs -r -n 2 -P "$TEST_JOBS" sh -c '
    timeout -k 10 "$1" "$4" >"$2/$3.log" 2>&1; echo $? >"$2/$3.rc"
' sh "$TEST_TIMEOUT" "$dir"
i=0
for t in "$@"; do
    i=$((i + 1))
    log="$dir/$i.log"
    rc=$(cat "$dir/$i.rc" 2>/dev/null || echo 1)
    [ "$rc" -eq 137 ] && rc=124
    cat "$log"
    p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | head -1)
    f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" | head -1)
    s=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$log" | head -1)
    pass=$((pass + ${p:-0})); fail=$((fail + ${f:-0})); skip=$((skip + ${s:-0}))
    if [ "$rc" -ne 0 ] && { [ -z "$f" ] || [ "$rc" -eq 124 ]; }; then
        status "$t" "$rc"; fail=$((fail + 1))
    fi
done
if [ -n "${PI2_UNIT_ONLY:-}" ]; then
    echo "$pass passed, $fail failed, $skip skipped"
    [ "$fail" -eq 0 ]
    exit
fi
# Fuzz regression replay: every seed and every saved crash of each target.
for r in "${BUILD:-build}"/fuzz/replay-*; do
    [ -x "$r" ] || continue
    t=${r##*/replay-}
    out=$(timed "$r" "$t" "tests/fuzz/corpus/$t" "tests/fuzz/crashes/$t" 2>&1)
    rc=$?
    echo "$out"
    if [ "$rc" -eq 0 ]; then pass=$((pass + 1)); else status "$r" "$rc"; fail=$((fail + 1)); fi
done
if [ -f tests/e2e.sh ]; then
    out=$(timed env BUILD="${BUILD:-build}" sh tests/e2e.sh 2>&1)
    rc=$?
    echo "$out"
    p=$(echo "$out" | sed -n 's/^e2e: \([0-9]*\) passed, \([0-9]*\) failed, \([0-9]*\) skipped$/\1 \2 \3/p')
    set -- $p
    pass=$((pass + ${1:-0})); fail=$((fail + ${2:-1})); skip=$((skip + ${3:-0}))
    [ "$rc" -eq 124 ] && { status tests/e2e.sh "$rc"; [ -n "$p" ] && fail=$((fail + 1)); }
fi
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
