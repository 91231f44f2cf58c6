"""The broker process from the outside: clean shutdown on signals, metadata that survives restarts
(also after SIGKILL), and start-up failures that exit with a clear message instead of a
traceback (spec/protocol.md, "Durability of metadata").

Receive streams are opened raw (grpclib `Channel.request`): the broker sends the initial
metadata only once the stream is attached to the consumer, so a message published after
`recv_initial_metadata()` cannot be dropped for want of a consumer, and the stream's final
status is observable exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import pytest
from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.const import Status

from danube.client import DanubeClient, SubType
from danube.localcluster.broker_process import BROKER_BIN, BrokerProcess
from danube.proto import danube as pb
from danube.proto import danube_admin as admin_pb
from danube.testing import free_port
from tests.support.aio import run
from tests.support.wire import ReceiveStream, channel_to, receive_stream

pytestmark = pytest.mark.slow

UNCLEAN_STDERR = ("Traceback", "Task was destroyed", "never awaited", "unclosed")
"""What a clean shutdown must never print (asyncio/trio leaks and ResourceWarnings included:
BrokerProcess runs the broker with PYTHONWARNINGS=default)."""

STOP_WITHIN_S = 5.0
"""The broker's grace period for open streams is 2 s; a clean stop takes well under that."""


def _assert_clean(text: str) -> None:
    """No traceback, leaked task, unawaited coroutine or unclosed resource on stderr."""
    found = [marker for marker in UNCLEAN_STDERR if marker in text]
    assert not found, f"stderr shows {found}:\n{text}"


async def _next_payload(stream: ReceiveStream) -> bytes:
    message = await asyncio.wait_for(stream.recv_message(), 5)
    assert message is not None, "the stream ended instead of delivering"
    return message.payload


async def _drain(stream: ReceiveStream) -> list[bytes]:
    """Reads to the end of the stream and its trailers; raises unless the status is OK."""
    payloads = []
    while (message := await stream.recv_message()) is not None:
        payloads.append(message.payload)
    await stream.recv_trailing_metadata()
    return payloads


async def _send(channel: Channel, producer_id: int, topic: str, payload: bytes) -> None:
    msg_id = pb.MsgId(producer_id=producer_id, topic_name=topic)
    response = await pb.ProducerServiceStub(channel).send_message(
        pb.StreamMessage(request_id=7, msg_id=msg_id, payload=payload, producer_name="p")
    )
    assert response.request_id == 7


async def _create_producer(channel: Channel, topic: str, name: str = "p") -> int:
    response = await pb.ProducerServiceStub(channel).create_producer(
        pb.ProducerRequest(request_id=1, producer_name=name, topic_name=topic)
    )
    return response.producer_id


async def _subscribe(channel: Channel, topic: str, name: str, subscription: str) -> int:
    response = await pb.ConsumerServiceStub(channel).subscribe(
        pb.ConsumerRequest(
            request_id=1,
            topic_name=topic,
            consumer_name=name,
            subscription=subscription,
            subscription_type=pb.ConsumerRequestSubscriptionType.Exclusive,
        )
    )
    return response.consumer_id


@asynccontextmanager
async def _stuck_stream(broker: BrokerProcess, topic: str) -> AsyncIterator[int]:
    """A consumer (own connection) whose receive stream is open but never read; yields its
    id. Its messages pile up in HTTP/2 flow control and then in the broker's queue."""
    async with channel_to(broker.broker_addr) as channel:
        await _create_producer(channel, topic, "stuck-creator")
        consumer_id = await _subscribe(channel, topic, "stuck", "stuck-sub")
        async with receive_stream(channel, consumer_id):
            yield consumer_id


