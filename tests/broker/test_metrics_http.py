"""The metrics endpoint's HTTP handling without a broker: malformed, oversized and slow
requests get an answer or a closed connection, never a crash; the histograms count as
Prometheus means them; removed topics lose their series."""

from __future__ import annotations

import asyncio
import itertools
import random
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace

import grpclib.const
import numpy as np
import pytest
import trio
import trio.testing
from grpclib.metadata import Deadline
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from danube.machines.dispatch import QueueLimits
from danube.machines.node.core import BrokerCore, BrokerIdentity
from danube.runtime import grpc_util, metrics_http
from danube.runtime import metrics as metrics_module
from danube.runtime.metrics import SIZE_BUCKETS, BrokerMetrics, Histogram
from danube.runtime.metrics_http import Endpoints, Request, Response, parse_head, read_head
from danube.values.config import DispatchStrategy, Policies


class Stub:
    def __init__(self) -> None:
        self.reason: str | None = "starting"
        self.scrapes = 0

    def metrics(self) -> bytes:
        self.scrapes += 1
        if self.scrapes == 2:
            raise RuntimeError("a collector broke")
        return b"up 1\n"

    def not_ready(self) -> str | None:
        return self.reason

    async def alive(self) -> bool:
        return True


@asynccontextmanager
async def endpoint(stub: Stub) -> AsyncIterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    port = sock.getsockname()[1]
    endpoints = Endpoints(stub.metrics, stub.not_ready, stub.alive)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(metrics_http.serve_http, sock, endpoints)
        yield port
        nursery.cancel_scope.cancel()
    sock.close()


async def exchange(port: int, data: bytes) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(data)
        received = b""
        while chunk := await stream.receive_some(65536):
            received += chunk
    return received


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"\x16\x03\x01garbage\r\n\r\n", 400),
        (b"GET /metrics\r\n\r\n", 400),
        (b"GET metrics HTTP/1.1\r\n\r\n", 400),
        (b"GET /metrics HTTP/2.0\r\n\r\n", 505),
        (b"GET /m\xc3\xa9trics HTTP/1.1\r\n\r\n", 400),
    ],
)
def test_malformed_request_lines_get_an_error_answer(head: bytes, status: int) -> None:
    parsed = parse_head(head)
    assert isinstance(parsed, Response) and parsed.status == status


def test_the_query_string_is_ignored() -> None:
    assert parse_head(b"GET /metrics?x=1 HTTP/1.0\r\nHost: a\r\n\r\n") == Request("GET", "/metrics")


@pytest.mark.trio
async def test_an_oversized_head_is_refused_without_reading_more() -> None:
    client, server = trio.testing.memory_stream_pair()
    await client.send_all(b"GET /metrics HTTP/1.1\r\n" + b"X: y\r\n" * 4000)
    answer = await read_head(server)
    assert isinstance(answer, Response) and answer.status == 431


@pytest.mark.trio
async def test_a_client_that_closes_early_gets_a_bad_request() -> None:
    client, server = trio.testing.memory_stream_pair()
    await client.send_all(b"GET /metr")
    await client.aclose()
    answer = await read_head(server)
    assert isinstance(answer, Response) and answer.status == 400


