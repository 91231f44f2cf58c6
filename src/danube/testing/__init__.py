"""The testing kit, shipped in the package as `trio.testing` is: the instant in-memory port
of the effect interpreter (`MemoryPort`), a core driven through it (`CoreDriver`),
`make_core`, a fake clock, `wait_until` and free ports (spec/effects.md, "Ports"); an instant
metadata store with etcd's semantics (`InstantStore`) and a driver of the load manager over
it (`ManagerDriver`); brokers joined by in-memory replication streams (`ReplicaNetwork`)."""

from danube.testing.driver import CoreDriver
from danube.testing.memory import MemoryPort, WaiterResult
from danube.testing.replication import ReplicaNetwork
from danube.testing.store import DECISIONS, InstantStore, ManagerDriver
from danube.testing.support import FakeClock, free_port, free_ports, make_core, wait_until

__all__ = [
    "DECISIONS",
    "CoreDriver",
    "FakeClock",
    "InstantStore",
    "ManagerDriver",
    "MemoryPort",
    "ReplicaNetwork",
    "WaiterResult",
    "free_port",
    "free_ports",
    "make_core",
    "wait_until",
]
