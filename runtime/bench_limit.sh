#!/bin/sh
# Memory-limit benchmark (make bench): the promise of --mem-limit on one
# bundled model, each run under a cgroup v1 memory cap of the limit's size
# (the page cache the run causes is charged too). For every run the peak
# footprint is checked twice: the group's memory.max_usage_in_bytes and the
# process's peak RSS (/usr/bin/time, outside the group); a peak above the
# limit, or a run the cap killed, FAILS the benchmark (exit 1) after the
# table is printed. Figures, each against something measured here:
#   least limit      pi2-run plan's smallest runnable limit, against the
#                    target: the Q4_0 bytes of everything but the FFNs
#                    (NONFFN_Q40) + 300 MB
#   sweep            decode at limits that leave 0/25/50/75/90% of the FFN
#                    payload out of memory (above the least limit that keeps
#                    every resident item resident), and at the least limit
#                    (everything that can stream streamed) + 1 MB with a
#                    512-token prompt; the planner's settings from this
#                    machine's hardware profile (pi2-run probe profile)
#   half-FFN limit   NONFFN_Q40 + half the FFN's Q4_0 bytes + 300 MB: decode
#                    against the same model fully in memory, the two
#                    alternating (ABBA) REPEAT times, and against the I/O
#                    floor (bytes read per token / this disk's random-read
#                    rate at the run's mean request size, pi2-run probe io)
#   in memory        this shape's decode fully in memory (the half-FFN
#                    pairs' in-memory runs) against a Q4_0-class dense engine
#                    at the memory's speed: 0.95 x the read bandwidth
#                    pi2-run --hw-probe measures before and after those runs
#                    (the better) / Q40_BYTES a token (4.03 GB, llama.cpp's
#                    Q4_0 of the 7B shape; target 2x), with the bytes read a
#                    token; and --dense decode against that bandwidth
#                    (target 0.85)
# HALF_MODEL (default MODEL.pi2): the same model converted otherwise (e.g.
# --pred-quant q4), which the half-FFN pairs and the in-memory figures run
# instead; the half-FFN limit is still MODEL's (the same FFN bytes).
# Writes WORKDIR/limit-NAME.json.
# Usage: sh runtime/bench_limit.sh MODEL.pi2 PUBKEY WORKDIR NONFFN_Q40_BYTES [NAME]
set -eu
B=${BUILD:-build}
M=${1:?usage: runtime/bench_limit.sh MODEL.pi2 PUBKEY WORKDIR NONFFN_Q40_BYTES [NAME]}
K=${2:?}
W=${3:?}
NQ=${4:?}
NAME=${5:-$(basename "$M" .pi2)}
HM=${HALF_MODEL:-$M}
RM=$M # the model run() runs
TH=${THREADS:-2}
TG=${BENCH_TG:-64}
PP=${BENCH_PP:-32}
POINTS=${POINTS:-"0 25 50 75 90"}
REPEAT=${REPEAT:-2}
Q40=${Q40_BYTES:-4030000000}
MB=1048576
mkdir -p "$W"
say() { printf '%s\n' "$*"; }
jget() { sed -n "s/.*\"$1\":\([-0-9.e+]*\).*/\1/p" | head -1; }
mb() { echo "$1" | awk -v m=$MB '{printf "%.1f", $1 / m}'; }
ratio() { echo "$1 $2" | awk '{ if ($2 > 0) printf "%.2f", $1 / $2; else print "nan" }'; }

capped=yes
[ -w /sys/fs/cgroup/memory ] || capped=no
[ -x /usr/bin/time ] || { echo "bench_limit: /usr/bin/time is missing (apt-get install time)" >&2; exit 1; }
sync
io=$("$B/pi2-run" probe io "$M" 2>/dev/null) || io="" # (a file under 1 MB cannot be probed)
. runtime/bench_io.sh # io_rate

# the planner's settings come from this machine's hardware profile, as a
# user's do once they have run pi2-run probe profile
HWP="$W/hw-profile.json"
"$B/pi2-run" probe profile --device-path "$(dirname "$M")" --hw-profile "$HWP" -t "$TH" >/dev/null
# least CTX: the smallest runnable limit at CTX positions (pi2-run plan without a limit)
least_at() { "$B/pi2-run" plan "$M" --pubkey "$K" --ctx "$1" -t "$TH" 2>/dev/null | jget minimum_bytes; }
least=$(least_at $((PP + TG)))
least512=$(least_at $((512 + TG)))
whole=$("$B/pi2-run" plan "$M" --pubkey "$K" --mem-limit 1T --ctx $((PP + TG)) -t "$TH" 2>/dev/null)
ffn=$(echo "$whole" | jget ffn_bytes)
# the sweep's 0%: the least that keeps every resident item resident (nothing streamed)
base=$(echo "$whole" | jget minimum_bytes)
target=$(echo "$NQ" | awk '{printf "%.0f", $1 + 300e6}')
half=$(echo "$NQ $ffn" | awk '{printf "%.0f", $1 + $2 / 2 + 300e6}')
say "least limit: $(mb "$least") MB at $((PP + TG)) positions, $(mb "$least512") MB at $((512 + TG))"
say "target: least limit $(mb "$least") MB = $(ratio "$least" "$target") x the target (non-FFN Q4_0 $(mb "$NQ") MB + 300 MB = $(mb "$target") MB; <= 1 meets it)"
say "FFN payload $(mb "$ffn") MB; half-FFN limit $(mb "$half") MB"

