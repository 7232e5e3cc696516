#!/bin/sh
# Benchmarks (not tests): the generator and the converter on the generated
# 7B-shaped model. Figures are printed with ratios to a baseline measured in
# the same run (sequential O_DIRECT read/write of the same bytes with dd: this
# machine's storage limit), then the offloading runtime on the bundled 7B-shaped
# model (runtime/bench_offload.sh), then the MoE model (runtime/bench_moe.sh).
# Needs ~40 GB free under BENCH_DIR. BENCH=runtime: only the 1B-shaped
# runtime part; BENCH=moe: only the MoE part.
set -eu
B=${BUILD:-build}
W=${BENCH_DIR:-$B/bench}
mkdir -p "$W"
say() { printf '%s\n' "$*"; }
num() { sed -n "s/.*$1 \([0-9.]*\).*/\1/p" | head -1; }

moe() {
    say "== mixture of experts: the generated TurboSparse-Mixtral-shaped model (runtime/bench_moe.sh)"
    BUILD=$B sh runtime/bench_moe.sh "$W/moe"
}
if [ "${BENCH:-all}" = moe ]; then moe; exit 0; fi

say "== runtime: the generated 1B-shaped ReGLU model, all in memory"
BUILD=$B sh runtime/bench.sh "$W"
[ "${BENCH:-all}" = runtime ] && exit 0

say "== generator: 7B-shaped dReLU model (hidden 4096, ffn 14336, 32 layers, BF16)"
rm -rf "$W/synth-7b"
out=$("$B/pi2-convert" synth --preset 7b --predictors -o "$W/synth-7b" | tail -1)
say "$out"
gen_gbs=$(echo "$out" | sed -n 's/.* in \([0-9.]*\) s.*/\1/p')
gen_rss=$(echo "$out" | num "peak RSS")
size=$(du -sb "$W/synth-7b" | cut -f1)

say "== baseline: sequential O_DIRECT write and read of the same bytes (dd, 16 MiB blocks)"
cnt=$((size / 16777216))
t0=$(date +%s.%N)
dd if=/dev/zero of="$W/dd.bin" bs=16M count="$cnt" oflag=direct conv=fsync status=none
t1=$(date +%s.%N)
wr=$(echo "$size $t0 $t1" | awk '{printf "%.3f", $1/($3-$2)/1e9}')
t0=$(date +%s.%N)
for f in "$W"/synth-7b/*.safetensors; do dd if="$f" of=/dev/null bs=16M iflag=direct status=none; done
t1=$(date +%s.%N)
rd=$(echo "$size $t0 $t1" | awk '{printf "%.3f", $1/($3-$2)/1e9}')
rm -f "$W/dd.bin"
gen_rate=$(echo "$size $gen_gbs" | awk '{printf "%.3f", $1/$2/1e9}')
say "disk: write $wr GB/s, read $rd GB/s"
say "generator: $gen_rate GB/s = $(echo "$gen_rate $wr" | awk '{printf "%.2f", $1/$2}') x disk write, peak RSS $gen_rss MB"

say "== converter without training (q4 FFN, q8 other; calibration kept minimal: 128 self-generated tokens)"
rm -f "$W/synth-7b.pi2c" "$W/synth-7b-min.pi2c"
"$B/pi2-convert" "$W/synth-7b" -o "$W/synth-7b-min.pi2c" --calib-tokens 128 -q >"$W/convert.log"
cat "$W/convert.log"
rm -f "$W/synth-7b-min.pi2c"
q=$(sed -n 's/.*: \([0-9.]*\) GB read in \([0-9.]*\) s.*/\1 \2/p' "$W/convert.log")
qrate=$(echo "$q" | awk '{printf "%.3f", $1/$2}')
crss=$(num "peak RSS" <"$W/convert.log")
say "quantization: $qrate GB/s read = $(echo "$qrate $rd" | awk '{printf "%.2f", $1/$2}') x disk read; peak RSS $crss MB (target < 2048)"

