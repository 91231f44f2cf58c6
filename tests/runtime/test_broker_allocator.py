"""The broker runs on glibc's malloc unless told otherwise (spec/memory.md, "Giving memory
back"): with CPython's arenas, memory freed after a load stays pinned by the few objects that
live on in each arena (bench/RESULTS.md, issue 28 part 6). `danube-broker` runs itself again
with `PYTHONMALLOC=malloc` when the variable is not set; a set one is kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from danube.localcluster.broker_process import BrokerProcess


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    pairs = (item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)
    return dict(pairs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("given", "expected"), [(None, "malloc"), ("pymalloc", "pymalloc")])
def test_the_broker_runs_on_glibc_malloc_unless_pythonmalloc_is_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: str | None, expected: str
) -> None:
    if given is None:
        monkeypatch.delenv("PYTHONMALLOC", raising=False)
    broker = BrokerProcess(tmp_path / "data", env={"PYTHONMALLOC": given} if given else None)
    broker.start()
    try:
        assert _environ(broker.pid).get("PYTHONMALLOC") == expected
        assert f"event=allocator pythonmalloc={expected}" in broker.log_text()
    finally:
        broker.kill()
