#!/bin/sh
# The main job end to end on a model the project makes itself: generate an
# activation-sparse (dReLU) model, then generate text from it and show what
# fired. Grows with the tools.
set -eu
B=${BUILD:-build}
D=$B/demo
mkdir -p "$D"
echo "== 1. pi2-convert synth: a generated dReLU model with planted sparsity (10% of FFN neurons per token)"
rm -rf "$D/model"
"$B/pi2-convert" synth --preset small -o "$D/model"
ls -l "$D/model"
echo
echo "== 2. pi2-run --reference: dense fp32 reference generation, with activation statistics"
"$B/pi2-run" --reference "$D/model" -p "Once upon a time" -n 32 --stats
if [ -d ../shared/models/tinystories-656k-drelu ]; then
    echo
    echo "== 3. the same on a real trained dReLU model (../shared/models/tinystories-656k-drelu)"
    "$B/pi2-run" --reference ../shared/models/tinystories-656k-drelu -p "Once upon a time, there was a" -n 48 --stats
fi
