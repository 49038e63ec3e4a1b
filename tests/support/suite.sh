# Shared by the suites' runners (tests/polyglot/run.sh, tests/a2a/run.sh):
# source it, then call `suite_begin NAME SERVER_BIN`. It gives
#
#   say/pass/fail/abort/summary   one line per step: "NAME: ok   ...",
#                                 "NAME: FAIL ..." (with the tail of the logs
#                                 given), "NAME: P passed, F failed"
#   suite_venv VENV REQUIREMENTS  a venv with every package pinned; sets PY
#   suite_npm_ci DIR              npm ci (package-lock.json) in DIR
#   suite_start_upstream          tests/polyglot/fake_upstream.py on an
#                                 ephemeral port; sets UPSTREAM_ADDR
#   suite_start_server            agentrt-server on an ephemeral port with
#                                 the fake as its default model and two API
#                                 keys (users alice and bob); sets
#                                 SERVER_ADDR, KEY_A, KEY_B, SERVER_LOG
#   run_suite NAME LOG COUNTS CMD...  a step whose output goes to LOG; COUNTS
#                                 (pytest_counts, tap_counts) names its counts
#
# Processes are waited for by the lines they print (never by sleeping), and
# stopped (SIGTERM) when the runner exits. WORK is a temporary directory,
# removed then.

SUITE_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
START_TIMEOUT=60 # seconds to wait for a "listening on" line
SUITE_NAME=""
PASSED=0
FAILED=0
WORK=""
SUITE_PIDS=()

