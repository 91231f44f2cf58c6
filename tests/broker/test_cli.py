"""`danube-cli produce` and `consume` as a user runs them: real subprocesses against the shared
broker. What matters here is what a person sees: exit codes, the messages printed, and one
readable error line (never a traceback) when something is wrong.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from danube.client import DanubeClient
from danube.localcluster.broker_process import BrokerProcess
from tests.support.aio import run, unique_topic

pytestmark = pytest.mark.slow

CLI_BIN = Path(sys.executable).parent / "danube-cli"
SUBSCRIBED = "subscribed to "
"""The consumer's stderr line once it has subscribed (messages published after it are kept
for the consumer even before its receive stream is open)."""


class Consumer:
    """A `danube-cli consume` subprocess whose stderr is collected by a reader thread."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            [str(CLI_BIN), "consume", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        self.stderr_lines: list[str] = []
        self._subscribed = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.stderr_lines.append(line)
            if line.startswith(SUBSCRIBED):
                self._subscribed.set()

    def wait_subscribed(self, timeout: float = 15) -> None:
        if not self._subscribed.wait(timeout):
            self.process.kill()
            raise AssertionError(f"consumer did not subscribe: {''.join(self.stderr_lines)}")

    def finish(self, timeout: float = 15) -> tuple[int, str, str]:
        """Exit code, stdout and stderr once the process has ended by itself."""
        try:
            stdout, _ = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise
        self._reader.join(5)
        return self.process.returncode, stdout, "".join(self.stderr_lines)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(5)


def _cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CLI_BIN), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def _create_topic(broker: BrokerProcess, topic: str) -> None:
    async def create() -> None:
        async with DanubeClient(broker.url) as client:
            await client.producer(topic, "creator").create()

    run(create)


