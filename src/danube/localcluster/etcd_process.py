"""A real single-member `etcd` on free loopback ports in a data directory of its own.

The timings (10 ms heartbeat, 100 ms election timeout) make a fresh member healthy in about a
tenth of a second and also lower etcd's minimum lease TTL to one second, which keeps lease
expiry (and so failover) short in tests and local clusters.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ETCD_BIN = Path(shutil.which("etcd") or "/usr/bin/etcd")
"""etcd from PATH (a release binary, a distribution's package), else Debian's place."""
START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 10.0


def terminate(process: subprocess.Popen[Any], timeout: float) -> None:
    """SIGTERM, then SIGKILL if the process has not exited within `timeout` seconds."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout)


def free_port() -> int:
    # The port may be taken again between here and etcd's bind; `start` retries if it is.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass(frozen=True, slots=True)
class EtcdServerTls:
    """TLS on etcd's client URL (`--cert-file`, `--key-file`) and, with `client_ca_file`,
    client certificates signed by that CA required (`--client-cert-auth`). `probe_*` is what
    this process's own health probe and compaction present and trust."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None
    probe_ca_file: str | None = None
    probe_cert_file: str | None = None
    probe_key_file: str | None = None


class EtcdProcess:
    """One etcd member. Its output goes to `<data_dir>/etcd.log`, quoted when it fails."""

    def __init__(self, data_dir: Path, tls: EtcdServerTls | None = None) -> None:
        self.data_dir = data_dir
        self.log_path = data_dir / "etcd.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.client_port = 0
        self.tls = tls

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.endpoint}"

    def _probe_context(self) -> ssl.SSLContext | None:
        tls = self.tls
        if tls is None:
            return None
        context = ssl.create_default_context(cafile=tls.probe_ca_file)
        if tls.probe_cert_file is not None:
            context.load_cert_chain(tls.probe_cert_file, tls.probe_key_file)
        return context

    def start(self, attempts: int = 3) -> EtcdProcess:
        if not os.access(ETCD_BIN, os.X_OK):
            raise RuntimeError(
                f"no etcd binary at {ETCD_BIN} or on PATH: install the Debian package "
                "etcd-server (`bash scripts/bootstrap.sh` does) or an etcd release binary"
            )
        for _ in range(attempts):
            self._spawn()
            if self._wait_healthy():
                return self
            self.stop()
        raise RuntimeError(
            f"etcd did not become healthy within {START_TIMEOUT_S} s ({attempts} attempts):\n"
            + self.log_tail()
        )

    def _spawn(self) -> None:
        self.client_port, peer_port = free_port(), free_port()
        member_dir = self.data_dir / f"member-{self.client_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        command = [
            str(ETCD_BIN),
            "--name", "test",
            "--data-dir", str(member_dir),
            "--listen-client-urls", self.url,
            "--advertise-client-urls", self.url,
            "--listen-peer-urls", peer_url,
            "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"test={peer_url}",
            "--heartbeat-interval", "10",
            "--election-timeout", "100",
        ]  # fmt: skip
        if self.tls is not None:
            command += ["--cert-file", self.tls.cert_file, "--key-file", self.tls.key_file]
            if self.tls.client_ca_file is not None:
                command += ["--client-cert-auth", "--trusted-ca-file", self.tls.client_ca_file]
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # outlives a Ctrl-C until the brokers have stopped
            )

    def _wait_healthy(self) -> bool:
        assert self.process is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False  # most likely a port taken between free_port() and the bind
            try:
                with urllib.request.urlopen(
                    f"{self.url}/health", timeout=1, context=self._probe_context()
                ) as response:
                    if json.load(response).get("health") == "true":
                        return True
            except (OSError, ValueError):
                pass
            time.sleep(0.02)
        return False

    def compact(self, revision: int) -> None:
        """Drops the history before `revision`, through etcd's JSON gateway, so tests need no
        etcd client of their own."""
        body = json.dumps({"revision": revision, "physical": True}).encode()
        request = urllib.request.Request(f"{self.url}/v3/kv/compaction", data=body)
        with urllib.request.urlopen(request, timeout=10, context=self._probe_context()) as response:
            response.read()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if etcd has not exited within STOP_TIMEOUT_S."""
        if self.process is not None:
            terminate(self.process, STOP_TIMEOUT_S)
        self.process = None

    def __enter__(self) -> EtcdProcess:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
