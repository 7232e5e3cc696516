#!/bin/sh
# The main job end to end on a model the project makes itself: generate an
# activation-sparse (dReLU) model, convert it (quantize, train predictors,
# profile, measure quality), bundle and sign it, then generate text with the
# sparse runtime and compare it with dense mode and the quantized reference.
set -eu
B=${BUILD:-build}
D=$B/demo
mkdir -p "$D"
rm -rf "$D/model" "$D/model.pi2c" "$D/model-q" "$D/model.pi2" "$D/key.pem" "$D/key.pub.pem" "$D/ts.pi2c" "$D/ts.pi2" \
    "$D/hw.json" "$D/plan.json" "$D"/model-*.json
export PI2_HW_PROFILE="$D/hw.json" # the demo's own hardware profile, not the user's
echo "== 1. pi2-convert synth: a generated dReLU model with planted sparsity (10% of FFN neurons fire per token)"
"$B/pi2-convert" synth --preset small -o "$D/model"
echo
echo "== 2. pi2-convert: 4-bit FFN / 8-bit attention, predictors trained on self-generated text, activation profile"
"$B/pi2-convert" "$D/model" -o "$D/model.pi2c" --train-predictors --calib-tokens 8192
echo
echo "== 3. what the converted model holds (a tar: every payload 4 KiB-aligned)"
tar tvf "$D/model.pi2c" | awk '{n++; s+=$3} END {printf "%d members, %.1f MB\n", n, s/1e6}'
tar tvf "$D/model.pi2c" | grep -v '\.pad/' | sed -n '1,4p;/predictor\|p\/0/p;/profile\/0/p;/manifest/p'
echo
echo "== 4. pi2-bundle: hot-to-cold neuron order, row-column bundles, one signed container"
"$B/pi2-bundle" keygen --private "$D/key.pem" --public "$D/key.pub.pem"
"$B/pi2-bundle" "$D/model.pi2c" -o "$D/model.pi2" --key "$D/key.pem"
"$B/pi2-bundle" verify "$D/model.pi2" --pubkey "$D/key.pub.pem"
"$B/pi2-bundle" inspect "$D/model.pi2"
echo
echo "== 5. pi2-run: the signed container, memory-mapped; sparse decode (only predicted neurons are read)"
"$B/pi2-run" "$D/model.pi2" --pubkey "$D/key.pub.pem" -p "Once upon a time" -n 32 --stats | tee "$D/inmem.txt"
echo
echo "== 6. the same prompt in --dense mode (every neuron computed) and on the quantized reference"
"$B/pi2-run" "$D/model.pi2" --pubkey "$D/key.pub.pem" -p "Once upon a time" -n 32 --dense --stats
"$B/pi2-convert" export "$D/model.pi2c" -o "$D/model-q" >/dev/null
"$B/pi2-run" --reference "$D/model-q" -p "Once upon a time" -n 32
echo
echo "== 7. perplexity on the decode path, sparse vs dense (text: the model's own sampled output)"
"$B/pi2-run" "$D/model.pi2" --pubkey "$D/key.pub.pem" -p "Once upon a time" -n 300 --temp 1 --seed 3 >"$D/text.txt"
"$B/pi2-run" "$D/model.pi2" --pubkey "$D/key.pub.pem" --ppl "$D/text.txt"
"$B/pi2-run" "$D/model.pi2" --pubkey "$D/key.pub.pem" --ppl "$D/text.txt" --dense
echo
echo "== 8. a fixed workload (prompt 128 tokens, 64 generated): one JSON line per mode"
"$B/pi2-run" "$D/model.pi2" --pubkey "$D/key.pub.pem" --bench
"$B/pi2-run" "$D/model.pi2" --pubkey "$D/key.pub.pem" --bench --dense
echo
echo "== 9. offloading: the same model in the least memory it can run in (the FFN weights stay in the file;"
echo "      the neurons that fire are read with direct I/O into a neuron cache, overlapping compute)"
plan=$("$B/pi2-run" "$D/model.pi2" --pubkey "$D/key.pub.pem" --plan-only --mem-limit 1T -p "Once upon a time" -n 32)
min=$(echo "$plan" | sed -n 's/.*"minimum_bytes":\([0-9]*\).*/\1/p')
ffn=$(echo "$plan" | sed -n 's/.*"ffn_bytes":\([0-9]*\).*/\1/p')
echo "plan: FFN payload $((ffn / 1024)) KiB; the smallest limit is $((min / 1048576 + 1)) MiB (resident weights, KV cache, buffers)"
"$B/pi2-run" "$D/model.pi2" --pubkey "$D/key.pub.pem" -p "Once upon a time" -n 32 --mem-limit "$((min / 1048576 + 1))M" \
    --hot-share 0 --no-plan --stats | tee "$D/offload.txt"
if cmp -s "$D/inmem.txt" "$D/offload.txt"; then echo "same text as with every weight in memory: yes"
else echo "text differs from the in-memory run (the offloaded FFN sums in another order; a near-tie flipped)"; fi
echo
echo "== 10. the planner: profile this machine (kernels, memory, this disk; short figures for the demo), then plan"
echo "      at the smallest limit of step 9 plus a quarter of the FFN: hot groups per layer, threads, I/O depth, predicted
      speed (on this small model a shallower I/O queue frees enough memory to keep every FFN neuron)"
"$B/pi2-run" --profile-hw --device-path "$D" --hw-profile "$D/hw.json" --profile-seconds 0.05 >/dev/null
half=$((min / 1024 + ffn / 4096))
"$B/pi2-run" "$D/model.pi2" --pubkey "$D/key.pub.pem" --hw-profile "$D/hw.json" --plan-only --mem-limit "${half}K" \
    -p "Once upon a time" -n 32 >"$D/plan.json"
sed 's/"hot_groups":\[[0-9,]*\]/"hot_groups":[...]/; s/"gate_groups":\[[0-9,]*\]/"gate_groups":[...]/; s/,"memory".*/}/' "$D/plan.json"
"$B/pi2-run" "$D/model.pi2" --pubkey "$D/key.pub.pem" --hw-profile "$D/hw.json" -p "Once upon a time" -n 32 \
    --mem-limit "${half}K" --plan "$D/plan.json" --stats 2>&1 | grep -v "^per-token\|^FFN\|^threads"
if [ -d ../shared/models/tinystories-656k-drelu ]; then
    echo
    echo "== 11. a real trained dReLU model (../shared/models/tinystories-656k-drelu): convert, bundle, run"
    "$B/pi2-convert" ../shared/models/tinystories-656k-drelu -o "$D/ts.pi2c" --train-predictors -q | tail -1
    "$B/pi2-bundle" "$D/ts.pi2c" -o "$D/ts.pi2" --key "$D/key.pem" -q
    "$B/pi2-run" "$D/ts.pi2" --pubkey "$D/key.pub.pem" -p "Once upon a time, there was a" -n 48 --stats
fi
