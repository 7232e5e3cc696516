#!/bin/sh
# Regenerate the seed corpora under tests/fuzz/corpus/<target>/ from the
# golden tinystories files and from inputs the project's tools make.
# Every seed stays under 64 KiB (larger candidates are skipped).
# Usage: sh tests/fuzz/make-corpus.sh   (from the repository root; builds
# build/ first). PI2_SHARED points at the shared models (default ../shared).
set -eu
B=${BUILD:-build}
SHARED=${PI2_SHARED:-../shared}
GOLD=$SHARED/models/tinystories-656k
C=tests/fuzz/corpus
MAX=65535
make --no-print-directory all "$B/fuzz/gen-seeds" >/dev/null
G=$B/fuzz/gen-seeds
T=$(mktemp -d "${TMPDIR:-/tmp}/pi2corpus.XXXXXX")
trap 'rm -rf "$T"' EXIT
for t in safetensors hfconfig tokenizer manifest container torchzip plan hwprof pem; do
    rm -rf "$C/$t"; mkdir -p "$C/$t"
done

# seed TARGET NAME FILE: copy FILE in when it is small enough.
seed() {
    sz=$(wc -c <"$3")
    if [ "$sz" -gt "$MAX" ]; then echo "skip $1/$2: $sz bytes"; return 0; fi
    cp "$3" "$C/$1/$2"; chmod 644 "$C/$1/$2"
}

# --- model files made by the project ---
"$B/pi2-convert" synth --preset tiny -o "$T/tiny" >/dev/null
"$B/pi2-convert" synth --preset tiny --hidden 32 --ff 64 --layers 1 --heads 2 --kv-heads 1 \
    --vocab 300 --dtype bf16 --tied -o "$T/mini" >/dev/null
"$B/pi2-convert" synth --preset moe --hidden 32 --ff 32 --layers 1 --heads 2 --kv-heads 2 --vocab 300 \
    --dtype f16 --predictors -o "$T/moe" >/dev/null
"$B/pi2-convert" "$T/tiny" -o "$T/tiny.pi2c" --calib-tokens 256 -q >/dev/null 2>&1
"$B/pi2-bundle" "$T/tiny.pi2c" -o "$T/tiny.pi2" --unsigned -q >/dev/null 2>&1
"$B/pi2-convert" "$T/moe" -o "$T/moe.pi2c" --calib-tokens 256 -q >/dev/null 2>&1
mkdir "$T/conv" "$T/bund" "$T/moec"
tar xf "$T/tiny.pi2c" -C "$T/conv" manifest.json
tar xf "$T/moe.pi2c" -C "$T/moec" manifest.json
tar xf "$T/tiny.pi2" -C "$T/bund" manifest.json

# --- config.json ---
seed hfconfig golden.json "$GOLD/config.json"
seed hfconfig tiny.json "$T/tiny/config.json"
seed hfconfig mini.json "$T/mini/config.json"
seed hfconfig moe.json "$T/moe/config.json"
seed hfconfig turbosparse.json "$SHARED/published-formats/turbosparse-mistral-instruct/config.json"
"$B/pi2-convert" synth --preset tiny --act fatrelu --vocab 300 -o "$T/fat" >/dev/null
seed hfconfig prosparse.json "$T/fat/config.json"
# rope_scaling in each accepted form (the llama3 one as Llama 3.1 publishes it)
for r in '{"type": "linear", "factor": 2.0}' '{"rope_type": "dynamic", "factor": 4.0}' \
    '{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}'; do
    n=$(printf '%s' "$r" | sed 's/.*ype": "\([a-z0-9]*\)".*/\1/')
    sed "s/\"rope_scaling\": null/\"rope_scaling\": $r/" "$T/fat/config.json" >"$T/rope-$n.json"
    seed hfconfig "rope-$n.json" "$T/rope-$n.json"
done

