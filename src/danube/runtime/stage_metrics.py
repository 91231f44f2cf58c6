"""Where a reliable message's time goes inside the broker (issue 23, point 2): one histogram
per stage of its path, `danube_stage_latency_ms{stage=...}`, so the broker's own metrics say
whether a slow publish waited for the disk, the thread hand-off, the loop or the consumer.

The stages, in the order a message passes them (spec/message-path.md):

- `receive`: the socket read that brought the request's last bytes → the request decoded
  (h2, grpclib's buffers, the size check, the codec); a lower bound when several requests
  came in one read;
- `check`: decoded → the core call's effects started (fence, served here, schema, pacing,
  the publish pool's admission, the core's own checks);
- `write`: the group commit queued to its WAL writer thread → its `pwrite` done (the
  hand-off to the thread and the write syscall);
- `fsync`: the `fdatasync` of that write;
- `back`: durable → its answer running on the loop (the rest of the writer's batch,
  `call_soon_threadsafe`, the loop's queue);
- `acknowledgement`: the answer on the loop → the publish's reply built and handed to
  grpclib (the waiter table, the flow's last fence check, the handler's wake-up);
- `dispatch`: the newest answer on the loop → a consumer's stream that waited for records
  took them (the stream task's wake-up, `BrokerCore.take`; a stream catching up on history
  without waiting is not observed, one woken by a read of the WAL's files is, from the
  newest commit);
- `send`: records taken → written to the consumer's HTTP/2 stream (encoding, h2, socket).

Replication (issue 27 point 6), one observation per `Replicate` or answer, never per message:

- `replicate_queue` (owner): the core's `ReplicaSend` → its bytes handed to the follower's
  HTTP/2 stream (the link's queue and writer task's wake-up);
- `replicate_round` (owner): handed to the stream → the follower's `Replicated` covering it
  read on the owner's loop (the network both ways and everything the follower does);
- `replica_durable` (follower): a `Replicate` decoded → the follower's `Replicated` for it put
  on the answer outbox (its lane, its WAL's write and fsync, whose `write`/`fsync`/`back` are
  the follower broker's own stages above, and the core's turn);
- `replica_answer` (follower): the answer put → written to the owner's stream.

On the owner, `acknowledgement` then also holds the wait for the follower after the owner's
own fsync (its answer runs on the loop before the follower's `Replicated` comes).

A message waiting in its topic's lane for the group commit before it shows in none of them:
a publish's whole time in the broker is `publish` (read → reply handed to grpclib), and what
the stages leave of it is that wait plus the loop's queueing.

Costs: a `perf_counter` read and one bucket increment per stage, once per request (receive,
check, acknowledgement, publish), per group commit (write, fsync, back) or per stream turn
(dispatch, send), never per message of a batch.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Metric

STAGE_BUCKETS_MS = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 1000, 5000,
)  # fmt: skip
"""Finer than the send latency's buckets: most stages take tens of microseconds."""

REPLICATION_STAGES = ("replicate_queue", "replicate_round", "replica_durable", "replica_answer")
"""The stages of a replicated group commit's round (owner and follower): none on a standalone
broker or an unreplicated topic."""
STAGES = (
    "receive",
    "check",
    "write",
    "fsync",
    "back",
    "acknowledgement",
    "dispatch",
    "send",
    "publish",
    *REPLICATION_STAGES,
)


class StageHistogram:
    """Bucket counts and sum, in milliseconds (plain lists: one `observe` is a short loop
    over 16 bounds, cheaper than numpy for a single value)."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(STAGE_BUCKETS_MS) + 1)
        self.total = 0.0

    def observe(self, ms: float) -> None:
        slot = 0
        for bound in STAGE_BUCKETS_MS:
            if ms <= bound:
                break
            slot += 1
        self.counts[slot] += 1
        self.total += ms

    def buckets(self) -> list[tuple[str, float]]:
        cumulative, out = 0, []
        for bound, count in zip((*STAGE_BUCKETS_MS, float("inf")), self.counts, strict=True):
            cumulative += count
            out.append(("+Inf" if bound == float("inf") else str(bound), cumulative))
        return out


class StageLatency:
    """One broker's stage histograms and the stamps carried between stages."""

    def __init__(self) -> None:
        self.histograms = {stage: StageHistogram() for stage in STAGES}
        self.stored_at = 0.0
        """`perf_counter` when the newest group commit's answer ran on the loop: the start
        of `acknowledgement` and `dispatch` (the reply or stream that wakes next was, but
        for commits of other topics answered in between, woken by it)."""

    def observe(self, stage: str, seconds: float) -> None:
        self.histograms[stage].observe(seconds * 1000)

    def committed(
        self,
        submitted: float,
        finished: float,
        answered: float,
        synced: float | None,
        *,
        wrote: bool = True,
    ) -> None:
        """A WAL file effect's legs (`wal_writer` stamps, `perf_counter` seconds): queued,
        done in the thread, answered on the loop; `synced`: its fdatasync's seconds, None
        for a write without one; `wrote`: False for a lone `Fsync` (`flush`-less writes
        fsynced by a second effect), whose hand-off is not a write."""
        histograms = self.histograms
        busy = finished - submitted - (synced or 0.0)
        if wrote:
            histograms["write"].observe(busy * 1000)
        if synced is not None:
            histograms["fsync"].observe(synced * 1000)
        histograms["back"].observe((answered - finished) * 1000)
        self.stored_at = answered

    def replied(self, received: tuple[float, float] | None) -> None:
        """A publish's reply is ready: its `acknowledgement` ends, and its `publish` (from
        the read that brought it, `received` as `grpc_util.RECEIVED` holds it)."""
        now = time.perf_counter()
        histograms = self.histograms
        if self.stored_at:
            histograms["acknowledgement"].observe((now - self.stored_at) * 1000)
        if received is not None and received[0]:
            histograms["publish"].observe((now - received[0]) * 1000)

    def since_stored(self, stage: str) -> None:
        """`stage` (acknowledgement, dispatch) ends now; it began at the newest answer."""
        if self.stored_at:
            self.histograms[stage].observe((time.perf_counter() - self.stored_at) * 1000)


def stage_families(broker: str, stages: StageLatency) -> Iterator[Metric]:
    family = HistogramMetricFamily(
        "danube_stage_latency_ms",
        "Time a reliable message spends in each stage of the broker's path (receive, check, "
        "write, fsync, back, acknowledgement, dispatch, send; publish: read to reply).",
        labels=["broker", "stage"],
    )
    for stage in STAGES:
        histogram = stages.histograms[stage]
        family.add_metric([broker, stage], histogram.buckets(), histogram.total)
    yield family
