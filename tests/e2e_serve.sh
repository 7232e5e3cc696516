# The conversation and the server end to end, sourced by tests/e2e.sh after
# its models exist ($T/b.pi2 signed with $T/k.pem, its key $T/k.pub): pi2-run
# chat scripted from stdin, pi2-run serve through curl (and the official
# openai npm client when it can be installed). Uses e2e.sh's ok/bad/skp.

SM="$T/b.pi2"
. "$(dirname "$0")/serve_port.sh"
# --- chat: two turns, /reset, the first again ---
printf 'hello there\n' | "$B/pi2-run" chat "$SM" --pubkey "$T/k.pub" --system "be brief" -n 8 >"$T/chat1.out" 2>"$T/err" \
    && [ -s "$T/chat1.out" ] && ok || { bad "chat: one turn"; cat "$T/err"; }
printf 'hello there\nhow are you\n/reset\n/help\nhello there\n/quit\nnot read\n' \
    | "$B/pi2-run" chat "$SM" --pubkey "$T/k.pub" --system "be brief" -n 8 --stats >"$T/chat.out" 2>"$T/chat.err"
rc=$?
n1=$(wc -c <"$T/chat1.out")
turns=$(grep -c '^\[prompt' "$T/chat.err")
[ "$rc" -eq 0 ] && [ "$turns" -eq 3 ] && grep -q "/reset" "$T/chat.err" && ok \
    || { bad "chat: two turns, /reset, one more: exit $rc, $turns turns"; cat "$T/chat.err"; }
# after /reset the conversation starts over: the same reply (greedy), the
# system prompt's tokens from the cache; the second turn prefills its new text only
head -c "$n1" "$T/chat.out" | cmp -s - "$T/chat1.out" && tail -c "$n1" "$T/chat.out" | cmp -s - "$T/chat1.out" && ok \
    || { bad "chat: the turn after /reset differs from the first"; cat "$T/chat1.out" "$T/chat.out"; }
turn() { grep '^\[prompt' "$T/chat.err" | sed -n "$1"'s/^\[prompt \([0-9]*\) tokens, \([0-9]*\) prefilled.*/\1 \2/p'; }
p1=$(turn 1) p2=$(turn 2) p3=$(turn 3)
# shellcheck disable=SC2086
set -- ${p1:-0 0} ${p2:-0 0} ${p3:-0 0}
[ "$1" -gt 0 ] && [ "$1" -eq "$2" ] && [ "$4" -le $(($3 - $1)) ] && [ "$5" -eq "$1" ] && [ "$6" -lt "$1" ] && ok \
    || { bad "chat: prefill reuse (first '$p1', second '$p2', after /reset '$p3')"; cat "$T/chat.err"; }
printf 'hello there\n' | "$B/pi2-run" chat "$SM" --pubkey "$T/k.pub" --system "be brief" -n 8 --mem-limit 40M \
    >"$T/chatm.out" 2>"$T/err" && [ -s "$T/chatm.out" ] && ok || { bad "chat under --mem-limit"; cat "$T/err"; }
long=$(printf 'all work and no play %.0s' $(seq 1 20))
printf '%s\nhi\n' "$long" | "$B/pi2-run" chat "$SM" --pubkey "$T/k.pub" --ctx 64 -n 4 >"$T/out" 2>"$T/err"
[ $? -eq 0 ] && grep -q "context of 64 positions" "$T/err" && [ "$(wc -l <"$T/out")" -ge 1 ] && ok \
    || { bad "chat: a message over the context is refused and the chat goes on"; cat "$T/err"; }
yes "tell me more" | head -n 12 | "$B/pi2-run" chat "$SM" --pubkey "$T/k.pub" --ctx 96 -n 4 --chat-drop-oldest \
    >"$T/out" 2>"$T/err"
[ $? -eq 0 ] && grep -q "dropped to fit the context" "$T/err" && ! grep -q "pi2-run:" "$T/err" && ok \
    || { bad "chat --chat-drop-oldest"; cat "$T/err"; }
