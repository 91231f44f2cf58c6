"""Brokers with TLS and bearer tokens on every port (issue 25, deliver 7) for the modules of
the hostile suite that run their scenarios secured: `conftest.secured_broker` starts one per
such module, as each plain module has its own.

`Access` is how a scenario reaches a broker, plain or secured, with the same code: the TLS
context (None: plaintext), the headers a call carries (the super admin's token) and the URL
scheme. `Access.anonymous` is the same broker without the token, for the refusals."""

from __future__ import annotations

import os
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
import trustme
import yaml
from grpclib.client import Channel
from grpclib.events import SendRequest, listen

from danube.client import ClientSecurity
from danube.localcluster.broker_process import BrokerProcess
from danube.machines.security.tokens import mint
from danube.runtime.tls import client_context
from tests.hostile.harness import WatchedBroker

SUPER_ADMIN = "root"


@dataclass(frozen=True)
class Access:
    """How to reach a broker's ports: `ca_file` None is plaintext."""

    ca_file: str | None = None
    token: str | None = None
    headers: tuple[tuple[str, str], ...] = field(default=())

    @property
    def secured(self) -> bool:
        return self.ca_file is not None

    @property
    def scheme(self) -> str:
        return "https" if self.secured else "http"

    @property
    def anonymous(self) -> Access:
        """The same transport without credentials."""
        return replace(self, token=None, headers=())

    def grpc_context(self) -> ssl.SSLContext | None:
        """TLS negotiating h2, or None for plaintext."""
        return client_context(self.ca_file) if self.ca_file else None

    def http_context(self) -> ssl.SSLContext | None:
        """TLS for the metrics port (http/1.1), or None for plaintext."""
        return ssl.create_default_context(cafile=self.ca_file) if self.ca_file else None

    def channel(self, address: str) -> Channel:
        """A grpclib channel that sends this access's headers on every call."""
        host, _, port = address.rpartition(":")
        channel = Channel(host, int(port), ssl=self.grpc_context())
        headers = self.headers

        async def add_headers(event: SendRequest) -> None:
            for name, value in headers:
                event.metadata[name] = value

        if headers:
            listen(channel, SendRequest, add_headers)
        return channel


PLAIN = Access()


def access_of(broker: WatchedBroker) -> Access:
    """How the suite reaches `broker` as the most privileged caller it has."""
    security = broker.security
    if security is None:
        return PLAIN
    token = security.token
    headers = (("authorization", f"Bearer {token}"),) if token else ()
    return Access(security.ca_file, token, headers)


@dataclass
class SecuredBroker:
    watched: WatchedBroker
    access: Access
    secret: str
    """The HS256 key the broker verifies tokens with (to mint others in tests)."""


def start_secured(root: Path) -> SecuredBroker:
    """A broker in `auth.mode: tls` with HS256 tokens, a trustme CA's certificate, `root` as
    its only super admin; its acknowledged messages stored and its prober running."""
    secret = "hostile-secret-" + os.urandom(16).hex()
    ca = trustme.CA()
    ca_file = root / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    issued = ca.issue_cert("127.0.0.1", "localhost")
    issued.private_key_pem.write_to_path(str(root / "key.pem"))
    issued.cert_chain_pems[0].write_to_path(str(root / "cert.pem"))
    config = root / "broker.yaml"
    auth = {
        "mode": "tls",
        "tls": {"cert_file": str(root / "cert.pem"), "key_file": str(root / "key.pem")},
        "jwt": {"issuer": "danube-auth"},
        "super_admins": [SUPER_ADMIN],
    }
    config.write_text(yaml.safe_dump({"auth": auth}))
    process = BrokerProcess(
        root / "data", config_file=config, env={"DANUBE_JWT_SECRET_KEY": secret}
    )
    token = mint(SUPER_ADMIN, secret, now=time.time(), ttl_s=7200)
    security = ClientSecurity(ca_file=str(ca_file), token=token)
    watched = WatchedBroker(root / "data", "secured", process=process, security=security)
    watched.start()
    return SecuredBroker(watched, access_of(watched), secret)


def plain_or_secured(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    directory: str,
    name: str,
) -> Iterator[WatchedBroker]:
    """A module's broker fixture, parametrized plain / secured: a plain broker of the module's
    own (`directory`, `name`), or its secured one (`secured_broker`)."""
    if request.param == "secured":
        yield request.getfixturevalue("secured_broker").watched
        return
    watched = WatchedBroker(tmp_path_factory.mktemp(directory) / "data", name).start()
    try:
        yield watched
    finally:
        watched.close()
