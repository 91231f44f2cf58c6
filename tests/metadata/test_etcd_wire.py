"""The hand codec of the etcd client (danube.metadata.etcd.wire) against the types betterproto
generates from proto/etcd_*.proto: every encoder writes what betterproto writes for the same
message, and every decoder reads what betterproto writes."""

from __future__ import annotations

import betterproto
import pytest
from hypothesis import given
from hypothesis import strategies as st

from danube.metadata.etcd import wire
from danube.proto import etcdserverpb as pb
from danube.proto import mvccpb

keys = st.binary(max_size=12)
int64s = st.integers(min_value=-(2**63), max_value=2**63 - 1)
revisions = st.integers(min_value=0, max_value=2**63 - 1)


@st.composite
def key_values(draw: st.DrawFn) -> mvccpb.KeyValue:
    return mvccpb.KeyValue(
        key=draw(keys),
        create_revision=draw(revisions),
        mod_revision=draw(revisions),
        version=draw(revisions),
        value=draw(st.binary(max_size=20)),
        lease=draw(int64s),
    )


def same_kv(hand: wire.KeyValue | None, generated: mvccpb.KeyValue) -> bool:
    assert hand is not None
    return (
        hand.key,
        hand.create_revision,
        hand.mod_revision,
        hand.version,
        hand.value,
        hand.lease,
    ) == (
        generated.key,
        generated.create_revision,
        generated.mod_revision,
        generated.version,
        generated.value,
        generated.lease,
    )


def header(revision: int) -> pb.ResponseHeader:
    return pb.ResponseHeader(cluster_id=7, member_id=9, revision=revision, raft_term=3)


# -- encoders -----------------------------------------------------------------------------------


@given(keys, keys, st.integers(min_value=0, max_value=2**40), st.booleans())
def test_range_request(key: bytes, end: bytes, limit: int, keys_only: bool) -> None:
    generated = pb.RangeRequest(key=key, range_end=end, limit=limit, keys_only=keys_only)
    hand = wire.range_request(key, end, limit=limit, keys_only=keys_only)
    assert hand == bytes(generated)


@given(keys, st.binary(max_size=20), int64s, st.booleans())
def test_put_and_delete_requests(key: bytes, value: bytes, lease: int, prev_kv: bool) -> None:
    put = pb.PutRequest(key=key, value=value, lease=lease, prev_kv=prev_kv)
    assert wire.put_request(key, value, lease, prev_kv=prev_kv) == bytes(put)
    delete = pb.DeleteRangeRequest(key=key, range_end=value)
    assert wire.delete_range_request(key, value) == bytes(delete)


@given(
    st.sampled_from(list(pb.CompareCompareResult)),
    keys,
    st.sampled_from(sorted(wire.COMPARE_FIELDS)),
    int64s,
    st.binary(max_size=10),
)
def test_compare_sends_the_selected_member_even_at_its_default(
    result: pb.CompareCompareResult, key: bytes, member: str, number: int, value: bytes
) -> None:
    operand: int | bytes = value if member == "value" else number
    target = {
        "value": pb.CompareCompareTarget.VALUE,
        "version": pb.CompareCompareTarget.VERSION,
        "create_revision": pb.CompareCompareTarget.CREATE,
        "mod_revision": pb.CompareCompareTarget.MOD,
    }[member]
    generated = pb.Compare(result=result, target=target, key=key)
    setattr(generated, member, operand)
    hand = wire.compare(int(result), int(target), key, member, operand)
    assert hand == bytes(generated)
    assert betterproto.which_one_of(pb.Compare().parse(hand), "target_union") == (member, operand)


@given(st.lists(keys, max_size=3), st.lists(keys, max_size=3), st.lists(keys, max_size=3))
def test_txn_request(compares: list[bytes], puts: list[bytes], deletes: list[bytes]) -> None:
    generated = pb.TxnRequest(
        compare=[pb.Compare(key=k, version=0) for k in compares],
        success=[pb.RequestOp(request_put=pb.PutRequest(key=k, value=b"1")) for k in puts],
        failure=[pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=k)) for k in deletes]
        + [pb.RequestOp(request_range=pb.RangeRequest(key=k)) for k in deletes],
    )
    hand = wire.txn_request(
        [wire.compare(0, 0, k, "version", 0) for k in compares],
        [
            wire.request_op(wire.REQUEST_PUT, wire.put_request(k, b"1", 0, prev_kv=False))
            for k in puts
        ],
        [wire.request_op(wire.REQUEST_DELETE_RANGE, wire.delete_range_request(k)) for k in deletes]
        + [wire.request_op(wire.REQUEST_RANGE, wire.range_request(k)) for k in deletes],
    )
    assert hand == bytes(generated)


@given(st.lists(st.tuples(st.lists(keys, max_size=2), st.lists(keys, max_size=2)), max_size=3))
def test_nested_txn_request(txns: list[tuple[list[bytes], list[bytes]]]) -> None:
    """`EtcdStore.txn_many`'s request: one outer transaction whose success ops are whole
    transactions (RequestOp.request_txn)."""
    generated = pb.TxnRequest(
        success=[
            pb.RequestOp(
                request_txn=pb.TxnRequest(
                    compare=[pb.Compare(key=k, version=0) for k in compares],
                    success=[
                        pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=k))
                        for k in deletes
                    ],
                )
            )
            for compares, deletes in txns
        ]
    )
    hand = wire.txn_request(
        [],
        [
            wire.request_op(
                wire.REQUEST_TXN,
                wire.txn_request(
                    [wire.compare(0, 0, k, "version", 0) for k in compares],
                    [
                        wire.request_op(wire.REQUEST_DELETE_RANGE, wire.delete_range_request(k))
                        for k in deletes
                    ],
                    [],
                ),
            )
            for compares, deletes in txns
        ],
        [],
    )
    assert hand == bytes(generated)


