"""Fixtures of the A2A suite: the server run.sh started, reached through the
official SDK's own gRPC transport (a2a-sdk, `a2a.client.transports.grpc`).

run.sh exports A2A_TARGET (host:port of agentrt-server), A2A_KEY (a valid
API key), A2A_OTHER_KEY (another user's key), UPSTREAM_URL (the fake
upstream, for its request counters), and A2A_CARD_BASE (the HTTP base URL
of a second server whose public card names A2A_PUBLIC_URL, the first
server's address).
"""

from __future__ import annotations

import os

import grpc
import pytest
import pytest_asyncio
from a2a.client import ClientCallContext, ClientConfig, ClientFactory
from a2a.client.transports.grpc import GrpcTransport
from a2a.types.a2a_pb2 import GetExtendedAgentCardRequest


def env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set: run the suite through tests/a2a/run.sh")
    return value


@pytest.fixture(scope="session")
def target() -> str:
    return env("A2A_TARGET")


@pytest.fixture(scope="session")
def upstream_url() -> str:
    return env("UPSTREAM_URL")


def call_context(key: str | None) -> ClientCallContext:
    """Per-call service parameters: the bearer key (the SDK sends them as
    gRPC metadata, next to its own `a2a-version`)."""
    params = {} if key is None else {"authorization": f"Bearer {key}"}
    return ClientCallContext(service_parameters=params, timeout=30)


@pytest.fixture
def ctx() -> ClientCallContext:
    return call_context(env("A2A_KEY"))


@pytest.fixture
def other_ctx() -> ClientCallContext:
    return call_context(env("A2A_OTHER_KEY"))


@pytest_asyncio.fixture
async def transport(target):
    """The SDK's gRPC transport without a card: what a caller uses to read
    the card over gRPC (GetExtendedAgentCard)."""
    t = GrpcTransport(grpc.aio.insecure_channel(target), None)
    yield t
    await t.close()


@pytest_asyncio.fixture
async def card(transport, ctx):
    return await transport.get_extended_agent_card(
        GetExtendedAgentCardRequest(), context=ctx
    )


@pytest_asyncio.fixture
async def client(card):
    """The SDK's client for the card the server published (gRPC chosen from
    its supported_interfaces, streaming on)."""
    config = ClientConfig(
        streaming=True,
        grpc_channel_factory=grpc.aio.insecure_channel,
        supported_protocol_bindings=["GRPC"],
    )
    c = ClientFactory(config).create(card)
    yield c
    await c.close()
