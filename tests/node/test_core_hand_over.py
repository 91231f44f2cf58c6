"""Issue 27, moves (spec/replication.md, "Failover and moves"): an unloading replicated topic
is handed over to its in-sync followers once they hold its log end, without waiting for an
upload of its tail; with no follower in sync it takes the upload path as before. Driven
like `test_core_replication` (a core whose topic replicates to `b2`)."""

from __future__ import annotations

from danube.machines.cluster.replicas import ReplicaSet
from danube.machines.node.core import ReplicaConfig, ReplicaPropose, ReplicationSettings
from danube.machines.node.effects import DropWal
from danube.machines.replication.messages import Replicated
from tests.node.test_core_replication import TOPIC, Owner


def test_an_unload_hands_over_once_the_in_sync_follower_holds_the_log_end() -> None:
    owner = Owner(ReplicationSettings(broker_id="b1", lag_ms=500))
    owner.configure(("b2",), ("b2",))
    owner.sends()
    owner.publish("m0")
    owner.publish("m1")
    owner.run(owner.core.unload(TOPIC, owner.now).effects)
    # No object tier here, so the upload path has nothing to wait for; what matters is
    # that the topic is not handed over while b2 lacks the log end.
    owner.core.settled(TOPIC)
    assert owner.core.lifecycle.handed_over(TOPIC) is None, "b2 lacks the log end"
    owner.answer("b2", Replicated(TOPIC, 0, 2))
    assert owner.acked() == 1
    assert owner.core.settled(TOPIC)
    assert owner.core.lifecycle.handed_over(TOPIC) == 2, "two records the index lacks"
    # Handing over, the owner changes the in-sync set no more: a lag that would shrink it
    # proposes nothing (the successor is chosen from the set as it stands).
    owner.driver.now_ms += 10_000
    ticked = owner.run(owner.core.tick(owner.now).effects)
    assert not [e for e in ticked if isinstance(e, ReplicaPropose)]
    removed = owner.core.remove(TOPIC, reason="moved", delete_files=True).effects
    (drop,) = [e for e in removed if isinstance(e, DropWal)]
    assert not drop.delete_files, "the files may be the last copy outside the followers"


def test_without_an_in_sync_follower_the_unload_takes_the_upload_path() -> None:
    owner = Owner(ReplicationSettings(broker_id="b1", lag_ms=500))
    owner.configure(("b2",), ())
    owner.sends()
    owner.publish("m0")
    owner.run(owner.core.unload(TOPIC, owner.now).effects)
    assert owner.core.settled(TOPIC)  # no tier here: settled once the WAL is idle
    assert owner.core.lifecycle.handed_over(TOPIC) is None
    removed = owner.core.remove(TOPIC, reason="moved", delete_files=True).effects
    (drop,) = [e for e in removed if isinstance(e, DropWal)]
    assert drop.delete_files


def test_planted_bug_handing_over_before_caught_up_is_caught() -> None:
    """`move_before_caught_up` (tests/sim/replication_mutations.py) hands over while the
    follower still lacks the log end: this test sees it."""
    from tests.sim.replication_mutations import move_before_caught_up

    with move_before_caught_up():
        owner = Owner(ReplicationSettings(broker_id="b1", lag_ms=500))
        owner.configure(("b2",), ("b2",))
        owner.sends()
        owner.publish("m0")
        owner.run(owner.core.unload(TOPIC, owner.now).effects)
        owner.core.settled(TOPIC)
        assert owner.core.lifecycle.handed_over(TOPIC) == 1, "the planted bug does not wait"


def test_a_stale_replicas_value_does_not_restart_replication() -> None:
    """A replicas value older than the one the owner holds (a late read-back, a watch event
    overtaken by a read) is ignored. Taken (`python -m sim --cluster --data --replicated
    --seed 74`, found while testing hand-overs), it restarted the owner's machine with an
    older in-sync set (none) and the owner acknowledged alone while etcd recorded the
    follower in sync; the follower was promoted without those records."""
    owner = Owner()
    owner.configure(("b2",), ("b2",))  # at version 1
    owner.sends()
    stale = ReplicaConfig(0, (), (), 0, replicating=True)
    owner.run(owner.core.replicas_changed(TOPIC, stale, now_ms=owner.now).effects)
    owner.publish("m0")
    assert owner.acked() == -1, "acknowledged without b2, which etcd records in sync"
    owner.answer("b2", Replicated(TOPIC, 0, 1))
    assert owner.acked() == 0


