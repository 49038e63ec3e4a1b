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
# users — and a second server whose A2A card (on its HTTP well-known path)
# names the first; then runs pytest tests/a2a/python and node --test in
# tests/a2a/node. Ends with `a2a: N passed, M failed`; exits non-zero when
# anything failed. The steps are tests/support/suite.sh's.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../support/suite.sh
source "$HERE/../support/suite.sh"
suite_begin a2a "$@"

suite_venv "${A2A_VENV:-$SUITE_ROOT/.ci/.venv-a2a}" "$HERE/python/requirements.txt"
suite_npm_ci "$HERE/node"
pass "tools installed ($((SECONDS - SUITE_STARTED)) s)"

# The MCP test server: server tools, for the approval test.
SUITE_MCP="${MCP_BIN:-$(dirname "$BIN")/examples/mcp_test_server}"
[[ -x "$SUITE_MCP" ]] || abort "no MCP test server at $SUITE_MCP: build it with \
cargo build -p agentrt-runtime --example mcp_test_server and set MCP_BIN"
suite_start_upstream
suite_start_server
export A2A_TARGET="$SERVER_ADDR" A2A_KEY="$KEY_A" A2A_OTHER_KEY="$KEY_B" \
    UPSTREAM_URL="http://$UPSTREAM_ADDR"

# A second server whose card advertises the first one's address as its
# public URL (as a pod's card names the Service, not the pod): the SDK reads
# the card from its well-known HTTP path and must follow it to the first.
A2A_PUBLIC_URL="localhost:${SERVER_ADDR##*:}"
exec {CARD_FD}< <(AGENTRT_A2A_PUBLIC_URL="$A2A_PUBLIC_URL" exec "$BIN" --listen 127.0.0.1:0 \
    --data-dir "$WORK/card-data" --config "$WORK/agentrt.toml" --metrics-listen 127.0.0.1:0 \
    2>"$WORK/card-server.err")
SUITE_PIDS+=("$!")
line="$(await_line "$CARD_FD" '^agentrt-server metrics on http://127\.0\.0\.1:[0-9]+/metrics$')" ||
    abort "the card server printed no metrics line" "$WORK/card-server.err"
A2A_CARD_BASE="${line#agentrt-server metrics on }"
A2A_CARD_BASE="${A2A_CARD_BASE%/metrics}"
pass "card server: $A2A_CARD_BASE/.well-known/agent-card.json names $A2A_PUBLIC_URL"
export A2A_CARD_BASE A2A_PUBLIC_URL

run_suite "python a2a-sdk suite" "$WORK/pytest.log" pytest_counts \
    "$PY" -B -m pytest -p no:cacheprovider -q "$HERE/python"
run_suite "node @a2a-js/sdk suite" "$WORK/node.log" tap_counts \
    node_test "$HERE/node" test/

say "done in $((SECONDS - SUITE_STARTED)) s"
summary
((FAILED == 0))
