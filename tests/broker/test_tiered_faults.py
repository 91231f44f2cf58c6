"""The object tier under faults, through real broker processes against moto's S3 server on
loopback (spec/object-layout.md; issue 5, proofs (c) and (d)):

(c) with the S3 endpoint answering `SlowDown`, `InternalError` and stalling part of the
    time (`tests/support/flaky_s3.py` in front of moto), nothing acknowledged is lost and the
    uploads catch up once the store behaves;
(d) the state a crash between upload and index commit leaves (an object nobody indexed) is
    never served, is overwritten by the re-upload, and an orphan below the end of the index
    is collected by the orphan scan.

The metadata index is checked directly, by opening the broker's embedded metadata store after
a graceful stop; objects are read from moto directly, past the proxy.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import trio

from danube.client import DanubeClient, DispatchStrategy, Message, SubType
from danube.kernels import crc32c
from danube.localcluster.broker_process import BrokerProcess
from danube.machines.tiering import layout
from danube.machines.tiering.index import IndexEntry, validate_index
from danube.machines.wal import format
from danube.metadata.embedded import EmbeddedStore
from danube.metadata.model import Delete, Put
from danube.testing import free_port
from danube.values.names import parse_topic
from tests.support.aio import receive_n, run, unique_topic
from tests.support.flaky_s3 import (
    INTERNAL_ERROR_MESSAGE,
    SLOWDOWN_MESSAGE,
    FaultRates,
    FlakyS3Proxy,
)

pytestmark = pytest.mark.slow

BUCKET = "danube-faults"
PAYLOAD = 1024
PRODUCERS = 4
SEGMENT_BYTES = 65536
FAILURE_EVENTS = ("Traceback", "event=tier_halted", "event=topic_stopped", "retention_skipped")
"""Log marks that mean the tier gave up or history went missing: none is acceptable here."""


@pytest.fixture(scope="module")
def s3_server() -> Iterator[str]:
    """moto's S3 server on a free loopback port, in this process (so a test can backdate an
    object, which S3 itself never allows), with a bucket; credentials in the environment,
    as a deployment passes them."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    names = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
    )  # fmt: skip
    endpoint = f"http://127.0.0.1:{port}"
    _Bucket(endpoint, "").fs.mkdir(BUCKET)
    yield endpoint
    server.stop()
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


class _Bucket:
    """The test's own view of the objects under one durable root: straight to moto, never
    through the proxy, and without s3fs's listing cache (the broker changes the bucket)."""

    def __init__(self, endpoint: str, root: str) -> None:
        import s3fs

        from danube.runtime.object_store import io_loop

        self.fs = s3fs.S3FileSystem(
            client_kwargs={"endpoint_url": endpoint},
            use_listings_cache=False,
            skip_instance_cache=True,
            loop=io_loop(),  # not fsspec's default loop: see test_tiered.s3_endpoint
        )
        self.root = root

    def _path(self, key: str) -> str:
        return f"{BUCKET}/{self.root}/{key}"

    def keys(self, prefix: str) -> list[str]:
        self.fs.invalidate_cache()
        base = f"{BUCKET}/{self.root}/"
        return sorted(path[len(base) :] for path in self.fs.find(self._path(prefix)))

    def get(self, key: str) -> bytes:
        return bytes(self.fs.cat_file(self._path(key)))

    def put(self, key: str, data: bytes) -> None:
        self.fs.pipe_file(self._path(key), data)

    def backdate(self, key: str, hours: float) -> None:
        """Makes the object look `hours` old to a listing (moto's model; real S3 has no way)."""
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.s3.models import s3_backends

        stored = s3_backends[DEFAULT_ACCOUNT_ID]["aws"].get_object(BUCKET, f"{self.root}/{key}")
        assert stored is not None, key
        stored.last_modified = stored.last_modified - timedelta(hours=hours)


