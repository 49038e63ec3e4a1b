"""Fixtures of the Python polyglot suite.

tests/polyglot/run.sh starts the fake upstream and agentrt-server (two API
keys, users alice and bob) and passes them in the environment:
POLYGLOT_ADDR (host:port), POLYGLOT_KEY_A, POLYGLOT_KEY_B (bearer keys of
two different users), POLYGLOT_UPSTREAM (the fake upstream's host:port).
The stubs are those of the agentrt-client wheel that run.sh built from
proto/ (packages/python/build.sh) and installed into the suite's venv.
"""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.exit(f"{name} is not set: run this suite through tests/polyglot/run.sh", returncode=2)
    return value


@pytest.fixture(scope="session")
def pb():
    """The agentrt.v1 modules of the installed agentrt-client wheel, as a
    namespace with short names."""
    from agentrt.v1 import (agents_pb2, agents_pb2_grpc, common_pb2, runtime_pb2, runtime_pb2_grpc,
                            sessions_pb2, sessions_pb2_grpc)

    class Stubs:
        agents = agents_pb2
        agents_grpc = agents_pb2_grpc
        common = common_pb2
        runtime = runtime_pb2
        sessions = sessions_pb2
        runtime_grpc = runtime_pb2_grpc
        sessions_grpc = sessions_pb2_grpc

    return Stubs


class Client:
    """Both services on one channel, every call authenticated as one user."""

    def __init__(self, pb, channel: grpc.Channel, key: str) -> None:
        self.pb = pb
        self.sessions = pb.sessions_grpc.SessionServiceStub(channel)
        self.runtime = pb.runtime_grpc.AgentRuntimeStub(channel)
        self.agents = pb.agents_grpc.AgentServiceStub(channel)
        self.metadata = (("authorization", f"Bearer {key}"),)

    def call(self, method, request, timeout: float = 30.0, **kwargs):
        """Calls a stub method with this user's key; kwargs go to grpc."""
        return method(request, metadata=self.metadata, timeout=timeout, **kwargs)

    def create_session(self, title: str = "polyglot") -> str:
        return self.call(self.sessions.CreateSession, self.pb.sessions.CreateSessionRequest(title=title)).session_id

    def chat_request(self, session_id: str, text: str, **fields):
        request = self.pb.runtime.ChatRequest(session_id=session_id, **fields)
        request.content.add().text.text = text
        return request

    def chat(self, session_id: str, text: str, timeout: float = 30.0, **fields):
        """Starts a Chat; returns the streaming call (an iterator of ChatEvent)."""
        return self.call(self.runtime.Chat, self.chat_request(session_id, text, **fields), timeout=timeout)


@pytest.fixture(scope="session")
def release_gate():
    """Lets the fake upstream's `[gate]`d streams go on (POST /release)."""
    import urllib.request

    url = f"http://{_env('POLYGLOT_UPSTREAM')}/release"

    def release() -> int:
        with urllib.request.urlopen(urllib.request.Request(url, data=b"", method="POST"), timeout=10) as r:
            import json

            return json.load(r)["released"]

    return release


@pytest.fixture(scope="session")
def channel():
    ch = grpc.insecure_channel(_env("POLYGLOT_ADDR"))
    grpc.channel_ready_future(ch).result(timeout=30)
    yield ch
    ch.close()


@pytest.fixture(scope="session")
def alice(pb, channel) -> Client:
    return Client(pb, channel, _env("POLYGLOT_KEY_A"))


@pytest.fixture(scope="session")
def bob(pb, channel) -> Client:
    return Client(pb, channel, _env("POLYGLOT_KEY_B"))
