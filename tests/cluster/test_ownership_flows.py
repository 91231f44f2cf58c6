"""The ownership flows, run with `run_now` against scripted answers: what each asks for, in
which order, and which machine input it ends with."""

from __future__ import annotations

from typing import Any

from danube import keys as all_keys
from danube.effects import (
    Outcome,
    StoreList,
    StoreRead,
    StoreTxn,
    StoreUnreachable,
    TxnAnswer,
)
from danube.effects.flow import run_now
from danube.machines.cluster import keys
from danube.machines.cluster import ownership as own
from danube.machines.cluster import ownership_flows as flows
from danube.machines.cluster.replicas import ReplicaSet
from danube.machines.node import paths
from danube.metadata.model import Compare, KeyValue
from danube.values.names import parse_topic

TOPIC = "/default/orders"
OWNER = own.owner_key(TOPIC)


class Machine:
    """Records the inputs a flow feeds to the machine (the flows call nothing else)."""

    def __init__(self, *, lease_id: int = 7, unloading: bool = True, loading: bool = True) -> None:
        self.config = own.OwnershipConfig("b1")
        self.lease_id = lease_id
        self._unloading = unloading
        self._loading = loading
        self.inputs: list[tuple[Any, ...]] = []

    def claim_done(
        self, topic: str, ok: bool, revision: int, now: int, *, known: bool, token: int
    ) -> list:
        assert token == TOKEN  # every answer names the claim it answers
        self.inputs.append(("claim_done", topic, ok, revision, known))
        return []

    def released(self, topic: str, ok: bool, now: int) -> list:
        self.inputs.append(("released", topic, ok))
        return []

    def loaded(self, topic: str, now: int, claim_revision: int | None = None) -> list:
        self.inputs.append(("loaded", topic))
        self.claim_revision = claim_revision
        return []

    def load_failed(
        self,
        topic: str,
        now: int,
        keep_local: bool | None = None,
        claim_revision: int | None = None,
    ) -> list:
        self.inputs.append(("load_failed", topic))
        self.keep_local = keep_local
        self.claim_revision = claim_revision
        return []

    def unloaded(self, topic: str, now: int, *, handed_over: bool = False) -> list:
        self.inputs.append(("unloaded", topic) if not handed_over else ("handed over", topic))
        return []

    def unloading(self, topic: str, revision: int) -> bool:
        return self._unloading

    def loading(self, topic: str, revision: int) -> bool:
        return self._loading


def claim_of(holder: str, lease: int, revision: int) -> KeyValue:
    return KeyValue(OWNER, {"broker_id": holder}, revision, revision, 1, lease)


def answers(*replies: Any) -> tuple[list[Any], Any]:
    asked: list[Any] = []
    queue = list(replies)

    def perform(request: Any) -> Any:
        asked.append(request)
        reply = queue.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply

    return asked, perform


TOKEN = 3


def claim_effect(lease_id: int = 7) -> own.Claim:
    return own.Claim(TOPIC, (), (), lease_id, TOKEN)


def test_a_committed_claim_is_done_at_its_revision() -> None:
    machine = Machine()
    asked, perform = answers(TxnAnswer(Outcome.COMMITTED, revision=41))
    run_now(flows.claim(machine, claim_effect(), lambda: 0), perform)  # type: ignore[arg-type]
    assert machine.inputs == [("claim_done", TOPIC, True, 41, True)]
    assert isinstance(asked[0], StoreTxn) and asked[0].read_back == (OWNER,)


def test_an_unanswered_claim_found_as_its_own_is_done() -> None:
    """Its answer was lost after it landed: the read-back finds it under this lease."""
    machine = Machine(lease_id=7)
    found = {OWNER: claim_of(keys.broker_id_to_json("b1"), 7, 52)}
    _, perform = answers(TxnAnswer(Outcome.UNKNOWN, found))
    run_now(flows.claim(machine, claim_effect(), lambda: 0), perform)  # type: ignore[arg-type]
    assert machine.inputs == [("claim_done", TOPIC, True, 52, True)]