def _config(path: Path, durable: str, endpoint: str, segment_bytes: int = SEGMENT_BYTES) -> Path:
    path.write_text(
        "\n".join(
            [
                "storage:",
                "  mode: object_store",
                "  durable:",
                f"    root: {durable}",
                f"    endpoint: {endpoint}",
                "  local_retention:",
                "    size_mb: 1",
                "  wal:",
                "    rotation:",
                f"      max_bytes: {segment_bytes}",
            ]
        )
        + "\n"
    )
    return path


def _payload(number: int) -> bytes:
    return f"{number:06d}".encode().ljust(PAYLOAD, b".")


async def _produce(url: str, topic: str, first: int, count: int) -> None:
    """Messages `first` … `first + count - 1`, message n by producer `p{n % PRODUCERS}`, each
    acknowledged by the broker before `send` returns."""
    async with DanubeClient(url) as client:
        created = [
            await client.producer(topic, f"p{i}", dispatch=DispatchStrategy.RELIABLE).create()
            for i in range(PRODUCERS)
        ]

        async def send(index: int) -> None:
            start = first + (index - first) % PRODUCERS
            for n in range(start, first + count, PRODUCERS):
                await created[index].send(_payload(n))

        await asyncio.gather(*(send(i) for i in range(PRODUCERS)))


async def _read_from_earliest(url: str, topic: str, subscription: str, count: int) -> list[Message]:
    async with DanubeClient(url) as client:
        consumer = client.consumer(
            topic, "reader", subscription, sub_type=SubType.EXCLUSIVE, start="earliest"
        )
        async with consumer:
            return await receive_n(consumer, count, timeout=45)


def _assert_history(messages: list[Message], count: int) -> None:
    """Offsets 0 … count-1 in order, every acknowledged message exactly once with its own
    bytes, and each producer's messages in the order it sent them."""
    assert [m.offset for m in messages] == list(range(count)), "no gap, no duplicate"
    numbers = [int(m.payload[:6]) for m in messages]
    assert sorted(numbers) == list(range(count)), "every acknowledged message exactly once"
    for message, number in zip(messages, numbers, strict=True):
        assert message.payload == _payload(number), f"offset {message.offset} payload corrupted"
        assert message.producer_name == f"p{number % PRODUCERS}"
    for producer in range(PRODUCERS):
        sent = [n for n in numbers if n % PRODUCERS == producer]
        assert sent == sorted(sent), f"producer p{producer} reordered"


def _index(data_dir: Path, topic: str) -> tuple[list[IndexEntry], dict[str, object]]:
    """The topic's object index and the rest of its index prefix (the `cur` pointer), read from
    the stopped broker's metadata store."""
    prefix = layout.index_prefix(parse_topic(topic))

    async def scan() -> list[tuple[str, object]]:
        store = await EmbeddedStore.open(data_dir / "metadata")
        try:
            return [(kv.key, kv.value) for kv in await store.scan(prefix)]
        finally:
            await store.aclose()

    found = trio.run(scan)
    entries = [IndexEntry.from_json(v) for k, v in found if layout.index_start(k) is not None]
    others = {k: v for k, v in found if layout.index_start(k) is None}
    return sorted(entries, key=lambda e: e.start_offset), others


def _unindex_last(data_dir: Path, topic: str) -> IndexEntry:
    """Takes the newest index entry back out, as if the broker had died after uploading that
    segment and before committing its entry (the `cur` pointer goes back with it)."""
    entries, _ = _index(data_dir, topic)
    last, previous = entries[-1], entries[-2]
    name = parse_topic(topic)

    async def drop() -> None:
        store = await EmbeddedStore.open(data_dir / "metadata")
        try:
            result = await store.txn(
                [],
                [
                    Delete(layout.index_path(name, last.start_offset)),
                    Put(layout.current_path(name), layout.current_value(previous.start_offset)),
                ],
            )
            assert result.succeeded
        finally:
            await store.aclose()

    trio.run(drop)
    return last


def _wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting until {what}")


def _local_bases(wal_dir: Path) -> list[int]:
    return sorted(
        b for p in wal_dir.glob("*.wal") if (b := format.segment_base(p.name)) is not None
    )


