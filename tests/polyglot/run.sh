#!/usr/bin/env bash
# The TypeScript and Python suites and the examples against a built server.
#
#   [MCP_BIN=PATH/TO/mcp_test_server] tests/polyglot/run.sh PATH/TO/agentrt-server
#
# (MCP_BIN defaults to examples/mcp_test_server beside the server binary.)
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
# non-zero when anything failed. The steps are tests/support/suite.sh's.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../support/suite.sh
source "$HERE/../support/suite.sh"
suite_begin polyglot "$@"

suite_venv "${POLYGLOT_VENV:-$SUITE_ROOT/.ci/.venv-polyglot}" "$HERE/python/requirements.txt"
suite_npm_ci "$HERE/node"
pass "tools installed ($((SECONDS - SUITE_STARTED)) s)"

# The MCP test server: server tools, for the approval tests.
SUITE_MCP="${MCP_BIN:-$(dirname "$BIN")/examples/mcp_test_server}"
[[ -x "$SUITE_MCP" ]] || abort "no MCP test server at $SUITE_MCP: build it with \
cargo build -p agentrt-runtime --example mcp_test_server and set MCP_BIN"
suite_start_upstream
suite_start_server
export POLYGLOT_ADDR="$SERVER_ADDR" POLYGLOT_KEY_A="$KEY_A" POLYGLOT_KEY_B="$KEY_B" \
    POLYGLOT_UPSTREAM="$UPSTREAM_ADDR"

node_suite() {
    (cd "$HERE/node" && npm run --silent build) && node_test "$HERE/node" "$HERE"/node/build/test/*.test.js
}
say "python suite: pytest tests/polyglot/python"
run_suite "python suite" "$WORK/pytest.log" pytest_counts \
    "$PY" -B -m pytest -p no:cacheprovider -q "$HERE/python"
say "node suite: proto-loader-gen-types + tsc, node --test"
run_suite "node suite" "$WORK/node.log" tap_counts node_suite

# ---------------------------------------------------------------- examples
# Each example once: its answer, the busy ErrorInfo and the stopped turn's
# outcome and trailing status must show (the long turn is a `[hang]`).
example() {
    local name="$1" out="$2" says="$3"
    shift 3
    local t0=$SECONDS
    if "$@" --addr "$SERVER_ADDR" --key "$KEY_A" --long-prompt "[hang]" "$says" >"$out" 2>&1 &&
        grep -qx "echo: $says" "$out" &&
        grep -qE '^busy: ABORTED SESSION_BUSY turn_id=[0-9a-f-]+$' "$out" &&
        grep -qx 'stopped: outcome TURN_OUTCOME_CANCELED, trailing status CANCELLED' "$out"; then
        pass "$name ($((SECONDS - t0)) s): answer, SESSION_BUSY, stopped turn"
    else
        fail "$name: answer, SESSION_BUSY and stopped turn" "$out" "$SERVER_LOG"
    fi
}
say "examples"
example "examples/python/chat.py" "$WORK/example-py.log" "hello from python" \
    "$PY" -B "$SUITE_ROOT/examples/python/chat.py"
suite_npm_ci "$SUITE_ROOT/examples/node"
example "examples/node/chat.mjs" "$WORK/example-node.log" "hello from node" \
    node "$SUITE_ROOT/examples/node/chat.mjs"

say "done in $((SECONDS - SUITE_STARTED)) s"
summary
((FAILED == 0))
