"""The one interpreter of the core's effects, through the instant memory port of
`danube.testing` (spec/effects.md): the decided policies, each tested once."""

from __future__ import annotations

from typing import Any

from danube.effects import (
    Backoff,
    ObjectFailure,
    ObjectGet,
    ObjectStoreFailed,
    Outcome,
    Sleep,
    StoreTxn,
    TxnAnswer,
    Work,
)
from danube.effects.flow import run_now
from danube.interpreter import flows
from danube.interpreter.waiters import MetadataLane, Publishes
from danube.machines.tiering import CommitIndex, ObjectRead, UploadError
from danube.machines.wal.format import WalFormatError
from danube.metadata.model import KeyValue
from danube.values.errors import DanubeError


def plan() -> ObjectRead:
    return ObjectRead("k", 0, 0, 10, 0, 0, 1)


def test_an_object_read_retries_store_failures_for_as_long_as_they_last() -> None:
    failures, pauses = [0], []

    def perform(effect: Any) -> Any:
        if isinstance(effect, ObjectGet):
            failures[0] += 1
            if failures[0] < 40:
                raise ObjectStoreFailed(ObjectFailure.TRANSIENT, "500")
            return b"data"
        if isinstance(effect, Sleep):
            pauses.append(effect.ms)
            return None
        assert isinstance(effect, Work)
        return (b"record",)

    outcome = run_now(flows.read_object(plan(), lambda: True), perform)
    assert outcome == flows.ReadOutcome((b"record",))
    assert pauses[:6] == [200, 400, 800, 1600, 3200, 5000] and max(pauses) == 5000


def test_only_bytes_that_do_not_verify_stop_an_object_read() -> None:
    def perform(effect: Any) -> Any:
        if isinstance(effect, Work):
            raise WalFormatError("bad crc")
        return b"data"

    outcome = run_now(flows.read_object(plan(), lambda: True), perform)
    assert outcome is not None and "does not verify" in (outcome.failure or "")


def test_an_object_read_ends_quietly_when_its_topic_goes() -> None:
    live = iter([True, False])

    def perform(effect: Any) -> Any:
        if isinstance(effect, ObjectGet):
            raise ObjectStoreFailed(ObjectFailure.TRANSIENT, "500")
        return None

    assert run_now(flows.read_object(plan(), lambda: next(live)), perform) is None


def test_a_bounded_backoff_gives_up_and_says_why() -> None:
    def perform(effect: Any) -> Any:
        if isinstance(effect, ObjectGet):
            raise ObjectStoreFailed(ObjectFailure.TRANSIENT, "500")
        return None

    bounded = Backoff(first_ms=1, attempts=3)
    outcome = run_now(flows.read_object(plan(), lambda: True, bounded), perform)
    assert outcome is not None and "cannot be read" in (outcome.failure or "")


def test_upload_failures_are_classified_once() -> None:
    throttled = ObjectStoreFailed(ObjectFailure.THROTTLED, "SlowDown")
    assert flows.classify(throttled) is UploadError.THROTTLED
    assert flows.classify(ObjectStoreFailed(ObjectFailure.TRANSIENT, "500")) is (
        UploadError.SERVER_ERROR
    )
    assert flows.classify(ObjectStoreFailed(ObjectFailure.FATAL, "403")) is UploadError.FATAL
    assert flows.classify(FileNotFoundError("gone")) is UploadError.FATAL
    assert flows.classify(WalFormatError("bad")) is UploadError.FATAL
    assert flows.classify(ConnectionResetError()) is UploadError.SERVER_ERROR


def test_an_index_commit_is_one_store_transaction_with_its_path_read_back() -> None:
    entry = _Entry()
    commit = CommitIndex("/index/0", entry, "/index/cur")  # type: ignore[arg-type]
    txn = commit.transaction()
    assert isinstance(txn, StoreTxn) and txn.read_back == ("/index/0",)
    found = KeyValue("/index/0", entry.to_json(), 1, 1, 1, None)

    def perform(effect: Any) -> Any:
        return TxnAnswer(Outcome.UNKNOWN, {"/index/0": found})

    answer = run_now(flows.commit_index(commit), perform)
    assert answer is not None and answer.found["/index/0"] is found


class _Entry:
    start_offset = 0
    key = "objects/a"

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key}


def test_each_waiting_publish_is_answered_exactly_once() -> None:
    answers: list[tuple[str, DanubeError | None]] = []
    table = Publishes(lambda waiter, error: answers.append((waiter, error)))
    table.wait("t", 3, "a")
    table.wait("t", 5, "b")
    table.wait("t", 9, "c")
    table.acknowledge("t", 5)
    table.fail("t", 0, "topic stopped")
    table.acknowledge("t", 9)
    assert [w for w, _ in answers] == ["a", "b", "c"]
    assert answers[2][1] is not None
    table.wait("t", -1, "d")  # nothing left to wait for: answered at once
    assert answers[-1] == ("d", None) and len(answers) == 4


def test_a_topic_whose_publishes_are_all_answered_holds_no_queue() -> None:
    """Issue 23: an idle topic's empty deque (about 600 bytes) was kept for ever."""
    answers: list[tuple[str, DanubeError | None]] = []
    table = Publishes(lambda waiter, error: answers.append((waiter, error)))
    table.wait("t", 3, "a")
    table.wait("u", 3, "b")
    table.acknowledge("t", 3)
    table.fail("u", 0, "topic stopped")
    assert table.waiting == {} and len(answers) == 2
    table.wait("t", 4, "c")
    table.acknowledge("t", 4)
    assert table.waiting == {} and answers[-1] == ("c", None)


def test_a_reply_waits_for_every_metadata_change_before_it_and_hears_their_failures() -> None:
    lane, heard = MetadataLane(), []
    for _ in range(3):
        lane.submit(object())
    lane.when_durable(1, 2, heard.append)
    lane.written(None)
    assert heard == []
    lane.written("NotOwner")
    assert heard == ["NotOwner"]


def test_a_fresh_topics_load_removes_and_remakes_its_directory_and_scans_nothing() -> None:
    """The scan of a directory just removed and made again is known (empty): a fresh load
    asks for no `ScanTopic` (issue 23: a worker-thread hop per new topic fewer)."""
    from danube.effects import RecoverTopic, RemoveTopicFiles, ScanTopic

    asked: list[Any] = []

    def perform(effect: Any) -> Any:
        asked.append(effect)
        assert not isinstance(effect, ScanTopic)
        return None

    plan = run_now(flows.recover("/default/t", lambda: (0, 0), fresh=True, now_ms=lambda: 0),
                   perform)  # fmt: skip
    assert asked[0] == RemoveTopicFiles("/default/t", recreate=True)
    assert [type(effect) for effect in asked] == [RemoveTopicFiles, RecoverTopic]
    assert plan.next_offset == 0 and not plan.segments
