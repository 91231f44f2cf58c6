"""Replicated publish→ack latency in simulated time: the cluster simulator with data planes and
replication (`python -m sim --cluster --data --replicated`), no faults, each broker's fsync
taking `--fsync-us`. Deterministic and independent of the machine's load, so it shows what
the protocol costs (how many fsyncs and network hops lie on an acknowledgement's path) where
the wall-clock benchmark (`bench.cluster_e2e e2e`) is drowned by a busy machine.

    python -m bench.replication_sim_latency --fsync-us 5000 --seeds 3

A tree whose `ClusterFaults` has no `fsync_us` (before 2026-11-29) is measured by giving the
brokers' `Faults` that fsync time instead (the same thing: what `ClusterFaults.fsync_us`
passes on)."""

from __future__ import annotations

import argparse
import dataclasses
import functools
from typing import Any

import sim.cluster_clients as clients
import sim.cluster_data as cluster_data
from sim.cluster import ClusterSimulation, ClusterWorkload
from sim.cluster_faults import CLUSTER_PROFILES, ClusterFaults
from sim.faults import Faults


def measure(fsync_us: int, seeds: range, seconds: float) -> list[int]:
    """Every successful publish's latency (µs of simulated time) over `seeds`."""
    latencies: list[int] = []
    original = clients.ClusterProducer._answered

    def answered(self: Any, publish: Any, answer: Any) -> None:
        if publish.live and answer is not None and not isinstance(answer, Exception):
            latencies.extend([self.world.now - publish.sent_us] * len(publish.numbers))
        original(self, publish, answer)

    faults = CLUSTER_PROFILES["none"]
    clients.ClusterProducer._answered = answered  # type: ignore[method-assign]
    saved = cluster_data.Faults
    try:
        if "fsync_us" in {f.name for f in dataclasses.fields(ClusterFaults)}:
            faults = dataclasses.replace(faults, fsync_us=fsync_us)
        else:
            cluster_data.Faults = functools.partial(Faults, fsync_us=fsync_us)  # type: ignore[misc]
        workload = ClusterWorkload(data=True, replicated=True, admin=0)
        for seed in seeds:
            result = ClusterSimulation(seed, workload, faults).run(seconds)
            assert result.ok, (seed, [v.detail for v in result.violations])
    finally:
        clients.ClusterProducer._answered = original  # type: ignore[method-assign]
        cluster_data.Faults = saved  # type: ignore[misc]
    return sorted(latencies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fsync-us", type=int, default=5_000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    latencies = measure(args.fsync_us, range(1, args.seeds + 1), args.seconds)

    def quantile(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] / 1_000

    print(
        f"fsync {args.fsync_us} us, replicated: {len(latencies)} acknowledgements, "
        f"p50 {quantile(0.5):.2f} ms, p90 {quantile(0.9):.2f} ms, p99 {quantile(0.99):.2f} ms"
    )


if __name__ == "__main__":
    main()
