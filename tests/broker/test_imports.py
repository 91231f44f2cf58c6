"""A broker process can use etcd whatever it imported first (a fresh interpreter each). The
store once needed protobuf's pure-Python implementation, chosen once per process; the grpclib
store needs none, and this keeps any later process-wide choice from creeping back in."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "first",
    ["danube.runtime.server", "danube.cli.broker", "danube.runtime.schema_service"],
)
def test_the_etcd_backend_loads_after_the_broker_modules(first: str) -> None:
    code = f"import {first}\nfrom danube.metadata import EtcdStore\nprint(EtcdStore.__name__)"
    env = {k: v for k, v in os.environ.items() if k != "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "EtcdStore"
