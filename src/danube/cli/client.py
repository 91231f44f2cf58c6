"""`danube-cli`: produce, consume (Danube's flags), drive load for an audit, and manage
schemas from the command line."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from grpclib.const import Status

from danube.cli.schema import TYPES, add_schema_commands
from danube.cli.schema_payloads import PayloadError, SchemaPayloads, render_bytes
from danube.cli.usage import (
    CLIENT_ENV_PREFIX,
    UsageError,
    add_service_addr,
    read_input,
    security_of,
)
from danube.client import (
    DanubeClient,
    DanubeClientError,
    DispatchStrategy,
    Message,
    SchemaRef,
    SubType,
    WriterSchema,
)
from danube.client.schemas import SchemaRegistry

DEFAULT_TOPIC = "/default/test_topic"
PROGRESS_SECONDS = 1.0


def _attributes(text: str | None) -> dict[str, str]:
    if not text:
        return {}
    pairs = {}
    for item in text.split(","):
        key, sep, value = item.partition(":")
        if not sep or not key.strip():
            raise UsageError(f"invalid attribute {item!r}: expected key:value[,key:value...]")
        pairs[key.strip()] = value.strip()
    return pairs


class Progress:
    """A single status line on stderr, rewritten at most once a second, so long runs show
    they are alive without flooding the terminal or a log."""

    def __init__(self, verb: str, total: int | None) -> None:
        self._verb = verb
        self._total = total
        self._started = time.monotonic()
        self._last = self._started
        self.count = 0

    def tick(self) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self._last >= PROGRESS_SECONDS:
            self._last = now
            self._print(now, end="\r")

    def finish(self) -> None:
        self._print(time.monotonic(), end="\n")

    def _print(self, now: float, end: str) -> None:
        elapsed = max(now - self._started, 1e-9)
        of = f"/{self._total}" if self._total else ""
        print(
            f"{self._verb} {self.count}{of} messages in {elapsed:.1f} s "
            f"({self.count / elapsed:.0f} msg/s)",
            file=sys.stderr,
            end=end,
            flush=True,
        )


def subject_for_topic(topic: str) -> str:
    """Danube's CLI's subject for a schema given with the payload: `/default/orders` is
    `default-orders`."""
    return topic.lstrip("/").replace("/", "-")


async def _schema_ref(
    args: argparse.Namespace, registry: SchemaRegistry, payload: bytes
) -> SchemaRef | None:
    """The schema the producer writes with, registering `--schema-file` first (once the
    payload is known to fit it, so a typo in the payload registers nothing); a schema file
    pins the version it registered as (or already was), so an older definition is written as
    that older version."""
    if args.schema_file is not None:
        if args.schema_version is not None or args.schema_min_version is not None:
            raise UsageError("--schema-file registers the version it writes with; drop "
                             "--schema-version and --schema-min-version")  # fmt: skip
        if args.schema_type is None:
            raise UsageError("--schema-file needs --schema-type")
        definition = read_input(args.schema_file)
        subject = args.schema_subject or subject_for_topic(args.topic)
        try:
            local = WriterSchema(subject, 0, 0, args.schema_type, definition)
            SchemaPayloads.of(local).encode(payload)
        except PayloadError as error:
            raise UsageError(f"{error}; nothing was registered or sent") from None
        answer = await registry.register(
            subject, args.schema_type, definition, created_by="danube-cli"
        )
        state = "registered" if answer.is_new_version else "found"
        print(f"schema {subject}: {state} version {answer.version}", file=sys.stderr)
        return SchemaRef(subject, pinned=answer.version)
    if args.schema_type is not None:
        raise UsageError("--schema-type goes with --schema-file")
    if args.schema_subject is None:
        if args.schema_version is not None or args.schema_min_version is not None:
            raise UsageError("--schema-version and --schema-min-version need --schema-subject")
        return None
    return SchemaRef(args.schema_subject, args.schema_version, args.schema_min_version)


async def produce(args: argparse.Namespace) -> int:
    if args.file is not None:
        payload = read_input(args.file)
    elif args.message is not None:
        payload = args.message.encode()
    else:
        raise UsageError("give the payload with -m/--message or -f/--file")
    if args.count < 1:
        raise UsageError("-c/--count must be at least 1")
    attributes = _attributes(args.attributes)
    strategy = DispatchStrategy.RELIABLE if args.reliable else DispatchStrategy.NON_RELIABLE
    progress = Progress("sent", args.count)
    async with DanubeClient(
        args.service_addr, security=security_of(args, CLIENT_ENV_PREFIX)
    ) as client:
        producer = client.producer(
            args.topic,
            args.producer_name,
            partitions=args.partitions,
            dispatch=strategy,
            schema=await _schema_ref(args, client.schemas, payload),
        )
        schema = await producer.resolve_schema()
        if schema is not None:
            try:
                payload = SchemaPayloads.of(schema).encode(payload)
            except PayloadError as error:
                raise UsageError(f"{error}; nothing was sent") from None
        await producer.create()
        try:
            for _ in range(args.count):
                await producer.send(payload, key=args.key, attributes=attributes)
                progress.tick()
                if args.interval:
                    await asyncio.sleep(args.interval / 1000)
        finally:
            progress.finish()
    return 0


class MessageRenderer:
    """Prints messages; one written with a schema is decoded (Avro) and checked against the
    version it names, fetched once per version, and one that does not fit says why."""

    def __init__(self, registry: SchemaRegistry) -> None:
        self._registry = registry
        self._schemas: dict[tuple[int, int | None], SchemaPayloads | str] = {}
        """Codecs, and answers that cannot change (no such schema, one that does not parse
        here); a registry that could not answer is asked again at the next message."""

    async def _schema(self, schema_id: int, version: int | None) -> SchemaPayloads | str:
        """The schema's codec, or why there is none."""
        key = (schema_id, version)
        if key in self._schemas:
            return self._schemas[key]
        named = f"schema id {schema_id} {'latest' if version is None else f'v{version}'}"
        try:
            answer = await self._registry.get(schema_id, version)
            self._schemas[key] = SchemaPayloads.of(WriterSchema.of(answer))
        except PayloadError as error:
            self._schemas[key] = f"{named}: {error}"
        except DanubeClientError as error:
            if error.status is not Status.NOT_FOUND:
                return f"{named}: {error}"
            self._schemas[key] = f"{named}: {error}"
        return self._schemas[key]

    async def render(self, message: Message) -> str:
        attributes = f" attributes={dict(message.attributes)}" if message.attributes else ""
        key = f" key={message.routing_key}" if message.routing_key else ""
        head = f"{message.topic} offset={message.offset}{key}{attributes}"
        if message.schema_id is None:
            return f"[{head}] {render_bytes(message.payload)}"
        schema = await self._schema(message.schema_id, message.schema_version)
        if isinstance(schema, str):
            return f"[{head} schema unknown: {schema}] {render_bytes(message.payload)}"
        try:
            body = schema.render(message.payload)
        except PayloadError as error:
            return f"[{head} INVALID: {error}] {render_bytes(message.payload)}"
        return f"[{head} schema={schema.name}] {body}"


