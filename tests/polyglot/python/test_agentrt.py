"""The polyglot scenarios through Python grpcio against agentrt-server and
the scripted fake upstream (tests/polyglot/fake_upstream.py)."""

from __future__ import annotations

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status


def kind(event) -> str:
    return event.WhichOneof("kind")


def read_until(stream, predicate) -> list:
    """Reads events until one satisfies predicate; returns them all (the last
    one matched). Fails when the stream ends first."""
    seen = []
    for event in stream:
        seen.append(event)
        if predicate(event):
            return seen
    pytest.fail(f"the stream ended before the awaited event; kinds: {[kind(e) for e in seen]}")


def drain(stream) -> tuple[list, grpc.RpcError | None]:
    """Reads a stream to its end: the events and the trailing error (None when OK)."""
    events = []
    try:
        for event in stream:
            events.append(event)
    except grpc.RpcError as err:
        return events, err
    return events, None


def text_of(events) -> str:
    return "".join(e.text.text for e in events if kind(e) == "text")


def finished(events):
    done = [e.turn_finished for e in events if kind(e) == "turn_finished"]
    assert len(done) == 1, f"expected one turn_finished, kinds: {[kind(e) for e in events]}"
    return done[0]


def error_info(err: grpc.RpcError) -> error_details_pb2.ErrorInfo:
    """The google.rpc.ErrorInfo carried in the grpc-status-details-bin trailer."""
    status = rpc_status.from_call(err)
    assert status is not None, f"no grpc-status-details-bin on {err.code()}: {err.details()}"
    assert status.code == err.code().value[0]
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    pytest.fail(f"no ErrorInfo among the details of {err.code()}: {[d.type_url for d in status.details]}")


def test_a_turn_yields_every_event_kind_and_is_stored(pb, alice):
    sid = alice.create_session()
    events = list(alice.chat(sid, "hello [think]"))
    kinds = [kind(e) for e in events]
    assert kinds[0] == "turn_started" and kinds[-1] == "turn_finished", kinds
    for expected in ("reasoning", "text", "step", "message_stored", "usage"):
        assert expected in kinds, f"no {expected} event in {kinds}"
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert {e.turn_id for e in events} == {events[0].turn_id} and events[0].turn_id
    assert all(e.session_id == sid for e in events)
    assert "".join(e.reasoning.text for e in events if kind(e) == "reasoning") == "thinking hard"
    answer = text_of(events)
    assert answer == "echo: hello [think]"
    assert finished(events).outcome == pb.sessions.TURN_OUTCOME_SUCCESS
    usage = [e.usage.usage for e in events if kind(e) == "usage"]
    assert usage[0].input_tokens == 10 and usage[0].output_tokens == 3
    stored_roles = [e.message_stored.role for e in events if kind(e) == "message_stored"]
    assert stored_roles == [pb.common.ROLE_USER, pb.common.ROLE_ASSISTANT]

    history = alice.call(alice.sessions.GetHistory, pb.sessions.GetHistoryRequest(session_id=sid)).messages
    assert [m.role for m in history] == [pb.common.ROLE_USER, pb.common.ROLE_ASSISTANT]
    assert "".join(b.text.text for b in history[0].content) == "hello [think]"
    assert "".join(b.text.text for b in history[1].content if b.WhichOneof("block") == "text") == answer

    turns = alice.call(alice.sessions.ListTurns, pb.sessions.ListTurnsRequest(session_id=sid)).turns
    assert [t.turn_id for t in turns] == [events[0].turn_id]
    assert turns[0].outcome == pb.sessions.TURN_OUTCOME_SUCCESS and turns[0].steps == 1
    assert turns[0].usage.input_tokens == 10 and turns[0].user_message_seq == history[0].seq
    one = alice.call(alice.sessions.GetTurn, pb.sessions.GetTurnRequest(session_id=sid, turn_id=turns[0].turn_id))
    assert one == turns[0]


