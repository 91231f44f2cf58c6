"""What a take from the hot caches' page pool costs when many slabs are partly free (issue 28
part 15, `danube.machines.memory.pages`): `--slabs` slabs of 1 MiB are filled page by page,
then every other page is given back (each slab keeps half its pages free, in runs of one);
then `--takes` runs of `--pages` pages are taken (a cache's chunk is 16) and given back, and
runs of one page. The pool before part 15 scanned every partly free slab for a run (`find`
on each slab's free map); it now keeps each slab's longest free run and visits only slabs
that fit. Prints microseconds a take (a `madvise` a give back is timed apart).

    PYTHONPATH=src:. python -m bench.page_pool_take --slabs 2000
"""

from __future__ import annotations

import argparse
import time

from danube.machines.memory.pages import SLAB_PAGES, PagePool


def _fragmented(slabs: int) -> tuple[PagePool, list[int]]:
    pool = PagePool()
    handles = [pool.take(1)[0] for _ in range(slabs * SLAB_PAGES)]
    pool.give_back_runs([(handle, 1) for handle in handles[::2]])
    return pool, handles[1::2]


def _takes(pool: PagePool, pages: int, takes: int) -> tuple[float, float]:
    """Microseconds a take and a give back, `takes` of each."""
    started = time.perf_counter()
    runs = [pool.take(pages)[0] for _ in range(takes)]
    took = time.perf_counter() - started
    started = time.perf_counter()
    for handle in runs:
        pool.give_back(handle, pages)
    gave = time.perf_counter() - started
    return took / takes * 1e6, gave / takes * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slabs", type=int, default=2_000)
    parser.add_argument("--takes", type=int, default=2_000)
    parser.add_argument("--pages", type=int, default=16)
    args = parser.parse_args()
    pool, _held = _fragmented(args.slabs)
    for pages in (args.pages, 1):
        take_us, give_us = _takes(pool, pages, args.takes)
        print(
            f"slabs={args.slabs} pages={pages} takes={args.takes} "
            f"take_us={take_us:.2f} give_back_us={give_us:.2f} slabs_after={pool.stats().slabs}"
        )


if __name__ == "__main__":
    main()
