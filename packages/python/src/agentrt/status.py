"""The error of a failed agentrt call: its gRPC code, message and the
`google.rpc` details the server put in the `grpc-status-details-bin` trailer.

agentrt describes refusals with the standard detail messages: `ErrorInfo`
(a stable `reason` such as `SESSION_BUSY`, in domain `agentrt`, with
`metadata`), `BadRequest` (the field at fault), `QuotaFailure` and
`RetryInfo` (a quota and when to retry), and may use the others of
`google/rpc/error_details.proto`. :func:`details_of` decodes them;
:class:`AgentrtError` carries them with the code.
"""

from __future__ import annotations

from typing import Optional, TypeVar

import grpc
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

__all__ = ["AgentrtError", "details_of", "status_of"]

M = TypeVar("M", bound=Message)

# The detail messages of google/rpc/error_details.proto, by full name.
_DETAIL_TYPES: dict[str, type[Message]] = {
    cls.DESCRIPTOR.full_name: cls
    for cls in (
        error_details_pb2.ErrorInfo,
        error_details_pb2.RetryInfo,
        error_details_pb2.DebugInfo,
        error_details_pb2.QuotaFailure,
        error_details_pb2.PreconditionFailure,
        error_details_pb2.BadRequest,
        error_details_pb2.RequestInfo,
        error_details_pb2.ResourceInfo,
        error_details_pb2.Help,
        error_details_pb2.LocalizedMessage,
    )
}


def status_of(call: grpc.Call) -> Optional[status_pb2.Status]:
    """The `google.rpc.Status` of a finished call (an `grpc.RpcError` is one),
    or None when the server sent no `grpc-status-details-bin` trailer."""
    try:
        return rpc_status.from_call(call)
    except ValueError:
        # The trailer's code or message disagrees with the call's status:
        # the details are still the server's, so decode them regardless.
        for key, value in call.trailing_metadata() or ():
            if key == "grpc-status-details-bin" and isinstance(value, bytes):
                return status_pb2.Status.FromString(value)
        return None


def details_of(status: Optional[status_pb2.Status]) -> list[Message]:
    """The details of a status, each decoded to its `google.rpc` message
    (`ErrorInfo`, `BadRequest`, ...); a detail of another type stays a
    `google.protobuf.Any`."""
    decoded: list[Message] = []
    for detail in status.details if status is not None else ():
        cls = _DETAIL_TYPES.get(detail.TypeName())
        if cls is None:
            decoded.append(detail)
            continue
        message = cls()
        detail.Unpack(message)
        decoded.append(message)
    return decoded


class AgentrtError(Exception):
    """A failed agentrt call: the gRPC status code, its message and the
    decoded `google.rpc` details.

    The facade (:mod:`agentrt.client`) raises it in place of `grpc.RpcError`;
    :meth:`from_rpc_error` makes one from an error of the raw stubs.
    """

    code: grpc.StatusCode
    message: str
    details: list[Message]
    rpc_error: Optional[grpc.RpcError]

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        details: Optional[list[Message]] = None,
        rpc_error: Optional[grpc.RpcError] = None,
    ) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message
        self.details = list(details or [])
        self.rpc_error = rpc_error

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> "AgentrtError":
        """The error of a failed call of the raw stubs (a `grpc.RpcError`
        that is also a `grpc.Call`, as grpcio raises them)."""
        if not isinstance(error, grpc.Call):
            return cls(grpc.StatusCode.UNKNOWN, str(error), rpc_error=error)
        return cls(error.code(), error.details() or "", details_of(status_of(error)), rpc_error=error)

    def detail(self, kind: type[M]) -> Optional[M]:
        """The first detail of message type `kind` (e.g.
        `error_details_pb2.QuotaFailure`), or None."""
        for detail in self.details:
            if isinstance(detail, kind):
                return detail
        return None

    @property
    def error_info(self) -> Optional[error_details_pb2.ErrorInfo]:
        """The `ErrorInfo` detail: `reason`, `domain` and `metadata`."""
        return self.detail(error_details_pb2.ErrorInfo)

    @property
    def reason(self) -> Optional[str]:
        """The `ErrorInfo` reason (`SESSION_BUSY`, ...), or None."""
        info = self.error_info
        return info.reason if info is not None else None

    @property
    def bad_request(self) -> Optional[error_details_pb2.BadRequest]:
        """The `BadRequest` detail: which fields were refused and why."""
        return self.detail(error_details_pb2.BadRequest)

    @property
    def quota_failure(self) -> Optional[error_details_pb2.QuotaFailure]:
        """The `QuotaFailure` detail: the quota that was exceeded."""
        return self.detail(error_details_pb2.QuotaFailure)

    @property
    def retry_info(self) -> Optional[error_details_pb2.RetryInfo]:
        """The `RetryInfo` detail: how long to wait before trying again."""
        return self.detail(error_details_pb2.RetryInfo)

    def __str__(self) -> str:
        reason = f" ({self.reason})" if self.reason else ""
        return f"{self.code.name}: {self.message}{reason}"

