#!/bin/sh
# MoE benchmark (make bench): the generated TurboSparse-Mixtral-shaped model
# (pi2-convert synth --preset moe: hidden 2048, 8 experts of ffn 5632, top-2,
# 16 layers, dReLU, per-expert predictors shipped in the checkpoint; 9.65 GB
# BF16) converted (predictors imported), bundled, then
#   1. the memory-vs-speed table of runtime/bench_offload.sh at 0%, 50% and
#      75% of the expert payloads out of memory (hit rates, bytes per token,
#      physical floors, planned vs fixed split);
#   2. the expert-aware read-ahead at 50%: decode with the router's guess of
#      each layer's experts read ahead during attention vs --no-read-ahead,
#      alternating REPEAT times, and how often an expert chosen for a token
#      is chosen again for the next (vs top-k / experts by chance).
# Needs ~16 GB free under WORKDIR; the bundle is kept there and reused
# (delete WORKDIR/synth-moe.pi2 to make it anew).
# Usage: sh runtime/bench_moe.sh WORKDIR
set -eu
B=${BUILD:-build}
W=${1:?usage: runtime/bench_moe.sh WORKDIR}
TH=${THREADS:-2}
TG=${BENCH_TG:-64}
PP=${BENCH_PP:-32}
REPEAT=${REPEAT:-2}
mkdir -p "$W"
say() { printf '%s\n' "$*"; }
jget() { sed -n "s/.*\"$1\":\([-0-9.e+]*\).*/\1/p" | head -1; }
M="$W/synth-moe"

if [ ! -f "$M.pi2" ] || [ ! -f "$W/moe.pub" ]; then # kept from an earlier run (as runtime/bench.sh keeps its model)
    say "== generating the MoE model (preset moe), converting (1024 calibration tokens: every expert gets samples), bundling"
    rm -rf "$M" "$M.pi2c" "$M.pi2"
    "$B/pi2-convert" synth --preset moe -o "$M" | tail -1
    "$B/pi2-convert" "$M" -o "$M.pi2c" --calib-tokens 1024 -q | grep -v '^  layer'
    rm -f "$W/moe.pem" "$W/moe.pub"
    "$B/pi2-bundle" keygen --private "$W/moe.pem" --public "$W/moe.pub" >/dev/null
    "$B/pi2-bundle" "$M.pi2c" -o "$M.pi2" --key "$W/moe.pem" -q
    rm -rf "$M" "$M.pi2c" # the bundle is all the runs need
fi

say "== offloading table (runtime/bench_offload.sh)"
POINTS=${POINTS:-"0 50 75"} BUILD=$B sh runtime/bench_offload.sh "$M.pi2" "$W/moe.pub" "$W" synth-moe

say "== expert-aware read-ahead at 50% offloaded (fixed split): router guess + predictors during attention vs none"
plan=$("$B/pi2-run" "$M.pi2" --pubkey "$W/moe.pub" --plan-only --bench --mem-limit 1T -t "$TH" --no-plan)
minimum=$(echo "$plan" | jget minimum_bytes)
ffn=$(echo "$plan" | jget ffn_bytes)
limit=$(echo "$minimum $ffn" | awk '{printf "%.0f", $1 + $2 / 2 + 65536}')
capped=yes
[ -w /sys/fs/cgroup/memory ] || capped=no
one() {
    if [ "$capped" = yes ]; then
        sh tests/cgroup_run.sh "$limit" "$W/usage" "$B/pi2-run" "$M.pi2" --pubkey "$W/moe.pub" --bench --bench-pp "$PP" \
            --bench-tg "$TG" -t "$TH" --mem-limit "$limit" --no-verify-ffn --no-plan "$@"
    else
        "$B/pi2-run" "$M.pi2" --pubkey "$W/moe.pub" --bench --bench-pp "$PP" --bench-tg "$TG" -t "$TH" \
            --mem-limit "$limit" --no-verify-ffn --no-plan "$@"
    fi
}
printf '%-14s %8s %7s %9s %9s %9s %9s\n' "read-ahead" "tok/s" "hit%" "MB read/t" "reads/t" "IO wait" "guessed"
for i in $(seq "$REPEAT"); do
    for mode in on off; do
        if [ "$mode" = on ]; then r=$(one); else r=$(one --no-read-ahead); fi
        echo "$r" >"$W/moe-ra-$mode.json.$i"
        echo "$mode $(echo "$r" | jget tg_tok_s) $(echo "$r" | jget hit_rate) $(echo "$r" | jget read_bytes_per_token) \
            $(echo "$r" | jget reads_per_token) $(echo "$r" | jget io_wait_share) $(echo "$r" | jget expert_guessed)" |
            awk '{printf "%-14s %8.2f %7.1f %9.2f %9.0f %8.1f%% %8.1f%%\n", $1, $2, 100*$3, $4/1e6, $5, 100*$6, 100*$7}'
    done
done
# means over the runs (jget keeps a file's first match only)
mean() { for f in "$W"/moe-ra-$1.json.*; do jget tg_tok_s <"$f"; done | awk '{s+=$1; n++} END {print s/n}'; }
on=$(mean on)
off=$(mean off)
reuse=$(jget expert_reuse <"$W/moe-ra-on.json.1")
say "read-ahead on / off: $(echo "$on $off" | awk '{printf "%.2f / %.2f tok/s = %.2fx", $1, $2, $1/$2}') (means of $REPEAT each; caps: $capped)"
say "experts: $(echo "$reuse" | awk '{printf "%.1f%%", 100*$1}') of choices repeat the previous token's (chance: top-2 of 8 = 25%)"
printf '{"model":"synth-moe","offloaded_pct":50,"read_ahead_tok_s":%s,"no_read_ahead_tok_s":%s,"expert_reuse":%s}\n' \
    "$on" "$off" "$reuse" | tee "$W/moe-read-ahead.json"