def _assert_one_error_line(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Exit code non-zero, and stderr is exactly one `danube-cli: error: ...` line."""
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("danube-cli: error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# -- happy paths ------------------------------------------------------------------------------


def test_consume_count_exits_after_the_messages_of_produce_count(broker: BrokerProcess) -> None:
    """The shell workflow: a consumer waits, a producer sends N, the consumer prints N and exits
    0 by itself; the producer reports its progress on stderr and the payloads go to stdout."""
    topic = unique_topic("cli")
    _create_topic(broker, topic)
    consumer = Consumer("-s", broker.url, "-t", topic, "-m", "cli-sub", "-c", "5")
    try:
        consumer.wait_subscribed()
        produced = _cli("produce", "-s", broker.url, "-t", topic, "-m", "hello-cli", "-c", "5")
        assert produced.returncode == 0, produced.stderr
        assert "sent 5/5 messages" in produced.stderr
        assert "Traceback" not in produced.stderr
        code, stdout, stderr = consumer.finish()
    finally:
        consumer.kill()
    assert code == 0, stderr
    lines = stdout.strip().splitlines()
    assert len(lines) == 5, stdout
    assert all(line.endswith("] hello-cli") and topic in line for line in lines), stdout
    assert "received 5/5 messages" in stderr


def test_reliable_produce_then_consume_from_earliest(broker: BrokerProcess) -> None:
    """`produce --reliable` stores messages nobody is subscribed to yet; a consumer that
    starts at the earliest offset gets every one, in order, and exits after its count."""
    topic = unique_topic("cli-reliable")
    produced = _cli(
        "produce", "-s", broker.url, "-t", topic, "--reliable", "-m", "kept", "-c", "20"
    )
    assert produced.returncode == 0, produced.stderr
    assert "sent 20/20 messages" in produced.stderr
    consumed = _cli(
        "consume", "-s", broker.url, "-t", topic, "-m", "audit", "--start", "earliest",
        "-c", "20",
    )  # fmt: skip
    assert consumed.returncode == 0, consumed.stderr
    lines = consumed.stdout.strip().splitlines()
    assert len(lines) == 20 and all(line.endswith("] kept") for line in lines), consumed.stdout
    again = _cli("produce", "-s", broker.url, "-t", topic, "-m", "x")
    _assert_one_error_line(again, "Reliable", "NonReliable")


def test_consume_starts_at_a_given_offset(broker: BrokerProcess) -> None:
    """`--start N` on a reliable topic: the new subscription's first message is offset N, and
    an offset past the end is refused with one readable line."""
    topic = unique_topic("cli-offset")
    produced = _cli(
        "produce", "-s", broker.url, "-t", topic, "--reliable", "-m", "m", "-c", "10"
    )  # fmt: skip
    assert produced.returncode == 0, produced.stderr
    consumed = _cli(
        "consume", "-s", broker.url, "-t", topic, "-m", "from-7", "--start", "7", "-c", "3",
    )  # fmt: skip
    assert consumed.returncode == 0, consumed.stderr
    offsets = re.findall(r" offset=(\d+)\]", consumed.stdout)
    assert offsets == ["7", "8", "9"], consumed.stdout
    beyond = _cli(
        "consume", "-s", broker.url, "-t", topic, "-m", "from-99", "--start", "99", "-c", "1"
    )  # fmt: skip
    _assert_one_error_line(beyond, "99")


@pytest.mark.parametrize("sub_type", ["exclusive", "shared", "fail-over", "key-shared"])
def test_every_subscription_type_is_accepted_and_receives(
    broker: BrokerProcess, sub_type: str
) -> None:
    """Danube's spellings of the four types, each as the only consumer of its subscription:
    it receives the message; attributes given as `k1:v1,k2:v2` come out as a mapping."""
    topic = unique_topic(f"cli-{sub_type}")
    _create_topic(broker, topic)
    consumer = Consumer(
        "-s", broker.url, "-t", topic, "-m", f"sub-{sub_type}", "--sub-type", sub_type,
        "-c", "1",
    )  # fmt: skip
    try:
        consumer.wait_subscribed()
        assert f"({sub_type})" in "".join(consumer.stderr_lines)
        produced = _cli(
            "produce", "-s", broker.url, "-t", topic, "-m", "typed", "-a", "k1:v1,k2:v2"
        )
        assert produced.returncode == 0, produced.stderr
        code, stdout, stderr = consumer.finish()
    finally:
        consumer.kill()
    assert code == 0, stderr
    assert stdout.strip().endswith("] typed"), stdout
    assert "attributes={'k1': 'v1', 'k2': 'v2'}" in stdout


# -- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize("attributes", ["k1v1", "k1:v1,broken", ":v"])
def test_bad_attribute_string_is_one_error_line(broker: BrokerProcess, attributes: str) -> None:
    result = _cli("produce", "-s", broker.url, "-t", unique_topic(), "-m", "x", "-a", attributes)
    _assert_one_error_line(result, "invalid attribute", "key:value")


def test_missing_payload_is_one_error_line(broker: BrokerProcess) -> None:
    result = _cli("produce", "-s", broker.url, "-t", unique_topic())
    _assert_one_error_line(result, "-m/--message", "-f/--file")


@pytest.mark.parametrize(
    "args",
    [("produce", "-m", "x"), ("consume", "-m", "sub")],
    ids=["produce", "consume"],
)
def test_unreachable_broker_is_one_error_line(args: tuple[str, ...]) -> None:
    """Port 1 on loopback refuses connections: after its retries the CLI says which address it
    could not reach."""
    started = time.monotonic()
    result = _cli(args[0], "-s", "http://127.0.0.1:1", "-t", "/default/t", *args[1:])
    _assert_one_error_line(result, "127.0.0.1:1")
    assert time.monotonic() - started < 20


def test_malformed_service_address_is_one_error_line() -> None:
    result = _cli("produce", "-s", "not-a-url", "-t", "/default/t", "-m", "x")
    _assert_one_error_line(result, "not-a-url", "http://host:port")


def test_consuming_a_missing_topic_is_one_error_line(broker: BrokerProcess) -> None:
    """Consumers never create topics; the user learns that instead of waiting forever."""
    topic = unique_topic("missing")
    result = _cli("consume", "-s", broker.url, "-t", topic, "-m", "sub")
    _assert_one_error_line(result, topic, "does not exist")


def test_sigint_stops_a_waiting_consumer_with_130(broker: BrokerProcess) -> None:
    """Ctrl-C is how a waiting consumer is normally stopped: the shell convention 128+SIGINT,
    and no KeyboardInterrupt traceback."""
    topic = unique_topic("cli-sigint")
    _create_topic(broker, topic)
    consumer = Consumer("-s", broker.url, "-t", topic, "-m", "sigint-sub")
    try:
        consumer.wait_subscribed()
        time.sleep(0.2)  # let it reach its receive loop
        consumer.process.send_signal(signal.SIGINT)
        code, stdout, stderr = consumer.finish(timeout=10)
    finally:
        consumer.kill()
    assert code == 130, stderr
    assert stdout == ""
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr


@pytest.mark.parametrize("command", ["produce", "consume"])
def test_subcommand_help_exits_0(command: str) -> None:
    result = _cli(command, "--help")
    assert result.returncode == 0, result.stderr
    assert f"usage: danube-cli {command}" in result.stdout
    for flag in ("--service-addr", "--topic"):
        assert flag in result.stdout
