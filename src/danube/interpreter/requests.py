"""Requests a flow makes of the interpreter itself rather than of the port."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from danube.effects.flow import Flow
from danube.values.frozen import fast_init


@fast_init
@dataclass(frozen=True, slots=True)
class Exclusive:
    """Run `flow` holding the topic's directory: loads, repairs, drops and checkpoint writes
    of one topic run one at a time, in the order they asked. Answered with the sub-flow's
    value (its failure is thrown in)."""

    topic: str
    flow: Flow[Any]


@dataclass(frozen=True, slots=True)
class FilesIdle:
    """Answered with None once no WAL file effect of the topic is under way or queued (a
    repair or a drop discards the ones not started first; a follower's cut waits for them)."""

    topic: str