# --- safetensors ---
"$G" st-trim "$GOLD/model.safetensors" "$T/golden8.safetensors" 8
"$G" st-trim "$GOLD/model.safetensors" "$T/golden1.safetensors" 1
"$G" st-trim "$T/mini/model.safetensors" "$T/mini.safetensors" 64
"$G" st-trim "$T/moe/model.safetensors" "$T/moe.safetensors" 64
seed safetensors golden8 "$T/golden8.safetensors"
seed safetensors golden1 "$T/golden1.safetensors"
seed safetensors mini-bf16 "$T/mini.safetensors"
seed safetensors moe-f16 "$T/moe.safetensors"
seed safetensors tiny "$T/tiny/model.safetensors"

# --- tokenizer.json ---
seed tokenizer golden "$GOLD/tokenizer.json"
seed tokenizer tiny "$T/tiny/tokenizer.json"
"$G" tok "$T/tok300.json" 300 7
seed tokenizer synth300 "$T/tok300.json"
if command -v python3 >/dev/null 2>&1; then
    # The golden tokenizer cut to its first 600 tokens and the merges among
    # them: keeps its normalizer, decoder, added tokens and post_processor.
    python3 - "$GOLD/tokenizer.json" "$T/golden-cut.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1], encoding="utf-8"))
keep = {k: v for k, v in t["model"]["vocab"].items() if v < 600}
def ok(m):
    a, b = m.split(" ", 1) if isinstance(m, str) else m
    return a in keep and b in keep and a + b in keep
t["model"]["vocab"] = keep
t["model"]["merges"] = [m for m in t["model"]["merges"] if ok(m)]
json.dump(t, open(sys.argv[2], "w", encoding="utf-8"), ensure_ascii=False, separators=(",", ":"))
PY
    seed tokenizer golden-cut600 "$T/golden-cut.json"
fi

# --- manifest.json ---
seed manifest converted "$T/conv/manifest.json"
seed manifest bundled "$T/bund/manifest.json"
seed manifest moe-predictors "$T/moec/manifest.json"

# --- container ---
seed container tiny-bundle "$T/tiny.pi2"
printf 'hello\n' >"$T/hello"
: >"$T/empty"
"$G" ctr "$T/c1.pi2" a.txt="$T/hello" dir/b.bin="$T/empty" "manifest.sig=$T/hello"
"$G" ctr "$T/c2.pi2" tokenizer.json="$T/tok300.json" manifest.json="$T/bund/manifest.json"
"$G" ctr "$T/c3.pi2" manifest.json="$T/conv/manifest.json"
"$G" ctr "$T/c0.pi2"
seed container small "$T/c1.pi2"
seed container bundle-manifest "$T/c2.pi2"
seed container converted-manifest "$T/c3.pi2"
seed container empty "$T/c0.pi2"
# Hand-mutated variants of the small one: a bad checksum, a non-octal size,
# a size past the end, a cut file, a non-zero byte after the end marker.
mut() { # mut OUT OFFSET BYTES
    cp "$T/c1.pi2" "$C/container/$1"
    printf "$3" | dd of="$C/container/$1" bs=1 seek="$2" conv=notrunc status=none
}
mut bad-checksum 148 '9'
mut bad-octal 124 '9'
mut huge-size 124 '77777777777'
mut bad-typeflag 156 '5'
mut prefix-set 345 'x'
mut trailing-garbage 16383 'z'
head -c 6144 "$T/c1.pi2" >"$C/container/truncated"

# --- torchzip: whole zips, and bare pickles (fuzz_torchzip wraps those in a
# zip whose storages hold 24, 64, 0 and 256 bytes: the "four" tensors) ---
"$G" tz "$T/four.pt" four
"$G" tz "$T/all.pt" all
"$G" tz "$T/model_0.pt" pred
"$G" tz-pkl "$T/four.pt" "$T/four.pkl"
seed torchzip zip-four "$T/four.pt"
seed torchzip zip-all-dtypes "$T/all.pt"
seed torchzip zip-predictor "$T/model_0.pt"
seed torchzip pkl-four "$T/four.pkl"
head -c 700 "$T/four.pt" >"$C/torchzip/zip-truncated"
# refused on purpose: os.system("ls"), an INST opcode
printf '\200\002cos\nsystem\nq\000X\002\000\000\000lsq\001\205q\002Rq\003.' >"$C/torchzip/pkl-os-system"
printf '\200\002(ios\nsystem\n.' >"$C/torchzip/pkl-inst"
if command -v python3 >/dev/null 2>&1; then
    # Python's own pickler on the "four" state dict as module.state_dict()
    # returns it (OrderedDict, _metadata by BUILD), protocols 2 and 4, torch
    # stood in for by stub modules so that no torch is needed.
    python3 - "$C/torchzip" <<'PY'
