"""The prober's samples judged as the suite judges them: a call the prober's own stop cut
short within the limit is no failure of the broker (CI once failed on exactly that)."""

from tests.hostile.harness import Sample
from tests.hostile.ledger import HEALTH_LIMIT_MS


def test_a_call_cut_short_by_the_stop_fails_only_when_it_was_already_slow() -> None:
    assert not Sample(0.0, 3.0, "INFLIGHT", 0).failed
    assert Sample(0.0, HEALTH_LIMIT_MS + 1, "INFLIGHT", 0).failed


def test_slow_or_unanswered_calls_fail() -> None:
    assert not Sample(0.0, 3.0, "OK", 0).failed
    assert Sample(0.0, HEALTH_LIMIT_MS + 1, "OK", 0).failed
    assert Sample(0.0, 3.0, "DROPPED", 0).failed
    assert Sample(0.0, 3.0, "UNAVAILABLE", 0).failed
