"""A rotated broker certificate reaches peer calls without a restart (issue 25): the client
context a broker calls the others with (`peers.PEERS.ssl`) is reloaded with the servers'
contexts (`CertificateReloader.follow`), so the call after a rotation presents the new
certificate. The peer here is a real grpclib server requiring a client certificate, which
records the serial number of the certificate each call presented."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpclib.const
import grpclib.server
import pytest
import trustme

from danube.proto import danube as pb
from danube.runtime.grpc_util import Server
from danube.runtime.peers import configure
from danube.runtime.tls import CertificateReloader, server_context
from danube.values.auth_config import AuthConfig, JwtConfig, TlsFiles

HEALTH = "/danube.HealthCheck/HealthCheck"


class SerialRecorder:
    """A peer's HealthCheck that notes the serial number of the caller's certificate."""

    def __init__(self) -> None:
        self.serials: list[int] = []

    async def health(self, stream: grpclib.server.Stream) -> None:
        await stream.recv_message()
        cert: Any = stream.peer.cert()
        self.serials.append(int(cert["serialNumber"], 16))
        await stream.send_message(pb.HealthCheckResponse())

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return {
            HEALTH: grpclib.const.Handler(
                self.health,
                grpclib.const.Cardinality.UNARY_UNARY,
                pb.HealthCheckRequest,
                pb.HealthCheckResponse,
            )
        }


def _issue(ca: trustme.CA, cert: Path, key: Path) -> int:
    """A broker certificate (CN broker-a) written to the files; returns its serial number."""
    issued = ca.issue_cert("127.0.0.1", "localhost", common_name="broker-a")
    issued.private_key_pem.write_to_path(str(key))
    issued.cert_chain_pems[0].write_to_path(str(cert))
    from cryptography import x509

    return x509.load_pem_x509_certificate(issued.cert_chain_pems[0].bytes()).serial_number


@pytest.mark.parametrize("followed", [True, False], ids=["followed", "not-followed"])
def test_the_next_peer_call_presents_the_rotated_certificate(
    tmp_path: Path, followed: bool
) -> None:
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    cert, key = tmp_path / "broker.pem", tmp_path / "broker.key"
    first = _issue(ca, cert, key)
    files = TlsFiles(str(cert), str(key), str(ca_file))
    auth = AuthConfig(mode="tls", tls=files, jwt=JwtConfig(secret_key="s" * 32))
    peers = configure(auth, "a")
    reloader = CertificateReloader(files)
    if followed:
        reloader.follow(peers.ssl)
    peer_cert, peer_key = tmp_path / "peer.pem", tmp_path / "peer.key"
    _issue(ca, peer_cert, peer_key)
    peer_tls = server_context(TlsFiles(str(peer_cert), str(peer_key), str(ca_file), True))
    recorder = SerialRecorder()

    async def call(port: int) -> None:
        channel = peers.channel("127.0.0.1", port)
        try:
            async with channel.request(
                HEALTH,
                grpclib.const.Cardinality.UNARY_UNARY,
                pb.HealthCheckRequest,
                pb.HealthCheckResponse,
                metadata=peers.metadata(),
            ) as stream:
                await stream.send_message(pb.HealthCheckRequest(), end=True)
                await stream.recv_message()
        finally:
            channel.close()

    async def scenario() -> int:
        server = Server([recorder])  # the server a peer broker runs
        await server.start("127.0.0.1", 0, ssl=peer_tls)
        port = server._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            await call(port)
            rotated = _issue(ca, cert, key)  # a sidecar rotates the files
            assert reloader.check()
            await call(port)
            return rotated
        finally:
            server.close()
            await server.wait_closed()

    rotated = asyncio.run(scenario())
    assert recorder.serials[0] == first
    if followed:
        assert recorder.serials[1] == rotated != first
    else:  # what a broker did before: the certificate it started with, until a restart
        assert recorder.serials[1] == first
