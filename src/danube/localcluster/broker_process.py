"""Starts `danube-broker` as a real subprocess on free loopback ports and stops it again."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

READY = re.compile(
    r"event=broker_ready .*broker_addr=(\S+) admin_addr=(\S+)(?: metrics_addr=(\S+))?"
)
BROKER_BIN = Path(sys.executable).parent / "danube-broker"
START_TIMEOUT_S = 60.0
"""The broker loads its kernels before it reports ready (`event=kernels_ready`): milliseconds
with the ahead-of-time module; with numba's JIT, 0.5–2 s from numba's cache, 5–20 s on a fresh
checkout or after a kernel changed (2 busy cores): the wait covers the compile."""


class BrokerProcess:
    """A broker subprocess. Its stderr is collected in `log_lines` for assertions."""

    def __init__(
        self,
        data_dir: Path,
        *,
        config_file: Path | None = None,
        broker_port: int = 0,
        admin_port: int = 0,
        metrics_port: int | None = 0,
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        log_file: Path | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.config_file = config_file
        self.broker_port = broker_port
        self.admin_port = admin_port
        self.metrics_port = metrics_port
        """The metrics and health endpoint's port (0: a free one); None turns it off."""
        self.extra_args = extra_args
        self.env = env or {}
        self.log_file = log_file
        """Also append the broker's log here (as well as to `log_lines`)."""
        self.process: subprocess.Popen[str] | None = None
        self.log_lines: list[str] = []
        self.broker_addr = ""
        self.admin_addr = ""
        self.metrics_addr = ""
        """host:port of the metrics endpoint once started; empty when it is off."""
        self._ready = threading.Event()
        self._reader: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.broker_addr}"

    @property
    def metrics_url(self) -> str:
        """Base URL of the metrics and health endpoint (`/metrics`, `/healthz`, `/readyz`)."""
        if not self.metrics_addr:
            raise RuntimeError("this broker runs without a metrics endpoint")
        return f"http://{self.metrics_addr}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def command(self) -> list[str]:
        args = [
            str(BROKER_BIN),
            "--broker-addr", f"127.0.0.1:{self.broker_port}",
            "--admin-addr", f"127.0.0.1:{self.admin_port}",
            "--data-dir", str(self.data_dir),
            "--prom-exporter",
            "off" if self.metrics_port is None else f"127.0.0.1:{self.metrics_port}",
            *self.extra_args,
        ]  # fmt: skip
        if self.config_file is not None:
            args += ["--config-file", str(self.config_file)]
        return args

    def start(self) -> BrokerProcess:
        self._ready.clear()
        self.log_lines = []
        env = {**os.environ, "PYTHONWARNINGS": "default", "PYTHONDEVMODE": "", **self.env}
        self.process = subprocess.Popen(
            self.command(),
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C reaches the launcher, which stops us in order
            text=True,
            env=env,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._ready.wait(START_TIMEOUT_S):
            self.kill()
            raise RuntimeError("broker did not become ready:\n" + self.log_text())
        # Later restarts reuse the same ports, as a client expects of a restarted broker.
        self.broker_port = int(self.broker_addr.rsplit(":", 1)[1])
        self.admin_port = int(self.admin_addr.rsplit(":", 1)[1])
        if self.metrics_addr:
            self.metrics_port = int(self.metrics_addr.rsplit(":", 1)[1])
        return self

    def _read(self) -> None:
        assert self.process is not None and self.process.stderr is not None
        sink = self.log_file.open("a") if self.log_file is not None else None
        try:
            for line in self.process.stderr:
                self._take(line)
                if sink is not None:
                    sink.write(line)
                    sink.flush()
        finally:
            if sink is not None:
                sink.close()

    def _take(self, line: str) -> None:
        self.log_lines.append(line.rstrip("\n"))
        match = READY.search(line)
        if match:
            self.broker_addr, self.admin_addr = match.group(1), match.group(2)
            metrics = match.group(3)
            self.metrics_addr = "" if metrics in (None, "off") else metrics
            self._ready.set()

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def loaded_topics(self) -> list[str]:
        """Cluster mode: the topics this broker loaded, in order (from its log; a topic
        that moved away again is still listed)."""
        return re.findall(r"event=topic_loaded topic=(\S+)", self.log_text())

    def log_text(self) -> str:
        return "\n".join(self.log_lines)

    def wait_for_log(self, pattern: str, timeout: float = 10.0) -> str:
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.log_lines):
                if regex.search(line):
                    return line
            time.sleep(0.05)
        raise AssertionError(f"no log line matching {pattern!r}:\n{self.log_text()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        """Sends `sig` and waits for the exit code."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(sig)
        code = self.process.wait(timeout)
        if self._reader is not None:
            self._reader.join(5)
        return code

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        if self._reader is not None:
            self._reader.join(5)

    def __enter__(self) -> BrokerProcess:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.kill()