def test_a_claim_is_found_as_its_own_by_the_lease_it_was_made_under() -> None:
    """A claim made under lease 7 whose answer comes after the machine registered again
    with lease 9: what it finds under lease 7 is its own landing (the machine then ignores
    the answer by its token), and a claim under lease 9 is not a lease-7 claim's."""
    machine = Machine(lease_id=9)
    found = {OWNER: claim_of(keys.broker_id_to_json("b1"), 7, 52)}
    _, perform = answers(TxnAnswer(Outcome.UNKNOWN, found))
    run_now(flows.claim(machine, claim_effect(7), lambda: 0), perform)  # type: ignore[arg-type]
    assert machine.inputs == [("claim_done", TOPIC, True, 52, True)]
    machine = Machine(lease_id=7)
    _, perform = answers(TxnAnswer(Outcome.REFUSED, found))
    run_now(flows.claim(machine, claim_effect(9), lambda: 0), perform)  # type: ignore[arg-type]
    assert machine.inputs == [("claim_done", TOPIC, False, 0, True)]


def test_an_unanswered_claim_not_found_is_not_known_to_have_failed() -> None:
    """It may still land: only a refusal says it did not."""
    machine = Machine()
    _, perform = answers(TxnAnswer(Outcome.UNKNOWN, {OWNER: None}))
    run_now(flows.claim(machine, claim_effect(), lambda: 0), perform)  # type: ignore[arg-type]
    assert machine.inputs == [("claim_done", TOPIC, False, 0, False)]
    machine = Machine()
    _, perform = answers(TxnAnswer(Outcome.REFUSED, {OWNER: claim_of("other", 3, 9)}))
    run_now(flows.claim(machine, claim_effect(), lambda: 0), perform)  # type: ignore[arg-type]
    assert machine.inputs == [("claim_done", TOPIC, False, 0, True)]


def test_a_load_reads_records_the_writer_and_adopts() -> None:
    machine = Machine()
    prefixes, policy_key = own.load_reads(TOPIC)
    delivery = paths.topic_delivery(parse_topic(TOPIC))
    entry = KeyValue(delivery, {"strategy": "reliable"}, 1, 1, 1, None)
    committed = TxnAnswer(Outcome.COMMITTED, revision=60)
    asked, perform = answers([entry], [], None, None, committed, None)
    run_now(flows.load(machine, own.Load(TOPIC, 50), lambda: 0), perform)  # type: ignore[arg-type]
    kinds = [StoreList, StoreList, StoreRead, StoreRead, StoreTxn, flows.Adopt]
    assert [type(a) for a in asked] == kinds
    assert [a.prefix for a in asked[:2]] == list(prefixes) and asked[2].key == policy_key
    assert asked[3].key == all_keys.replicas_key(TOPIC)
    assert asked[5].claim_revision == 50 and asked[5].entries[delivery] == {"strategy": "reliable"}
    assert machine.inputs == [("loaded", TOPIC)]


def test_a_load_without_metadata_or_store_fails_without_adopting() -> None:
    machine = Machine()
    asked, perform = answers([], [], None)
    run_now(flows.load(machine, own.Load(TOPIC, 50), lambda: 0), perform)  # type: ignore[arg-type]
    assert machine.inputs == [("load_failed", TOPIC)] and len(asked) == 3
    machine = Machine()
    _, perform = answers(StoreUnreachable("down"))
    run_now(flows.load(machine, own.Load(TOPIC, 50), lambda: 0), perform)  # type: ignore[arg-type]
    assert machine.inputs == [("load_failed", TOPIC)]


def test_a_load_the_machine_no_longer_waits_for_adopts_nothing() -> None:
    """An earlier stay's load whose writer record landed before a new lease dropped the
    topic and a new claim loaded it again: adopting it would serve the topic under the claim
    that is gone, and its answer would pass for the new stay's load."""
    machine = Machine(loading=False)
    delivery = paths.topic_delivery(parse_topic(TOPIC))
    entry = KeyValue(delivery, {"strategy": "reliable"}, 1, 1, 1, None)
    committed = TxnAnswer(Outcome.COMMITTED, revision=60)
    asked, perform = answers([entry], [], None, None, committed)
    run_now(flows.load(machine, own.Load(TOPIC, 50), lambda: 0), perform)  # type: ignore[arg-type]
    assert flows.Adopt not in [type(a) for a in asked]
    assert machine.inputs == []
    machine = Machine()  # the current stay's answers name their claim
    asked, perform = answers([entry], [], None, None, committed, None)
    run_now(flows.load(machine, own.Load(TOPIC, 50), lambda: 0), perform)  # type: ignore[arg-type]
    assert machine.inputs == [("loaded", TOPIC)] and machine.claim_revision == 50


