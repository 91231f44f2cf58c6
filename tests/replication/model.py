"""A small world for the replication machines: one owner, two followers, etcd's replicas
value, per-link ordered streams that may lose a suffix when they break, follower fsyncs and
crashes, in-sync proposals committed or lost, and at most one failover to an in-sync follower
(while the deposed owner goes on). Everything happens in an order a `random.Random` picks.

Checked while it runs (`Violation` names the broken rule), and by `settle` once faults stop:

- r1-lite: at each `AcknowledgeUpTo(end)`, every offset below `end` is on the acknowledging
  owner and durably, with the same record, on every follower of etcd's in-sync set when etcd's
  epoch is the owner's; and every record ever acknowledged is on the current owner's log.
- r3: a follower never holds, at an offset, a record the owner of the epoch it filed it under
  did not send at that offset.
- fencing: a follower never answers `Replicated` for an epoch lower than one it has seen, and
  an owner never advances its acknowledgements on such an answer.
- liveness: after `settle`, every follower of the current owner holds its whole log durably and
  is in etcd's in-sync set, and the owner acknowledges everything it holds.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from danube.machines.replication.follower import FollowerLog
from danube.machines.replication.messages import (
    AcknowledgeUpTo,
    AppendFrames,
    Deposed,
    Mismatch,
    ProposeInSync,
    ReadForResend,
    Reconcile,
    RecordEpoch,
    Replicate,
    Replicated,
    Send,
    StaleEpoch,
    TruncateTo,
    end_of_epoch,
)
from danube.machines.replication.owner import OwnerReplication

TOPIC = "t"


class Violation(AssertionError):
    pass


def encode(uids: list[int]) -> bytes:
    return b",".join(str(u).encode() for u in uids)


def decode(frames: bytes) -> list[int]:
    return [int(x) for x in frames.split(b",")] if frames else []


@dataclass
class Broker:
    name: str
    log: list[tuple[int, int]] = field(default_factory=list)
    """(uid, epoch filed under); for a follower, appended (durable or not)."""
    durable: int = 0
    epoch_seen: int = 1
    epoch_starts: list[tuple[int, int]] = field(default_factory=lambda: [(1, 0)])
    follower: FollowerLog | None = None
    owner: OwnerReplication | None = None


class World:
    def __init__(
        self,
        rnd: random.Random,
        owner_cls: type[OwnerReplication] = OwnerReplication,
        follower_cls: type[FollowerLog] = FollowerLog,
    ) -> None:
        self.rnd = rnd
        self.owner_cls = owner_cls
        self.follower_cls = follower_cls
        self.now = 0
        self.uid = 0
        self.etcd = {"epoch": 1, "in_sync": ("F1", "F2"), "version": 1}
        self.brokers = {n: Broker(n) for n in ("A", "F1", "F2")}
        for n in ("F1", "F2"):
            self.brokers[n].follower = follower_cls(
                TOPIC, epoch=1, log_end=0, epoch_starts=[(1, 0)]
            )
        self.brokers["A"].owner = owner_cls(
            TOPIC,
            1,
            durable_end=0,
            high_watermark=0,
            followers=("F1", "F2"),
            in_sync=("F1", "F2"),
            version=1,
            lag_ms=rnd.choice((200, 1_000)),
            window_bytes=rnd.choice((8, 64, 1 << 20)),
            max_in_flight=rnd.choice((3, 10, 1 << 16)),
        )
        self.down: dict[tuple[str, str], deque[Replicate]] = {}
        self.up: dict[tuple[str, str], deque[tuple[object, int]]] = {}
        self.reads: list[tuple[str, ReadForResend]] = []
        self.proposals: list[tuple[str, ProposeInSync]] = []
        self.sent: dict[int, set[tuple[int, int]]] = {}
        """epoch → (offset, uid) its owner sent."""
        self.acked: dict[int, int] = {}
        """offset → uid of every acknowledged record."""
        self.promoted = False
        self.acks = 0

    # -- effects ----------------------------------------------------------------------------------

    def owner_effects(self, name: str, effects: list, trigger_epoch: int | None = None) -> None:
        owner = self.brokers[name].owner
        assert owner is not None
        for eff in effects:
            if isinstance(eff, Send):
                m = eff.message
                for i, uid in enumerate(decode(m.frames)):
                    self.sent.setdefault(m.epoch, set()).add((m.prev_end + i, uid))
                target = self.brokers[eff.follower]
                if target.follower is not None:
                    self.down.setdefault((name, eff.follower), deque()).append(m)
            elif isinstance(eff, AcknowledgeUpTo):
                self.check_ack(name, eff.end, trigger_epoch)
            elif isinstance(eff, ProposeInSync):
                self.proposals.append((name, eff))
            elif isinstance(eff, ReadForResend):
                self.reads.append((name, eff))
            elif isinstance(eff, Deposed):
                pass

    def follower_effects(self, owner: str, name: str, effects: list) -> None:
        b = self.brokers[name]
        for eff in effects:
            if isinstance(eff, AppendFrames):
                uids = decode(eff.frames)
                assert eff.prev_end == len(b.log), (eff, len(b.log))
                filed = b.follower.epoch if b.follower else 0
                for i, uid in enumerate(uids):
                    if (eff.prev_end + i, uid) not in self.sent.get(filed, set()):
                        raise Violation(f"r3: {name} files {uid}@{eff.prev_end + i} under {filed}")
                    b.log.append((uid, filed))
            elif isinstance(eff, TruncateTo):
                del b.log[eff.end :]
                b.durable = min(b.durable, eff.end)
            elif isinstance(eff, RecordEpoch):
                b.epoch_seen = max(b.epoch_seen, eff.epoch)
                if eff.start is not None:
                    b.epoch_starts = [(e, s) for e, s in b.epoch_starts if s < eff.start]
                    b.epoch_starts.append((eff.epoch, eff.start))
            elif isinstance(eff, Reconcile):
                o = self.owner_of(eff.epoch)
                ob = self.brokers[o]
                end = end_of_epoch(ob.epoch_starts, eff.last_epoch, len(ob.log))
                self.follower_effects(o, name, b.follower.new_epoch(eff.epoch, end))
            else:
                if isinstance(eff, Replicated) and eff.epoch < b.epoch_seen:
                    raise Violation(f"fencing: {name} acks epoch {eff.epoch} after {b.epoch_seen}")
                self.up.setdefault((owner, name), deque()).append((eff, b.epoch_seen))

    def owner_of(self, epoch: int) -> str:
        for n, b in self.brokers.items():
            if b.owner is not None and b.owner.epoch == epoch:
                return n
        raise AssertionError(epoch)

    def current_owner(self) -> str:
        return self.owner_of(self.etcd["epoch"])

    # -- checks -----------------------------------------------------------------------------------

    def check_ack(self, name: str, end: int, trigger_epoch: int | None) -> None:
        self.acks += 1
        owner = self.brokers[name]
        epoch = owner.owner.epoch
        if trigger_epoch is not None and trigger_epoch > epoch:
            raise Violation(
                f"fencing: {name} (epoch {epoch}) acks on a follower at {trigger_epoch}"
            )
        if end > owner.durable:
            raise Violation(f"r1: {name} acks {end} beyond its durable end {owner.durable}")
        if self.etcd["epoch"] == epoch:
            for f in self.etcd["in_sync"]:
                fb = self.brokers[f]
                for off in range(end):
                    if off >= fb.durable or fb.log[off][0] != owner.log[off][0]:
                        raise Violation(f"r1: {name} acks {end}, {f} lacks offset {off}")
        for off in range(end):
            uid = owner.log[off][0]
            if self.acked.setdefault(off, uid) != uid:
                raise Violation(f"r1: offset {off} acknowledged as two records")
        self.check_current_owner_holds_acked()

    def check_current_owner_holds_acked(self) -> None:
        log = self.brokers[self.current_owner()].log
        for off, uid in self.acked.items():
            if off >= len(log) or log[off][0] != uid:
                raise Violation(f"r1: acknowledged {uid}@{off} not on the current owner")

    # -- actions ----------------------------------------------------------------------------------

    def owners(self) -> list[str]:
        return [n for n, b in self.brokers.items() if b.owner is not None]

    def append(self) -> None:
        name = self.rnd.choice(self.owners())
        b = self.brokers[name]
        uids = []
        for _ in range(self.rnd.randint(1, 3)):
            self.uid += 1
            uids.append(self.uid)
            b.log.append((self.uid, b.owner.epoch))
        # Sent as written (`written`); the owner's own fsync is `owner_fsync`, later.
        self.owner_effects(name, b.owner.written(len(b.log), encode(uids), self.now))

    def owner_fsync(self) -> None:
        names = [n for n in self.owners() if self.brokers[n].durable < len(self.brokers[n].log)]
        if not names:
            return
        b = self.brokers[self.rnd.choice(names)]
        b.durable = len(b.log)
        self.owner_effects(b.name, b.owner.durable(b.durable, b"", self.now))

    def deliver_down(self) -> None:
        keys = [k for k, q in self.down.items() if q]
        if not keys:
            return
        o, f = self.rnd.choice(keys)
        m = self.down[(o, f)].popleft()
        fl = self.brokers[f].follower
        if fl is not None:
            self.follower_effects(o, f, fl.replicate(m))

    def deliver_up(self) -> None:
        keys = [k for k, q in self.up.items() if q]
        if not keys:
            return
        o, f = self.rnd.choice(keys)
        msg, sender_epoch = self.up[(o, f)].popleft()
        owner = self.brokers[o].owner
        if isinstance(msg, Replicated):
            self.owner_effects(o, owner.replicated(f, msg, self.now), sender_epoch)
        elif isinstance(msg, Mismatch):
            self.owner_effects(o, owner.mismatch(f, msg, self.now))
        elif isinstance(msg, StaleEpoch):
            self.owner_effects(o, owner.stale_epoch(f, msg))

    def fsync(self) -> None:
        f = self.rnd.choice([n for n, b in self.brokers.items() if b.follower is not None])
        b = self.brokers[f]
        b.durable = len(b.log)
        effects = b.follower.appended_durable(len(b.log))
        self.follower_effects(self.owner_of(b.follower.epoch), f, effects)

    def break_stream(self) -> None:
        o = self.rnd.choice(self.owners())
        f = self.rnd.choice([n for n in ("F1", "F2") if n != o])
        for q in (self.down.get((o, f)), self.up.get((o, f))):
            if q:
                keep = self.rnd.randint(0, len(q))
                while len(q) > keep:
                    q.pop()
        self.owner_effects(o, self.brokers[o].owner.stream_broke(f, self.now))

    def crash_follower(self) -> None:
        names = [n for n, b in self.brokers.items() if b.follower is not None]
        f = self.rnd.choice(names)
        b = self.brokers[f]
        del b.log[b.durable :]
        starts = [(e, s) for e, s in b.epoch_starts if s <= b.durable]
        b.follower = self.follower_cls.recovered(
            TOPIC, epoch=b.epoch_seen, durable_end=b.durable, epoch_starts=starts
        )
        for o in self.owners():
            self.down.pop((o, f), None)
            self.up.pop((o, f), None)
            self.owner_effects(o, self.brokers[o].owner.stream_broke(f, self.now))

    def tick(self) -> None:
        self.now += self.rnd.randint(0, 700)
        for o in self.owners():
            self.owner_effects(o, self.brokers[o].owner.tick(self.now))

    def settle_proposal(self) -> None:
        if not self.proposals:
            return
        o, p = self.proposals.pop(self.rnd.randrange(len(self.proposals)))
        current = p.epoch == self.etcd["epoch"] and p.expected_version == self.etcd["version"]
        if current and self.rnd.random() < 0.8:
            self.etcd = {
                "epoch": p.epoch,
                "in_sync": p.in_sync,
                "version": p.expected_version + 1,
            }
        owner = self.brokers[o].owner
        # The read-back after the transaction (a deposed owner's reads may be stale).
        if self.etcd["epoch"] == owner.epoch or self.rnd.random() < 0.5:
            e = self.etcd
            self.owner_effects(o, owner.replicas_seen(e["in_sync"], e["version"], e["epoch"]))

    def serve_read(self) -> None:
        if not self.reads:
            return
        o, r = self.reads.pop(self.rnd.randrange(len(self.reads)))
        log = self.brokers[o].log
        end = self.brokers[o].durable  # the WAL serves durable frames only
        if end <= r.from_offset:
            raise Violation(f"{o} asks to read {r.from_offset}, not durable (ends {end})")
        if end > r.from_offset + 1 and self.rnd.random() < 0.5:
            end = self.rnd.randint(r.from_offset + 1, end)  # a chunk
        frames = encode([uid for uid, _ in log[r.from_offset : end]])
        self.owner_effects(
            o,
            self.brokers[o].owner.frames_read(r.follower, r.from_offset, frames, end, self.now),
        )

    def promote(self) -> None:
        if self.promoted or not self.etcd["in_sync"]:
            return
        self.promoted = True
        new = self.rnd.choice(self.etcd["in_sync"])
        b = self.brokers[new]
        del b.log[b.durable :]
        b.follower = None
        others = tuple(f for f in self.etcd["in_sync"] if f != new)
        followers = tuple(f for f in ("F1", "F2") if f != new)
        self.etcd = {"epoch": 2, "in_sync": others, "version": self.etcd["version"] + 1}
        b.epoch_starts = [(e, s) for e, s in b.epoch_starts if s < len(b.log)] + [(2, len(b.log))]
        b.owner = self.owner_cls(
            TOPIC,
            2,
            durable_end=len(b.log),
            high_watermark=0,
            followers=followers,
            in_sync=others,
            version=self.etcd["version"],
            lag_ms=1_000,
            window_bytes=64,
            now_ms=self.now,
        )
        for k in [k for k in self.down if new in k]:
            del self.down[k]
        for k in [k for k in self.up if new in k]:
            del self.up[k]
        self.check_current_owner_holds_acked()
        self.owner_effects(new, b.owner.start(self.now))

    def run(self, steps: int) -> None:
        actions = [
            (self.append, 4),
            (self.owner_fsync, 4),
            (self.deliver_down, 6),
            (self.deliver_up, 6),
            (self.fsync, 4),
            (self.break_stream, 1),
            (self.crash_follower, 0.5),
            (self.tick, 2),
            (self.settle_proposal, 2),
            (self.serve_read, 2),
            (self.promote, 0.1),
        ]
        fns = [a for a, _ in actions]
        weights = [w for _, w in actions]
        for _ in range(steps):
            self.rnd.choices(fns, weights)[0]()

    def settle(self, rounds: int = 200) -> None:
        """No more faults: deliver everything, fsync, serve reads, commit proposals and let
        time pass, until quiet. Liveness: the current owner then acknowledges all it has."""
        for _ in range(rounds):
            busy = False
            for q in (*self.down.values(), *self.up.values()):
                busy = busy or bool(q)
            while any(self.down.values()) or any(self.up.values()):
                self.deliver_down()
                self.deliver_up()
            for name, b in self.brokers.items():
                if b.owner is not None and b.durable < len(b.log):
                    busy = True
                    b.durable = len(b.log)
                    self.owner_effects(name, b.owner.durable(b.durable, b"", self.now))
                if b.follower is not None and b.durable < len(b.log):
                    busy = True
                    b.durable = len(b.log)
                    self.follower_effects(
                        self.owner_of(b.follower.epoch),
                        name,
                        b.follower.appended_durable(b.durable),
                    )
            while self.reads:
                busy = True
                self.serve_read()
            while self.proposals:
                busy = True
                o, p = self.proposals.pop(0)
                if (p.epoch, p.expected_version) == (self.etcd["epoch"], self.etcd["version"]):
                    self.etcd = {
                        "epoch": p.epoch,
                        "in_sync": p.in_sync,
                        "version": p.expected_version + 1,
                    }
                owner = self.brokers[o].owner
                if owner.epoch == self.etcd["epoch"]:
                    e = self.etcd
                    self.owner_effects(
                        o, owner.replicas_seen(e["in_sync"], e["version"], e["epoch"])
                    )
            if not busy:
                self.now += 100
                for o in self.owners():
                    self.owner_effects(o, self.brokers[o].owner.tick(self.now))
        name = self.current_owner()
        owner = self.brokers[name].owner
        for f in owner.links:
            fb = self.brokers[f]
            held = [uid for uid, _ in fb.log[: fb.durable]]
            if f not in self.etcd["in_sync"] or held != [u for u, _ in self.brokers[name].log]:
                raise Violation(f"liveness: {f} never caught up with {name} and rejoined")
        if owner.high_watermark != owner.durable_end:
            stuck = f"{owner.high_watermark} of {owner.durable_end}"
            raise Violation(f"liveness: {name} acknowledges only {stuck}")