async def consume(args: argparse.Namespace) -> int:
    if args.count is not None and args.count < 1:
        raise UsageError("-c/--count must be at least 1")
    progress = Progress("received", args.count)
    async with DanubeClient(
        args.service_addr, security=security_of(args, CLIENT_ENV_PREFIX)
    ) as client:
        consumer = client.consumer(
            args.topic,
            args.consumer,
            args.subscription,
            sub_type=SubType.named(args.sub_type),
            key_filters=tuple(args.key_filter or ()),
            start=args.start,
        )
        async with consumer:
            print(
                f"subscribed to {args.topic} as {args.consumer} in {args.subscription} "
                f"({args.sub_type}); waiting for messages, Ctrl-C to stop",
                file=sys.stderr,
                flush=True,
            )
            renderer = MessageRenderer(client.schemas)
            try:
                async for message in consumer:
                    await consumer.ack(message)
                    if args.quiet:
                        progress.tick()
                    else:
                        progress.count += 1
                        print(await renderer.render(message), flush=True)
                    if args.count is not None and progress.count >= args.count:
                        break
            finally:
                progress.finish()
    return 0


async def load(args: argparse.Namespace) -> int:
    try:
        from danube.audit.load import (
            LoadPlan,
            LoadRun,
            say_on_stderr,
            subscription_types,
            summary,
        )
    except ImportError as error:
        raise UsageError(
            f"danube-cli load writes Parquet logs and needs the audit extra "
            f"(pip install 'pydanube[audit]'): {error}"
        ) from None
    plan = LoadPlan(
        service_url=args.service_addr,
        logs=args.logs,
        topic_prefix=args.topic_prefix,
        topics=args.topics,
        partitions=args.partitions,
        producers=args.producers,
        messages=args.messages,
        rate=args.rate,
        payload_bytes=args.payload_bytes,
        keys=args.keys,
        subscriptions=subscription_types(args.subscriptions),
        consumers=args.consumers,
        reliable=not args.non_reliable,
        drain_s=args.drain,
    )
    problems = plan.problems()
    if problems:
        raise UsageError("; ".join(problems))
    result = await LoadRun(plan, say_on_stderr).run()
    print(summary(plan, result), flush=True)
    return 1 if result.failures or any(result.missing.values()) else 0


