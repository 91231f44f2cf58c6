"""The broker's topics by name (`Catalogue.topics_by_name`), with the indexes that keep a
topic's cost from growing with the number of topics (issue 23): partitions by base name (a
topic's creation looked at every topic to find conflicting partitions) and the topics a tick
has to visit (it walked every topic, 20 times a second).

A tick visits the topics touched since the last tick (`TopicRecord.wal` and
`TopicRecord.advance` note them in `touched`) and those whose deadline came
(`schedule`); the rest would have nothing to do. They are visited in the order the topics came,
as the walk over every topic did, so a tick's effects come in the same order."""

from __future__ import annotations

import heapq
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from danube.machines.node.records import TopicRecord

_PARTITION = re.compile(r"(?P<base>.+)-part-(?P<index>0|[1-9][0-9]*)", re.DOTALL)
"""`danube.values.names._PARTITION_RE`, as `partition_index` matches it."""


class TopicTable(dict[str, "TopicRecord"]):
    """A dict of topic records; only `table[name] = record` and `del table[name]` change it
    (checked: the other mutators raise), so the indexes stay in step."""

    def __init__(self) -> None:
        super().__init__()
        self.touched: set[str] = set()
        """Topics whose state an input may have changed since the last tick."""
        self._wakes: list[tuple[int, int, str]] = []
        """(due ms, order, name): a topic's next deadline; stale entries are skipped."""
        self._partitions: dict[str, dict[str, int]] = {}
        """Base name → its partitions present (name → index)."""
        self._arrivals = 0
        self.subscriptions = 0
        """Subscriptions of every topic in the table, added up (the memory budget's state
        pool counts them; `Consumers.add_subscription` and `unsubscribe` keep it)."""
        self.visited = 0
        """Topics the last tick visited (tests: an idle broker visits none)."""

    # -- changes ------------------------------------------------------------------------------

    def __setitem__(self, name: str, record: TopicRecord) -> None:
        old = self.get(name)
        self.subscriptions += len(record.subscriptions) - (len(old.subscriptions) if old else 0)
        if old is None:
            self._arrivals += 1
            record.order = self._arrivals
            match = _PARTITION.fullmatch(name)
            if match is not None:
                self._partitions.setdefault(match["base"], {})[name] = int(match["index"])
        else:
            record.order = old.order  # a dict keeps the position of a key it had
        record.touched = self.touched
        record.wake_ms = None
        self.touched.add(name)
        super().__setitem__(name, record)

    def __delitem__(self, name: str) -> None:
        self.subscriptions -= len(self[name].subscriptions)
        super().__delitem__(name)
        self.touched.discard(name)
        match = _PARTITION.fullmatch(name)
        if match is not None:
            found = self._partitions.get(match["base"], {})
            found.pop(name, None)
            if not found:
                self._partitions.pop(match["base"], None)

    def _unsupported(self, *_: object, **__: object) -> None:
        raise TypeError("TopicTable changes only by table[name] = record and del table[name]")

    pop = popitem = clear = update = setdefault = __ior__ = _unsupported  # type: ignore[assignment]

    # -- partitions ---------------------------------------------------------------------------

    def partitions(self, base: str) -> list[str]:
        """Names of `<base>-part-<n>` present, ordered by n."""
        found = self._partitions.get(base)
        if not found:
            return []
        return sorted(found, key=found.__getitem__)

    # -- ticks --------------------------------------------------------------------------------

    def due(self, now_ms: int, *, every: bool = False) -> list[TopicRecord]:
        """The topics a tick at `now_ms` visits, in the order they came: touched since the
        last tick, or due; `every`: all of them (a policy changed)."""
        names = set(self) if every else self.touched.copy()
        self.touched.clear()
        wakes = self._wakes
        while wakes and wakes[0][0] <= now_ms:
            due, order, name = heapq.heappop(wakes)
            record = self.get(name)
            if record is not None and record.order == order and record.wake_ms == due:
                record.wake_ms = None
                names.add(name)
        records = [record for name in names if (record := self.get(name)) is not None]
        records.sort(key=_order)
        self.visited = len(records)
        return records

    def schedule(self, record: TopicRecord, due_ms: int | None) -> None:
        """After a visit: the topic's next deadline (None: none until an input touches it).
        An earlier deadline still queued stays (a visit too many is harmless)."""
        if due_ms is None or due_ms == record.wake_ms:
            return
        if record.wake_ms is None or due_ms < record.wake_ms:
            record.wake_ms = due_ms
            heapq.heappush(self._wakes, (due_ms, record.order, record.name.full))


def _order(record: TopicRecord) -> int:
    return record.order