# the flag spellings select the same runs
c=$(printf 'hello there\n' | "$B/pi2-run" "$SM" --chat --pubkey "$T/k.pub" --system "be brief" -n 8 2>"$T/err")
[ -n "$c" ] && [ "$c" = "$(cat "$T/chat1.out")" ] && ok || { bad "--chat differs from chat: '$c'"; cat "$T/err"; }
expect_error "--chat with --serve" "separate runs" "$B/pi2-run" "$SM" --chat --serve --pubkey "$T/k.pub"
expect_error "chat with --reference" "bundled model" "$B/pi2-run" --reference "$T/tiny" --chat
# --chat-template: a built-in by name and the model's tokenizer_config.json; the
# prompt shows in --stats' token count, and a name that is neither is one line
printf 'hello there\n' | "$B/pi2-run" chat "$SM" --pubkey "$T/k.pub" --chat-template llama2 -n 4 --stats \
    >"$T/out" 2>"$T/err" && grep -q '^\[prompt' "$T/err" && ok || { bad "chat --chat-template llama2"; cat "$T/err"; }
printf '{"chat_template": "{%% for m in messages %%}{{ m.role }}: {{ m.content }}\\n{%% endfor %%}assistant:"}' \
    >"$T/tokenizer_config.json"
printf 'hello there\n' | "$B/pi2-run" chat "$SM" --pubkey "$T/k.pub" --chat-template "$T/tokenizer_config.json" -n 4 \
    >"$T/out" 2>"$T/err" && ok || { bad "chat --chat-template tokenizer_config.json"; cat "$T/err"; }
expect_error "chat --chat-template missing" "nosuch" "$B/pi2-run" chat "$SM" --pubkey "$T/k.pub" --chat-template "$T/nosuch"

# --- serve ---
if ! command -v curl >/dev/null 2>&1 || ! command -v jq >/dev/null 2>&1; then
    skp "serve: curl and jq are needed to test the server"
else
    # start_server ARGS...: pi2-run serve on a free port (SPID, URL)
    start_server() {
        rm -f "$T/serve.err" # not the last server's port
        "$B/pi2-run" serve "$SM" --pubkey "$T/k.pub" --port 0 "$@" 2>"$T/serve.err" &
        SPID=$!
        port=$(serve_port "$T/serve.err" "$SPID" 600)
        URL="http://127.0.0.1:${port:-1}"
    }
    # stop_server NAME: SIGTERM, and a clean exit
    stop_server() {
        kill -TERM "$SPID" 2>/dev/null
        wait "$SPID"
        rc=$?
        [ "$rc" -eq 0 ] && grep -q "stopping" "$T/serve.err" && ok || { bad "$1: exit $rc after SIGTERM"; cat "$T/serve.err"; }
    }
    # req METHOD PATH [BODY] [curl args]: the status code; the body in $T/resp
    req() {
        m=$1 p=$2; shift 2
        if [ "$m" = POST ]; then
            b=$1; shift
            curl -s -m 60 -o "$T/resp" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary "$b" "$@" "$URL$p"
        else
            curl -s -m 60 -o "$T/resp" -w '%{http_code}' "$@" "$URL$p"
        fi
    }
    # expect_status NAME CODE METHOD PATH [BODY] [curl args]: the code, and an OpenAI error body for a 4xx
    expect_status() {
        name=$1 want=$2; shift 2
        got=$(req "$@")
        if [ "$got" != "$want" ]; then bad "serve: $name: HTTP $got, not $want"; cat "$T/resp"; echo; return; fi
        case "$want" in 4*|5*) jq -e '.error.message | type == "string"' "$T/resp" >/dev/null 2>&1 && ok \
            || { bad "serve: $name: no error JSON"; cat "$T/resp"; echo; } ;; *) ok ;; esac
    }
    start_server --api-key sekrit
    A="Authorization: Bearer sekrit"
    M=$(basename "$SM" .pi2)
    chat='{"model":"'"$M"'","messages":[{"role":"user","content":"hello there"}],"max_tokens":8,"temperature":0}'
    expect_status "chat completion" 200 POST /v1/chat/completions "$chat" -H "$A"
    jq -e '.object == "chat.completion" and (.choices[0].message.content | type == "string")
        and .choices[0].message.role == "assistant" and (.choices[0].finish_reason | IN("stop", "length"))
        and .usage.completion_tokens > 0 and .usage.prompt_tokens > 0' "$T/resp" >/dev/null && ok \
        || { bad "serve: chat completion body"; cat "$T/resp"; echo; }
    jq -j '.choices[0].message.content' "$T/resp" >"$T/chat.srv"
    # greedy through the server = pi2-run on the same formatted prompt
    P=$(printf '<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n')
    "$B/pi2-run" "$SM" --pubkey "$T/k.pub" -p "$P