# -- signals ----------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_stops_broker_cleanly_with_open_stream(
    broker_factory: type[BrokerProcess], tmp_path: Path, sig: signal.Signals
) -> None:
    """systemd/Kubernetes (SIGTERM) and Ctrl-C (SIGINT) must both end open receive streams with
    UNAVAILABLE "shutting down" (status OK would tell a client its session was taken over or its
    topic deleted; UNAVAILABLE says reconnect), exit 0 promptly, and leave no leaked tasks or
    resources behind."""
    broker = broker_factory(tmp_path / "data").start()
    topic = "/default/shutdown"

    async def scenario() -> float:
        async with channel_to(broker.broker_addr) as channel:
            producer_id = await _create_producer(channel, topic)
            consumer_id = await _subscribe(channel, topic, "c", "s")
            async with receive_stream(channel, consumer_id) as stream:
                await _send(channel, producer_id, topic, b"before-shutdown")
                assert await _next_payload(stream) == b"before-shutdown"
                # Read on while the broker stops: the end of the stream must be seen while
                # the connection is still up (grpclib fails a stream whose trailers were not
                # consumed before the connection went away).
                rest = asyncio.create_task(_drain(stream))
                started = time.monotonic()
                code = await asyncio.to_thread(broker.stop, sig)
                elapsed = time.monotonic() - started
                assert code == 0, broker.log_text()
                # A proper gRPC status, not a broken connection (StreamTerminatedError).
                with pytest.raises(GRPCError) as ended:
                    await asyncio.wait_for(rest, 5)
                assert ended.value.status is Status.UNAVAILABLE
                assert "shutting down" in (ended.value.message or "")
            return elapsed

    elapsed = run(scenario)
    assert elapsed < STOP_WITHIN_S, f"stopping took {elapsed:.1f} s"
    broker.wait_for_log("event=broker_stopped", timeout=1)
    _assert_clean(broker.log_text())


def test_second_sigint_during_shutdown_is_harmless(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    """An impatient operator presses Ctrl-C again while the broker drains: the second signal
    is logged and ignored, the orderly shutdown (grace period for streams, metadata flush)
    completes, and the exit code is still 0.

    A consumer that never reads keeps its stream writer blocked on HTTP/2 flow control, so the
    broker spends its grace period waiting and the second signal surely lands mid-shutdown."""
    broker = broker_factory(tmp_path / "data").start()
    assert broker.process is not None
    topic = "/default/twice"

    async def scenario() -> float:
        async with (
            channel_to(broker.broker_addr) as channel,
            _stuck_stream(broker, topic),
        ):
            producer_id = await _create_producer(channel, topic)
            for _ in range(100):  # 6.4 MiB: more than the stuck client's 4 MiB window
                await _send(channel, producer_id, topic, b"x" * 65536)
            started = time.monotonic()
            broker.process.send_signal(signal.SIGINT)  # type: ignore[union-attr]
            await asyncio.to_thread(broker.wait_for_log, "event=broker_stopping", 5)
            broker.process.send_signal(signal.SIGINT)  # type: ignore[union-attr]
            code = await asyncio.to_thread(broker.process.wait, 15)  # type: ignore[union-attr]
            assert code == 0, broker.log_text()
            return time.monotonic() - started

    elapsed = run(scenario)
    assert elapsed < STOP_WITHIN_S, f"stopping took {elapsed:.1f} s"
    broker.wait_for_log("event=signal_ignored signal=SIGINT reason=already_stopping", 2)
    broker.wait_for_log("event=broker_stopped", 2)
    _assert_clean(broker.log_text())


def test_repeated_sigint_until_exit_is_harmless(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    """Ctrl-C held down (or pressed repeatedly) until the process is gone: every signal after
    the first must be harmless, including those that land after the broker stopped serving.
    Three runs, since whether a signal lands in a given millisecond depends on scheduling."""
    codes = []
    for attempt in range(3):
        broker = broker_factory(tmp_path / f"data-{attempt}").start()
        process = broker.process
        assert process is not None
        process.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 10
        while process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.001)
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGINT)
        codes.append(process.wait(5))
        broker.kill()
    assert codes == [0, 0, 0]


