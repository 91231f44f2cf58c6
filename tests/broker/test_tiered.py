"""Reliable topics with an object tier, through real broker processes: against a shared
filesystem (`file://`) and against a real S3-compatible HTTP server on loopback (moto's).
History pruned from the local WAL is served from objects with no gap or duplicate, and a
broker that lost its whole WAL directory serves the full history and keeps the offsets
(spec/object-layout.md; issue 5, proofs (a) and (b))."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from danube.client import DanubeClient, DispatchStrategy, SubType
from danube.localcluster.broker_process import BrokerProcess
from danube.testing import free_port
from tests.support.aio import receive_n, run, unique_topic

pytestmark = pytest.mark.slow

MESSAGES = 1500
PAYLOAD = 1024


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server on a free loopback port, with a bucket; credentials in the
    environment (as a real deployment passes them), never in the broker's config."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
    )  # fmt: skip
    endpoint = f"http://127.0.0.1:{port}"
    import s3fs

    from danube.runtime.object_store import io_loop

    # Our own loop, as the broker's ObjectStore: fsspec's default one comes from the global
    # event-loop policy, which trio-asyncio (used by earlier tests) replaces with one that
    # never runs here, and the call then waits forever.
    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint}, loop=io_loop())
    fs.mkdir("danube-history")
    yield endpoint
    server.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _config(path: Path, durable: str, endpoint: str | None) -> Path:
    lines = [
        "storage:",
        f"  mode: {'object_store' if durable.startswith('s3://') else 'shared_fs'}",
        "  durable:",
        f"    root: {durable}",
    ]
    if endpoint:
        lines.append(f"    endpoint: {endpoint}")
    lines += [
        "  local_retention:",
        "    size_mb: 1",
        "  wal:",
        "    rotation:",
        "      max_bytes: 65536",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


async def _produce(url: str, topic: str, first: int, count: int, producers: int = 4) -> None:
    async with DanubeClient(url) as client:
        created = [
            await client.producer(topic, f"p{i}", dispatch=DispatchStrategy.RELIABLE).create()
            for i in range(producers)
        ]

        async def send(index: int) -> None:
            for n in range(first + index, first + count, producers):
                await created[index].send(f"{n:06d}".encode().ljust(PAYLOAD, b"."))

        await asyncio.gather(*(send(i) for i in range(producers)))


async def _read_from_earliest(url: str, topic: str, subscription: str, count: int) -> list[int]:
    """The offsets received, after checking that the payloads are every message sent, once,
    each whole (its number, padded to PAYLOAD bytes)."""
    async with DanubeClient(url) as client:
        consumer = client.consumer(
            topic, "reader", subscription, sub_type=SubType.EXCLUSIVE, start="earliest"
        )
        async with consumer:
            messages = await receive_n(consumer, count, timeout=60)
    numbers = sorted(int(m.payload[:6]) for m in messages)
    assert numbers == list(range(count)), "every message sent, once"
    assert all(m.payload == m.payload[:6].ljust(PAYLOAD, b".") for m in messages)
    return [m.offset for m in messages]


def _wait_for_pruning(wal_dir: Path, objects: int, list_objects: object) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        local = sorted(p.name for p in wal_dir.glob("*.wal"))
        if local and int(local[0][:20]) > 0 and objects <= len(list_objects()):  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise AssertionError(f"the local WAL was not pruned: {sorted(wal_dir.iterdir())}")


@pytest.mark.parametrize("backend", ["file", "s3"])
def test_history_comes_from_objects_and_survives_losing_the_local_wal(
    backend: str,
    broker_factory: type[BrokerProcess],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    endpoint = None
    if backend == "s3":
        endpoint = request.getfixturevalue("s3_endpoint")
        durable = f"s3://danube-history/{tmp_path.name}"
    else:
        durable = f"file://{tmp_path / 'shared'}"
    config = _config(tmp_path / "broker.yaml", durable, endpoint)
    topic = unique_topic("tiered")
    data_dir = tmp_path / "data"
    process = broker_factory(data_dir, config_file=config).start()
    wal_dir = data_dir / "wal" / "default" / topic.rsplit("/", 1)[1]

    from danube.runtime.object_store import ObjectStore

    store = ObjectStore(durable, endpoint=endpoint)
    prefix = f"storage/topics/default/{topic.rsplit('/', 1)[1]}/segments/"
    run(lambda: _produce(process.url, topic, 0, MESSAGES), timeout=120)
    _wait_for_pruning(wal_dir, 3, lambda: store.list(prefix))
    offsets = run(lambda: _read_from_earliest(process.url, topic, "history", MESSAGES))
    assert offsets == list(range(MESSAGES)), "objects then the local tail, no gap, no duplicate"

    assert process.stop() == 0
    shutil.rmtree(data_dir / "wal")  # the local disk is lost; metadata and objects remain
    process = broker_factory(data_dir, config_file=config).start()
    run(lambda: _produce(process.url, topic, MESSAGES, 4), timeout=60)
    offsets = run(lambda: _read_from_earliest(process.url, topic, "replay", MESSAGES + 4))
    assert offsets == list(range(MESSAGES + 4)), "the full history, then offsets continue"
    assert "Traceback" not in process.log_text(), process.log_text()
