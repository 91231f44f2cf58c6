"""The broker side of ownership: claim on assignment, load, unload and release on deletion
(marking the leader's not-ready marker ready), retries, late markers, and dropping everything
when the lease changes. One test per rule of danube.machines.cluster.ownership's docstring."""

from __future__ import annotations

import pytest

from danube.machines.cluster.keys import Marker, MarkerReason, assignment_key, unassigned_key
from danube.machines.cluster.ownership import (
    Claim,
    Drop,
    Load,
    NotOwner,
    Ownership,
    OwnershipConfig,
    Phase,
    Release,
    Unload,
    WakeAt,
    become_writer,
    fence_compares,
    owner_key,
    seal_replica_set,
    writer_key,
)
from danube.machines.cluster.replicas import ReplicaSet
from danube.metadata.model import Compare, Delete, KeyValue, Put
from danube.metadata.state import MetadataState

T = "/default/orders"
OWNER = owner_key(T)
MARKER = unassigned_key(T)


def machine(lease: int = 7) -> Ownership:
    o = Ownership(OwnershipConfig("1", retry_ms=500))
    assert o.member(lease, 0) == []
    return o


def last(o: Ownership, topic: str = T) -> int:
    """The token of the topic's last claim, which its answer names (`Claim.token`)."""
    token = o.last_claim(topic)
    assert token is not None
    return token


def serving(o: Ownership, claim_revision: int = 40) -> None:
    (claim,) = o.assignment_seen(T, True, 0)
    assert isinstance(claim, Claim)
    assert o.claim_done(T, True, claim_revision, 0, known=True, token=last(o)) == [
        Load(T, claim_revision)
    ]
    assert o.loaded(T, 0) == []
    assert o.serving() == [T]


def unload_marker(ready: bool = False, from_broker: str = "1") -> Marker:
    return Marker(MarkerReason.UNLOAD, from_broker, None, ready)


def test_owner_key_follows_the_topic_layout() -> None:
    assert OWNER == "/topics/default/orders/owner"


def test_an_assignment_is_claimed_under_the_lease_by_compare_and_create() -> None:
    """Compared also on the assignment: a broker whose view is stale (back from a
    partition, its watch behind) cannot claim a topic the leader gave to another."""
    o = machine()
    assigned = Compare(assignment_key("1", T), "mod_revision", ">", 0)
    assert o.assignment_seen(T, True, 0) == [
        Claim(
            T,
            (Compare(OWNER, "version", "==", 0), assigned),
            (Put(OWNER, {"broker_id": 1}, 7),),
            lease_id=7,
            token=1,
        )
    ]
    assert o.phase(T) is Phase.CLAIMING
    assert o.assignment_seen(T, True, 1) == []  # one claim at a time


def test_a_claim_carries_its_revision_into_the_load() -> None:
    o = machine()
    serving(o, claim_revision=41)


def test_a_refused_claim_is_retried_after_the_delay() -> None:
    o = machine()
    o.assignment_seen(T, True, 0)
    assert o.claim_done(T, False, 0, 100, known=True, token=last(o)) == [WakeAt(600)]
    assert o.tick(599) == [WakeAt(600)]
    assert [type(e) for e in o.tick(600)] == [Claim]


def test_a_deleted_assignment_unloads_then_releases_claim_and_marks_the_marker_ready() -> None:
    o = machine()
    serving(o)
    assert o.marker_seen(T, unload_marker(), 50, 0) == []
    assert o.assignment_seen(T, False, 0) == [Unload(T, 40)]
    assert o.phase(T) is Phase.UNLOADING
    assert o.unloaded(T, 0) == [
        Release(
            T,
            (
                Compare(OWNER, "mod_revision", "==", 40),
                Compare(MARKER, "mod_revision", "==", 50),
            ),
            (Delete(OWNER), Put(MARKER, {"reason": "unload", "from_broker": 1, "ready": True})),
            40,  # after a completed unload: the replica set of epoch 40 is marked sealed
        )
    ]
    assert o.released(T, True, 0) == []
    assert o.phase(T) is None


