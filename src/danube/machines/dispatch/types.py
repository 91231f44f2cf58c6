"""Vocabulary shared by the dispatch state machines and their drivers."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class SubscriptionType(enum.IntEnum):
    """Wire values of `ConsumerRequest.SubscriptionType`."""

    EXCLUSIVE = 0
    SHARED = 1
    FAILOVER = 2
    KEY_SHARED = 3


class DropReason(enum.Enum):
    """Why a message did not reach a consumer (each is counted): all but `POISON_POLICY` for
    non-reliable subscriptions, that one for a reliable message the Drop policy skipped."""

    NO_CONSUMER = "no_consumer"
    QUEUE_FULL = "queue_full"
    NO_KEY_MATCH = "no_key_match"
    POISON_POLICY = "poison_policy"
    MEMORY_BUDGET = "memory_budget"
    """The broker's consumer pool had no room for it (spec/memory.md, "Consumer queues")."""


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """Per-consumer bound on messages waiting for the wire: the broker's memory for a slow
    consumer is at most this, whatever the publish rate."""

    max_messages: int = 1000
    max_bytes: int = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ConsumerReady:
    """Effect: the consumer's queue went from empty to non-empty; its stream writer should
    drain it. Emitted once per transition, not once per message."""

    consumer_id: int


class StartKind(enum.Enum):
    LATEST = "latest"
    EARLIEST = "earliest"
    OFFSET = "offset"


@dataclass(frozen=True, slots=True)
class StartPosition:
    """Where a new subscription starts (Danube: always the latest message)."""

    kind: StartKind = StartKind.LATEST
    offset: int = 0


LATEST = StartPosition()
