"""How our client, `danube-cli` and `danube-admin` connect to a secured broker
(spec/security.md): TLS (the system's roots or a CA file, a client certificate for mutual
TLS, the name the certificate must carry) and a bearer token sent on every call.

Settings come from arguments, then from the environment under a prefix: `DANUBE_ADMIN_` for
`danube-admin` (Danube's names: `DANUBE_ADMIN_TLS`, `_CA`, `_CERT`, `_KEY`, `_DOMAIN`,
`_TOKEN` or the older `_API_KEY`) and `DANUBE_` for `danube-cli` (ours, the same suffixes).
As in Danube's clients, a token implies TLS, and an `https://` URL asks for TLS too."""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass

TRUE = {"1", "true", "yes", "on"}


@dataclass(frozen=True, slots=True)
class ClientSecurity:
    tls: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    domain: str | None = None
    """The name the broker's certificate must carry, when not the host connected to."""
    token: str | None = None
    headers: Callable[[], Mapping[str, str]] | None = None
    """Headers made anew for every call, beside the token: a broker's internal producers send
    the broker's own short-lived identity this way (`danube.runtime.peers`)."""

    @property
    def uses_tls(self) -> bool:
        return self.tls or self.token is not None or self.ca_file is not None

    def context(self) -> ssl.SSLContext | None:
        if not self.uses_tls:
            return None
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca_file)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["h2"])
        if self.cert_file is not None:
            context.load_cert_chain(self.cert_file, self.key_file)
        return context

    def metadata(self) -> dict[str, str]:
        found = {"authorization": f"Bearer {self.token}"} if self.token else {}
        if self.headers is not None:
            found.update(self.headers())
        return found

    def __repr__(self) -> str:  # never print the token
        token = "set" if self.token else "none"
        return f"ClientSecurity(tls={self.uses_tls}, ca_file={self.ca_file!r}, token={token})"


def from_environment(
    prefix: str,
    url: str = "",
    *,
    env: Mapping[str, str] | None = None,
    **given: str | bool | None,
) -> ClientSecurity:
    """Settings from `given` (None: not given), else `<prefix>TLS`, `_CA`, `_CERT`, `_KEY`,
    `_DOMAIN`, `_TOKEN` (`_API_KEY` too) from the environment."""
    env = os.environ if env is None else env

    def pick(name: str, *keys: str) -> str | None:
        value = given.get(name)
        if value is not None and value is not False:
            return str(value)
        for key in keys:
            if env.get(prefix + key):
                return env[prefix + key]
        return None

    tls = bool(given.get("tls")) or (pick("", "TLS") or "").lower() in TRUE
    return ClientSecurity(
        tls=tls or url.startswith("https://"),
        ca_file=pick("ca_file", "CA"),
        cert_file=pick("cert_file", "CERT"),
        key_file=pick("key_file", "KEY"),
        domain=pick("domain", "DOMAIN"),
        token=pick("token", "TOKEN", "API_KEY"),
    )