def test_a_rebalance_marker_is_marked_ready_with_its_target_kept() -> None:
    o = machine()
    serving(o)
    o.marker_seen(T, Marker(MarkerReason.REBALANCE, "1", "2", False, 1_700_000_000), 50, 0)
    o.assignment_seen(T, False, 0)
    (release,) = o.unloaded(T, 0)
    assert isinstance(release, Release)
    assert release.ops[1] == Put(
        MARKER,
        {
            "reason": "rebalance",
            "from_broker": 1,
            "to_broker": 2,
            "timestamp": 1_700_000_000,
            "ready": True,
        },
    )


def test_a_marker_that_shows_after_the_release_is_still_marked_ready() -> None:
    o = machine()
    serving(o)
    o.assignment_seen(T, False, 0)
    (release,) = o.unloaded(T, 0)
    assert release == Release(
        T, (Compare(OWNER, "mod_revision", "==", 40),), (Delete(OWNER),), sealed_epoch=40
    )
    o.released(T, True, 0)
    assert o.phase(T) is None
    (late,) = o.marker_seen(T, unload_marker(), 60, 0)
    assert late == Release(
        T,
        (Compare(MARKER, "mod_revision", "==", 60),),
        (Put(MARKER, {"reason": "unload", "from_broker": 1, "ready": True}),),
    )
    o.released(T, True, 0)
    assert o.phase(T) is None


def test_markers_of_other_brokers_or_already_ready_are_not_ours_to_touch() -> None:
    o = machine()
    assert o.marker_seen(T, unload_marker(from_broker="2"), 60, 0) == []
    assert o.marker_seen(T, unload_marker(ready=True), 61, 0) == []
    assert o.marker_seen(T, Marker(), 62, 0) == []  # a new topic's null marker
    assert o.phase(T) is None


def test_a_failed_release_is_retried() -> None:
    o = machine()
    serving(o)
    o.assignment_seen(T, False, 0)
    o.unloaded(T, 0)
    assert o.released(T, False, 10) == [WakeAt(510)]
    assert [type(e) for e in o.tick(510)] == [Release]


def test_an_assignment_deleted_while_loading_is_unloaded_once_the_load_answers() -> None:
    o = machine()
    o.assignment_seen(T, True, 0)
    o.claim_done(T, True, 40, 0, known=True, token=last(o))  # Load(T, 40) is out
    assert o.assignment_seen(T, False, 0) == []
    assert o.loaded(T, 0) == [Unload(T, 40)]


def test_an_assignment_deleted_while_claiming_needs_no_unload() -> None:
    o = machine()
    o.assignment_seen(T, True, 0)
    o.assignment_seen(T, False, 0)
    assert o.claim_done(T, False, 0, 0, known=True, token=last(o)) == []
    assert o.phase(T) is None


@pytest.mark.parametrize("claim_out", [True, False], ids=["claim in flight", "claim waiting"])
def test_a_topic_moved_away_before_its_claim_landed_still_marks_the_marker_ready(
    claim_out: bool,
) -> None:
    """Found by `python -m sim --cluster --data` (seed 4): the claim kept finding the
    broker's own claim of its previous lease, the leader moved the topic away, and with the
    marker seen before the deleted assignment the machine forgot the topic without marking
    the marker ready; no broker was ever assigned the topic again."""
    o = machine()
    o.assignment_seen(T, True, 0)
    if not claim_out:
        assert o.claim_done(T, False, 0, 0, known=True, token=last(o)) == [WakeAt(500)]
    moved = Marker(MarkerReason.REBALANCE, "1", "2", False, 1_700_000_000)
    assert o.marker_seen(T, moved, 60, 1) == ([] if claim_out else [WakeAt(500)])
    effects = o.assignment_seen(T, False, 2)
    if claim_out:
        assert effects == []
        effects = o.claim_done(T, False, 0, 3, known=True, token=last(o))
    (release,) = effects
    assert release == Release(
        T,
        (Compare(MARKER, "mod_revision", "==", 60),),
        (Put(MARKER, dict(moved.to_json(), ready=True)),),
    )
    assert o.released(T, True, 4) == []
    assert o.phase(T) is None


