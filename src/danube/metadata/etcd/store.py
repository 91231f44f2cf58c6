"""`MetadataStore` on an etcd v3 cluster, for brokers that share metadata.

It speaks etcd's gRPC API (KV, Watch, Lease) as proto/etcd_rpc.proto and proto/etcd_kv.proto
declare it, over grpclib, on an asyncio loop hosted in the caller's trio run
(danube.metadata.etcd.loop says where that boundary is and why). Lease calls use the types the
project's betterproto pipeline generates from those files (danube.proto.etcdserverpb); the
KV and Watch messages, which carry every key and value, go through the hand codec in
danube.metadata.etcd.wire, checked against those same generated types. It replaced the `etcd3`
package, whose generated modules predate protobuf 4 and forced protobuf's pure-Python
implementation on the whole process, and whose blocking calls needed a worker thread each
(issue 23).

Values are stored as their canonical JSON text (`encode_value`), so etcd's byte-wise value
compares are the same compares the in-memory and embedded stores make on that text. Revisions,
versions and lease ids are etcd's own: a fresh etcd is at revision 1, so its first change gets
revision 2.
"""

from __future__ import annotations

import contextlib
import json
import math
import ssl
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any, Self, TypeVar

import betterproto
import trio
from grpclib.client import Channel
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError

from danube.metadata.etcd import wire
from danube.metadata.etcd.loop import AsyncioHost
from danube.metadata.etcd.watch import Watch, WatchStream, watch_request
from danube.metadata.model import (
    CompactedError,
    Compare,
    Delete,
    DeletePrefix,
    Get,
    JSONValue,
    KeyValue,
    LeaseNotFound,
    MetadataCorrupted,
    MetadataError,
    Op,
    Put,
    StoreClosed,
    TxnResult,
    WatchEvent,
)
from danube.metadata.state import encode_value
from danube.proto import etcdserverpb as pb

Reply = TypeVar("Reply")

_RANGE = "/etcdserverpb.KV/Range"
_PUT = "/etcdserverpb.KV/Put"
_DELETE_RANGE = "/etcdserverpb.KV/DeleteRange"
_TXN = "/etcdserverpb.KV/Txn"
_LEASE_GRANT = "/etcdserverpb.Lease/LeaseGrant"
_LEASE_REVOKE = "/etcdserverpb.Lease/LeaseRevoke"
_LEASE_KEEPALIVE = "/etcdserverpb.Lease/LeaseKeepAlive"

# How long `connect` waits between attempts on an etcd that refuses connections (still
# starting): doubling from the first to the last, so a down etcd is not hammered.
_RETRY_FIRST_S = 0.05
_RETRY_MAX_S = 0.5

_COMPARE_TARGETS = {
    "value": int(pb.CompareCompareTarget.VALUE),
    "version": int(pb.CompareCompareTarget.VERSION),
    "create_revision": int(pb.CompareCompareTarget.CREATE),
    "mod_revision": int(pb.CompareCompareTarget.MOD),
}
_COMPARE_RESULTS = {
    "==": int(pb.CompareCompareResult.EQUAL),
    "!=": int(pb.CompareCompareResult.NOT_EQUAL),
    "<": int(pb.CompareCompareResult.LESS),
    ">": int(pb.CompareCompareResult.GREATER),
}

# What a call to an etcd that is down or unreachable raises, besides a gRPC status: a refused
# or reset connection (OSError), a connection lost mid-call (StreamTerminatedError), an HTTP/2
# answer that is not gRPC (ProtocolError). TimeoutError (the deadline) is an OSError too.
_TRANSPORT_ERRORS = (OSError, StreamTerminatedError, ProtocolError)


CALLS_IN_FLIGHT = 128
"""KV calls (Range, Put, DeleteRange, Txn) on the connection at once; later ones wait in trio.
h2 counts a connection's open streams by walking all of them each time it opens one, so
with the hundreds of reads and transactions a broker issues when a dead broker's topics land
on it (`bench.cluster_e2e failover-many`: 234 loads) every call cost more the more were
waiting: 11 % of that broker's main thread went to `H2Connection.open_outbound_streams`.
Lease calls are not counted: a renewal must not wait behind a failover's reads, or the
broker fences itself."""

