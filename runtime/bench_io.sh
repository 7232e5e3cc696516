# Sourced by the offloading benchmarks (runtime/bench_offload.sh,
# runtime/bench_limit.sh): io_rate REQ prints the random-read rate at
# depth 32, in bytes/s, that `pi2-run probe io` measured (its JSON in $io)
# for the probed request size nearest to REQ bytes on a log scale.
io_rate() {
    echo "$io" | tr '{' '\n' | awk -v want="$1" -F'[:,]' '
        /"depth":32/ { for (i = 1; i < NF; i++) { if ($i == "\"size\"") s = $(i+1); if ($i == "\"bytes_per_s\"") r = $(i+1) }
                       d = log(s / want); if (d < 0) d = -d
                       if (best == "" || d < bd) { best = r; bd = d } }
        END { print best }'
}
