# serve_port ERRFILE PID TRIES: the port `pi2-run serve --port 0` printed to
# ERRFILE, waiting up to TRIES tenths of a second while PID lives; empty
# when it printed none. Sourced by tests/e2e_serve.sh and tests/arm64.sh.
serve_port() {
    for _ in $(seq 1 "$3"); do
        p=$(sed -n 's|.* on http://127.0.0.1:\([0-9]*\)/v1 .*|\1|p' "$1" 2>/dev/null)
        [ -n "$p" ] && { echo "$p"; return; }
        kill -0 "$2" 2>/dev/null || return
        sleep 0.1
    done
}
