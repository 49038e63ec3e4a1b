#!/usr/bin/env bash
# The TypeScript and Python suites and the examples against a built server.
#
#   [MCP_BIN=PATH/TO/mcp_test_server] tests/polyglot/run.sh PATH/TO/agentrt-server
#
# (MCP_BIN defaults to examples/mcp_test_server beside the server binary.)
#
# Installs its own tools: a venv .ci/.venv-polyglot (or $POLYGLOT_VENV) from
# tests/polyglot/python/requirements.txt (every package pinned) and
# `npm ci` in tests/polyglot/node (package-lock.json). Builds the packages
# from proto/ — the wheel with packages/python/build.sh (its pinned tools in
# the venv $POLYGLOT_BUILD_VENV, default the suite's venv path + "-build"),
# the npm tarball with packages/node/build.sh — and installs them: the
# wheel into the suite's venv (pip, --no-deps: its dependencies are the
# pinned ones of requirements.txt), the tarball into tests/polyglot/node and
# examples/node (`npm install --no-save`). Starts the scripted fake upstream
# (fake_upstream.py) and one agentrt-server on loopback ephemeral ports,
# configured with the fake as its default model and two API keys of two
# users, then runs the Python suite (pytest), the Node suite (TypeScript
# compiled by tsc, run by `node --test`) and the examples in examples/python
# and examples/node, all through the installed packages. Ends with
# `polyglot: N passed, M failed`; exits non-zero when anything failed. The
# steps are tests/support/suite.sh's.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../support/suite.sh
source "$HERE/../support/suite.sh"
suite_begin polyglot "$@"

VENV="${POLYGLOT_VENV:-$SUITE_ROOT/.ci/.venv-polyglot}"
suite_venv "$VENV" "$HERE/python/requirements.txt"
suite_npm_ci "$HERE/node"
pass "tools installed ($((SECONDS - SUITE_STARTED)) s)"

# ---------------------------------------------------------------- packages
# Built from this checkout's proto/ and installed as a user would.
t0=$SECONDS
say "packages/python/build.sh"
WHEEL="$(AGENTRT_BUILD_VENV="${POLYGLOT_BUILD_VENV:-$VENV-build}" \
    "$SUITE_ROOT/packages/python/build.sh" "$WORK/dist" 2>"$WORK/wheel.log" | tail -n 1)"
[[ -f "$WHEEL" ]] || abort "packages/python/build.sh built no wheel" "$WORK/wheel.log"
"$PY" -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall "$WHEEL" \
    >"$WORK/pip-wheel.log" 2>&1 && "$PY" -m pip check >>"$WORK/pip-wheel.log" 2>&1 ||
    abort "pip install $(basename "$WHEEL")" "$WORK/pip-wheel.log"
pass "$(basename "$WHEEL") built and installed ($((SECONDS - t0)) s)"

t0=$SECONDS
say "packages/node/build.sh"
TARBALL="$("$SUITE_ROOT/packages/node/build.sh" "$WORK/dist" 2>"$WORK/tarball.log" | tail -n 1)"
[[ -f "$TARBALL" ]] || abort "packages/node/build.sh packed no tarball" "$WORK/tarball.log"
# npm_install_package DIR: the tarball into DIR (after its `npm ci`),
# leaving package.json and package-lock.json as they are.
npm_install_package() {
    (cd "$1" && npm install --no-save --no-audit --no-fund "$TARBALL") >"$WORK/npm-package.log" 2>&1 ||
        abort "npm install $(basename "$TARBALL") in ${1#"$SUITE_ROOT"/}" "$WORK/npm-package.log"
}
npm_install_package "$HERE/node"
pass "$(basename "$TARBALL") built and installed ($((SECONDS - t0)) s)"

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
say "node suite: tsc, node --test"
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
npm_install_package "$SUITE_ROOT/examples/node"
example "examples/node/chat.mjs" "$WORK/example-node.log" "hello from node" \
    node "$SUITE_ROOT/examples/node/chat.mjs"

say "done in $((SECONDS - SUITE_STARTED)) s"
summary
((FAILED == 0))
