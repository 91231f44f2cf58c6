"""`flows.propose_in_sync`: an owner's change of its topic's in-sync set. With the value it
holds at the expected version it writes without reading first and takes a committed write
as the new value without reading it back (issue 23: a failover's new owner proposed once
per adopted topic, two reads and a transaction each); any other outcome is read back."""

from __future__ import annotations

from typing import Any

from danube.effects import Outcome, StoreRead, StoreTxn, TxnAnswer
from danube.interpreter.flows import propose_in_sync
from danube.keys import replicas_key
from danube.machines.cluster.replicas import ReplicaSet
from danube.machines.node.replica_owner import ReplicaConfig, known_value, replica_config
from danube.machines.replication.messages import ProposeInSync
from danube.metadata.model import KeyValue

TOPIC = "/default/t"
KEY = replicas_key(TOPIC)
HELD = ReplicaSet(epoch=7, owner="b1", followers=("b2",), in_sync=())
PROPOSAL = ProposeInSync(TOPIC, 7, ("b2",), 40)


def _stored(record: ReplicaSet, revision: int) -> KeyValue:
    return KeyValue(KEY, record.to_json(), revision, revision, 1, None)


def _run(flow: Any, answers: list[Any]) -> tuple[list[Any], Any]:
    """Drives `flow`, answering its effects in order; (effects yielded, its result)."""
    yielded: list[Any] = []
    try:
        effect = next(flow)
        while True:
            yielded.append(effect)
            effect = flow.send(answers[len(yielded) - 1])
    except StopIteration as done:
        return yielded, done.value


def test_known_value_is_written_without_a_read_and_kept_without_a_read_back() -> None:
    effects, config = _run(
        propose_in_sync(PROPOSAL, epoch_start=3, known=HELD),
        [TxnAnswer(Outcome.COMMITTED, revision=52)],
    )
    assert [type(e) for e in effects] == [StoreTxn]
    txn = effects[0]
    assert [(c.key, c.target, c.operand) for c in txn.compares][1] == (KEY, "mod_revision", 40)
    written = ReplicaSet.from_json(txn.ops[0].value)
    assert written.in_sync == ("b2",) and written.epochs == ((7, 3),)
    assert config == replica_config(written, 52)
    assert config.replicating and config.record == written


def test_a_refused_write_on_the_known_value_is_read_back() -> None:
    newer = ReplicaSet(epoch=7, owner="b1", followers=("b3",), in_sync=())
    effects, config = _run(
        propose_in_sync(PROPOSAL, known=HELD),
        [TxnAnswer(Outcome.REFUSED), _stored(newer, 45)],
    )
    assert [type(e) for e in effects] == [StoreTxn, StoreRead]
    assert config == replica_config(newer, 45)


def test_an_unknown_outcome_is_read_back() -> None:
    effects, config = _run(
        propose_in_sync(PROPOSAL, known=HELD),
        [TxnAnswer(Outcome.UNKNOWN), None],
    )
    assert [type(e) for e in effects] == [StoreTxn, StoreRead]
    assert config is None


def test_without_a_known_value_the_store_is_read_first() -> None:
    effects, config = _run(
        propose_in_sync(PROPOSAL),
        [_stored(HELD, 40), TxnAnswer(Outcome.COMMITTED, revision=52)],
    )
    assert [type(e) for e in effects] == [StoreRead, StoreTxn]
    assert config is not None and config.version == 52 and config.in_sync == ("b2",)


def test_a_held_value_at_another_version_is_not_known() -> None:
    held = replica_config(HELD, 40)
    assert known_value(held, 40) == HELD
    assert known_value(held, 41) is None
    assert known_value(ReplicaConfig(7, ("b2",), (), 40), 40) is None
    assert known_value(None, 40) is None


def test_a_refusal_read_back_at_the_version_compared_says_the_claim_is_gone() -> None:
    """Of the two compares (the claim at the proposal's epoch, the value at its expected
    version) the value's held, so the claim's failed."""
    effects, config = _run(
        propose_in_sync(PROPOSAL, known=HELD),
        [TxnAnswer(Outcome.REFUSED), _stored(HELD, 40)],
    )
    assert [type(e) for e in effects] == [StoreTxn, StoreRead]
    assert config.claim_gone == 7 and config.version == 40


def test_a_value_changed_meanwhile_or_an_unknown_outcome_says_nothing_of_the_claim() -> None:
    newer = ReplicaSet(epoch=7, owner="b1", followers=("b3",), in_sync=())
    _, config = _run(
        propose_in_sync(PROPOSAL, known=HELD), [TxnAnswer(Outcome.REFUSED), _stored(newer, 45)]
    )
    assert config.claim_gone is None
    _, config = _run(
        propose_in_sync(PROPOSAL, known=HELD), [TxnAnswer(Outcome.UNKNOWN), _stored(HELD, 40)]
    )
    assert config.claim_gone is None
