"""The one vocabulary of I/O that every machine and flow of the broker asks for.

A machine decides; what it needs from the world it names with one of these values, and a
port carries it out: the production runtime (etcd, files, S3, trio), the simulator (the
same, with latency and faults) or the instant in-memory port of `danube.testing`. Since
every machine speaks this vocabulary, each port implements it once, and the simulator runs
exactly the flows production runs (spec/effects.md).

The values are answered, not returned: a flow (`danube.effects.flow`) yields one and gets
the answer sent back, or the failure thrown in. What each is answered with is said on it.

Failures are exceptions a port raises into the flow:
- `StoreUnreachable`: the metadata store did not answer (a transaction's outcome is then
  `Outcome.UNKNOWN`, not this error);
- `ObjectStoreFailed` with its `ObjectFailure` kind;
- `OSError` from files, as the operating system says it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from danube.metadata.model import Compare, KeyValue, Op
from danube.values.frozen import fast_init

# -- the metadata store ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoreRead:
    """Answered with the key's `KeyValue`, or None when it does not exist."""

    key: str


@dataclass(frozen=True, slots=True)
class StoreList:
    """Answered with every `KeyValue` under `prefix`, in key order."""

    prefix: str


class Outcome(enum.Enum):
    COMMITTED = "committed"
    """The compares held and the operations were applied."""
    REFUSED = "refused"
    """A compare did not hold; nothing was applied."""
    UNKNOWN = "unknown"
    """No answer came (a timeout, a lost connection): the operations may or may not have
    been applied. `read_back` tells the machine what the store holds now, if it could be
    read."""


@fast_init
@dataclass(frozen=True, slots=True)
class StoreTxn:
    """One atomic compare-and-operate transaction: if every compare holds, apply `ops`.

    Answered with a `TxnAnswer`. Whenever the outcome is not `COMMITTED`, the interpreter
    reads the keys of `read_back` (the same for every machine: one read after the refusal
    or the unknown outcome) and passes what it found, so the machine can tell "somebody
    else holds it" from "my own write landed after all".

    `fenced` names keys written under this broker's ownership of a topic: the port adds the
    compares of the ownership claim (cluster mode), so a broker that lost the topic cannot
    write; of the claims in `claims` when given. `purpose` is for logs and the simulator's
    trace only."""

    compares: tuple[Compare, ...]
    ops: tuple[Op, ...]
    read_back: tuple[str, ...] = ()
    fenced: tuple[str, ...] = ()
    purpose: str = ""
    claims: tuple[tuple[str, int], ...] | None = None
    """`(topic, claim revision)` the change was decided under (`BrokerCore.fence_claims`):
    the fence compares these, not the claims the port holds when the write goes out."""


@fast_init
@dataclass(frozen=True, slots=True)
class TxnAnswer:
    outcome: Outcome
    found: Mapping[str, KeyValue | None] = field(default_factory=dict)
    """The `read_back` keys as read after a refusal or an unknown outcome (missing keys
    were not readable: the store was down too)."""
    revision: int = 0
    """The store's revision of a committed transaction."""

    @property
    def committed(self) -> bool:
        return self.outcome is Outcome.COMMITTED


@dataclass(frozen=True, slots=True)
class StoreReadMany:
    """Several reads at one revision, in one store request (etcd: one transaction of range
    requests): each of `keys` read, each of `prefixes` scanned. Answered with a
    `ReadManyAnswer`; `StoreUnreachable` when the store did not answer. Why: a broker
    given a dead broker's hundreds of topics read each topic's keys in four requests
    (issue 23); one request for a batch of topics is one round trip and one decode."""

    keys: tuple[str, ...]
    prefixes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ReadManyAnswer:
    found: Mapping[str, KeyValue | None]
    """Each key of `keys`: its `KeyValue`, None when it does not exist."""
    scanned: Mapping[str, list[KeyValue]]
    """Each prefix of `prefixes`: every `KeyValue` under it, in key order."""


@dataclass(frozen=True, slots=True)
class StoreTxns:
    """Several independent transactions, each with its own compares and outcome (etcd: one
    request of nested transactions, `danube.runtime.store_port.perform_txns`), none
    fenced, none with a `read_back`, none writing a key another writes. Answered with one
    `TxnAnswer` per transaction, in order (an unanswered request: every one `UNKNOWN`)."""

    txns: tuple[StoreTxn, ...]


