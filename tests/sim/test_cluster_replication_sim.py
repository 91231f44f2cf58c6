"""The cluster run with replication (`python -m sim --cluster --replicated`, issue 27): topics
at `fsync` replicate their WAL tail to followers before acknowledging, and owners are crashed,
stopped, killed for good and partitioned from etcd and from each other. Deterministic; every
acknowledged message is held by the topic's owner at the end unless every broker that could
take it over died for good (r1), and nothing is acknowledged under a superseded claim (r2);
planted bugs of replication are caught (`tests/sim/replication_mutations.py`)."""

from __future__ import annotations

import pytest

from sim.cluster import ClusterSimulation, ClusterWorkload
from sim.cluster_data_checker import REPLICA_LOSS
from sim.cluster_faults import CLUSTER_PROFILES
from tests.sim.replication_mutations import REPLICATION_MUTATIONS

DEFAULT = CLUSTER_PROFILES["default"]
REPLICATED = ClusterWorkload(replicated=True)
SECONDS = 15


def test_the_same_seed_gives_the_same_run() -> None:
    first = ClusterSimulation(3, REPLICATED, DEFAULT).run(8)
    second = ClusterSimulation(3, REPLICATED, DEFAULT).run(8)
    other = ClusterSimulation(4, REPLICATED, DEFAULT).run(8)
    assert first.digest == second.digest
    assert first.digest != other.digest
    assert first.data == second.data
    assert first.data["replica_sends"] > 0


def test_every_invariant_holds_and_the_followers_are_used() -> None:
    sends = 0
    for seed in range(1, 9):
        result = ClusterSimulation(seed, REPLICATED, DEFAULT).run(SECONDS)
        assert result.ok, (seed, [v.detail for v in result.violations])
        assert result.settled, seed
        assert result.data["acknowledged"] > 200, (seed, result.data)
        sends += result.data["replica_sends"]
    assert sends > 5_000  # the group commits went to the followers


def first_caught(mutation: str, seeds: range) -> tuple[int, list[str]] | None:
    """The first seed whose run with the planted bug breaks an invariant, and which."""
    for seed in seeds:
        with REPLICATION_MUTATIONS[mutation]():
            result = ClusterSimulation(seed, REPLICATED, DEFAULT).run(SECONDS)
        if not result.ok:
            return seed, [v.invariant for v in result.violations]
    return None


@pytest.mark.parametrize(
    "mutation",
    ["acknowledge_before_followers", "promote_any_follower"],
)
def test_planted_bugs_lose_acknowledged_messages(mutation: str) -> None:
    """Acknowledging before the in-sync followers have a group commit, and promoting a
    follower that is not in sync, each lose acknowledged messages when an owner goes
    (caught at seeds 1 and 10 of 200)."""
    caught = first_caught(mutation, range(1, 201))
    assert caught is not None, f"{mutation} went unnoticed for 200 seeds"
    seed, invariants = caught
    assert REPLICA_LOSS in invariants, (seed, invariants)
    assert ClusterSimulation(seed, REPLICATED, DEFAULT).run(SECONDS).ok, seed
