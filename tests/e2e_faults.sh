# The fault suite of the end-to-end tests, sourced by tests/e2e.sh after its
# models exist ($T/tiny, $T/tiny.pi2c, $T/b.pi2, $T/k.pem, $T/k.pub, $T/hw.json):
# what a new user does to their files. Uses e2e.sh's ok/bad/skp/expect_*.

# ms: milliseconds since the epoch
ms() { echo $(($(date +%s%N) / 1000000)); }
# expect_fast NAME PATTERN CMD...: expect_error, and done in under a second
expect_fast() {
    t0=$(ms)
    expect_error "$@"
    el=$(($(ms) - t0))
    [ "$el" -lt 1000 ] && ok || bad "$1: refused after $el ms, not in under a second"
}
sums() { cksum "$T/tiny"/* "$T/tiny.pi2c" "$T/b.pi2" "$T/k.pem" "$T/k.pub" "$T/long.txt" 2>/dev/null; }

# --- the output rule: never an input, never an existing file without --force ---
yes "Once upon a time there was a little girl who liked to play in the park." | head -n 200 >"$T/long.txt"
sums >"$T/sums.before"
expect_fast "convert -o the input's weights" "inside the input directory" \
    "$B/pi2-convert" "$T/tiny" -o "$T/tiny/model.safetensors" -q
expect_fast "convert -o the input's config" "inside the input directory" \
    "$B/pi2-convert" "$T/tiny" -o "$T/tiny/config.json" -q
expect_fast "convert -o a new file in the input" "inside the input directory" \
    "$B/pi2-convert" "$T/tiny" -o "$T/tiny/new.pi2c" -q
expect_fast "convert -o the input dir" "is the input" "$B/pi2-convert" "$T/tiny" -o "$T/tiny" -q
expect_fast "convert -o the calibration text" "is the input" \
    "$B/pi2-convert" "$T/tiny" -o "$T/long.txt" --calib "$T/long.txt" -q
ln -s "$T/tiny" "$T/tiny-link"
expect_fast "convert -o the input through a symlink" "inside the input directory" \
    "$B/pi2-convert" "$T/tiny" -o "$T/tiny-link/model.safetensors" -q
expect_fast "export -o its input" "is the input" "$B/pi2-convert" export "$T/tiny.pi2c" -o "$T/tiny.pi2c"
expect_fast "bundle -o its input" "is the input" "$B/pi2-bundle" "$T/tiny.pi2c" -o "$T/tiny.pi2c" --unsigned -q
expect_fast "bundle -o its key" "is the input" "$B/pi2-bundle" "$T/tiny.pi2c" -o "$T/k.pem" --key "$T/k.pem" -q
expect_fast "inspect --svg its input" "is the input" "$B/pi2-bundle" inspect "$T/b.pi2" --svg "$T/b.pi2"
expect_fast "profile-hw --hw-profile the model" "not a hardware profile" \
    "$B/pi2-run" --profile-hw "$T/b.pi2" --hw-profile "$T/b.pi2" -t 1 --profile-seconds 0.02
expect_fast "profile-hw --hw-profile the model, --force" "is the input" \
    "$B/pi2-run" --profile-hw "$T/b.pi2" --hw-profile "$T/b.pi2" -t 1 --profile-seconds 0.02 --force
expect_fast "keygen one file for both keys" "same file" \
    "$B/pi2-bundle" keygen --private "$T/kk.pem" --public "$T/kk.pem"
expect_fast "keygen over a public key" "never replaced" \
    "$B/pi2-bundle" keygen --private "$T/kk.pem" --public "$T/k.pub"
sums >"$T/sums.after"
cmp -s "$T/sums.before" "$T/sums.after" && ok || bad "a refused output changed an input"

# -o an existing directory: refused at once
mkdir -p "$T/adir"
expect_fast "convert -o a directory" "is a directory" "$B/pi2-convert" "$T/tiny" -o "$T/adir" -q
expect_fast "bundle -o a directory" "is a directory" "$B/pi2-bundle" "$T/tiny.pi2c" -o "$T/adir" --unsigned -q
expect_fast "inspect --svg a directory" "is a directory" "$B/pi2-bundle" inspect "$T/b.pi2" --svg "$T/adir"
expect_fast "synth -o an existing file" "already exists" "$B/pi2-convert" synth --preset tiny -o "$T/short.txt"
expect_fast "convert -o a missing directory" "$T/nodir" "$B/pi2-convert" "$T/tiny" -o "$T/nodir/x.pi2c" -q

# an existing output: refused without --force, replaced with it
echo old >"$T/old.pi2c"
expect_fast "convert over a file" "already exists: choose another name (--force replaces it)" "$B/pi2-convert" "$T/tiny" -o "$T/old.pi2c" -q
[ "$(cat "$T/old.pi2c")" = old ] && ok || bad "a refused convert changed the existing output"
expect_ok "convert --force" "$B/pi2-convert" "$T/tiny" -o "$T/old.pi2c" -q --calib-tokens 256 --force
tar tf "$T/old.pi2c" 2>/dev/null | grep -q manifest.json && ok || bad "convert --force did not replace the output"
echo old >"$T/old.pi2"
expect_fast "bundle over a file" "already exists: choose another name (--force replaces it)" "$B/pi2-bundle" "$T/tiny.pi2c" -o "$T/old.pi2" --unsigned -q
[ "$(cat "$T/old.pi2")" = old ] && ok || bad "a refused bundle changed the existing output"
expect_ok "bundle --force" "$B/pi2-bundle" "$T/tiny.pi2c" -o "$T/old.pi2" --unsigned -q --force
"$B/pi2-bundle" verify "$T/old.pi2" --allow-unsigned >/dev/null 2>&1 && ok || bad "bundle --force did not replace the output"
echo old >"$T/old.svg"
expect_fast "inspect --svg over a file" "already exists: choose another name (--force replaces it)" "$B/pi2-bundle" inspect "$T/b.pi2" --svg "$T/old.svg"
expect_ok "inspect --svg --force" "$B/pi2-bundle" inspect "$T/b.pi2" --svg "$T/old.svg" --force
head -c 4 "$T/old.svg" | grep -q "<svg" && ok || bad "inspect --svg --force did not replace the chart"

# not enough free space: refused before the work (a small tmpfs; needs root)
mkdir -p "$T/small"
if mount -t tmpfs -o size=64k tmpfs "$T/small" 2>/dev/null; then
    expect_fast "convert to a full file system" "free some space" "$B/pi2-convert" "$T/tiny" -o "$T/small/x.pi2c" -q
    expect_fast "bundle to a full file system" "free some space" \
        "$B/pi2-bundle" "$T/tiny.pi2c" -o "$T/small/x.pi2" --unsigned -q
    [ -z "$(ls -A "$T/small")" ] && ok || bad "a refused output left files: $(ls -A "$T/small")"
    umount "$T/small"
else
    skp "free-space check: cannot mount a tmpfs (needs root)"
fi

# --- interrupted runs: SIGINT/SIGTERM remove the temporary output at once;
# after a kill -9 the next run writing the same output removes it (and says
# so); the previous output stays intact either way. Background jobs of a
# script start with SIGINT ignored: env --default-signal gives it back. ---
# wait_tmp OUT PID: until a temporary of OUT appears (5 s at most) while PID runs
wait_tmp() {
    i=0
    while [ $i -lt 500 ] && kill -0 "$2" 2>/dev/null; do
        ls -d "$1".tmp.* >/dev/null 2>&1 && return 0
        sleep 0.01
        i=$((i + 1))
    done
    return 1
}
# interrupt NAME OUT SIG DELAY CMD...: run CMD (writing OUT, which exists),
# kill it with SIG DELAY seconds after its temporary appears; the previous
# OUT must be intact (or replaced by a complete one: the run may finish first)
interrupt() {
    name=$1 out=$2 sig=$3 delay=$4; shift 4
    cp "$out" "$T/prev"
    env --default-signal=INT,TERM "$@" >/dev/null 2>"$T/err" &
    pid=$!
    if wait_tmp "$out" $pid; then
        sleep "$delay"
        kill -"$sig" $pid 2>/dev/null
    fi
    wait $pid 2>/dev/null; rc=$?
    if [ $rc -eq 0 ]; then
        skp "$name: finished before the signal"
    elif cmp -s "$out" "$T/prev"; then
        ok
    else
        bad "$name: exit $rc changed the previous output"
    fi
    case $sig in
        INT | TERM)
            if ls -d "$out".tmp.* >/dev/null 2>&1; then bad "$name: left $(ls -d "$out".tmp.*)"; else ok; fi ;;
    esac
}
if env --default-signal=INT true 2>/dev/null; then
    cp "$T/tiny.pi2c" "$T/kill.pi2c"
    conv="$B/pi2-convert $T/tiny -o $T/kill.pi2c -q --force --calib-tokens 8192"
    # "at once" last: a run that finishes first clears the temporaries an
    # earlier kill -9 left, so the checks below follow the last run's rc
    # shellcheck disable=SC2086
    for sig in INT TERM 9; do
        interrupt "convert, SIG$sig after 0.5 s" "$T/kill.pi2c" $sig 0.5 $conv
        interrupt "convert, SIG$sig at once" "$T/kill.pi2c" $sig 0 $conv
    done
    if [ "$rc" -ne 0 ]; then
        ls -d "$T/kill.pi2c".tmp.* >/dev/null 2>&1 && ok || bad "kill -9 of convert left no temporary to find"
        expect_ok "convert after a kill -9" "$B/pi2-convert" "$T/tiny" -o "$T/kill.pi2c" -q --force --calib-tokens 256
        grep -q "removed .*kill.pi2c.tmp.*interrupted run" "$T/err" && ok || { bad "convert did not name the stale temporary"; cat "$T/err"; }
        ls -d "$T/kill.pi2c".tmp.* >/dev/null 2>&1 && bad "convert left stale temporaries: $(ls -d "$T/kill.pi2c".tmp.*)" || ok
    else
        skp "convert after a kill -9: the last kill came after the run had finished"
    fi
    # a bundle of a few MB (its temporary appears early; it may finish before the kill)
    "$B/pi2-convert" synth --preset small --hidden 256 --ff 8192 --layers 2 --dtype bf16 --predictors -o "$T/mid" \
        >/dev/null 2>&1 && "$B/pi2-convert" "$T/mid" -o "$T/mid.pi2c" --calib-tokens 64 -q >/dev/null 2>&1 \
        && "$B/pi2-bundle" "$T/mid.pi2c" -o "$T/kill.pi2" --unsigned -q >/dev/null 2>&1 || bad "making the model to interrupt"
    bund="$B/pi2-bundle $T/mid.pi2c -o $T/kill.pi2 --unsigned -q --force --threads 1"
    # shellcheck disable=SC2086
    for sig in INT 9; do
        interrupt "bundle, SIG$sig at once" "$T/kill.pi2" $sig 0 $bund
        interrupt "bundle, SIG$sig after 0.05 s" "$T/kill.pi2" $sig 0.05 $bund
    done
    expect_ok "bundle after a kill -9" "$B/pi2-bundle" "$T/mid.pi2c" -o "$T/kill.pi2" --unsigned -q --force
    ls -d "$T/kill.pi2".tmp.* >/dev/null 2>&1 && bad "bundle left stale temporaries: $(ls -d "$T/kill.pi2".tmp.*)" || ok
    # synth writes a directory: its temporary directory goes the same way
    env --default-signal=INT,TERM "$B/pi2-convert" synth --preset small -o "$T/ksyn" >/dev/null 2>&1 &
    pid=$!
    wait_tmp "$T/ksyn" $pid && kill -TERM $pid 2>/dev/null
    wait $pid 2>/dev/null
    ls -d "$T/ksyn".tmp.* >/dev/null 2>&1 && bad "SIGTERM of synth left $(ls -d "$T/ksyn".tmp.*)" || ok
    "$B/pi2-convert" synth --preset small -o "$T/ksyn" >/dev/null 2>&1 &
    pid=$!
    wait_tmp "$T/ksyn" $pid && kill -9 $pid 2>/dev/null
    wait $pid 2>/dev/null
    expect_ok "synth after a kill -9" "$B/pi2-convert" synth --preset tiny -o "$T/ksyn2"
    "$B/pi2-convert" synth --preset tiny -o "$T/ksyn" >/dev/null 2>"$T/err" && ok || bad "synth after a kill -9 of synth"
    ls -d "$T/ksyn".tmp.* >/dev/null 2>&1 && bad "synth left stale temporaries: $(ls -d "$T/ksyn".tmp.*)" || ok
else
    skp "interrupted runs: env --default-signal (coreutils 8.31) missing"
fi

# --- the model changing under pi2-run: cut short (truncated) or overwritten in place while it
# runs, in memory and offloaded. The run is stopped (SIGSTOP) once it prints, the file changed,
# the run continued: a cut is one line naming the file, never a SIGBUS; an overwrite of a
# resident member is named by --stats ("changed since verification"), exit 1 ---
# under_run NAME HOW CMD...: run CMD (on $T/chg.pi2, a copy of $T/kill.pi2), change the file
# by HOW (cut | overwrite) once it printed; its exit status into $rc, stderr in $T/err
under_run() {
    name=$1 how=$2; shift 2
    cp "$T/kill.pi2" "$T/chg.pi2"
    : >"$T/chg.out"
    "$@" >"$T/chg.out" 2>"$T/err" &
    pid=$!
    i=0
    while [ $i -lt 1000 ] && [ ! -s "$T/chg.out" ] && kill -0 $pid 2>/dev/null; do sleep 0.01; i=$((i + 1)); done
    kill -STOP $pid 2>/dev/null
    if ! kill -0 $pid 2>/dev/null || [ ! -s "$T/chg.out" ]; then
        kill -CONT $pid 2>/dev/null; wait $pid; rc=255; return
    fi
    case $how in
        cut) truncate -s 64K "$T/chg.pi2" ;;
        overwrite) dd if=/dev/zero of="$T/chg.pi2" bs=1 seek="$(($(member_off "$T/chg.pi2" "$att") + 64))" count=256 \
                       conv=notrunc 2>/dev/null ;;
    esac
    kill -CONT $pid
    wait $pid; rc=$?
}
att=w/model.layers.0.self_attn.q_proj.weight.q
[ -f "$T/kill.pi2" ] || skp "changes under a run: no model made to interrupt"
mmin=$("$B/pi2-run" plan "$T/kill.pi2" --trust-unsigned -p hi -n 1000 2>/dev/null | jget minimum_bytes)
for mode in memory offload; do
    [ -f "$T/kill.pi2" ] || break
    lim=""; [ $mode = offload ] && lim="--mem-limit $((${mmin:-0} + 4194304))"
    # shellcheck disable=SC2086
    under_run "$mode, cut" cut "$B/pi2-run" "$T/chg.pi2" --trust-unsigned -p hi -n 1000 --dense -t 1 $lim
    if [ $rc -eq 255 ]; then skp "$mode run cut short: it finished before the change"
    else
        want="$T/chg.pi2"; [ $mode = memory ] && want="$T/chg.pi2: the file changed while in use (it was cut short)"
        [ $rc -eq 1 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -qF "$want" "$T/err" && ok \
            || { bad "$mode run on a file cut short: exit $rc"; cat "$T/err"; }
    fi
    # shellcheck disable=SC2086
    under_run "$mode, overwrite" overwrite "$B/pi2-run" "$T/chg.pi2" --trust-unsigned -p hi -n 1000 --dense -t 1 --stats $lim
    if [ $rc -eq 255 ]; then skp "$mode run overwritten: it finished before the change"
    else
        [ $rc -eq 1 ] && grep -q "unsigned (trusted on request), changed since verification" "$T/err" \
            && tail -n 1 "$T/err" | grep -q "changed since verification: .*chg.pi2.*$att" && ok \
            || { bad "$mode run on a file overwritten in place: exit $rc"; cat "$T/err"; }
    fi
done

# --- every write checked: output that cannot be written is an error ---
if [ -w /dev/full ]; then
    "$B/pi2-run" "$T/b.pi2" --pubkey "$T/k.pub" -p "hello world" -n 12 >/dev/full 2>"$T/err"; rc=$?
    [ $rc -eq 1 ] && grep -q "standard output" "$T/err" && ok || { bad "pi2-run >/dev/full: exit $rc"; cat "$T/err"; }
    "$B/pi2-run" --reference "$T/tiny" -p "hello" -n 8 >/dev/full 2>"$T/err"; rc=$?
    [ $rc -eq 1 ] && grep -q "standard output" "$T/err" && ok || { bad "pi2-run --reference >/dev/full: exit $rc"; cat "$T/err"; }
    "$B/pi2-convert" "$T/tiny" -o "$T/full.pi2c" --calib-tokens 256 -q >/dev/full 2>"$T/err"; rc=$?
    [ $rc -eq 1 ] && grep -q "standard output" "$T/err" && ok || { bad "pi2-convert >/dev/full: exit $rc"; cat "$T/err"; }
    "$B/pi2-bundle" "$T/tiny.pi2c" -o "$T/full.pi2" --unsigned >/dev/full 2>"$T/err"; rc=$?
    [ $rc -eq 1 ] && grep -q "standard output" "$T/err" && ok || { bad "pi2-bundle >/dev/full: exit $rc"; cat "$T/err"; }
    "$B/pi2-bundle" inspect "$T/b.pi2" >/dev/full 2>"$T/err"; rc=$?
    [ $rc -eq 1 ] && ok || bad "pi2-bundle inspect >/dev/full: exit $rc"
    "$B/pi2-run" --help >/dev/full 2>/dev/null && bad "pi2-run --help >/dev/full: exit 0" || ok
else
    skp "writes to /dev/full: no /dev/full"
fi

# --- messages that say what the input is and what to do ---
for f in "$T/b.pi2" "$T/tiny.pi2c"; do
    expect_fast "convert a container" "$f: a pi2 container (a converted or bundled model), not a Hugging Face model directory" \
        "$B/pi2-convert" "$f" -o "$T/fromctr.pi2c" -q
    expect_fast "--reference a container" "$f: a pi2 container .*not a Hugging Face model directory" \
        "$B/pi2-run" --reference "$f" -p hi
done
expect_fast "convert a safetensors file" "a safetensors file, not a Hugging Face model directory" \
    "$B/pi2-convert" "$T/tiny/model.safetensors" -o "$T/fromst.pi2c" -q
# a prompt longer than the context: the sums are right and the advice fits
yes "hello" | head -n 100 | tr '\n' ' ' >"$T/p400.txt"
yes "hello" | head -n 1200 | tr '\n' ' ' >"$T/p1200.txt"
expect_error "prompt longer than the model" "^pi2-run: the prompt is [0-9]* tokens, more than the model's context of 512 positions: shorten it$" \
    "$B/pi2-run" "$T/b.pi2" --pubkey "$T/k.pub" -f "$T/p1200.txt" -n 4
expect_error "reference prompt longer than the model" "the prompt is [0-9]* tokens, more than the model's context of 512 positions" \
    "$B/pi2-run" --reference "$T/tiny" -f "$T/p1200.txt" -n 4
for how in engine reference; do
    if [ $how = engine ]; then "$B/pi2-run" "$T/b.pi2" --pubkey "$T/k.pub" -f "$T/p400.txt" -n 400 >/dev/null 2>"$T/err"
    else "$B/pi2-run" --reference "$T/tiny" -f "$T/p400.txt" -n 400 >/dev/null 2>"$T/err"; fi
    # prompt + n = needed, held - prompt = the -n advised
    sed -n 's/.*the prompt (\([0-9]*\) tokens) plus -n \([0-9]*\) needs \([0-9]*\) positions, the model'"'"'s context holds \([0-9]*\): use -n \([0-9]*\) or less$/\1 \2 \3 \4 \5/p' "$T/err" \
        | awk 'NF == 5 && $1 + $2 == $3 && $4 - $1 == $5 { good = 1 } END { exit !good }' && ok \
        || { bad "$how: a prompt plus -n past the model's positions"; cat "$T/err"; }
done
# with -n at that advice, the run goes
n=$(sed -n 's/.*use -n \([0-9]*\) or less$/\1/p' "$T/err")
"$B/pi2-run" --reference "$T/tiny" -f "$T/p400.txt" -n "${n:-1}" >/dev/null 2>"$T/err" && ok || { bad "-n as advised"; cat "$T/err"; }
"$B/pi2-run" "$T/b.pi2" --pubkey "$T/k.pub" -f "$T/p400.txt" -n 10 --ctx 64 >/dev/null 2>"$T/err"
grep -q "plus -n 10 needs [0-9]* positions, the context holds 64: raise --ctx (the model holds 512)$" "$T/err" && ok \
    || { bad "a prompt past --ctx"; cat "$T/err"; }
# an I/O probe of a file too small for its reads
for probe in "--io-probe" "probe io"; do
    # shellcheck disable=SC2086
    expect_fast "$probe of a small file" "k.pub: too small to probe (113 bytes).*at least 1 MB (1048576 bytes)" \
        "$B/pi2-run" $probe "$T/k.pub"
done
# --reference refuses non-finite weights as the converter does: one line naming the tensor
cp -r "$T/tiny" "$T/nan"
hl=$(head -c 8 "$T/nan/model.safetensors" | od -An -tu4 -N4 | tr -d ' ')
printf '\377\377\377\377' | dd of="$T/nan/model.safetensors" bs=1 seek=$((8 + hl + 20)) conv=notrunc status=none
expect_fast "reference NaN weights" "model.safetensors: tensor 'model.embed_tokens.weight' holds a non-finite value (NaN or infinity) at element 5" \
    "$B/pi2-run" --reference "$T/nan" -p hi -n 2
expect_error "convert NaN weights" "model.embed_tokens.weight.*non-finite" "$B/pi2-convert" "$T/nan" -o "$T/nan.pi2c" -q --calib-tokens 64
# -q: nothing but errors
"$B/pi2-run" plan "$T/b.pi2" --pubkey "$T/k.pub" -p hi -q >"$T/out" 2>"$T/err" && [ -s "$T/out" ] && [ ! -s "$T/err" ] && ok \
    || { bad "pi2-run plan -q printed on stderr"; cat "$T/err"; }
"$B/pi2-run" plan "$T/b.pi2" --pubkey "$T/k.pub" -p hi --mem-limit 40M -q >"$T/out" 2>"$T/err" && [ ! -s "$T/err" ] && ok \
    || { bad "pi2-run plan --mem-limit -q printed on stderr"; cat "$T/err"; }
"$B/pi2-convert" synth --preset tiny -o "$T/qsyn" -q >"$T/out" 2>&1 && [ ! -s "$T/out" ] && ok || { bad "synth -q printed"; cat "$T/out"; }
"$B/pi2-convert" export "$T/tiny.pi2c" -o "$T/qexp" -q >"$T/out" 2>&1 && [ ! -s "$T/out" ] && ok || { bad "export -q printed"; cat "$T/out"; }
"$B/pi2-convert" --help | grep -q "calib-tokens N .*default: 32768 below 100M parameters" && ok \
    || bad "--calib-tokens does not document its default"

# --- small things: --version, exit codes in --help, one-line flag errors, -q, prompts from stdin and files ---
for tool in pi2-convert pi2-bundle pi2-run; do
    "$B/$tool" --version >"$T/out" 2>&1 && grep -q "^$tool (pi2) " "$T/out" && grep -q "kernels compiled in: scalar" "$T/out" \
        && ok || { bad "$tool --version"; cat "$T/out"; }
    "$B/$tool" --help | grep -q "^exit status: 0 ok" && ok || bad "$tool --help does not state the exit codes"
done
expect_error "run unknown option" "^pi2-run: unknown option '--frob'; see --help$" "$B/pi2-run" --frob
expect_error "run missing value" "^pi2-run: option '-n' needs a value" "$B/pi2-run" m.pi2 -n
expect_error "convert unknown option" "^pi2-convert: unknown option '--frob'" "$B/pi2-convert" "$T/tiny" --frob
expect_error "synth unknown option" "^pi2-convert synth: unknown option '--frob'" "$B/pi2-convert" synth --preset tiny --frob
expect_error "bundle unknown option" "^pi2-bundle: unknown option '--frob'" "$B/pi2-bundle" x.pi2c --frob
"$B/pi2-bundle" "$T/tiny.pi2c" -o "$T/quiet.pi2" --unsigned -q >"$T/out" 2>&1 && [ ! -s "$T/out" ] && ok \
    || { bad "pi2-bundle -q printed"; cat "$T/out"; }
a=$("$B/pi2-run" "$T/b.pi2" --pubkey "$T/k.pub" -p "hello world" -n 8 2>/dev/null)
b=$(echo "hello world" | "$B/pi2-run" "$T/b.pi2" --pubkey "$T/k.pub" -p - -n 8 2>/dev/null)
echo "hello world" >"$T/prompt.txt"
c=$("$B/pi2-run" "$T/b.pi2" --pubkey "$T/k.pub" -f "$T/prompt.txt" -n 8 2>/dev/null)
[ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" = "$c" ] && ok || bad "-p -, -f FILE and -p TEXT differ: '$a' '$b' '$c'"
expect_error "run -p and -f" "not both" "$B/pi2-run" "$T/b.pi2" -p hi -f "$T/prompt.txt"
expect_error "run -f missing" "$T/noprompt.txt" "$B/pi2-run" "$T/b.pi2" -f "$T/noprompt.txt"
git -C "$(dirname "$0")/.." check-ignore -q key.pem 2>/dev/null && ok || skp "*.pem ignored: not a git checkout"

# --- plans written by plan (--plan-only) are accepted by --plan, with and without a hardware
# profile: the same text as the run that planned for itself; without a profile the plan is the
# fixed split, unpredicted, and says so ---
for hw in "$T/hw.json" "$T/no-hw-profile.json"; do
    for how in "plan" "--plan-only"; do
        args="$T/b.pi2 --pubkey $T/k.pub --hw-profile $hw -t 1 --mem-limit 40M"
        rt="$B/pi2-run $args"
        # shellcheck disable=SC2086
        if [ "$how" = plan ]; then "$B/pi2-run" plan $args -p hi >"$T/rt-plan.json" 2>"$T/err"
        else $rt --plan-only -p hi >"$T/rt-plan.json" 2>"$T/err"; fi
        rc=$?
        # shellcheck disable=SC2086
        a=$($rt -p hi -n 6 2>>"$T/err") && b=$($rt --plan "$T/rt-plan.json" -p hi -n 6 --stats 2>"$T/stats") \
            && [ $rc -eq 0 ] && [ -n "$a" ] && [ "$a" = "$b" ] && grep -q "^plan: given" "$T/stats" && ok \
            || { bad "plan round trip ($how) with $hw: '$a' vs '$b'"; cat "$T/err" "$T/stats" "$T/rt-plan.json"; }
        if [ -e "$hw" ]; then
            grep -q '"predicted":{"decode_tok_s":[0-9]' "$T/rt-plan.json" && ! grep -q '"note"' "$T/rt-plan.json" && ok \
                || { bad "a plan made with a hardware profile is not predicted"; cat "$T/rt-plan.json"; }
        else
            grep -q '"hot_groups":\[[0-9,]*\],"gate_groups":\[[0-9,]*\],"source":"fixed split","note":"no hardware profile' \
                "$T/rt-plan.json" && grep -q "^plan: given .* not predicted (no hardware profile" "$T/stats" && ok \
                || { bad "a plan made without a hardware profile: the fixed split, not predicted"; cat "$T/rt-plan.json" "$T/stats"; }
        fi
    done
done