@pytest.mark.trio
async def test_paths_methods_and_readiness_over_a_real_socket() -> None:
    stub = Stub()
    async with endpoint(stub) as port:
        ok = await exchange(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status_of(ok) == 200 and ok.endswith(b"\r\n\r\nup 1\n")
        assert b"Connection: close" in ok and b"Content-Length: 5" in ok
        broken = await exchange(port, b"GET /metrics HTTP/1.1\r\n\r\n")
        assert status_of(broken) == 500, "a failing collector is an error answer, not a crash"
        assert status_of(await exchange(port, b"GET /metrics HTTP/1.1\r\n\r\n")) == 200
        assert status_of(await exchange(port, b"POST /metrics HTTP/1.1\r\n\r\n")) == 405
        assert status_of(await exchange(port, b"GET /other HTTP/1.1\r\n\r\n")) == 404
        assert status_of(await exchange(port, b"GET /healthz HTTP/1.1\r\n\r\n")) == 200
        not_ready = await exchange(port, b"GET /readyz HTTP/1.1\r\n\r\n")
        assert status_of(not_ready) == 503 and not_ready.endswith(b"starting\n")
        stub.reason = None
        assert status_of(await exchange(port, b"GET /readyz HTTP/1.1\r\n\r\n")) == 200
        garbage = await exchange(port, b"\x00\xff" * 100 + b"\r\n\r\n")
        assert status_of(garbage) == 400


@pytest.mark.trio
async def test_a_slow_head_is_cut_off_and_gives_way_to_a_newcomer(
    monkeypatch: pytest.MonkeyPatch, mock_clock: trio.testing.MockClock
) -> None:
    """Time stands still (the mock clock) until the test moves it, and each step waits until
    the server has handled what the sockets hold, so no load can reorder the steps."""
    monkeypatch.setattr(metrics_http, "MAX_CONNECTIONS", 1)
    async with endpoint(Stub()) as port:
        slow = await trio.open_tcp_stream("127.0.0.1", port)
        await slow.send_all(b"GET /metr")
        await trio.testing.wait_all_tasks_blocked()
        served = await exchange(port, b"GET /healthz HTTP/1.1\r\n\r\n")
        assert status_of(served) == 200, "at the cap the slow head gives way"
        assert await slow.receive_some(100) == b"", "the slow client is disconnected"
        await slow.aclose()
        alone = await trio.open_tcp_stream("127.0.0.1", port)
        await alone.send_all(b"GET /metr")
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(metrics_http.HEAD_TIMEOUT_S)
        assert await alone.receive_some(100) == b"", "a head that never ends is cut off"
        await alone.aclose()


@pytest.mark.trio
async def test_a_refused_scrape_gets_its_answer_after_sending_its_request(
    monkeypatch: pytest.MonkeyPatch, mock_clock: trio.testing.MockClock
) -> None:
    """The 503 goes out once the request head is read and the close waits for the client's
    close: a request arriving late, in pieces and with a body, is never left unread in the
    server's socket, where it would turn the close into a reset that destroys the answer."""
    monkeypatch.setattr(metrics_http, "MAX_SCRAPES", 0)
    async with endpoint(Stub()) as port:
        client = await trio.open_tcp_stream("127.0.0.1", port)
        async with client:
            await trio.testing.wait_all_tasks_blocked()
            mock_clock.jump(metrics_http.HEAD_TIMEOUT_S * 0.9)
            await client.send_all(b"GET /metrics HTTP/1.1\r\n")
            await trio.testing.wait_all_tasks_blocked()
            await client.send_all(b"Content-Length: 5000\r\n\r\n" + b"x" * 5000)
            await trio.testing.wait_all_tasks_blocked()
            mock_clock.jump(metrics_http.HEAD_TIMEOUT_S * 0.2)
            received = b""
            while chunk := await client.receive_some(65536):
                received += chunk
        assert status_of(received) == 503 and received.endswith(b"too many scrapes at once\n")
        assert status_of(await exchange(port, b"GET /healthz HTTP/1.1\r\n\r\n")) == 200


@pytest.mark.trio
async def test_healthz_answers_while_more_slow_heads_than_the_cap_keep_coming() -> None:
    """Issue 20: 40 connections holding half a request head made /healthz answer 503 for 5 s
    (a liveness probe would have killed the broker). Here more than the cap's worth of slow
    heads are held open, and reopened as soon as the endpoint drops one, while /healthz is
    polled on the real clock: every poll is answered 200 (the bound is seconds, where the
    bug answered 503 at once)."""
    slow_clients = metrics_http.MAX_CONNECTIONS + 16
    polls: list[int] = []
    heads_sent = 0
    async with endpoint(Stub()) as port, trio.open_nursery() as attackers:

        async def hold_slow_heads() -> None:
            nonlocal heads_sent
            while True:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                async with stream:
                    await stream.send_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                    heads_sent += 1
                    while await stream.receive_some(100):
                        pass  # dropped by the endpoint: open another

        for _ in range(slow_clients):
            attackers.start_soon(hold_slow_heads)
        with trio.fail_after(10):
            while heads_sent < slow_clients:
                await trio.sleep(0.01)
        await trio.sleep(0.2)  # the endpoint has accepted them
        for _ in range(20):
            with trio.fail_after(10):
                polls.append(status_of(await exchange(port, b"GET /healthz HTTP/1.1\r\n\r\n")))
            await trio.sleep(0.05)
        attackers.cancel_scope.cancel()
    assert polls == [200] * 20


@given(
    steps=st.lists(
        st.tuples(st.sampled_from(["admit", "answer", "linger", "leave"]), st.integers(0, 30)),
        max_size=80,
    ),
    limit=st.integers(1, 5),
)
def test_admission_holds_at_most_the_limit_and_evicts_slow_heads_first(
    steps: list[tuple[str, int]], limit: int
) -> None:
    admission = metrics_http.Admission(limit)
    fresh = itertools.count(100)
    for action, pick in steps:
        held = admission.held()
        if action == "admit":
            heads = admission.held(metrics_http.Phase.HEAD)
            lingering = admission.held(metrics_http.Phase.LINGER)
            newcomer = next(fresh)
            victim = admission.admit(newcomer)
            if len(held) < limit:
                assert victim is None
            elif heads:
                assert victim == heads[0], "the oldest head gives way first"
            elif lingering:
                assert victim == lingering[0]
            else:
                assert victim == newcomer, "turned away only when all are being answered"
        elif held:
            connection = held[pick % len(held)]
            if action == "leave":
                admission.left(connection)
            else:
                phase = (
                    metrics_http.Phase.ANSWER if action == "answer" else metrics_http.Phase.LINGER
                )
                admission.moved(connection, phase)
        assert len(admission.held()) <= limit


def test_histogram_buckets_are_cumulative_and_le_inclusive() -> None:
    histogram = Histogram((1, 10))
    histogram.observe(1)
    histogram.observe_many(np.array([0, 5, 10, 11]))
    assert histogram.buckets() == [("1", 2), ("10", 4), ("+Inf", 5)]
    assert histogram.total == 27


def test_a_batch_is_counted_as_its_messages_one_by_one_would_be() -> None:
    values = np.array([0, 64, 65, 300, 1024, 5000, 10**7, 2**25] * 5)
    one_by_one, batched = Histogram(SIZE_BUCKETS), Histogram(SIZE_BUCKETS)
    for value in values.tolist():
        one_by_one.observe(value)
    batched.observe_many(values)
    assert batched.buckets() == one_by_one.buckets()
    assert batched.total == one_by_one.total


def standalone_core() -> BrokerCore:
    core = BrokerCore(
        BrokerIdentity("http://b:1", "http://b:1"),
        rng=random.Random(1),
        default_policies=Policies(),
        queue_limits=QueueLimits(10, 1 << 20),
    )
    core.bootstrap(["default"])
    return core


def test_series_of_topics_the_broker_no_longer_serves_disappear() -> None:
    core = standalone_core()
    core.create_topic("/default/t", DispatchStrategy.NON_RELIABLE)
    metrics = BrokerMetrics(core, "7", "standalone")
    core.subscribe("/default/t", "c", "s", 0, ())
    metrics.nacked("/default/t", "s")
    metrics.send_failed("/default/never-served", 1, "NOT_FOUND")
    text = metrics.exposition().decode()
    assert (
        'danube_subscription_nack_total{broker="7",subscription="s",topic="/default/t"} 1.0' in text
    )
    assert 'danube_topic_messages_in_total{broker="7",topic="/default/t"} 0.0' in text
    unserved = (
        'danube_producer_send_total{broker="7",error_code="NOT_FOUND",result="error",topic=""}'
    )
    assert f"{unserved} 1.0" in text, "unserved topics share one series"
    core.delete_topic("/default/t")
    assert 'topic="/default/t"' not in metrics.exposition().decode()


def test_series_of_removed_subscriptions_disappear() -> None:
    core = standalone_core()
    core.create_topic("/default/t", DispatchStrategy.NON_RELIABLE)
    metrics = BrokerMetrics(core, "7", "standalone")
    for sub in ("kept", "gone"):
        core.subscribe("/default/t", f"c-{sub}", sub, 0, ())
        metrics.consumer_sent(("/default/t", sub), 2, 100)
        metrics.nacked("/default/t", sub)
    core.unsubscribe("/default/t", "gone")
    text = metrics.exposition().decode()
    for family in (
        "danube_consumer_messages_out_total",
        "danube_consumer_bytes_out_total",
        "danube_subscription_nack_total",
    ):
        assert f'{family}{{broker="7",subscription="kept",topic="/default/t"}}' in text
        assert f'{family}{{broker="7",subscription="gone",topic="/default/t"}}' not in text


def test_only_consumers_with_an_open_stream_count_as_active() -> None:
    core = standalone_core()
    core.create_topic("/default/t", DispatchStrategy.NON_RELIABLE)
    metrics = BrokerMetrics(core, "7", "standalone")
    attached = core.subscribe("/default/t", "a", "s", 1, ()).value
    core.subscribe("/default/t", "b", "s", 1, ())
    generation = core.open_stream(attached).value
    labels = 'broker="7",subscription="s",topic="/default/t"'
    text = metrics.exposition().decode()
    assert f"danube_subscription_active_consumers{{{labels}}} 1.0" in text
    assert 'danube_topic_active_consumers{broker="7",topic="/default/t"} 1.0' in text
    core.close_stream(attached, generation)
    text = metrics.exposition().decode()
    assert f"danube_subscription_active_consumers{{{labels}}} 0.0" in text
    assert 'danube_topic_active_consumers{broker="7",topic="/default/t"} 0.0' in text


@pytest.mark.parametrize(
    ("timeout", "status"),
    [(0, "DEADLINE_EXCEEDED"), (60, "CANCELLED"), (None, "CANCELLED")],
)
def test_a_call_cut_short_is_counted_by_whether_its_deadline_passed(
    timeout: float | None, status: str
) -> None:
    # made here, not at collection: a full run reaches this test minutes after collecting it
    deadline = None if timeout is None else Deadline.from_timeout(timeout)

    async def handler(_: object) -> None:
        raise asyncio.CancelledError

    outcomes: list[tuple[str, str, str]] = []
    counted = grpc_util._counted(
        "/danube.Svc/Call",
        grpclib.const.Handler(handler, grpclib.const.Cardinality.UNARY_UNARY, None, None),
        lambda *outcome: outcomes.append(outcome),
    )
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(counted.func(SimpleNamespace(deadline=deadline)))
    assert outcomes == [("danube.Svc", "Call", status)]


def test_schema_checks_redirects_and_imbalance_are_exported() -> None:
    core = standalone_core()
    core.create_topic("/default/t", DispatchStrategy.NON_RELIABLE)
    metrics = BrokerMetrics(core, "7", "cluster", leading=lambda: False)
    metrics.imbalance = lambda: 0.25
    metrics.schema_checked("/default/t", "warn", None)
    metrics.schema_checked("/default/t", "warn", "payload_invalid")
    metrics.redirected()
    text = metrics.exposition().decode()
    assert 'danube_schema_validation_total{broker="7",policy="warn",topic="/default/t"} 2.0' in text
    assert (
        'danube_schema_validation_failures_total{broker="7",reason="payload_invalid",'
        'topic="/default/t"} 1.0'
    ) in text
    assert 'danube_client_redirects_total{broker="7",reason="not_local"} 1.0' in text
    assert "danube_cluster_imbalance_cv" not in text, "only the leader reports it"
    metrics.leading = lambda: True
    assert 'danube_cluster_imbalance_cv{broker="7"} 0.25' in metrics.exposition().decode()
    core.delete_topic("/default/t")
    assert "/default/t" not in metrics.exposition().decode()


def _summed(
    text: str, dropped: frozenset[str]
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of our own series (`danube_*`) with the `dropped` labels removed, added up.

    The process and runtime series are left out: they move between two scrapes (CPU seconds,
    collections), so two expositions taken one after the other never agree on them."""
    totals: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("danube_"):
            continue
        for sample in family.samples:
            labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k not in dropped))
            key = (sample.name, labels)
            totals[key] = totals.get(key, 0.0) + sample.value
    return totals


def test_without_per_topic_series_every_family_is_summed_per_broker() -> None:
    """`metrics.per_topic: false`: however many topics clients create, a scrape has the same
    series, and each is the sum of what the per-topic series would say."""
    core = standalone_core()
    per_topic = BrokerMetrics(core, "7", "standalone")
    per_broker = BrokerMetrics(core, "7", "standalone", per_topic=False)
    for index in range(5):
        topic = f"/default/t{index}"
        core.create_topic(topic, DispatchStrategy.NON_RELIABLE)
        core.subscribe(topic, f"c{index}", "s", 0, ())
        for metrics in (per_topic, per_broker):
            metrics.sent(topic, 100 * index, 0.002 * index, stored=False)
            metrics.sent_batch(topic, np.array([10, 5000, 70_000]), 0.01, stored=False)
            metrics.consumer_sent((topic, "s"), 2, 300)
            metrics.nacked(topic, "s")
            metrics.schema_checked(topic, "warn", "payload_invalid")
            metrics.send_failed(topic, 1, "INVALID_ARGUMENT")
    labelled = per_topic.exposition().decode()
    summed = per_broker.exposition().decode()
    assert 'topic="/default/t4"' in labelled
    assert "topic=" not in summed and "subscription=" not in summed
    assert _summed(summed, frozenset()) == _summed(labelled, metrics_module.PER_TOPIC_LABELS)
    assert 'danube_producer_send_total{broker="7",error_code="",result="ok"} 20.0' in summed
    assert 'danube_topic_active_subscriptions{broker="7"} 5.0' in summed
    for index in range(5, 50):  # more topics: no more series
        core.create_topic(f"/default/t{index}", DispatchStrategy.NON_RELIABLE)
    assert len(per_broker.exposition().decode().splitlines()) == len(summed.splitlines())


def test_the_process_series_are_exported_beside_ours() -> None:
    """Issue 26, point 7: a dashboard or alert on the broker process needs its memory, CPU,
    open files and collections (prometheus_client's process, platform and GC collectors)."""
    text = BrokerMetrics(standalone_core(), "7", "standalone").exposition().decode()
    for series in (
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "process_open_fds",
        "python_info",
        "python_gc_collections_total",
    ):
        assert f"\n{series}" in text, series
