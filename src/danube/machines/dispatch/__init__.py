"""Delivery decisions as pure state machines: which consumer gets which message, and when a
message is dropped. Drivers (the trio broker, the simulator) only move the bytes."""

from danube.machines.dispatch.keyshared import HashRing, KeyFilter
from danube.machines.dispatch.nonreliable import NonReliableSubscription, Queued
from danube.machines.dispatch.types import (
    LATEST,
    ConsumerReady,
    DropReason,
    QueueLimits,
    StartKind,
    StartPosition,
    SubscriptionType,
)

__all__ = [
    "LATEST",
    "ConsumerReady",
    "DropReason",
    "HashRing",
    "KeyFilter",
    "NonReliableSubscription",
    "QueueLimits",
    "Queued",
    "StartKind",
    "StartPosition",
    "SubscriptionType",
]
