"""What a cached batch really costs in memory (spec/memory.md "Accounting").

The hot cache used to count record bytes only; a Python object per record (and a few per batch)
made a 16-byte record cost some 200 bytes. These constants add what the objects cost, measured
with `bench/cache_memory.py` (tracemalloc and RSS growth in a fresh process, 100,000 records
of 16 to 4,096 bytes, 1 to 100 records a batch; bench/RESULTS.md, 2026-11-29) and fitted as
`payload + PER_RECORD * records + PER_BATCH`, so the accounted bytes of every measured case are
within 20 % of what the cache really adds.
"""

from __future__ import annotations

LIST_PER_RECORD = 43
"""`WalMachine.append` and a follower's `append_frames`: one `bytes` object per record (33-byte
header, allocator rounding) and its slot in the batch's list."""
LIST_PER_BATCH = 158
"""... and per batch: the list, the `CachedBatch`, its first offset, its slot in the cache."""
PACKED_PER_RECORD = 17
"""`WalMachine.append_packed`: a record inside one stamped frame costs its 4-byte length prefix
and its 8-byte entry in the positions array (and allocator rounding of the frame)."""
PACKED_PER_BATCH = 340
"""... and per batch: the frame's `bytes` header, the `PackedRecords`, the positions array
(a numpy array object), the `CachedBatch`."""


def list_batch_cost(record_bytes: int, count: int) -> int:
    """Accounted bytes of a batch of `count` records held as separate `bytes` objects."""
    return record_bytes + LIST_PER_RECORD * count + LIST_PER_BATCH


def packed_batch_cost(record_bytes: int, count: int) -> int:
    """Accounted bytes of a batch held as one packed frame (`PackedRecords`)."""
    return record_bytes + PACKED_PER_RECORD * count + PACKED_PER_BATCH
