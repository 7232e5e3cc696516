#!/bin/sh
# The main job end to end on a model the project makes itself: generate an
# activation-sparse (dReLU) model, convert it (quantize, train predictors,
# profile, measure quality), then generate text from the quantized weights.
# Grows with the tools.
set -eu
B=${BUILD:-build}
D=$B/demo
mkdir -p "$D"
rm -rf "$D/model" "$D/model.pi2c" "$D/model-q" "$D/model.pi2" "$D/key.pem" "$D/key.pub.pem"
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
echo "== 5. pi2-run on the quantized weights (exported back to an F32 dir for the reference path)"
"$B/pi2-convert" export "$D/model.pi2c" -o "$D/model-q"
"$B/pi2-run" --reference "$D/model-q" -p "Once upon a time" -n 32 --stats
if [ -d ../shared/models/tinystories-656k-drelu ]; then
    echo
    echo "== 6. a real trained dReLU model (../shared/models/tinystories-656k-drelu) on the reference path"
    "$B/pi2-run" --reference ../shared/models/tinystories-656k-drelu -p "Once upon a time, there was a" -n 48 --stats
fi
