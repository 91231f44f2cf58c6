"""The one interpreter of the broker core's effects, and the port protocol it runs against
(spec/effects.md). Pure: no trio, asyncio, os, time, sockets or threads."""

from danube.interpreter.flows import OBJECT_READ_BACKOFF
from danube.interpreter.host import Done, Host
from danube.interpreter.interpreter import CHECKPOINT_INTERVAL_MS, Interpreter

__all__ = ["CHECKPOINT_INTERVAL_MS", "OBJECT_READ_BACKOFF", "Done", "Host", "Interpreter"]
