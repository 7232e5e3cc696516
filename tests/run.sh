#!/bin/sh
# Run the cmocka test binaries given as arguments, then the end-to-end tests;
# print one closing line "N passed, N failed, N skipped".
set -u
pass=0 fail=0 skip=0
log=$(mktemp)
for t in "$@"; do
    "$t" >"$log" 2>&1
    rc=$?
    cat "$log"
    p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | head -1)
    f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" | head -1)
    s=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$log" | head -1)
    pass=$((pass + ${p:-0})); fail=$((fail + ${f:-0})); skip=$((skip + ${s:-0}))
    if [ "$rc" -ne 0 ] && [ -z "$f" ]; then
        echo "$t: exited with status $rc"; fail=$((fail + 1))
    fi
done
rm -f "$log"
# PI2_UNIT_ONLY=1 (the TSan run): the binaries above only.
[ -n "${PI2_UNIT_ONLY:-}" ] && { echo "$pass passed, $fail failed, $skip skipped"; [ "$fail" -eq 0 ]; exit; }
# Fuzz regression replay: every seed and every saved crash of each target.
for r in "${BUILD:-build}"/fuzz/replay-*; do
    [ -x "$r" ] || continue
    t=${r##*/replay-}
    out=$("$r" "$t" "tests/fuzz/corpus/$t" "tests/fuzz/crashes/$t" 2>&1)
    rc=$?
    echo "$out"
    if [ "$rc" -eq 0 ]; then pass=$((pass + 1)); else echo "$r: exited with status $rc"; fail=$((fail + 1)); fi
done
if [ -x tests/e2e.sh ] || [ -f tests/e2e.sh ]; then
    out=$(BUILD=${BUILD:-build} sh tests/e2e.sh 2>&1)
    echo "$out"
    p=$(echo "$out" | sed -n 's/^e2e: \([0-9]*\) passed, \([0-9]*\) failed, \([0-9]*\) skipped$/\1 \2 \3/p')
    set -- $p
    pass=$((pass + ${1:-0})); fail=$((fail + ${2:-1})); skip=$((skip + ${3:-0}))
fi
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
