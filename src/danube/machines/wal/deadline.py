"""When a WAL machine's next tick can have work, so a broker with many topics keeps the idle ones
in a deadline heap instead of asking every topic at every tick (issue 23: the walk over all
topics made a topic's cost grow with the topic count).

Kept out of `machine.py` (at its size limit); it reads the machine's state the way
`WalMachine.tick_due` does and must stay in step with it: the answer is a lower bound, never
later than the first time `tick_due` turns true while no other input reaches the machine.
"""

from __future__ import annotations

from danube.machines.wal.machine import WalMachine
from danube.values.wal_config import Durability

DUE_NOW = -(1 << 62)
"""Ask `tick_due` at every tick: more than the passing of time decides (a periodic fsync
waits, and a clock that steps back makes it due too), or the tick is due already."""
_FAR = 1 << 62


def next_due_ms(log: WalMachine) -> int | None:
    """The earliest time `log.tick_due` can turn true with no other input in between; None when
    only an input can give a tick work."""
    if log._failure is not None:
        return None
    config = log.config
    if (
        log._unsynced_since_ms is not None
        and log._fsync is None
        and config.durability is not Durability.FSYNC
    ):
        return DUE_NOW  # `_interval_due`: due again if the clock steps back
    if log._retention_due(-_FAR):  # over its bytes (an age due in the far past: also now)
        return DUE_NOW
    dues: list[int] = []
    age, active = config.segment_age_ms, log._active()
    if age is not None and active is not None and not active.sealing:
        dues.append(active.created_ms + age)  # `_rotation_due`
    if config.retention_ms is not None and log._retention_due(_FAR):
        dues.append(log._segments[1].created_ms + config.retention_ms)  # `_retention_due`
    return min(dues, default=None)
