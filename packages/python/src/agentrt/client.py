"""A thin typed facade over the generated stubs: one channel, the bearer key
on every call, Chat's event stream as an iterator of typed `ChatEvent`s and
failures as :class:`~agentrt.status.AgentrtError`.

    client = agentrt.connect("http://127.0.0.1:50051", token="KEY")
    session = client.create_session(title="hello")
    for event in client.chat(session.session_id, "Hello there"):
        if event.WhichOneof("kind") == "text":
            print(event.text.text, end="")

The generated stubs stay at hand (`client.sessions`, `client.runtime`,
`client.agents`, `client.admin`) for everything the facade does not wrap;
they send the key too, and :meth:`Client.call` maps their errors.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Callable, NamedTuple, Optional, TypeVar, Union

import grpc

from agentrt.status import AgentrtError
from agentrt.v1 import (
    admin_pb2_grpc,
    agents_pb2_grpc,
    common_pb2,
    runtime_pb2,
    runtime_pb2_grpc,
    sessions_pb2,
    sessions_pb2_grpc,
)

__all__ = ["ChatStream", "Client", "connect"]

Resp = TypeVar("Resp")

# The routing header: lets a service mesh send one session's calls to one
# replica. The server does not need it; the facade sends it on every
# session-scoped call.
SESSION_HEADER = "x-agentrt-session"


class _CallDetails(
    NamedTuple(
        "_CallDetails",
        [
            ("method", str),
            ("timeout", Optional[float]),
            ("metadata", Optional[Sequence[tuple[str, Union[str, bytes]]]]),
            ("credentials", Optional[grpc.CallCredentials]),
            ("wait_for_ready", Optional[bool]),
            ("compression", Any),
        ],
    ),
    grpc.ClientCallDetails,
):
    pass


class _BearerKey(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds `authorization: Bearer KEY` to every call. (Call credentials
    would refuse a plaintext channel, which a local server is.)"""

    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        metadata = [m for m in (details.metadata or ()) if m[0] != "authorization"]
        metadata.append(self._header)
        return _CallDetails(
            details.method,
            details.timeout,
            metadata,
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )

    def intercept_unary_unary(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):  # type: ignore[no-untyped-def]
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):  # type: ignore[no-untyped-def]
        return continuation(self._details(client_call_details), request_iterator)


class ChatStream(Iterator[runtime_pb2.ChatEvent]):
    """The events of a Chat or Subscribe call, in order. A non-OK trailing
    status (after the last event, e.g. CANCELLED for a stopped turn) is
    raised as :class:`AgentrtError` by the iteration.

    Leaving a loop early does not end the call: read on later, or
    :meth:`cancel` it (the turn then goes on or stops as the request's
    `on_disconnect` says).
    """

    def __init__(self, call: Any) -> None:
        #: The underlying grpcio call (an iterator that is also a `grpc.Call`).
        self.call = call

    def __iter__(self) -> ChatStream:
        return self

    def __next__(self) -> runtime_pb2.ChatEvent:
        try:
            event: runtime_pb2.ChatEvent = next(self.call)
        except grpc.RpcError as err:
            raise AgentrtError.from_rpc_error(err) from err
        return event

    def cancel(self) -> bool:
        """Cancels the call; True when it was still running."""
        return bool(self.call.cancel())

    def drain(self) -> tuple[list[runtime_pb2.ChatEvent], Optional[AgentrtError]]:
        """Reads to the end: the remaining events and the trailing error
        (None when the call ended OK)."""
        events: list[runtime_pb2.ChatEvent] = []
        try:
            for event in self:
                events.append(event)
        except AgentrtError as err:
            return events, err
        return events, None


