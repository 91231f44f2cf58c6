"""The schema gate's cache of topic bindings, pure, on an injected clock, so the broker
(`SchemaService.topic_config`, on `time.monotonic`) and the simulator keep one policy:

- a binding read is trusted for `ttl_s` (a change made through another broker of a
  cluster takes effect within that time; through this one, at once: `forget`);
- a read that fails while a binding is cached serves that binding for another `ttl_s`
  (publishes do not each wait for a store that does not answer); with none cached the
  failure stands;
- at most `capacity` topics are kept, the least recently read dropped first (the names a
  client sends must not grow the broker's memory without bound)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

V = TypeVar("V")

TTL_S = 1.0
CAPACITY = 65_536


class BindingCache(Generic[V]):
    def __init__(
        self, clock: Callable[[], float], ttl_s: float = TTL_S, capacity: int = CAPACITY
    ) -> None:
        self._clock = clock
        self.ttl_s = ttl_s
        self._capacity = capacity
        self._entries: OrderedDict[str, tuple[float, V]] = OrderedDict()
        """Binding by topic, with when it was read."""

    def fresh(self, topic: str) -> tuple[bool, V | None]:
        """(True, the binding) when one read less than `ttl_s` ago is cached."""
        cached = self._entries.get(topic)
        if cached is not None and self._clock() - cached[0] < self.ttl_s:
            return True, cached[1]
        return False, None

    def failed(self, topic: str) -> tuple[bool, V | None]:
        """A read failed: (True, the cached binding), trusted for another `ttl_s`, or
        (False, None) when none is cached (the failure stands)."""
        cached = self._entries.get(topic)
        if cached is None:
            return False, None
        self._entries[topic] = (self._clock(), cached[1])
        return True, cached[1]

    def read(self, topic: str, binding: V) -> None:
        """A read answered `binding`."""
        self._entries[topic] = (self._clock(), binding)
        self._entries.move_to_end(topic)
        if len(self._entries) > self._capacity:
            self._entries.popitem(last=False)

    def forget(self, topic: str) -> None:
        """Changed through this broker: the next lookup reads it."""
        self._entries.pop(topic, None)