def test_a_second_chat_on_a_busy_session_is_aborted_with_session_busy(pb, alice):
    sid = alice.create_session()
    live = alice.chat(sid, "[hang]")
    first = read_until(live, lambda e: kind(e) == "text")
    turn_id = first[0].turn_id
    try:
        with pytest.raises(grpc.RpcError) as caught:
            list(alice.chat(sid, "me too"))
        err = caught.value
        assert err.code() == grpc.StatusCode.ABORTED, err
        info = error_info(err)
        assert info.reason == "SESSION_BUSY"
        assert info.domain == "agentrt"
        assert info.metadata["turn_id"] == turn_id
    finally:
        stopped = alice.call(alice.runtime.StopSession, pb.runtime.StopSessionRequest(session_id=sid))
    assert stopped.stopped
    events, _ = drain(live)
    assert finished(events).outcome == pb.sessions.TURN_OUTCOME_CANCELED


def test_subscribe_after_seq_resumes_with_the_next_event(pb, alice, release_gate):
    sid = alice.create_session()
    # [gate]: the upstream pauses after "tick 2 " until released, so the turn
    # is still live when the watcher attaches (no race with its end).
    chat = alice.chat(sid, "[slow 30] [gate]", on_disconnect=pb.runtime.ON_DISCONNECT_CONTINUE)
    seen = read_until(chat, lambda e: kind(e) == "text" and e.text.text == "tick 2 ")
    turn_id, seq = seen[-1].turn_id, seen[-1].seq
    # after_seq one before "tick 2 ": the replay starts with it, which also
    # shows the watcher is attached before the upstream is released.
    watch = alice.call(alice.runtime.Subscribe, pb.runtime.SubscribeRequest(session_id=sid, after_seq=seq - 1))
    first = next(watch)
    assert (first.seq, kind(first), first.text.text) == (seq, "text", "tick 2 ")
    chat.cancel()  # the turn runs on (CONTINUE); the watcher sees the rest
    assert release_gate() == 1
    rest, err = drain(watch)
    events = [first, *rest]
    assert err is None, err
    assert [e.seq for e in events] == list(range(seq, seq + len(events)))
    assert {e.turn_id for e in events} == {turn_id}
    assert kind(events[-1]) == "turn_finished"
    assert finished(events).outcome == pb.sessions.TURN_OUTCOME_SUCCESS
    ticks = text_of(seen) + text_of(rest)
    assert ticks == "".join(f"tick {k} " for k in range(1, 31))


def test_stop_cancels_the_live_turn(pb, alice):
    sid = alice.create_session()
    live = alice.chat(sid, "[hang]")
    read_until(live, lambda e: kind(e) == "text")
    stopped = alice.call(alice.runtime.StopSession, pb.runtime.StopSessionRequest(session_id=sid))
    assert stopped.stopped is True
    events, err = drain(live)
    done = finished(events)
    assert kind(events[-1]) == "turn_finished"
    assert done.outcome == pb.sessions.TURN_OUTCOME_CANCELED
    assert done.cancel_reason == pb.runtime.CANCEL_REASON_STOPPED
    # The trailing status of a stopped turn: CANCELLED, after turn_finished.
    assert err is not None and err.code() == grpc.StatusCode.CANCELLED, err
    again = alice.call(alice.runtime.StopSession, pb.runtime.StopSessionRequest(session_id=sid))
    assert again.stopped is False


def test_a_caller_executed_tool_gets_its_result(pb, alice):
    sid = alice.create_session()
    tool = pb.runtime.ToolDefinition(
        name="lookup", description="looks a word up",
        parameters_json_schema='{"type":"object","properties":{"q":{"type":"string"}}}',
    )
    chat = alice.chat(sid, "find it [tool lookup]", extra_tools=[tool])
    seen = read_until(chat, lambda e: kind(e) == "tool_call")
    call = seen[-1].tool_call
    assert call.name == "lookup" and call.call_id == "call_1"
    assert call.arguments_json.replace(" ", "") == '{"q":"findit[toollookup]"}'
    alice.call(alice.runtime.SubmitToolResult, pb.runtime.SubmitToolResultRequest(
        session_id=sid, turn_id=seen[-1].turn_id, call_id=call.call_id, content="forty-two"))
    rest, err = drain(chat)
    assert err is None, err
    assert text_of(rest) == "tool said: forty-two"
    assert finished(rest).outcome == pb.sessions.TURN_OUTCOME_SUCCESS
    assert [e.seq for e in seen + rest] == list(range(1, len(seen) + len(rest) + 1))


