#!/usr/bin/env bash
# The TypeScript and Python suites and the examples against a built server.
#
#   tests/polyglot/run.sh PATH/TO/agentrt-server
#
# Installs its own tools: a venv .ci/.venv-polyglot from
# tests/polyglot/python/requirements.txt (every package pinned) and
# `npm ci` in tests/polyglot/node (package-lock.json). Starts the scripted
# fake upstream (fake_upstream.py) and one agentrt-server on loopback
# ephemeral ports, configured with the fake as its default model and two API
# keys of two users, then runs the Python suite (pytest), the Node suite
# (TypeScript compiled by tsc, run by `node --test`) and the examples in
# examples/python and examples/node (`npm ci` there too). Both suites generate their stubs from
# proto/ at run time. Ends with `polyglot: N passed, M failed`; exits
# non-zero when anything failed.
set -uo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HERE="$REPO_ROOT/tests/polyglot"
VENV="${POLYGLOT_VENV:-$REPO_ROOT/.ci/.venv-polyglot}"
START_TIMEOUT=60 # seconds to wait for a "listening on" line

PASSED=0
FAILED=0
WORK=""
UPSTREAM_PID=""
SERVER_PID=""

log() { printf 'polyglot: %s\n' "$*"; }
pass() {
    PASSED=$((PASSED + 1))
    printf 'polyglot: ok   %s\n' "$1"
}
# fail NAME [FILE...]: counts a failed step and prints the files given.
fail() {
    FAILED=$((FAILED + 1))
    printf 'polyglot: FAIL %s\n' "$1"
    shift
    local f
    for f in "$@"; do
        if [[ -f "$f" ]]; then
            printf -- '----- %s -----\n' "$(basename "$f")"
            tail -n 200 "$f"
            printf -- '----- end -----\n'
        fi
    done
}
summary() { printf 'polyglot: %d passed, %d failed\n' "$PASSED" "$FAILED"; }
abort() {
    fail "$@"
    summary
    exit 1
}
stop_pid() {
    local pid="$1"
    if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    fi
}
cleanup() {
    stop_pid "$SERVER_PID"
    stop_pid "$UPSTREAM_PID"
    [[ -n "$WORK" ]] && rm -rf "$WORK"
}
trap cleanup EXIT
trap 'echo "polyglot: interrupted" >&2; exit 1' INT TERM HUP

