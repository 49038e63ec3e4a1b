"""agentrt's A2A gRPC binding driven by the official Python SDK (a2a-sdk):
its client, its gRPC transport, its typed errors."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
import uuid

import grpc
import pytest
from a2a.client import A2AClientError
from a2a.types import a2a_pb2
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetExtendedAgentCardRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.errors import (
    ContentTypeNotSupportedError,
    InvalidParamsError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from conftest import call_context
from google.protobuf import descriptor_pb2, json_format, struct_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

pytestmark = pytest.mark.asyncio


def request(text: str, context_id: str = "", task_id: str = "") -> SendMessageRequest:
    return SendMessageRequest(
        message=Message(
            message_id=str(uuid.uuid4()),
            context_id=context_id,
            task_id=task_id,
            role=a2a_pb2.ROLE_USER,
            parts=[Part(text=text)],
        )
    )


def kind(event) -> str:
    return event.WhichOneof("payload")


def artifact_text(events) -> str:
    return "".join(
        p.text
        for e in events
        if kind(e) == "artifact_update"
        for p in e.artifact_update.artifact.parts
    )


def final_state(events) -> int:
    updates = [e for e in events if kind(e) == "status_update"]
    assert updates, f"no status update in {events}"
    return updates[-1].status_update.status.state


async def read_until(stream, predicate):
    """Reads `stream` until an event satisfies `predicate`; returns all read."""
    seen = []
    async for event in stream:
        seen.append(event)
        if predicate(event):
            return seen
    raise AssertionError(f"the stream ended before the awaited event: {seen}")


def is_working(event) -> bool:
    return (
        kind(event) == "status_update"
        and event.status_update.status.state == TaskState.TASK_STATE_WORKING
    )


def upstream_open(upstream_url: str) -> int:
    with urllib.request.urlopen(f"{upstream_url}/requests", timeout=5) as r:
        return json.load(r)["open"]


def wait_upstream_closed(upstream_url: str, deadline_s: float = 10.0) -> None:
    """Asks the fake upstream until it reports no open request: it notices
    agentrt's closed connection on its own thread, a moment after the turn
    ended. Each ask is a round trip; there is no sleep."""
    end = time.monotonic() + deadline_s
    while upstream_open(upstream_url) != 0:
        if time.monotonic() > end:
            raise AssertionError("the upstream request stayed open after the cancel")


async def test_the_agent_card_describes_the_grpc_interface(card, target):
    assert card.name == "agentrt"
    assert card.capabilities.streaming is True
    assert card.capabilities.push_notifications is False
    interfaces = [(i.protocol_binding, i.url, i.protocol_version) for i in card.supported_interfaces]
    assert interfaces == [("GRPC", target, "1.0")]
    assert card.security_schemes["bearer"].http_auth_security_scheme.scheme == "Bearer"
    assert [list(r.schemes) for r in card.security_requirements] == [["bearer"]]
    assert "chat" in [s.id for s in card.skills]


async def test_a_streamed_message_runs_to_completion(client, ctx):
    events = [e async for e in client.send_message(request("hello a2a"), context=ctx)]
    assert kind(events[0]) == "task"
    task = events[0].task
    assert task.status.state == TaskState.TASK_STATE_SUBMITTED
    assert task.context_id and task.id
    assert [p.text for p in task.history[0].parts] == ["hello a2a"]
    assert is_working(events[1])
    chunks = [e.artifact_update for e in events if kind(e) == "artifact_update"]
    assert artifact_text(events) == "echo: hello a2a"
    assert [c.last_chunk for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert [c.append for c in chunks] == [False] + [True] * (len(chunks) - 1)
    last = events[-1].status_update
    assert last.status.state == TaskState.TASK_STATE_COMPLETED
    assert [p.text for p in last.status.message.parts] == ["echo: hello a2a"]
    assert all(e.task_id == task.id for e in (c for c in chunks))

    stored = await client.get_task(GetTaskRequest(id=task.id), context=ctx)
    assert stored.status.state == TaskState.TASK_STATE_COMPLETED
    assert stored.artifacts[0].parts[0].text == "echo: hello a2a"
    assert [(m.role, m.parts[0].text) for m in stored.history] == [
        (a2a_pb2.ROLE_USER, "hello a2a"),
        (a2a_pb2.ROLE_AGENT, "echo: hello a2a"),
    ]

    # The next message in the same context is the next task; the session
    # keeps the history.
    again = [
        e
        async for e in client.send_message(
            request("second", context_id=task.context_id), context=ctx
        )
    ]
    assert again[0].task.context_id == task.context_id
    assert again[0].task.id != task.id
    assert artifact_text(again) == "echo: second"


async def test_a_non_streaming_message_returns_the_finished_task(card, ctx, target):
    from a2a.client import ClientConfig, ClientFactory

    config = ClientConfig(
        streaming=False,
        grpc_channel_factory=grpc.aio.insecure_channel,
        supported_protocol_bindings=["GRPC"],
    )
    c = ClientFactory(config).create(card)
    try:
        events = [e async for e in c.send_message(request("blocking"), context=ctx)]
    finally:
        await c.close()
    assert len(events) == 1 and kind(events[0]) == "task"
    assert events[0].task.status.state == TaskState.TASK_STATE_COMPLETED
    assert events[0].task.artifacts[0].parts[0].text == "echo: blocking"


async def test_cancel_ends_a_hanging_task_and_closes_the_upstream_request(client, ctx, upstream_url):
    stream = client.send_message(request("[hang] please"), context=ctx)
    seen = await read_until(stream, is_working)
    task_id = seen[0].task.id
    canceled = await client.cancel_task(CancelTaskRequest(id=task_id), context=ctx)
    assert canceled.id == task_id
    assert canceled.status.state == TaskState.TASK_STATE_CANCELED
    rest = [e async for e in stream]
    assert final_state(rest) == TaskState.TASK_STATE_CANCELED
    wait_upstream_closed(upstream_url)
    with pytest.raises(TaskNotCancelableError):
        await client.cancel_task(CancelTaskRequest(id=task_id), context=ctx)


def release_gate(upstream_url: str) -> int:
    """Lets the fake upstream's `[gate]`d streams go on; how many waited."""
    req = urllib.request.Request(f"{upstream_url}/release", data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.load(r)["released"]


async def test_resubscribe_after_a_disconnect_misses_nothing(client, ctx, upstream_url):
    expected = "".join(f"tick {k} " for k in range(1, 41))
    # [gate]: the upstream pauses after "tick 2 " until released, so the task
    # is still live when the caller comes back (no race with its end).
    stream = client.send_message(request("[slow 40] [gate]"), context=ctx)
    seen = []
    async for event in stream:
        seen.append(event)
        if sum(1 for e in seen if kind(e) == "artifact_update") == 2:
            break
    await stream.aclose()  # the caller goes away mid-task
    task_id = seen[0].task.id
    assert artifact_text(seen) == "tick 1 tick 2 "

    resub = client.subscribe(SubscribeToTaskRequest(id=task_id), context=ctx)
    resumed = []
    async for event in resub:  # the replay, up to where the upstream waits
        resumed.append(event)
        if artifact_text(resumed) == "tick 1 tick 2 ":
            break
    assert kind(resumed[0]) == "task" and resumed[0].task.id == task_id
    assert release_gate(upstream_url) == 1
    resumed += [e async for e in resub]
    assert artifact_text(resumed) == expected
    assert final_state(resumed) == TaskState.TASK_STATE_COMPLETED

    with pytest.raises(UnsupportedOperationError):
        async for _ in client.subscribe(SubscribeToTaskRequest(id=task_id), context=ctx):
            pass
    stored = await client.get_task(GetTaskRequest(id=task_id), context=ctx)
    assert stored.artifacts[0].parts[0].text == expected


async def test_unknown_tasks_raise_task_not_found(client, ctx, other_ctx):
    for bogus in ["nope", "no-such-context/0190", ""]:
        with pytest.raises(TaskNotFoundError):
            await client.get_task(GetTaskRequest(id=bogus), context=ctx)
    with pytest.raises(TaskNotFoundError):
        await client.cancel_task(CancelTaskRequest(id="nope/nope"), context=ctx)
    with pytest.raises(TaskNotFoundError):
        async for _ in client.subscribe(SubscribeToTaskRequest(id="nope/nope"), context=ctx):
            pass
    # Another user's task is not found either.
    events = [e async for e in client.send_message(request("mine"), context=ctx)]
    with pytest.raises(TaskNotFoundError):
        await client.get_task(GetTaskRequest(id=events[0].task.id), context=other_ctx)
    with pytest.raises(TaskNotFoundError):
        async for _ in client.send_message(
            request("intrude", context_id=events[0].task.context_id), context=other_ctx
        ):
            pass


async def test_list_tasks_pages_a_contexts_tasks_newest_first(client, ctx, other_ctx):
    first = [e async for e in client.send_message(request("one"), context=ctx)]
    context_id, older = first[0].task.context_id, first[0].task.id
    second = [
        e async for e in client.send_message(request("two", context_id=context_id), context=ctx)
    ]
    newer = second[0].task.id
    page = await client.list_tasks(
        ListTasksRequest(context_id=context_id, page_size=1), context=ctx
    )
    assert [t.id for t in page.tasks] == [newer]
    assert (page.page_size, page.total_size) == (1, 2)
    assert page.next_page_token
    assert not page.tasks[0].artifacts, "artifacts only when asked for"
    rest = await client.list_tasks(
        ListTasksRequest(
            context_id=context_id,
            page_size=1,
            page_token=page.next_page_token,
            include_artifacts=True,
        ),
        context=ctx,
    )
    assert [t.id for t in rest.tasks] == [older]
    assert not rest.next_page_token
    task = rest.tasks[0]
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    assert task.artifacts[0].parts[0].text == "echo: one"
    assert task == await client.get_task(GetTaskRequest(id=older), context=ctx)
    # A status filter; another user's context lists nothing.
    canceled = await client.list_tasks(
        ListTasksRequest(context_id=context_id, status=TaskState.TASK_STATE_CANCELED),
        context=ctx,
    )
    assert (list(canceled.tasks), canceled.total_size) == ([], 0)
    theirs = await client.list_tasks(ListTasksRequest(context_id=context_id), context=other_ctx)
    assert (list(theirs.tasks), theirs.total_size) == ([], 0)
    # agentrt lists one context's tasks: without one the call says so.
    with pytest.raises(InvalidParamsError) as refused:
        await client.list_tasks(ListTasksRequest(), context=ctx)
    assert "context_id" in str(refused.value)


async def test_a_message_to_a_busy_context_waits_submitted_then_runs(client, ctx, upstream_url):
    stream = client.send_message(request("[hang] busy"), context=ctx)
    seen = await read_until(stream, is_working)
    task = seen[0].task
    # A2A has no busy error: the second message waits in the context's
    # inbox as a SUBMITTED task and runs once the first task has ended.
    queued = client.send_message(request("me too", context_id=task.context_id), context=ctx)
    first = await queued.__anext__()
    assert kind(first) == "task"
    assert first.task.status.state == TaskState.TASK_STATE_SUBMITTED
    assert first.task.id != task.id and first.task.context_id == task.context_id
    got = await client.get_task(GetTaskRequest(id=first.task.id), context=ctx)
    assert got.status.state == TaskState.TASK_STATE_SUBMITTED
    await client.cancel_task(CancelTaskRequest(id=task.id), context=ctx)
    assert final_state([e async for e in stream]) == TaskState.TASK_STATE_CANCELED
    rest = [e async for e in queued]
    assert is_working(rest[0])
    assert artifact_text(rest) == "echo: me too"
    assert final_state(rest) == TaskState.TASK_STATE_COMPLETED
    assert all(e_task_id(e) == first.task.id for e in rest)


def e_task_id(event) -> str:
    payload = getattr(event, kind(event))
    return payload.task_id


async def test_missing_or_wrong_keys_are_unauthenticated(client, transport):
    for key in [None, "wrong-key"]:
        with pytest.raises(A2AClientError) as err:
            await transport.get_extended_agent_card(
                GetExtendedAgentCardRequest(), context=call_context(key)
            )
        assert "UNAUTHENTICATED" in str(err.value)
        with pytest.raises(A2AClientError) as err:
            async for _ in client.send_message(request("hi"), context=call_context(key)):
                pass
        assert "UNAUTHENTICATED" in str(err.value)


async def test_unsupported_parts_and_operations_raise_the_a2a_errors(client, ctx):
    data = SendMessageRequest(
        message=Message(
            message_id=str(uuid.uuid4()),
            role=a2a_pb2.ROLE_USER,
            parts=[Part(data=struct_pb2.Value(string_value="x"))],
        )
    )
    with pytest.raises(ContentTypeNotSupportedError):
        async for _ in client.send_message(data, context=ctx):
            pass
    with pytest.raises(PushNotificationNotSupportedError):
        await client.create_task_push_notification_config(
            TaskPushNotificationConfig(task_id="a/b", url="https://example.invalid/hook"),
            context=ctx,
        )


def normalized(fd: descriptor_pb2.FileDescriptorProto) -> dict:
    """What decides wire compatibility: messages (fields: name, number, type,
    label, type name, oneof, proto3 optional, options), oneofs, enums,
    services and RPCs; file options apart."""

    def message(m):
        return {
            "fields": {
                f.name: (
                    f.number,
                    f.type,
                    f.label,
                    f.type_name,
                    f.oneof_index if f.HasField("oneof_index") else None,
                    f.proto3_optional,
                    f.options.SerializeToString(deterministic=True),
                )
                for f in m.field
            },
            "oneofs": [o.name for o in m.oneof_decl],
            "nested": {n.name: message(n) for n in m.nested_type},
            "options": m.options.SerializeToString(deterministic=True),
        }

    return {
        "package": fd.package,
        "dependency": list(fd.dependency),
        "messages": {m.name: message(m) for m in fd.message_type},
        "enums": {e.name: [(v.name, v.number) for v in e.value] for e in fd.enum_type},
        "services": {
            s.name: {
                r.name: (r.input_type, r.output_type, r.client_streaming, r.server_streaming)
                for r in s.method
            }
            for s in fd.service
        },
    }


async def test_the_served_descriptor_matches_the_sdks_but_for_the_documented_differences(target):
    """The vendored a2a.proto, compiled by protox into the server and read
    back through its reflection service, against the descriptor a2a-sdk was
    generated from. The differences are exactly those proto/lf/a2a/v1/README.md
    lists."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        responses = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(file_containing_symbol="lf.a2a.v1.A2AService")])
        )
        files = {}
        async for response in responses:
            for raw in response.file_descriptor_response.file_descriptor_proto:
                fd = descriptor_pb2.FileDescriptorProto.FromString(raw)
                files[fd.name] = fd
    ours = files["lf/a2a/v1/a2a.proto"]
    sdk = descriptor_pb2.FileDescriptorProto()
    a2a_pb2.DESCRIPTOR.CopyToProto(sdk)

    a, b = normalized(ours), normalized(sdk)
    # 1. QuerySkill and its messages and enum are in the vendored (newer) file only.
    assert set(a["services"]["A2AService"]) - set(b["services"]["A2AService"]) == {"QuerySkill"}
    del a["services"]["A2AService"]["QuerySkill"]
    assert set(a["messages"]) - set(b["messages"]) == {"SkillQueryRequest", "SkillQueryResult"}
    del a["messages"]["SkillQueryRequest"], a["messages"]["SkillQueryResult"]
    assert set(a["enums"]) - set(b["enums"]) == {"SkillSupportLevel"}
    del a["enums"]["SkillSupportLevel"]
    # 2. AgentCapabilities.skill_query (5, optional bool) likewise.
    caps = a["messages"]["AgentCapabilities"]
    assert caps["fields"].pop("skill_query")[:2] == (5, descriptor_pb2.FieldDescriptorProto.TYPE_BOOL)
    assert caps["oneofs"].pop() == "_skill_query"
    assert a == b

    # 3. File options: the language packages differ, nothing else.
    differing = {
        f.name
        for f in descriptor_pb2.FileOptions.DESCRIPTOR.fields
        if getattr(ours.options, f.name) != getattr(sdk.options, f.name)
    }
    assert differing == {
        "java_package",
        "java_outer_classname",
        "objc_class_prefix",
        "php_namespace",
        "php_metadata_namespace",
        "ruby_package",
    }


async def test_a_caller_tool_call_is_input_required_and_its_result_resumes(client, ctx):
    req = request("[tool lookup] the answer")
    req.metadata.update(
        {
            "agentrt_extra_tools": [
                {"name": "lookup", "description": "looks it up", "parameters": {"type": "object"}}
            ]
        }
    )
    events = [e async for e in client.send_message(req, context=ctx)]
    task = events[0].task
    last = events[-1].status_update.status
    assert last.state == TaskState.TASK_STATE_INPUT_REQUIRED
    call = json_format.MessageToDict(last.message.parts[0].data)["tool_call"]
    assert (call["call_id"], call["name"]) == ("call_1", "lookup")
    assert call["arguments"] == {"q": "[tool lookup] the answer"}

    answer = SendMessageRequest(
        message=Message(
            message_id=str(uuid.uuid4()),
            task_id=task.id,
            role=a2a_pb2.ROLE_USER,
            parts=[Part(data=json_format.ParseDict({"call_id": "call_1", "content": "42"}, struct_pb2.Value()))],
        )
    )
    resumed = [e async for e in client.send_message(answer, context=ctx)]
    assert kind(resumed[0]) == "task" and resumed[0].task.id == task.id
    assert artifact_text(resumed) == "tool said: 42"
    assert final_state(resumed) == TaskState.TASK_STATE_COMPLETED


async def test_a_server_tool_call_awaiting_approval_is_input_required_and_a_denial_resumes(client, ctx):
    req = request("[tool t__echo] please")
    req.metadata.update({"agentrt_require_approval": ["*"]})
    events = [e async for e in client.send_message(req, context=ctx)]
    task = events[0].task
    last = events[-1].status_update.status
    assert last.state == TaskState.TASK_STATE_INPUT_REQUIRED
    asked = json_format.MessageToDict(last.message.parts[0].data)["approval_required"]
    assert (asked["call_id"], asked["name"]) == ("call_1", "t__echo")

    decision = SendMessageRequest(
        message=Message(
            message_id=str(uuid.uuid4()),
            task_id=task.id,
            role=a2a_pb2.ROLE_USER,
            parts=[
                Part(
                    data=json_format.ParseDict(
                        {"call_id": "call_1", "approved": False, "reason": "not now"}, struct_pb2.Value()
                    )
                )
            ],
        )
    )
    resumed = [e async for e in client.send_message(decision, context=ctx)]
    assert kind(resumed[0]) == "task" and resumed[0].task.id == task.id
    said = artifact_text(resumed)
    assert said.startswith("tool said: ") and "denied" in said and "not now" in said, said
    assert final_state(resumed) == TaskState.TASK_STATE_COMPLETED
