"""The owner's side of replication in the broker core (spec/replication.md, "Data path"):
publishes are acknowledged, and records readable, only once every recorded in-sync follower
holds them; the group commit's frames go out unchanged; the in-sync set shrinks and grows
through fenced proposals; a follower behind the window is resent from the WAL; a higher epoch
stops the topic. Driven through the shared interpreter and the testing kit's memory port."""

from __future__ import annotations

import random
from typing import Any

import pytest

from danube import keys
from danube.effects import TopicFile
from danube.machines.cluster.replicas import ReplicaSet
from danube.machines.dispatch import QueueLimits, StartKind, StartPosition
from danube.machines.node import replica_owner
from danube.machines.node.core import (
    BrokerCore,
    BrokerIdentity,
    PublishAcked,
    ReplicaConfig,
    ReplicaPropose,
    ReplicaSend,
    ReplicationSettings,
    TopicStopped,
)
from danube.machines.node.effects import DropWal, WalIo
from danube.machines.replication.messages import Mismatch, Replicated, StaleEpoch
from danube.machines.wal import format
from danube.machines.wal.machine import Fsync, WalConfig, Write
from danube.testing import CoreDriver
from danube.values.config import DispatchStrategy, Policies
from danube.values.errors import DanubeError

URL = "http://127.0.0.1:6650"
TOPIC = "/default/r"
EARLIEST = StartPosition(StartKind.EARLIEST)


class Owner:
    """A standalone core whose reliable topic replicates to followers `b2`, `b3`."""

    def __init__(self, settings: ReplicationSettings | None = None) -> None:
        self.core = BrokerCore(
            BrokerIdentity(URL, URL),
            rng=random.Random(7),
            default_policies=Policies(),
            queue_limits=QueueLimits(),
            wal_config=WalConfig(segment_bytes=64 * 1024),
            replication=settings or ReplicationSettings(broker_id="b1"),
        )
        self.driver = CoreDriver(self.core)
        self.run(self.core.bootstrap(["default"]).effects)
        step = self.core.create_producer(
            TOPIC, "p", access_mode=0, strategy=DispatchStrategy.RELIABLE
        )
        self.run(step.effects)
        self.producer = step.value
        self.version = 1

    @property
    def now(self) -> int:
        return self.driver.now_ms

    def run(self, effects: Any) -> list[Any]:
        return self.driver.run(effects)

    def configure(self, followers: tuple[str, ...], in_sync: tuple[str, ...]) -> list[Any]:
        """The replicas value as the owner reads it (also stored, for proposals)."""
        record = ReplicaSet(0, "b1", followers, in_sync)
        self.driver.metadata[keys.replicas_key(TOPIC)] = record.to_json()
        config = ReplicaConfig(0, followers, in_sync, self.version)
        return self.run(self.core.replicas_changed(TOPIC, config, now_ms=self.now).effects)

    def publish(self, payload: str) -> int:
        step = self.core.publish(
            self.producer, TOPIC, payload, len(payload), None,
            encode=lambda offset: payload.encode(), now_ms=self.now,
        )  # fmt: skip
        self.run(step.effects)
        return step.value

    def answer(self, follower: str, answer: Any) -> list[Any]:
        return self.run(self.core.replica_answered(follower, answer, now_ms=self.now).effects)

    def sends(self) -> list[ReplicaSend]:
        sent, self.driver.port.sent = self.driver.port.sent, []
        return sent

    def acked(self) -> int:
        return self.driver.acked.get(TOPIC, -1)

    def consume(self) -> tuple[int, int]:
        step = self.core.subscribe(TOPIC, "c", "s", 0, (), EARLIEST, now_ms=self.now)
        self.run(step.effects)
        opened = self.core.open_stream(step.value, now_ms=self.now)
        self.run(opened.effects)
        return step.value, opened.value

    def taken(self, consumer: tuple[int, int]) -> list[Any]:
        return list(self.core.take(consumer[0], consumer[1], 1000) or [])


