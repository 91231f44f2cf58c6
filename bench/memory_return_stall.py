"""How long a return of memory holds the loop, by kind (issue 28 part 15, spec/memory.md
"Giving memory back"): a process holding `--mib` MiB of long-lived objects (dicts and lists
of small objects, as the broker's per-topic state: tracked by the collector, no garbage) and
`--cycles` fresh reference cycles (what a closed stream leaves) is handed to the production
carrier (`MemoryReturner`, the trim in its worker thread as in the broker) once with a full
return (every generation: what each return did before part 15) and once with a light one
(generations 0 and 1), the order alternated over `--rounds`. Prints the time the caller was
held (the loop's stall), the collection's objects freed and the RSS given back.

    PYTHONPATH=src:. python -m bench.memory_return_stall --mib 500 --cycles 20000
"""

from __future__ import annotations

import argparse
import gc
import logging
import re
import statistics
import time

from danube.runtime.memory_return import MemoryReturner, rss_bytes


class _Node:
    """A small object with a reference (one of a cycle)."""

    __slots__ = ("other", "payload")

    def __init__(self) -> None:
        self.other: object = None
        self.payload = bytes(64)


def _state(mib: int) -> list[dict[str, object]]:
    """Long-lived tracked objects until the RSS grew by `mib` MiB."""
    start, state = rss_bytes() or 0, []
    while (rss_bytes() or 0) - start < mib << 20:
        base = len(state)
        state.extend(
            {"name": f"topic-{i}", "offsets": list(range(12)), "meta": {"a": i, "b": [i, i]}}
            for i in range(base, base + 10_000)
        )
    return state


def _cycles(count: int) -> None:
    for _ in range(count):
        a, b = _Node(), _Node()
        a.other, b.other = b, a


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=500)
    parser.add_argument("--cycles", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    fresh = rss_bytes() or 0
    state = _state(args.mib)
    gc.collect()  # the state is old now: in the oldest generation, as the broker's is
    print(
        f"state: {len(state)} entries, {((rss_bytes() or 0) - fresh) / 2**20:.0f} MiB of RSS, "
        f"{len(gc.get_objects())} tracked objects"
    )
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("danube.runtime").addHandler(handler)
    logging.getLogger("danube.runtime").setLevel(logging.INFO)
    returner = MemoryReturner()
    freed: dict[bool, list[int]] = {True: [], False: []}
    held: dict[bool, list[float]] = {True: [], False: []}
    for n in range(args.rounds):
        for full in (True, False) if n % 2 == 0 else (False, True):
            _cycles(args.cycles)
            started = time.perf_counter()
            returner(0, full=full)
            held[full].append((time.perf_counter() - started) * 1000)
            returner.wait(60)
            found = re.search(r"collected=(\d+)", lines[-1])
            freed[full].append(int(found.group(1)) if found else -1)
    for full in (True, False):
        times = held[full]
        print(
            f"{'full ' if full else 'light'}: loop held {statistics.median(times):.1f} ms median "
            f"({min(times):.1f}-{max(times):.1f}) over {len(times)} returns, objects "
            f"collected {freed[full]}"
        )


if __name__ == "__main__":
    main()
