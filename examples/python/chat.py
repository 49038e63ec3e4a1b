#!/usr/bin/env python3
"""agentrt from Python: a streamed Chat, a busy session's ErrorInfo, a stopped turn.

    pip install grpcio grpcio-tools grpcio-status googleapis-common-protos protobuf
    python examples/python/chat.py --addr 127.0.0.1:50051 [--key KEY] "Hello there"

Generates the stubs from proto/ into a temporary directory, then: creates a
session and streams the answer to PROMPT; starts a second, long turn
(--long-prompt) and shows that another Chat meanwhile is ABORTED with
ErrorInfo SESSION_BUSY; stops the long turn and shows its outcome and the
trailing status.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

REPO = Path(__file__).resolve().parents[2]


def load_stubs(out: str):
    protos = [str(p.relative_to(REPO / "proto")) for p in (REPO / "proto/agentrt/v1").glob("*.proto")]
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{REPO / 'proto'}",
                    f"--python_out={out}", f"--grpc_python_out={out}", *protos], check=True)
    sys.path.insert(0, out)
    from agentrt.v1 import runtime_pb2, runtime_pb2_grpc, sessions_pb2, sessions_pb2_grpc
    return runtime_pb2, runtime_pb2_grpc, sessions_pb2, sessions_pb2_grpc


def error_info(err: grpc.RpcError) -> error_details_pb2.ErrorInfo | None:
    """The google.rpc.ErrorInfo in the grpc-status-details-bin trailer, if any."""
    status = rpc_status.from_call(err)
    for detail in status.details if status else []:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return info
    return None


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--addr", default="127.0.0.1:50051")
    parser.add_argument("--key", default=os.environ.get("AGENTRT_TOKEN"), help="bearer key (AGENTRT_TOKEN)")
    parser.add_argument("--long-prompt", default="Write a long story about a lighthouse keeper.")
    parser.add_argument("prompt")
    args = parser.parse_args()
    metadata = [("authorization", f"Bearer {args.key}")] if args.key else []

    with tempfile.TemporaryDirectory() as out:
        runtime_pb2, runtime_grpc, sessions_pb2, sessions_grpc = load_stubs(out)
        channel = grpc.insecure_channel(args.addr)
        sessions = sessions_grpc.SessionServiceStub(channel)
        runtime = runtime_grpc.AgentRuntimeStub(channel)

        def routed(sid: str):
            # x-agentrt-session lets a mesh send a session's calls to one replica.
            return [*metadata, ("x-agentrt-session", sid)]

        def chat(sid: str, text: str):
            request = runtime_pb2.ChatRequest(session_id=sid)
            request.content.add().text.text = text
            return runtime.Chat(request, metadata=routed(sid), timeout=300)

        sid = sessions.CreateSession(sessions_pb2.CreateSessionRequest(title="example"),
                                     metadata=metadata, timeout=30).session_id
        for event in chat(sid, args.prompt):
            if event.WhichOneof("kind") == "text":
                print(event.text.text, end="", flush=True)
        print()

        # A second Chat while a turn is live: ABORTED, ErrorInfo SESSION_BUSY.
        long = chat(sid, args.long_prompt)
        for event in long:
            if event.WhichOneof("kind") == "text":
                break
        try:
            for _ in chat(sid, "and another thing"):
                pass
            print("the long turn had already finished: no SESSION_BUSY to show")
        except grpc.RpcError as err:
            info = error_info(err)
            if err.code() != grpc.StatusCode.ABORTED or info is None:
                raise
            print(f"busy: {err.code().name} {info.reason} turn_id={info.metadata['turn_id']}")

        # Stop it: the stream still ends with turn_finished; the trailing
        # status (CANCELLED) arrives after it as an RpcError.
        runtime.StopSession(runtime_pb2.StopSessionRequest(session_id=sid), metadata=routed(sid), timeout=30)
        outcome = None
        try:
            for event in long:
                if event.WhichOneof("kind") == "turn_finished":
                    outcome = sessions_pb2.TurnOutcome.Name(event.turn_finished.outcome)
            trailing = "OK"
        except grpc.RpcError as err:
            trailing = err.code().name
        print(f"stopped: outcome {outcome}, trailing status {trailing}")
        channel.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
