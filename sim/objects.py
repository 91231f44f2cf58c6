"""A simulated S3-like object store: the shared storage tiered topics move their history to.

Keys map to whole objects (bytes and a last-modified time). Every request takes a latency and
may be refused with SlowDown (throttled), fail with a 5xx, or stall for seconds, and a read
outage fails every GET for seconds; each outcome is rolled from the world's RNG, so a run stays
a pure function of its seed. Writes are atomic, as an S3 PUT is: an object is either absent or
whole. A put lands only when its completion event fires and the process that sent it is still
alive (a broker that dies mid-upload cut the connection: nothing lands); a put that fails with
a 5xx may have landed anyway (the answer was lost), which is the ambiguity the uploader must
tolerate. The store keeps its own clock, the simulated time without the broker's injected clock
jumps: objects are dated by the store, and the orphan grace period compares that date with the
broker's wall clock.
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from danube.machines.tiering import StoredObject
from danube.machines.wal import format, records
from sim.faults import Faults, Injected
from sim.world import World

FLOOR_US = 2_000
"""The fastest request (a round trip to a nearby region)."""
STALL_US = (1_000_000, 5_000_000)
"""How long a stalled request takes (a slow partition, a long GC pause on the server)."""
GET_OUTAGE_US = (1_000_000, 10_000_000)
"""How long a read outage (`Faults.s3_get_outage`) lasts."""


class StoreError(enum.Enum):
    """How a request failed, as the store answers."""

    SLOW_DOWN = "SlowDown (503)"
    SERVER_ERROR = "InternalError (500)"
    NO_SUCH_KEY = "NoSuchKey (404)"


@dataclass(slots=True)
class StoredBlob:
    data: bytes
    modified_ms: int
    """The store's clock when the object landed."""


class _Objects(dict[str, StoredBlob]):
    """The store's objects by key, with a sorted listing of each prefix listed so far, kept
    up to date as objects are written and deleted (orphan scans list every topic's objects
    every second; walking and sorting all objects for each was a twentieth of a cluster
    run). Every way to change the dict keeps the listings right: tests and the impostor
    fault write to it directly. Blobs are never changed in place."""

    def __init__(self) -> None:
        super().__init__()
        self.listings: dict[str, list[StoredObject]] = {}
        """As the uploader's `ListObjects` answer holds them (tuples of key and time): a
        listing is then handed over without building an object per entry per scan."""
        self._lengths: list[int] = []
        """The lengths of the listed prefixes: a key's listings are found by looking up its
        prefix of each length, not by testing every topic's prefix on every write."""

    def _listed(self, key: str) -> list[list[StoredObject]]:
        listings = self.listings
        found = [listings.get(key[:length]) for length in self._lengths]
        return [listed for listed in found if listed is not None]

    def _put(self, key: str, value: StoredBlob) -> None:
        for listed in self._listed(key):
            at = bisect.bisect_left(listed, (key,))
            if at < len(listed) and listed[at][0] == key:
                listed[at] = StoredObject(key, value.modified_ms)
            else:
                listed.insert(at, StoredObject(key, value.modified_ms))

    def _gone(self, key: str) -> None:
        for listed in self._listed(key):
            at = bisect.bisect_left(listed, (key,))
            if at < len(listed) and listed[at][0] == key:
                del listed[at]

    def _forget(self) -> None:
        self.listings.clear()
        self._lengths = []

    def __setitem__(self, key: str, value: StoredBlob) -> None:
        super().__setitem__(key, value)
        self._put(key, value)

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        self._gone(key)

    def pop(self, key: str, *default: Any) -> Any:
        had = key in self
        value = super().pop(key, *default)
        if had:
            self._gone(key)
        return value

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def popitem(self) -> tuple[str, StoredBlob]:
        self._forget()
        return super().popitem()

    def clear(self) -> None:
        self._forget()
        super().clear()

    def update(self, *args: Any, **kwargs: Any) -> None:
        self._forget()
        super().update(*args, **kwargs)

    def __ior__(self, other: Any) -> Any:
        self._forget()
        return super().__ior__(other)

    def listing(self, prefix: str) -> list[StoredObject]:
        """(key, last-modified ms) of every object under `prefix`, in key order (a copy)."""
        listed = self.listings.get(prefix)
        if listed is None:
            listed = [
                StoredObject(k, o.modified_ms) for k, o in self.items() if k.startswith(prefix)
            ]
            listed.sort()  # keys are unique: sorted by key
            self.listings[prefix] = listed
            self._lengths = sorted({*self._lengths, len(prefix)})
        return list(listed)


