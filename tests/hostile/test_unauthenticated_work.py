"""What a caller without valid credentials can make a secured broker do (issue 25, deliver
7): nothing expensive. The guard refuses when a call's headers arrive, before the handler
reads the body, so a schema bomb sent without a token (or with a forged or expired one) is
never parsed nor compiled, and a 16 MiB request is never read, let alone decoded.

The evidence does not depend on timing: `danube_schema_parse_total` (every definition a
caller sent to the parser) does not move for the refused bombs and moves for the same
call with the token; and HTTP/2 flow control shows the broker never read the large body
(a server that reads grants more window; this one let the client send no more than the
window it advertised at the start, then answered UNAUTHENTICATED).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request

import h2.settings
import pytest
from grpclib import GRPCError
from grpclib.const import Status

from danube.machines.security.tokens import mint
from danube.proto import danube_schema as pb
from tests.hostile.h2client import RawH2, grpc_frame
from tests.hostile.ledger import LEDGER
from tests.hostile.secured import SUPER_ADMIN, Access, SecuredBroker

pytestmark = pytest.mark.slow

PARSES = re.compile(r"^danube_schema_parse_total\{[^}]*\} (\S+)$", re.MULTILINE)
REGISTER = "/danube_schema.SchemaRegistry/RegisterSchema"
LARGE = 16 << 20


def _parses(secured: SecuredBroker) -> float:
    """The broker's `danube_schema_parse_total`, all schema types, read over HTTPS with the
    super admin's token."""
    access = secured.access
    request = urllib.request.Request(
        f"https://{secured.watched.process.metrics_addr}/metrics", headers=dict(access.headers)
    )
    with urllib.request.urlopen(request, timeout=10, context=access.http_context()) as answer:
        text = answer.read().decode()
    return sum(float(value) for value in PARSES.findall(text))


def _bombs() -> dict[str, tuple[str, bytes]]:
    """Definitions that cost the parser: a 20,000-symbol Avro enum, a JSON schema of 31
    anyOf-doubling levels, and a Protobuf file (compiled by protoc before parsing)."""
    levels: dict[str, object] = {"a0": {"type": "string"}}
    for level in range(1, 32):
        ref = {"$ref": f"#/definitions/a{level - 1}"}
        levels[f"a{level}"] = {"anyOf": [ref, ref]}
    doubling = {"definitions": levels, "$ref": "#/definitions/a31"}
    enum = {"type": "enum", "name": "E", "symbols": [f"S{i}" for i in range(20_000)]}
    proto = 'syntax = "proto3"; message M { ' + " ".join(
        f"int32 f{i} = {i};" for i in range(1, 2000)
    )
    return {
        "avro enum": ("avro", json.dumps(enum).encode()),
        "json anyOf doubling": ("json_schema", json.dumps(doubling).encode()),
        "protobuf": ("protobuf", (proto + " }").encode()),
    }


async def _attempt(access: Access, address: str, kind: str, definition: bytes) -> list[str]:
    """RegisterSchema and CheckCompatibility of `definition` with `access`: their statuses."""
    channel = access.channel(address)
    outcomes = []
    try:
        registry = pb.SchemaRegistryStub(channel)
        calls = (
            registry.register_schema(pb.RegisterSchemaRequest("unauth-bomb", kind, definition)),
            registry.check_compatibility(
                pb.CheckCompatibilityRequest("unauth-bomb", definition, kind)
            ),
        )
        for call in calls:
            try:
                await asyncio.wait_for(call, 30)
                outcomes.append("OK")
            except GRPCError as error:
                outcomes.append(error.status.name)
    finally:
        channel.close()
    return outcomes


