"""`MetadataStore` on an etcd v3 cluster, for brokers that share metadata.

It speaks etcd's gRPC API through the message classes and stubs that the `etcd3` package
generates (`etcd3.etcdrpc`) rather than through `etcd3.Etcd3Client`'s helpers: those turn every
gRPC status into a bare exception without its details, and their watch thread re-opens its
stream in a tight loop while etcd is down. gRPC calls block, so each one runs in a worker thread
(`trio.to_thread`), and every watch is one gRPC stream drained by a thread of its own that hands
responses to trio in order.

Values are stored as their canonical JSON text (`encode_value`), so etcd's byte-wise value
compares are the same compares the in-memory and embedded stores make on that text. Revisions,
versions and lease ids are etcd's own: a fresh etcd is at revision 1, so its first change gets
revision 2.
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
import threading
import warnings
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from types import ModuleType, TracebackType
from typing import Any, Self, TypeVar

import grpc
import trio

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

_PROTOBUF_IMPLEMENTATION = "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"


def _import_etcd3() -> tuple[ModuleType, ModuleType]:
    """Imports etcd3's generated gRPC modules, which predate protobuf 4.

    They build descriptors directly, which protobuf's default (upb) implementation refuses; the
    pure-Python implementation still accepts them. protobuf picks its implementation once per
    process, when it is first imported, so the variable must be set before that happens. It is
    removed again afterwards so that child processes (brokers, the official client in the
    conformance tests) keep the fast default. The project's own wire code is betterproto and
    does not use google.protobuf at all.
    """
    if "google.protobuf" in sys.modules:
        from google.protobuf.internal import api_implementation

        if api_implementation.Type() != "python":
            raise ImportError(
                "etcd3 needs protobuf's pure-Python implementation, but google.protobuf was "
                f"already imported with {api_implementation.Type()!r}: import "
                f"danube.metadata.etcd earlier, or set {_PROTOBUF_IMPLEMENTATION}=python"
            )
    set_here = _PROTOBUF_IMPLEMENTATION not in os.environ
    os.environ.setdefault(_PROTOBUF_IMPLEMENTATION, "python")
    try:
        with warnings.catch_warnings():
            # The old-style descriptor calls warn once per message type; nothing to act on.
            warnings.simplefilter("ignore", DeprecationWarning)
            from etcd3 import etcdrpc
            from etcd3.etcdrpc import kv_pb2
    finally:
        if set_here:
            del os.environ[_PROTOBUF_IMPLEMENTATION]
    return etcdrpc, kv_pb2


etcdrpc, kv_pb2 = _import_etcd3()

T = TypeVar("T")

# As etcd's Go client: a scan of a large prefix must not fail on gRPC's 4 MiB default.
_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1)]

_COMPARE_TARGETS = {
    "value": etcdrpc.Compare.VALUE,
    "version": etcdrpc.Compare.VERSION,
    "create_revision": etcdrpc.Compare.CREATE,
    "mod_revision": etcdrpc.Compare.MOD,
}
_COMPARE_RESULTS = {
    "==": etcdrpc.Compare.EQUAL,
    "!=": etcdrpc.Compare.NOT_EQUAL,
    "<": etcdrpc.Compare.LESS,
    ">": etcdrpc.Compare.GREATER,
}


class EtcdUnavailable(MetadataError):
    """etcd did not answer (down, unreachable, or no leader) within the store's timeout."""


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

    The store belongs to the trio run that connected it: watches hand their events to that run.
    """

    def __init__(
        self,
        channel: grpc.Channel,
        endpoint: str,
        *,
        prefix: str,
        timeout_s: float,
        watch_buffer: int,
    ) -> None:
        self._channel = channel
        self._endpoint = endpoint
        self._prefix = prefix
        self._timeout_s = timeout_s
        self._watch_buffer = watch_buffer
        self._kv = etcdrpc.KVStub(channel)
        self._lease = etcdrpc.LeaseStub(channel)
        self._watch_stub = etcdrpc.WatchStub(channel)
        self._watches: set[_Watch] = set()
        self._closed = False

    @classmethod
    async def connect(
        cls,
        endpoints: Sequence[str],
        *,
        prefix: str = "",
        timeout_s: float = 5.0,
        watch_buffer: int = 1024,
    ) -> EtcdStore:
        """Opens the store on the first of `endpoints` ("host:port" or "http://host:port") that
        answers a read within `timeout_s`, waiting for an etcd that is still starting.

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
        targets = [_target(endpoint) for endpoint in endpoints]
        failures: list[str] = []
        for endpoint, target in zip(endpoints, targets, strict=True):
            channel = grpc.insecure_channel(target, options=_CHANNEL_OPTIONS)
            store = cls(
                channel, endpoint, prefix=prefix, timeout_s=timeout_s, watch_buffer=watch_buffer
            )
            start, _ = store._range("")
            probe = etcdrpc.RangeRequest(key=start, limit=1, keys_only=True)
            try:
                await store._call(store._kv.Range, probe, wait_for_ready=True)
            except MetadataError as exc:
                failures.append(str(exc))
            except BaseException:
                await store.aclose()  # cancelled while waiting for this endpoint
                raise
            else:
                return store
            await store.aclose()
        raise EtcdUnavailable("cannot use etcd: " + "; ".join(failures))

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
        response = await self._call(self._kv.Range, etcdrpc.RangeRequest(key=self._key(key)))
        return self._key_value(response.kvs[0]) if response.kvs else None

    async def scan(self, prefix: str) -> list[KeyValue]:
        start, end = self._range(prefix)
        # etcd returns a range in key byte order, which for UTF-8 is str order.
        response = await self._call(self._kv.Range, etcdrpc.RangeRequest(key=start, range_end=end))
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
        create = etcdrpc.WatchCreateRequest(key=start, range_end=end, prev_kv=True)
        if start_revision is not None:
            create.start_revision = start_revision + 1  # etcd's start is inclusive, ours is not
        watch = _Watch(self, prefix, etcdrpc.WatchRequest(create_request=create))
        self._watches.add(watch)
        try:
            with trio.move_on_after(self._timeout_s):
                await watch.settled.wait()
            if not watch.created:
                self._ensure_open()
                raise watch.error or EtcdUnavailable(
                    f"etcd at {self._endpoint} did not confirm a watch on {prefix!r} within "
                    f"{self._timeout_s} s"
                )
            yield _WatchStream(watch)
        finally:
            self._watches.discard(watch)
            watch.end(None)
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(watch.thread.join)

    # -- writes -------------------------------------------------------------------------------

    async def put(self, key: str, value: JSONValue, lease: int | None = None) -> int:
        request = self._put_request(Put(key, value, lease))
        response = await self._call(self._kv.Put, request)
        revision: int = response.header.revision
        return revision

    async def delete(self, key: str) -> bool:
        request = etcdrpc.DeleteRangeRequest(key=self._key(key))
        response = await self._call(self._kv.DeleteRange, request)
        return bool(response.deleted)

    async def delete_prefix(self, prefix: str) -> int:
        start, end = self._range(prefix)
        request = etcdrpc.DeleteRangeRequest(key=start, range_end=end)
        response = await self._call(self._kv.DeleteRange, request)
        deleted: int = response.deleted
        return deleted

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        request = etcdrpc.TxnRequest(
            compare=[self._compare(compare) for compare in compares],
            success=[self._request_op(op) for op in success],
            failure=[self._request_op(op) for op in failure],
        )
        response = await self._call(self._kv.Txn, request)
        executed = success if response.succeeded else failure
        return TxnResult(
            succeeded=response.succeeded,
            revision=response.header.revision,
            responses=tuple(
                self._op_result(op, result)
                for op, result in zip(executed, response.responses, strict=True)
            ),
        )

    # -- leases -------------------------------------------------------------------------------

    async def grant_lease(self, ttl_s: float) -> int:
        if ttl_s <= 0:
            raise ValueError(f"a lease needs a positive TTL, got {ttl_s}")
        request = etcdrpc.LeaseGrantRequest(TTL=math.ceil(ttl_s))
        response = await self._call(self._lease.LeaseGrant, request)
        lease_id: int = response.ID
        return lease_id

    async def keepalive(self, lease_id: int) -> None:
        request = etcdrpc.LeaseKeepAliveRequest(ID=lease_id)
        responses = await self._call(self._keepalive_once, request)
        # etcd answers a renewal of a lease it does not know (any more) with TTL 0.
        if not responses or responses[0].TTL <= 0:
            raise LeaseNotFound(f"lease {lease_id} does not exist (expired or revoked?)")

    def _keepalive_once(self, request: Any, *, timeout: float, wait_for_ready: bool) -> list[Any]:
        # One renewal on a stream of its own: the stream ends once etcd answered the request.
        stream = self._lease.LeaseKeepAlive(
            iter([request]), timeout=timeout, wait_for_ready=wait_for_ready
        )
        return list(stream)

    async def revoke(self, lease_id: int) -> None:
        request = etcdrpc.LeaseRevokeRequest(ID=lease_id)
        try:
            await self._call(self._lease.LeaseRevoke, request)
        except LeaseNotFound:
            raise LeaseNotFound(f"lease {lease_id} does not exist (expired or revoked?)") from None

    # -- lifecycle ----------------------------------------------------------------------------

    async def aclose(self) -> None:
        # Shielded, so a store whose owner is being cancelled still ends its watchers and
        # releases the channel.
        with trio.CancelScope(shield=True):
            if self._closed:
                return
            self._closed = True
            for watch in list(self._watches):
                watch.end(None)
            await trio.to_thread.run_sync(self._channel.close)

    # -- internals ----------------------------------------------------------------------------

    def _ensure_open(self) -> None:
        if self._closed:
            raise StoreClosed("the metadata store is closed")

    async def _call(
        self, method: Callable[..., T], request: Any, *, wait_for_ready: bool = False
    ) -> T:
        """Runs one blocking gRPC call in a worker thread, with etcd's errors translated.

        Without `wait_for_ready`, a call fails at once while the channel cannot connect,
        instead of waiting out the timeout. A cancelled caller still waits for its call (at
        most `timeout_s`) rather than abandoning it: an abandoned write could land after the
        same caller's next one.
        """
        self._ensure_open()
        call = functools.partial(
            method, request, timeout=self._timeout_s, wait_for_ready=wait_for_ready
        )
        try:
            return await trio.to_thread.run_sync(call)
        except grpc.RpcError as exc:
            raise self._error(exc) from None
        except ValueError:
            # gRPC's answer to a call that started on a channel `aclose` just closed.
            if self._closed:
                raise StoreClosed("the metadata store is closed") from None
            raise

    def _error(self, exc: grpc.RpcError) -> Exception:
        code, details = _status(exc)
        if self._closed:
            return StoreClosed("the metadata store is closed")
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            what = (
                "is unavailable"
                if code == grpc.StatusCode.UNAVAILABLE
                else f"did not answer within {self._timeout_s} s"
            )
            return EtcdUnavailable(
                f"etcd at {self._endpoint} {what} ({code.name}: {details}); is it running, "
                f"and is {self._endpoint} its client URL?"
            )
        if code == grpc.StatusCode.NOT_FOUND and "lease" in details:
            return LeaseNotFound(f"{details} (expired or revoked?)")
        if code == grpc.StatusCode.OUT_OF_RANGE and "compacted" in details:
            return CompactedError(details)
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            # Duplicate keys in a transaction branch, an empty key: the caller's mistake, as
            # the other backends report it.
            return ValueError(f"etcd rejected the request: {details}")
        name = "unknown status" if code is None else code.name
        return MetadataError(f"etcd at {self._endpoint} failed: {name}: {details}")

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

    def _key_value(self, kv: Any) -> KeyValue:
        return KeyValue(
            key=self._user_key(kv.key),
            value=self._decode(kv.key, kv.value),
            create_revision=kv.create_revision,
            mod_revision=kv.mod_revision,
            version=kv.version,
            lease=kv.lease or None,
        )

    def _watch_event(self, event: Any) -> WatchEvent:
        kv = event.kv
        prev_value = (
            self._decode(kv.key, event.prev_kv.value) if event.HasField("prev_kv") else None
        )
        if event.type == kv_pb2.Event.DELETE:
            return WatchEvent("delete", self._user_key(kv.key), None, kv.mod_revision, prev_value)
        return WatchEvent(
            "put",
            self._user_key(kv.key),
            self._decode(kv.key, kv.value),
            kv.mod_revision,
            prev_value,
        )

    def _compare(self, compare: Compare) -> Any:
        message = etcdrpc.Compare(
            key=self._key(compare.key),
            target=_COMPARE_TARGETS[compare.target],
            result=_COMPARE_RESULTS[compare.op],
        )
        if compare.target == "value":
            message.value = encode_value(compare.operand).encode()
        else:
            setattr(message, compare.target, compare.operand)
        return message

    def _put_request(self, op: Put) -> Any:
        # prev_kv, so that a Put in a transaction can report the value it replaced.
        return etcdrpc.PutRequest(
            key=self._key(op.key),
            value=encode_value(op.value).encode(),
            lease=op.lease or 0,
            prev_kv=True,
        )

    def _request_op(self, op: Op) -> Any:
        if isinstance(op, Put):
            return etcdrpc.RequestOp(request_put=self._put_request(op))
        if isinstance(op, Delete):
            return etcdrpc.RequestOp(
                request_delete_range=etcdrpc.DeleteRangeRequest(key=self._key(op.key))
            )
        if isinstance(op, DeletePrefix):
            start, end = self._range(op.prefix)
            return etcdrpc.RequestOp(
                request_delete_range=etcdrpc.DeleteRangeRequest(key=start, range_end=end)
            )
        return etcdrpc.RequestOp(request_range=etcdrpc.RangeRequest(key=self._key(op.key)))

    def _op_result(self, op: Op, result: Any) -> Any:
        """One entry of TxnResult.responses, in the shape TxnResult documents."""
        if isinstance(op, Put):
            put = result.response_put
            return self._key_value(put.prev_kv) if put.HasField("prev_kv") else None
        if isinstance(op, Delete):
            return bool(result.response_delete_range.deleted)
        if isinstance(op, DeletePrefix):
            deleted: int = result.response_delete_range.deleted
            return deleted
        assert isinstance(op, Get)
        kvs = result.response_range.kvs
        return self._key_value(kvs[0]) if kvs else None