def _chain_end(keys: list[str], topic: str) -> int:
    """Where the contiguous run of objects from offset 0 ends (0: no object starts at 0)."""
    end = 0
    for start, next_offset in sorted(
        filter(None, (layout.parse_object_key(parse_topic(topic), k) for k in keys))
    ):
        if start > end:
            break
        if start == end:
            end = next_offset
    return end


def _assert_clean_log(process: BrokerProcess) -> None:
    bad = [line for line in process.log_lines if any(mark in line for mark in FAILURE_EVENTS)]
    assert not bad, "the broker log shows failures:\n" + "\n".join(bad)


def test_uploads_ride_out_s3_errors_and_stalls(
    s3_server: str,
    broker_factory: type[BrokerProcess],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Proof (c). 1,500 reliable 1 KiB messages (about 50 segments of 32 KiB, 1 MiB of local
    retention) are produced while 40% of S3 requests misbehave: 10% `503 SlowDown`, 10%
    `500 InternalError`, 10% `500` after the PUT landed (the object exists, the broker is told
    it failed), 10% stalled 1-2 s. The faults stay on until each kind was injected and an
    `InternalError` reached the broker; then a SlowDown storm (every request refused) until a
    SlowDown reaches the broker; then no faults. Every acknowledged message comes back once,
    in order, with its bytes (the first 400 also to a reader while GETs fail 25% of the time);
    the index ends up contiguous over all 1,500 offsets and names exactly the objects in the
    bucket, each matching its size, its CRC32C and the local segment.

    botocore (legacy retry mode: 5 attempts, backoff up to 8 s) absorbs almost every fault on
    its own and makes each faulted request take seconds, so the broker runs with
    `AWS_MAX_ATTEMPTS=1` (the SDK's own setting, from the environment) to let faults reach the
    broker's retry paths. s3fs still retries `SlowDown` 5 times itself, so a SlowDown reaches
    the broker only in a storm. Observed with this seed (the same on every run: uploads are
    sequential, so the seeded decisions meet the same requests): 18 PUTs in the mixed phase
    (1 SlowDown absorbed by s3fs, 1 InternalError, 3 lost replies, 1 stall), 4
    `upload_failed kind=server_error`; the storm's SlowDown reaches the broker as
    `OSError(16, 'Reduce your request rate.')`, which `classify` reads as `throttled`
    (`test_s3_slowdown_is_classified_as_throttling`; asserted last here so that everything
    else is still checked); the faulty read saw ~35 failed GETs.
    """
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    mixed = FaultRates(
        throttled=0.10, server_error=0.10, stalled=0.10, lost_reply=0.10, stall_seconds=(1.0, 2.0)
    )
    topic = unique_topic("flaky")
    short = topic.rsplit("/", 1)[1]
    durable = f"s3://{BUCKET}/{tmp_path.name}"
    bucket = _Bucket(s3_server, tmp_path.name)
    prefix = layout.object_prefix(parse_topic(topic))
    data_dir = tmp_path / "data"
    wal_dir = data_dir / "wal" / "default" / short
    total = 1500

    with FlakyS3Proxy(s3_server, mixed, seed=20261122) as proxy:
        config = _config(tmp_path / "broker.yaml", durable, proxy.url, segment_bytes=32768)
        process = broker_factory(data_dir, config_file=config).start()
        proxy.faults_on = True
        run(lambda: _produce(process.url, topic, 0, 1000), timeout=60)
        kinds = ("throttled", "server_error", "stalled", "lost_reply")
        _wait_until(
            lambda: all(proxy.injected(kind) for kind in kinds), 30, "every fault was injected"
        )
        process.wait_for_log(
            rf"event=upload_failed .*{re.escape(INTERNAL_ERROR_MESSAGE)}", timeout=30
        )

        mixed_phase = proxy.snapshot()
        proxy.rates = FaultRates(throttled=1.0)  # a storm: every request told to slow down
        run(lambda: _produce(process.url, topic, 1000, total - 1000), timeout=60)
        process.wait_for_log(rf"event=upload_failed .*{re.escape(SLOWDOWN_MESSAGE)}", timeout=30)
        proxy.faults_on = False
        uploads_faulted = proxy.snapshot()

        def caught_up() -> bool:
            local = _local_bases(wal_dir)
            end = _chain_end(bucket.keys(prefix), topic)
            return bool(local) and local[0] > 0 and end == local[-1]

        _wait_until(caught_up, 30, "every sealed segment is uploaded and the WAL pruned")
        assert _local_bases(wal_dir)[0] > 0, "history below the WAL is served from objects"
        messages = run(lambda: _read_from_earliest(process.url, topic, "history", total), 60)
        _assert_history(messages, total)

        proxy.rates = FaultRates(throttled=0.10, server_error=0.15)
        proxy.faults_on = True  # history reads (range GETs) now fail a quarter of the time
        from_objects = min(_local_bases(wal_dir)[0], 400)  # a prefix, to keep the test short
        again = run(lambda: _read_from_earliest(process.url, topic, "flaky", from_objects), 60)
        proxy.faults_on = False
        assert [(m.offset, m.payload) for m in again] == [
            (m.offset, m.payload) for m in messages[:from_objects]
        ], "the same history, read from objects while the store fails"
        assert process.stop() == 0
        counts = proxy.snapshot()

    assert all(uploads_faulted.get(f"PUT {kind}") for kind in kinds), uploads_faulted
    assert counts.get("GET server_error"), counts
    text = process.log_text()
    failures = re.findall(r"event=upload_failed .*kind=(\w+) error=(.*)", text)
    assert ("server_error", INTERNAL_ERROR_MESSAGE) in {
        (kind, error.split("'")[1]) for kind, error in failures
    }, f"an InternalError reached the broker's upload retry path: {failures}"
    assert "event=object_read_failed" in text, "a GET error reached the broker's read retry"
    _assert_clean_log(process)

    entries, others = _index(data_dir, topic)
    assert validate_index(entries) == [], validate_index(entries)
    assert entries[0].start_offset == 0 and entries[-1].next_offset == total, (
        "the graceful stop indexed the sealed tail: the index covers every offset"
    )
    assert others == {
        layout.current_path(parse_topic(topic)): {"start": f"{entries[-1].start_offset:020d}"}
    }
    assert bucket.keys(prefix) == [e.key for e in entries], "no object beside the indexed ones"
    for entry in entries:
        data = bucket.get(entry.key)
        assert (len(data), crc32c(data)) == (entry.size, entry.crc32c), entry.key
        local = wal_dir / format.segment_name(entry.start_offset)
        if local.exists():
            assert local.read_bytes() == data, f"{entry.key} differs from its local segment"
    print(f"proxy: mixed phase {mixed_phase}, uploads {uploads_faulted}, all {counts}")

    throttled = [(kind, error) for kind, error in failures if SLOWDOWN_MESSAGE in error]
    assert throttled, "the SlowDown storm reached the broker's retry path"
    assert {kind for kind, _ in throttled} == {"throttled"}, (
        f"S3 SlowDown must be classified as throttling (spec/object-layout.md): {throttled}"
    )


def test_unindexed_objects_are_never_served_and_get_overwritten(
    s3_server: str,
    broker_factory: type[BrokerProcess],
    tmp_path: Path,
) -> None:
    """Proof (d), with the state a crash leaves planted while the broker is stopped:

    * the newest segment's index entry removed (the broker died after its upload and before
      its commit) and its object replaced by a valid segment of other records, so a broker
      that trusted the object instead of re-uploading would serve wrong payloads;
    * an object under the key the next segment will get, again holding other records;
    * an orphan inside the indexed range (a key that can never be indexed), three hours old.

    After a restart the orphan scan (first run at recovery; the 1 h grace is met by the
    backdated object) deletes the third and keeps the second (at the end of the index, so it
    may still be committed, whatever its age); the re-upload overwrites both others with the
    local bytes, and readers, also of a broker that lost its local WAL, see every message
    once with its own bytes.
    """
    topic = unique_topic("orphans")
    short = topic.rsplit("/", 1)[1]
    name = parse_topic(topic)
    durable = f"s3://{BUCKET}/{tmp_path.name}"
    bucket = _Bucket(s3_server, tmp_path.name)
    prefix = layout.object_prefix(name)
    data_dir = tmp_path / "data"
    wal_dir = data_dir / "wal" / "default" / short
    config = _config(tmp_path / "broker.yaml", durable, s3_server)
    first, more = 300, 20  # `more` fit in one segment: the next one is [first, first + more)

    process = broker_factory(data_dir, config_file=config).start()
    run(lambda: _produce(process.url, topic, 0, first), timeout=60)
    assert process.stop() == 0
    entries, _ = _index(data_dir, topic)
    assert len(entries) >= 3 and entries[-1].next_offset == first, entries

    # -- plant the crash state ------------------------------------------------------------------
    unindexed = _unindex_last(data_dir, topic)
    local_unindexed = (wal_dir / format.segment_name(unindexed.start_offset)).read_bytes()
    assert bucket.get(unindexed.key) == local_unindexed
    impostor = _impostor(bucket.get(entries[0].key), unindexed.start_offset, unindexed.next_offset)
    bucket.put(unindexed.key, impostor)
    next_key = layout.object_key(name, first, first + more)
    next_impostor = _impostor(bucket.get(entries[0].key), first, first + more)
    bucket.put(next_key, next_impostor)
    stale_key = layout.object_key(name, 5, 10)  # inside the first entry: never indexable
    bucket.put(stale_key, b"left behind by a broker long gone")
    for key in (unindexed.key, next_key, stale_key):
        bucket.backdate(key, hours=3)

    # -- restart: recovery re-uploads, the orphan scan collects --------------------------------
    process = broker_factory(data_dir, config_file=config).start()
    process.wait_for_log(rf"event=orphan_deleted .*key={re.escape(stale_key)}", timeout=20)
    process.wait_for_log(rf"event=segment_uploaded .*key={re.escape(unindexed.key)}", timeout=20)
    keys = bucket.keys(prefix)
    assert stale_key not in keys, "the orphan below the end of the index was collected"
    assert next_key in keys and bucket.get(next_key) == next_impostor, (
        "an object at the end of the index is kept: it may still be committed"
    )
    run(lambda: _produce(process.url, topic, first, more), timeout=60)
    messages = run(lambda: _read_from_earliest(process.url, topic, "local", first + more), 60)
    _assert_history(messages, first + more)
    assert process.stop() == 0  # seals [first, first + more): uploaded and indexed at stop

    entries, _ = _index(data_dir, topic)
    assert validate_index(entries) == []
    assert [e.key for e in entries][-2:] == [unindexed.key, next_key], entries
    for entry in entries:
        local = (wal_dir / format.segment_name(entry.start_offset)).read_bytes()
        assert bucket.get(entry.key) == local, f"{entry.key} is not the local segment"
        assert (entry.size, entry.crc32c) == (len(local), crc32c(local))
    assert bucket.keys(prefix) == [e.key for e in entries]

    # -- a broker that lost its local WAL reads everything from the objects ---------------------
    shutil.rmtree(data_dir / "wal")
    process = broker_factory(data_dir, config_file=config).start()
    total = first + more + 4
    run(lambda: _produce(process.url, topic, first + more, 4), timeout=60)
    messages = run(lambda: _read_from_earliest(process.url, topic, "objects", total), 60)
    _assert_history(messages, total)
    assert process.stop() == 0
    _assert_clean_log(process)


def test_s3_slowdown_is_classified_as_throttling(
    s3_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the uploader is told when S3 answers `503 SlowDown` (after s3fs's own five
    tries) and `500 InternalError`, through the broker's own `ObjectStore` and `classify`:
    throttling and a transient server error (spec/object-layout.md, "Retries" and "Driver")."""
    from danube.machines.tiering import UploadError
    from danube.runtime.object_store import ObjectStore, classify

    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # read by botocore when the client is made
    classified, errors = {}, {}
    with FlakyS3Proxy(s3_server, FaultRates()) as proxy:
        store = ObjectStore(f"s3://{BUCKET}/{tmp_path.name}", endpoint=proxy.url)
        proxy.faults_on = True
        for code, rates in (
            ("InternalError", FaultRates(server_error=1.0)),
            ("SlowDown", FaultRates(throttled=1.0)),
        ):
            proxy.rates = rates
            with pytest.raises(Exception) as raised:
                store.put("some/key.wal", b"bytes")
            classified[code] = classify(raised.value)
            errors[code] = repr(raised.value)
        assert proxy.injected("server_error") == 1 and proxy.injected("throttled") >= 1
    assert classified == {
        "InternalError": UploadError.SERVER_ERROR,
        "SlowDown": UploadError.THROTTLED,
    }, f"the store raised {errors}"


def test_history_reads_outlast_a_store_outage(
    s3_server: str,
    broker_factory: type[BrokerProcess],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A store that refuses every request for 10 s while a subscription reads history that
    only objects hold (the broker lost its local WAL): the read waits the outage out and then
    delivers all of it, and producing, which needs no object store, carries on meanwhile.
    The spec (object-layout.md, "Driver") says store errors of `ReadObject` are retried with
    backoff and only data that does not verify stops the topic. `AWS_MAX_ATTEMPTS=1` keeps the
    SDK from stretching each of the broker's attempts; with botocore's defaults (5 tries, up
    to 8 s apart) the same outage would have to last about a minute."""
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    topic = unique_topic("outage")
    data_dir = tmp_path / "data"
    history, total = 200, 204
    with FlakyS3Proxy(s3_server, FaultRates(server_error=1.0), seed=7) as proxy:
        durable = f"s3://{BUCKET}/{tmp_path.name}"
        config = _config(tmp_path / "broker.yaml", durable, proxy.url)
        process = broker_factory(data_dir, config_file=config).start()
        run(lambda: _produce(process.url, topic, 0, history), timeout=60)
        assert process.stop() == 0  # indexed at stop
        shutil.rmtree(data_dir / "wal")
        process = broker_factory(data_dir, config_file=config).start()

        async def read_through_outage() -> list[Message]:
            async with DanubeClient(process.url) as client:
                consumer = client.consumer(
                    topic, "reader", "outage", sub_type=SubType.EXCLUSIVE, start="earliest"
                )
                proxy.faults_on = True
                async with consumer:
                    await _produce(process.url, topic, history, total - history)
                    await asyncio.sleep(10)
                    proxy.faults_on = False
                    return await receive_n(consumer, total, timeout=20)

        try:
            messages = run(read_through_outage, timeout=60)
        except TimeoutError:
            seen = [
                line
                for line in process.log_lines
                if "object_read_failed" in line or "topic_stopped" in line
            ]
            pytest.fail("no history after the outage; the broker logged:\n" + "\n".join(seen))
        assert proxy.injected("server_error") > 0
    _assert_history(messages, total)
    assert "event=object_read_failed" in process.log_text()
    assert process.stop() == 0
    _assert_clean_log(process)


def _impostor(model: bytes, start: int, next_offset: int) -> bytes:
    """A valid segment for offsets `start` … `next_offset - 1` (header, frames, CRCs all
    right) whose records are the first records of `model`: if it were ever served, readers
    would get payloads of other offsets."""
    header = format.decode_segment_header(model)
    scan = format.scan_segment(model)
    records: list[bytes] = []
    for position in scan.positions:
        records.extend(format.decode_frame(model, position).records)
        if len(records) >= next_offset - start:
            break
    records = records[: next_offset - start]
    assert len(records) == next_offset - start, "the model segment is too small"
    data = format.encode_segment_header(header.topic, start, header.created_ms)
    data += format.encode_frame(start, header.created_ms, records)
    assert format.scan_segment(data).next_offset == next_offset
    return data
