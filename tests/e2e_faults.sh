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
expect_fast "convert over a file" "give --force" "$B/pi2-convert" "$T/tiny" -o "$T/old.pi2c" -q
[ "$(cat "$T/old.pi2c")" = old ] && ok || bad "a refused convert changed the existing output"
expect_ok "convert --force" "$B/pi2-convert" "$T/tiny" -o "$T/old.pi2c" -q --calib-tokens 256 --force
tar tf "$T/old.pi2c" 2>/dev/null | grep -q manifest.json && ok || bad "convert --force did not replace the output"
echo old >"$T/old.pi2"
expect_fast "bundle over a file" "give --force" "$B/pi2-bundle" "$T/tiny.pi2c" -o "$T/old.pi2" --unsigned -q
[ "$(cat "$T/old.pi2")" = old ] && ok || bad "a refused bundle changed the existing output"
expect_ok "bundle --force" "$B/pi2-bundle" "$T/tiny.pi2c" -o "$T/old.pi2" --unsigned -q --force
"$B/pi2-bundle" verify "$T/old.pi2" --allow-unsigned >/dev/null 2>&1 && ok || bad "bundle --force did not replace the output"
echo old >"$T/old.svg"
expect_fast "inspect --svg over a file" "give --force" "$B/pi2-bundle" inspect "$T/b.pi2" --svg "$T/old.svg"
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
