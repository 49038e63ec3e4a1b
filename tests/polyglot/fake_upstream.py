#!/usr/bin/env python3
"""A scripted, OpenAI-compatible fake model upstream for the polyglot and A2A suites.

Usage: fake_upstream.py [--port PORT]   (default 0: an ephemeral port)

Serves `POST /v1/chat/completions` on 127.0.0.1 as a streaming SSE answer
(`data: {...}` chunks, then `data: [DONE]`), in the shape agentrt's OpenAI
provider reads (`choices[0].delta.content`, `.reasoning_content`,
`.tool_calls`, a finish reason, then a chunk with `usage`). Prints exactly
one line `fake-upstream listening on 127.0.0.1:PORT` (flushed) once it
accepts connections and runs until killed. Standard library only.

The answer depends on the text of the last user message; directives may be
combined:

- default: `echo: <user text>` in 3 content deltas, usage (prompt_tokens 10,
  completion_tokens 3), finish_reason `stop`.
- `[think]`: two `reasoning_content` deltas (`thinking `, `hard`) first.
- `[tool NAME]`: while the request's last message is not a tool result, one
  tool call to NAME (id `call_1`, arguments `{"q": "<user text>"}`),
  finish_reason `tool_calls`; once it is (role `tool`), the text
  `tool said: <tool content>`.
- `[hang]`: one content delta `working`, then nothing more; the connection
  stays open until the client closes it.
- `[slow N]`: N content deltas `tick K ` (K = 1..N), 20 ms apart, then a
  normal end.
- `[gate]` (with `[slow N]`): the stream pauses after its second delta until
  `POST /release` (which lets every stream paused at that moment go on), so a
  test can attach a watcher to a live turn without racing its end.
- `[fail]`: HTTP 500 with an OpenAI-style error body.
- `[media]`: `saw: <kinds>` naming the media parts of the last user message
  in order (`image/png`, `file report.pdf`), or `saw: nothing`.

`GET /requests` answers `{"total": T, "open": O}`: the chat-completion
requests seen so far and how many of them are still being answered (a
`[hang]` request stays open until its client closes the connection).
"""

from __future__ import annotations

import argparse
import http.server
import json
import re
import sys
import threading
import time

SLOW_INTERVAL = 0.02
MAX_BODY = 16 << 20


class Gate:
    """Streams paused by `[gate]`, released together by `POST /release`."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.releases = 0
        self.waiting = 0

    def wait(self) -> None:
        with self.cond:
            seen = self.releases
            self.waiting += 1
            try:
                while self.releases == seen:
                    self.cond.wait()
            finally:
                self.waiting -= 1

    def release(self) -> int:
        """Releases the streams waiting now; returns how many there were."""
        with self.cond:
            self.releases += 1
            self.cond.notify_all()
            return self.waiting


GATE = Gate()


class Counters:
    """Requests seen and requests still open, shared by all handler threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.total = 0
        self.open = 0

    def enter(self) -> None:
        with self.lock:
            self.total += 1
            self.open += 1

    def leave(self) -> None:
        with self.lock:
            self.open -= 1

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return {"total": self.total, "open": self.open}


COUNTERS = Counters()