@given(revisions, st.lists(st.booleans(), max_size=4), st.integers(min_value=0, max_value=9))
def test_nested_txn_reply(revision: int, outcomes: list[bool], deleted: int) -> None:
    inner = [
        pb.TxnResponse(
            header=header(revision),
            succeeded=ok,
            responses=[
                pb.ResponseOp(
                    response_delete_range=pb.DeleteRangeResponse(
                        header=header(revision), deleted=deleted
                    )
                )
            ]
            if ok
            else [],
        )
        for ok in outcomes
    ]
    outer = pb.TxnResponse(
        header=header(revision),
        succeeded=True,
        responses=[pb.ResponseOp(response_txn=t) for t in inner],
    )
    reply = wire.TxnReply.FromString(bytes(outer))
    assert reply.revision == revision and reply.succeeded
    assert [isinstance(r, wire.TxnReply) and r.succeeded for r in reply.responses] == outcomes
    for nested, ok in zip(reply.responses, outcomes, strict=True):
        assert isinstance(nested, wire.TxnReply)
        if ok:
            (only,) = nested.responses
            assert isinstance(only, wire.DeleteRangeReply) and only.deleted == deleted
        else:
            assert nested.responses == []


@given(keys, keys, revisions)
def test_watch_create_request(key: bytes, end: bytes, start: int) -> None:
    create = pb.WatchCreateRequest(key=key, range_end=end, start_revision=start, prev_kv=True)
    generated = pb.WatchRequest(create_request=create)
    assert wire.watch_create_request(key, end, start) == bytes(generated)


# -- decoders -----------------------------------------------------------------------------------


@given(revisions, st.lists(key_values(), max_size=4))
def test_range_reply(revision: int, kvs: list[mvccpb.KeyValue]) -> None:
    data = bytes(pb.RangeResponse(header=header(revision), kvs=kvs, more=True, count=len(kvs)))
    reply = wire.RangeReply.FromString(data)
    assert reply.revision == revision
    assert len(reply.kvs) == len(kvs)
    assert all(same_kv(h, g) for h, g in zip(reply.kvs, kvs, strict=True))


@given(revisions, st.none() | key_values(), st.integers(min_value=0, max_value=2**40))
def test_put_txn_and_delete_replies(
    revision: int, prev: mvccpb.KeyValue | None, deleted: int
) -> None:
    put = pb.PutResponse(header=header(revision))
    if prev is not None:
        put.prev_kv = prev
    delete = pb.DeleteRangeResponse(header=header(revision), deleted=deleted)
    got = pb.RangeResponse(header=header(revision), kvs=[] if prev is None else [prev])
    txn = pb.TxnResponse(
        header=header(revision),
        succeeded=True,
        responses=[
            pb.ResponseOp(response_put=put),
            pb.ResponseOp(response_delete_range=delete),
            pb.ResponseOp(response_range=got),
        ],
    )
    reply = wire.TxnReply.FromString(bytes(txn))
    assert (reply.revision, reply.succeeded, len(reply.responses)) == (revision, True, 3)
    hand_put, hand_delete, hand_range = reply.responses
    assert isinstance(hand_put, wire.PutReply) and hand_put.revision == revision
    if prev is None:
        assert hand_put.prev_kv is None
    else:
        assert same_kv(hand_put.prev_kv, prev)
    assert isinstance(hand_delete, wire.DeleteRangeReply) and hand_delete.deleted == deleted
    assert isinstance(hand_range, wire.RangeReply) and len(hand_range.kvs) == len(got.kvs)
    assert wire.PutReply.FromString(bytes(put)).revision == revision
    assert wire.DeleteRangeReply.FromString(bytes(delete)).deleted == deleted


@given(
    st.booleans(),
    st.booleans(),
    revisions,
    st.text(max_size=10),
    st.lists(st.tuples(st.booleans(), key_values(), st.none() | key_values()), max_size=3),
)
def test_watch_reply(
    created: bool,
    canceled: bool,
    compact: int,
    reason: str,
    events: list[tuple[bool, mvccpb.KeyValue, mvccpb.KeyValue | None]],
) -> None:
    generated = pb.WatchResponse(
        header=header(5),
        watch_id=3,
        created=created,
        canceled=canceled,
        compact_revision=compact,
        cancel_reason=reason,
        events=[
            mvccpb.Event(
                type=mvccpb.EventEventType.DELETE if delete else mvccpb.EventEventType.PUT,
                kv=kv,
                **({} if prev is None else {"prev_kv": prev}),
            )
            for delete, kv, prev in events
        ],
    )
    reply = wire.WatchReply.FromString(bytes(generated))
    assert (reply.created, reply.canceled, reply.compact_revision, reply.cancel_reason) == (
        created,
        canceled,
        compact,
        reason,
    )
    assert len(reply.events) == len(events)
    for hand, (delete, kv, prev) in zip(reply.events, events, strict=True):
        assert hand.delete == delete and same_kv(hand.kv, kv)
        assert (hand.prev_kv is None) == (prev is None)
        if prev is not None:
            assert same_kv(hand.prev_kv, prev)


def test_a_reply_that_is_not_protobuf_is_a_wire_error() -> None:
    for data in (b"\x0a\x05ab", b"\x08\xff", b"\x0b"):
        with pytest.raises(wire.WireError):
            wire.RangeReply.FromString(data)