_BOUNDED_CALLS = frozenset({_RANGE, _PUT, _DELETE_RANGE, _TXN})
_LEASE_CALLS = frozenset({_LEASE_GRANT, _LEASE_REVOKE, _LEASE_KEEPALIVE})
"""Calls made on the lease lane (`EtcdStore._lease_channel`), a connection of their own: a
failover's hundreds of reads and transactions fill the KV connection's HTTP/2 send queue and
flow-control windows, and a renewal queued behind them failed under load (issue 23 point 4:
`membership_request_failed`, brokers fenced)."""

WATCH_BUFFER = 16_384
"""Events a watch holds unread before it ends with CompactedError. A leader's load manager
with 700 topics fell more than 1,024 behind while a dead broker's topics moved and batched
decisions landed (`bench.cluster_e2e failover-many`), and the re-read that follows such an
end costs more than the lag: a whole snapshot of `/cluster/` for a consumer already behind.
A few hundred bytes per event: megabytes at most, for a consumer that is slow, not stuck."""


class EtcdUnavailable(MetadataError):
    """etcd did not answer (down, unreachable, or no leader) within the store's timeout."""

    def __init__(self, message: str, cause: str = "") -> None:
        super().__init__(message)
        self.cause = cause or message


class EtcdStore:
    """`MetadataStore` over one etcd cluster; open it with `EtcdStore.connect`.

    Every key the caller names is stored under `prefix` (prepended verbatim), and keys come
    back without it, so several clusters or test cases can share one etcd. Revisions are
    etcd's store-wide counter, so they also advance for other prefixes' changes.

    Where etcd's semantics differ from the in-memory reference, this store follows etcd:

    - a value compare on a missing key is false whatever the operator, even `== None`;
    - lease TTLs are whole seconds: `grant_lease` rounds up, and etcd raises anything below its
      minimum (1.5 election timeouts rounded up, 2 s with etcd's default timings), so a lease
      may outlive what was asked but never falls short of it. Expiry is etcd's to detect and
      shows up as delete events about half a second after the deadline;
    - a put with a lease that has expired but that etcd has not revoked yet still succeeds,
      and the key vanishes with the lease moments later.

    The store belongs to the trio run that connected it: its asyncio loop is a system task of
    that run.
    """

    def __init__(
        self,
        host: AsyncioHost,
        endpoint: str,
        *,
        prefix: str,
        timeout_s: float,
        watch_buffer: int,
    ) -> None:
        self._host = host
        self._endpoint = endpoint
        self._calls = trio.Semaphore(CALLS_IN_FLIGHT)
        self._prefix = prefix
        self._timeout_s = timeout_s
        self.watch_buffer = watch_buffer
        self._channel: Channel | None = None
        self._lease_channel: Channel | None = None
        """The lease lane: grants, renewals and revokes on a connection of their own
        (`_LEASE_CALLS`); grpclib connects a channel at its first call."""
        self._watches: set[Watch] = set()
        self._closed = False

    @classmethod
    async def connect(
        cls,
        endpoints: Sequence[str],
        *,
        prefix: str = "",
        timeout_s: float = 5.0,
        watch_buffer: int = WATCH_BUFFER,
        ssl_context: ssl.SSLContext | None = None,
    ) -> EtcdStore:
        """Opens the store on the first of `endpoints` ("host:port", "http://host:port" or
        "https://host:port") that answers a read within `timeout_s`, waiting for an etcd that
        is still starting.

        With `ssl_context` (ALPN `h2`; a client certificate in it for an etcd that requires
        one) every endpoint is reached over TLS; an `https://` endpoint needs one, an
        `http://` endpoint refuses one: the two never mix.

        The store then talks to that member only; `timeout_s` also bounds every later call.
        Raises EtcdUnavailable, naming every endpoint tried, if none answers.

        `prefix` is prepended to keys verbatim, so no store's prefix should be a prefix of
        another's ("/t1" and "/t10"): a scan of "" under "/t1" would include "/t10"'s keys.
        """
        if not endpoints:
            raise ValueError("EtcdStore.connect needs at least one endpoint")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        if watch_buffer < 1:
            raise ValueError("watch_buffer must be at least 1")
        targets = [_target(endpoint, tls=ssl_context is not None) for endpoint in endpoints]
        failures: list[str] = []
        for endpoint, (host, port) in zip(endpoints, targets, strict=True):
            loop = await AsyncioHost.start(f"etcd client {endpoint}")
            store = cls(
                loop, endpoint, prefix=prefix, timeout_s=timeout_s, watch_buffer=watch_buffer
            )
            try:
                store._channel = await loop.run(_open_channel, host, port, ssl_context)
                store._lease_channel = await loop.run(_open_channel, host, port, ssl_context)
                await store._probe()
            except MetadataError as exc:
                failures.append(str(exc))
            except BaseException:
                await store.aclose()  # cancelled while waiting for this endpoint
                raise
            else:
                return store
            await store.aclose()
        raise EtcdUnavailable("cannot use etcd: " + "; ".join(failures))

    async def _probe(self) -> None:
        """One read, retried with back-off while etcd refuses connections, for `timeout_s`."""
        start, _ = self._range("")
        probe = wire.Encoded(wire.range_request(start, limit=1, keys_only=True))
        give_up = trio.current_time() + self._timeout_s
        delay = _RETRY_FIRST_S
        while True:
            remaining = max(give_up - trio.current_time(), 0.001)
            try:
                await self._call(_RANGE, probe, wire.RangeReply, timeout_s=remaining)
                return
            except EtcdUnavailable as exc:
                if trio.current_time() + delay >= give_up:
                    raise _unavailable(
                        self._endpoint, f"did not answer within {self._timeout_s} s", exc.cause
                    ) from None
            await trio.sleep(delay)
            delay = min(delay * 2, _RETRY_MAX_S)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- reads --------------------------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        request = wire.Encoded(wire.range_request(self._key(key)))
        response = await self._call(_RANGE, request, wire.RangeReply)
        return self._key_value(response.kvs[0]) if response.kvs else None

    async def scan(self, prefix: str) -> list[KeyValue]:
        start, end = self._range(prefix)
        # etcd returns a range in key byte order, which for UTF-8 is str order.
        request = wire.Encoded(wire.range_request(start, end))
        response = await self._call(_RANGE, request, wire.RangeReply)
        return [self._key_value(kv) for kv in response.kvs]

    @asynccontextmanager
    async def watch(
        self, prefix: str, start_revision: int | None = None
    ) -> AsyncGenerator[AsyncIterator[WatchEvent], None]:
        await trio.lowlevel.checkpoint()
        self._ensure_open()
        if start_revision is not None and start_revision < 0:
            raise ValueError(f"revisions are not negative, got {start_revision}")
        start, end = self._range(prefix)
        watch = Watch(self, prefix, watch_request(start, end, start_revision), self._endpoint)
        self._watches.add(watch)
        try:
            await self._host.run(watch.start, self._channel)
            with trio.move_on_after(self._timeout_s):
                await watch.settled.wait()
            if not watch.created:
                self._ensure_open()
                raise watch.error or EtcdUnavailable(
                    f"etcd at {self._endpoint} did not confirm a watch on {prefix!r} within "
                    f"{self._timeout_s} s"
                )
            yield WatchStream(watch)
        finally:
            self._watches.discard(watch)
            watch.end(None)
            with trio.CancelScope(shield=True):
                await watch.finished.wait()

    # -- writes -------------------------------------------------------------------------------

    async def put(self, key: str, value: JSONValue, lease: int | None = None) -> int:
        request = wire.Encoded(self._put_request(Put(key, value, lease), prev_kv=False))
        response = await self._call(_PUT, request, wire.PutReply)
        return response.revision

    async def delete(self, key: str) -> bool:
        request = wire.Encoded(wire.delete_range_request(self._key(key)))
        response = await self._call(_DELETE_RANGE, request, wire.DeleteRangeReply)
        return bool(response.deleted)

    async def delete_prefix(self, prefix: str) -> int:
        start, end = self._range(prefix)
        request = wire.Encoded(wire.delete_range_request(start, end))
        response = await self._call(_DELETE_RANGE, request, wire.DeleteRangeReply)
        return response.deleted

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        request = wire.txn_request(
            [self._compare(compare) for compare in compares],
            [self._request_op(op) for op in success],
            [self._request_op(op) for op in failure],
        )
        response = await self._call(_TXN, wire.Encoded(request), wire.TxnReply)
        executed = success if response.succeeded else failure
        return TxnResult(
            succeeded=response.succeeded,
            revision=response.revision,
            responses=tuple(
                self._op_result(op, result)
                for op, result in zip(executed, response.responses, strict=True)
            ),
        )

    async def txn_many(
        self, txns: Sequence[tuple[Sequence[Compare], Sequence[Op]]]
    ) -> list[TxnResult]:
        """Several independent transactions (compares, success ops; no failure ops) in one
        request: etcd runs each as a nested transaction of one outer transaction that has no
        compares, so each keeps its own compares and outcome, and all are one round trip and
        one etcd write (issue 23: a dead broker's failovers). etcd refuses more than
        `--max-txn-ops` (128 by default) nested transactions, and two that write the same
        key; the caller keeps to both. Results come in the order given, all with the outer
        transaction's revision."""
        nested = [
            wire.request_op(
                wire.REQUEST_TXN,
                wire.txn_request(
                    [self._compare(compare) for compare in compares],
                    [self._request_op(op) for op in success],
                    [],
                ),
            )
            for compares, success in txns
        ]
        request = wire.txn_request([], nested, [])
        response = await self._call(_TXN, wire.Encoded(request), wire.TxnReply)
        results = []
        for (_, success), inner in zip(txns, response.responses, strict=True):
            if not isinstance(inner, wire.TxnReply):
                raise MetadataError(
                    f"etcd at {self._endpoint} answered a nested transaction with {inner!r}"
                )
            executed = success if inner.succeeded else ()
            responses = inner.responses if inner.succeeded else []
            results.append(
                TxnResult(
                    succeeded=inner.succeeded,
                    revision=response.revision,
                    responses=tuple(
                        self._op_result(op, result)
                        for op, result in zip(executed, responses, strict=True)
                    ),
                )
            )
        return results

    async def read_many(
        self, keys: Sequence[str], prefixes: Sequence[str]
    ) -> tuple[dict[str, KeyValue | None], dict[str, list[KeyValue]]]:
        """Each of `keys` read and each of `prefixes` scanned at one revision, in one
        request: a transaction with no compares whose operations are range requests
        (issue 23: a broker loading a batch of topics). etcd takes `--max-txn-ops` (128 by
        default) operations; the caller keeps to it."""
        ranges = [wire.range_request(self._key(key)) for key in keys]
        ranges += [wire.range_request(*self._range(prefix)) for prefix in prefixes]
        request = wire.txn_request([], [wire.request_op(wire.REQUEST_RANGE, r) for r in ranges], [])
        response = await self._call(_TXN, wire.Encoded(request), wire.TxnReply)
        replies = list(response.responses)
        if len(replies) != len(ranges) or not all(isinstance(r, wire.RangeReply) for r in replies):
            raise MetadataError(f"etcd at {self._endpoint} answered reads with {replies!r}")
        found: dict[str, KeyValue | None] = {}
        for key, reply in zip(keys, replies, strict=False):
            assert isinstance(reply, wire.RangeReply)
            found[key] = self._key_value(reply.kvs[0]) if reply.kvs else None
        scanned: dict[str, list[KeyValue]] = {}
        for prefix, reply in zip(prefixes, replies[len(keys) :], strict=True):
            assert isinstance(reply, wire.RangeReply)
            scanned[prefix] = [self._key_value(kv) for kv in reply.kvs]
        return found, scanned

    # -- leases -------------------------------------------------------------------------------

    async def grant_lease(self, ttl_s: float) -> int:
        if ttl_s <= 0:
            raise ValueError(f"a lease needs a positive TTL, got {ttl_s}")
        request = pb.LeaseGrantRequest(ttl=math.ceil(ttl_s))
        response = await self._call(_LEASE_GRANT, request, pb.LeaseGrantResponse)
        if response.error:
            raise MetadataError(f"etcd at {self._endpoint} refused a lease: {response.error}")
        lease_id: int = response.id
        return lease_id

    async def keepalive(self, lease_id: int) -> None:
        request = pb.LeaseKeepAliveRequest(id=lease_id)
        response = await self._exchange(
            _LEASE_KEEPALIVE, request, pb.LeaseKeepAliveResponse, cardinality=_RENEW_ONCE
        )
        # etcd answers a renewal of a lease it does not know (any more) with TTL 0.
        if response is None or response.ttl <= 0:
            raise LeaseNotFound(f"lease {lease_id} does not exist (expired or revoked?)")

    async def revoke(self, lease_id: int) -> None:
        request = pb.LeaseRevokeRequest(id=lease_id)
        try:
            await self._call(_LEASE_REVOKE, request, pb.LeaseRevokeResponse)
        except LeaseNotFound:
            raise LeaseNotFound(f"lease {lease_id} does not exist (expired or revoked?)") from None

    # -- lifecycle ----------------------------------------------------------------------------

    async def aclose(self) -> None:
        # Shielded, so a store whose owner is being cancelled still ends its watches and
        # releases the connection.
        with trio.CancelScope(shield=True):
            if self._closed:
                return
            self._closed = True
            for watch in list(self._watches):
                watch.end(None)
            for watch in list(self._watches):
                await watch.finished.wait()
            for channel in (self._channel, self._lease_channel):
                if channel is not None:
                    with contextlib.suppress(StoreClosed):  # the loop is gone already
                        await self._host.run(_close_channel, channel)
            await self._host.stop()

    # -- internals ----------------------------------------------------------------------------

    def _ensure_open(self) -> None:
        if self._closed:
            raise StoreClosed("the metadata store is closed")

    async def _call(
        self,
        path: str,
        request: betterproto.Message | wire.Encoded,
        reply_type: type[Reply],
        *,
        timeout_s: float | None = None,
    ) -> Reply:
        """One unary call (etcd always answers one of those, or fails it)."""
        reply = await self._exchange(path, request, reply_type, timeout_s=timeout_s)
        if reply is None:
            raise MetadataError(f"etcd at {self._endpoint} ended {path} without a reply")
        return reply

    async def _exchange(
        self,
        path: str,
        request: betterproto.Message | wire.Encoded,
        reply_type: type[Reply],
        *,
        timeout_s: float | None = None,
        cardinality: Cardinality = Cardinality.UNARY_UNARY,
    ) -> Reply | None:
        """One request and at most one reply on the store's loop, with etcd's errors translated
        (and no grpclib traceback chained to them).

        The call is shielded from the caller's cancellation (it is bounded by `timeout_s`): a
        cancelled caller still waits for its call rather than abandoning it, since an abandoned
        write could land after the same caller's next one. A KV call first takes one of
        `CALLS_IN_FLIGHT` slots; waiting for one (none free) can be cancelled, as nothing was
        sent. Lease calls go on the lease lane's connection (`_LEASE_CALLS`).
        """
        self._ensure_open()
        timeout = self._timeout_s if timeout_s is None else timeout_s
        bounded = path in _BOUNDED_CALLS  # lease calls take no slot
        channel = self._lease_channel if path in _LEASE_CALLS else self._channel
        if bounded:
            try:
                self._calls.acquire_nowait()
            except trio.WouldBlock:
                await self._calls.acquire()  # cancellable: nothing was sent yet
        try:
            with trio.CancelScope(shield=True):
                reply: Reply | None = await self._host.run(
                    _request_reply, channel, path, cardinality, request, reply_type, timeout
                )
        except (GRPCError, wire.WireError, *_TRANSPORT_ERRORS) as exc:
            raise self.error(exc) from None
        finally:
            if bounded:
                self._calls.release()
        return reply

    def error(self, exc: BaseException) -> Exception:
        """etcd's answer (or the lack of one) as the MetadataStore error it means."""
        if self._closed:
            return StoreClosed("the metadata store is closed")
        if isinstance(exc, wire.WireError):
            return MetadataError(f"etcd at {self._endpoint} sent a malformed reply: {exc}")
        if isinstance(exc, TimeoutError):
            return _unavailable(
                self._endpoint, f"did not answer within {self._timeout_s} s", "deadline"
            )
        if not isinstance(exc, GRPCError):
            return _unavailable(self._endpoint, "is unavailable", f"{type(exc).__name__}: {exc}")
        status, details = exc.status, exc.message or ""
        if status in (Status.UNAVAILABLE, Status.DEADLINE_EXCEEDED):
            what = (
                "is unavailable"
                if status == Status.UNAVAILABLE
                else f"did not answer within {self._timeout_s} s"
            )
            return _unavailable(self._endpoint, what, f"{status.name}: {details}")
        if status == Status.NOT_FOUND and "lease" in details:
            return LeaseNotFound(f"{details} (expired or revoked?)")
        if status == Status.OUT_OF_RANGE and "compacted" in details:
            return CompactedError(details)
        if status == Status.INVALID_ARGUMENT:
            # Duplicate keys in a transaction branch, an empty key: the caller's mistake, as
            # the other backends report it.
            return ValueError(f"etcd rejected the request: {details}")
        return MetadataError(f"etcd at {self._endpoint} failed: {status.name}: {details}")

    def _key(self, key: str) -> bytes:
        return (self._prefix + key).encode()

    def _range(self, prefix: str) -> tuple[bytes, bytes]:
        """etcd's [key, range_end) for every key that starts with `prefix`."""
        start = self._key(prefix)
        if not start:
            return b"\0", b"\0"  # etcd's spelling of "all keys"
        # UTF-8 never contains the byte 0xff, so the last byte can always be incremented.
        return start, start[:-1] + bytes([start[-1] + 1])

    def _user_key(self, raw: bytes) -> str:
        return raw.decode()[len(self._prefix) :]

    def _decode(self, raw_key: bytes, raw_value: bytes) -> JSONValue:
        try:
            return json.loads(raw_value)
        except ValueError:
            raise MetadataCorrupted(
                f"etcd key {raw_key!r} does not hold JSON; something other than danube wrote it"
            ) from None

    def _key_value(self, kv: wire.KeyValue) -> KeyValue:
        return KeyValue(
            key=self._user_key(kv.key),
            value=self._decode(kv.key, kv.value),
            create_revision=kv.create_revision,
            mod_revision=kv.mod_revision,
            version=kv.version,
            lease=kv.lease or None,
        )

    def watch_event(self, event: wire.Event) -> WatchEvent:
        kv = event.kv
        prev = event.prev_kv
        prev_value = None if prev is None else self._decode(kv.key, prev.value)
        if event.delete:
            return WatchEvent("delete", self._user_key(kv.key), None, kv.mod_revision, prev_value)
        return WatchEvent(
            "put",
            self._user_key(kv.key),
            self._decode(kv.key, kv.value),
            kv.mod_revision,
            prev_value,
            kv.lease or None,
        )

    def _compare(self, compare: Compare) -> bytes:
        operand: int | bytes = (
            encode_value(compare.operand).encode()
            if compare.target == "value"
            else int(compare.operand)  # type: ignore[call-overload]
        )
        return wire.compare(
            _COMPARE_RESULTS[compare.op],
            _COMPARE_TARGETS[compare.target],
            self._key(compare.key),
            compare.target,
            operand,
        )

    def _put_request(self, op: Put, *, prev_kv: bool) -> bytes:
        # prev_kv in a transaction, so that a Put there can report the value it replaced.
        value = encode_value(op.value).encode()
        return wire.put_request(self._key(op.key), value, op.lease or 0, prev_kv=prev_kv)

    def _request_op(self, op: Op) -> bytes:
        if isinstance(op, Put):
            return wire.request_op(wire.REQUEST_PUT, self._put_request(op, prev_kv=True))
        if isinstance(op, Delete):
            delete = wire.delete_range_request(self._key(op.key))
            return wire.request_op(wire.REQUEST_DELETE_RANGE, delete)
        if isinstance(op, DeletePrefix):
            start, end = self._range(op.prefix)
            delete = wire.delete_range_request(start, end)
            return wire.request_op(wire.REQUEST_DELETE_RANGE, delete)
        return wire.request_op(wire.REQUEST_RANGE, wire.range_request(self._key(op.key)))

    def _op_result(self, op: Op, result: wire.ResponseOp) -> Any:
        """One entry of TxnResult.responses, in the shape TxnResult documents."""
        if isinstance(op, Put):
            assert isinstance(result, wire.PutReply)
            return None if result.prev_kv is None else self._key_value(result.prev_kv)
        if isinstance(op, Delete | DeletePrefix):
            assert isinstance(result, wire.DeleteRangeReply)
            return bool(result.deleted) if isinstance(op, Delete) else result.deleted
        assert isinstance(op, Get) and isinstance(result, wire.RangeReply)
        return self._key_value(result.kvs[0]) if result.kvs else None


