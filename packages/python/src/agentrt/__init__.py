"""Client for agentrt, the gRPC agent runtime.

- `agentrt.v1` and `agentrt.hooks.v1`: the generated messages (`*_pb2`) and
  stubs (`*_pb2_grpc`) of every service, with type stubs (`.pyi`).
- :func:`connect` / :class:`Client`: one channel with the bearer key on every
  call; :meth:`Client.chat` yields typed `ChatEvent`s.
- :class:`AgentrtError`: a failed call's code, message and decoded
  `google.rpc` details (`ErrorInfo`, `BadRequest`, `QuotaFailure`, ...).
"""

from agentrt.client import ChatStream, Client, connect
from agentrt.status import AgentrtError, details_of, status_of

__all__ = ["AgentrtError", "ChatStream", "Client", "connect", "details_of", "status_of"]
