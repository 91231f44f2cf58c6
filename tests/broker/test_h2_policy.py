"""The HTTP/2 guard's decisions (`danube.runtime.h2_policy`), as properties over any timing."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from danube.runtime.h2_policy import (
    Keepalive,
    KeepaliveAction,
    PingStrikes,
    ResetBudget,
    header_list_size,
)

gaps = st.lists(st.floats(min_value=0, max_value=5, allow_nan=False), max_size=300)


def _times(steps: list[float] | list[int]) -> list[float]:
    now, times = 0.0, []
    for step in steps:
        now += step
        times.append(now)
    return times


@given(gaps, st.integers(min_value=1, max_value=20), st.floats(min_value=0.1, max_value=10))
def test_reset_budget_trips_exactly_when_a_window_holds_more_than_the_limit(
    steps: list[float], limit: int, window: float
) -> None:
    budget = ResetBudget(limit, window)
    times = _times(steps)
    for i, now in enumerate(times):
        in_window = sum(1 for t in times[: i + 1] if t > now - window)
        assert budget.reset(now) == (in_window > limit)


@given(gaps)
def test_a_reset_budget_of_zero_never_trips(steps: list[float]) -> None:
    budget = ResetBudget(0, 10)
    assert not any(budget.reset(now) for now in _times(steps))


def test_reset_budget_forgets_resets_older_than_its_window() -> None:
    budget = ResetBudget(2, 10)
    assert not budget.reset(0) and not budget.reset(1)
    assert budget.reset(2)
    assert not ResetBudget(2, 10).reset(0)
    later = ResetBudget(2, 10)
    later.reset(0)
    later.reset(1)
    assert not later.reset(11)  # the first two have left the window


@given(st.lists(st.integers(min_value=10, max_value=100), max_size=50))
def test_pings_no_closer_than_the_interval_are_never_strikes(steps: list[int]) -> None:
    strikes = PingStrikes(10)
    assert not any(strikes.ping(now) for now in _times(steps))
    assert strikes.strikes == 0


def test_the_third_strike_closes_and_sending_forgives() -> None:
    strikes = PingStrikes(10, max_strikes=2)
    assert [strikes.ping(t) for t in (0, 1, 2, 3)] == [False, False, False, True]
    forgiven = PingStrikes(10, max_strikes=2)
    for t in range(20):
        forgiven.sent()  # the broker answered something in between: e.g. BDP pings
        assert not forgiven.ping(t)


@given(
    st.floats(min_value=0.01, max_value=100),
    st.floats(min_value=0.01, max_value=100),
    st.lists(st.tuples(st.floats(min_value=0, max_value=50), st.booleans()), max_size=100),
)
def test_keepalive_closes_only_a_busy_peer_silent_for_interval_plus_timeout(
    interval: float, timeout: float, ticks: list[tuple[float, bool]]
) -> None:
    """Never closes before `interval + timeout` of silence; pings only a busy connection."""
    keepalive = Keepalive(interval, timeout, 0.0)
    now = 0.0
    last_read = 0.0
    pinged = False
    for step, busy in ticks:
        now += step
        action = keepalive.tick(now, busy)
        if action is KeepaliveAction.PING:
            assert busy and not pinged and now - last_read >= interval
            pinged = True
        if action is KeepaliveAction.CLOSE:
            assert pinged and now - last_read >= interval + timeout - 1e-9
            return
        assert keepalive.next_tick(now) > 0


def test_keepalive_pings_then_closes_a_silent_busy_peer_and_an_answer_saves_it() -> None:
    keepalive = Keepalive(1.0, 2.0, 0.0)
    assert keepalive.tick(0.5, busy=True) is KeepaliveAction.NOTHING
    assert keepalive.tick(1.0, busy=True) is KeepaliveAction.PING
    assert keepalive.next_tick(1.0) == 2.0
    assert keepalive.tick(2.9, busy=True) is KeepaliveAction.NOTHING
    assert keepalive.tick(3.0, busy=True) is KeepaliveAction.CLOSE
    saved = Keepalive(1.0, 2.0, 0.0)
    assert saved.tick(1.0, busy=True) is KeepaliveAction.PING
    saved.received(1.5)  # the ack
    assert saved.tick(2.4, busy=True) is KeepaliveAction.NOTHING
    assert saved.tick(2.5, busy=True) is KeepaliveAction.PING  # a new round, not a CLOSE
    idle = Keepalive(1.0, 2.0, 0.0)
    assert idle.tick(100, busy=False) is KeepaliveAction.NOTHING


def test_header_list_size_counts_32_bytes_per_field() -> None:
    assert header_list_size([]) == 0
    assert header_list_size([("ab", "cde"), (b"x", b"")]) == 2 + 3 + 32 + 1 + 32


def test_a_client_pinging_at_the_minimum_interval_with_jitter_collects_no_strike() -> None:
    """A Rust client's keep_alive_interval of exactly 10 s on a quiet stream: its pings land
    a little early or late; only clearly early ones are strikes (review of issue 20)."""
    strikes = PingStrikes(min_interval=10.0)
    now = 0.0
    for _ in range(20):
        assert not strikes.ping(now)
        now += 9.95
    assert strikes.strikes == 0