def _sub_type(text: str) -> str:
    try:
        SubType.named(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def _start_position(text: str) -> str | int:
    if text in ("latest", "earliest"):
        return text
    if text.isdigit():
        return int(text)
    raise argparse.ArgumentTypeError("expected latest, earliest or an offset (a number)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="danube-cli",
        description="Produce to and consume from a Danube broker, drive load for an audit, "
        "and manage schemas.",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    def common(sub: argparse.ArgumentParser) -> None:
        add_service_addr(sub)
        sub.add_argument(
            "-t", "--topic", default=DEFAULT_TOPIC, help=f"topic (default {DEFAULT_TOPIC})"
        )

    prod = commands.add_parser("produce", help="send messages")
    common(prod)
    prod.add_argument("-n", "--producer-name", default="test_producer")
    prod.add_argument("-m", "--message", help="payload text")
    prod.add_argument("-f", "--file", type=Path, help="payload from a file (wins over -m)")
    prod.add_argument("-a", "--attributes", help='attributes as "k1:v1,k2:v2"')
    prod.add_argument("-k", "--key", help="routing key (Key-Shared routing, partition choice)")
    prod.add_argument(
        "-p", "--partitions", type=int, default=0, help="number of partitions (0: none)"
    )
    prod.add_argument("-c", "--count", type=int, default=1, help="messages to send (default 1)")
    prod.add_argument(
        "-i", "--interval", type=int, default=0, help="milliseconds between sends (default 0)"
    )
    prod.add_argument("--reliable", action="store_true", help="reliable (persistent) topic")
    prod.add_argument(
        "--schema-subject",
        help="write with this subject's schema (latest version unless pinned); the payload "
        "is checked against it first (JSON Schema: JSON, sent as given; Avro: JSON, sent "
        "as one binary datum)",
    )
    prod.add_argument(
        "--schema-version", type=int, metavar="N", help="pin version N of --schema-subject"
    )
    prod.add_argument(
        "--schema-min-version", type=int, metavar="N",
        help="fail unless the latest version of --schema-subject is N or later",
    )  # fmt: skip
    prod.add_argument(
        "--schema-file", type=Path,
        help="register this schema (under --schema-subject, or <namespace>-<topic>) and "
        "write with it",
    )  # fmt: skip
    prod.add_argument("--schema-type", choices=TYPES, help="the type of --schema-file")
    prod.set_defaults(run=produce)

    cons = commands.add_parser(
        "consume",
        help="receive (and acknowledge) messages",
        description="Receive and acknowledge messages, printing one line each. A message "
        "written with a schema is checked against the version it names (Avro is shown as "
        "JSON); one that does not fit is marked INVALID with the reason.",
    )
    common(cons)
    cons.add_argument("-n", "--consumer", default="consumer_pubsub", help="consumer name")
    cons.add_argument("-m", "--subscription", required=True, help="subscription name")
    cons.add_argument(
        "--sub-type", type=_sub_type, default="shared",
        metavar="{exclusive,shared,failover,key-shared}",
        help="subscription type, also spelled fail-over or key_shared (default shared)",
    )  # fmt: skip
    cons.add_argument("--key-filter", action="append", help="Key-Shared glob filter (repeatable)")
    cons.add_argument(
        "--start", type=_start_position, metavar="latest|earliest|OFFSET",
        help="where a new subscription starts (default: latest; an existing one resumes "
        "where it left off)",
    )  # fmt: skip
    cons.add_argument("-c", "--count", type=int, help="stop after this many messages")
    cons.add_argument(
        "-q", "--quiet", action="store_true",
        help="do not print messages; show a progress line instead",
    )  # fmt: skip
    cons.set_defaults(run=consume)

    gen = commands.add_parser(
        "load",
        help="drive producers and consumers at a set rate and log what they were told and "
        "received, for an audit (spark/README.md)",
    )
    add_service_addr(gen)
    gen.add_argument("--logs", type=Path, required=True, help="directory for the Parquet logs")
    gen.add_argument(
        "--topic-prefix", default="",
        help="topics are <prefix>-0, <prefix>-1, ... (default /default/load-<run id>); "
        "generators running at once need prefixes of their own",
    )  # fmt: skip
    gen.add_argument("--topics", type=int, default=1, help="number of topics (default 1)")
    gen.add_argument(
        "-p", "--partitions", type=int, default=0, help="partitions per topic (default 0: none)"
    )
    gen.add_argument("--producers", type=int, default=1, help="producers per topic (default 1)")
    gen.add_argument(
        "-c", "--messages", type=int, default=1000, help="messages in all (default 1000)"
    )
    gen.add_argument(
        "-r", "--rate", type=float, default=100.0,
        help="messages per second in all; each producer sends one at a time on a schedule "
        "and catches up after a slow acknowledgement (default 100)",
    )  # fmt: skip
    gen.add_argument(
        "--payload-bytes", type=int, default=128,
        help="payload size, at least the producer name and sequence number (default 128)",
    )  # fmt: skip
    gen.add_argument(
        "--keys", type=int, default=0, help="routing keys per producer (default 0: no key)"
    )
    gen.add_argument(
        "--subscriptions", default="exclusive,shared",
        help="subscription types, one subscription each, comma-separated from exclusive, "
        "shared, failover, key_shared (or key-shared, fail-over; default exclusive,shared)",
    )  # fmt: skip
    gen.add_argument(
        "--consumers", type=int, default=2,
        help="consumers per subscription; an Exclusive one has one (default 2)",
    )  # fmt: skip
    gen.add_argument(
        "--non-reliable", action="store_true",
        help="non-reliable topics (default: reliable, at-least-once)",
    )  # fmt: skip
    gen.add_argument(
        "--drain", type=float, default=30.0,
        help="seconds to wait for deliveries without progress after the last "
        "acknowledgement (default 30)",
    )  # fmt: skip
    gen.set_defaults(run=load)

    add_schema_commands(commands)
    return parser


def _run(run: Callable[[argparse.Namespace], object], args: argparse.Namespace) -> int:
    """Runs the command; Ctrl-C and SIGTERM stop it cleanly (exit 130 / 143)."""

    async def main() -> int:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        stopped: list[int] = []
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, lambda s=signum: (stopped.append(s), task.cancel()))
        try:
            return await run(args)  # type: ignore[misc]
        except asyncio.CancelledError:
            if stopped:
                return 128 + stopped[0]
            raise

    return asyncio.run(main())


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args.run, args)
    except (DanubeClientError, UsageError) as error:
        print(f"danube-cli: error: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"danube-cli: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
