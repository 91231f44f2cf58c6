"""What a cached batch really costs in memory (spec/memory.md "Accounting").

The hot cache used to count record bytes only; a Python object per record (and a few per batch)
made a 16-byte record cost some 200 bytes. Since issue 28's rework a cached batch is its frame's
record region in a shared buffer (each record's 4-byte length and its bytes) and a few entries in
flat arrays (`danube.machines.wal.cache`), whichever path appended it: `WalMachine.append`,
`append_packed` or a follower's `append_frames`. The constants are measured with
`bench/cache_memory.py` (tracemalloc and RSS growth in a fresh process; bench/RESULTS.md) and
fitted as `payload + PER_RECORD * records + PER_BATCH`, so the accounted bytes of every measured
case are within 20 % of what the cache really adds.
"""

from __future__ import annotations

PER_RECORD = 8
"""A record's 4-byte length prefix and its 4-byte position in the cache's array."""
PER_BATCH = 48
"""A batch's four 8-byte array entries, its entry in the ledger's order, and the growth
slack of the buffers and arrays."""


def batch_cost(record_bytes: int, count: int) -> int:
    """Accounted bytes of a cached batch of `count` records of `record_bytes` in all."""
    return record_bytes + PER_RECORD * count + PER_BATCH