def message_text(message: dict) -> str:
    """The text of a chat message whose content is a string or a list of parts."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "")
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


def last_user_text(messages: list) -> str:
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return message_text(message)
    return ""


def media_parts(message: dict) -> list[str]:
    """The media parts of a chat message: image mime types, file names."""
    content = message.get("content")
    if not isinstance(content, list):
        return []
    out = []
    for part in content:
        if not isinstance(part, dict):
            continue
        if part.get("type") == "image_url":
            url = part.get("image_url", {}).get("url", "")
            out.append(url[len("data:") :].split(";", 1)[0])
        elif part.get("type") == "file":
            out.append("file " + part.get("file", {}).get("filename", ""))
    return out


def last_user(messages: list) -> dict:
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return message
    return {}


def thirds(text: str) -> list[str]:
    n = len(text)
    return [text[: n // 3], text[n // 3 : 2 * n // 3], text[2 * n // 3 :]]


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fake-upstream"

    def log_message(self, *_args) -> None:
        pass

    # ------------------------------------------------------------ helpers
    def send_json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def start_stream(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

    def raw_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def event(self, payload: str) -> None:
        self.raw_chunk(f"data: {payload}\n\n".encode())

    def chunk(self, delta: dict | None = None, finish: str | None = None) -> None:
        choice: dict = {"index": 0, "delta": delta or {}}
        if finish is not None:
            choice["finish_reason"] = finish
        self.event(json.dumps({"object": "chat.completion.chunk", "choices": [choice]}))

    def end_stream(self, reason: str) -> None:
        self.chunk(finish=reason)
        self.event(
            json.dumps(
                {
                    "object": "chat.completion.chunk",
                    "choices": [],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13},
                }
            )
        )
        self.event("[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def wait_for_close(self) -> None:
        """Blocks until the client closes the connection."""
        self.close_connection = True
        while True:
            try:
                data = self.rfile.read1(4096)
            except (ConnectionError, OSError):
                return
            if not data:
                return

    # ------------------------------------------------------------ routes
    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        if self.path.split("?", 1)[0] == "/requests":
            self.send_json(200, COUNTERS.snapshot())
        else:
            self.send_json(404, {"error": {"message": f"no route GET {self.path}"}})

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        length = int(self.headers.get("content-length") or "0")
        if length > MAX_BODY:
            self.send_json(413, {"error": {"message": "request body too large"}})
            self.close_connection = True
            return
        body = self.rfile.read(length)
        if self.path.split("?", 1)[0] == "/release":
            self.send_json(200, {"released": GATE.release()})
            return
        if self.path.split("?", 1)[0] != "/v1/chat/completions":
            self.send_json(404, {"error": {"message": f"no route POST {self.path}"}})
            return
        try:
            request = json.loads(body or b"{}")
            messages = request.get("messages") or []
        except (ValueError, AttributeError):
            self.send_json(400, {"error": {"message": "the body is not a chat completion request"}})
            return
        COUNTERS.enter()
        try:
            self.answer(messages)
        except (ConnectionError, OSError):
            # The client went away mid-answer (a Stop or a deadline).
            self.close_connection = True
        finally:
            COUNTERS.leave()

    def answer(self, messages: list) -> None:
        text = last_user_text(messages)
        if "[fail]" in text:
            self.send_json(
                500,
                {
                    "error": {
                        "message": "the fake upstream was asked to fail",
                        "type": "server_error",
                        "code": "fake_failure",
                    }
                },
            )
            return
        self.start_stream()
        if "[think]" in text:
            self.chunk({"role": "assistant", "reasoning_content": "thinking "})
            self.chunk({"reasoning_content": "hard"})
        tool = re.search(r"\[tool ([^\]\s]+)\]", text)
        slow = re.search(r"\[slow (\d+)\]", text)
        gated = "[gate]" in text
        last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
        if tool and last.get("role") == "tool":
            for piece in thirds(f"tool said: {message_text(last)}"):
                self.chunk({"content": piece})
            self.end_stream("stop")
        elif tool:
            call = {
                "index": 0,
                "id": "call_1",
                "type": "function",
                "function": {"name": tool.group(1), "arguments": json.dumps({"q": text})},
            }
            self.chunk({"role": "assistant", "tool_calls": [call]})
            self.end_stream("tool_calls")
        elif "[media]" in text:
            seen = media_parts(last_user(messages))
            for piece in thirds("saw: " + (", ".join(seen) if seen else "nothing")):
                self.chunk({"content": piece})
            self.end_stream("stop")
        elif "[hang]" in text:
            self.chunk({"content": "working"})
            self.wait_for_close()
        elif slow:
            for k in range(1, int(slow.group(1)) + 1):
                if k > 1:
                    time.sleep(SLOW_INTERVAL)
                self.chunk({"content": f"tick {k} "})
                if k == 2 and gated:
                    GATE.wait()
            self.end_stream("stop")
        else:
            for piece in thirds(f"echo: {text}"):
                self.chunk({"content": piece})
            self.end_stream("stop")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="scripted fake OpenAI-compatible upstream")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: ephemeral)")
    args = parser.parse_args(argv[1:])
    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    host, port = server.server_address[:2]
    print(f"fake-upstream listening on {host}:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