def test_a_publish_waits_for_every_in_sync_follower() -> None:
    owner = Owner()
    owner.configure(("b2", "b3"), ("b2", "b3"))
    probes = owner.sends()
    assert sorted(s.follower for s in probes) == ["b2", "b3"]
    assert all(s.message.record_count == 0 for s in probes)
    consumer = owner.consume()

    owner.publish("m0")
    sends = owner.sends()
    assert [(s.follower, s.message.prev_end, s.message.record_count) for s in sends] == [
        ("b2", 0, 1),
        ("b3", 0, 1),
    ]
    assert owner.acked() == -1, "acknowledged before any follower has it"
    assert owner.taken(consumer) == []

    owner.answer("b2", Replicated(TOPIC, 0, 1))
    assert owner.acked() == -1, "acknowledged before b3 has it"
    assert owner.taken(consumer) == []
    effects = owner.answer("b3", Replicated(TOPIC, 0, 1))
    assert PublishAcked(TOPIC, 0) in effects
    assert len(owner.taken(consumer)) == 1


def test_the_frames_sent_are_the_bytes_the_wal_wrote() -> None:
    owner = Owner()
    owner.configure(("b2",), ("b2",))
    owner.sends()
    for i in range(3):
        owner.publish(f"m{i}")
    frames = b"".join(s.message.frames for s in owner.sends())
    (segment,) = owner.driver.files[TOPIC].values()
    header = format.decode_segment_header(bytes(segment))
    assert frames == bytes(segment[header.length :])


def test_a_group_commit_goes_out_with_its_write_and_counts_once_the_owner_fsynced() -> None:
    """The frames go to the followers in the same step as the WAL's `Write`, before the
    owner's fsync (the two fsyncs overlap); a follower that has them durably first
    acknowledges nothing until the owner's own fsync is done."""
    owner = Owner()
    owner.configure(("b2",), ("b2",))
    owner.sends()
    core, now = owner.core, owner.now
    step = core.publish(
        owner.producer, TOPIC, "m0", 2, None, encode=lambda offset: b"m0", now_ms=now
    )
    sends = [e for e in step.effects if isinstance(e, ReplicaSend)]
    assert [(s.follower, s.message.prev_end, s.message.end) for s in sends] == [("b2", 0, 1)]
    io = [f for e in step.effects if isinstance(e, WalIo) for f in e.effects]
    assert any(isinstance(f, Write) for f in io)
    fsyncs: list[Fsync] = []
    for effect in io:
        done = core.wal_io_done(TOPIC, effect, None, now_ms=now).effects
        fsyncs += [
            f for e in done if isinstance(e, WalIo) for f in e.effects if isinstance(f, Fsync)
        ]
    assert len(fsyncs) == 1, "the owner's fsync is under way"
    answered = core.replica_answered("b2", Replicated(TOPIC, 0, 1), now_ms=now).effects
    assert not any(isinstance(e, PublishAcked) for e in answered), (
        "acknowledged before the owner's own fsync"
    )
    done = core.wal_io_done(TOPIC, fsyncs[0], None, now_ms=now).effects
    assert PublishAcked(TOPIC, 0) in done