class Client:
    """The agentrt services on one channel, every call sent with one key.
    Use :func:`connect` to make one; close it (or use it in `with`)."""

    def __init__(self, channel: grpc.Channel, token: Optional[str] = None) -> None:
        self._raw_channel = channel
        if token:
            channel = grpc.intercept_channel(channel, _BearerKey(token))
        #: The channel the stubs use (with the key added to every call).
        self.channel = channel
        self.sessions = sessions_pb2_grpc.SessionServiceStub(channel)
        self.runtime = runtime_pb2_grpc.AgentRuntimeStub(channel)
        self.agents = agents_pb2_grpc.AgentServiceStub(channel)
        self.admin = admin_pb2_grpc.RuntimeAdminStub(channel)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes the channel; calls still running are cancelled."""
        self._raw_channel.close()

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Waits until the channel is connected; raises
        `grpc.FutureTimeoutError` after `timeout` seconds."""
        grpc.channel_ready_future(self._raw_channel).result(timeout=timeout)

    def call(
        self,
        method: Callable[..., Resp],
        request: Any,
        *,
        timeout: Optional[float] = 30.0,
        session_id: Optional[str] = None,
    ) -> Resp:
        """Runs a unary call of a stub (e.g. `client.sessions.GetSession`)
        with a deadline `timeout` seconds away; a failure is raised as
        :class:`AgentrtError`. `session_id` adds the routing header."""
        try:
            return method(request, timeout=timeout, metadata=_routed(session_id))
        except grpc.RpcError as err:
            raise AgentrtError.from_rpc_error(err) from err

    def create_session(self, title: str = "", agent_id: str = "", **fields: Any) -> sessions_pb2.Session:
        """Creates a session (of agent `agent_id`, when given); other
        `CreateSessionRequest` fields as keywords."""
        request = sessions_pb2.CreateSessionRequest(title=title, agent_id=agent_id, **fields)
        return self.call(self.sessions.CreateSession, request)

    def history(self, session_id: str) -> list[common_pb2.Message]:
        """The first page of the session's stored messages, oldest first."""
        request = sessions_pb2.GetHistoryRequest(session_id=session_id)
        return list(self.call(self.sessions.GetHistory, request, session_id=session_id).messages)

    def chat(
        self,
        session_id: str,
        content: Union[str, Sequence[common_pb2.ContentBlock]],
        *,
        timeout: Optional[float] = None,
        **fields: Any,
    ) -> ChatStream:
        """Sends a user message (a text, or content blocks) and streams the
        turn's events. Other `ChatRequest` fields as keywords (`model`,
        `on_busy`, `extra_tools`, ...). `timeout` is the call's deadline in
        seconds; the server ends the turn as TIMED_OUT shortly before it."""
        request = runtime_pb2.ChatRequest(session_id=session_id, **fields)
        if isinstance(content, str):
            request.content.add().text.text = content
        else:
            request.content.extend(content)
        return self._stream(self.runtime.Chat, request, timeout, session_id)

    def subscribe(self, session_id: str, after_seq: int = 0, *, timeout: Optional[float] = None) -> ChatStream:
        """Watches the session's live turn: the events after `after_seq`
        (replayed from the buffer), then the rest as they happen."""
        request = runtime_pb2.SubscribeRequest(session_id=session_id, after_seq=after_seq)
        return self._stream(self.runtime.Subscribe, request, timeout, session_id)

    def stop(self, session_id: str) -> bool:
        """Stops the session's live turn; False when none was running."""
        request = runtime_pb2.StopSessionRequest(session_id=session_id)
        return self.call(self.runtime.StopSession, request, session_id=session_id).stopped

    def submit_tool_result(
        self, session_id: str, turn_id: str, call_id: str, content: str, *, is_error: bool = False
    ) -> None:
        """Answers a caller-executed tool call (a `tool_call` event)."""
        request = runtime_pb2.SubmitToolResultRequest(
            session_id=session_id, turn_id=turn_id, call_id=call_id, content=content, is_error=is_error
        )
        self.call(self.runtime.SubmitToolResult, request, session_id=session_id)

    def submit_tool_approval(self, session_id: str, call_id: str, approved: bool, reason: str = "") -> None:
        """Approves or denies a server tool call (an `approval_required` event)."""
        request = runtime_pb2.SubmitToolApprovalRequest(
            session_id=session_id, call_id=call_id, approved=approved, reason=reason
        )
        self.call(self.runtime.SubmitToolApproval, request, session_id=session_id)

    def _stream(self, method: Any, request: Any, timeout: Optional[float], session_id: str) -> ChatStream:
        try:
            return ChatStream(method(request, timeout=timeout, metadata=_routed(session_id)))
        except grpc.RpcError as err:
            raise AgentrtError.from_rpc_error(err) from err


def _routed(session_id: Optional[str]) -> list[tuple[str, str]]:
    return [(SESSION_HEADER, session_id)] if session_id else []


def connect(
    url: str,
    token: Optional[str] = None,
    *,
    root_certificates: Optional[bytes] = None,
    options: Optional[Sequence[tuple[str, Any]]] = None,
) -> Client:
    """A client of the server at `url`:

    - `http://HOST:PORT` or `HOST:PORT`: plaintext (a local server);
    - `https://HOST:PORT`: TLS, verified against the system's trust roots,
      or against `root_certificates` (PEM bytes) when given.

    `token` is the bearer key sent with every call. `options` are grpcio
    channel options. The channel connects on first use (see
    :meth:`Client.wait_ready`).
    """
    target, secure = _target(url)
    if secure:
        credentials = grpc.ssl_channel_credentials(root_certificates=root_certificates)
        channel = grpc.secure_channel(target, credentials, options=options)
    else:
        if root_certificates is not None:
            raise ValueError(f"root_certificates given for a plaintext URL ({url}): use https://")
        channel = grpc.insecure_channel(target, options=options)
    return Client(channel, token)


def _target(url: str) -> tuple[str, bool]:
    for scheme, secure in (("https://", True), ("http://", False)):
        if url.startswith(scheme):
            return url[len(scheme):].rstrip("/"), secure
    if "://" in url:
        raise ValueError(f"unsupported URL scheme in {url!r}: use http://, https:// or HOST:PORT")
    return url, False

