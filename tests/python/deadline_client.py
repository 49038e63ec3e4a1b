#!/usr/bin/env python3
"""A grpcio client's deadline still gets the TIMED_OUT outcome (P7 item 8).

Usage: deadline_client.py PATH/TO/agentrt-server

grpc-core clients (Python, C++, Ruby, ...) send their deadline in
`grpc-timeout` rounded *up*; a server that keeps only a few milliseconds in
hand ends the turn after the client has already given up, so the caller sees
a bare DEADLINE_EXCEEDED, no outcome and no stored NOTICE. This starts a fake
OpenAI-compatible upstream on loopback that sends one text delta and then
hangs, starts agentrt-server against it, and makes a grpcio Chat with a 10 s
deadline: the stream must carry `turn_finished` with TURN_OUTCOME_TIMED_OUT
before the trailing DEADLINE_EXCEEDED, and the history must hold the NOTICE.
Needs `grpcio` and `grpcio-tools`. Prints one line per check; exits non-zero
when any check fails.
"""

from __future__ import annotations

import http.server
import json
import os
import sys
import tempfile
import threading
import time

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Checks, Server, generate_stubs  # noqa: E402

DEADLINE = 10.0


class HangingUpstream(http.server.BaseHTTPRequestHandler):
    """Answers a chat completion with one SSE delta, then sends nothing."""

    protocol_version = "HTTP/1.1"
    release = threading.Event()

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        length = int(self.headers.get("content-length", "0"))
        self.rfile.read(length)
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        chunk = {"choices": [{"index": 0, "delta": {"content": "thinking about it"}}]}
        data = f"data: {json.dumps(chunk)}\n\n".encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()
        # Hang until the test ends (the server's request is cancelled by
        # then, which closes the connection).
        self.release.wait(timeout=60)

    def log_message(self, *_args) -> None:
        pass


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    binary = argv[1]
    checks = Checks()
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), HangingUpstream)
    upstream.daemon_threads = True
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory(prefix="agentrt-deadline-") as work:
        config = os.path.join(work, "agentrt.toml")
        with open(config, "w") as f:
            f.write(
                'default_model = "hang/m"\n\n[[providers]]\nname = "hang"\nkind = "openai"\n'
                f'base_url = "http://127.0.0.1:{upstream.server_address[1]}/v1"\n'
            )
        stubs = os.path.join(work, "stubs")
        os.makedirs(stubs)
        generate_stubs(stubs)
        sys.path.insert(0, stubs)
        from agentrt.v1 import (
            common_pb2,
            runtime_pb2,
            runtime_pb2_grpc,
            sessions_pb2,
            sessions_pb2_grpc,
        )

        server = Server(binary, work, "server", ["--config", config])
        try:
            addr = server.addr
            if not checks.check("server with a hanging upstream started", addr is not None,
                                server.stderr()):
                return 1
            channel = grpc.insecure_channel(addr)
            grpc.channel_ready_future(channel).result(timeout=30)
            sessions = sessions_pb2_grpc.SessionServiceStub(channel)
            runtime = runtime_pb2_grpc.AgentRuntimeStub(channel)
            sid = sessions.CreateSession(sessions_pb2.CreateSessionRequest(), timeout=30).session_id
            request = runtime_pb2.ChatRequest(session_id=sid)
            request.content.add().text.text = "take your time"
            events, code = [], None
            started = time.monotonic()
            try:
                for event in runtime.Chat(request, timeout=DEADLINE):
                    events.append(event)
            except grpc.RpcError as e:
                code = e.code()
            took = time.monotonic() - started
            finished = [e.turn_finished for e in events if e.WhichOneof("kind") == "turn_finished"]
            checks.check(
                f"a {DEADLINE:.0f} s grpcio deadline ends the turn TIMED_OUT inside the stream",
                len(finished) == 1
                and finished[0].outcome == sessions_pb2.TURN_OUTCOME_TIMED_OUT,
                f"events: {[e.WhichOneof('kind') for e in events]}, after {took:.2f} s",
            )
            checks.check(
                "the trailing status is DEADLINE_EXCEEDED",
                code == grpc.StatusCode.DEADLINE_EXCEEDED,
                f"got {code}",
            )
            history = sessions.GetHistory(
                sessions_pb2.GetHistoryRequest(session_id=sid), timeout=30
            ).messages
            notice = [m for m in history if m.role == common_pb2.ROLE_NOTICE]
            checks.check("the time-limit NOTICE is stored", len(notice) == 1, f"{len(history)} messages")
        finally:
            HangingUpstream.release.set()
            server.stop()
            upstream.shutdown()
    print(f"deadline: {checks.passed} passed, {checks.failed} failed", flush=True)
    return 0 if checks.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
