"""Fault knobs of the cluster control-plane run (`python -m sim --cluster`) and its profiles.

Separate from `sim.faults.Faults`: the single-broker run's seeds and digests must not move
when the cluster run gains a knob."""

from __future__ import annotations

from dataclasses import dataclass

from sim.faults import Faults


@dataclass(frozen=True, slots=True)
class ClusterFaults:
    latency_us: int = 500
    """Mean one-way latency between a broker and etcd (exponential around a 50 µs floor)."""
    loss: float = 0.0
    """Per message: a request or an answer vanishes (the caller times out); a watch stream
    breaks (the broker notices after a while and watches again)."""
    partition: float = 0.0
    """Per fault tick: one broker is cut off from etcd, for a tenth of `partition_us` up to
    all of it (shorter and longer than a lease)."""
    partition_us: int = 8_000_000
    crash: float = 0.0
    """Per fault tick: a running broker dies (nothing more is sent; its lease runs out in
    etcd) and restarts after about `restart_us` as a new incarnation."""
    stop: float = 0.0
    """Per fault tick: a running broker stops gracefully (gives up leadership, revokes its
    lease) and restarts after about `restart_us`."""
    restart_us: int = 1_500_000
    kill: float = 0.0
    """Per fault tick: a running broker dies for good (its machine is lost), as long as two
    brokers are left; its topics must fail over to the others."""
    stall: float = 0.0
    """Per fault tick: etcd stalls for up to `stall_us`: requests wait and are applied, in
    order, when it resumes; leases keep expiring on its clock meanwhile."""
    stall_us: int = 3_000_000
    slow: float = 0.0
    """Per request: the request or its answer takes 1 to 6 s longer (it lands, or is
    answered, after the caller's 3 s timeout)."""
    skew: float = 0.0
    """How much of the allowed drift (`drift_ms` per lease TTL) each broker's clock uses: its
    rate against etcd's is drawn from 1 ± skew·drift/TTL. Below 1 the self-fencing margin
    holds."""

    def network(self) -> Faults:
        """What `sim.network.Network` reads: latency and loss."""
        return Faults(latency_us=self.latency_us, loss=self.loss)

    def calm(self) -> ClusterFaults:
        """The settle phase: the same latency and clocks, no new faults."""
        return ClusterFaults(latency_us=self.latency_us, skew=self.skew)


CLUSTER_PROFILES = {
    "none": ClusterFaults(),
    "default": ClusterFaults(
        loss=0.005, partition=0.01, crash=0.005, stop=0.002, kill=0.002, stall=0.003,
        slow=0.005, skew=0.9,
    ),
    "heavy": ClusterFaults(
        loss=0.02, partition=0.03, crash=0.015, stop=0.005, kill=0.005, stall=0.01, slow=0.02,
        skew=0.95,
    ),
}  # fmt: skip
