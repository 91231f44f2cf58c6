"""What `danube-cli produce`, `consume` and `load` do once parsed: imported when a command
runs, not for `--help` (the client, its wire types and the schema codecs cost a tool's start
0.2 s; issue 26)."""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
from typing import TYPE_CHECKING, Any

from grpclib.const import Status

from danube.cli.progress import Progress
from danube.cli.usage import (
    CLIENT_ENV_PREFIX,
    BadInput,
    UsageError,
    read_input,
    render_bytes,
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

if TYPE_CHECKING:
    from danube.cli.schema_payloads import SchemaPayloads

# `danube.cli.schema_payloads` (the schema codecs: jsonschema, fastavro, protobuf) is imported
# where a schema is in play: a plain produce or consume does not load it (issue 26: it was a
# third of a first `produce`'s 1 s).


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
        from danube.cli.schema_payloads import PayloadError, SchemaPayloads

        try:
            local = WriterSchema(subject, 0, 0, args.schema_type, definition)
            SchemaPayloads.of(local).encode(payload)
        except PayloadError as error:
            raise BadInput(f"{error}; nothing was registered or sent") from None
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
            from danube.cli.schema_payloads import PayloadError, SchemaPayloads

            try:
                payload = SchemaPayloads.of(schema).encode(payload)
            except PayloadError as error:
                raise BadInput(f"{error}; nothing was sent") from None
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
        from danube.cli.schema_payloads import PayloadError, SchemaPayloads

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

    async def render_json(self, message: Message) -> str:
        """One JSON object on one line (`consume -o json`): the message's id fields, its
        attributes and the payload as text when it is UTF-8, else base64
        (`payload_encoding` says which); a message written with a schema also carries its id,
        version and either `value` (Avro decoded to JSON, JSON Schema parsed) or
        `schema_error` saying why it does not fit."""
        line: dict[str, Any] = {
            "topic": message.topic,
            "offset": message.offset,
            "producer_id": message.producer_id,
            "producer_name": message.producer_name,
            "broker_addr": message.broker_addr,
            "request_id": message.request_id,
            "publish_time": message.publish_time,
            "routing_key": message.routing_key,
            "attributes": dict(message.attributes),
        }
        try:
            line["payload"], line["payload_encoding"] = message.payload.decode(), "utf-8"
        except UnicodeDecodeError:
            line["payload"] = base64.b64encode(message.payload).decode("ascii")
            line["payload_encoding"] = "base64"
        if message.schema_id is not None:
            line["schema_id"], line["schema_version"] = message.schema_id, message.schema_version
            schema = await self._schema(message.schema_id, message.schema_version)
            if isinstance(schema, str):
                line["schema_error"] = schema
            else:
                from danube.cli.schema_payloads import PayloadError

                try:
                    text = schema.render(message.payload)
                    if schema.parsed is not None:
                        line["value"] = json.loads(text)
                except PayloadError as error:
                    line["schema_error"] = str(error)
                except ValueError:
                    pass  # a string or number schema: the payload above is the value
        return json.dumps(line, ensure_ascii=False, separators=(",", ":"))

    async def render(self, message: Message) -> str:
        attributes = f" attributes={dict(message.attributes)}" if message.attributes else ""
        key = f" key={message.routing_key}" if message.routing_key else ""
        head = f"{message.topic} offset={message.offset}{key}{attributes}"
        if message.schema_id is None:
            return f"[{head}] {render_bytes(message.payload)}"
        schema = await self._schema(message.schema_id, message.schema_version)
        if isinstance(schema, str):
            return f"[{head} schema unknown: {schema}] {render_bytes(message.payload)}"
        from danube.cli.schema_payloads import PayloadError

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
            show = renderer.render_json if args.output == "json" else renderer.render
            try:
                async for message in consumer:
                    await consumer.ack(message)
                    if args.quiet:
                        progress.tick()
                    else:
                        progress.count += 1
                        print(await show(message), flush=True)
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
        raise BadInput(
            f"danube-cli load writes Parquet logs and needs the audit extra "
            f"(pip install 'pydanube[audit]'): {error}"
        ) from None
    plan = LoadPlan(
        service_url=args.service_addr,
        logs=args.logs,
        topic_prefix=args.topic_prefix,
        subscription_prefix=args.subscription_prefix,
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
        connection_topics=args.topics_per_connection,
        duration_s=args.duration,
    )
    problems = plan.problems()
    if problems:
        raise UsageError("; ".join(problems))
    result = await LoadRun(plan, say_on_stderr).run()
    print(summary(plan, result), flush=True)
    return 1 if result.failures or any(result.missing.values()) else 0
