"""The replication machines in a random world (`tests/replication/model.py`): random
interleavings of appends, deliveries, broken streams, fsyncs, follower crashes, in-sync
proposals and one failover keep r1-lite, r3 and fencing; and once the faults stop
(`World.settle`), every follower catches up and rejoins the in-sync set (liveness). Each
planted bug below breaks one rule and must be caught within 200 seeds, so the model is shown
able to fail."""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from danube.machines.replication.follower import FollowerLog
from danube.machines.replication.messages import (
    FollowerEffect,
    Mismatch,
    OwnerEffect,
    Replicate,
    Replicated,
)
from danube.machines.replication.owner import OwnerReplication
from tests.replication.model import Violation, World


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(min_value=0, max_value=2**64))
def test_random_worlds_keep_the_invariants(seed: int) -> None:
    """A seed, not `st.randoms()`: a world draws thousands of choices, more than Hypothesis
    likes to record per example, and a seed reproduces a failure just as well."""
    world = World(random.Random(seed))
    world.run(400)
    world.settle()


def test_a_follower_whose_acknowledgements_were_withheld_rejoins() -> None:
    """Seeds 1802 and 2387. 1802: a promoted owner's follower makes its last epoch-1
    frames and the first epoch-2 frame durable in one fsync, so it acknowledges neither
    (frames of an older epoch are never acknowledged); the topic then goes idle. 2387: the
    new owner's empty probe finds the follower's last epoch-1 append not yet durable (no
    answer), and that append, once durable, is not acknowledged either. Without the
    owner's probe of an overdue follower (`OwnerReplication._probe_overdue`) neither
    follower ever rejoins."""
    for seed in (1802, 2387):
        world = World(random.Random(seed))
        world.run(400)
        world.settle()


def test_the_worlds_reach_what_they_check() -> None:
    """Acknowledgements in both epochs, failovers and committed in-sync changes happen, or
    the checks above would pass vacuously."""
    acks = promoted = versions = 0
    for seed in range(60):
        world = World(random.Random(seed))
        world.run(400)
        acks += world.acks
        promoted += world.promoted
        versions += world.etcd["version"] - (2 if world.promoted else 1)
    assert acks > 1_000 and promoted > 10 and versions > 30


def _caught(**classes: type) -> str:
    for seed in range(200):
        try:
            world = World(random.Random(seed), **classes)
            world.run(400)
            world.settle()
        except Violation as violation:
            return str(violation)
    raise AssertionError("the planted bug went unnoticed for 200 seeds")


class _AcknowledgesBeforeFollowers(OwnerReplication):
    def _target(self) -> int:
        return self.durable_end


class _CountsTheWrittenEnd(OwnerReplication):
    """The high watermark counts what the owner sent as written, not what it has on disk."""

    def _target(self) -> int:
        durable, self.durable_end = self.durable_end, self.written_end
        try:
            return super()._target()
        finally:
            self.durable_end = durable

    def written(self, end: int, frames: bytes, now_ms: int) -> list[OwnerEffect]:
        return [*super().written(end, frames, now_ms), *self._advance()]


class _AcceptsLowerEpoch(FollowerLog):
    def replicate(self, msg: Replicate) -> list[FollowerEffect]:
        if msg.epoch < self.epoch:
            msg = replace(msg, epoch=self.epoch)
        return super().replicate(msg)


class _ExpandCountsLate(OwnerReplication):
    def _counted(self) -> frozenset[str]:
        return self.in_sync


class _AcknowledgesForTheFramesEpoch(FollowerLog):
    """Answers a durable append with the epoch it was appended under, even after this
    follower saw a higher one: the deposed owner would count it."""

    def appended_durable(self, end: int) -> list[FollowerEffect]:
        epochs = [epoch for until, epoch in self._appends if until <= end]
        out = super().appended_durable(end)
        if epochs and not out and self.durable_end >= end:
            return [Replicated(self.topic, min(epochs), self.durable_end)]
        return out


class _NeverExpands(OwnerReplication):
    def _maybe_expand(self) -> list[OwnerEffect]:
        return []


class _IgnoresMismatch(OwnerReplication):
    def mismatch(self, follower: str, msg: Mismatch, now_ms: int) -> list[OwnerEffect]:
        return []


def test_planted_never_expanding_is_caught() -> None:
    assert _caught(owner_cls=_NeverExpands).startswith("liveness")


def test_planted_ignoring_a_mismatch_is_caught() -> None:
    assert _caught(owner_cls=_IgnoresMismatch).startswith("liveness")


def test_planted_acknowledging_before_the_followers_fsync_is_caught() -> None:
    assert _caught(owner_cls=_AcknowledgesBeforeFollowers).startswith("r1")


def test_planted_counting_the_owners_written_end_is_caught() -> None:
    """Frames go out as the owner writes them; acknowledging once the followers have them,
    before the owner's own fsync, breaks r1 (the owner's durable end)."""
    assert _caught(owner_cls=_CountsTheWrittenEnd).startswith("r1")


def test_planted_follower_accepting_a_deposed_owner_is_caught() -> None:
    assert _caught(follower_cls=_AcceptsLowerEpoch).startswith("r3")


def test_planted_expand_counted_only_once_committed_is_caught() -> None:
    assert _caught(owner_cls=_ExpandCountsLate).startswith("r1")


def test_planted_follower_acknowledging_for_a_deposed_owner_is_caught() -> None:
    assert _caught(follower_cls=_AcknowledgesForTheFramesEpoch).startswith("fencing")
