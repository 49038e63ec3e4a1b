#!/usr/bin/env python3
"""agentrt from Python: a streamed Chat, a busy session's ErrorInfo, a stopped turn.

    packages/python/build.sh            # prints the wheel's path
    pip install packages/python/dist/agentrt_client-0.1.0-py3-none-any.whl
    python examples/python/chat.py --addr 127.0.0.1:50051 [--key KEY] "Hello there"

With the agentrt-client package: creates a session and streams the answer
to PROMPT; starts a second, long turn (--long-prompt) and shows that another
Chat meanwhile fails with AgentrtError ABORTED, ErrorInfo SESSION_BUSY;
stops the long turn and shows its outcome and the trailing status.
"""

from __future__ import annotations

import argparse
import os
import sys

import agentrt
from agentrt.v1 import sessions_pb2


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--addr", default="127.0.0.1:50051", help="http://HOST:PORT, https://HOST:PORT or HOST:PORT")
    parser.add_argument("--key", default=os.environ.get("AGENTRT_TOKEN"), help="bearer key (AGENTRT_TOKEN)")
    parser.add_argument("--long-prompt", default="Write a long story about a lighthouse keeper.")
    parser.add_argument("prompt")
    args = parser.parse_args()

    with agentrt.connect(args.addr, token=args.key) as client:
        sid = client.create_session(title="example").session_id
        for event in client.chat(sid, args.prompt, timeout=300):
            if event.WhichOneof("kind") == "text":
                print(event.text.text, end="", flush=True)
        print()

        # A second Chat while a turn is live: ABORTED, ErrorInfo SESSION_BUSY.
        long = client.chat(sid, args.long_prompt, timeout=300)
        for event in long:
            if event.WhichOneof("kind") == "text":
                break
        try:
            for _ in client.chat(sid, "and another thing"):
                pass
            print("the long turn had already finished: no SESSION_BUSY to show")
        except agentrt.AgentrtError as err:
            if err.error_info is None:
                raise
            print(f"busy: {err.code.name} {err.reason} turn_id={err.error_info.metadata['turn_id']}")

        # Stop it: the stream still ends with turn_finished; the trailing
        # status (CANCELLED) comes after it, as the stream's error.
        client.stop(sid)
        events, trailing = long.drain()
        outcome = None
        for event in events:
            if event.WhichOneof("kind") == "turn_finished":
                outcome = sessions_pb2.TurnOutcome.Name(event.turn_finished.outcome)
        print(f"stopped: outcome {outcome}, trailing status {trailing.code.name if trailing else 'OK'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
