"""Key-Shared routing: glob key filters and the consistent-hash ring.

Virtual nodes are placed by consumer *name* (Danube uses its random consumer id), so a key keeps
its consumer across reconnects and broker restarts; only ~1/N of the keys move when a consumer
joins or leaves.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable

from danube.values.hashing import ring_hash

VIRTUAL_NODES_PER_CONSUMER = 100


class KeyFilter:
    """A glob over the key's UTF-8 bytes: `*` any run (empty too), `?` exactly one byte,
    everything else literal and case-sensitive; the whole key must match."""

    __slots__ = ("_regex", "pattern")

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        parts = []
        for byte in pattern.encode():
            char = bytes([byte])
            if char == b"*":
                parts.append(b".*")
            elif char == b"?":
                parts.append(b".")
            else:
                parts.append(re.escape(char))
        self._regex = re.compile(b"".join(parts), re.DOTALL)

    def matches(self, key: bytes) -> bool:
        return self._regex.fullmatch(key) is not None

    def __repr__(self) -> str:
        return f"KeyFilter({self.pattern!r})"


def accepts(filters: tuple[KeyFilter, ...], key: bytes) -> bool:
    """No filters means every key."""
    return not filters or any(f.matches(key) for f in filters)


class HashRing:
    """Virtual nodes of the members, sorted by position on a 32-bit ring."""

    __slots__ = ("_members", "_owners", "_positions")

    def __init__(self, members: Iterable[tuple[int, str]] = ()) -> None:
        self._members: dict[int, str] = {}
        self._positions: list[int] = []
        self._owners: list[int] = []
        for member_id, name in members:
            self._members[member_id] = name
        self._rebuild()

    def _rebuild(self) -> None:
        nodes = sorted(
            (ring_hash(f"{name}-{i}".encode()), member_id)
            for member_id, name in self._members.items()
            for i in range(VIRTUAL_NODES_PER_CONSUMER)
        )
        self._positions = [position for position, _ in nodes]
        self._owners = [owner for _, owner in nodes]

    def add(self, member_id: int, name: str) -> None:
        self._members[member_id] = name
        self._rebuild()

    def remove(self, member_id: int) -> None:
        if self._members.pop(member_id, None) is not None:
            self._rebuild()

    def __contains__(self, member_id: int) -> bool:
        return member_id in self._members

    def __len__(self) -> int:
        return len(self._members)

    def owner(self, key: bytes, eligible: frozenset[int] | None = None) -> int | None:
        """The first virtual node at or after the key's position (wrapping) whose member is
        eligible; walking past ineligible nodes is the same as filtering the ring."""
        if not self._positions:
            return None
        start = bisect.bisect_left(self._positions, ring_hash(key))
        count = len(self._owners)
        for step in range(count):
            owner = self._owners[(start + step) % count]
            if eligible is None or owner in eligible:
                return owner
        return None