class StoreUnreachable(Exception):
    """The metadata store did not answer a read."""


@dataclass(frozen=True, slots=True)
class LeaseGrant:
    """Answered with the id of a new lease of `ttl_s` seconds."""

    ttl_s: float


@dataclass(frozen=True, slots=True)
class LeaseRenew:
    """Keep the lease alive one more time-to-live; answered with None, or `LeaseGone` when
    the store says it no longer exists (expired or revoked)."""

    lease_id: int


class LeaseGone(Exception):
    """The store answered that the lease does not exist."""


# -- objects --------------------------------------------------------------------------------


class ObjectFailure(enum.Enum):
    THROTTLED = "throttled"
    """The store asks to slow down: retry later, with a longer pause."""
    TRANSIENT = "transient"
    """A server error or a lost connection: retry."""
    FATAL = "fatal"
    """Credentials, a missing bucket, a request the store refuses: retrying does not help."""
    MISSING = "missing"
    """The object does not exist."""


class ObjectStoreFailed(Exception):
    def __init__(self, kind: ObjectFailure, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ObjectGet:
    """Answered with the bytes [`start`, `end`) of the object (all of it when `end` is
    None)."""

    key: str
    start: int = 0
    end: int | None = None


@fast_init
@dataclass(frozen=True, slots=True)
class ObjectPut:
    """Answered with None once the object is stored whole."""

    key: str
    data: bytes


@dataclass(frozen=True, slots=True)
class ObjectList:
    """Answered with `(key, modified_ms)` pairs under `prefix`."""

    prefix: str


@dataclass(frozen=True, slots=True)
class ObjectDelete:
    """Answered with None (deleting what is not there succeeds)."""

    key: str


# -- files of a topic's WAL directory --------------------------------------------------------


@fast_init
@dataclass(frozen=True, slots=True)
class TopicFile:
    """A WAL file effect (`danube.machines.wal.machine.CreateSegment`, `Write`, `Fsync`,
    `CloseSegment`, `DeleteSegment`) on the topic's directory; answered with None. A write
    of a topic whose durability syncs every write is synced before the answer."""

    topic: str
    effect: Any
    sync: bool = False
    """The topic syncs every write (`WalConfig.synced_writes`, decided when its WAL was
    loaded): a `Write` is fdatasynced before it is answered."""


@fast_init
@dataclass(frozen=True, slots=True)
class ReadTopicFile:
    """Answered with the bytes [`start`, `end`) of the topic's segment `segment_base`
    (all of it when `end` is None); `FileNotFoundError` when the segment is gone."""

    topic: str
    segment_base: int
    start: int = 0
    end: int | None = None


@dataclass(frozen=True, slots=True)
class ScanTopic:
    """Answered with the topic's directory as recovery sees it: `TopicScan`."""

    topic: str


@dataclass(frozen=True, slots=True)
class TopicScan:
    segments: tuple[tuple[int, Any], ...]
    """(segment base, `wal.format` scan or `wal.recovery.UnreadableSegment`), by base."""
    checkpoint_end: int | None
    """The durable end the checkpoint marks, None without a checkpoint."""
    loss_accepted_at: int | None
    """The offset of an operator's `accept-loss` file, None without one."""
    epochs: EpochHistory | None = None
    """The replication epochs recorded in the directory (`WriteEpochs`), None without."""


EMPTY_SCAN = TopicScan((), None, None, None)
"""What a directory just removed and made again holds (`RemoveTopicFiles(recreate=True)`)."""


@dataclass(frozen=True, slots=True)
class RecoverTopic:
    """Carry out a recovery plan's actions (`wal.recovery.TruncateSegment`, `PlaceSegment`,
    …), mark `next_offset` in the checkpoint when asked and remove an `accept-loss` file;
    answered with None."""

    topic: str
    actions: tuple[Any, ...]
    mark: int | None
    clear_loss_accepted: bool
    now_ms: int = 0
    """The clock for the headers of segments a `PlaceSegment` creates."""


@dataclass(frozen=True, slots=True)
class TruncateTopicFile:
    """Cut the segment to `size` bytes and sync it; answered with None."""

    topic: str
    segment_base: int
    size: int


@dataclass(frozen=True, slots=True)
class EpochHistory:
    """A replica's epochs (spec/replication.md, "Reconciliation"): the highest epoch it has
    seen (a deposed owner's frames are refused after a crash too) and where each epoch's
    records start in its log, `(epoch, first offset)`, epochs increasing."""

    seen: int
    starts: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class WriteEpochs:
    """Replace the topic's epochs file with `history`, durably (temporary file, fsync,
    rename, fsync of the directory) before answering None: later answers to the owner and
    appends rely on it."""

    topic: str
    history: EpochHistory


@dataclass(frozen=True, slots=True)
class MarkDurable:
    """Write the topic's checkpoint: offsets below `end` are durable. Answered with None."""

    topic: str
    end: int


@dataclass(frozen=True, slots=True)
class RemoveTopicFiles:
    """Delete the topic's WAL directory and everything in it; answered with None.
    `recreate`: then make it again, empty (a fresh topic's load, `flows.recover`, which
    then knows the directory's scan without a `ScanTopic`: one hand-off to a thread per new
    topic fewer, issue 23)."""

    topic: str
    recreate: bool = False


@dataclass(frozen=True, slots=True)
class CloseTopicFiles:
    """The interpreter is done with the topic's files (an unload, a drop): release what the
    port holds open for them; answered with None."""

    topic: str


# -- time and work ---------------------------------------------------------------------------


@fast_init
@dataclass(frozen=True, slots=True)
class Sleep:
    """Answered with None after `ms` milliseconds of the port's clock."""

    ms: int


@fast_init
@dataclass(frozen=True, slots=True)
class Work:
    """CPU-bound work (parsing, checksums): answered with what `run()` returns. Production
    runs it in a worker thread; the simulator and the testing port run it inline."""

    run: Callable[[], Any]


IoEffect: TypeAlias = (
    StoreRead
    | StoreList
    | StoreTxn
    | LeaseGrant
    | LeaseRenew
    | ObjectGet
    | ObjectPut
    | ObjectList
    | ObjectDelete
    | TopicFile
    | ReadTopicFile
    | ScanTopic
    | RecoverTopic
    | TruncateTopicFile
    | MarkDurable
    | WriteEpochs
    | RemoveTopicFiles
    | CloseTopicFiles
    | Sleep
    | Work
)


# -- in-memory stores (the simulator's and the testing port's) -------------------------------


def apply_ops(ops: tuple[Op, ...] | list[Op], data: dict[str, Any]) -> None:
    """Applies store operations to a plain key -> value map, in order (`Put`, `Delete`,
    `DeletePrefix`): the store of the ports that keep their metadata in a dict."""
    from danube.metadata.model import Delete, DeletePrefix, Put

    for op in ops:
        if isinstance(op, Put):
            data[op.key] = op.value
        elif isinstance(op, Delete):
            data.pop(op.key, None)
        elif isinstance(op, DeletePrefix):
            for key in [k for k in data if k.startswith(op.prefix)]:
                del data[key]
        else:
            raise TypeError(f"{type(op).__name__} is not a write")


def compares_hold(compares: tuple[Compare, ...] | list[Compare], data: dict[str, Any]) -> bool:
    """Evaluates compares on a plain map without versions: `version`/`create_revision`/
    `mod_revision` compare as 1 for a present key and 0 for a missing one (enough for
    "absent" and "present" guards), values as themselves."""
    for compare in compares:
        present = compare.key in data
        if compare.target == "value":
            if not present:
                return False
            actual: Any = data[compare.key]
        else:
            actual = 1 if present else 0
        expected: Any = compare.operand
        if compare.op == "==" and actual != expected:
            return False
        if compare.op == "!=" and actual == expected:
            return False
        if compare.op == ">" and not actual > expected:
            return False
        if compare.op == "<" and not actual < expected:
            return False
    return True


# -- policies as data ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Backoff:
    """How a flow retries a failing call: pauses of `first_ms`, growing by `factor` up to
    `cap_ms`; `attempts` None retries for as long as the failure lasts (the flow still ends
    when its owner goes: a topic unloaded, a broker stopped)."""

    first_ms: int
    factor: float = 2.0
    cap_ms: int = 5_000
    attempts: int | None = None

    def pause_ms(self, attempt: int) -> int:
        """The pause after failed attempt `attempt` (1 for the first)."""
        return int(min(self.cap_ms, self.first_ms * self.factor ** (attempt - 1)))

    def gives_up(self, attempt: int) -> bool:
        return self.attempts is not None and attempt >= self.attempts