import collections, pickle, sys, types
torch, utils = types.ModuleType("torch"), types.ModuleType("torch._utils")
torch._utils = utils
sys.modules["torch"], sys.modules["torch._utils"] = torch, utils
for name in ("FloatStorage", "HalfStorage", "BFloat16Storage", "ByteStorage"):
    setattr(torch, name, type(name, (), {"__module__": "torch"}))
def _rebuild_tensor_v2(*args): pass
_rebuild_tensor_v2.__module__ = "torch._utils"
utils._rebuild_tensor_v2 = _rebuild_tensor_v2
class Storage:
    def __init__(self, kind, key, numel): self.kind, self.key, self.numel = kind, key, numel
class Tensor:
    def __init__(self, storage, size, stride): self.args = (storage, 0, size, stride, False, collections.OrderedDict())
    def __reduce_ex__(self, proto): return (_rebuild_tensor_v2, self.args)
class Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, Storage):
            return ("storage", getattr(torch, obj.kind), obj.key, "cpu", obj.numel)
        return None
sd = collections.OrderedDict()
sd["a.f32"] = Tensor(Storage("FloatStorage", "0", 6), (2, 3), (3, 1))
sd["b.f16"] = Tensor(Storage("HalfStorage", "1", 32), (4, 8), (8, 1))
sd["c.bf16"] = Tensor(Storage("BFloat16Storage", "2", 0), (0, 5), (5, 1))
sd["d.u8"] = Tensor(Storage("ByteStorage", "3", 256), (16, 16), (16, 1))
sd._metadata = collections.OrderedDict([("", {"version": 1}), ("d", {"version": 2})])
for proto in (2, 4):
    with open("%s/pkl-python-state-dict-p%d" % (sys.argv[1], proto), "wb") as f:
        Pickler(f, protocol=proto).dump(sd)
PY
fi

# --- plans (pi2-run plan: with a hardware profile, predicted; without, the
# fixed split with its note), model calibrations, hardware profiles, keys ---
"$B/pi2-bundle" keygen --private "$T/k.pem" --public "$T/k.pub" >/dev/null
seed pem private "$T/k.pem"
seed pem public "$T/k.pub"
sed 's/PRIVATE KEY/PUBLIC KEY/' "$T/k.pem" >"$T/mixed.pem"
seed pem private-labelled-public "$T/mixed.pem"
head -c 60 "$T/k.pub" >"$C/pem/public-cut"
mkdir -p "$T/hwdev"
"$B/pi2-run" --profile-hw --device-path "$T/hwdev" --hw-profile "$T/hw.json" -t 2 --profile-seconds 0.01 \
    >/dev/null 2>&1
# the machine's names replaced: the seed says nothing of where it was made
sed -e 's/"cpu": *"[^"]*"/"cpu": "cpu"/' -e 's/"device": *"[^"]*"/"device": "\/models"/' "$T/hw.json" >"$T/hw-seed.json"
seed hwprof profile "$T/hw-seed.json"
for hw in "$T/hw.json" "$T/none.json"; do
    n=$(basename "$hw" .json)
    "$B/pi2-run" plan "$T/tiny.pi2" --trust-unsigned --hw-profile "$hw" -t 1 --mem-limit 40M -p hi 2>/dev/null \
        | sed "s|$T/||g" >"$T/plan-$n.json"
    seed plan "plan-$n" "$T/plan-$n.json"
done
z='[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0]'
printf '{"version":6,"extra_reads":0.5,"runs":3,"reads_sums":[1,2],"compute_sums":[[3,3],%s],"io_sums":[%s,[0,0]]}\n' \
    "${z#\[0,0\],}" "${z%,\[0,0\]}" >"$C/plan/calibration"

du -sh "$C"
for t in "$C"/*; do echo "$(basename "$t"): $(ls "$t" | wc -l) seeds"; done
