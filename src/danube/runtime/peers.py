"""How this broker calls another broker of its cluster (spec/security.md, "Between brokers"):
forwarded admin calls, replication streams, epoch questions, and any internal producer
(dead letters) go through `PEERS`, set once at start (`configure`).

- With TLS on the admin port (every inter-broker call goes to an admin port), the channel
  speaks TLS, trusting `auth.tls.ca_file` (else the system's roots) and presenting the
  broker's own certificate, so a peer requiring mutual TLS accepts it.
- With `auth.cluster_key`, every call carries `x-danube-broker-token`: a short-lived token
  signed with that key naming this broker (`tokens.mint_broker`); the receiving broker's
  guard makes it a `broker` principal. Only brokers hold the key, so no header a client can
  send makes it a broker (Danube's `x-danube-internal-broker` grants nothing here).

One value per process: a broker process is one broker.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpclib.client

from danube.client.security import ClientSecurity
from danube.machines.security.tokens import BROKER_TTL_S, mint_broker
from danube.runtime.auth import BROKER_TOKEN_HEADER
from danube.runtime.tls import client_context
from danube.values.auth_config import AuthConfig

RENEW_BEFORE_S = BROKER_TTL_S / 2
"""A token is re-minted when less than this is left of it: a call never leaves with a token
about to end."""


@dataclass
class PeerAccess:
    ssl: ssl.SSLContext | None = None
    name: str = ""
    cluster_key: str | None = None
    clock: Callable[[], float] = time.time
    _token: str = field(default="", repr=False)
    _until: float = 0.0

    def metadata(self) -> dict[str, str]:
        """The headers that say "a broker of this cluster" (none without a cluster key)."""
        if self.cluster_key is None:
            return {}
        now = self.clock()
        if now >= self._until - RENEW_BEFORE_S:
            self._token = mint_broker(self.name, self.cluster_key, now)
            self._until = now + BROKER_TTL_S
        return {BROKER_TOKEN_HEADER: self._token}

    def channel(self, host: str, port: int, **options: Any) -> grpclib.client.Channel:
        return grpclib.client.Channel(host, port, ssl=self.ssl, **options)


PEERS = PeerAccess()


def configure(auth: AuthConfig, broker_id: int | str) -> PeerAccess:
    """At start: how this broker reaches and proves itself to the others."""
    files = auth.tls
    context = None
    if files is not None and auth.tls_on("admin"):
        context = client_context(files.ca_file, files.cert_file, files.key_file)
    PEERS.ssl = context
    PEERS.name = f"broker-{broker_id}"
    PEERS.cluster_key = auth.cluster_key
    PEERS._until = 0.0
    return PEERS


def internal_client(auth: AuthConfig) -> ClientSecurity:
    """How this broker's internal producers (dead letters forwarded to another broker's topic)
    reach a client port: TLS when the client port speaks it, trusting `auth.tls.ca_file` and
    presenting the broker's certificate (a broker certificate under mutual TLS), and then the
    broker token on every call when a cluster key is set. Either makes the caller a `broker`
    principal at the owner, whose access check lets brokers publish."""
    files = auth.tls
    if files is not None and auth.tls_on("client"):
        return ClientSecurity(
            tls=True,
            ca_file=files.ca_file,
            cert_file=files.cert_file,
            key_file=files.key_file,
            headers=PEERS.metadata,
        )
    # A plaintext client port gets no broker token: it would cross the client network in
    # clear (such a port has no authentication to pass either: auth.mode tls puts every
    # port under TLS).
    return ClientSecurity()
