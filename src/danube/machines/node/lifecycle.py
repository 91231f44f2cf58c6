"""Topics leaving this broker: deleted by an operator, or moved away in cluster mode
(spec/cluster.md "Topic moves": `unload`, wait until `settled`, then `remove`). Forgetting a
topic forgets its producers and consumers and ends their streams."""

from __future__ import annotations

from danube.machines.cluster.replicas import ReplicaSet
from danube.machines.node import paths
from danube.machines.node.catalogue import Catalogue
from danube.machines.node.consumers import Consumers
from danube.machines.node.effects import DropWal, Effect, PersistMeta, Step
from danube.machines.node.phase import TopicEvent
from danube.machines.node.producers import Producers
from danube.machines.node.records import TopicRecord
from danube.machines.node.reliable_log import ReliableLogs
from danube.machines.tiering import layout as tier_layout
from danube.machines.wal.machine import release
from danube.values.errors import invalid, not_found
from danube.values.names import parse_topic


class Lifecycle:
    def __init__(
        self,
        catalogue: Catalogue,
        producers: Producers,
        consumers: Consumers,
        logs: ReliableLogs,
    ) -> None:
        self._catalogue = catalogue
        self._topics = catalogue.topics_by_name
        self._producers = producers
        self._consumers = consumers
        self._logs = logs
        self.kept: set[str] = set()
        self.seen_moving: dict[str, ReplicaSet] = {}
        """The replica set last seen of each topic on its way out: a successor may record
        itself before the topic is removed here, and no later change may come to decide
        its kept directory by (`BrokerCore.remove`)."""
        """Topics handed over from here whose WAL directory stays on disk, not loaded and not
        a replica: the successor's replicas hold the log, and these files go once the
        replica set no longer counts on this broker (`kept_still_needed`)."""

    def serves(self, topic: str) -> bool:
        """The topic is loaded here and not on its way out."""
        record = self._topics.get(topic)
        return record is not None and not record.phase.moving

    def unload(self, topic: str, now_ms: int) -> Step[None]:
        """See `BrokerCore.unload`."""
        record = self._topics.get(topic)
        if record is None or record.phase.moving:
            return Step(None)
        record.advance(TopicEvent.UNLOAD)
        effects: list[Effect] = list(self._logs.seal(record, now_ms))
        if record.reliable:
            effects.extend(self._logs.flush_cursors(record, now_ms))
        return Step(None, tuple(effects))

    def settled(self, topic: str) -> bool:
        """An unloading topic's WAL is idle and every sealed segment is indexed (or the
        topic is stopped and can do neither); replicated, also uploaded, which waits for the
        high watermark. Or, replicated, handed over: every record is acknowledged and every
        member of the recorded in-sync set holds the log end (`hand_over_ready`); the
        release then leaves the replica set unsealed and the load manager promotes one of
        them (spec/replication.md, "Moves")."""
        record = self._topics.get(topic)
        if record is None or record.phase.stopped:
            return True
        if record.log.handing_over:
            return True
        if record.phase.moving and self._logs.replicas.hand_over_ready(record):
            # Every in-sync follower holds the log end: they take over without an upload of
            # the tail (spec/replication.md, "Moves"). No in-sync proposal from now on, so
            # the set the release finds is the one that holds everything.
            record.log.handing_over = True
            return True
        if record.wal is not None and not record.wal.idle:
            return False
        if record.log.sealed_waiting:  # replicated: sealed, not yet below the high watermark
            return False
        uploader = record.log.uploader
        return uploader is None or uploader.idle

    def handed_over(self, topic: str) -> int | None:
        """None unless the unloading topic goes to its in-sync followers without waiting for
        an upload of its tail (`settled` found it ready); then how many of its records the
        object index does not hold yet (the tail its new owner uploads)."""
        record = self._topics.get(topic)
        if record is None or not record.log.handing_over or record.wal is None:
            return None
        return max(record.wal.readable_offset - self._logs.indexed_end(record), 0)

    def tail_kept(self, topic: str) -> bool:
        """The unloading topic leaves with a tail the object index may lack: handed over, or
        stopped (its WAL failed, or a repair rewound it, before an upload). Its release must
        not mark the replica set sealed, which would let any broker load it from objects
        without the tail its followers and its files hold (`Ownership.unloaded`)."""
        record = self._topics.get(topic)
        return record is not None and (record.log.handing_over or record.phase.stopped)

    def remove(self, topic: str, *, reason: str, delete_files: bool) -> Step[None]:
        """See `BrokerCore.remove`."""
        record = self._topics.get(topic)
        if record is None:
            return Step(None)
        self._producers.depart(record)
        # Handed over or stopped, the files may hold the only copy of the tail outside the
        # followers (no upload was waited for): kept, as after a drop.
        keep = self.tail_kept(topic)
        if record.log.handing_over:
            self.kept.add(topic)
        return Step(None, tuple(self._forget(record, reason, delete_files and not keep)))

    def delete_topic(self, topic: str) -> Step[None]:
        """See `BrokerCore.delete_topic`."""
        partition = parse_topic(topic).partition_of
        if partition is not None:
            raise invalid(
                f"{topic} is a partition of {partition[0]}: delete the partitioned topic by "
                f"its base name {partition[0]} (as Danube, partitions go together)"
            )
        targets = [topic] if topic in self._topics else self._catalogue.partitions(topic)
        if not targets:
            raise not_found(f"topic {topic} does not exist")
        effects: list[Effect] = []
        for target in targets:
            effects.extend(self._delete_topic(self._topics[target]))
        return Step(None, tuple(effects))

    def _delete_topic(self, record: TopicRecord) -> list[Effect]:
        self.seen_moving.pop(record.name.full, None)
        self.kept.discard(record.name.full)
        effects: list[Effect] = [
            PersistMeta(
                deletes=(paths.namespace_topic(record.name),),
                # the object index too: a topic created again under this name starts empty
                delete_prefixes=(
                    paths.topic_prefix(record.name),
                    tier_layout.index_prefix(record.name),
                ),
            )
        ]
        effects.extend(
            self._forget(record, f"topic {record.name.full} was deleted", True, objects=True)
        )
        return effects

    def _forget(
        self, record: TopicRecord, reason: str, delete_files: bool, *, objects: bool = False
    ) -> list[Effect]:
        """Removes the topic from memory: its producers and consumers are unknown from now on
        (health checks answer CLOSE) and open receive streams end."""
        self._producers.forget(record)
        effects = self._consumers.forget(record)
        del self._topics[record.name.full]
        release(record.log.wal)
        if record.reliable:
            effects.append(DropWal(record.name.full, reason, delete_files, objects))
        return effects