def _waiting_on_a_tool(pb, alice, sid):
    """A turn paused on caller tool `wait`: its stream and tool_call event."""
    tool = pb.runtime.ToolDefinition(
        name="wait", description="waits for the caller",
        parameters_json_schema='{"type":"object","properties":{}}',
    )
    chat = alice.chat(sid, "first [tool wait]", extra_tools=[tool])
    seen = read_until(chat, lambda e: kind(e) == "tool_call")
    return chat, seen[-1]


def test_enqueue_queues_a_message_that_runs_as_its_own_turn_after_the_live_one(pb, alice):
    sid = alice.create_session()
    first, call = _waiting_on_a_tool(pb, alice, sid)
    queued = alice.chat(sid, "second", on_busy=pb.runtime.ON_BUSY_ENQUEUE)
    head = next(queued)
    assert kind(head) == "queued" and head.queued.position == 1
    status = alice.call(alice.runtime.GetSessionStatus, pb.runtime.GetSessionStatusRequest(session_id=sid))
    assert [q.id for q in status.queued] == [head.turn_id]
    alice.call(alice.runtime.SubmitToolResult, pb.runtime.SubmitToolResultRequest(
        session_id=sid, turn_id=call.turn_id, call_id=call.tool_call.call_id, content="done"))
    rest, err = drain(first)
    assert err is None, err
    assert finished(rest).outcome == pb.sessions.TURN_OUTCOME_SUCCESS
    rest, err = drain(queued)
    assert err is None, err
    assert kind(rest[0]) == "turn_started"
    assert {e.turn_id for e in rest} == {head.turn_id}
    assert text_of(rest) == "echo: second"
    assert finished(rest).outcome == pb.sessions.TURN_OUTCOME_SUCCESS


def test_steer_joins_the_live_turn_at_its_next_step(pb, alice):
    sid = alice.create_session()
    first, call = _waiting_on_a_tool(pb, alice, sid)
    steer = alice.chat(sid, "and this too", on_busy=pb.runtime.ON_BUSY_STEER)
    alice.call(alice.runtime.SubmitToolResult, pb.runtime.SubmitToolResultRequest(
        session_id=sid, turn_id=call.turn_id, call_id=call.tool_call.call_id, content="done"))
    events, err = drain(steer)
    assert err is None, err
    assert kind(events[0]) == "steered" and events[0].steered.message_seq > 0
    assert {e.turn_id for e in events} == {call.turn_id}
    # The next model request's last user message is the steering one.
    assert text_of(events) == "echo: and this too"
    assert finished(events).outcome == pb.sessions.TURN_OUTCOME_SUCCESS
    rest, err = drain(first)
    assert err is None, err
    assert finished(rest).outcome == pb.sessions.TURN_OUTCOME_SUCCESS
    history = alice.call(alice.sessions.GetHistory, pb.sessions.GetHistoryRequest(session_id=sid)).messages
    steered = [m for m in history if m.seq == events[0].steered.message_seq]
    assert steered and steered[0].content[0].text.text == "and this too"


def test_a_client_deadline_times_the_turn_out(pb, alice):
    sid = alice.create_session()
    events, err = drain(alice.chat(sid, "[hang]", timeout=2.0))
    assert err is not None and err.code() == grpc.StatusCode.DEADLINE_EXCEEDED, err
    # The server ends the turn a margin before the deadline, so the outcome
    # reaches the client before the trailing DEADLINE_EXCEEDED.
    assert finished(events).outcome == pb.sessions.TURN_OUTCOME_TIMED_OUT
    assert kind(events[-1]) == "turn_finished"


