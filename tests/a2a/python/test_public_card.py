"""The public agent card over HTTP, as the SDK discovers an agent: run.sh
starts a second agentrt-server whose `[a2a] public_url`
(AGENTRT_A2A_PUBLIC_URL) is the first server's address. The SDK's card
resolver reads the card from the second one's well-known path, and its
client follows the card's URL to the first: the task it creates lives
there."""

from __future__ import annotations

import uuid

import grpc
import httpx
import pytest
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.client.transports.grpc import GrpcTransport
from a2a.types import a2a_pb2
from a2a.types.a2a_pb2 import GetTaskRequest, Message, Part, SendMessageRequest, TaskState
from conftest import env

pytestmark = pytest.mark.asyncio


async def test_the_sdk_reads_the_public_card_and_follows_its_url(ctx, target):
    card_base = env("A2A_CARD_BASE")
    public_url = env("A2A_PUBLIC_URL")
    async with httpx.AsyncClient(timeout=10) as http:
        card = await A2ACardResolver(http, card_base).get_agent_card()
    assert [(i.protocol_binding, i.url, i.protocol_version) for i in card.supported_interfaces] == [
        ("GRPC", public_url, "1.0")
    ]
    assert card.name == "agentrt"
    assert card.capabilities.extended_agent_card is True
    assert card.security_schemes["bearer"].http_auth_security_scheme.scheme == "Bearer"
    # Server tools are for callers with credentials (the extended card).
    assert [s.id for s in card.skills] == ["chat"]

    config = ClientConfig(
        streaming=False,
        grpc_channel_factory=grpc.aio.insecure_channel,
        supported_protocol_bindings=["GRPC"],
    )
    client = ClientFactory(config).create(card)
    message = Message(
        message_id=str(uuid.uuid4()),
        role=a2a_pb2.ROLE_USER,
        parts=[Part(text="where are you")],
    )
    try:
        events = [e async for e in client.send_message(SendMessageRequest(message=message), context=ctx)]
    finally:
        await client.close()
    assert len(events) == 1 and events[0].WhichOneof("payload") == "task"
    task = events[0].task
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    assert task.artifacts[0].parts[0].text == "echo: where are you"

    # The server the card named ran it (the card's own server has another store).
    transport = GrpcTransport(grpc.aio.insecure_channel(target), None)
    try:
        stored = await transport.get_task(GetTaskRequest(id=task.id), context=ctx)
    finally:
        await transport.close()
    assert stored.id == task.id
    assert stored.status.state == TaskState.TASK_STATE_COMPLETED
