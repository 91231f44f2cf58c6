"""Our protos against the descriptors the official Python client (danube-client) was generated
from: a second, independent source next to spec/upstream-wire.md. The client may lag the broker,
so only what it knows is required of us; anything newer is covered by test_upstream_wire.py."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable
from typing import Any

import pytest

DUMP_SCRIPT = pathlib.Path(__file__).with_name("dump_official_descriptors.py")


@pytest.mark.conformance
def test_official_client_descriptors_exist_identically_in_ours(
    run_official: Callable[..., str], our_wire: dict[str, dict[str, Any]]
) -> None:
    official: dict[str, dict[str, Any]] = json.loads(run_official(str(DUMP_SCRIPT)))

    packages = {e["package"] for e in official.values() if e["kind"] == "file"}
    assert {"danube", "danube_schema"} <= packages, f"official client dump looks wrong: {packages}"

    problems = []
    for name, entry in sorted(official.items()):
        if name not in our_wire:
            problems.append(f"missing in ours: {name} {entry}")
        elif our_wire[name] != entry:
            problems.append(f"{name}:\n  official {entry}\n  ours     {our_wire[name]}")
    assert not problems, "differences from the official client:\n" + "\n".join(problems)
