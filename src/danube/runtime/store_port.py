"""The production port of the metadata-store effects (`StoreRead`, `StoreList`,
`StoreTxn`); flows run on it with `danube.effects.flow.drive`.

The port adds what production has and the flows must not know: the request timeout, the
ownership claims that fence a broker's writes, and the store's own error types, turned into
the vocabulary's (`StoreUnreachable`, `Outcome.UNKNOWN`). The read-back after a transaction
that did not commit is done here, once, for every machine."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import trio

from danube.effects import (
    LeaseGone,
    LeaseGrant,
    LeaseRenew,
    Outcome,
    ReadManyAnswer,
    StoreList,
    StoreRead,
    StoreReadMany,
    StoreTxn,
    StoreTxns,
    StoreUnreachable,
    TxnAnswer,
)
from danube.machines.cluster.ownership import fence_compares
from danube.metadata import KeyValue, LeaseNotFound, MetadataError, MetadataStore
from danube.runtime.watching import REQUEST_TIMEOUT_S

STORE_EFFECTS = (
    StoreRead,
    StoreList,
    StoreTxn,
    LeaseGrant,
    LeaseRenew,
    StoreReadMany,
    StoreTxns,
)
StoreEffect = StoreRead | StoreList | StoreTxn | LeaseGrant | LeaseRenew | StoreReadMany | StoreTxns


async def perform_store(
    store: MetadataStore, effect: StoreEffect, claims: Mapping[str, int] | None = None
) -> Any:
    """Carries out one store effect with the request timeout; raises `StoreUnreachable`
    for a request the store did not answer, `LeaseGone` for a lease it does not know,
    `danube.machines.cluster.ownership.NotOwner` for a fenced write this broker holds no claim
    for."""
    if isinstance(effect, StoreTxn):
        return await _transact(store, effect, claims)
    if isinstance(effect, StoreTxns):
        return await perform_txns(store, effect.txns)
    try:
        with trio.fail_after(REQUEST_TIMEOUT_S):
            if isinstance(effect, StoreRead):
                return await store.get(effect.key)
            if isinstance(effect, StoreList):
                return await store.scan(effect.prefix)
            if isinstance(effect, StoreReadMany):
                return await _read_many(store, effect)
            if isinstance(effect, LeaseGrant):
                return await store.grant_lease(effect.ttl_s)
            await store.keepalive(effect.lease_id)
            return None
    except LeaseNotFound as error:
        raise LeaseGone(str(error)) from error
    except (MetadataError, trio.TooSlowError) as error:
        raise StoreUnreachable(f"{type(error).__name__}: {error}") from error


async def _read_many(store: MetadataStore, effect: StoreReadMany) -> ReadManyAnswer:
    """One request on a store that has `read_many` (etcd); else each read, one after the
    other (the in-process stores answer at once)."""
    many = getattr(store, "read_many", None)
    if many is not None:
        found, scanned = await many(effect.keys, effect.prefixes)
        return ReadManyAnswer(found, scanned)
    found = {key: await store.get(key) for key in effect.keys}
    scanned = {prefix: await store.scan(prefix) for prefix in effect.prefixes}
    return ReadManyAnswer(found, scanned)


async def _transact(
    store: MetadataStore, effect: StoreTxn, claims: Mapping[str, int] | None
) -> TxnAnswer:
    if effect.claims is not None and claims is not None:  # the claims it was decided under
        claims = dict(effect.claims)
    compares = [*effect.compares, *fence_compares(effect.fenced, claims)]
    try:
        with trio.fail_after(REQUEST_TIMEOUT_S):
            result = await store.txn(compares, list(effect.ops))
    except (MetadataError, trio.TooSlowError):
        outcome = Outcome.UNKNOWN
    else:
        if result.succeeded:
            return TxnAnswer(Outcome.COMMITTED, revision=result.revision)
        outcome = Outcome.REFUSED
    found: dict[str, KeyValue | None] = {}
    for key in effect.read_back:
        try:
            with trio.fail_after(REQUEST_TIMEOUT_S):
                found[key] = await store.get(key)
        except (MetadataError, trio.TooSlowError):
            break  # the store is gone: the flow sees the key as not read
    return TxnAnswer(outcome, found)


async def perform_txns(store: MetadataStore, effects: Sequence[StoreTxn]) -> list[TxnAnswer]:
    """Carries out several independent, unfenced transactions (the load manager's decisions),
    answers in order. On a store that has `txn_many` (etcd) they go as one request, each
    with its own compares and outcome: a dead broker's hundreds of failovers cost a few etcd
    writes instead of one each (issue 23). Elsewhere, or for effects that need the fence or a
    read-back, or if etcd refuses the batch as a whole, each goes on its own, together."""
    many = getattr(store, "txn_many", None)
    if len(effects) > 1 and many is not None and not any(e.fenced or e.read_back for e in effects):
        try:
            with trio.fail_after(REQUEST_TIMEOUT_S):
                results = await many([(e.compares, e.ops) for e in effects])
        except (MetadataError, trio.TooSlowError):
            return [TxnAnswer(Outcome.UNKNOWN) for _ in effects]
        except ValueError:
            pass  # refused as a whole (two writes of one key?): each on its own below
        else:
            return [
                TxnAnswer(Outcome.COMMITTED, revision=result.revision)
                if result.succeeded
                else TxnAnswer(Outcome.REFUSED)
                for result in results
            ]
    answers: list[TxnAnswer] = [TxnAnswer(Outcome.UNKNOWN)] * len(effects)

    async def one(index: int) -> None:
        answers[index] = await _transact(store, effects[index], None)

    async with trio.open_nursery() as nursery:
        for index in range(len(effects)):
            nursery.start_soon(one, index)
    return answers
