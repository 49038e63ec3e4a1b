#!/usr/bin/env python3
"""grpcio over TLS and mTLS against the real agentrt-server (P8 item 1).

Usage: tls_client.py PATH/TO/agentrt-server

Generates a CA, a server certificate (SANs localhost and 127.0.0.1) and a
client certificate (URI SAN spiffe://agentrt.test/python) with the
`cryptography` package, then starts two servers on loopback:

1. TLS only (--tls-cert/--tls-key): a grpcio secure channel trusting the CA
   completes a Chat; a plaintext grpcio channel gets no RPC through.
2. mTLS (--tls-client-ca, [[auth.mtls]] mapping the client certificate's
   SPIFFE id to the user "python"): with the certificate, CreateSession and
   Chat succeed as "python"; without one, no RPC gets through.

Needs `grpcio`, `grpcio-tools` and `cryptography`. Prints one line per check;
exits non-zero when any check fails.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import sys
import tempfile

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Checks, Server, generate_stubs  # noqa: E402

RPC_TIMEOUT = 30.0
CLIENT_ID = "spiffe://agentrt.test/python"


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def make_pki() -> dict[str, bytes]:
    """A CA and two leaves signed by it, as PEM."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("agentrt smoke ca")
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(cn: str, sans: list[x509.GeneralName], usage) -> tuple[bytes, bytes]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(cn))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)

    server_cert, server_key = leaf(
        "agentrt smoke server",
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
        ExtendedKeyUsageOID.SERVER_AUTH,
    )
    client_cert, client_key = leaf(
        "python client",
        [x509.UniformResourceIdentifier(CLIENT_ID)],
        ExtendedKeyUsageOID.CLIENT_AUTH,
    )
    return {
        "ca.pem": ca.public_bytes(serialization.Encoding.PEM),
        "server.pem": server_cert,
        "server.key": server_key,
        "client.pem": client_cert,
        "client.key": client_key,
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    binary = argv[1]
    checks = Checks()
    with tempfile.TemporaryDirectory(prefix="agentrt-tls-") as work:
        pki = make_pki()
        for name, data in pki.items():
            with open(os.path.join(work, name), "wb") as f:
                f.write(data)
        path = lambda name: os.path.join(work, name)  # noqa: E731
        stubs = os.path.join(work, "stubs")
        os.makedirs(stubs)
        generate_stubs(stubs)
        sys.path.insert(0, stubs)
        from agentrt.v1 import runtime_pb2, runtime_pb2_grpc, sessions_pb2, sessions_pb2_grpc

        def chat(channel) -> tuple[str, str, object]:
            """(owner, text, outcome) of a new session's turn."""
            sessions = sessions_pb2_grpc.SessionServiceStub(channel)
            runtime = runtime_pb2_grpc.AgentRuntimeStub(channel)
            session = sessions.CreateSession(sessions_pb2.CreateSessionRequest(), timeout=RPC_TIMEOUT)
            request = runtime_pb2.ChatRequest(session_id=session.session_id)
            request.content.add().text.text = "hello tls"
            text, outcome = "", None
            for event in runtime.Chat(
                request, timeout=RPC_TIMEOUT, metadata=[("x-agentrt-session", session.session_id)]
            ):
                kind = event.WhichOneof("kind")
                if kind == "text":
                    text += event.text.text
                elif kind == "turn_finished":
                    outcome = event.turn_finished.outcome
            return session.owner, text, outcome

        def refused(channel) -> tuple[bool, str]:
            """Whether no RPC gets through `channel`."""
            sessions = sessions_pb2_grpc.SessionServiceStub(channel)
            try:
                sessions.CreateSession(sessions_pb2.CreateSessionRequest(), timeout=10)
            except grpc.RpcError as e:
                return True, f"{e.code()}"
            return False, "CreateSession succeeded"

        def secure(with_client_cert: bool):
            creds = grpc.ssl_channel_credentials(
                root_certificates=pki["ca.pem"],
                private_key=pki["client.key"] if with_client_cert else None,
                certificate_chain=pki["client.pem"] if with_client_cert else None,
            )
            return creds

        tls = Server(binary, work, "tls", ["--tls-cert", path("server.pem"), "--tls-key", path("server.key")])
        try:
            if checks.check("TLS server started", tls.addr is not None, tls.stderr()):
                with grpc.secure_channel(tls.addr, secure(False)) as channel:
                    try:
                        owner, text, outcome = chat(channel)
                        checks.check(
                            "grpcio Chat over TLS with the generated CA",
                            text == "You said: hello tls"
                            and outcome == sessions_pb2.TURN_OUTCOME_SUCCESS,
                            f"text {text!r}, outcome {outcome}",
                        )
                    except grpc.RpcError as e:
                        checks.check("grpcio Chat over TLS with the generated CA", False, f"{e}")
                with grpc.insecure_channel(tls.addr) as channel:
                    ok, detail = refused(channel)
                    checks.check("a plaintext grpcio channel is refused on the TLS port", ok, detail)
        finally:
            tls.stop()

        config = path("mtls.toml")
        with open(config, "w") as f:
            f.write(f'[[auth.mtls]]\nidentity = "{CLIENT_ID}"\nuser = "python"\n')
        mtls = Server(
            binary, work, "mtls",
            ["--config", config, "--tls-cert", path("server.pem"), "--tls-key", path("server.key"),
             "--tls-client-ca", path("ca.pem")],
        )
        try:
            if checks.check("mTLS server started", mtls.addr is not None, mtls.stderr()):
                with grpc.secure_channel(mtls.addr, secure(True)) as channel:
                    try:
                        owner, text, outcome = chat(channel)
                        checks.check(
                            f"grpcio with a client certificate ({CLIENT_ID}) chats as user python",
                            owner == "python" and outcome == sessions_pb2.TURN_OUTCOME_SUCCESS,
                            f"owner {owner!r}, outcome {outcome}",
                        )
                    except grpc.RpcError as e:
                        checks.check("grpcio with a client certificate chats as user python", False, f"{e}")
                with grpc.secure_channel(mtls.addr, secure(False)) as channel:
                    ok, detail = refused(channel)
                    checks.check("a grpcio channel without a client certificate is refused", ok, detail)
        finally:
            mtls.stop()
    print(f"tls: {checks.passed} passed, {checks.failed} failed", flush=True)
    return 0 if checks.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
