"""A replicated topic is ticked only when a timer of its replication is due or an input
touched it (issue 23 point 4): a failover's new owner, adopting hundreds of replicated topics,
spent 29 % of its main thread in ticks that visited every one of them at every tick."""

from __future__ import annotations

from danube.machines.node import topic_deadline
from danube.machines.node.core import ReplicaPropose, ReplicationSettings
from danube.machines.replication.messages import Replicated
from danube.machines.wal.deadline import next_due_ms
from tests.node.test_core_replication import TOPIC, Owner

LAG = 500


def _tick(owner: Owner, after_ms: int) -> tuple[int, list]:
    """Ticks `after_ms` later: how many topics it visited, and its effects."""
    owner.driver.now_ms += after_ms
    effects = owner.core.tick(owner.now).effects
    owner.run(effects)
    return owner.core.catalogue.topics_by_name.visited, list(effects)


def _settled(owner: Owner) -> None:
    for _ in range(3):  # the inputs above touched it: visited until nothing is due
        _tick(owner, 50)


def test_an_idle_replicated_topic_is_not_visited_at_every_tick() -> None:
    owner = Owner(ReplicationSettings(broker_id="b1", lag_ms=LAG))
    owner.configure(("b2",), ("b2",))
    owner.answer("b2", Replicated(TOPIC, 0, 0))
    _settled(owner)
    assert [_tick(owner, 50)[0] for _ in range(20)] == [0] * 20


def test_an_unacknowledged_send_wakes_the_topic_at_its_lag_deadline() -> None:
    owner = Owner(ReplicationSettings(broker_id="b1", lag_ms=LAG))
    owner.configure(("b2",), ("b2",))
    owner.answer("b2", Replicated(TOPIC, 0, 0))
    _settled(owner)
    sent_at = owner.now
    owner.publish("m0")  # goes to b2, which never answers
    due = sent_at + LAG + 1  # older than `lag_ms`: shrunk away
    _settled(owner)
    while owner.now + 50 < due:
        visited, effects = _tick(owner, 50)
        assert visited == 0, owner.now
    visited, effects = _tick(owner, 50)
    assert visited == 1
    assert any(isinstance(e, ReplicaPropose) and e.proposal.in_sync == () for e in effects)


def test_a_lost_proposal_touches_the_topic_and_is_made_again_at_the_next_tick() -> None:
    owner = Owner(ReplicationSettings(broker_id="b1", lag_ms=LAG))
    owner.driver.port.hold = lambda effect: type(effect).__name__ == "StoreTxn"
    owner.configure(("b2",), ("b2",))  # the registration goes out and waits
    _settled(owner)
    assert _tick(owner, 50)[0] == 0, "under way: nothing due until its retry deadline"
    owner.run(owner.core.replica_proposal_lost(TOPIC).effects)
    visited, effects = _tick(owner, 50)
    assert visited == 1
    assert sum(isinstance(e, ReplicaPropose) for e in effects) == 1


def test_the_topic_deadline_counts_replication() -> None:
    """`topic_deadline.next_due` takes the replication's deadline (`DUE_NOW`, a visit at every
    tick, before issue 23 point 4)."""
    owner = Owner(ReplicationSettings(broker_id="b1", lag_ms=LAG))
    owner.configure(("b2",), ("b2",))
    owner.answer("b2", Replicated(TOPIC, 0, 0))
    _settled(owner)
    record = owner.core.catalogue.topics_by_name[TOPIC]
    replicas = owner.core.logs.replicas
    assert replicas.next_due(record) is None
    owner.publish("m0")
    sent_at = owner.now
    assert replicas.next_due(record) == sent_at + LAG + 1
    wal = record.log.wal
    assert wal is not None
    wal_due = next_due_ms(wal)
    expected = sent_at + LAG + 1 if wal_due is None else min(wal_due, sent_at + LAG + 1)
    assert topic_deadline.next_due(record, 20, replicas) == expected


def test_an_idle_tiered_topic_is_visited_only_at_its_uploader_deadline() -> None:
    """A tiered topic's uploader timers (retries, the orphan scan) are indexed too: once its
    segments are indexed an idle tiered topic is not visited until the next scan."""
    from tests.node import test_core_tiered as tiered

    driver = tiered.start()
    tiered.publish(driver, tiered.producer(driver), 40)  # several sealed, uploaded segments

    def visits(after_ms: int) -> int:
        driver.now_ms += after_ms
        driver.run(driver.core.tick(driver.now_ms).effects)
        return driver.core.catalogue.topics_by_name.visited

    for _ in range(5):
        visits(50)
    record = driver.core.catalogue.topics_by_name[tiered.TOPIC]
    uploader = record.log.uploader
    assert uploader is not None and uploader.idle
    assert [visits(50) for _ in range(20)] == [0] * 20
    due = uploader.next_timer_ms
    assert due is not None and due > driver.now_ms  # the next orphan scan
    assert visits(due - driver.now_ms) == 1