fails=""
# run LIMIT OUT [pi2-run args]: a --bench run at LIMIT under a cap of LIMIT;
# sets peak (cgroup bytes, or the run's own footprint uncapped) and rss
run() {
    limit=$1 out=$2
    shift 2
    set -- "$B/pi2-run" bench "$RM" --pubkey "$K" --bench-tg "$TG" -t "$TH" --mem-limit "$limit" --hw-profile "$HWP" "$@"
    if [ "$capped" = yes ]; then
        /usr/bin/time -f %M -o "$W/rss" sh tests/cgroup_run.sh "$limit" "$W/usage" "$@" >"$out" 2>"$W/err" || return 1
        read -r peak _ <"$W/usage"
    else
        /usr/bin/time -f %M -o "$W/rss" "$@" >"$out" 2>"$W/err" || return 1
        peak=$(jget footprint_bytes <"$out")
    fi
    rss=$(($(tail -1 "$W/rss") * 1024))
}
# check LABEL LIMIT: a peak over the limit is a failure
check() {
    if [ "$peak" -gt "$2" ] || [ "$rss" -gt "$2" ]; then
        fails="$fails $1"
        echo "OVERRUN"
    else
        echo "ok"
    fi
}
row() { # row LABEL LIMIT OUT
    r=$(cat "$3")
    tg=$(echo "$r" | jget tg_tok_s)
    rb=$(echo "$r" | jget read_bytes_per_token)
    rs=$(echo "$r" | jget read_size)
    rate=$(io_rate "${rs:-4096}")
    st=$(check "$1" "$2")
    printf '%-12s %9s %8.2f %9.2f %9s %9s %7s\n' "$1" "$(mb "$2")" "$tg" "$(echo "${rb:-0}" | awk '{print $1 / 1e6}')" \
        "$(mb "$peak")" "$(mb "$rss")" "$st"
    points="$points{\"point\":\"$1\",\"limit\":$2,\"tok_s\":$tg,\"read_bytes_per_token\":${rb:-0},\"read_size\":${rs:-0},\"io_rate\":${rate:-0},\"cgroup_peak\":$peak,\"peak_rss\":$rss,\"over\":$([ "$st" = ok ] && echo false || echo true)},"
}
points=""
say "== sweep: each run under a cgroup cap of its limit (caps: $capped); peaks from the group and /usr/bin/time"
printf '%-12s %9s %8s %9s %9s %9s %7s\n' "point" "limit MB" "tok/s" "MB read/t" "cg peak" "peak RSS" "peak"
for pct in $POINTS; do
    limit=$(echo "$base $ffn $pct" | awk '{printf "%.0f", $1 + $2 * (100 - $3) / 100 + 65536}')
    if run "$limit" "$W/limit-$NAME-$pct.json" --bench-pp "$PP"; then
        row "$pct% out" "$limit" "$W/limit-$NAME-$pct.json"
    else
        say "$pct% out: FAILED at $(mb "$limit") MB: $(tail -1 "$W/err")"
        fails="$fails $pct%"
    fi
done
limit=$((least512 + MB))
if run "$limit" "$W/limit-$NAME-least.json" --bench-pp 512; then
    row "least+1MB" "$limit" "$W/limit-$NAME-least.json"
else
    say "least + 1 MB: FAILED at $(mb "$limit") MB: $(tail -1 "$W/err")"
    fails="$fails least"
fi