# A lease renewal: one request on a LeaseKeepAlive stream of its own, which etcd ends once it
# has answered and seen the request side end.
_RENEW_ONCE = Cardinality.STREAM_STREAM


async def _open_channel(host: str, port: int, context: ssl.SSLContext | None) -> Channel:
    """A grpclib channel; made in asyncio code, where grpclib finds its loop."""
    return Channel(host, port, ssl=context)


async def _close_channel(channel: Channel) -> None:
    channel.close()


async def _request_reply(
    channel: Channel | None,
    path: str,
    cardinality: Cardinality,
    request: betterproto.Message | wire.Encoded,
    reply_type: type[Reply],
    timeout_s: float,
) -> Reply | None:
    """Sends one request and reads at most one reply (asyncio; run on the store's loop)."""
    if channel is None:
        raise StoreClosed("the metadata store is closed")
    async with channel.request(
        path, cardinality, type(request), reply_type, timeout=timeout_s
    ) as stream:
        await stream.send_message(request, end=True)
        reply: Reply | None = await stream.recv_message()
    return reply


def _unavailable(endpoint: str, what: str, cause: str) -> EtcdUnavailable:
    return EtcdUnavailable(
        f"etcd at {endpoint} {what} ({cause}); is it running, and is {endpoint} its client URL?",
        cause,
    )


def _target(endpoint: str, *, tls: bool) -> tuple[str, int]:
    """The host and port of an endpoint given as "host:port", "http://host:port" (not with
    `tls`) or "https://host:port" (only with `tls`)."""
    scheme, separator, address = endpoint.rpartition("://")
    if separator and scheme not in ("http", "https"):
        raise ValueError(f"etcd endpoint {endpoint!r}: expected http:// or https://")
    if separator and (scheme == "https") != tls:
        raise ValueError(
            f"etcd endpoint {endpoint!r}: https:// needs a TLS context"
            if tls is False
            else f"etcd endpoint {endpoint!r}: http:// with a TLS context (use https://)"
        )
    address = address.rstrip("/")
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"etcd endpoint {endpoint!r} is not host:port")
    return host, int(port)