def test_a_claim_whose_answer_was_lost_is_settled_before_the_topic_is_forgotten() -> None:
    """The claim timed out, then the assignment went: the claim may have landed under the
    lease and would block the next owner until the lease dies. The machine claims again,
    and releases what that finds."""
    o = machine()
    o.assignment_seen(T, True, 0)
    assert o.claim_done(T, False, 0, 100, known=False, token=last(o)) == [WakeAt(600)]
    assert o.assignment_seen(T, False, 200) == [WakeAt(600)], "the retry still stands"
    (again,) = o.tick(600)
    assert isinstance(again, Claim)
    # It had landed (own_claim): the topic is loaded, then unloaded, since its WAL may hold
    # what no object holds yet.
    assert o.claim_done(T, True, 41, 650, known=True, token=last(o)) == [Load(T, 41)]
    assert o.loaded(T, 660) == [Unload(T, 41)]
    (release,) = o.unloaded(T, 700)
    assert release == Release(
        T, (Compare(OWNER, "mod_revision", "==", 41),), (Delete(OWNER),), sealed_epoch=41
    )
    assert o.released(T, True, 750) == []
    assert o.phase(T) is None


def test_an_unassigned_topic_whose_claim_is_known_to_have_failed_is_forgotten() -> None:
    o = machine()
    o.assignment_seen(T, True, 0)
    assert o.claim_done(T, False, 0, 100, known=False, token=last(o)) == [WakeAt(600)]
    o.assignment_seen(T, False, 200)
    (again,) = o.tick(600)
    assert isinstance(again, Claim)
    assert (
        o.claim_done(T, False, 0, 650, known=True, token=last(o)) == []
    )  # another broker's claim is there
    assert o.phase(T) is None


def test_a_topic_assigned_back_during_its_unload_is_claimed_again_after_release() -> None:
    o = machine()
    serving(o)
    o.assignment_seen(T, False, 0)
    assert o.assignment_seen(T, True, 0) == []  # still unloading
    o.unloaded(T, 0)
    assert [type(e) for e in o.released(T, True, 0)] == [Claim]


def test_a_failed_load_keeps_the_claim_and_tries_again() -> None:
    o = machine()
    o.assignment_seen(T, True, 0)
    o.claim_done(T, True, 40, 0, known=True, token=last(o))
    assert not o.failed_load(T)
    assert o.load_failed(T, 100) == [WakeAt(600)]
    assert o.failed_load(T)  # requests for it are not held (`ViewFacts.load_failed`)
    assert o.tick(600) == [Load(T, 40)]


def test_a_load_whose_writer_record_went_unanswered_is_retried_with_its_decision() -> None:
    """The writer transaction may land after the load failed: the retry carries what the
    load decided about the local WAL (`become_writer` keeps it once the replica set shows
    that transaction landed); a new claim starts afresh."""
    o = machine()
    o.assignment_seen(T, True, 0)
    o.claim_done(T, True, 40, 0, known=True, token=last(o))
    assert o.load_failed(T, 100, keep_local=True) == [WakeAt(600)]
    assert o.tick(600) == [Load(T, 40, True)]
    assert o.load_failed(T, 700) == [WakeAt(1200)]
    assert o.tick(1200) == [Load(T, 40, True)]
    o.member(8, 1300)  # a new lease: every topic dropped, the assignment claimed again
    assert o.claim_done(T, True, 90, 1300, known=True, token=last(o)) == [Load(T, 90)]


def test_a_new_lease_drops_every_topic_and_claims_the_assignments_again() -> None:
    o = machine()
    serving(o)
    other = "/default/other"
    o.assignment_seen(other, True, 0)
    effects = o.member(8, 0)
    assert effects[:2] == [Drop(T), Drop(other)]
    claims = [e for e in effects if isinstance(e, Claim)]
    assert [c.topic for c in claims] == [T, other]
    assert all(c.ops[0] == Put(owner_key(c.topic), {"broker_id": 1}, 8) for c in claims)


def test_the_answer_of_a_claim_sent_under_an_old_lease_is_not_the_new_claims() -> None:
    """A claim in flight across a new registration: its answer, landed under the old lease
    at revision 40, arrives once the new stay's claim is out. Taken for the new claim's, it
    loaded the topic under revision 40, a key of the old lease that is about to vanish (and
    the new claim's own answer was then ignored). It is ignored; the new claim, refused
    while the old lease's key stands, is retried and lands."""
    o = machine(lease=7)
    (old,) = o.assignment_seen(T, True, 0)
    assert isinstance(old, Claim) and old.lease_id == 7
    effects = o.member(8, 0)
    (new,) = [e for e in effects if isinstance(e, Claim)]
    assert new.lease_id == 8 and new.token != old.token
    assert o.claim_done(T, True, 40, 10, known=True, token=old.token) == []
    assert o.phase(T) is Phase.CLAIMING
    assert o.claim_done(T, False, 0, 20, known=False, token=old.token) == []
    assert o.tick(5_000) == []  # still one claim in flight: the new one
    assert o.claim_done(T, False, 0, 30, known=True, token=new.token) == [WakeAt(530)]
    (again,) = o.tick(530)
    assert isinstance(again, Claim) and again.lease_id == 8
    assert o.claim_done(T, True, 60, 600, known=True, token=again.token) == [Load(T, 60)]


