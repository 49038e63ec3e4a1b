"""The agentrt-client wheel itself: installed (not the repository's tree),
complete (every proto of proto/agentrt), typed (mypy sees the messages), and
its facade: connect, chat's typed events, AgentrtError with decoded details."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
import sysconfig
import textwrap
from importlib import metadata
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2

import agentrt
from agentrt.v1 import common_pb2, runtime_pb2, sessions_pb2
from conftest import REPO_ROOT


def kind(event: runtime_pb2.ChatEvent) -> str:
    return event.WhichOneof("kind") or ""


@pytest.fixture(scope="module")
def client():
    with agentrt.connect(f"http://{os.environ['POLYGLOT_ADDR']}", token=os.environ["POLYGLOT_KEY_A"]) as c:
        c.wait_ready(timeout=30)
        yield c


def test_the_package_is_the_installed_wheel_of_this_version():
    installed = Path(sysconfig.get_paths()["purelib"]).resolve()
    assert Path(agentrt.__file__).resolve().parent == installed / "agentrt"
    cargo = (REPO_ROOT / "Cargo.toml").read_text()
    version = re.search(r'^\[workspace\.package\]\nversion = "([^"]+)"', cargo, re.M)
    assert version and metadata.version("agentrt-client") == version.group(1)


def test_every_proto_has_its_modules_and_type_stubs():
    protos = sorted((REPO_ROOT / "proto").glob("agentrt/**/*.proto"))
    assert len(protos) >= 6, protos
    installed = Path(agentrt.__file__).resolve().parent.parent
    for proto in protos:
        rel = proto.relative_to(REPO_ROOT / "proto").with_suffix("")
        module = ".".join(rel.parts)
        for suffix in ("_pb2", "_pb2_grpc"):
            importlib.import_module(module + suffix)
            stub = installed / rel.parent / f"{rel.name}{suffix}.pyi"
            assert stub.is_file(), f"no type stub {stub}"
    assert (installed / "agentrt" / "py.typed").is_file()


def test_chat_yields_typed_events(client):
    session = client.create_session(title="facade")
    assert isinstance(session, sessions_pb2.Session) and session.session_id
    events = list(client.chat(session.session_id, "hello [think]", timeout=30))
    assert all(isinstance(e, runtime_pb2.ChatEvent) for e in events)
    assert kind(events[0]) == "turn_started" and kind(events[-1]) == "turn_finished"
    assert "".join(e.text.text for e in events if kind(e) == "text") == "echo: hello [think]"
    assert events[-1].turn_finished.outcome == sessions_pb2.TURN_OUTCOME_SUCCESS
    roles = [m.role for m in client.history(session.session_id)]
    assert roles == [common_pb2.ROLE_USER, common_pb2.ROLE_ASSISTANT]


def test_a_busy_session_raises_agentrt_error_with_error_info(client):
    sid = client.create_session().session_id
    live = client.chat(sid, "[hang]", timeout=30)
    first = next(live)
    with pytest.raises(agentrt.AgentrtError) as caught:
        list(client.chat(sid, "me too", timeout=30))
    err = caught.value
    assert err.code == grpc.StatusCode.ABORTED
    assert err.reason == "SESSION_BUSY" and err.error_info is not None
    assert err.error_info.domain == "agentrt"
    assert err.error_info.metadata["turn_id"] == first.turn_id
    assert isinstance(err.rpc_error, grpc.RpcError)
    assert "SESSION_BUSY" in str(err) and str(err).startswith("ABORTED: ")
    assert client.stop(sid) is True
    events, trailing = live.drain()
    assert events[-1].turn_finished.outcome == sessions_pb2.TURN_OUTCOME_CANCELED
    assert trailing is not None and trailing.code == grpc.StatusCode.CANCELLED
    assert client.stop(sid) is False


def test_a_refused_request_carries_bad_request(client):
    sid = client.create_session().session_id
    with pytest.raises(agentrt.AgentrtError) as caught:
        list(client.chat(sid, "should not run", model="nowhere/x"))
    err = caught.value
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    assert err.bad_request is not None, err.details
    fields = [v.field for v in err.bad_request.field_violations]
    assert "model" in fields, fields
    assert err.detail(error_details_pb2.BadRequest) is err.bad_request
    assert err.quota_failure is None and err.retry_info is None


def test_raw_stub_errors_map_through_call(client):
    other = agentrt.connect(os.environ["POLYGLOT_ADDR"], token=os.environ["POLYGLOT_KEY_B"])
    try:
        sid = client.create_session().session_id
        with pytest.raises(agentrt.AgentrtError) as caught:
            other.call(other.sessions.GetSession, sessions_pb2.GetSessionRequest(session_id=sid))
        assert caught.value.code == grpc.StatusCode.NOT_FOUND
        # The raw stubs send the key too, and their errors convert.
        with pytest.raises(grpc.RpcError) as raw:
            other.sessions.GetSession(sessions_pb2.GetSessionRequest(session_id=sid), timeout=30)
        assert agentrt.AgentrtError.from_rpc_error(raw.value).code == grpc.StatusCode.NOT_FOUND
        assert other.sessions.GetSession(sessions_pb2.GetSessionRequest(session_id=other.create_session().session_id),
                                         timeout=30).session_id
    finally:
        other.close()
    with agentrt.connect(os.environ["POLYGLOT_ADDR"], token="not-a-configured-key") as stranger:
        with pytest.raises(agentrt.AgentrtError) as caught:
            stranger.create_session()
        assert caught.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_the_key_goes_with_streaming_calls_of_the_raw_stubs(client):
    import hashlib

    sid = client.create_session().session_id
    data = b"through the package\n" * 500
    digest = hashlib.sha256(data).hexdigest()

    def messages():
        yield sessions_pb2.UploadBlobRequest(
            session_id=sid, upload_id="pkg-upload", size=len(data), sha256=digest,
            mime_type="text/plain", name="notes.txt")
        yield sessions_pb2.UploadBlobRequest(data=data)

    done = client.call(client.sessions.UploadBlob, messages(), session_id=sid)
    assert done.blob.blob_id == digest and done.committed_size == len(data)
    read = client.sessions.GetBlob(sessions_pb2.GetBlobRequest(session_id=sid, blob_id=digest), timeout=30)
    assert b"".join(chunk.data for chunk in read) == data


def test_a_url_with_another_scheme_is_refused():
    with pytest.raises(ValueError, match="unsupported URL scheme"):
        agentrt.connect("grpc://127.0.0.1:1")
    with pytest.raises(ValueError, match="use https://"):
        agentrt.connect("http://127.0.0.1:1", root_certificates=b"pem")


def _mypy(path: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir=/dev/null", str(path)],
        capture_output=True, text=True, cwd=cwd,
    )


def test_the_type_stubs_check_a_client(tmp_path):
    example = REPO_ROOT / "examples" / "python" / "chat.py"
    good = _mypy(example, tmp_path)
    assert good.returncode == 0, good.stdout + good.stderr
    # The events are typed: a misspelt field of a message is an error.
    bad = tmp_path / "typo.py"
    bad.write_text(textwrap.dedent("""\
        import agentrt

        def first_text(client: agentrt.Client, sid: str) -> str:
            for event in client.chat(sid, "hi"):
                return event.text.txt
            return ""
    """))
    checked = _mypy(bad, tmp_path)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert '"TextDelta" has no attribute "txt"' in checked.stdout, checked.stdout