def test_a_deleted_topic_is_forgotten_at_once_and_a_moved_one_sealed_first() -> None:
    machine = Machine()
    asked, perform = answers(None)
    effect = own.Unload(TOPIC, 50, deleted=True)
    run_now(flows.unload(machine, effect, lambda: 0), perform)  # type: ignore[arg-type]
    assert [type(a) for a in asked] == [flows.Forget]
    assert asked[0].delete_files and asked[0].event == "topic_deleted_here"
    assert machine.inputs == [("unloaded", TOPIC)]
    machine = Machine()
    asked, perform = answers(None, None, None)
    run_now(flows.unload(machine, own.Unload(TOPIC, 50), lambda: 0), perform)  # type: ignore[arg-type]
    assert [type(a) for a in asked] == [flows.Seal, flows.AwaitSettled, flows.Forget]
    assert asked[2].event == "topic_unloaded" and machine.inputs == [("unloaded", TOPIC)]
    machine = Machine()  # settled by a hand-over to the in-sync followers: the machine hears so
    asked, perform = answers(None, True, None)
    run_now(flows.unload(machine, own.Unload(TOPIC, 50), lambda: 0), perform)  # type: ignore[arg-type]
    assert machine.inputs == [("handed over", TOPIC)]


def test_a_restart_keeps_the_files_and_a_stopped_topic_is_not_sealed() -> None:
    """A restart (`Ownership.restart`: a repair rewound the log below what the followers
    hold) forgets the topic but keeps its files, which the next claim's load adopts. Its
    settle answer, like that of any stopped topic (`Lifecycle.tail_kept`), tells the machine
    the tail was not uploaded."""
    machine = Machine()
    asked, perform = answers(None, True, None)
    effect = own.Unload(TOPIC, 50, restart=True)
    run_now(flows.unload(machine, effect, lambda: 0), perform)  # type: ignore[arg-type]
    assert [type(a) for a in asked] == [flows.Seal, flows.AwaitSettled, flows.Forget]
    assert not asked[2].delete_files and asked[2].event == "topic_restarted"
    assert machine.inputs == [("handed over", TOPIC)]


def test_an_overtaken_unload_forgets_nothing() -> None:
    machine = Machine(unloading=False)
    asked, perform = answers(None, None)
    run_now(flows.unload(machine, own.Unload(TOPIC, 50), lambda: 0), perform)  # type: ignore[arg-type]
    assert [type(a) for a in asked] == [flows.Seal, flows.AwaitSettled]
    assert machine.inputs == []


def test_a_drop_keeps_the_files() -> None:
    asked, perform = answers(None)
    run_now(flows.drop(own.Drop(TOPIC)), perform)
    assert asked == [
        flows.Forget(TOPIC, "this broker lost its ownership of the topic", False, "topic_dropped")
    ]


def test_a_load_keeps_the_local_log_of_an_in_sync_follower_and_claims_the_replica_set() -> None:
    """A promoted follower's directory holds every acknowledged record (spec/replication.md,
    "Failover"): it is kept although another broker wrote the topic last, and the replica
    set names the new owner and epoch, compared on its revision."""
    record = ReplicaSet(40, "b1", ("b2", "b3"), ("b2", "b3"))
    found = KeyValue(all_keys.replicas_key(TOPIC), record.to_json(), 7, 41, 3, None)
    entries = {all_keys.writer_key(TOPIC): {"broker_id": "b1"}}
    writer = own.become_writer(TOPIC, "b2", 50, entries, found)
    assert writer.keep_local
    assert Compare(found.key, "mod_revision", "==", 41) in writer.compares
    (put,) = [op for op in writer.ops if getattr(op, "key", None) == found.key]
    claimed = ReplicaSet.from_json(put.value)
    assert (claimed.epoch, claimed.owner, claimed.in_sync) == (50, "b2", ("b3",))
    # not in sync: the directory goes (the log continues from the object index)
    lagging = ReplicaSet(40, "b1", ("b2", "b3"), ("b3",))
    found = KeyValue(all_keys.replicas_key(TOPIC), lagging.to_json(), 7, 41, 3, None)
    assert not own.become_writer(TOPIC, "b2", 50, entries, found).keep_local
    # an unreadable replica set changes nothing
    junk = KeyValue(all_keys.replicas_key(TOPIC), {"epoch": -1}, 7, 41, 3, None)
    writer = own.become_writer(TOPIC, "b2", 50, entries, junk)
    assert not writer.keep_local and len(writer.ops) == 1