def test_planted_bug_counting_the_written_end_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A high watermark that counts what the owner wrote rather than what it has on disk
    (`tests/sim/replication_mutations.count_written_end`) fails the test above."""
    from tests.sim.replication_mutations import count_written_end

    with count_written_end(), pytest.raises(AssertionError, match="before the owner's own"):
        test_a_group_commit_goes_out_with_its_write_and_counts_once_the_owner_fsynced()


def test_a_repair_below_what_was_sent_stops_the_topic() -> None:
    rewound()


def rewound() -> Owner:
    """The frames went to the follower as written; the fsync fails and the repair cuts them
    from the owner's log. Serving on under the same epoch would put other records at those
    offsets while the follower holds these: the topic stops until a new claim (new epoch,
    reconciliation by epoch)."""
    owner = Owner()
    owner.configure(("b2",), ("b2",))
    owner.sends()
    port = owner.driver.port
    answer = port.answer

    def fsync_fails(effect: Any) -> Any:
        if isinstance(effect, TopicFile) and isinstance(effect.effect, Fsync):
            port.answer = answer
            raise OSError("EIO")
        return answer(effect)

    port.answer = fsync_fails  # type: ignore[method-assign]
    waiter = owner.driver.wait_stored(TOPIC, 0)
    owner.publish("m0")
    assert [(s.message.prev_end, s.message.end) for s in owner.sends()] == [(0, 1)]
    assert waiter.error is not None and owner.acked() == -1
    assert "repaired to offset 0" in owner.driver.stopped.get(TOPIC, ""), owner.driver.stopped
    with pytest.raises(DanubeError):
        owner.publish("m1")
    # Stopped to be claimed again under a new epoch: the port hands it to the ownership
    # machine (`Host.restart_topic`).
    assert port.restarted == [TOPIC]
    return owner


def test_a_stopped_replicated_topic_leaves_unsealed_with_its_files() -> None:
    """Its tail was never uploaded (the WAL stopped): an unload, the restart's or an
    operator's, settles at once and tells the release not to seal the replica set
    (`Lifecycle.tail_kept`), and the topic is forgotten with its files kept, which hold
    everything it acknowledged."""
    leaves_unsealed(rewound())
    owner = Owner()
    owner.configure(("b2",), ("b2",))
    owner.sends()
    owner.publish("m0")
    owner.answer("b2", Replicated(TOPIC, 0, 1))
    assert owner.acked() == 0
    assert owner.core.lifecycle.tail_kept(TOPIC) is False, "serving: nothing to say yet"
    effects = owner.answer("b2", StaleEpoch(TOPIC, 9))  # deposed: stopped, no restart
    assert any(isinstance(e, TopicStopped) and not e.restart for e in effects)
    assert owner.driver.port.restarted == []
    leaves_unsealed(owner)


def leaves_unsealed(owner: Owner) -> None:
    owner.run(owner.core.unload(TOPIC, owner.now).effects)
    assert owner.core.settled(TOPIC)
    assert owner.core.lifecycle.tail_kept(TOPIC), "a stopped topic's tail was not uploaded"
    removed = owner.core.remove(TOPIC, reason="moved", delete_files=True).effects
    (drop,) = [e for e in removed if isinstance(e, DropWal)]
    assert not drop.delete_files


def test_planted_bug_sealing_a_stopped_topic_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the rule (only a hand-over keeps the tail unsealed, as before), the test
    above fails: the operator's unload of a stopped topic would seal its replica set."""
    from danube.machines.node.lifecycle import Lifecycle

    def handed_over_only(self: Lifecycle, topic: str) -> bool:
        record = self._topics.get(topic)
        return record is not None and record.log.handing_over

    monkeypatch.setattr(Lifecycle, "tail_kept", handed_over_only)
    with pytest.raises(AssertionError):
        test_a_stopped_replicated_topic_leaves_unsealed_with_its_files()