say() { printf '%s: %s\n' "$SUITE_NAME" "$*"; }
pass() {
    PASSED=$((PASSED + 1))
    say "ok   $1"
}
# fail NAME [FILE...]: counts a failed step and prints the tail of each file.
fail() {
    FAILED=$((FAILED + 1))
    say "FAIL $1"
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
summary() { say "$PASSED passed, $FAILED failed"; }
abort() {
    fail "$@"
    summary
    exit 1
}

suite_cleanup() {
    local pid
    for pid in "${SUITE_PIDS[@]}"; do
        if kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid" 2>/dev/null
            wait "$pid" 2>/dev/null
        fi
    done
    [[ -n "$WORK" ]] && rm -rf "$WORK"
}

# suite_begin NAME SERVER_BIN: checks the argument, sets BIN (absolute),
# WORK and SUITE_STARTED, installs the exit trap.
suite_begin() {
    SUITE_NAME="$1"
    if [[ $# -ne 2 || -z "$2" ]]; then
        echo "usage: $0 PATH/TO/agentrt-server" >&2
        exit 2
    fi
    [[ -x "$2" ]] || { echo "$SUITE_NAME: $2 is not an executable file" >&2; exit 2; }
    BIN="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"
    WORK="$(mktemp -d "${TMPDIR:-/tmp}/agentrt-$SUITE_NAME.XXXXXX")"
    SUITE_STARTED=$SECONDS
    trap suite_cleanup EXIT
    trap 'say interrupted >&2; exit 1' INT TERM HUP
}

# suite_venv VENV REQUIREMENTS: creates VENV when missing and installs the
# pinned REQUIREMENTS into it; sets PY.
suite_venv() {
    local venv="$1" reqs="$2"
    if [[ ! -x "$venv/bin/python" ]]; then
        say "creating venv $venv"
        python3 -m venv "$venv" >"$WORK/venv.log" 2>&1 || abort "python3 -m venv $venv" "$WORK/venv.log"
    fi
    PY="$venv/bin/python"
    say "pip install -r ${reqs#"$SUITE_ROOT"/}"
    "$PY" -m pip install --quiet --disable-pip-version-check -r "$reqs" >"$WORK/pip.log" 2>&1 ||
        abort "pip install -r ${reqs#"$SUITE_ROOT"/}" "$WORK/pip.log"
}

# suite_npm_ci DIR: npm ci in DIR (exactly its package-lock.json).
suite_npm_ci() {
    local dir="$1" rel log
    rel="${dir#"$SUITE_ROOT"/}"
    log="$WORK/npm-${rel//\//-}.log"
    say "npm ci in $rel (node $(node --version))"
    (cd "$dir" && npm ci --no-audit --no-fund) >"$log" 2>&1 || abort "npm ci in $rel" "$log"
}

# await_line FD PATTERN: reads lines from FD until one matches PATTERN (an
# extended regex) and prints it; fails after START_TIMEOUT seconds or when
# FD closes (the process exited).
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

# suite_start_upstream: the scripted fake model upstream (needs PY).
suite_start_upstream() {
    local line
    exec {UPSTREAM_FD}< <(exec "$PY" -u "$SUITE_ROOT/tests/polyglot/fake_upstream.py" --port 0 2>"$WORK/upstream.err")
    SUITE_PIDS+=("$!")
    line="$(await_line "$UPSTREAM_FD" '^fake-upstream listening on 127\.0\.0\.1:[0-9]+$')" ||
        abort "the fake upstream printed no 'fake-upstream listening on' line" "$WORK/upstream.err"
    UPSTREAM_ADDR="${line#fake-upstream listening on }"
    pass "fake upstream listening on $UPSTREAM_ADDR"
}

# suite_start_server: BIN with the fake upstream as its default model and
# API keys KEY_A (user alice) and KEY_B (user bob); with SUITE_MCP (the
# path of the MCP test server) its tools as server tools t__*.
suite_start_server() {
    local line
    KEY_A="$SUITE_NAME-key-alice-$RANDOM$RANDOM$RANDOM"
    KEY_B="$SUITE_NAME-key-bob-$RANDOM$RANDOM$RANDOM"
    cat >"$WORK/agentrt.toml" <<TOML
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

# An agent whose prompt shows its memory block "notes" (AgentService).
[[agents]]
id = "helper"
description = "polyglot helper"
system_prompt = "Notes: {{ memory.notes }}"
TOML
    if [[ -n "${SUITE_MCP:-}" ]]; then
        # Server tools t__echo, t__slow, t__fail (an MCP server over stdio).
        printf '\n[[mcp_servers]]\nname = "t"\ncommand = "%s"\n' "$SUITE_MCP" >>"$WORK/agentrt.toml"
    fi
    SERVER_LOG="$WORK/server.err"
    exec {SERVER_FD}< <(exec "$BIN" --listen 127.0.0.1:0 --data-dir "$WORK/data" \
        --config "$WORK/agentrt.toml" 2>"$SERVER_LOG")
    SUITE_PIDS+=("$!")
    line="$(await_line "$SERVER_FD" '^agentrt-server listening on 127\.0\.0\.1:[0-9]+$')" ||
        abort "agentrt-server printed no 'agentrt-server listening on' line" "$SERVER_LOG"
    SERVER_ADDR="${line#agentrt-server listening on }"
    pass "agentrt-server listening on $SERVER_ADDR"
}

# run_suite NAME LOG COUNTS CMD...: runs CMD with its output in LOG; COUNTS
# (reading LOG on stdin) names its test counts.
run_suite() {
    local name="$1" out="$2" counts="$3" t0=$SECONDS
    shift 3
    if "$@" >"$out" 2>&1; then
        pass "$name ($((SECONDS - t0)) s): $($counts <"$out")"
    else
        fail "$name ($($counts <"$out"))" "$out" "$SERVER_LOG"
    fi
}
pytest_counts() { grep -E '[0-9]+ (passed|failed|error)' | tail -n 1; }
tap_counts() { awk '/^# (tests|pass|fail) / { printf "%s%s %s", sep, $3, $2; sep = ", " }'; }

# node_test DIR PATHS...: `node --test` in DIR with the TAP reporter; a run
# in which no test passed fails (node --test passes when it finds none).
node_test() {
    local dir="$1" out rc
    shift
    out="$(cd "$dir" && node --test --test-reporter=tap "$@")"
    rc=$?
    printf '%s\n' "$out"
    ((rc == 0)) && grep -qE '^# pass [1-9]' <<<"$out"
}
