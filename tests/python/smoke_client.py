#!/usr/bin/env python3
"""Smoke test of a running agentrt-server through Python grpcio.

Usage: smoke_client.py HOST:PORT

Generates the Python stubs from proto/ into a temporary directory at run time
(nothing generated is committed), then checks sessions, a Chat turn with the
offline `builtin/echo` model, admission errors and the stored history.
Needs `grpcio` and `grpcio-tools` (.ci/smoke.sh installs them into a venv).
Prints one line per check and exits non-zero when any check fails.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import tempfile
import time
import traceback

import grpc

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RPC_TIMEOUT = 30.0
SENT_TEXT = "hello from python"
START_TIMEOUT = 60.0


class Server:
    """agentrt-server on 127.0.0.1:0 with a data dir under `work` and the
    given extra arguments; `addr` is the address from its "listening" line,
    or None when it exited or printed none within START_TIMEOUT. The other
    scripts (deadline, busy, TLS) start their own servers with it."""

    def __init__(self, binary: str, work: str, name: str, args: list[str],
                 env: dict[str, str] | None = None) -> None:
        self.log = os.path.join(work, f"{name}.err")
        self.out = open(os.path.join(work, f"{name}.out"), "w+")
        self.err = open(self.log, "w")
        self.proc = subprocess.Popen(
            [binary, "--listen", "127.0.0.1:0", "--data-dir", os.path.join(work, f"{name}-data"),
             *args],
            stdout=self.out,
            stderr=self.err,
            env=env,
        )
        self.addr = None
        until = time.monotonic() + START_TIMEOUT
        while self.addr is None and time.monotonic() < until and self.proc.poll() is None:
            self.out.seek(0)
            for line in self.out.read().splitlines():
                if line.startswith("agentrt-server listening on "):
                    self.addr = line.removeprefix("agentrt-server listening on ").strip()
            if self.addr is None:
                time.sleep(0.05)

    def log_text(self) -> str:
        """Everything the server wrote to stderr so far."""
        with open(self.log) as f:
            return f.read()

    def stderr(self) -> str:
        return self.log_text()[-2000:]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.out.close()
        self.err.close()


class Checks:
    def __init__(self) -> None:
        self.passed = 0
        self.failed = 0

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        if ok:
            self.passed += 1
            print(f"  ok   {name}", flush=True)
        else:
            self.failed += 1
            suffix = f": {detail}" if detail else ""
            print(f"  FAIL {name}{suffix}", flush=True)
        return ok


def generate_stubs(out_dir: str) -> None:
    protos = sorted(
        os.path.relpath(p, REPO_ROOT)
        for p in glob.glob(os.path.join(REPO_ROOT, "proto", "agentrt", "v1", "*.proto"))
    )
    if not protos:
        raise RuntimeError(f"no .proto files under {REPO_ROOT}/proto/agentrt/v1")
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        "-I",
        "proto",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *protos,
    ]
    result = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(
            f"grpc_tools.protoc failed ({result.returncode}):\n{result.stdout}{result.stderr}"
        )


def run(addr: str, checks: Checks) -> None:
    # Imported here: they exist only once generate_stubs() has run.
    from agentrt.v1 import common_pb2, runtime_pb2, runtime_pb2_grpc, sessions_pb2, sessions_pb2_grpc

    channel = grpc.insecure_channel(addr)
    try:
        grpc.channel_ready_future(channel).result(timeout=RPC_TIMEOUT)
    except grpc.FutureTimeoutError:
        checks.check(f"connect to {addr}", False, f"not ready within {RPC_TIMEOUT:.0f}s")
        return
    sessions = sessions_pb2_grpc.SessionServiceStub(channel)
    runtime = runtime_pb2_grpc.AgentRuntimeStub(channel)

    # 1. CreateSession
    session = sessions.CreateSession(
        sessions_pb2.CreateSessionRequest(title="python smoke"), timeout=RPC_TIMEOUT
    )
    if not checks.check(
        "CreateSession returns a session id",
        bool(session.session_id) and session.title == "python smoke",
        repr(session),
    ):
        return
    sid = session.session_id

    # 2. Chat with the default (echo) model
    request = runtime_pb2.ChatRequest(
        session_id=sid,
        content=[common_pb2.ContentBlock(text=common_pb2.TextBlock(text=SENT_TEXT))],
    )
    events = list(runtime.Chat(request, timeout=RPC_TIMEOUT))
    kinds = [e.WhichOneof("kind") for e in events]
    seqs = [e.seq for e in events]
    checks.check(
        "Chat event seq is 1..n without gaps",
        len(events) > 0 and seqs == list(range(1, len(events) + 1)),
        f"seqs={seqs}",
    )
    checks.check(
        "Chat starts with turn_started",
        len(kinds) > 0 and kinds[0] == "turn_started",
        f"kinds={kinds}",
    )
    finished = [e.turn_finished for e in events if e.WhichOneof("kind") == "turn_finished"]
    checks.check(
        "Chat ends with exactly one turn_finished, outcome SUCCESS",
        len(finished) == 1
        and kinds[-1] == "turn_finished"
        and finished[0].outcome == sessions_pb2.TURN_OUTCOME_SUCCESS,
        f"kinds={kinds} finished={[str(f) for f in finished]}",
    )
    text = "".join(e.text.text for e in events if e.WhichOneof("kind") == "text")
    expected = f"You said: {SENT_TEXT}"
    checks.check(
        f"Chat text deltas concatenate to {expected!r}",
        text == expected,
        f"got {text!r}",
    )
    turn_ids = {e.turn_id for e in events}
    checks.check(
        "all Chat events carry the session id and one turn id",
        all(e.session_id == sid for e in events) and len(turn_ids) == 1 and "" not in turn_ids,
        f"turn_ids={turn_ids}",
    )

    # 3. Chat with an unknown model: rejected at admission, before any event
    bad = runtime_pb2.ChatRequest(
        session_id=sid,
        content=[common_pb2.ContentBlock(text=common_pb2.TextBlock(text="should not run"))],
        model="nowhere/x",
    )
    got_events: list[str] = []
    code = None
    try:
        for e in runtime.Chat(bad, timeout=RPC_TIMEOUT):
            got_events.append(e.WhichOneof("kind"))
    except grpc.RpcError as err:
        code = err.code()
    checks.check(
        "Chat with unknown model 'nowhere/x' fails INVALID_ARGUMENT before any event",
        code == grpc.StatusCode.INVALID_ARGUMENT and not got_events,
        f"code={code} events={got_events}",
    )

    # 4. GetSession on a missing id
    code = None
    try:
        sessions.GetSession(
            sessions_pb2.GetSessionRequest(session_id="no-such-session-smoke"), timeout=RPC_TIMEOUT
        )
    except grpc.RpcError as err:
        code = err.code()
    checks.check("GetSession on a missing id fails NOT_FOUND", code == grpc.StatusCode.NOT_FOUND, f"code={code}")

    # 5. GetHistory: the user message and the echo answer, nothing from the rejected turn
    history = sessions.GetHistory(sessions_pb2.GetHistoryRequest(session_id=sid), timeout=RPC_TIMEOUT)
    roles = [m.role for m in history.messages]
    role_names = [common_pb2.Role.Name(r) for r in roles]
    checks.check(
        "GetHistory has 2 messages: ROLE_USER then ROLE_ASSISTANT",
        roles == [common_pb2.ROLE_USER, common_pb2.ROLE_ASSISTANT],
        f"roles={role_names}",
    )
    if len(history.messages) == 2:
        stored = "".join(b.text.text for b in history.messages[1].content if b.WhichOneof("block") == "text")
        checks.check("stored assistant message is the echo answer", stored == expected, f"got {stored!r}")

    channel.close()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} HOST:PORT", file=sys.stderr)
        return 2
    addr = argv[1]
    checks = Checks()
    print(f"smoke_client: testing {addr} with grpcio {grpc.__version__}", flush=True)
    with tempfile.TemporaryDirectory(prefix="agentrt-pystubs-") as out_dir:
        try:
            generate_stubs(out_dir)
            sys.path.insert(0, out_dir)
            run(addr, checks)
        except Exception:  # noqa: BLE001 - any unexpected error is a failed check
            checks.check("no unexpected error", False, traceback.format_exc())
        finally:
            if out_dir in sys.path:
                sys.path.remove(out_dir)
    total = checks.passed + checks.failed
    if checks.failed or total == 0:
        print(f"smoke_client: FAILED ({checks.failed} of {total} checks failed)", flush=True)
        return 1
    print(f"smoke_client: all {total} checks passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
