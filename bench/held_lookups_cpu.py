"""CPU of many lookups held at once (spec/cluster.md, "Held answers", the cap): 5,000
lookups of a topic the view shows being assigned, for ever, against one `ClusterPlacement`
with `hold_ms` and `cluster.lookup_hold_max` as given; prints wall and CPU time of the run.

    PYTHONPATH=src python -m bench.held_lookups_cpu HOLD_MAX [HOLD_MS]
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from typing import Any

from danube.machines.cluster.placement import ViewFacts
from danube.runtime.placement import ClusterPlacement
from danube.values.errors import DanubeError

REQUESTS = 5_000


class _Core:
    def serves(self, topic: str) -> bool:
        return False


async def _one(placement: ClusterPlacement) -> None:
    with contextlib.suppress(DanubeError):
        await placement.lookup("/default/t")


async def _all(placement: ClusterPlacement) -> None:
    await asyncio.gather(*(_one(placement) for _ in range(REQUESTS)))


def main(argv: list[str]) -> None:
    hold_max = int(argv[0])
    hold_ms = int(argv[1]) if len(argv) > 1 else 2_000
    core: Any = _Core()
    store: Any = None  # never read: the view answers every lookup
    placement = ClusterPlacement(
        core, store, "1", auto_create_topics=True, hold_ms=hold_ms, hold_max=hold_max
    )
    placement.view = lambda topic: ViewFacts(None, True, None)
    wall, cpu = time.monotonic(), time.process_time()
    asyncio.run(_all(placement))
    print(
        f"hold_max={hold_max} hold_ms={hold_ms} requests={REQUESTS} "
        f"wall={time.monotonic() - wall:.2f}s cpu={time.process_time() - cpu:.2f}s"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
