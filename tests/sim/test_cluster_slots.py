"""The simulator's cluster ports run the production ports' slots and batching
(`danube.machines.cluster.request_batching`, through `sim.cluster_slots`): decisions of one
burst go to the simulated etcd as one request, claims and loads wait for slots, and a batch
etcd would refuse fails the run."""

from __future__ import annotations

import collections
from typing import Any
from unittest import mock

import pytest

from danube.effects import StoreTxn
from danube.machines.cluster.request_batching import FLOW_SLOTS, TXNS_IN_FLIGHT
from danube.metadata.model import Delete, DeletePrefix, Put
from sim import cluster_slots
from sim.cluster import ClusterSimulation, ClusterWorkload
from sim.cluster_faults import CLUSTER_PROFILES

DEFAULT = CLUSTER_PROFILES["default"]


@pytest.mark.usefixtures("as_found")
def test_a_run_batches_decisions_and_holds_loads_to_their_slots() -> None:
    """Seeds of a run with data planes: some failover or burst of assignments sends several
    decisions in one request, and a broker given many topics at once has loads wait. Never
    more than the slots allow run at once. With sequential producers (`in_flight=1`): with
    the window of 4 (issue 22 round 12) seeds 1-5 batch decisions but no load waits; the
    slots are the control plane's, the producers only move the interleaving. For the same
    reason plain producers and the 20 ms object batch of before round 13 (`as_found`):
    main's runs of then."""
    sizes: collections.Counter[int] = collections.Counter()
    most = {"decisions": 0, "flows": 0}
    waited = [0]
    run_batch, run_flow = cluster_slots.DecisionLanes._run, cluster_slots.FlowSlots.run

    def batch(self: cluster_slots.DecisionLanes, txns: list[Any], urgent: bool) -> None:
        sizes[len(txns)] += 1
        run_batch(self, txns, urgent)
        most["decisions"] = max(most["decisions"], *self._busy.values())

    def flow(self: cluster_slots.FlowSlots, kind: type, start: Any) -> None:
        limit = FLOW_SLOTS.get(kind)
        if limit is not None and self._busy[kind] >= limit:
            waited[0] += 1
        run_flow(self, kind, start)
        most["flows"] = max(most["flows"], *self._busy.values())

    with (
        mock.patch.object(cluster_slots.DecisionLanes, "_run", batch),
        mock.patch.object(cluster_slots.FlowSlots, "run", flow),
    ):
        for seed in range(1, 6):
            workload = ClusterWorkload(data=True, in_flight=1, batched=0.0)
            result = ClusterSimulation(seed, workload, DEFAULT).run(30)
            assert result.ok, result.violations
            if max(sizes) > 1 and waited[0]:
                break
        else:
            pytest.fail(f"no seed of 1-5 batched and waited: {dict(sizes)}, {waited[0]} waits")
    assert most["decisions"] <= TXNS_IN_FLIGHT
    assert most["flows"] <= max(FLOW_SLOTS.values())


def _txn(*ops: Any) -> StoreTxn:
    return StoreTxn((), ops, purpose="SetFollowers x")


def test_the_simulated_etcd_refuses_what_etcd_refuses_in_one_request() -> None:
    assert cluster_slots.refusal([_txn(Put("/a", 1)), _txn(Delete("/b"))]) is None
    assert "write /a" in (cluster_slots.refusal([_txn(Put("/a", 1)), _txn(Delete("/a"))]) or "")
    assert "prefix" in (cluster_slots.refusal([_txn(Put("/a", 1)), _txn(DeletePrefix("/"))]) or "")
    many = [_txn(Put(f"/k{i}", i)) for i in range(cluster_slots.ETCD_MAX_TXN_OPS + 1)]
    assert "nested" in (cluster_slots.refusal(many) or "")


def test_a_refused_batch_fails_the_run_loudly() -> None:
    """A refusal is not swallowed by the simulated store (it raises out of the run), so a
    batching rule that lets such a batch through shows. The runs above never see two
    decisions of one burst write one key (the rule is defensive there), so this plants the
    refusal itself rather than a broken rule."""

    def refused(txns: list[StoreTxn]) -> str | None:
        return "planted" if len(txns) > 1 else None

    with (
        mock.patch.object(cluster_slots, "refusal", refused),
        pytest.raises(cluster_slots.RefusedBatch),
    ):
        ClusterSimulation(1, ClusterWorkload(data=True), DEFAULT).run(30)
