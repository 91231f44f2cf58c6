"""The client and the command-line tools start without numba (issue 26): importing it cost
every `--help` 0.3–0.6 s and the first send a JIT compile. The client checksums its batch
frames with the `crc32c` C package; the bytes must be exactly the broker's encoder's."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from danube.client.frame import encode_batch
from danube.machines.wal import batches, format, records

LIGHT = (
    "danube.client",
    "danube.cli.client",
    "danube.cli.admin",
    "danube.cli.broker",
    "danube.cli.local_cluster",
)


@pytest.mark.parametrize("module", LIGHT)
def test_importing_the_tool_loads_no_jit_compiler(module: str) -> None:
    """A fresh interpreter each (this one imported numba long ago); the parser is built too,
    as `--help` builds it."""
    code = (
        f"import sys, {module} as m\n"
        "getattr(m, 'build_parser', lambda: None)()\n"
        "import json; print(json.dumps(sorted(k for k in sys.modules if k.split('.')[0] in "
        "('numba', 'llvmlite', 'numpy'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == []


def test_the_client_uses_the_producer_and_consumer_without_numba() -> None:
    """The names the package exports load lazily: each of them, loaded, still needs no
    numba (the producer's batch path included)."""
    code = (
        "import sys, danube.client as c\n"
        "for name in c.__all__: getattr(c, name)\n"
        "c.DanubeClient; from danube.client.batching import Batch\n"
        "from danube.client.frame import encode_batch; encode_batch([b'x'])\n"
        "print('numba' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"


@pytest.mark.parametrize(
    "payloads",
    [[b""], [b"a"], [b"hello", b"", b"x" * 1000], [bytes(range(256))] * 7],
)
def test_the_client_frame_is_the_broker_frame(payloads: list[bytes]) -> None:
    messages = [
        records.encode(records.Record(request_id=i + 1, payload=p, has_msg_id=False))
        for i, p in enumerate(payloads)
    ]
    frame = encode_batch(messages)
    assert frame == format.encode_frame(0, 0, messages)
    checked = batches.check_batch(frame)
    assert checked.count == len(messages)


def test_a_damaged_client_frame_is_refused_by_the_broker() -> None:
    """The test can fail: a frame whose CRC the client computed wrongly would pass the
    equality above only if both encoders were wrong alike, so the broker's check runs too."""
    frame = bytearray(encode_batch([records.encode(records.Record(payload=b"x"))]))
    frame[0] ^= 1
    with pytest.raises(Exception, match="CRC32C mismatch"):
        batches.check_batch(bytes(frame))
