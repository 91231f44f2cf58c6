"""The production port of the metadata-store effects (`StoreRead`, `StoreList`,
`StoreTxn`); flows run on it with `danube.effects.flow.drive`.

The port adds what production has and the flows must not know: the request timeout, the
ownership claims that fence a broker's writes, and the store's own error types, turned into
the vocabulary's (`StoreUnreachable`, `Outcome.UNKNOWN`). The read-back after a transaction
that did not commit is done here, once, for every machine."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import trio

from danube.effects import (
    LeaseGone,
    LeaseGrant,
    LeaseRenew,
    Outcome,
    StoreList,
    StoreRead,
    StoreTxn,
    StoreUnreachable,
    TxnAnswer,
)
from danube.machines.cluster.ownership import fence_compares
from danube.metadata import KeyValue, LeaseNotFound, MetadataError, MetadataStore
from danube.runtime.watching import REQUEST_TIMEOUT_S

STORE_EFFECTS = (StoreRead, StoreList, StoreTxn, LeaseGrant, LeaseRenew)
StoreEffect = StoreRead | StoreList | StoreTxn | LeaseGrant | LeaseRenew


async def perform_store(
    store: MetadataStore, effect: StoreEffect, claims: Mapping[str, int] | None = None
) -> Any:
    """Carries out one store effect with the request timeout; raises `StoreUnreachable`
    for a request the store did not answer, `LeaseGone` for a lease it does not know,
    `danube.machines.cluster.ownership.NotOwner` for a fenced write this broker holds no claim
    for."""
    if isinstance(effect, StoreTxn):
        return await _transact(store, effect, claims)
    try:
        with trio.fail_after(REQUEST_TIMEOUT_S):
            if isinstance(effect, StoreRead):
                return await store.get(effect.key)
            if isinstance(effect, StoreList):
                return await store.scan(effect.prefix)
            if isinstance(effect, LeaseGrant):
                return await store.grant_lease(effect.ttl_s)
            await store.keepalive(effect.lease_id)
            return None
    except LeaseNotFound as error:
        raise LeaseGone(str(error)) from error
    except (MetadataError, trio.TooSlowError) as error:
        raise StoreUnreachable(f"{type(error).__name__}: {error}") from error


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