def test_another_users_session_is_not_found(pb, alice, bob):
    sid = alice.create_session()
    assert alice.call(alice.sessions.GetSession, pb.sessions.GetSessionRequest(session_id=sid)).session_id == sid
    with pytest.raises(grpc.RpcError) as caught:
        bob.call(bob.sessions.GetSession, pb.sessions.GetSessionRequest(session_id=sid))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as caught:
        list(bob.chat(sid, "not yours"))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as caught:
        bob.call(bob.sessions.GetHistory, pb.sessions.GetHistoryRequest(session_id=sid))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_bad_input_is_rejected_before_any_event(pb, alice):
    sid = alice.create_session()
    with pytest.raises(grpc.RpcError) as caught:
        list(alice.chat(sid, "should not run", model="nowhere/x"))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as caught:
        alice.call(alice.sessions.GetSession, pb.sessions.GetSessionRequest(session_id="no-such-session"))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    history = alice.call(alice.sessions.GetHistory, pb.sessions.GetHistoryRequest(session_id=sid)).messages
    assert list(history) == []


def test_requests_without_a_known_key_are_unauthenticated(pb, channel):
    from conftest import Client

    stranger = Client(pb, channel, "not-a-configured-key")
    with pytest.raises(grpc.RpcError) as caught:
        stranger.create_session()
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED


def _waiting_on_an_approval(pb, alice, sid, text):
    """A turn paused on server tool t__echo, which requires approval."""
    chat = alice.chat(sid, f"{text} [tool t__echo]", require_approval=["t__echo"])
    seen = read_until(chat, lambda e: kind(e) == "approval_required")
    event = seen[-1]
    assert event.approval_required.name == "t__echo"
    assert event.approval_required.call_id == "call_1"
    status = alice.call(alice.runtime.GetSessionStatus, pb.runtime.GetSessionStatusRequest(session_id=sid))
    assert [(c.call_id, c.wait) for c in status.pending_calls] == [("call_1", pb.runtime.PENDING_CALL_WAIT_APPROVAL)]
    return chat


def test_an_approved_server_tool_call_runs_and_a_second_decision_is_refused(pb, alice, bob):
    sid = alice.create_session()
    chat = _waiting_on_an_approval(pb, alice, sid, "approve")
    decision = pb.runtime.SubmitToolApprovalRequest(session_id=sid, call_id="call_1", approved=True)
    # Another user's decision: the session does not exist for them.
    with pytest.raises(grpc.RpcError) as other:
        bob.call(bob.runtime.SubmitToolApproval, decision)
    assert other.value.code() == grpc.StatusCode.NOT_FOUND
    alice.call(alice.runtime.SubmitToolApproval, decision)
    with pytest.raises(grpc.RpcError) as twice:
        alice.call(alice.runtime.SubmitToolApproval, decision)
    assert twice.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    events, err = drain(chat)
    assert err is None, err
    done = [e.tool_use for e in events if kind(e) == "tool_use" and e.tool_use.call_id == "call_1"]
    assert done and done[-1].status in (pb.runtime.TOOL_STATUS_DONE, pb.runtime.TOOL_STATUS_ERROR)
    assert text_of(events).startswith("tool said: ")
    assert finished(events).outcome == pb.sessions.TURN_OUTCOME_SUCCESS


def test_a_denied_call_is_not_run_and_the_model_is_told_the_reason(pb, alice):
    sid = alice.create_session()
    chat = _waiting_on_an_approval(pb, alice, sid, "deny")
    alice.call(alice.runtime.SubmitToolApproval, pb.runtime.SubmitToolApprovalRequest(
        session_id=sid, call_id="call_1", approved=False, reason="not today"))
    events, err = drain(chat)
    assert err is None, err
    said = text_of(events)
    assert "denied" in said and "not today" in said, said
    assert finished(events).outcome == pb.sessions.TURN_OUTCOME_SUCCESS


def _png(size: int) -> bytes:
    return b"\x89PNG\r\n\x1a\n" + bytes(i % 251 for i in range(size - 8))


