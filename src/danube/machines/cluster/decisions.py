"""The load manager's decisions (`Assign`, `Move`, `FailOver`, `Release`, `MarkDrained`,
`SetFollowers`) as what they are for the store: one `danube.effects.StoreTxn` each, carried
out by the store port of the broker (`danube.runtime.load_manager`) or of the simulator
(`sim.cluster_node`). A decision's outcome is not reported to the machine: one that took
effect shows in the watch, one that did not is made again while it is still due."""

from __future__ import annotations

from danube.effects import StoreTxn
from danube.machines.cluster import load_manager as lm


def describe(decision: lm.Txn) -> str:
    """What the decision does, for logs and the simulator's trace."""
    if isinstance(decision, lm.Assign):
        return f"{decision.topic} to {decision.broker}"
    if isinstance(decision, lm.Move):
        return f"{decision.topic} from {decision.from_broker} to {decision.to_broker}"
    if isinstance(decision, lm.FailOver):
        return f"{decision.topic} from {decision.broker}"
    if isinstance(decision, lm.MarkDrained):
        return f"broker {decision.broker} drained"
    if isinstance(decision, lm.SetFollowers):
        return f"{decision.topic} followers {','.join(decision.followers) or 'none'}"
    return f"{decision.topic} from {decision.from_broker}"


def as_txn(decision: lm.Txn) -> StoreTxn:
    """The decision's transaction; its purpose starts with the decision's kind (the
    simulator's checker tells the leader's writes by it)."""
    kind = type(decision).__name__
    return StoreTxn(decision.compares, decision.ops, purpose=f"{kind} {describe(decision)}")
