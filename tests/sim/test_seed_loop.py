"""The multi-seed loop (`python -m sim --seeds N --jobs J`): worker processes change the wall
time only. Every seed is its own deterministic world, so the outcomes, their order and the exit
status are the same for any number of workers."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

import pytest

from sim.__main__ import main
from sim.seeds import run_seeds


@dataclass
class _Result:
    seed: int
    trace: list[str] | None = None

    @property
    def ok(self) -> bool:
        return self.seed % 3 != 0

    def summary(self) -> dict[str, Any]:
        return {"seed": self.seed, "ok": self.ok}


def _loop(jobs: int, json_lines: bool, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    args = argparse.Namespace(seed=1, seeds=9, jobs=jobs, json=json_lines, trace=None)
    status = run_seeds(args, _Result, lambda result: f"seed {result.seed} failed")
    return status, capsys.readouterr().out


@pytest.mark.parametrize("json_lines", [False, True])
def test_workers_report_the_same_failing_seeds_in_seed_order(
    json_lines: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    alone = _loop(1, json_lines, capsys)
    shared = _loop(3, json_lines, capsys)
    assert alone == shared
    status, out = shared
    assert status == 1
    if json_lines:
        assert [json.loads(line)["seed"] for line in out.splitlines()] == list(range(1, 10))
    else:
        assert out.splitlines() == ["seed 3 failed", "seed 6 failed", "seed 9 failed"]


def _summaries(jobs: int, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    argv = ["--seed", "4", "--seeds", "3", "--duration", "1", "--swarm", "--json"]
    assert main([*argv, "--jobs", str(jobs)]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    for line in lines:
        line.pop("wall_s")
        line.pop("load_wall_s", None)
    return lines


def test_a_real_run_in_two_workers_matches_the_run_in_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    alone = _summaries(1, capsys)
    assert [line["seed"] for line in alone] == [4, 5, 6]
    assert _summaries(2, capsys) == alone