def test_a_retried_load_keeps_the_decision_of_a_writer_record_that_landed_late() -> None:
    """Seed 78 of the replicated cluster simulator: b2, in sync, claims at 50; its writer
    transaction goes unanswered (it lands later) and the load fails, remembering its
    decision to keep the directory. The retry reads the replica set that transaction wrote
    (b2 owner at epoch 50, out of `in_sync`) and the writer key from before it (b1): it
    keeps the directory all the same, instead of dropping the acknowledged tail."""
    delivery = paths.topic_delivery(parse_topic(TOPIC))
    entry = KeyValue(delivery, {"strategy": "reliable"}, 1, 1, 1, None)
    before = ReplicaSet(40, "b1", ("b2", "b3"), ("b2", "b3"))
    found = KeyValue(all_keys.replicas_key(TOPIC), before.to_json(), 7, 41, 3, None)
    writer_entry = KeyValue(all_keys.writer_key(TOPIC), {"broker_id": "b1"}, 1, 30, 1, None)
    machine = Machine()
    machine.config = own.OwnershipConfig("b2")
    lost = TxnAnswer(Outcome.UNKNOWN)
    _, perform = answers([entry, writer_entry], [], None, found, lost)
    run_now(flows.load(machine, own.Load(TOPIC, 50), lambda: 0), perform)  # type: ignore[arg-type]
    assert machine.inputs == [("load_failed", TOPIC)] and machine.keep_local is True
    landed = ReplicaSet(50, "b2", ("b2", "b3"), ("b3",))
    found = KeyValue(all_keys.replicas_key(TOPIC), landed.to_json(), 7, 60, 4, None)
    committed = TxnAnswer(Outcome.COMMITTED, revision=61)
    asked, perform = answers([entry, writer_entry], [], None, found, committed, None)
    retry = own.Load(TOPIC, 50, machine.keep_local)
    run_now(flows.load(machine, retry, lambda: 0), perform)  # type: ignore[arg-type]
    assert isinstance(asked[-1], flows.Adopt) and asked[-1].keep_local
    # without the earlier decision, the same reads drop the directory
    asked, perform = answers([entry, writer_entry], [], None, found, committed, None)
    run_now(flows.load(machine, own.Load(TOPIC, 50), lambda: 0), perform)  # type: ignore[arg-type]
    assert not asked[-1].keep_local


def test_a_retry_without_a_replica_set_keeps_the_earlier_decision_after_a_late_writer_record() -> (
    None
):
    """Not replicated: the first attempt finds another broker the writer and decides to drop
    this broker's old directory; its writer record goes unanswered but lands, so the retry
    finds this broker the writer. It must still drop the directory (review of the seed-78
    fix: the retry kept the stale directory, against spec/cluster.md)."""
    delivery = paths.topic_delivery(parse_topic(TOPIC))
    entry = KeyValue(delivery, {"strategy": "reliable"}, 1, 1, 1, None)
    other = KeyValue(all_keys.writer_key(TOPIC), {"broker_id": "b1"}, 1, 30, 1, None)
    machine = Machine()
    machine.config = own.OwnershipConfig("b2")
    _, perform = answers([entry, other], [], None, None, TxnAnswer(Outcome.UNKNOWN))
    run_now(flows.load(machine, own.Load(TOPIC, 50), lambda: 0), perform)  # type: ignore[arg-type]
    assert machine.keep_local is False  # the first attempt: drop the directory
    landed = KeyValue(all_keys.writer_key(TOPIC), {"broker_id": "b2"}, 2, 51, 2, None)
    asked, perform = answers(
        [entry, landed], [], None, None, TxnAnswer(Outcome.COMMITTED, revision=61), None
    )
    run_now(flows.load(machine, own.Load(TOPIC, 50, False), lambda: 0), perform)  # type: ignore[arg-type]
    assert isinstance(asked[-1], flows.Adopt)
    assert asked[-1].keep_local is False
