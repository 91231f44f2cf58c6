"""Poison messages as operators watch them (spec/failure-policies.md, issue 24): per reliable
subscription, how many messages its poison policy dropped (Drop, or an operator's skip of a
blocked one) since it was loaded on this broker, and how many the Block policy holds now.
How many redeliveries each cause asked for (nack, ack timeout, consumer gone) and how many
messages the DeadLetter policy stored in their dead-letter topic; per broker, its dead-letter
republishes by outcome (stored, failed, forwarded to another broker). Read from the dispatch
machines at scrape time; nothing is kept between scrapes."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Metric

from danube.machines.dispatch.reliable import ReliableSubscription
from danube.machines.node.core import BrokerCore


def poison_families(broker: str, core: BrokerCore) -> Iterator[Metric]:
    dropped = CounterMetricFamily(
        "danube_subscription_poison_dropped",
        "Reliable subscriptions: messages skipped by the poison policy after their last "
        "allowed delivery (or by an operator) since the subscription was loaded here.",
        labels=["broker", "topic", "subscription"],
    )
    blocked = GaugeMetricFamily(
        "danube_subscription_blocked_messages",
        "Reliable subscriptions: messages the Block poison policy holds, waiting for an "
        "operator (Key-Shared: each holds its key; the others: the subscription).",
        labels=["broker", "topic", "subscription"],
    )
    redeliveries = CounterMetricFamily(
        "danube_subscription_redelivery_causes",
        "Reliable subscriptions: redeliveries asked for since the subscription was loaded "
        "here, by cause (nack, ack timeout, consumer gone).",
        labels=["broker", "topic", "subscription", "cause"],
    )
    dead_lettered = CounterMetricFamily(
        "danube_subscription_dlq",
        "Reliable subscriptions: messages stored in the dead-letter topic by the DeadLetter "
        "poison policy since the subscription was loaded here (Danube's name).",
        labels=["broker", "topic", "subscription", "poison_policy"],
    )
    republishes = CounterMetricFamily(
        "danube_dead_letter_republishes",
        "Dead letters this broker asked for since it started, by outcome: stored (its "
        "dead-letter topic acknowledged it, here or on its owner), failed (refused or lost: "
        "asked again after the policy's backoff), forwarded (sent to the broker serving the "
        "dead-letter topic, cluster mode; each also counted stored or failed).",
        labels=["broker", "outcome"],
    )
    letters = core.dead_letters
    for outcome, count in (
        ("stored", letters.stored),
        ("failed", letters.failed),
        ("forwarded", letters.forwarded),
    ):
        republishes.add_metric([broker, outcome], count)
    for record in core.topic_records():
        for sub in record.subscriptions.values():
            dispatcher = sub.machine  # a read-only view: not a touch
            if isinstance(dispatcher, ReliableSubscription):
                labels = [broker, record.name.full, sub.name]
                dropped.add_metric(labels, dispatcher.dropped)
                blocked.add_metric(labels, len(dispatcher.blocked))
                dead_lettered.add_metric([*labels, "dead_letter"], dispatcher.dead_letters_stored)
                for cause, count in sorted(dispatcher.redeliveries_by_cause.items()):
                    redeliveries.add_metric([*labels, cause.replace(" ", "_")], count)
    yield dropped
    yield blocked
    yield redeliveries
    yield dead_lettered
    yield republishes