def test_a_stale_replicas_value_is_not_kept_while_the_wal_loads() -> None:
    """While the topic's WAL loads (or is repaired) the value read is only kept, to apply
    once it is back; an older one than the value kept must not replace it (found in review:
    the same stale read-back as seed 74, one step earlier)."""
    owner = Owner()
    owner.configure(("b2",), ("b2",))  # at version 1
    record = owner.core._topics[TOPIC]
    working, record.log.wal = record.log.wal, None  # as while it loads
    newer = ReplicaConfig(0, ("b2",), ("b2",), 5)
    owner.run(owner.core.replicas_changed(TOPIC, newer, now_ms=owner.now).effects)
    stale = ReplicaConfig(0, (), (), 3, replicating=True)
    owner.run(owner.core.replicas_changed(TOPIC, stale, now_ms=owner.now).effects)
    assert record.log.replica_config == newer
    record.log.wal = working


def handed_over_owner() -> Owner:
    """b1 handed TOPIC over to b2 (in sync) and removed it: its directory is kept."""
    owner = Owner(ReplicationSettings(broker_id="b1", lag_ms=500))
    owner.configure(("b2",), ("b2",))
    owner.sends()
    owner.publish("m0")
    owner.answer("b2", Replicated(TOPIC, 0, 1))
    owner.run(owner.core.unload(TOPIC, owner.now).effects)
    assert owner.core.settled(TOPIC) and owner.core.lifecycle.handed_over(TOPIC) == 1
    owner.core.remove(TOPIC, reason="moved", delete_files=True)
    assert owner.core.lifecycle.kept == {TOPIC}
    return owner


def seen(owner: Owner, record: ReplicaSet | None, assigned: bool = False) -> list[DropWal]:
    step = owner.core.replica_set_seen(TOPIC, record, 9, assigned_here=assigned, now_ms=owner.now)
    return [e for e in step.effects if isinstance(e, DropWal)]


def test_a_kept_directory_stays_while_the_replica_set_counts_on_this_broker() -> None:
    """Until a promoted member records itself as owner the set still names b1 (the files may
    be the only copy outside the followers); a set naming b1 as follower or in sync, or the
    topic assigned here again, means the files are the log it follows or loads with; an
    unreadable or deleted set changes nothing."""
    owner = handed_over_owner()
    assert seen(owner, ReplicaSet(5, "b1", ("b2",), ("b2",))) == []
    assert seen(owner, ReplicaSet(6, "b2", ("b1",), ())) == []
    assert seen(owner, ReplicaSet(6, "b2", ("b3",), ("b1",))) == []
    assert seen(owner, ReplicaSet(6, "b2", ("b3",), ("b3",)), assigned=True) == []
    assert seen(owner, None) == []
    assert owner.core.lifecycle.kept == {TOPIC}


def test_a_kept_directory_goes_once_the_successor_no_longer_counts_on_it() -> None:
    """Issue 27's leftover: the old owner's kept directory was never removed unless the
    topic came back. Once b2 owns the topic and b1 is neither follower nor in sync, b2's
    replicas hold every acknowledged record: the files go, once."""
    owner = handed_over_owner()
    (drop,) = seen(owner, ReplicaSet(6, "b2", ("b3",), ("b3",)))
    assert drop.topic == TOPIC and drop.delete_files and not drop.delete_objects
    assert owner.core.lifecycle.kept == set()
    assert seen(owner, ReplicaSet(7, "b2", ("b3",), ("b3",))) == []


def test_a_set_seen_on_an_earlier_way_out_is_forgotten_once_the_topic_serves_again() -> None:
    """Review finding: a set kept from an earlier move could decide a later removal's kept
    directory (naming an old successor, before the new one recorded itself)."""
    owner = Owner(ReplicationSettings(broker_id="b1", lag_ms=500))
    owner.configure(("b2",), ("b2",))
    owner.core.lifecycle.seen_moving[TOPIC] = ReplicaSet(3, "b3", ("b4",), ())
    owner.core.replica_set_seen(
        TOPIC, ReplicaSet(5, "b1", ("b2",), ("b2",)), 9, assigned_here=True, now_ms=owner.now
    )
    assert TOPIC not in owner.core.lifecycle.seen_moving