def test_a_new_lease_claims_no_assignment_of_a_past_incarnation() -> None:
    """Heavy seed 162 (spec/replication.md): a broker back from a crash must not claim a
    topic the leader assigned to its past incarnation and is about to fail over. Run in a
    store: the assignment written before the new registration is refused, one written
    after it (the leader's new decision) is claimed."""
    store = MetadataState()
    store.put(assignment_key("1", T), None)  # the past incarnation's assignment
    lease = store.grant_lease(10, 0)
    registration, _ = store.txn((), (Put("/cluster/register/1", {}, lease),))
    o = Ownership(OwnershipConfig("1", retry_ms=500))
    o.assignment_seen(T, True, 0)
    (claim,) = o.member(lease, 0, registered_at=registration.revision)
    assert isinstance(claim, Claim)
    assert not store.txn(claim.compares, claim.ops)[0].succeeded
    assert o.claim_done(T, False, 0, 0, known=True, token=last(o)) == [WakeAt(500)]
    store.txn((), (Delete(assignment_key("1", T)),))  # the leader fails it over...
    store.put(assignment_key("1", T), None)  # ...and assigns it here again
    (claim,) = [e for e in o.tick(500) if isinstance(e, Claim)]
    assert store.txn(claim.compares, claim.ops)[0].succeeded


def test_nothing_is_done_before_the_broker_is_a_member() -> None:
    o = Ownership(OwnershipConfig("1"))
    assert o.assignment_seen(T, True, 0) == []
    assert [type(e) for e in o.member(7, 0)] == [Claim]


@pytest.mark.parametrize(("broker", "retry"), [("", 1), ("a/b", 1), ("1", 0)])
def test_bad_settings_are_refused(broker: str, retry: int) -> None:
    with pytest.raises(ValueError):
        OwnershipConfig(broker, retry_ms=retry)


# -- the fenced writes and the writer record ---------------------------------------------------


def test_every_topic_a_write_touches_is_fenced_on_its_claim() -> None:
    keys = [
        "/topics/default/orders/subscriptions/s/cursor",
        "/storage/topics/default/orders/segments/00000000000000000000",
        "/topics/default/audit/producers/9",
        "/namespaces/default/policy",
    ]
    claims = {T: 11, "/default/audit": 12}
    assert fence_compares(keys, claims) == [
        Compare("/topics/default/audit/owner", "mod_revision", "==", 12),
        Compare(OWNER, "mod_revision", "==", 11),
    ]


def test_a_write_for_an_unclaimed_topic_is_refused_and_standalone_is_not_fenced() -> None:
    cursor = ["/topics/default/orders/subscriptions/s/cursor"]
    with pytest.raises(NotOwner, match="/default/orders"):
        fence_compares(cursor, {"/default/audit": 3})
    assert fence_compares(cursor, None) == []
    assert fence_compares(["/namespaces/default/policy"], {}) == []


def test_a_broker_keeps_its_wal_only_while_it_is_still_the_writer() -> None:
    mine = become_writer(T, "1", 40, {writer_key(T): {"broker_id": 1}})
    assert mine.keep_local
    assert mine.compares == (Compare(OWNER, "mod_revision", "==", 40),)
    assert mine.ops == (Put(writer_key(T), {"broker_id": 1}),)
    assert not become_writer(T, "1", 40, {writer_key(T): {"broker_id": 2}}).keep_local
    assert not become_writer(T, "1", 40, {}).keep_local