def test_planted_bug_serving_on_after_a_rewinding_repair_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without the rule (the repaired topic serves on under its epoch), the test above fails."""
    monkeypatch.setattr(replica_owner.OwnerReplicas, "_rewound", lambda *args: [])
    with pytest.raises(AssertionError):
        test_a_repair_below_what_was_sent_stops_the_topic()


def test_a_catching_up_follower_does_not_hold_acknowledgements_back_and_joins() -> None:
    owner = Owner()
    owner.publish("m0")  # before replication: b2 lacks it
    owner.configure(("b2",), ())
    owner.sends()
    owner.publish("m1")
    assert owner.acked() == 1, "a follower outside the in-sync set must not gate"
    owner.sends()
    # b2 says it holds nothing: what the window lacks is read back from the WAL.
    owner.answer("b2", Mismatch(TOPIC, 0, 0))
    resent = owner.sends()
    assert resent[0].message.prev_end == 0 and resent[-1].message.end == 2
    effects = owner.answer("b2", Replicated(TOPIC, 0, 2))
    # Caught up: proposed for the in-sync set, written to the store, read back, adopted.
    assert any(isinstance(e, ReplicaPropose) and e.proposal.in_sync == ("b2",) for e in effects)
    stored = ReplicaSet.from_json(owner.driver.metadata[keys.replicas_key(TOPIC)])
    assert stored.in_sync == ("b2",)
    owner.publish("m2")
    assert owner.acked() == 1, "b2 is in sync now: m2 waits for it"
    owner.answer("b2", Replicated(TOPIC, 0, 3))
    assert owner.acked() == 2


def test_a_lagging_follower_is_shrunk_away_and_acknowledgements_resume() -> None:
    owner = Owner(ReplicationSettings(broker_id="b1", lag_ms=500))
    owner.configure(("b2",), ("b2",))
    owner.publish("m0")
    assert owner.acked() == -1
    owner.driver.now_ms += 600
    effects = owner.run(owner.core.tick(owner.now).effects)
    assert any(isinstance(e, ReplicaPropose) and e.proposal.in_sync == () for e in effects)
    assert ReplicaSet.from_json(owner.driver.metadata[keys.replicas_key(TOPIC)]).in_sync == ()
    assert owner.acked() == 0, "once the shrink is recorded the owner acknowledges alone"


def test_below_min_in_sync_a_publish_is_refused_and_says_why() -> None:
    owner = Owner(ReplicationSettings(broker_id="b1", min_in_sync=2))
    owner.publish("m0")  # before replication: b2 lacks it, so it is not in sync
    owner.configure(("b2",), ())
    waiter = owner.driver.wait_stored(TOPIC, 1)
    owner.publish("m1")
    assert owner.acked() == 0
    assert isinstance(waiter.error, DanubeError)
    failed = [e for e in owner.driver.port.events if e[0] == "publish_failed"]
    assert failed and "fewer in-sync replicas" in failed[0][1]["reason"]


def test_a_higher_epoch_stops_the_topic() -> None:
    owner = Owner()
    owner.configure(("b2",), ("b2",))
    waiter = owner.driver.wait_stored(TOPIC, 0)
    owner.publish("m0")
    effects = owner.answer("b2", StaleEpoch(TOPIC, 5))
    assert any(isinstance(e, TopicStopped) and "epoch 5" in e.reason for e in effects)
    assert waiter.error is not None
    with pytest.raises(DanubeError):
        owner.publish("m1")


def test_a_proposal_refused_for_its_claim_stops_the_topic_and_proposes_no_more() -> None:
    """The read-back of a refused proposal at the version it compared (`claim_gone`): the
    claim of the owner's epoch is gone. The topic stops as for a higher epoch, saying so,
    and nothing more is proposed at its ticks (before: one refused proposal a tick)."""
    owner = Owner()
    owner.configure(("b2",), ("b2",))
    waiter = owner.driver.wait_stored(TOPIC, 0)
    owner.publish("m0")
    config = ReplicaConfig(0, ("b2",), ("b2",), owner.version, claim_gone=0)
    effects = owner.run(
        owner.core.replica_proposal_answered(TOPIC, config, now_ms=owner.now).effects
    )
    assert any(
        isinstance(e, TopicStopped) and f"the claim of epoch 0 on {TOPIC} is gone" in e.reason
        for e in effects
    ), effects
    assert waiter.error is not None
    for _ in range(20):
        owner.driver.now_ms += 50
        tick = owner.core.tick(owner.now).effects
        assert not [e for e in tick if isinstance(e, ReplicaPropose)], tick


def test_a_follower_behind_the_window_is_resent_from_the_wal() -> None:
    owner = Owner(ReplicationSettings(broker_id="b1", window_bytes=1))
    owner.configure(("b2",), ())
    for i in range(4):
        owner.publish(f"m{i}")
    owner.sends()
    # b2 lost everything: the window holds only the last commit, so the rest is read back.
    owner.answer("b2", Mismatch(TOPIC, 0, 0))
    sends = owner.sends()
    assert sends and sends[0].message.prev_end == 0
    assert sends[-1].message.end == 4
    (segment,) = owner.driver.files[TOPIC].values()
    header = format.decode_segment_header(bytes(segment))
    assert b"".join(s.message.frames for s in sends) == bytes(segment[header.length :])


def test_without_followers_nothing_changes() -> None:
    owner = Owner()
    owner.configure((), ())
    owner.publish("m0")
    assert owner.acked() == 0
    assert owner.sends() == []


def test_an_owner_whose_followers_are_gone_acknowledges_alone() -> None:
    """The leader took b2 away (its broker is gone, none is left to replace it): the owner
    acknowledges what it holds, having recorded that it replicates under its epoch."""
    owner = Owner()
    owner.configure(("b2",), ("b2",))
    owner.publish("m0")
    assert owner.acked() == -1
    owner.configure((), ())
    assert owner.acked() == 0
    stored = ReplicaSet.from_json(owner.driver.metadata[keys.replicas_key(TOPIC)])
    assert stored.epochs and stored.epochs[-1][0] == stored.epoch


def test_nothing_is_acknowledged_before_the_epoch_is_recorded() -> None:
    """An owner that could not record its epoch in the replica set (the store refuses)
    acknowledges nothing: the load manager, seeing no sign of replication, could give the
    topic to another broker without these records."""
    owner = Owner()
    owner.driver.port.hold = lambda effect: type(effect).__name__ == "StoreTxn"
    owner.configure((), ())
    owner.publish("m0")
    assert owner.acked() == -1
    owner.driver.port.hold = None
    owner.run(())
    owner.driver.interpreter.perform_now(owner.driver.port.release)
    assert owner.acked() == 0


# -- planted bug: acknowledging before the followers have it -------------------------------------


def test_planted_bug_acknowledging_at_local_durability_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first test's check, run against a core that acknowledges as soon as its own WAL
    is durable (the bug issue 27 is about), must fail."""
    original = replica_owner.OwnerReplicas.durable

    def acks_early(self: Any, record: Any, through: int, now_ms: int) -> list[Any]:
        return [*original(self, record, through, now_ms), PublishAcked(record.name.full, through)]

    monkeypatch.setattr(replica_owner.OwnerReplicas, "durable", acks_early)
    with pytest.raises(AssertionError, match="acknowledged before any follower"):
        test_a_publish_waits_for_every_in_sync_follower()