def test_an_uploaded_pdf_and_an_inline_image_reach_the_model_and_come_back(pb, alice, bob):
    import hashlib

    sid = alice.create_session()
    pdf = b"%PDF-1.7\n" + bytes(i * 7 % 253 for i in range(600_000))
    digest = hashlib.sha256(pdf).hexdigest()
    chunk = 64 << 10

    def messages(offset: int, end: int):
        yield pb.sessions.UploadBlobRequest(
            session_id=sid, upload_id="py-upload", size=len(pdf), sha256=digest,
            mime_type="application/pdf", name="report.pdf", write_offset=offset)
        for start in range(offset, end, chunk):
            yield pb.sessions.UploadBlobRequest(data=pdf[start:min(start + chunk, end)])

    # A first stream that ends early commits what it sent; the rest resumes.
    first = alice.call(alice.sessions.UploadBlob, messages(0, 300_000))
    assert first.committed_size == 300_000 and not first.HasField("blob")
    status = alice.call(alice.sessions.GetUploadStatus, pb.sessions.GetUploadStatusRequest(
        session_id=sid, upload_id="py-upload"))
    assert status.committed_size == 300_000
    done = alice.call(alice.sessions.UploadBlob, messages(300_000, len(pdf)))
    assert done.blob.blob_id == digest and done.blob.size == len(pdf)

    image = _png(20_000)
    request = alice.chat_request(sid, "[media] look")
    request.content.add().image.CopyFrom(pb.common.ImageBlock(data=image, mime_type="image/png"))
    request.content.add().file.CopyFrom(pb.common.FileBlock(blob_id=digest, mime_type="application/pdf"))
    events = list(alice.call(alice.runtime.Chat, request))
    assert finished(events).outcome == pb.sessions.TURN_OUTCOME_SUCCESS
    # The OpenAI-compatible model reads images, not PDFs: a notice says so.
    assert text_of(events) == "saw: image/png", text_of(events)
    notices = [e.notice for e in events if kind(e) == "notice"]
    assert len(notices) == 1 and notices[0].code == "MEDIA_NOT_SHOWN", notices
    assert "report.pdf" in notices[0].message

    history = alice.call(alice.sessions.GetHistory, pb.sessions.GetHistoryRequest(session_id=sid)).messages
    blocks = [b.WhichOneof("block") for b in history[0].content]
    assert blocks == ["text", "image", "file"], blocks
    stored = history[0].content[1].image
    assert stored.data == b"" and stored.size == len(image)
    assert stored.blob_id == hashlib.sha256(image).hexdigest()

    read = list(alice.call(alice.sessions.GetBlob, pb.sessions.GetBlobRequest(session_id=sid, blob_id=digest)))
    assert read[0].blob.name == "report.pdf"
    assert b"".join(c.data for c in read) == pdf
    with pytest.raises(grpc.RpcError) as other:
        list(bob.call(bob.sessions.GetBlob, pb.sessions.GetBlobRequest(session_id=sid, blob_id=digest)))
    assert other.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_session_of_an_agent_and_the_users_own_memory(pb, alice, bob):
    agent = alice.call(alice.agents.GetAgent, pb.agents.GetAgentRequest(agent_id="helper")).agent
    assert (agent.agent_id, agent.version) == ("helper", 1)
    assert agent.source == pb.agents.AGENT_SOURCE_CONFIG
    session = alice.call(
        alice.sessions.CreateSession, pb.sessions.CreateSessionRequest(agent_id="helper")
    )
    assert (session.agent_id, session.agent_version) == ("helper", 1)
    edit = pb.agents.MemoryEdit(block="notes", set="likes tea")
    written = alice.call(
        alice.agents.UpdateMemory, pb.agents.UpdateMemoryRequest(agent_id="helper", edits=[edit])
    )
    assert dict(written.blocks) == {"notes": "likes tea"} and written.version == 1
    read = alice.call(alice.agents.GetMemory, pb.agents.GetMemoryRequest(agent_id="helper"))
    assert dict(read.blocks) == {"notes": "likes tea"}
    # Another user's memory of the same agent is their own (empty) ...
    theirs = bob.call(bob.agents.GetMemory, pb.agents.GetMemoryRequest(agent_id="helper"))
    assert dict(theirs.blocks) == {} and theirs.version == 0
    # ... and alice's is not theirs to read.
    with pytest.raises(grpc.RpcError) as err:
        bob.call(bob.agents.GetMemory, pb.agents.GetMemoryRequest(agent_id="helper", user_id="alice"))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    # A turn of the agent's session runs.
    events = list(alice.chat(session.session_id, "hello agent"))
    assert finished(events).outcome == pb.sessions.TURN_OUTCOME_SUCCESS
