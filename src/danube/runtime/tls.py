"""TLS for the broker's ports and for our clients (spec/security.md, "TLS").

Server side: one `ssl.SSLContext` per port kind (gRPC ports negotiate `h2` by ALPN, the
metrics port HTTP/1.1), TLS 1.2 at least. With a CA file, client certificates are verified
(required with `verify_client`, else optional: a verified one is an identity).

Reload without restart: `CertificateReloader.check` compares the certificate, key and CA
files' modification times and sizes with what it loaded last and, when one changed, loads the
chain again *into the same contexts*: OpenSSL copies a context's certificate into each new
connection, so new handshakes present the new certificate while open connections keep theirs,
and the servers never restart. The client context a broker calls its peers with
(`peers.PEERS.ssl`) is reloaded with them (`follow`): its next connection to a peer presents
the new certificate too. The broker checks every `RELOAD_CHECK_SECONDS` (a watch on
mtimes rather than SIGHUP: it also works where nobody can signal the process, e.g. a
certificate rotated by a sidecar into a mounted volume). A half-written pair (a key that does
not match the certificate) fails to load: the old chain stays and the failure is logged; the
next change retries. A CA file's new certificates are added to the trust store; one removed
from the file stays trusted until a restart (OpenSSL cannot drop a loaded CA).
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Sequence

from danube.values.auth_config import TlsFiles

log = logging.getLogger("danube.runtime")

RELOAD_CHECK_SECONDS = 1.0
GRPC_ALPN = ["h2"]
HTTP_ALPN = ["http/1.1"]


def server_context(files: TlsFiles, alpn: Sequence[str] = GRPC_ALPN) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(list(alpn))
    context.load_cert_chain(files.cert_file, files.key_file)
    if files.ca_file is not None:
        context.load_verify_locations(files.ca_file)
        context.verify_mode = ssl.CERT_REQUIRED if files.verify_client else ssl.CERT_OPTIONAL
    return context


def client_context(
    ca_file: str | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
) -> ssl.SSLContext:
    """What our client, `danube-cli` and `danube-admin` connect with: the system's roots
    unless a CA file is given, a client certificate for mutual TLS when one is given."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(GRPC_ALPN)
    if cert_file is not None:
        context.load_cert_chain(cert_file, key_file)
    return context


def _stamp(path: str | None) -> tuple[int, int] | None:
    if path is None:
        return None
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size


class CertificateReloader:
    """The server contexts of one broker and the files they were loaded from, and the client
    contexts that present the same certificate (`follow`: the one the broker calls its peers
    with), so a rotated certificate reaches servers and peer calls alike."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self.grpc = server_context(files)
        self.http = server_context(files, HTTP_ALPN)
        self.clients: list[ssl.SSLContext] = []
        self._stamps = self._current()
        self.reloads = 0

    def follow(self, context: ssl.SSLContext | None) -> None:
        """Reload `context` (a client context loaded from the same files) with the servers':
        the broker's next connection to a peer presents the new certificate."""
        if context is not None:
            self.clients.append(context)

    def _current(self) -> tuple[tuple[int, int] | None, ...]:
        files = self.files
        return _stamp(files.cert_file), _stamp(files.key_file), _stamp(files.ca_file)

    def check(self) -> bool:
        """Reloads the chain (and CA) into the contexts when a file changed; True if it did."""
        stamps = self._current()
        if stamps == self._stamps:
            return False
        self._stamps = stamps
        files = self.files
        try:
            server_context(files)  # a scratch load first: a bad pair never reaches the live ones
            for context in (self.grpc, self.http, *self.clients):
                context.load_cert_chain(files.cert_file, files.key_file)
                if files.ca_file is not None:
                    context.load_verify_locations(files.ca_file)
        except (OSError, ssl.SSLError) as error:
            log.error(
                "event=tls_reload_failed cert_file=%s reason=%s (the previous certificate "
                "stays in use)",
                files.cert_file, type(error).__name__,
            )  # fmt: skip
            return False
        self.reloads += 1
        log.info("event=tls_reloaded cert_file=%s reloads=%d", files.cert_file, self.reloads)
        return True