def test_planted_bug_readable_before_followers_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dispatch that follows the local WAL's `Readable` instead of the high watermark."""
    from danube.machines.node import reliable_log

    original = reliable_log.ReliableLogs.wal_effects

    def readable_early(self: Any, record: Any, effects: Any, now_ms: int) -> list[Any]:
        effects = list(effects)
        out = original(self, record, effects, now_ms)
        for effect in effects:
            if type(effect).__name__ == "Readable":
                out.extend(self.make_readable(record, effect.through_offset, now_ms))
        return out

    monkeypatch.setattr(reliable_log.ReliableLogs, "wal_effects", readable_early)
    with pytest.raises(AssertionError):
        test_a_publish_waits_for_every_in_sync_follower()


def test_a_registration_under_way_is_not_made_again_at_every_tick() -> None:
    """An owner records its epoch in the replica set once (a registration); until its answer
    comes, a tick makes it again only after `replica_owner.REGISTER_RETRY_MS`, and at once
    after it was lost. Every tick (50 ms) made it again before: a failover's new owner sent each of
    hundreds of registrations to a slow store tens of times over (issue 23 point 4)."""
    owner = Owner()
    config = ReplicaConfig(0, ("b2",), ("b2",), owner.version)
    step = owner.core.replicas_changed(TOPIC, config, now_ms=owner.now)
    assert [e.proposal.in_sync for e in step.effects if isinstance(e, ReplicaPropose)] == [("b2",)]

    def proposals(after_ms: int) -> int:
        owner.driver.now_ms += after_ms
        return sum(isinstance(e, ReplicaPropose) for e in owner.core.tick(owner.now).effects)

    assert [proposals(50) for _ in range(20)] == [0] * 20, "made again while under way"
    assert proposals(replica_owner.REGISTER_RETRY_MS) == 1, "an answer gone astray: made again"
    owner.core.replica_proposal_lost(TOPIC)
    assert proposals(50) == 1, "a lost registration is made again at the next tick"
    # Its answer older than the value held (ignored): over all the same, made again soon.
    older = ReplicaConfig(0, ("b2",), ("b2",), owner.version - 1)
    owner.core.replica_proposal_answered(TOPIC, older, now_ms=owner.now)
    assert proposals(50) == 0, "not at once"
    again = replica_owner.REGISTER_AGAIN_MS - 50
    assert proposals(again) == 1, "an answered registration that does not show is made again"


