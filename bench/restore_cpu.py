"""CPU seconds of what a restart does per topic before it is ready, in this process: the
metadata store's snapshot load (`MetadataState.restore`), its scan and `BrokerCore.restore`,
with the cyclic garbage collector on (as before issue 23 point 3's round 4) or paused (as the
broker's start does now). On a shared machine CPU time is steadier than a restart's wall time.

`python -m bench.restore_cpu DIR/data/metadata/metadata.snapshot [--collector on|off]`,
for instance on a directory `bench.topic_synth` made.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time
from pathlib import Path

from danube.machines.dispatch import QueueLimits
from danube.machines.node.core import BrokerCore, BrokerIdentity
from danube.metadata.state import MetadataState
from danube.values.config import Policies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("snapshot", type=Path)
    parser.add_argument("--collector", choices=("on", "off"), default="off")
    args = parser.parse_args()
    if args.collector == "off":
        gc.disable()
    started = time.process_time()
    state = MetadataState()
    state.restore(json.loads(args.snapshot.read_bytes()))
    loaded = time.process_time()
    entries = {kv.key: kv.value for kv in state.scan("/")}
    scanned = time.process_time()
    core = BrokerCore(
        BrokerIdentity("http://127.0.0.1:6650", "http://127.0.0.1:6650"),
        rng=random.Random(1),
        default_policies=Policies(),
        queue_limits=QueueLimits(),
    )
    core.restore(entries)
    restored = time.process_time()
    topics = len(core.catalogue.topics_by_name)
    print(f"collector {args.collector}: {len(entries):,} keys, {topics:,} topics; CPU s:", end=" ")
    print(f"load {loaded - started:.2f}, scan {scanned - loaded:.2f},", end=" ")
    print(f"restore {restored - scanned:.2f}, total {restored - started:.2f}")


if __name__ == "__main__":
    main()
