#!/usr/bin/env python3
"""grpcurl shows why a Chat was refused: the ErrorInfo reason SESSION_BUSY.

Usage: busy_grpcurl.py PATH/TO/agentrt-server PATH/TO/grpcurl

A person debugging with grpcurl must be able to read the google.rpc details
of an error; grpcurl decodes them only when the server's reflection serves
the google.rpc descriptors (otherwise it prints "not recognized"). This
starts a fake OpenAI-compatible upstream on loopback that sends one delta
and hangs, starts agentrt-server against it with an API key and a provider
key configured and JSON logs, holds a turn open with a grpcio Chat, and
sends a second Chat on the same session with grpcurl: grpcurl must print
code Aborted and the ErrorInfo reason SESSION_BUSY. Afterwards no line the
server logged may contain either configured secret. Needs `grpcio` and
`grpcio-tools`. Prints one line per check; exits non-zero when any fails.
"""

from __future__ import annotations

import http.server
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deadline_client import HangingUpstream  # noqa: E402
from harness import Checks, Server, generate_stubs  # noqa: E402

CALLER_KEY = "smoke-caller-key-7f3a9c"
PROVIDER_KEY = "smoke-provider-key-c41d07"


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    binary, grpcurl = argv[1], argv[2]
    checks = Checks()
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), HangingUpstream)
    upstream.daemon_threads = True
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory(prefix="agentrt-busy-") as work:
        config = os.path.join(work, "agentrt.toml")
        with open(config, "w") as f:
            f.write(
                'default_model = "hang/m"\n\n[[providers]]\nname = "hang"\nkind = "openai"\n'
                f'base_url = "http://127.0.0.1:{upstream.server_address[1]}/v1"\n'
                'api_key_env = "SMOKE_PROVIDER_KEY"\n\n'
                f'[[auth.api_keys]]\nkey = "{CALLER_KEY}"\nuser = "smoke"\n'
            )
        stubs = os.path.join(work, "stubs")
        os.makedirs(stubs)
        generate_stubs(stubs)
        sys.path.insert(0, stubs)
        from agentrt.v1 import runtime_pb2, runtime_pb2_grpc, sessions_pb2, sessions_pb2_grpc

        env = dict(os.environ, SMOKE_PROVIDER_KEY=PROVIDER_KEY, AGENTRT_LOG="debug")
        server = Server(binary, work, "server", ["--config", config, "--log-format", "json"], env=env)
        events: queue.Queue = queue.Queue(maxsize=1024)
        try:
            addr = server.addr
            if not checks.check("server with a hanging upstream started", addr is not None,
                                server.stderr()):
                return 1
            channel = grpc.insecure_channel(addr)
            grpc.channel_ready_future(channel).result(timeout=30)
            auth = [("authorization", f"Bearer {CALLER_KEY}")]
            sessions = sessions_pb2_grpc.SessionServiceStub(channel)
            runtime = runtime_pb2_grpc.AgentRuntimeStub(channel)
            sid = sessions.CreateSession(
                sessions_pb2.CreateSessionRequest(), metadata=auth, timeout=30
            ).session_id
            request = runtime_pb2.ChatRequest(session_id=sid)
            request.content.add().text.text = "hold the session"
            live = runtime.Chat(request, metadata=auth, timeout=120)

            def pump() -> None:
                try:
                    for event in live:
                        events.put(event.WhichOneof("kind"))
                except grpc.RpcError:
                    pass
                events.put(None)

            threading.Thread(target=pump, daemon=True).start()
            first = events.get(timeout=30)
            checks.check("the first Chat holds the session (turn_started)", first == "turn_started",
                         f"first event {first!r}")
            body = '{"sessionId":"%s","content":[{"text":{"text":"me too"}}]}' % sid
            shown = subprocess.run(
                [grpcurl, "-plaintext", "-max-time", "30", "-H", f"authorization: Bearer {CALLER_KEY}",
                 "-d", body, addr, "agentrt.v1.AgentRuntime/Chat"],
                capture_output=True, text=True, timeout=60,
            )
            text = shown.stdout + shown.stderr
            checks.check("grpcurl: the busy Chat fails with code Aborted",
                         shown.returncode != 0 and "Code: Aborted" in text, text)
            checks.check("grpcurl prints the google.rpc.ErrorInfo reason SESSION_BUSY",
                         "google.rpc.ErrorInfo" in text and re.search(r'"reason":\s*"SESSION_BUSY"', text)
                         is not None and "not recognized" not in text, text)
            runtime.StopSession(runtime_pb2.StopSessionRequest(session_id=sid),
                                metadata=auth, timeout=30)
            while events.get(timeout=30) is not None:
                pass
        finally:
            HangingUpstream.release.set()
            server.stop()
            upstream.shutdown()
        logged = server.log_text()
        leaked = [name for name, secret in (("the API key", CALLER_KEY),
                                            ("the provider key", PROVIDER_KEY))
                  if secret in logged]
        checks.check("no configured secret appears in the server's log",
                     not leaked and logged.strip() != "",
                     f"leaked: {leaked}; {len(logged.splitlines())} lines")
    print(f"busy: {checks.passed} passed, {checks.failed} failed", flush=True)
    return 0 if checks.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
