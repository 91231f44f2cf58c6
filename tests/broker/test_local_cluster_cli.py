"""`danube-local-cluster` as a user runs it (issue 26, point 6): a broker that dies is
reported and the cluster keeps running; commands on standard input kill, restart and add
brokers; `quit` stops everything cleanly."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
COMMAND = str(Path(sys.executable).with_name("danube-local-cluster"))


class Session:
    """The running command, its output line by line."""

    def __init__(self, root: Path) -> None:
        self.process = subprocess.Popen(
            [COMMAND, "--dir", str(root), "--brokers", "2", "--first-port", "0"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))

    def expect(self, text: str, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                if self.process.poll() is not None:
                    break
                continue
            self.seen.append(line)
            if text in line:
                return line
        raise AssertionError(f"no line with {text!r}; output:\n" + "\n".join(self.seen))

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()


def test_a_dead_broker_is_reported_and_can_be_restarted(tmp_path: Path) -> None:
    session = Session(tmp_path / "cluster")
    try:
        zero = session.expect("broker 0:  http://")
        session.expect("type help for commands")
        # a crash nobody asked for: reported, and the cluster keeps running
        os.kill(int(zero.rsplit("pid ", 1)[1]), signal.SIGKILL)
        session.expect("broker 0 exited (status -9); the others keep running")
        session.send("restart 0")
        session.expect("broker 0:  http://127.0.0.1:")
        session.send("kill 1")
        session.expect("broker 1 killed")
        session.send("status")
        session.expect("broker 1:  exited")
        session.send("nonsense")
        session.expect("? unknown command 'nonsense'")
        session.send("restart 1")
        session.expect("broker 1:  http://127.0.0.1:")
        session.send("add")
        session.expect("broker 2:  http://127.0.0.1:")
        session.send("quit")
        session.expect("stopped")
        assert session.process.wait(60) == 0
    finally:
        if session.process.poll() is None:
            session.process.kill()
