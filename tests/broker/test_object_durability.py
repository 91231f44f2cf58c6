"""The `object` acknowledgement level through a real broker process (spec/durability.md): every
acknowledged publish survives the broker being killed and its whole local WAL directory lost,
because a publish is answered only once its object is indexed. With `fsync` the same loss
takes the unsealed tail with it, which is why the level exists."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from danube.client import DanubeClient, DispatchStrategy, SubType
from danube.localcluster.broker_process import BrokerProcess
from tests.support.aio import receive_for, receive_n, run, unique_topic

pytestmark = pytest.mark.slow

MESSAGES = 200


def _config(tmp_path: Path, durability: str) -> Path:
    path = tmp_path / "broker.yaml"
    path.write_text(
        "storage:\n"
        "  mode: shared_fs\n"
        "  durable:\n"
        f"    root: file://{tmp_path / 'shared'}\n"
        "  wal:\n"
        f"    durability: {durability}\n"
        "    rotation:\n"
        "      max_bytes: 16777216\n"  # nothing seals by size in this test
    )
    return path


async def _produce(url: str, topic: str, producers: int = 4) -> None:
    """Concurrent producers, so that publishes share the object batches as they would."""
    async with DanubeClient(url) as client:
        created = [
            await client.producer(topic, f"p{i}", dispatch=DispatchStrategy.RELIABLE).create()
            for i in range(producers)
        ]

        async def send(index: int) -> None:
            for n in range(index, MESSAGES, producers):
                await created[index].send(f"{n:06d}".encode())

        await asyncio.gather(*(send(i) for i in range(producers)))


async def _read_from_earliest(url: str, topic: str, count: int | None) -> list[tuple[int, int]]:
    """`count` messages, or (None) whatever arrives within three seconds."""
    async with DanubeClient(url) as client:
        consumer = client.consumer(
            topic, "reader", "after-loss", sub_type=SubType.EXCLUSIVE, start="earliest"
        )
        async with consumer:
            if count is None:
                messages = await receive_for(consumer, 3)
            else:
                messages = await receive_n(consumer, count, timeout=30)
    return [(m.offset, int(m.payload)) for m in messages]


def _publish_then_lose_the_disk(
    broker_factory: type[BrokerProcess], tmp_path: Path, durability: str
) -> tuple[BrokerProcess, str]:
    """Publishes MESSAGES (each acknowledged), SIGKILLs the broker, deletes its WAL directory
    (metadata and objects remain) and starts a new broker on what is left."""
    config = _config(tmp_path, durability)
    data_dir = tmp_path / "data"
    topic = unique_topic(f"{durability}-ack")
    process = broker_factory(data_dir, config_file=config).start()
    run(lambda: _produce(process.url, topic), timeout=120)
    process.kill()
    shutil.rmtree(data_dir / "wal")
    return broker_factory(data_dir, config_file=config).start(), topic


def test_object_acknowledged_publishes_survive_losing_the_local_wal(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    process, topic = _publish_then_lose_the_disk(broker_factory, tmp_path, "object")
    received = run(lambda: _read_from_earliest(process.url, topic, MESSAGES), timeout=60)
    assert [offset for offset, _ in received] == list(range(MESSAGES)), "in order, no gap"
    assert sorted(n for _, n in received) == list(range(MESSAGES)), "every acknowledged publish"
    assert "Traceback" not in process.log_text(), process.log_text()


def test_fsync_acknowledged_publishes_do_not_survive_losing_the_local_wal(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    process, topic = _publish_then_lose_the_disk(broker_factory, tmp_path, "fsync")
    received = run(lambda: _read_from_earliest(process.url, topic, None), timeout=30)
    # Nothing was sealed, so nothing reached an object: the acknowledged tail is gone.
    assert len(received) < MESSAGES