" -n 8 >"$T/chat.run" 2>"$T/err"
    { printf '%s\n' "$P"; cat "$T/chat.srv"; echo; } | cmp -s - "$T/chat.run" && ok \
        || { bad "serve: greedy chat reply differs from pi2-run's"; cat "$T/chat.srv"; echo; cat "$T/chat.run"; }
    expect_status "chat completion, streamed" 200 POST /v1/chat/completions \
        '{"messages":[{"role":"user","content":"hello there"}],"max_tokens":8,"temperature":0,"stream":true}' -H "$A"
    tail -n 2 "$T/resp" | head -n 1 | grep -qx 'data: \[DONE\]' \
        && sed -n 's/^data: \({.*\)/\1/p' "$T/resp" | jq -j '.choices[0].delta.content // empty' >"$T/chat.sse" \
        && cmp -s "$T/chat.sse" "$T/chat.srv" \
        && sed -n 's/^data: \({.*\)/\1/p' "$T/resp" | jq -s -e '(.[0].choices[0].delta.role == "assistant")
            and (.[-1].choices[0].finish_reason | IN("stop", "length")) and all(.[]; .object == "chat.completion.chunk")' \
            >/dev/null && ok || { bad "serve: streamed chat differs from the whole reply"; cat "$T/resp"; }
    expect_status "completion" 200 POST /v1/completions '{"prompt":"hello world","max_tokens":8,"temperature":0}' -H "$A"
    "$B/pi2-run" "$SM" --pubkey "$T/k.pub" -p "hello world" -n 8 >"$T/cmpl.run" 2>"$T/err"
    { printf 'hello world'; jq -j '.choices[0].text' "$T/resp"; echo; } | cmp -s - "$T/cmpl.run" \
        && jq -e '.object == "text_completion"' "$T/resp" >/dev/null && ok \
        || { bad "serve: greedy completion differs from pi2-run's"; cat "$T/resp"; echo; cat "$T/cmpl.run"; }
    expect_status "completion, streamed" 200 POST /v1/completions \
        '{"prompt":"hello world","max_tokens":8,"temperature":0,"stream":true,"stop":["zz"]}' -H "$A"
    grep -q '^data: \[DONE\]' "$T/resp" && ok || { bad "serve: streamed completion has no [DONE]"; cat "$T/resp"; }
    expect_status "models" 200 GET /v1/models -H "$A"
    jq -e --arg m "$M" '.object == "list" and .data[0].id == $m' "$T/resp" >/dev/null && ok \
        || { bad "serve: /v1/models"; cat "$T/resp"; echo; }
    expect_status "health" 200 GET /health
    jq -e '.status == "ok" and .queue == 0' "$T/resp" >/dev/null && ok || { bad "serve: /health"; cat "$T/resp"; echo; }
    # bad requests: 4xx, and the server goes on
    expect_status "no key" 401 POST /v1/chat/completions "$chat"
    expect_status "wrong key" 401 POST /v1/chat/completions "$chat" -H "Authorization: Bearer nope"
    expect_status "malformed JSON" 400 POST /v1/chat/completions '{"messages": [' -H "$A"
    expect_status "not an object" 400 POST /v1/chat/completions '[1,2]' -H "$A"
    expect_status "messages a string" 400 POST /v1/chat/completions '{"messages":"hi"}' -H "$A"
    expect_status "max_tokens a string" 400 POST /v1/completions '{"prompt":"hi","max_tokens":"8"}' -H "$A"
    expect_status "temperature out of range" 400 POST /v1/completions '{"prompt":"hi","temperature":7}' -H "$A"
    expect_status "stop a number" 400 POST /v1/completions '{"prompt":"hi","stop":5}' -H "$A"
    expect_status "unknown role" 400 POST /v1/chat/completions '{"messages":[{"role":"wizard","content":"x"}]}' -H "$A"
    expect_status "duplicate key" 400 POST /v1/completions '{"prompt":"hi","prompt":"ho"}' -H "$A"
    expect_status "unknown model" 404 POST /v1/chat/completions \
        '{"model":"gpt-9","messages":[{"role":"user","content":"hi"}]}' -H "$A"
    jq -e '.error.code == "model_not_found"' "$T/resp" >/dev/null && ok || bad "serve: unknown model: no model_not_found code"
    head -c 2000000 /dev/zero | tr '\0' a >"$T/huge.txt"
    got=$(curl -s -m 60 -o "$T/resp" -w '%{http_code}' -H "$A" --data-binary @"$T/huge.txt" "$URL/v1/completions")
    [ "$got" = 413 ] && ok || bad "serve: a 2 MB body: HTTP $got, not 413"
    long=$(printf 'all work and no play %.0s' $(seq 1 200))
    expect_status "prompt over the context" 400 POST /v1/completions '{"prompt":"'"$long"'"}' -H "$A"
    jq -e '.error.code == "context_length_exceeded"' "$T/resp" >/dev/null && ok || bad "serve: long prompt: no code"
    expect_status "no such endpoint" 404 GET /v1/nothing -H "$A"
    expect_status "GET a POST endpoint" 405 GET /v1/completions -H "$A"
    # a client that goes away: its generation is cancelled
    curl -s -m 0.3 -o /dev/null -H "$A" --data-binary '{"prompt":"a","max_tokens":100000,"stream":true}' "$URL/v1/completions"
    curl -s -m 0.3 -o /dev/null -H "$A" --data-binary '{"prompt":"a","max_tokens":100000}' "$URL/v1/completions"
    sleep 0.5
    expect_status "still serving" 200 POST /v1/completions '{"prompt":"hello world","max_tokens":8,"temperature":0}' -H "$A"
    { printf 'hello world'; jq -j '.choices[0].text' "$T/resp"; echo; } | cmp -s - "$T/cmpl.run" && ok \
        || bad "serve: greedy completion changed after bad requests"
    # a bounded load: 200 requests, 4 at a time, all answered
    seq 1 200 | xargs -P 4 -I{} curl -s -m 120 -o /dev/null -w '%{http_code}\n' -H "$A" \
        --data-binary '{"prompt":"load {}","max_tokens":4,"seed":{}}' "$URL/v1/completions" >"$T/codes"
    [ "$(grep -c '^200$' "$T/codes")" -eq 200 ] && ok || { bad "serve: load: $(sort "$T/codes" | uniq -c | tr '\n' ' ')"; }
    # slow clients: half a request each, then silence; the others are served meanwhile
    python3 -c '