def registrations_at_one_instant(owner: Owner, answers: list[ReplicaConfig]) -> None:
    """The registration made once on `answers[0]`, then answered by each of `answers`
    (with a tick after each) at one instant: none is made again until `REGISTER_AGAIN_MS`
    later, then one is."""
    step = owner.core.replicas_changed(TOPIC, answers[0], now_ms=owner.now)
    assert sum(isinstance(e, ReplicaPropose) for e in step.effects) == 1
    made = 0
    for answer in answers:
        step = owner.core.replica_proposal_answered(TOPIC, answer, now_ms=owner.now)
        made += sum(isinstance(e, ReplicaPropose) for e in step.effects)
        made += sum(isinstance(e, ReplicaPropose) for e in owner.core.tick(owner.now).effects)
    assert made == 0, f"{made} registrations at one instant: a loop on the store"
    owner.driver.now_ms += replica_owner.REGISTER_AGAIN_MS
    tick = owner.core.tick(owner.now)
    assert sum(isinstance(e, ReplicaPropose) for e in tick.effects) == 1


def test_a_registration_answered_without_the_owners_epoch_is_not_made_again_at_once() -> None:
    """A refused claim (or a set recording another epoch) answers every registration the same
    way: made again at once, it looped on the store, one transaction per round trip, for ever
    (review finding); now once `REGISTER_AGAIN_MS` after the answer, at a tick."""
    owner = Owner()
    config = ReplicaConfig(0, ("b2",), ("b2",), owner.version)
    registrations_at_one_instant(owner, [config] * 100)  # refused, read back the same value


def test_a_registration_written_under_another_epoch_is_not_made_again_at_once() -> None:
    """A proposal records the owner's epoch only where the set names that epoch (the claim
    wrote it). An owner whose set names another one had each of its registrations commit,
    a newer value every time, and made it again at once: about 900 transactions a simulated
    second for as long as it owned the topic (`load_batch_forgets_replica_sets`, an owner
    loaded without reading its set). Now the same wait as for a refused one."""
    owner = Owner()
    state = owner.core._topics[TOPIC].log
    state.epoch, epoch = 7, 3  # the owner's claim is newer than the epoch the set names
    versions = range(owner.version, owner.version + 101)  # each answer a committed write
    registrations_at_one_instant(
        owner, [ReplicaConfig(epoch, ("b2",), ("b2",), version) for version in versions]
    )