def test_a_replica_set_written_by_this_claim_keeps_the_earlier_loads_decision() -> None:
    """A replica set naming this broker owner at this claim's epoch was written by an
    earlier load of the claim whose answer was lost: it took the broker out of `in_sync`,
    so the retry keeps that load's decision (`Load.keep_local`), whatever the writer key
    read says; a set of another epoch or owner decides afresh."""
    ours = ReplicaSet(40, "1", ("1", "2"), ("2",))
    found = KeyValue("/cluster/replicas/default/orders", ours.to_json(), 5, 41, 2, None)
    other = {writer_key(T): {"broker_id": 2}}
    assert not become_writer(T, "1", 40, other, found).keep_local
    assert become_writer(T, "1", 40, other, found, landed=True).keep_local
    assert not become_writer(T, "1", 40, other, found, landed=False).keep_local
    older = ReplicaSet(30, "1", ("1", "2"), ("2",))
    found = KeyValue("/cluster/replicas/default/orders", older.to_json(), 5, 31, 2, None)
    assert not become_writer(T, "1", 40, other, found, landed=True).keep_local
    theirs = ReplicaSet(40, "2", ("1", "2"), ("2",))
    found = KeyValue("/cluster/replicas/default/orders", theirs.to_json(), 5, 41, 2, None)
    assert not become_writer(T, "1", 40, other, found, landed=True).keep_local


def test_a_claim_found_is_ours_only_under_our_name_and_lease() -> None:
    """Found by `python -m sim --cluster --data` (seed 5 of the default profile): a claim
    whose answer timed out had landed; every retry's compare failed on it, and the topic was
    served by no broker for as long as the lease lived."""
    from danube.machines.cluster.ownership import own_claim
    from danube.metadata.model import KeyValue

    def found(value: object, lease: int | None) -> KeyValue:
        return KeyValue("/topics/default/t/owner", value, 5, 7, 1, lease)

    assert own_claim(found({"broker_id": 1}, 42), "1", 42)
    assert not own_claim(found({"broker_id": 1}, 41), "1", 42)
    assert not own_claim(found({"broker_id": 2}, 42), "1", 42)
    assert not own_claim(found("garbage", 42), "1", 42)
    assert not own_claim(None, "1", 42)
    assert not own_claim(found({"broker_id": 1}, 42), "1", None)


def test_an_unload_overtaken_by_a_new_lease_and_claim_is_no_longer_current() -> None:
    """Found in review: the driver forgot the topic once the seal settled without asking
    whether the unload was still current, so a stay loaded again meanwhile (new lease, new
    claim) lost its topic and WAL directory while the machine believed it served."""
    o = machine()
    serving(o, claim_revision=40)
    assert o.assignment_seen(T, False, 0) == [Unload(T, 40)]
    assert o.unloading(T, 40)
    o.member(8, 0)  # a new lease: Drop, the topic is not assigned any more
    assert not o.unloading(T, 40)
    o.assignment_seen(T, True, 0)
    o.claim_done(T, True, 90, 0, known=True, token=last(o))
    o.loaded(T, 0)
    assert o.phase(T) is Phase.SERVING
    assert not o.unloading(T, 40)
    o.assignment_seen(T, False, 0)
    assert o.unloading(T, 90) and not o.unloading(T, 40)


def test_a_load_of_an_earlier_stay_adopts_nothing_once_a_new_claim_loads_the_topic() -> None:
    """A load in flight across a new lease: the topic is dropped, claimed again at a new
    revision and loading again. The earlier load is no longer the topic's step (`loading`),
    so its flow adopts nothing, and its answers (`loaded`, `load_failed` naming its claim)
    leave the new stay's load alone."""
    o = machine()
    o.assignment_seen(T, True, 0)
    assert o.claim_done(T, True, 40, 0, known=True, token=last(o)) == [Load(T, 40)]
    assert o.loading(T, 40)
    o.member(8, 10)  # a new lease: Drop, and the assignment claimed again
    assert not o.loading(T, 40)
    assert o.claim_done(T, True, 90, 20, known=True, token=last(o)) == [Load(T, 90)]
    assert o.loading(T, 90) and not o.loading(T, 40)
    assert o.loaded(T, 30, 40) == [] and o.phase(T) is Phase.LOADING
    assert o.load_failed(T, 30, None, 40) == [] and not o.failed_load(T)
    assert o.loaded(T, 40, 90) == [] and o.phase(T) is Phase.SERVING
    assert not o.loading(T, 90)