def test_schema_bombs_without_valid_credentials_are_never_parsed(
    secured_broker: SecuredBroker,
) -> None:
    """Without a token, with a token signed by another key, with an expired one: every
    RegisterSchema and CheckCompatibility of a schema bomb is UNAUTHENTICATED and the parse
    counter does not move; the super admin's one small Protobuf registration moves it."""
    watched = secured_broker.watched
    started = watched.mark()
    forged = mint(SUPER_ADMIN, "not-the-broker-key-" + "x" * 16, now=time.time())
    expired = mint(SUPER_ADMIN, secured_broker.secret, now=time.time() - 7200, ttl_s=60)
    callers = {
        "no token": secured_broker.access.anonymous,
        "forged token": Access(
            secured_broker.access.ca_file, forged, (("authorization", f"Bearer {forged}"),)
        ),
        "expired token": Access(
            secured_broker.access.ca_file, expired, (("authorization", f"Bearer {expired}"),)
        ),
    }
    before = _parses(secured_broker)
    refused: dict[str, list[str]] = {}
    for who, access in callers.items():
        for name, (kind, definition) in _bombs().items():
            outcomes = asyncio.run(_attempt(access, watched.addr, kind, definition))
            refused[f"{who}: {name}"] = outcomes
            for outcome in outcomes:
                LEDGER.record("unauthenticated", f"{who}: {name}", outcome, definition[:48])
    after_refusals = _parses(secured_broker)
    small = b'syntax = "proto3"; message Small { int32 a = 1; }'
    control = asyncio.run(_attempt(secured_broker.access, watched.addr, "protobuf", small))
    after_control = _parses(secured_broker)
    LEDGER.notes.append(
        f"schema bombs without valid credentials: {sum(map(len, refused.values()))} calls "
        f"refused, danube_schema_parse_total {before:.0f} -> {after_refusals:.0f}, then "
        f"{after_control:.0f} after the super admin's one registration"
    )
    watched.measure(started, "schema bombs without credentials")
    wrong = {call: o for call, o in refused.items() if o != ["UNAUTHENTICATED"] * 2}
    assert not wrong, wrong
    assert after_refusals == before, f"{after_refusals - before} refused definitions parsed"
    assert control[0] == "OK", f"the super admin's registration: {control}"
    assert after_control >= before + 1, "the parse counter did not count a parse"
    watched.assert_healthy_since(started, "schema bombs without credentials")


def test_a_large_request_without_a_token_is_never_read(secured_broker: SecuredBroker) -> None:
    """A 16 MiB RegisterSchema without a token: UNAUTHENTICATED, and the client could send
    no more than the stream window the broker advertised (it never read the body, so never
    granted more, so never buffered nor decoded it)."""
    watched = secured_broker.watched
    started = watched.mark()
    data = grpc_frame(b"\x0a" + b"\xff" * 4 + b"\x07" + b"s" * (LARGE - 6))
    with RawH2(watched.addr, context=secured_broker.access.grpc_context()) as client:
        client.handshake()
        window = client.seen.settings.get(h2.settings.SettingCodes.INITIAL_WINDOW_SIZE, 65_535)
        stream_id = client.conn.get_next_available_stream_id()
        client.conn.send_headers(stream_id, client.call_headers(REGISTER))
        sent = 0
        answered = lambda: stream_id in client.seen.statuses or stream_id in client.seen.resets  # noqa: E731
        deadline = time.monotonic() + 30
        while sent < len(data) and not client.seen.closed and not answered():
            if time.monotonic() > deadline:
                break
            room = min(
                client.conn.local_flow_control_window(stream_id),
                client.conn.max_outbound_frame_size,
                len(data) - sent,
            )
            if room <= 0:
                client.pump(0.5)
                continue
            client.conn.send_data(stream_id, data[sent : sent + room])
            sent += room
            client.flush()
            client.drain()
        client.pump(10.0, until=answered)
        status = client.seen.statuses.get(stream_id)
    LEDGER.record("unauthenticated", "16 MiB RegisterSchema", f"status {status}", data[:48])
    LEDGER.notes.append(
        f"16 MiB request without a token: answered grpc-status {status} after the client "
        f"could send {sent} of {len(data)} bytes (stream window {window})"
    )
    watched.measure(started, "16 MiB request without a token")
    assert status == str(Status.UNAUTHENTICATED.value), f"answered {status}"
    assert sent <= window < len(data), f"{sent} bytes accepted, window {window}"
    watched.assert_healthy_since(started, "16 MiB request without a token")


def test_the_secured_broker_came_through_unauthenticated_work(
    secured_broker: SecuredBroker,
) -> None:
    problems = secured_broker.watched.checkpoint()
    assert not problems, "; ".join(problems)
