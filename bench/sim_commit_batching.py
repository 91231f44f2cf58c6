"""How many etcd transactions batching the index commits would save, measured on a cluster
run with data planes (issue 22, round 8).

    python -m bench.sim_commit_batching --profile default --seed 1 --duration 30

Why: round 7 (bench/RESULTS.md) named one etcd transaction for several topics' index commits
as the next lift towards 50x real time. Before building it (a production change of the
uploader, the store port and the simulated etcd), this measures what it could buy. It
records, per broker, when each index commit (`StoreTxn` whose purpose is `index ...`) was sent
and when its answer came, and replays two batching rules over those times:

- **group commit**: at most one index transaction of a broker in flight; commits that come
  while one is in flight wait and go together as the next transaction, sent when the one in
  flight answers. A commit that finds none in flight waits for nothing; the others wait
  behind the one in flight, slow (a slow etcd request, a partition) or not.
- **per tick**: every commit waits for the broker's next 50 ms tick (`sim.broker.TICK_US`)
  and the commits of one tick go as one transaction. It adds the wait to every commit.

The replay keeps each commit's measured round trip, so it is an estimate (batching moves
later events); the run itself is unchanged and its digest is printed."""

from __future__ import annotations

import argparse
import collections
import statistics
from collections.abc import Callable
from typing import Any

from danube.effects import Outcome
from sim import cluster_data
from sim.broker import TICK_US
from sim.cluster import ClusterSimulation, ClusterWorkload
from sim.cluster_faults import CLUSTER_PROFILES


def group_commit(commits: list[tuple[int, int]]) -> tuple[int, list[int]]:
    """Transactions of one broker under group commit, and each commit's wait before it is
    sent (µs): `commits` are (sent, round trip µs) in the order sent. A batch's round trip is
    its first member's (one request, one draw of the network and of etcd's slowness)."""
    transactions = 0
    waits: list[int] = []
    free_at = -1  # when the transaction in flight answers
    batch_round_trip = 0  # of the batch waiting to go (0: none waits)
    for sent, round_trip in commits:
        if sent >= free_at and batch_round_trip:
            # the waiting batch went when the one in flight answered
            transactions += 1
            free_at += batch_round_trip
            batch_round_trip = 0
        if sent >= free_at:
            transactions += 1
            free_at = sent + round_trip
            waits.append(0)
            continue
        waits.append(free_at - sent)
        batch_round_trip = batch_round_trip or round_trip
    return transactions + (1 if batch_round_trip else 0), waits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="default", choices=sorted(CLUSTER_PROFILES))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--duration", type=float, default=30.0)
    args = parser.parse_args()

    sent: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
    failed: collections.Counter[str] = collections.Counter()
    unanswered = 0
    store = cluster_data.ClusterPort._store

    def _store(port: cluster_data.ClusterPort, effect: Any, done: Callable[..., None]) -> None:
        nonlocal unanswered
        if not effect.purpose.startswith("index "):
            store(port, effect, done)
            return
        world, name = port.broker.world, port.broker.host.name
        start = world.now
        unanswered += 1

        def answered(*answer: Any, **error: Any) -> None:
            nonlocal unanswered
            unanswered -= 1
            if not answer or getattr(answer[0], "outcome", None) is not Outcome.COMMITTED:
                failed[name] += 1  # refused, timed out (then read back) or failed
            sent[name].append((start, world.now - start))
            done(*answer, **error)

        store(port, effect, answered)

    cluster_data.ClusterPort._store = _store  # type: ignore[method-assign]
    try:
        simulation = ClusterSimulation(
            args.seed, ClusterWorkload(data=True), CLUSTER_PROFILES[args.profile]
        )
        result = simulation.run(args.duration)
    finally:
        cluster_data.ClusterPort._store = store  # type: ignore[method-assign]

    commits = sum(len(times) for times in sent.values())
    round_trips = sorted(rt for times in sent.values() for _, rt in times)
    grouped, grouped_waits = 0, []
    for times in sent.values():
        transactions, waited = group_commit(sorted(times))
        grouped += transactions
        grouped_waits += waited
    grouped_waits.sort()
    ticks = sum(len({s // TICK_US for s, _ in times}) for times in sent.values())
    waits = [(-s) % TICK_US for times in sent.values() for s, _ in times]
    acknowledged = max(1, result.data.get("acknowledged", 0))
    print(
        f"seed {args.seed} --profile {args.profile}: {result.events} events, "
        f"{acknowledged} acknowledged, digest {result.digest[:16]}"
    )
    print(
        f"index commits answered {commits} ({commits / acknowledged:.2f} a message; "
        f"{sum(failed.values())} not committed, {unanswered} never answered), round trip "
        f"p50 {statistics.median(round_trips) / 1000:.2f} ms, "
        f"p90 {round_trips[len(round_trips) * 9 // 10] / 1000:.2f} ms, "
        f"p99 {round_trips[len(round_trips) * 99 // 100] / 1000:.2f} ms, "
        f"max {round_trips[-1] / 1000:.0f} ms"
    )
    print(
        f"group commit: {grouped} transactions ({grouped / acknowledged:.2f} a message, "
        f"{100 * (commits - grouped) / max(1, commits):.0f} % fewer); a commit waits "
        f"{statistics.mean(grouped_waits) / 1000:.1f} ms on average, "
        f"{sum(1 for w in grouped_waits if w) / max(1, commits):.0%} of them wait, "
        f"p99 {grouped_waits[len(grouped_waits) * 99 // 100] / 1000:.1f} ms"
    )
    print(
        f"per tick: {ticks} transactions ({ticks / acknowledged:.2f} a message, "
        f"{100 * (commits - ticks) / max(1, commits):.0f} % fewer), each commit waits "
        f"{statistics.mean(waits) / 1000:.1f} ms on average for its tick"
    )


if __name__ == "__main__":
    main()