class _Watch:
    """One etcd watch stream, drained by its own thread into a trio channel.

    The thread blocks on the gRPC stream and hands each response to trio with
    `trio.from_thread.run_sync`, one at a time, so events keep etcd's order and are only ever
    touched in trio. A response is taken whole, because etcd packs up to 1000 revisions into
    one when it replays history and the consumer cannot read in the middle of it; a response
    that arrives while `watch_buffer` events are still unread ends the watch with
    CompactedError instead, after the consumer has read those.
    """

    def __init__(self, store: EtcdStore, prefix: str, request: Any) -> None:
        self.store = store
        self.prefix = prefix
        # Bounded by the check in `_deliver`, not by the channel (see above).
        self.send, self.receive = trio.open_memory_channel[WatchEvent](math.inf)
        # Set once etcd confirmed the watch or it ended, whichever came first.
        self.settled = trio.Event()
        self.created = False
        self.ended = False
        # Raised to the consumer once the buffered events are drained; None ends iteration.
        self.error: Exception | None = None
        # Creating the call does not block: gRPC starts it in the background. The request
        # stream ends after the create request, which etcd takes as "no more requests", not as
        # the end of the watch.
        self.call: Any = store._watch_stub.Watch(iter([request]))
        self.thread = threading.Thread(
            target=self._pump,
            args=(trio.lowlevel.current_trio_token(),),
            name=f"etcd-watch {prefix}",
            daemon=True,
        )
        self.thread.start()

    def end(self, error: Exception | None) -> None:
        if self.ended:
            return
        self.ended = True
        self.error = error
        self.send.close()
        self.settled.set()
        self.call.cancel()

    def _pump(self, token: trio.lowlevel.TrioToken) -> None:
        try:
            try:
                for response in self.call:
                    if not trio.from_thread.run_sync(self._deliver, response, trio_token=token):
                        return
            except grpc.RpcError as exc:
                trio.from_thread.run_sync(self._fail, exc, trio_token=token)
        except trio.RunFinishedError:
            self.call.cancel()  # the trio run that owned this watch is over

    def _fail(self, exc: grpc.RpcError) -> None:
        # After `end` the stream fails with CANCELLED, which nobody needs to hear about.
        if not self.ended:
            self.end(self.store._error(exc))

    def _deliver(self, response: Any) -> bool:
        """Takes one watch response in trio; returns whether to keep reading the stream."""
        if self.ended:
            return False
        if response.compact_revision:
            self.end(
                CompactedError(
                    f"watch on {self.prefix!r}: etcd compacted its history up to revision "
                    f"{response.compact_revision}; re-read the keys and watch from the current "
                    "revision"
                )
            )
            return False
        if response.canceled:
            reason = response.cancel_reason or "no reason given"
            self.end(MetadataError(f"etcd cancelled the watch on {self.prefix!r}: {reason}"))
            return False
        if response.created:
            self.created = True
            self.settled.set()
        if not response.events:
            return True
        if self.send.statistics().current_buffer_used >= self.store._watch_buffer:
            self.end(
                CompactedError(
                    f"watch on {self.prefix!r} fell more than {self.store._watch_buffer} events "
                    f"behind; changes from revision {response.events[0].kv.mod_revision} on "
                    "were dropped"
                )
            )
            return False
        try:
            events = [self.store._watch_event(event) for event in response.events]
        except MetadataCorrupted as exc:
            self.end(exc)
            return False
        for event in events:
            self.send.send_nowait(event)
        return True


class _WatchStream(AsyncIterator[WatchEvent]):
    def __init__(self, watch: _Watch) -> None:
        self._watch = watch

    async def __anext__(self) -> WatchEvent:
        try:
            return await self._watch.receive.receive()
        except trio.EndOfChannel:
            if self._watch.error is not None:
                raise self._watch.error from None
            raise StopAsyncIteration from None


def _status(exc: grpc.RpcError) -> tuple[grpc.StatusCode | None, str]:
    # The errors gRPC raises are also its Call objects; the RpcError base has neither method.
    code = exc.code() if callable(getattr(exc, "code", None)) else None
    details = exc.details() if callable(getattr(exc, "details", None)) else None
    return code, details or str(exc)


def _target(endpoint: str) -> str:
    """The gRPC target of an endpoint given as "host:port" or "http://host:port"."""
    scheme, separator, address = endpoint.rpartition("://")
    if separator and scheme != "http":
        raise ValueError(f"etcd endpoint {endpoint!r}: only plain http endpoints are supported")
    address = address.rstrip("/")
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"etcd endpoint {endpoint!r} is not host:port")
    return address