def test_shutdown_closes_client_connections(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    """Clients are normally connected when a broker stops; an orderly shutdown closes their
    connections instead of leaking the sockets until the interpreter tears down (grpclib alone
    leaves them open: 'ResourceWarning: unclosed transport')."""
    broker = broker_factory(tmp_path / "data").start()

    async def stop_with_idle_client() -> int:
        async with channel_to(broker.broker_addr) as channel:
            await pb.DiscoveryStub(channel).topic_partitions(pb.TopicLookupRequest(topic="/d/x"))
            return await asyncio.to_thread(broker.stop, signal.SIGTERM)

    assert run(stop_with_idle_client) == 0
    _assert_clean(broker.log_text())


# -- restarts ---------------------------------------------------------------------------------


def test_metadata_and_ids_survive_a_restart(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    """After a restart namespaces, topics (plain and partitioned) and subscriptions are back,
    and an official client that keeps its old producer id / consumer id continues without
    noticing (Danube forgets the ids)."""
    broker = broker_factory(tmp_path / "data").start()
    namespace = "lifecycle"
    plain = f"/{namespace}/plain"
    base = f"/{namespace}/parted"
    partitions = [f"{base}-part-{i}" for i in range(3)]

    async def before() -> tuple[int, int]:
        async with channel_to(broker.admin_addr) as admin:
            await admin_pb.NamespaceAdminStub(admin).create_namespace(
                admin_pb.NamespaceRequest(name=namespace)
            )
        async with DanubeClient(broker.url) as client:
            await client.producer(base, "parted-producer", partitions=3).create()
        async with channel_to(broker.broker_addr) as channel:
            producer_id = await _create_producer(channel, plain)
            consumer_id = await _subscribe(channel, plain, "c", "plain-sub")
            await _subscribe(channel, partitions[1], "c", "part-sub")
        return producer_id, consumer_id

    producer_id, consumer_id = run(before)
    assert broker.stop(signal.SIGTERM) == 0
    broker.start()

    async def after() -> None:
        async with DanubeClient(broker.url) as client:
            assert await client.partitions(plain) == [plain]
            assert await client.partitions(base) == partitions
            assert await client.lookup(plain) == broker.url
            for partition in partitions:
                assert await client.lookup(partition) == broker.url
        async with channel_to(broker.admin_addr) as admin:
            listed = await admin_pb.BrokerAdminStub(admin).list_namespaces(admin_pb.Empty())
            assert namespace in listed.namespaces
            topics = await admin_pb.NamespaceAdminStub(admin).get_namespace_topics(
                admin_pb.NamespaceRequest(name=namespace)
            )
            assert sorted(topics.topics) == sorted([plain, *partitions])
            topic_admin = admin_pb.TopicAdminStub(admin)
            subs = await topic_admin.list_subscriptions(admin_pb.TopicRequest(name=plain))
            assert subs.subscriptions == ["plain-sub"]
            subs = await topic_admin.list_subscriptions(admin_pb.TopicRequest(name=partitions[1]))
            assert subs.subscriptions == ["part-sub"]
        async with (
            channel_to(broker.broker_addr) as channel,
            receive_stream(channel, consumer_id) as stream,
        ):
            await _send(channel, producer_id, plain, b"after-restart")
            assert await _next_payload(stream) == b"after-restart"

    run(after)
    assert broker.stop(signal.SIGTERM) == 0
    _assert_clean(broker.log_text())


def test_client_consumer_continues_across_a_clean_restart(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    """The point of keeping consumer ids across restarts: a client consumer just reopens its
    stream and keeps receiving, with no error surfacing to the application.

    A second consumer that never reads holds the broker in its shutdown grace period (as any
    slow client can), so the client's health check after its stream ended is answered by the
    stopping broker rather than racing the closing of the port."""
    broker = broker_factory(tmp_path / "data").start()
    topic = "/default/client-restart"
    stuck_topic = "/default/client-restart-stuck"

    async def scenario() -> list[bytes]:
        async with (
            DanubeClient(broker.url) as client,
            channel_to(broker.broker_addr) as channel,
            _stuck_stream(broker, stuck_topic),
        ):
            stuck_producer = await _create_producer(channel, stuck_topic)
            for _ in range(100):  # 6.4 MiB: more than the stuck client's 4 MiB window
                await _send(channel, stuck_producer, stuck_topic, b"x" * 65536)
            producer = await client.producer(topic, "p").create()
            consumer = client.consumer(topic, "c", "s", sub_type=SubType.EXCLUSIVE)
            await consumer.subscribe()
            await producer.send(b"before")
            first = await asyncio.wait_for(consumer.receive(), 5)
            assert await asyncio.to_thread(broker.stop, signal.SIGTERM) == 0
            await asyncio.to_thread(broker.start)
            await asyncio.sleep(1.5)  # the client's reconnect backoff
            await producer.send(b"after")
            second = await asyncio.wait_for(consumer.receive(), 5)
            return [first.payload, second.payload]

    assert run(scenario) == [b"before", b"after"]


def test_sigkill_keeps_everything_that_was_acknowledged(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    """A reply is only sent once its metadata is fsync'ed: topics, producers and subscriptions
    whose creation was answered survive a SIGKILL right after the last answer."""
    broker = broker_factory(tmp_path / "data").start()
    topics = [f"/default/crash-{i}" for i in range(150)]

    async def create_then_kill() -> tuple[dict[str, int], dict[str, int]]:
        async with channel_to(broker.broker_addr) as channel:
            producer_ids = await asyncio.gather(*(_create_producer(channel, t) for t in topics))
            consumer_ids = await asyncio.gather(
                *(_subscribe(channel, t, "c", "crash-sub") for t in topics[::10])
            )
            assert broker.process is not None
            broker.process.kill()  # immediately after the last answer
        return dict(zip(topics, producer_ids, strict=True)), dict(
            zip(topics[::10], consumer_ids, strict=True)
        )

    producers, consumers = run(create_then_kill)
    broker.kill()
    broker.start()

    async def check() -> None:
        async with channel_to(broker.admin_addr) as admin:
            listed = await admin_pb.NamespaceAdminStub(admin).get_namespace_topics(
                admin_pb.NamespaceRequest(name="default")
            )
            missing = sorted(set(topics) - set(listed.topics))
            assert not missing, f"{len(missing)} acknowledged topics lost: {missing[:5]}"
            topic_admin = admin_pb.TopicAdminStub(admin)
            for topic in consumers:
                subs = await topic_admin.list_subscriptions(admin_pb.TopicRequest(name=topic))
                assert subs.subscriptions == ["crash-sub"], topic
        async with channel_to(broker.broker_addr) as channel:
            health = pb.HealthCheckStub(channel)
            for topic, producer_id in producers.items():
                response = await health.health_check(
                    pb.HealthCheckRequest(client=pb.HealthCheckRequestClientType.Producer,
                                          id=producer_id)
                )  # fmt: skip
                assert response.status == pb.HealthCheckResponseClientStatus.OK, topic
            topic, producer_id = topics[-1], producers[topics[-1]]
            await _send(channel, producer_id, topic, b"after-crash")

    run(check)


# -- start-up failures ------------------------------------------------------------------------


def _run_broker(*args: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BROKER_BIN), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def _fresh_ports(**taken: int) -> list[str]:
    """`--broker-addr`/`--admin-addr` on free ports, or on the given (taken) ones."""
    args = []
    for flag in ("--broker-addr", "--admin-addr"):
        args += [flag, f"127.0.0.1:{taken.get(flag, free_port())}"]
    return args


@contextmanager
def _listening_socket() -> Iterator[int]:
    """Occupies a loopback port (listening, as another server would) for the block."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


async def _partitions(url: str, topic: str) -> list[str]:
    async with DanubeClient(url) as client:
        return await client.partitions(topic)


def _assert_one_line_error(result: subprocess.CompletedProcess[str], needle: str) -> None:
    assert result.returncode == 1, result.stderr
    lines = [line for line in result.stderr.splitlines() if "level=" not in line]
    assert len(lines) == 1 and lines[0].startswith("danube-broker: "), result.stderr
    assert needle in lines[0]
    _assert_clean(result.stderr)


def test_second_broker_on_same_data_dir_exits_1(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    """Two brokers writing one metadata log would corrupt it; the second must refuse to start
    and say which directory is taken, and the first must not notice."""
    data_dir = tmp_path / "shared-data"
    first = broker_factory(data_dir).start()
    result = _run_broker(*_fresh_ports(), "--data-dir", str(data_dir))
    assert result.returncode == 1, result.stderr
    assert "another broker" in result.stderr and str(data_dir) in result.stderr
    assert first.process is not None and first.process.poll() is None
    assert run(lambda: _partitions(first.url, "/default/none")) == []


def test_second_broker_on_same_data_dir_says_so_in_one_line(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    """The refusal is for an operator: one `danube-broker: ...` line, not a traceback."""
    data_dir = tmp_path / "shared-data"
    broker_factory(data_dir).start()
    result = _run_broker(*_fresh_ports(), "--data-dir", str(data_dir))
    _assert_one_line_error(result, "another broker")


@pytest.mark.parametrize("which", ["--broker-addr", "--admin-addr"])
def test_port_in_use_exits_1_naming_the_address(tmp_path: Path, which: str) -> None:
    """A port conflict is an operator error: exit 1 and name the address that is taken."""
    with _listening_socket() as port:
        result = _run_broker(*_fresh_ports(**{which: port}), "--data-dir", str(tmp_path / "d"))
    assert result.returncode == 1, result.stderr
    assert f"127.0.0.1:{port}" in result.stderr
    assert "in use" in result.stderr.lower()


def test_port_in_use_says_so_in_one_line(tmp_path: Path) -> None:
    with _listening_socket() as port:
        result = _run_broker(
            *_fresh_ports(**{"--broker-addr": port}), "--data-dir", str(tmp_path / "d")
        )
    _assert_one_line_error(result, f"cannot listen on 127.0.0.1:{port}")


@pytest.mark.parametrize(
    ("yaml_text", "key"),
    [
        ("policies:\n  max_mesage_size: 10\n", "max_mesage_size"),
        ("brokr:\n  host: 127.0.0.1\n", "brokr"),
        ("dispatch:\n  consumer_queue_msgs: 5\n", "consumer_queue_msgs"),
    ],
    ids=["policies", "top-level", "dispatch"],
)
def test_unknown_config_key_exits_2_naming_it(tmp_path: Path, yaml_text: str, key: str) -> None:
    """A misspelt key silently ignored is a production incident; refuse it by name."""
    config = tmp_path / "broker.yaml"
    config.write_text(yaml_text)
    result = _run_broker("--config-file", str(config), "--data-dir", str(tmp_path / "data"))
    assert result.returncode == 2, result.stderr
    assert key in result.stderr
    assert "configuration error" in result.stderr
    _assert_clean(result.stderr)


def test_invalid_yaml_exits_2(tmp_path: Path) -> None:
    config = tmp_path / "broker.yaml"
    config.write_text("policies: [open\n  : :\n")
    result = _run_broker("--config-file", str(config), "--data-dir", str(tmp_path / "data"))
    assert result.returncode == 2, result.stderr
    assert str(config) in result.stderr and "YAML" in result.stderr
    _assert_clean(result.stderr)


def test_help_lists_the_main_flags() -> None:
    result = _run_broker("--help")
    assert result.returncode == 0, result.stderr
    for flag in ("--broker-addr", "--data-dir", "--config-file"):
        assert flag in result.stdout