# The model the bundler and the offloading runtime get is converted again
# with the default calibration: its activation profile orders and groups
# the neurons. From 112 profiled tokens the co-activation groups fitted
# noise (each read brought 1.07 needed neurons at 50% offloaded); from
# 4032, a token at 50% made 4167 reads instead of 5811 (44 vs 59 MB) and
# decoded at 8.5 instead of 6.8 tok/s.
say "== converter with the default calibration (4096 self-generated tokens: the profile the bundle is ordered by)"
"$B/pi2-convert" "$W/synth-7b" -o "$W/synth-7b.pi2c" -q >"$W/convert-calib.log"
grep -E "^calibration|^quality|^wrote" "$W/convert-calib.log"

say "== bundler on the converted 7B-shaped model"
BUILD=$B sh bundle/bench.sh "$W/synth-7b.pi2c" "$W"

say "== offloading: the bundled 7B-shaped dReLU model under memory limits (runtime/bench_offload.sh)"
BUILD=$B sh runtime/bench_offload.sh "$W/bundle-bench.pi2" "$W/bundle-bench.pub" "$W" synth-7b

say "== converter with predictor training on a 2-layer 7B-shaped model (per-layer training time)"
rm -rf "$W/synth-7b-2l" "$W/synth-7b-2l.pi2c"
"$B/pi2-convert" synth --preset 7b --layers 2 -o "$W/synth-7b-2l" >/dev/null
"$B/pi2-convert" "$W/synth-7b-2l" -o "$W/synth-7b-2l.pi2c" --train-predictors --calib-tokens 4096 -q | tee "$W/train.log"
printf '{"gen_GBps": %s, "gen_vs_disk_write": %s, "gen_peak_rss_MB": %s, "quant_GBps": %s, "quant_vs_disk_read": %s, "convert_peak_rss_MB": %s}\n' \
    "$gen_rate" "$(echo "$gen_rate $wr" | awk '{printf "%.2f", $1/$2}')" "$gen_rss" "$qrate" \
    "$(echo "$qrate $rd" | awk '{printf "%.2f", $1/$2}')" "$crss" | tee "$W/results.json"
rm -rf "$W/synth-7b" "$W/synth-7b-2l" "$W/synth-7b-2l.pi2c" # room for the next models

# The memory limit's targets (runtime/bench_limit.sh) on the same shape with
# predictors of published size (rank 1025, as TurboSparse-Mistral's) and the
# most compact resident part: 4-bit attention, embeddings and head, 8-bit
# predictors. 937 MB: llama.cpp's Q4_0 bytes of everything but the FFNs.
# The half-FFN pairs run the same model with 4-bit predictors (the user's
# choice where memory is short: half the resident predictor bytes, their
# cost in the converter's report), the rest the 8-bit one.
say "== memory limit: 7B-shaped dReLU model, rank-1025 predictors, --other-quant q4 --pred-quant q8 (runtime/bench_limit.sh;"
say "   the half-FFN pairs: --pred-quant q4)"
rm -rf "$W/synth-7b-r1k" "$W/synth-7b-r1k.pi2c" "$W/synth-7b-r1k.pi2" "$W/synth-7b-r1k-p4.pi2c" "$W/synth-7b-r1k-p4.pi2"
"$B/pi2-convert" synth --preset 7b --rank 512 --predictors -o "$W/synth-7b-r1k" -q
for pq in q8 q4; do
    out="$W/synth-7b-r1k$([ $pq = q4 ] && echo -p4)"
    "$B/pi2-convert" "$W/synth-7b-r1k" -o "$out.pi2c" --other-quant q4 --pred-quant $pq -q | grep -E "^quality|^wrote"
    "$B/pi2-bundle" "$out.pi2c" -o "$out.pi2" --key "$W/bundle-bench.pem" -q
    rm -f "$out.pi2c"
done
rm -rf "$W/synth-7b-r1k"
limit_ok=yes
HALF_MODEL="$W/synth-7b-r1k-p4.pi2" BUILD=$B sh runtime/bench_limit.sh "$W/synth-7b-r1k.pi2" "$W/bundle-bench.pub" "$W" \
    937000000 synth-7b-r1k || limit_ok=no
rm -f "$W/synth-7b-r1k.pi2" "$W/synth-7b-r1k-p4.pi2" # room for the MoE model
moe
[ "$limit_ok" = yes ] || { say "FAIL: the memory limit did not hold on the 7B-shaped model (above)"; exit 1; }