import socket, sys, time
socks = []
for i in range(3):
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro")
    socks.append(s)
time.sleep(6)
' "${URL##*:}" &
    slow=$!
    sleep 0.3
    expect_status "served beside slow clients" 200 POST /v1/completions '{"prompt":"hi","max_tokens":4}' -H "$A"
    kill "$slow" 2>/dev/null
    wait "$slow" 2>/dev/null
    # the official client, when npm can install it
    if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 \
        && { [ -d "$B/npm/node_modules/openai" ] \
             || timeout 120 npm install --prefix "$B/npm" --no-audit --no-fund --silent openai >"$T/npm.log" 2>&1; }; then
        timeout 60 node tests/serve_client.mjs "$B/npm" "$URL/v1" sekrit "$M" >"$T/out" 2>"$T/err" && ok \
            || { bad "serve: the openai npm client"; cat "$T/out" "$T/err"; }
    else
        skp "serve: the openai npm package could not be installed (node, npm or the registry missing)"
    fi
    stop_server "serve"
    # under a memory limit
    start_server --mem-limit 40M
    expect_status "offloaded completion" 200 POST /v1/completions '{"prompt":"hello world","max_tokens":8,"temperature":0}'
    stop_server "serve --mem-limit"
    start_server --host nonsense
    wait "$SPID"
    grep -q "host 'nonsense'" "$T/serve.err" && ok || { bad "serve: a bad --host"; cat "$T/serve.err"; }
fi