class SimObjectStore:
    def __init__(self, world: World, faults: Faults, injected: Injected, epoch_ms: int) -> None:
        self.world = world
        self.faults = faults
        self.injected = injected
        self.epoch_ms = epoch_ms
        self.objects = _Objects()
        self.gets_fail_until = 0
        """World time (µs) until which every GET fails: a read outage."""

    @property
    def now_ms(self) -> int:
        return self.epoch_ms + self.world.now_ms

    def get_outage(self) -> None:
        """From now on, every GET fails for a while (drawn from the world's RNG)."""
        lasts = self.world.rng.randint(*GET_OUTAGE_US)
        self.gets_fail_until = max(self.gets_fail_until, self.world.now + lasts)
        self.injected["s3_get_outage"] += 1
        self.world.log(f"fault s3_get_outage {lasts // 1000}ms")

    def _roll(self) -> tuple[int, StoreError | None]:
        """One request's latency and failure, if any."""
        faults, rng = self.faults, self.world.rng
        delay = FLOOR_US + int(rng.expovariate(1.0 / faults.s3_latency_us))
        if faults.s3_stall and rng.random() < faults.s3_stall:
            self.injected["s3_stall"] += 1
            delay += rng.randint(*STALL_US)
        if faults.s3_throttle and rng.random() < faults.s3_throttle:
            self.injected["s3_throttle"] += 1
            return delay, StoreError.SLOW_DOWN
        if faults.s3_server_error and rng.random() < faults.s3_server_error:
            self.injected["s3_server_error"] += 1
            return delay, StoreError.SERVER_ERROR
        return delay, None

    def put(
        self,
        key: str,
        data: bytes,
        alive: Callable[[], bool],
        done: Callable[[StoreError | None], None],
        landed: Callable[[], None],
    ) -> None:
        """Writes `data` at `key` (overwriting) when the request completes, if `alive()` then
        holds; `landed` hears of every write that happened, `done` of the answer."""
        delay, error = self._roll()
        # A 5xx answer may come after the write happened (the answer was lost).
        lands = error is None or (
            error is StoreError.SERVER_ERROR and self.world.rng.random() < 0.5
        )

        def complete() -> None:
            if not alive():
                return
            if lands:
                self.objects[key] = StoredBlob(data, self.now_ms)
                landed()
            done(error)

        self.world.at(delay, complete)

    def get_range(
        self,
        key: str,
        start: int,
        end: int,
        done: Callable[[bytes | None, StoreError | None], None],
    ) -> None:
        """Bytes [`start`, `end`) of `key`, read when the request completes."""
        delay, error = self._roll()
        if error is None and self.world.now < self.gets_fail_until:
            error = StoreError.SERVER_ERROR

        def complete() -> None:
            stored = self.objects.get(key)
            if error is not None:
                done(None, error)
            elif stored is None:
                done(None, StoreError.NO_SUCH_KEY)
            else:
                done(stored.data[start:end], None)

        self.world.at(delay, complete)

    def list_prefix(
        self, prefix: str, done: Callable[[list[tuple[str, int]] | None, StoreError | None], None]
    ) -> None:
        """(key, last-modified ms) of every object under `prefix`, in key order."""
        delay, error = self._roll()

        def complete() -> None:
            if error is not None:
                done(None, error)
                return
            done(self.objects.listing(prefix), None)

        self.world.at(delay, complete)

    def delete(self, key: str, done: Callable[[StoreError | None], None]) -> None:
        delay, error = self._roll()

        def complete() -> None:
            if error is None:
                self.objects.pop(key, None)
            done(error)

        self.world.at(delay, complete)


def impostor_segment(topic: str, offsets: Sequence[int], created_ms: int) -> bytes:
    """A well-formed segment holding `offsets` with records no producer sent (payload
    `impostor:<offset>`): what a fenced-out former owner might have uploaded. Every frame
    verifies, so only the index keeps readers away from it."""
    data = bytearray(format.encode_segment_header(topic, offsets[0], created_ms))
    for offset in offsets:
        record = records.Record(
            topic_name=topic,
            topic_offset=offset,
            payload=f"impostor:{offset}".encode(),
            producer_name="impostor",
        )
        data += format.encode_frame(offset, created_ms, [records.encode(record)])
    return bytes(data)
