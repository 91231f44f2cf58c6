"""Control-plane timings on a real etcd (issue 6): leader election, assignment latency of new
topics (one at a time and in a burst), failover of a dead broker's topics, and a dead
leader's replacement. Three nodes run the membership and load-manager drivers in this one
process, each with its own etcd connection; no data plane.

    python -m bench.cluster_control [--topics 200] [--burst 500] [--ttl-ms 10000]

etcd runs on loopback with a 10 ms heartbeat and a 100 ms election timeout (a single member,
as the tests start it). Failover time is bound by the registration lease: the lease TTL plus
the time for the store to notice, plus one assignment.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import trio

from bench.e2e_nonreliable import _percentile
from danube.localcluster.etcd_process import EtcdProcess
from danube.metadata.etcd import EtcdStore
from tests.support.control_plane import (
    assignments,
    control_plane,
    leaders,
    post_topics,
    wait_until,
)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


async def _measure(endpoint: str, args: argparse.Namespace) -> None:
    async def open_store() -> EtcdStore:
        return await EtcdStore.connect([endpoint], prefix="/bench")

    observer = await open_store()
    membership = {
        "lease_ttl_ms": args.ttl_ms,
        "renew_interval_ms": max(100, args.ttl_ms // 5),
        "drift_ms": max(100, args.ttl_ms // 10),
        "retry_ms": 200,
    }
    start = trio.current_time()
    async with control_plane(open_store, ["1", "2", "3"], membership) as nodes:

        async def one_leader() -> bool:
            return len(leaders(nodes)) == 1

        await wait_until(one_leader)
        print(
            f"three members registered and a leader elected in {_ms(trio.current_time() - start)}"
        )

        latencies = []
        for i in range(args.topics):
            topic = f"/default/one-{i}"
            before = trio.current_time()
            await post_topics(observer, [topic])

            async def assigned(topic: str = topic) -> bool:
                return topic in await assignments(observer)

            await wait_until(assigned)
            latencies.append(trio.current_time() - before)
        print(
            f"assignment latency, {args.topics} topics one at a time (marker put -> assignment "
            f"read back): p50 {_ms(statistics.median(latencies))}, "
            f"p99 {_ms(_percentile(latencies, 99))}, max {_ms(max(latencies))}"
        )

        burst = [f"/default/burst-{i}" for i in range(args.burst)]
        before = trio.current_time()
        await post_topics(observer, burst)
        posted = trio.current_time() - before

        async def all_assigned() -> bool:
            owners = await assignments(observer)
            return all(t in owners for t in burst)

        await wait_until(all_assigned, timeout=120)
        owners = await assignments(observer)
        spread = sorted(sum(1 for t in burst if owners[t] == b) for b in "123")
        print(
            f"burst of {args.burst} markers (posted in {_ms(posted)}): all assigned "
            f"{_ms(trio.current_time() - before)} after the first put; per broker {spread}"
        )

        victim = next(n for n in nodes.values() if not n.leading)
        lost = [t for t, b in owners.items() if b == victim.name]
        killed = trio.current_time()
        victim.scope.cancel()

        async def failed_over() -> bool:
            now = await assignments(observer)
            return victim.name not in now.values() and all(t in now for t in lost)

        # Polled every 100 ms: a scan of every assignment per poll competes with the nodes
        # for this one process's interpreter.
        await wait_until(failed_over, timeout=args.ttl_ms / 1000 * 4 + 10, poll=0.1)
        print(
            f"broker killed (no revoke) -> its {len(lost)} topics assigned elsewhere: "
            f"{_ms(trio.current_time() - killed)} (lease TTL {args.ttl_ms} ms)"
        )

        (leader,) = leaders(nodes)
        killed = trio.current_time()
        leader.scope.cancel()
        await post_topics(observer, ["/default/after-leader"])

        async def replaced() -> bool:
            return "/default/after-leader" in await assignments(observer)

        await wait_until(replaced, timeout=args.ttl_ms / 1000 * 4 + 10, poll=0.1)
        print(
            f"leader killed -> new leader assigned a topic posted meanwhile: "
            f"{_ms(trio.current_time() - killed)}"
        )
    await observer.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--topics", type=int, default=200, help="topics posted one at a time")
    parser.add_argument("--burst", type=int, default=500, help="topics posted at once")
    parser.add_argument("--ttl-ms", type=int, default=10_000, help="registration lease TTL")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, EtcdProcess(Path(tmp)) as etcd:
        trio.run(_measure, etcd.endpoint, args)


if __name__ == "__main__":
    main()
