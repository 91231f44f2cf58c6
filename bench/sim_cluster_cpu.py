"""CPU of the cluster simulator with data planes, for per-message cost comparisons.

`python -m bench.sim_cluster_cpu --seed S [--duration 30] [--profile default] [--in-flight N]
[--replicated] [--object-batch-ms MS] [--batched P] [--rate R] [--topics T]` builds
`ClusterSimulation(S, ClusterWorkload(data=True), CLUSTER_PROFILES[profile])` (with the
producers' window N, share P of batched producers, R messages a second a producer and T
topics, the workload's defaults without them;
MS replaces `sim.cluster_data.OBJECT_BATCH_MS`, the `object` level's batch, for a what-if),
runs it and
prints the run's CPU time (`time.process_time()` around `run`, which a busy machine disturbs
less than wall time), events, acknowledged messages and digest, and the ratio of simulated
seconds (the faults' and the settling's) to that CPU time with the events a CPU second.
`--duration 0` only builds it: under `valgrind --tool=cachegrind --cache-sim=no` the two
counts' difference is the run's instructions, which the load does not move at all
(bench/RESULTS.md, issue 22 round 9).
Set `NUMBA_CPU_NAME=generic` for both counts and warm numba's cache once outside valgrind
with it: under valgrind the CPU reports other features, numba's cache (keyed on them) misses
and every kernel is compiled inside the count (round 10: 28,000 M instructions and
counting for the build alone). Set `DANUBE_KERNELS=jit` too once the ahead-of-time kernels
are built: they are compiled for this CPU (AVX-512), which valgrind cannot run (SIGILL in the
build, round 11). Compile the tree's bytecode first, and subtract each tree's own build count
(a stale `.pyc` is compiled at import: round 10's baseline, 56 M)."""

from __future__ import annotations

import argparse
import time

from sim import cluster_data
from sim.cluster import ClusterSimulation, ClusterWorkload
from sim.cluster_faults import CLUSTER_PROFILES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--duration", type=float, default=30.0, help="simulated s; 0: build only")
    parser.add_argument("--profile", default="default", choices=sorted(CLUSTER_PROFILES))
    parser.add_argument("--in-flight", type=int, default=ClusterWorkload().in_flight)
    parser.add_argument("--batched", type=float, default=ClusterWorkload().batched)
    parser.add_argument("--rate", type=float, default=ClusterWorkload().rate)
    parser.add_argument("--topics", type=int, default=ClusterWorkload().topics)
    parser.add_argument("--replicated", action="store_true")
    parser.add_argument("--object-batch-ms", type=int, default=cluster_data.OBJECT_BATCH_MS)
    args = parser.parse_args()
    cluster_data.OBJECT_BATCH_MS = args.object_batch_ms
    workload = ClusterWorkload(
        data=True,
        in_flight=args.in_flight,
        replicated=args.replicated,
        batched=args.batched,
        rate=args.rate,
        topics=args.topics,
    )
    simulation = ClusterSimulation(args.seed, workload, CLUSTER_PROFILES[args.profile])
    if not args.duration:
        return
    start = time.process_time()
    result = simulation.run(args.duration)
    cpu = time.process_time() - start
    acknowledged = result.data.get("acknowledged", 0)
    objects = result.data.get("objects_indexed", 0)
    per = f"{cpu / acknowledged * 1e3:.3f} ms a message" if acknowledged else "no message"
    simulated = result.duration_s + result.settle_s  # the faults, then the settling
    print(
        f"seed {args.seed}: cpu {cpu:.3f} s, {result.events} events, {acknowledged} "
        f"acknowledged ({per}), {objects} objects indexed, digest {result.digest[:16]}, "
        f"ok {result.ok}; {simulated:.1f} simulated s, {simulated / cpu:.1f}x real time by "
        f"the run's CPU, {result.events / cpu:,.0f} events a CPU second"
    )


if __name__ == "__main__":
    main()
