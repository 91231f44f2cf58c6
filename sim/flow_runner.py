"""The simulator's driver of flows (`danube.effects.flow`) and its port of the metadata-store
effects: each store request is one request of a broker process to the simulated etcd (with
its latency, stalls, faults and the drivers' timeout, `BrokerProcess.call`), so a flow runs
here exactly as it runs in a broker, only on simulated time.

What a store effect is answered with follows `danube.runtime.store_port`: a read that gets no
answer throws `StoreUnreachable`; a transaction that gets none is `Outcome.UNKNOWN`; after
any transaction that did not commit, the keys of `read_back` are read, one request each."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

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
from danube.effects.flow import Finished, Flow, step
from danube.machines.cluster.ownership import NotOwner, fence_compares
from danube.metadata import KeyValue, LeaseNotFound
from sim.etcd import Origin, SimEtcd, failed

_STORE_EFFECTS = (StoreTxn, StoreRead, StoreList, LeaseGrant, LeaseRenew, StoreReadMany, StoreTxns)

Answer = Callable[..., None]
"""`answer(value)` or `answer(error=exception)`: what a handler calls, once."""


class StoreHost(Protocol):
    name: str
    etcd: SimEtcd

    def call(self, what: str, run: Callable[[], Any], done: Callable[[Any], None]) -> None: ...


def run_flow(
    host: StoreHost,
    flow: Flow[Any],
    handle: Callable[[Any, Answer], None],
    done: Callable[[Finished], None],
    claims: Mapping[str, int] | None = None,
) -> None:
    """Runs `flow`: store effects go to the simulated etcd; any other request goes to
    `handle(request, answer)`. `done` gets the flow's end."""
    _FlowRun(host, flow, handle, done, claims).advance(step(flow))


class _FlowRun:
    """One flow of `run_flow`. An object with methods rather than closures that call each
    other: those are reference cycles, which only the cyclic collector frees."""

    __slots__ = ("claims", "done", "flow", "handle", "host")

    def __init__(
        self,
        host: StoreHost,
        flow: Flow[Any],
        handle: Callable[[Any, Answer], None],
        done: Callable[[Finished], None],
        claims: Mapping[str, int] | None,
    ) -> None:
        self.host = host
        self.flow = flow
        self.handle = handle
        self.done = done
        self.claims = claims

    def advance(self, request: Any) -> None:
        if isinstance(request, Finished):
            self.done(request)
            return
        if isinstance(request, _STORE_EFFECTS):
            perform_store(self.host, request, self.answer, self.claims)
        else:
            self.handle(request, self.answer)

    def answer(self, value: Any = None, *, error: BaseException | None = None) -> None:
        if error is not None:
            self.advance(step(self.flow, error=error))
        else:
            self.advance(step(self.flow, answer=value))


def perform_store(
    host: StoreHost,
    effect: StoreTxn | StoreRead | StoreList | LeaseGrant | LeaseRenew,
    answer: Answer,
    claims: Mapping[str, int] | None = None,
) -> None:
    etcd = host.etcd
    if isinstance(effect, StoreReadMany):
        many = effect

        def read_all() -> Any:
            found = {key: etcd.get(key) for key in many.keys}
            scanned = {prefix: etcd.scan(prefix) for prefix in many.prefixes}
            for result in (*found.values(), *scanned.values()):
                if failed(result):
                    return result
            return ReadManyAnswer(found, scanned)

        what = f"read {len(many.keys)} keys, {len(many.prefixes)} prefixes"
        host.call(what, read_all, lambda got: _read(got, answer))
        return
    if isinstance(effect, StoreTxns):
        _transact_many(host, list(effect.txns), answer)
        return
    if isinstance(effect, StoreRead):
        key = effect.key
        host.call(f"read {key}", lambda: etcd.get(key), lambda got: _read(got, answer))
        return
    if isinstance(effect, StoreList):
        prefix = effect.prefix
        host.call(f"scan {prefix}", lambda: etcd.scan(prefix), lambda got: _read(got, answer))
        return
    if isinstance(effect, LeaseGrant):
        ttl = effect.ttl_s
        host.call("grant lease", lambda: etcd.grant(ttl), lambda got: _read(got, answer))
        return
    if isinstance(effect, LeaseRenew):
        lease = effect.lease_id

        def renewed(result: Any) -> None:
            if isinstance(result, LeaseNotFound):
                answer(error=LeaseGone(str(result)))
            else:
                _read(None if not failed(result) else result, answer)

        host.call(f"renew lease {lease}", lambda: etcd.keepalive(lease), renewed)
        return
    if effect.claims is not None and claims is not None:  # the claims it was decided under
        claims = dict(effect.claims)
    try:
        fence = fence_compares(effect.fenced, claims)
    except NotOwner as error:
        answer(error=error)
        return
    compares, ops = (*effect.compares, *fence), effect.ops
    kind = effect.purpose.split(" ", 1)[0] if effect.purpose else "txn"
    origin = Origin(host.name, kind)

    def transacted(result: Any) -> None:
        if not failed(result) and result.succeeded:
            answer(TxnAnswer(Outcome.COMMITTED, revision=result.revision))
            return
        outcome = Outcome.UNKNOWN if failed(result) else Outcome.REFUSED
        _read_back(host, list(effect.read_back), {}, outcome, answer)

    host.call(effect.purpose or "txn", lambda: etcd.txn(compares, ops, origin), transacted)


def _transact_many(host: StoreHost, txns: list[StoreTxn], answer: Answer) -> None:
    """`StoreTxns`: one request of nested transactions, as the production port sends it
    (`perform_txns`); a batch etcd would refuse as a whole fails the run
    (`cluster_slots.refusal`)."""
    from sim.cluster_slots import RefusedBatch, refusal  # cluster_slots imports this module

    why = refusal(txns)
    if why is not None:
        raise RefusedBatch(f"broker {host.name} sent a batch etcd refuses: {why}")
    etcd, name = host.etcd, host.name

    def run() -> Any:
        results = []
        for txn in txns:
            kind = txn.purpose.split(" ", 1)[0] if txn.purpose else "txn"
            result = etcd.txn(txn.compares, txn.ops, Origin(name, kind))
            if failed(result):
                return result
            results.append(result)
        return results

    def done(results: Any) -> None:
        if failed(results):
            answer([TxnAnswer(Outcome.UNKNOWN) for _ in txns])
            return
        answer(
            [
                TxnAnswer(Outcome.COMMITTED, revision=r.revision)
                if r.succeeded
                else TxnAnswer(Outcome.REFUSED)
                for r in results
            ]
        )

    host.call(f"{len(txns)} transactions", run, done)


def _read(result: Any, answer: Answer) -> None:
    if failed(result):
        answer(error=StoreUnreachable(str(result)))
    else:
        answer(result)


def _read_back(
    host: StoreHost,
    keys: list[str],
    found: dict[str, KeyValue | None],
    outcome: Outcome,
    answer: Answer,
) -> None:
    if not keys:
        answer(TxnAnswer(outcome, found))
        return
    key = keys[0]

    def got(result: Any) -> None:
        if failed(result):  # the store is gone: the flow sees the key as not read
            answer(TxnAnswer(outcome, found))
            return
        found[key] = result
        _read_back(host, keys[1:], found, outcome, answer)

    host.call(f"read {key}", lambda: host.etcd.get(key), got)