def test_a_release_whose_claim_is_gone_is_done_and_one_whose_claim_stands_is_not() -> None:
    """Found in review: a release that landed but whose answer was lost compared a deleted
    claim on every retry and stayed RELEASING for good."""
    from danube.machines.cluster.ownership import release_done
    from danube.metadata.model import KeyValue

    o = machine()
    serving(o, claim_revision=40)
    [unload] = o.assignment_seen(T, False, 0)
    [release] = o.unloaded(T, 0)
    assert isinstance(unload, Unload) and isinstance(release, Release)

    def claim(revision: int) -> KeyValue:
        return KeyValue(OWNER, {"broker_id": 1}, revision, revision, 1, 7)

    assert release_done(release, None)
    assert release_done(release, claim(90))  # claimed anew since: not ours to delete
    assert not release_done(release, claim(40))
    marker_only = Release(T, (Compare(MARKER, "mod_revision", "==", 50),), ())
    assert not release_done(marker_only, None)


def test_a_topic_assigned_back_while_only_its_marker_was_owed_is_claimed_again() -> None:
    """Found in review: when the claim was released but the marker's ready was still owed and
    the marker then went away, the topic was forgotten without looking whether it had been
    assigned back meanwhile; it waited for an assignment event that never came."""
    o = machine()
    serving(o)
    o.marker_seen(T, unload_marker(), 50, 0)
    o.assignment_seen(T, False, 0)
    o.unloaded(T, 0)  # Release: the claim, and the marker at revision 50
    o.marker_seen(T, unload_marker(), 60, 0)  # rewritten while the release was out
    o.released(T, True, 0)  # the claim is gone; the marker at 60 is still owed: a new release
    o.assignment_seen(T, True, 0)  # assigned back meanwhile
    o.marker_seen(T, None, 0, 0)  # the marker is gone: nothing is owed any more
    o.released(T, False, 0)  # so the marker's release failed
    effects = o.tick(10_000)
    assert [type(e) for e in effects] == [Claim], effects


def test_a_delete_marker_reported_before_the_assignment_deletion_drops_the_topic() -> None:
    """The driver reads the marker before it reports the deletion, and the watch brings the
    same marker again afterwards: the older or equal report changes nothing."""
    o = machine()
    serving(o)
    delete = Marker(MarkerReason.DELETE, "1", None, False)
    assert o.marker_seen(T, delete, 60, 0) == []
    (unload,) = o.assignment_seen(T, False, 0)
    assert unload == Unload(T, 40, deleted=True)
    assert o.marker_seen(T, delete, 60, 0) == []
    assert o.marker_seen(T, unload_marker(), 59, 0) == []
    (release,) = o.unloaded(T, 0)
    assert isinstance(release, Release)
    assert Compare(MARKER, "mod_revision", "==", 60) in release.compares


def test_a_claimed_topic_unassigned_before_its_load_is_loaded_then_unloaded() -> None:
    """Its local WAL may hold acknowledged records no object holds yet (a replicated topic
    that waited for this broker, its last owner): the unload's seal uploads them. A topic
    whose load failed is unloaded without (nothing readable to seal)."""
    o = machine()
    o.assignment_seen(T, True, 0)
    assert o.claim_done(T, True, 41, 100, known=True, token=last(o)) == [Load(T, 41)]
    o.assignment_seen(T, False, 110)
    assert o.loaded(T, 120) == [Unload(T, 41)]
    o = machine()
    o.assignment_seen(T, True, 0)
    assert o.claim_done(T, True, 41, 100, known=True, token=last(o)) == [Load(T, 41)]
    o.assignment_seen(T, False, 110)
    assert o.load_failed(T, 120) == [WakeAt(620)]
    assert o.tick(620) == [Unload(T, 41)]


def test_only_an_unload_of_a_served_topic_marks_its_replica_set_sealed() -> None:
    """A release after a completed unload says the topic's tail is indexed (`sealed_epoch`);
    one whose load failed sealed nothing and must not say so (found by the simulator with
    replication, heavy faults, seed 56: the next owner came from the empty index)."""
    o = machine()
    o.assignment_seen(T, True, 0)
    assert o.claim_done(T, True, 41, 100, known=True, token=last(o)) == [Load(T, 41)]
    o.assignment_seen(T, False, 110)
    assert o.load_failed(T, 120) == [WakeAt(620)]
    assert o.tick(620) == [Unload(T, 41)]
    (release,) = o.unloaded(T, 700)
    assert release.sealed_epoch is None