say "== half-FFN limit ($(mb "$half") MB) vs fully in memory, alternating (ABBA) $REPEAT times ($(basename "$HM"))"
RM=$HM
# the same model fully in memory, into $mo
inmem() { "$B/pi2-run" bench "$HM" --pubkey "$K" --bench-pp "$PP" --bench-tg "$TG" -t "$TH" >"$mo" 2>"$W/err"; }
mt=0 ot=0 ok=yes
bw0=$("$B/pi2-run" --hw-probe -t "$TH" | jget read_bytes_per_s)
for i in $(seq "$REPEAT"); do
    mo="$W/limit-$NAME-inmem.json.$i" oo="$W/limit-$NAME-half.json.$i"
    if [ $((i % 2)) = 1 ]; then
        inmem && run "$half" "$oo" --bench-pp "$PP" || { ok=no; break; }
    else
        run "$half" "$oo" --bench-pp "$PP" && inmem || { ok=no; break; }
    fi
    row "half-FFN" "$half" "$oo" >/dev/null
    mt=$(echo "$mt $(jget tg_tok_s <"$mo")" | awk '{print $1 + $2}')
    ot=$(echo "$ot $(jget tg_tok_s <"$oo")" | awk '{print $1 + $2}')
done
vs_mem=0 vs_floor=0 vs_q40=0 dense_vs_bw=0
if [ "$ok" = yes ]; then
    mo="$W/limit-$NAME-dense.json"
    "$B/pi2-run" bench "$HM" --pubkey "$K" --bench-pp "$PP" --bench-tg 16 -t "$TH" --dense >"$mo" 2>"$W/err" || ok=no
fi
if [ "$ok" = yes ]; then
    bw1=$("$B/pi2-run" --hw-probe -t "$TH" | jget read_bytes_per_s)
    bw=$(echo "$bw0 $bw1" | awk '{print ($1 > $2 ? $1 : $2)}')
    dt=$(jget tg_tok_s <"$mo")
    db=$(echo "$(jget weight_bytes_per_token <"$mo") $(jget kv_bytes_per_token <"$mo")" | awk '{print $1 + $2}')
    dense_vs_bw=$(echo "$dt $db $bw" | awk '{printf "%.2f", $1 * $2 / $3}')
    mt=$(echo "$mt $REPEAT" | awk '{printf "%.3f", $1 / $2}')
    ot=$(echo "$ot $REPEAT" | awk '{printf "%.3f", $1 / $2}')
    vs_mem=$(ratio "$ot" "$mt")
    rb=$(jget read_bytes_per_token <"$oo")
    rate=$(io_rate "$(jget read_size <"$oo")")
    # the I/O floor's speed: tokens per second if reading were all a token cost
    floor=$(echo "${rb:-0} ${rate:-0}" | awk '{ if ($1 > 0) printf "%.3f", $2 / $1; else print 0 }')
    vs_floor=$(ratio "$ot" "$floor")
    q40_tg=$(echo "$bw $Q40" | awk '{printf "%.2f", 0.95 * $1 / $2}')
    vs_q40=$(ratio "$mt" "$q40_tg")
    sb=$(jget weight_bytes_per_token <"$W/limit-$NAME-inmem.json.1")
    say "fully in memory: $mt tok/s, $(echo "$sb" | awk '{printf "%.0f", $1 / 1e6}') MB of weights a token" \
        "= $vs_q40 x a Q4_0-class engine at the memory's speed: 0.95 x $(echo "$bw" | awk '{printf "%.2f", $1 / 1e9}')" \
        "GB/s / $(echo "$Q40" | awk '{printf "%.2f", $1 / 1e9}') GB = $q40_tg tok/s   [target >= 2]"
    say "--dense fully in memory: $dt tok/s, $(echo "$db" | awk '{printf "%.0f", $1 / 1e6}') MB a token" \
        "= $dense_vs_bw x the memory's read bandwidth   [target >= 0.85]"
    say "decode at $(mb "$half") MB: $ot tok/s = $vs_mem x fully in memory ($mt tok/s)   [target >= 0.5]"
    say "  reads $(echo "${rb:-0}" | awk '{printf "%.1f", $1 / 1e6}') MB a token; I/O floor $floor tok/s: decode = $vs_floor x the floor"
else
    say "half-FFN limit vs in memory: FAILED: $(tail -1 "$W/err")"
    fails="$fails half-FFN"
fi
printf '{"model":"%s","capped":"%s","least_bytes":%s,"least_target_bytes":%s,"ffn_bytes":%s,"half_limit":%s,"half_vs_in_memory":%s,"half_vs_io_floor":%s,"in_memory_vs_q4_0_at_0.95_bw":%s,"dense_vs_mem_bw":%s,"points":[%s]}\n' \
    "$NAME" "$capped" "$least" "$target" "$ffn" "$half" "$vs_mem" "$vs_floor" "$vs_q40" "$dense_vs_bw" "${points%,}" >"$W/limit-$NAME.json"
say "wrote $W/limit-$NAME.json"
if [ -n "$fails" ]; then
    say "FAIL: the memory limit did not hold (or a run failed) at:$fails"
    exit 1
fi
say "the limit held at every point"
