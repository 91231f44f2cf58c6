"""The load generator's plan: what it refuses before touching a broker, and the names it
gives (issue 7, point 1). The run itself is tested against a real broker in
tests/spark/test_load_audit.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from danube.audit.load import LoadPlan, Tally, subscription_types


def plan(**changes: object) -> LoadPlan:
    return LoadPlan(service_url="http://127.0.0.1:1", logs=Path("logs"), **changes)  # type: ignore[arg-type]


def test_a_sound_plan_has_no_problem() -> None:
    assert plan().problems() == []


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"topics": 0}, "--topics must be at least 1"),
        ({"keys": -1}, "--keys must be 0 (no key) or more"),
        ({"drain_s": -1.0}, "--drain must not be negative"),
        ({"subscriptions": ()}, "name at least one subscription type"),
        ({"subscriptions": ("shared", "shared")}, "each subscription type may be named once"),
        ({"subscriptions": ("bogus",)}, "unknown subscription type(s) bogus"),
        ({"rate": 0.0}, "--rate must be above 0"),
        ({"partitions": -1}, "--partitions must be 0 (not partitioned) or more"),
        ({"connection_topics": 0}, "--topics-per-connection must be at least 1"),
        ({"duration_s": -1.0}, "--duration must not be negative"),
    ],
)
def test_bad_plans_are_named(changes: dict[str, object], problem: str) -> None:
    assert problem in plan(**changes).problems()


def test_danube_cli_spellings_of_subscription_types_are_taken() -> None:
    assert subscription_types("Exclusive, key-shared,fail-over,shared,") == (
        "exclusive",
        "key_shared",
        "failover",
        "shared",
    )


def test_topics_carry_the_run_id_unless_a_prefix_is_given() -> None:
    """Two generators on one topic would make each other's messages unseen."""
    first, second = plan(topics=2), plan(topics=2)
    assert first.topic_names == [
        f"/default/load-{first.run_id}-0",
        f"/default/load-{first.run_id}-1",
    ]
    assert set(first.topic_names).isdisjoint(second.topic_names)
    assert plan(topic_prefix="/ns/t").topic_names == ["/ns/t-0"]


def test_the_tally_owes_what_was_acknowledged_until_it_arrives() -> None:
    tally = Tally(("exclusive", "shared"))
    early = ("/t", "p", 1)
    tally.received("shared", early)  # before its acknowledgement came back
    tally.acked(early)
    tally.acked(("/t", "p", 2))
    assert tally.missing() == {"exclusive": 2, "shared": 1}
    tally.received("exclusive", early)
    tally.received("exclusive", ("/t", "p", 2))
    tally.received("shared", ("/t", "p", 2))
    assert tally.missing() == {"exclusive": 0, "shared": 0}
    assert tally.deliveries == {"exclusive": 2, "shared": 2}


def test_subscriptions_carry_the_run_id_unless_a_prefix_names_them() -> None:
    assert plan(run_id="abc123").subscription("exclusive") == "load-abc123-exclusive"
    named = plan(run_id="abc123", subscription_prefix="soak")
    assert named.subscription("shared") == "soak-shared"
