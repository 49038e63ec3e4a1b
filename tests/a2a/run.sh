#!/usr/bin/env bash
# The A2A suites: agentrt's lf.a2a.v1 gRPC binding driven by the two
# official SDKs, a2a-sdk (Python) and @a2a-js/sdk (Node), each through its
# own gRPC transport.
#
#   tests/a2a/run.sh PATH/TO/agentrt-server
#
# Installs what it needs: a venv (.ci/.venv-a2a, or $A2A_VENV) from
# tests/a2a/python/requirements.txt (every package pinned) and `npm ci` in
# tests/a2a/node (package-lock.json). Starts the scripted fake upstream
# (tests/polyglot/fake_upstream.py) and one agentrt-server on loopback
# ephemeral ports — the fake as the default model, two API keys of two
# users — then runs pytest tests/a2a/python and node --test in
# tests/a2a/node. Ends with `a2a: N passed, M failed`; exits non-zero when
# anything failed.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HERE="$ROOT/tests/a2a"
VENV="${A2A_VENV:-$ROOT/.ci/.venv-a2a}"
WAIT_S=60 # longest wait for a "listening on" line

passed=0
failed=0
work=""
upstream_pid=""
server_pid=""

say() { printf 'a2a: %s\n' "$*"; }
ok() {
    passed=$((passed + 1))
    say "ok   $1"
}
# bad NAME [LOG...]: a failed step, with the tail of each log given.
bad() {
    failed=$((failed + 1))
    say "FAIL $1"
    shift
    for log in "$@"; do
        [[ -f "$log" ]] || continue
        printf -- '--- %s ---\n' "$(basename "$log")"
        tail -n 150 "$log"
    done
}
summary() { say "$passed passed, $failed failed"; }
die() {
    bad "$@"
    summary
    exit 1
}
halt() {
    if [[ -n "$1" ]] && kill -0 "$1" 2>/dev/null; then
        kill -TERM "$1" 2>/dev/null
        wait "$1" 2>/dev/null
    fi
}
cleanup() {
    halt "$server_pid"
    halt "$upstream_pid"
    [[ -n "$work" ]] && rm -rf "$work"
}
trap cleanup EXIT
trap 'say interrupted; exit 1' INT TERM HUP

if [[ $# -ne 1 ]]; then
    echo "usage: $0 PATH/TO/agentrt-server" >&2
    exit 2
fi
[[ -x "$1" ]] || { echo "a2a: $1 is not an executable" >&2; exit 2; }
BIN="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
work="$(mktemp -d "${TMPDIR:-/tmp}/agentrt-a2a.XXXXXX")"
t0=$SECONDS

# ------------------------------------------------------------------ tools
if [[ ! -x "$VENV/bin/python" ]]; then
    python3 -m venv "$VENV" >"$work/venv.log" 2>&1 || die "python3 -m venv $VENV" "$work/venv.log"
fi
PY="$VENV/bin/python"
"$PY" -m pip install --quiet --disable-pip-version-check -r "$HERE/python/requirements.txt" \
    >"$work/pip.log" 2>&1 || die "pip install -r tests/a2a/python/requirements.txt" "$work/pip.log"
(cd "$HERE/node" && npm ci --no-audit --no-fund) >"$work/npm.log" 2>&1 ||
    die "npm ci in tests/a2a/node" "$work/npm.log"
ok "tools installed ($((SECONDS - t0)) s)"

# ------------------------------------------------------------------ start
# first_line FD REGEX: prints the first line on FD matching REGEX; fails
# when FD closes (the process ended) or after WAIT_S seconds.
first_line() {
    local line end=$((SECONDS + WAIT_S))
    while ((SECONDS < end)); do
        IFS= read -r -t "$WAIT_S" -u "$1" line || return 1
        if [[ "$line" =~ $2 ]]; then
            printf '%s\n' "$line"
            return 0
        fi
    done
    return 1
}

exec {upstream_fd}< <(exec "$PY" -u "$ROOT/tests/polyglot/fake_upstream.py" --port 0 2>"$work/upstream.err")
upstream_pid=$!
line="$(first_line "$upstream_fd" '^fake-upstream listening on 127\.0\.0\.1:[0-9]+$')" ||
    die "the fake upstream did not say it was listening" "$work/upstream.err"
upstream="${line#fake-upstream listening on }"
ok "fake upstream on $upstream"

key="a2a-alice-$RANDOM$RANDOM$RANDOM"
other_key="a2a-bob-$RANDOM$RANDOM$RANDOM"
cat >"$work/agentrt.toml" <<TOML
default_model = "fake/m"

[[providers]]
name = "fake"
kind = "openai"
base_url = "http://$upstream/v1"

[[auth.api_keys]]
key = "$key"
user = "alice"

[[auth.api_keys]]
key = "$other_key"
user = "bob"
TOML
exec {server_fd}< <(exec "$BIN" --listen 127.0.0.1:0 --data-dir "$work/data" \
    --config "$work/agentrt.toml" 2>"$work/server.err")
server_pid=$!
line="$(first_line "$server_fd" '^agentrt-server listening on 127\.0\.0\.1:[0-9]+$')" ||
    die "agentrt-server did not say it was listening" "$work/server.err"
target="${line#agentrt-server listening on }"
ok "agentrt-server on $target"
export A2A_TARGET="$target" A2A_KEY="$key" A2A_OTHER_KEY="$other_key" \
    UPSTREAM_URL="http://$upstream"

# ------------------------------------------------------------------ suites
# suite NAME LOG COUNTS CMD...: runs CMD into LOG; COUNTS reads LOG on stdin
# and names the test counts.
suite() {
    local name="$1" log="$2" counts="$3" s=$SECONDS
    shift 3
    if "$@" >"$log" 2>&1; then
        ok "$name ($((SECONDS - s)) s): $($counts <"$log")"
    else
        bad "$name: $($counts <"$log")" "$log" "$work/server.err"
    fi
}
pytest_counts() { grep -E '[0-9]+ (passed|failed|error)' | tail -n 1; }
tap_counts() { awk '/^# (pass|fail) / { printf "%s%s %s", sep, $3, $2; sep = ", " }'; }

# node --test passes with no test at all: a suite that ran none failed.
node_suite() {
    local out rc
    out="$(cd "$HERE/node" && node --test --test-reporter=tap test/)"
    rc=$?
    printf '%s\n' "$out"
    ((rc == 0)) && grep -qE '^# pass [1-9]' <<<"$out"
}

suite "python a2a-sdk suite" "$work/pytest.log" pytest_counts \
    "$PY" -B -m pytest -p no:cacheprovider -q "$HERE/python"
suite "node @a2a-js/sdk suite" "$work/node.log" tap_counts \
    node_suite

say "done in $((SECONDS - t0)) s"
summary
((failed == 0))
