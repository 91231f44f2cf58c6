"""`bench.sim_commit_batching`'s group-commit replay (issue 22, round 8): the numbers in
bench/RESULTS.md rest on it, so its rule is pinned on hand-made times."""

from __future__ import annotations

from bench.sim_commit_batching import group_commit


def test_commits_that_never_overlap_go_alone_and_wait_for_nothing() -> None:
    assert group_commit([(0, 10), (20, 10), (40, 10)]) == (3, [0, 0, 0])


def test_commits_behind_one_in_flight_go_together_when_it_answers() -> None:
    # 0 is in flight until 100; 10, 20 and 30 wait and go as one at 100 (answered at 150,
    # the first waiter's round trip); 120 waits behind that batch and goes alone at 150.
    transactions, waits = group_commit([(0, 100), (10, 50), (20, 5), (30, 5), (120, 5)])
    assert transactions == 3
    assert waits == [0, 90, 80, 70, 30]


def test_a_slow_commit_holds_up_every_later_one() -> None:
    transactions, waits = group_commit([(0, 3_000_000), (1_000, 900), (2_000, 900)])
    assert transactions == 2
    assert waits == [0, 2_999_000, 2_998_000]
