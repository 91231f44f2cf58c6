"""`danube-cli load` spreads its topics over client connections (`--topics-per-connection`)
and spreads its producers' schedules over the interval: one connection for 1,000 topics made
h2 visit every open stream at each new one, client and broker side, and one beat for every
producer sent them all at once; together they held the soak's load to a fifth of its rate
(bench/RESULTS.md, issue 28 part 5). Against the shared broker."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from unittest import mock

from danube.audit import load
from danube.audit.load import LoadPlan, LoadRun
from danube.client import Producer
from danube.localcluster.broker_process import BrokerProcess
from tests.support.aio import run


def test_topics_share_connections_by_the_plan_and_producers_start_spread(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    clients: list[Any] = []
    original = load.DanubeClient

    def counted(url: str) -> Any:
        client = original(url)
        clients.append(client)
        return client

    first_sends: dict[str, float] = {}
    send = Producer.send

    async def timed(self: Producer, payload: bytes, **kwargs: Any) -> Any:
        first_sends.setdefault(self.name, time.monotonic())
        return await send(self, payload, **kwargs)

    plan = LoadPlan(
        service_url=broker.url, logs=tmp_path / "logs", topic_prefix="/default/spread",
        topics=5, messages=20, rate=10.0, subscriptions=("exclusive",), drain_s=10,
        connection_topics=2,
    )  # fmt: skip
    with (
        mock.patch.object(load, "DanubeClient", counted),
        mock.patch.object(Producer, "send", timed),
    ):
        result = run(lambda: LoadRun(plan, lambda _: None).run(), timeout=120)
    assert len(clients) == 3  # topics 0-1, 2-3, 4
    assert not result.failures and result.acknowledged == 20
    assert result.missing == {"exclusive": 0}
    starts = sorted(first_sends.values())
    assert len(starts) == 5
    # the interval is 5 / 10 msg/s = 0.5 s: the first sends are 0.1 s apart, not at once
    assert starts[-1] - starts[0] >= 0.3


def test_sending_stops_at_the_duration_and_what_was_acknowledged_is_drained(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    plan = LoadPlan(
        service_url=broker.url, logs=tmp_path / "logs", topic_prefix="/default/lasting",
        topics=2, messages=10_000, rate=20.0, subscriptions=("exclusive",), drain_s=10,
        duration_s=2.0,
    )  # fmt: skip
    started = time.monotonic()
    result = run(lambda: LoadRun(plan, lambda _: None).run(), timeout=120)
    assert 0 < result.acknowledged <= 2.0 * 20 + 2  # not the 10,000 asked
    assert not result.failures and result.missing == {"exclusive": 0}
    assert time.monotonic() - started < 30


def test_named_subscriptions_are_made_once_and_resumed_by_a_later_run(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    """The memory soak's set-up makes the subscriptions its load then uses (issue 28 part 6):
    a second run with the same `--subscription-prefix` subscribes to the same ones, which the
    first left with everything acknowledged, and is owed exactly its own messages."""
    from danube.audit.load import summary
    from danube.cli.client import build_parser

    args = build_parser().parse_args(
        ["load", "--logs", "x", "--subscription-prefix", "soak", "--topics", "2"]
    )
    assert args.subscription_prefix == "soak"
    outcomes = []
    for run_number in range(2):
        plan = LoadPlan(
            service_url=broker.url, logs=tmp_path / f"logs-{run_number}",
            topic_prefix="/default/named-subs", subscription_prefix="named", topics=2,
            messages=10, rate=20.0, subscriptions=("exclusive",), drain_s=10,
        )  # fmt: skip
        result = run(lambda plan=plan: LoadRun(plan, lambda _: None).run(), timeout=120)
        outcomes.append((result, summary(plan, result)))
    for result, text in outcomes:
        assert not result.failures and result.acknowledged == 10
        assert result.missing == {"exclusive": 0}
        assert "subscription named-exclusive: 10 deliveries" in text
