"""The peer brokers (NATS JetStream, Redis) as throwaway processes on loopback, so the peer
benchmark measures fresh servers with known settings instead of whatever a machine runs."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

PACKAGES = ("nats-server", "redis-server")
"""Debian packages, each named like the binary it installs."""
POLICY_RC_D = Path("/usr/sbin/policy-rc.d")
START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 5.0
# apt-get's complaints that mean its package lists are missing or stale, not that the install
# itself is impossible; only these are worth an `apt-get update` and a second try.
STALE_LISTS = ("Unable to locate package", "has no installation candidate", "apt-get update")


@dataclass(frozen=True, slots=True)
class PeerServer:
    url: str
    host: str
    port: int
    pid: int
    version: str
    """Release number only, e.g. `2.9.10`, as the benchmark labels its results with it."""
    directory: Path


def _binary(name: str) -> str | None:
    # /usr/sbin is not on an ordinary user's PATH, but that is where Debian puts nats-server.
    found = shutil.which(name)
    if found is not None:
        return found
    for folder in ("/usr/sbin", "/usr/bin"):
        candidate = Path(folder) / name
        if os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def ensure_installed() -> None:
    """Installs the Debian packages of the peer servers that are missing (a fresh CI machine
    has neither); raises RuntimeError with a one-line reason when that is not possible."""
    missing = [name for name in PACKAGES if _binary(name) is None]
    if not missing:
        return
    wanted = " ".join(missing)
    if shutil.which("apt-get") is None:
        raise RuntimeError(f"{wanted} not installed and apt-get not available: install {wanted}")
    if os.geteuid() == 0:
        as_root: list[str] = []
    elif shutil.which("sudo") is not None:
        # Without a terminal a password prompt would hang CI; fail instead.
        as_root = ["sudo"] if sys.stdin.isatty() else ["sudo", "-n"]
    else:
        raise RuntimeError(
            f"{wanted} not installed; installing needs root: apt-get install {wanted}"
        )
    install = [
        *as_root,
        "env", "DEBIAN_FRONTEND=noninteractive",
        "apt-get", "install", "-y", "--no-install-recommends", *missing,
    ]  # fmt: skip
    placed_policy = False
    try:
        if not POLICY_RC_D.exists():
            # Exit code 101 tells invoke-rc.d not to start the packages' services: the benchmark
            # starts its own servers, and a system-wide redis on port 6379 would only be in the way.
            _place_policy(as_root)
            placed_policy = True
        done = _run(install)
        if done.returncode != 0 and any(hint in done.stderr for hint in STALE_LISTS):
            _run([*as_root, "env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "update"])
            done = _run(install)
        if done.returncode != 0:
            raise RuntimeError(f"apt-get install {wanted} failed: {_last_line(done)}")
    finally:
        if placed_policy:
            _run([*as_root, "rm", "-f", str(POLICY_RC_D)])
    still_missing = [name for name in PACKAGES if _binary(name) is None]
    if still_missing:
        raise RuntimeError(f"installed {wanted} but found no {' '.join(still_missing)} binary")


def _place_policy(as_root: list[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="policy-rc-d-") as folder:
        script = Path(folder) / "policy-rc.d"
        script.write_text("#!/bin/sh\nexit 101\n")
        done = _run([*as_root, "install", "-m", "0755", str(script), str(POLICY_RC_D)])
    if done.returncode != 0:
        raise RuntimeError(f"could not create {POLICY_RC_D}: {_last_line(done)}")


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            command, capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False
        )
    except OSError as error:
        raise RuntimeError(f"could not run {command[0]}: {error}") from error


def _last_line(done: subprocess.CompletedProcess[str]) -> str:
    # apt-get reports progress on stdout and its reason for failing (`E: ...`) on stderr.
    for stream in (done.stderr, done.stdout):
        lines = [line.strip() for line in stream.splitlines() if line.strip()]
        if lines:
            return lines[-1]
    return f"exit code {done.returncode}"


def _require(name: str) -> str:
    binary = _binary(name)
    if binary is None:
        raise RuntimeError(
            f"{name} not installed (bench.peer_servers.ensure_installed installs it)"
        )
    return binary


def _version(binary: str) -> str:
    done = _run([binary, "--version"])
    match = re.search(r"(\d+\.\d+\.\d+)", done.stdout + done.stderr)
    if match is None:
        raise RuntimeError(f"{binary} --version said nothing like a version: {_last_line(done)}")
    return match.group(1)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def _server(
    name: str, scheme: str, port: int, arguments: Callable[[Path], list[str]]
) -> Iterator[PeerServer]:
    binary = _require(name)
    version = _version(binary)
    with tempfile.TemporaryDirectory(prefix=f"{name}-bench-") as folder:
        directory = Path(folder)
        data = directory / "data"
        data.mkdir()
        log_path = directory / "server.log"
        command = [binary, *arguments(data)]
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C reaches the harness, which stops us in order
            )
        try:
            _wait_for_port(process, port, name, log_path)
            yield PeerServer(
                url=f"{scheme}://127.0.0.1:{port}",
                host="127.0.0.1",
                port=port,
                pid=process.pid,
                version=version,
                directory=data,
            )
        finally:
            process.terminate()
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_for_port(process: subprocess.Popen[bytes], port: int, name: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if process.poll() is not None:
            raise RuntimeError(
                f"{name} exited with code {process.returncode} before accepting connections: "
                f"{_tail(log)}"
            )
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{name} did not accept connections on port {port} within "
                    f"{START_TIMEOUT_S:.0f} s: {_tail(log)}"
                ) from None
            time.sleep(0.05)


def _tail(log: Path, lines: int = 5) -> str:
    text = log.read_text(errors="replace").strip().splitlines()
    return " | ".join(text[-lines:]) if text else "(no output)"


@contextmanager
def nats_server() -> Iterator[PeerServer]:
    """A NATS server with JetStream storing in a private directory."""
    port = _free_port()

    def arguments(data: Path) -> list[str]:
        return ["-js", "-sd", str(data), "-a", "127.0.0.1", "-p", str(port)]

    with _server("nats-server", "nats", port, arguments) as server:
        yield server


@contextmanager
def redis_server(appendfsync: str) -> Iterator[PeerServer]:
    """A Redis server that persists only through its append-only file, fsynced as
    `appendfsync` says (`everysec` or `always`), so a stream's durability is the AOF's."""
    if appendfsync not in ("everysec", "always"):
        raise ValueError(f"appendfsync must be everysec or always, not {appendfsync!r}")
    port = _free_port()

    def arguments(data: Path) -> list[str]:
        return [
            "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data),
            "--appendonly", "yes", "--appendfsync", appendfsync, "--save", "",
        ]  # fmt: skip

    with _server("redis-server", "redis", port, arguments) as server:
        yield server
