"""A data directory of N idle reliable topics made in minutes, for timing a restart at a scale
that creating the topics through a broker (30-60 topics/s on the shared machine: 28-55 minutes
for 100,000) does not reach in a session (issue 23 point 3).

Why clone a broker-written template rather than write the formats here: the point is a
directory a broker would have written, and a second writer of the formats would drift from the
broker's. So a real broker first creates a few topics the way `bench.topic_scale` does (a
reliable producer, one message, a graceful stop); `synthesize` then reads that directory with
the broker's own code and repeats its first topic's keys and WAL under N names:

* metadata: every key of the template topic (those naming `<ns>/<topic>` as two path parts:
  `/topics/..`, `/namespaces/<ns>/topics/..`, `/storage/topics/..`) is renamed part for part
  and its value's strings naming the topic are renamed; the other keys (the namespace's policy)
  are copied once. They are written through `EmbeddedStore` itself, in transactions of
  `_BATCH` puts, so its log, snapshots and compaction are the broker's (revisions differ: the
  broker took several transactions per topic);
* WAL: each segment of the template topic is scanned (`format.scan_segment`), its header
  written again for the new topic (`encode_segment_header`) and each frame's records decoded
  and encoded again with the new topic name (`records.decode`/`encode`, `encode_frame`),
  keeping offsets, publish times and every other field; its `wal.checkpoint` (a durable
  high-water mark, no name in it) is copied as it is once it decodes.

What stays the template's: timestamps (segment creation, publish times). Producer ids are
drawn anew for each clone (`records.new_id`, from a seeded generator), in the keys, values and
stored records alike: a broker's are random and unique across its topics. `check_equivalent`
compares a synthesized directory with one a broker created with the same topics, and `python -m
bench.topic_synth --check 200` runs that comparison and a restart of both.

Files are written without fsync (the restart it serves reads them from the page cache, as a
restart right after a graceful stop does; a cold cache would be slower and is not measured).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from danube import keys
from danube.machines.node.records import new_id
from danube.machines.wal import records
from danube.machines.wal.checkpoint import CHECKPOINT_NAME, decode_checkpoint
from danube.machines.wal.format import (
    decode_frame,
    encode_frame,
    encode_segment_header,
    scan_segment,
    segment_base,
)
from danube.metadata.embedded import EmbeddedStore
from danube.metadata.model import JSONValue, Put
from danube.values.names import parse_topic

_BATCH = 1_000
"""Puts per transaction when writing the synthesized metadata."""


def topic_name(index: int) -> str:
    """The names `bench.topic_scale` gives its topics."""
    return f"/default/idle-{index}"


def renamed_key(
    key: str, template: str, topic: str, ids: Mapping[int, int] | None = None
) -> str | None:
    """`key` with the template topic's `<ns>/<local>` parts replaced by `topic`'s (and a
    producer id part by its clone's, `ids`), None for a key that does not name the template
    topic (shared by all topics)."""
    old, new = parse_topic(template), parse_topic(topic)
    parts = key.split("/")
    for at in range(len(parts) - 1):
        if parts[at] == old.namespace and parts[at + 1] == old.local:
            rest = [str(ids.get(int(p), p)) if ids and p.isdigit() else p for p in parts[at + 2 :]]
            return "/".join([*parts[:at], new.namespace, new.local, *rest])
    return None


def renamed_value(
    value: JSONValue, template: str, topic: str, ids: Mapping[int, int] | None = None
) -> JSONValue:
    """`value` with every string naming the template topic (full name or `<ns>/<local>`)
    naming `topic` instead, and every producer id of `ids` its clone's."""
    if isinstance(value, str):
        if value == template:
            return topic
        if value == template.lstrip("/"):
            return topic.lstrip("/")
        return value
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return ids.get(value, value) if ids else value
    if isinstance(value, list):
        return [renamed_value(v, template, topic, ids) for v in value]
    if isinstance(value, dict):
        return {k: renamed_value(v, template, topic, ids) for k, v in value.items()}
    return value


def renamed_segment(data: bytes, topic: str, ids: Mapping[int, int] | None = None) -> bytes:
    """A WAL segment of another topic written again for `topic`: its header and every
    record's topic name (and producer id, `ids`), through the WAL's own encoders; offsets,
    times and the rest kept."""
    scan = scan_segment(data)
    out = [encode_segment_header(topic, scan.header.base_offset, scan.header.created_ms)]
    for position in scan.positions:
        frame = decode_frame(data, position)
        again = []
        for raw in frame.records:
            record = records.decode(raw)
            record.topic_name = topic
            if ids:
                record.producer_id = ids.get(record.producer_id, record.producer_id)
            again.append(records.encode(record))
        out.append(encode_frame(frame.base_offset, frame.publish_ms, again))
    return b"".join(out)


@dataclass(frozen=True)
class Template:
    """What one broker-created topic left: its keys, the shared keys and its WAL files."""

    topic: str
    own: dict[str, JSONValue]
    shared: dict[str, JSONValue]
    wal_files: dict[str, bytes]
    """File name to bytes, of the topic's WAL directory."""
    producer_ids: tuple[int, ...]
    """Ids of its stored producers: a broker numbers producers across all topics
    (`records.new_id`), so each clone's get ids of their own."""


async def _scan(metadata_dir: Path) -> dict[str, JSONValue]:
    """Every durable key of a broker's metadata directory, read by the broker's store."""
    store = await EmbeddedStore.open(metadata_dir)
    try:
        return {kv.key: kv.value for kv in await store.scan("") if kv.lease is None}
    finally:
        await store.aclose()


def read_template(data_dir: Path, topic: str = topic_name(0)) -> Template:
    """The template topic of a stopped broker's data directory (`<root>/data`)."""
    entries = trio.run(_scan, data_dir / "metadata")
    own = {k: v for k, v in entries.items() if renamed_key(k, topic, topic) is not None}
    # Keys of the template directory's other topics are not copied: the clones replace them.
    shared = {k: v for k, v in entries.items() if k not in own and "/default/idle-" not in k}
    name = parse_topic(topic)
    wal_dir = data_dir / "wal" / name.namespace / name.local
    wal_files = {p.name: p.read_bytes() for p in sorted(wal_dir.iterdir()) if p.is_file()}
    for file_name, content in wal_files.items():
        if file_name == CHECKPOINT_NAME:  # names no topic: copied as it is
            if decode_checkpoint(content) is None:
                raise ValueError(f"{wal_dir / file_name}: no valid checkpoint")
        elif segment_base(file_name) is None:
            raise ValueError(f"{wal_dir / file_name}: not a segment, cannot be renamed")
    if not own or not wal_files:
        raise ValueError(f"{data_dir}: no keys or no WAL of {topic}")
    producer_ids = []
    for key in own:
        parsed = keys.parse_topic_key(key)
        if isinstance(parsed, keys.ProducerKey):
            producer_ids.append(parsed.producer_id)
        elif parsed is not None and not isinstance(parsed, keys.TopicKey):
            raise ValueError(f"{key}: the template topic must have only producers")
    return Template(topic, own, shared, wal_files, tuple(producer_ids))


async def _write_metadata(metadata_dir: Path, entries: Iterator[tuple[str, JSONValue]]) -> None:
    store = await EmbeddedStore.open(metadata_dir)
    try:
        batch: list[Put] = []
        for key, value in entries:
            batch.append(Put(key, value))
            if len(batch) == _BATCH:
                await store.txn((), batch)
                batch = []
        if batch:
            await store.txn((), batch)
    finally:
        await store.aclose()


def synthesize(template_root: Path, out_root: Path, topics: int, seed: int = 1) -> None:
    """`out_root` (a `--restart-only` directory: `broker.yaml` and `data/`) with `topics`
    copies of `template_root`'s first topic, named as `bench.topic_scale` names them."""
    template = read_template(template_root / "data")
    data = out_root / "data"
    data.mkdir(parents=True)
    shutil.copy(template_root / "broker.yaml", out_root / "broker.yaml")
    shutil.copy(template_root / "data" / "broker_id", data / "broker_id")

    rng, taken = random.Random(seed), dict[int, object]()
    producer_ids: list[dict[int, int]] = []
    for _ in range(topics):
        ids = {old: new_id(rng, taken) for old in template.producer_ids}
        taken.update(dict.fromkeys(ids.values()))
        producer_ids.append(ids)

    def entries() -> Iterator[tuple[str, JSONValue]]:
        yield from template.shared.items()
        for index in range(topics):
            topic, ids = topic_name(index), producer_ids[index]
            for key, value in template.own.items():
                renamed = renamed_key(key, template.topic, topic, ids)
                assert renamed is not None
                yield renamed, renamed_value(value, template.topic, topic, ids)

    trio.run(_write_metadata, data / "metadata", entries())
    for index in range(topics):
        topic = parse_topic(topic_name(index))
        wal_dir = data / "wal" / topic.namespace / topic.local
        wal_dir.mkdir(parents=True)
        for file_name, content in template.wal_files.items():
            if file_name != CHECKPOINT_NAME:
                content = renamed_segment(content, topic.full, producer_ids[index])
            (wal_dir / file_name).write_bytes(content)


# -- the equivalence check ------------------------------------------------------------------------


def _normalized_records(data: bytes) -> list[tuple[Any, ...]]:
    """A segment's records without what a clone keeps from its template: publish times, the
    producer id and the request id (per producer), and frame times."""
    scan = scan_segment(data)
    out: list[tuple[Any, ...]] = [(scan.header.base_offset, scan.header.topic, scan.state.value)]
    for position in scan.positions:
        frame = decode_frame(data, position)
        for raw in frame.records:
            record = records.decode(raw)
            record.publish_time = record.producer_id = record.request_id = 0
            out.append((frame.base_offset, len(frame.records), records.encode(record)))
    return out


def _without_producer_ids(entries: dict[str, JSONValue]) -> tuple[dict[str, JSONValue], list[int]]:
    """`entries` with each producer key's id part and value's `producer_id` as `*` (random in
    both directories), and the ids."""
    out: dict[str, JSONValue] = {}
    ids = []
    for key, value in entries.items():
        parsed = keys.parse_topic_key(key)
        if isinstance(parsed, keys.ProducerKey) and isinstance(value, dict):
            ids.append(parsed.producer_id)
            key = key.removesuffix(str(parsed.producer_id)) + "*"
            value = {**value, "producer_id": "*"}
        out[key] = value
    return out, ids


def check_equivalent(created: Path, synthesized: Path, topics: int) -> list[str]:
    """Differences between a broker-created `--keep` directory and a synthesized one with the
    same topics: key sets, values (exactly), WAL file names and records (modulo times and
    producer ids). An empty list: equivalent."""
    differences: list[str] = []
    roots = (created, synthesized)
    a, ids_a = _without_producer_ids(trio.run(_scan, created / "data" / "metadata"))
    b, ids_b = _without_producer_ids(trio.run(_scan, synthesized / "data" / "metadata"))
    if len(set(ids_b)) != len(ids_b) or len(ids_b) != len(ids_a):
        differences.append(
            f"producer ids: {len(ids_a)} created, {len(ids_b)} synthesized, "
            f"{len(set(ids_b))} of them distinct"
        )
    for key in sorted(a.keys() - b.keys())[:20]:
        differences.append(f"key only in the created directory: {key}")
    for key in sorted(b.keys() - a.keys())[:20]:
        differences.append(f"key only in the synthesized directory: {key}")
    for key in sorted(a.keys() & b.keys()):
        if a[key] != b[key]:
            differences.append(f"value of {key}: {a[key]!r} != {b[key]!r}")
    for index in range(topics):
        topic = parse_topic(topic_name(index))
        dirs = [root / "data" / "wal" / topic.namespace / topic.local for root in roots]
        names = [sorted(p.name for p in d.iterdir()) for d in dirs]
        if names[0] != names[1]:
            differences.append(f"WAL files of {topic.full}: {names[0]} != {names[1]}")
            continue
        for file_name in names[0]:
            read = decode_checkpoint if file_name == CHECKPOINT_NAME else _normalized_records
            one, other = (read((d / file_name).read_bytes()) for d in dirs)
            if one != other:
                differences.append(f"records of {topic.full}/{file_name}: {one} != {other}")
    return differences


async def replay(root: Path, sample: list[int], start_timeout: float) -> list[tuple[Any, ...]]:
    """Starts a broker on `root`, and for each sampled topic reads its stored messages from
    the earliest, publishes one more and reads it: (topic, offset, payload) of each."""
    from danube.client import DanubeClient, DispatchStrategy
    from danube.localcluster import broker_process
    from danube.localcluster.broker_process import BrokerProcess

    broker_process.START_TIMEOUT_S = start_timeout
    broker = BrokerProcess(root / "data", config_file=root / "broker.yaml", metrics_port=None)
    seen: list[tuple[Any, ...]] = []
    broker.start()
    try:
        async with DanubeClient(broker.url) as client:
            for index in sample:
                topic = topic_name(index)
                consumer = client.consumer(topic, "replay", "replay", start="earliest")
                await consumer.subscribe()
                first = await asyncio.wait_for(consumer.receive(), 30)
                producer = client.producer(
                    topic, "again", dispatch=DispatchStrategy.RELIABLE, batching=None
                )
                await producer.create()
                await producer.send(b"again")
                second = await asyncio.wait_for(consumer.receive(), 30)
                await producer.__aexit__()
                await consumer.close()
                for message in (first, second):
                    seen.append((message.topic, message.offset, message.payload))
    finally:
        if broker.alive:
            broker.stop(timeout=start_timeout)
    return seen


def _created(root: Path, topics: int, start_timeout: float) -> None:
    """`topics` topics created through a broker as `bench.topic_scale` does, kept in `root`."""
    from bench.topic_scale import CONFIG, Result, _fill
    from danube.localcluster import broker_process
    from danube.localcluster.broker_process import BrokerProcess

    broker_process.START_TIMEOUT_S = start_timeout
    (root / "broker.yaml").write_text(CONFIG)
    broker = BrokerProcess(root / "data", config_file=root / "broker.yaml", metrics_port=None)
    broker.start()
    args = argparse.Namespace(topics=topics, bucket=topics, concurrency=8)
    try:
        asyncio.run(_fill(broker, args, Result(topics, 8, fresh_rss_mib=0.0)))
    finally:
        broker.stop(timeout=start_timeout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--template", type=Path, default=None, help="a --keep directory")
    parser.add_argument("--out", type=Path, default=None, help="the directory to make")
    parser.add_argument("--topics", type=int, default=100_000)
    parser.add_argument(
        "--check", type=int, default=None, metavar="N",
        help="instead: create N topics through a broker, synthesize N, compare and replay both",
    )  # fmt: skip
    parser.add_argument("--dir", type=Path, default=Path("/tmp"))
    parser.add_argument("--start-timeout", type=float, default=600.0)
    args = parser.parse_args()
    if args.check is not None:
        created = Path(args.dir) / f"danube-synth-check-created-{time.time_ns()}"
        synthesized = created.with_name(created.name.replace("created", "synthesized"))
        created.mkdir(parents=True)
        _created(created, args.check, args.start_timeout)
        synthesize(created, synthesized, args.check)
        differences = check_equivalent(created, synthesized, args.check)
        for line in differences[:40]:
            print(line)
        print(f"{len(differences)} differences in the stored state ({created}, {synthesized})")
        step = max(1, args.check // 10)
        sample = [*range(0, args.check, step), args.check - 1]
        served = [
            asyncio.run(replay(r, sample, args.start_timeout)) for r in (created, synthesized)
        ]
        same = "the same" if served[0] == served[1] else "DIFFERENT"
        print(f"replay of {len(sample)} topics: {same}")
        if served[0] != served[1]:
            print(served[0], served[1], sep="\n")
        return
    if args.template is None:
        template = Path(args.dir) / f"danube-synth-template-{time.time_ns()}"
        template.mkdir(parents=True)
        _created(template, 1, args.start_timeout)
        args.template = template
    out = args.out or Path(args.dir) / f"danube-topic-scale-synth-{args.topics}"
    started = time.perf_counter()
    synthesize(args.template, out, args.topics)
    took = time.perf_counter() - started
    print(f"{args.topics:,} topics synthesized in {out} after {took:.1f} s")
    print(
        f"time a restart: python -m bench.topic_scale --topics {args.topics} --restart-only {out}"
    )


if __name__ == "__main__":
    main()
