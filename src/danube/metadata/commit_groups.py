"""Which waiting metadata transactions share one append and one fsync of the embedded store's
log (group commit). Pure: counts and sizes in, a decision out.

Transactions are taken in arrival order, so a group is always a prefix of the waiting line and
revisions are logged in the order callers were admitted. A group holds at least one transaction
(one larger than the byte bound goes alone, rather than never), and otherwise stops before the
transaction that would take it past either bound: a bounded group keeps one fsync's latency,
and the memory of its encoded records, bounded too.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GroupLimits:
    """Bounds of one group commit."""

    max_transactions: int = 512
    max_bytes: int = 1024 * 1024

    def __post_init__(self) -> None:
        if self.max_transactions < 1 or self.max_bytes < 1:
            raise ValueError("a group must be allowed at least one transaction and one byte")


def joins_group(limits: GroupLimits, count: int, group_bytes: int, record_bytes: int) -> bool:
    """Whether the next transaction in line, whose log record is `record_bytes` long (0 when
    it changes no durable key), joins a group that already holds `count` transactions taking
    `group_bytes` of log."""
    if count == 0:
        return True
    if count >= limits.max_transactions:
        return False
    return group_bytes + record_bytes <= limits.max_bytes


def split_groups(limits: GroupLimits, record_sizes: list[int]) -> list[int]:
    """How many transactions each successive group takes when `record_sizes` wait in line and
    none arrives meanwhile: the decision `joins_group` makes, applied until the line is empty
    (what the property tests and the docs reason about)."""
    groups: list[int] = []
    count = group_bytes = 0
    for size in record_sizes:
        if not joins_group(limits, count, group_bytes, size):
            groups.append(count)
            count = group_bytes = 0
        count += 1
        group_bytes += size
    if count:
        groups.append(count)
    return groups
