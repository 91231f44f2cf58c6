"""The broker runs on the allocator its environment names (spec/memory.md, "Giving memory
back"): CPython's by default, glibc's with `PYTHONMALLOC=malloc`, which gives back what closed
streams freed but fragments under message load (bench/RESULTS.md, issue 28 parts 6 and 7). It
says which at start (`event=allocator`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from danube.localcluster.broker_process import BrokerProcess


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    pairs = (item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)
    return dict(pairs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("given", "logged"), [(None, "-"), ("malloc", "malloc")])
def test_the_broker_keeps_the_allocator_it_is_given_and_says_which(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: str | None, logged: str
) -> None:
    if given is None:
        monkeypatch.delenv("PYTHONMALLOC", raising=False)
    broker = BrokerProcess(tmp_path / "data", env={"PYTHONMALLOC": given} if given else None)
    broker.start()
    try:
        assert _environ(broker.pid).get("PYTHONMALLOC") == given
        assert f"event=allocator pythonmalloc={logged}" in broker.log_text()
    finally:
        broker.kill()