if [[ $# -ne 1 ]]; then
    echo "usage: $0 PATH/TO/agentrt-server" >&2
    exit 2
fi
BIN="$1"
[[ -x "$BIN" ]] || { echo "polyglot: $BIN is not an executable file" >&2; exit 2; }
BIN="$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/agentrt-polyglot.XXXXXX")"
started=$SECONDS

# ---------------------------------------------------------------- tools
if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating venv $VENV"
    python3 -m venv "$VENV" >"$WORK/venv.log" 2>&1 || abort "create venv $VENV" "$WORK/venv.log"
fi
PY="$VENV/bin/python"
log "pip install -r tests/polyglot/python/requirements.txt into $VENV"
"$PY" -m pip install --quiet --disable-pip-version-check -r "$HERE/python/requirements.txt" \
    >"$WORK/pip.log" 2>&1 || abort "pip install -r tests/polyglot/python/requirements.txt" "$WORK/pip.log"
log "npm ci in tests/polyglot/node (node $(node --version))"
(cd "$HERE/node" && npm ci --no-audit --no-fund) >"$WORK/npm.log" 2>&1 ||
    abort "npm ci in tests/polyglot/node" "$WORK/npm.log"
pass "tools installed ($((SECONDS - started)) s)"

# ---------------------------------------------------------------- start
# await_line FD PATTERN NAME: reads lines from FD until one matches PATTERN
# (an extended regex) and prints it; fails after START_TIMEOUT seconds or
# when FD closes (the process exited).
await_line() {
    local fd="$1" pattern="$2" line
    local until=$((SECONDS + START_TIMEOUT))
    while ((SECONDS < until)); do
        IFS= read -r -t "$START_TIMEOUT" -u "$fd" line || return 1
        if [[ "$line" =~ $pattern ]]; then
            printf '%s\n' "$line"
            return 0
        fi
    done
    return 1
}

exec {UPSTREAM_FD}< <(exec "$PY" -u "$HERE/fake_upstream.py" --port 0 2>"$WORK/upstream.err")
UPSTREAM_PID=$!
line="$(await_line "$UPSTREAM_FD" '^fake-upstream listening on 127\.0\.0\.1:[0-9]+$')" ||
    abort "the fake upstream printed no 'fake-upstream listening on' line" "$WORK/upstream.err"
UPSTREAM_ADDR="${line#fake-upstream listening on }"
pass "fake upstream listening on $UPSTREAM_ADDR"

KEY_A="polyglot-key-alice-$RANDOM$RANDOM"
KEY_B="polyglot-key-bob-$RANDOM$RANDOM"
cat >"$WORK/agentrt.toml" <<EOF
default_model = "fake/m"

[[providers]]
name = "fake"
kind = "openai"
base_url = "http://$UPSTREAM_ADDR/v1"

[[auth.api_keys]]
key = "$KEY_A"
user = "alice"

[[auth.api_keys]]
key = "$KEY_B"
user = "bob"
EOF
exec {SERVER_FD}< <(exec "$BIN" --listen 127.0.0.1:0 --data-dir "$WORK/data" --config "$WORK/agentrt.toml" \
    2>"$WORK/server.err")
SERVER_PID=$!
line="$(await_line "$SERVER_FD" '^agentrt-server listening on 127\.0\.0\.1:[0-9]+$')" ||
    abort "agentrt-server printed no 'agentrt-server listening on' line" "$WORK/server.err"
ADDR="${line#agentrt-server listening on }"
pass "agentrt-server listening on $ADDR"

export POLYGLOT_ADDR="$ADDR" POLYGLOT_KEY_A="$KEY_A" POLYGLOT_KEY_B="$KEY_B" POLYGLOT_UPSTREAM="$UPSTREAM_ADDR"

# ---------------------------------------------------------------- suites
# suite NAME LOG SUMMARY-COMMAND COMMAND...: runs COMMAND with its output in
# LOG; SUMMARY-COMMAND (reading LOG on stdin) names its counts.
suite() {
    local name="$1" out="$2" counts="$3"
    shift 3
    local t0=$SECONDS
    if "$@" >"$out" 2>&1; then
        pass "$name ($((SECONDS - t0)) s): $($counts <"$out")"
    else
        fail "$name ($($counts <"$out"))" "$out" "$WORK/server.err"
    fi
}
pytest_counts() { grep -E '(passed|failed|error)' | tail -n 1; }
tap_counts() { awk '/^# (tests|pass|fail) / { printf "%s%s %s", sep, $3, $2; sep = ", " }'; }
node_suite() {
    cd "$HERE/node" && npm run --silent build && node --test --test-reporter=tap build/test/*.test.js
}

log "python suite: pytest tests/polyglot/python"
suite "python suite" "$WORK/pytest.log" pytest_counts \
    "$PY" -B -m pytest -p no:cacheprovider -q "$HERE/python"
log "node suite: proto-loader-gen-types + tsc, node --test"
suite "node suite" "$WORK/node.log" tap_counts node_suite

# ---------------------------------------------------------------- examples
# Each example once: its answer, the busy ErrorInfo and the stopped turn's
# outcome and trailing status must show (the long turn is a `[hang]`).
example() {
    local name="$1" out="$2" says="$3"
    shift 3
    local t0=$SECONDS
    if "$@" --addr "$ADDR" --key "$KEY_A" --long-prompt "[hang]" "$says" >"$out" 2>&1 &&
        grep -qx "echo: $says" "$out" &&
        grep -qE '^busy: ABORTED SESSION_BUSY turn_id=[0-9a-f-]+$' "$out" &&
        grep -qx 'stopped: outcome TURN_OUTCOME_CANCELED, trailing status CANCELLED' "$out"; then
        pass "$name ($((SECONDS - t0)) s): answer, SESSION_BUSY, stopped turn"
    else
        fail "$name: answer, SESSION_BUSY and stopped turn" "$out" "$WORK/server.err"
    fi
}
log "examples"
example "examples/python/chat.py" "$WORK/example-py.log" "hello from python" \
    "$PY" -B "$REPO_ROOT/examples/python/chat.py"
if (cd "$REPO_ROOT/examples/node" && npm ci --no-audit --no-fund) >"$WORK/npm-example.log" 2>&1; then
    example "examples/node/chat.mjs" "$WORK/example-node.log" "hello from node" \
        node "$REPO_ROOT/examples/node/chat.mjs"
else
    fail "npm ci in examples/node" "$WORK/npm-example.log"
fi

log "done in $((SECONDS - started)) s"
summary
((FAILED == 0))
