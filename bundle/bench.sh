#!/bin/sh
# Benchmark (not a test): bundling a converted model, normally the 7B-shaped
# one tests/bench.sh makes. Prints GB/s of output and peak RSS, with ratios to
# a baseline measured in the same run on the same disk: an O_DIRECT sequential
# read of the input plus an O_DIRECT write of as many bytes (dd, 16 MiB
# blocks), which is what a disk-bound bundler would take. Then verify's rate.
#   usage: sh bundle/bench.sh CONVERTED [WORKDIR]
# Leaves the bundle as WORKDIR/bundle-bench.pi2 (key bundle-bench.pem / .pub).
# Needs about twice the input's size free under WORKDIR (default: its dir).
set -eu
B=${BUILD:-build}
IN=${1:?usage: sh bundle/bench.sh CONVERTED [WORKDIR]}
W=${2:-$(dirname "$IN")}
mkdir -p "$W"
num() { sed -n "s/.*$1 \([0-9.]*\).*/\1/p" | head -1; }
size=$(stat -c %s "$IN")

echo "== baseline: O_DIRECT read of the input + O_DIRECT write of as many bytes (dd, 16 MiB blocks)"
cnt=$((size / 16777216 + 1))
t0=$(date +%s.%N)
dd if="$IN" of=/dev/null bs=16M iflag=direct status=none
t1=$(date +%s.%N)
dd if=/dev/zero of="$W/bench-dd.bin" bs=16M count="$cnt" oflag=direct conv=fsync status=none
t2=$(date +%s.%N)
rm -f "$W/bench-dd.bin"
rd=$(echo "$size $t0 $t1" | awk '{printf "%.3f", $1/($3-$2)/1e9}')
wr=$(echo "$size $t1 $t2" | awk '{printf "%.3f", $1/($3-$2)/1e9}')
both=$(echo "$size $t0 $t2" | awk '{printf "%.3f", $1/($3-$2)/1e9}')
echo "disk: read $rd GB/s, write $wr GB/s, read then write $both GB/s"

echo "== pi2-bundle $IN (signed, default layout)"
rm -f "$W/bundle-bench.pem" "$W/bundle-bench.pub" "$W/bundle-bench.pi2"
"$B/pi2-bundle" keygen --private "$W/bundle-bench.pem" --public "$W/bundle-bench.pub" >/dev/null
sync
"$B/pi2-bundle" "$IN" -o "$W/bundle-bench.pi2" --key "$W/bundle-bench.pem" -q | tee "$W/bench-bundle.log"
out=$(stat -c %s "$W/bundle-bench.pi2")
secs=$(sed -n 's/^done in \([0-9.]*\) s.*/\1/p' "$W/bench-bundle.log")
rss=$(num "peak RSS" <"$W/bench-bundle.log")
rate=$(echo "$out $secs" | awk '{printf "%.3f", $1/$2/1e9}')
ratio=$(echo "$rate $both" | awk '{printf "%.2f", $1/$2}')
echo "bundling: $rate GB/s written = $ratio x disk read-then-write; peak RSS $rss MB (target < 2048)"

echo "== pi2-bundle verify (the file was just written: mostly from the page cache)"
sync
"$B/pi2-bundle" verify "$W/bundle-bench.pi2" --pubkey "$W/bundle-bench.pub" | tee "$W/bench-verify.log"
v=$(sed -n 's/.* \([0-9.]*\) GB hashed in \([0-9.]*\) s.*/\1 \2/p' "$W/bench-verify.log" | awk '{printf "%.3f", $1/$2}')
echo "verify: $v GB/s = $(echo "$v $rd" | awk '{printf "%.2f", $1/$2}') x disk read"
printf '{"bundle_GBps": %s, "bundle_vs_disk": %s, "bundle_peak_rss_MB": %s, "verify_GBps": %s}\n' \
    "$rate" "$ratio" "$rss" "$v" | tee "$W/bench-bundle.json"