def test_a_restart_unloads_releases_without_sealing_and_claims_again() -> None:
    """Issue 27, a repair that rewinds: the core stopped a served topic whose log was cut
    below what its followers may hold (`TopicStopped.restart`). The machine unloads it,
    keeping its files; the release deletes the claim without marking the replica set sealed
    (the tail was never uploaded: sealed, any broker could load the topic from objects
    without what the followers hold), whatever the settle answer said; and, still assigned
    here, the topic is claimed again: a new claim revision, hence a new epoch, loaded from
    the same files."""
    o = machine()
    serving(o, claim_revision=41)
    assert o.restart(T, 0) == [Unload(T, 41, restart=True)]
    assert o.restart(T, 0) == [], "already on its way out"
    (release,) = o.unloaded(T, 0)
    assert isinstance(release, Release) and release.sealed_epoch is None
    assert release.ops == (Delete(OWNER),)
    (claim,) = o.released(T, True, 0)
    assert isinstance(claim, Claim) and o.phase(T) is Phase.CLAIMING
    assert o.claim_done(T, True, 60, 0, known=True, token=last(o)) == [Load(T, 60)]
    assert o.loaded(T, 0) == [] and o.serving() == [T]
    # The new stay is an ordinary one: a later move seals as usual.
    o.assignment_seen(T, False, 0)
    (release,) = o.unloaded(T, 0)
    assert release.sealed_epoch == 60


def test_a_topic_not_served_ignores_a_restart_and_one_loading_restarts_once_loaded() -> None:
    o = machine()
    assert o.restart(T, 0) == []
    o.assignment_seen(T, True, 0)
    assert o.restart(T, 0) == [] and o.phase(T) is Phase.CLAIMING
    # Adopted in a batch whose answer comes later: the restart waits for the load's answer.
    assert o.claim_done(T, True, 41, 0, known=True, token=last(o)) == [Load(T, 41)]
    assert o.restart(T, 0) == []
    assert o.loaded(T, 0) == [Unload(T, 41, restart=True)]


def test_planted_bug_sealing_after_a_rewind_is_caught() -> None:
    """`seal_after_rewind` (tests/sim/replication_mutations.py) seals the replica set at
    the release of a restart: the test above sees it."""
    from tests.sim.replication_mutations import seal_after_rewind

    with seal_after_rewind(), pytest.raises(AssertionError):
        test_a_restart_unloads_releases_without_sealing_and_claims_again()


def test_a_handed_over_unload_never_seals_and_an_uploaded_one_always_does() -> None:
    """Issue 27, moves: the release of an unload handed over to the in-sync followers (its
    tail not uploaded) does not touch the replica set: marked sealed, any broker could load
    the topic from objects without that tail (found in review: a shrink landing late left
    `in_sync` empty in the store, and the release sealed). The promotion rule gives it to an
    in-sync member, or back to this broker, which kept its files. An unload that uploaded
    its tail marks the set sealed whatever `in_sync` says; a set another owner took over is
    left alone."""
    o = machine()
    serving(o, claim_revision=41)
    o.assignment_seen(T, False, 0)
    (release,) = o.unloaded(T, 0, handed_over=True)
    assert isinstance(release, Release) and release.sealed_epoch is None
    o = machine()
    serving(o, claim_revision=41)
    o.assignment_seen(T, False, 0)
    (release,) = o.unloaded(T, 0)
    assert isinstance(release, Release) and release.sealed_epoch == 41

    key = "/cluster/replicas/default/t"

    def kv(record: ReplicaSet) -> KeyValue:
        return KeyValue(key, record.to_json(), 3, 7, 2, None)

    for in_sync in (("b2",), ()):
        uploaded = ReplicaSet(41, "b1", ("b2",), in_sync, ((41, 0),))
        compares, ops = seal_replica_set(kv(uploaded), "b1", 41)
        assert compares == (Compare(key, "mod_revision", "==", 7),)
        sealed = ReplicaSet(41, "b1", ("b2",), in_sync, ((41, 0),), sealed=True)
        assert ops == (Put(key, sealed.to_json()),)
    handing = ReplicaSet(41, "b1", ("b2",), ("b2",), ((41, 0),))
    assert seal_replica_set(kv(handing), "b2", 41) == ((), ())
    assert seal_replica_set(kv(handing), "b1", 40) == ((), ())
