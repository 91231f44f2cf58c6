"""Per-topic traffic for the console's charts, read from the brokers' Prometheus endpoints.

The admin API has no rates or backlog (Danube's UI asks Prometheus for them), so the console
scrapes each broker's `/metrics` (its `metrics_addr` from `list_brokers`) and sums a topic's
counters over all brokers: after a move the old owner keeps its count and the new one starts
from zero, so the sum stays monotonic. Rates are the browser's deltas between two polls.
Backlog is an estimate: messages published minus messages dispatched per subscription since
the brokers started (the metrics carry no cursor positions); it is labelled so in the UI.
"""

from __future__ import annotations

import re
import ssl
import urllib.request
from collections.abc import Iterable, Mapping
from typing import Any

SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
TOPIC_COUNTERS = {
    "danube_topic_messages_in_total": "messages_in",
    "danube_topic_bytes_in_total": "bytes_in",
    "danube_topic_active_producers": "producers",
    "danube_topic_active_consumers": "consumers",
}
SUBSCRIPTION_COUNTERS = {"danube_consumer_messages_out_total": "messages_out"}


def topic_series(texts: Iterable[str], topic: str) -> dict[str, Any]:
    """The topic's counters summed over the exposition texts of all brokers."""
    totals: dict[str, float] = dict.fromkeys(TOPIC_COUNTERS.values(), 0.0)
    subscriptions: dict[str, float] = {}
    for text in texts:
        for line in text.splitlines():
            match = SAMPLE.match(line)
            if match is None:
                continue
            name = match["name"]
            if name not in TOPIC_COUNTERS and name not in SUBSCRIPTION_COUNTERS:
                continue
            labels = dict(LABEL.findall(match["labels"]))
            if labels.get("topic") != topic:
                continue
            value = float(match["value"])
            if name in TOPIC_COUNTERS:
                totals[TOPIC_COUNTERS[name]] += value
            else:
                sub = labels.get("subscription", "")
                subscriptions[sub] = subscriptions.get(sub, 0.0) + value
    backlog = {sub: max(0.0, totals["messages_in"] - out) for sub, out in subscriptions.items()}
    return {**totals, "messages_out": subscriptions, "backlog_estimate": backlog}


def scrape(
    urls: Iterable[str],
    timeout_s: float,
    context: ssl.SSLContext | None = None,
    token: str | None = None,
) -> list[str]:
    """The `/metrics` text of each broker that answers; one that does not is skipped (a dead
    broker must not blank the chart of the topics that moved away from it). `context`: the
    TLS settings for a secured broker's metrics port (HTTPS with the broker's CA); `token`:
    the bearer token a secured `/metrics` asks for (Lookup on the cluster)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    texts = []
    for url in urls:
        try:
            target = urllib.request.Request(f"{url.rstrip('/')}/metrics", headers=headers)
            with urllib.request.urlopen(target, timeout=timeout_s, context=context) as reply:
                texts.append(reply.read().decode("utf-8", "replace"))
        except OSError:
            continue
    return texts


def metrics_urls(brokers: Mapping[str, Any], tls: bool = False) -> list[str]:
    """The metrics addresses in a `list_brokers` result. A secured broker serves `/metrics`
    over HTTPS and advertises `https://`; brokers before issue 25's second part advertised
    `http://` regardless, so with TLS on the admin port the scheme is corrected here."""
    urls = [b["metrics_addr"] for b in brokers.get("brokers", []) if b.get("metrics_addr")]
    if tls:
        urls = [
            f"https://{u.removeprefix('http://')}" if u.startswith("http://") else u for u in urls
        ]
    return urls


def metrics_context(
    ca_file: str | None,
    tls: bool,
    cert_file: str | None = None,
    key_file: str | None = None,
) -> ssl.SSLContext | None:
    """HTTPS settings for the metrics ports when the admin port is secured (the same CA; a
    client certificate, when one is given, identifies the scraper)."""
    if not tls:
        return None
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_file is not None:
        context.load_cert_chain(cert_file, key_file)
    return context
