"""RSS of a broker with each build of the kernels (issue 28, "numba ahead of time"):
`import danube.runtime.server` (maxrss of a fresh interpreter) and a fresh standalone broker
(VmRSS once it is ready, started as bench/memory_soak.py starts one, with a 256 MiB budget),
for `DANUBE_KERNELS=jit` and `=aot`.

    .venv/bin/python -m bench.kernel_builds_memory [--repeat 3]

Needs the ahead-of-time module (`python -m danube.cli.build_kernels`). Prints one line per build
with the median of the repeats.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from danube.localcluster.broker_process import BrokerProcess

IMPORT = (
    "import resource, sys\n"
    "import danube.runtime.server\n"
    "from danube.kernels import loaded\n"
    "print(loaded.IMPLEMENTATION, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,"
    " 'numba' in sys.modules)\n"
)


def _vm_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def import_mib(build: str) -> tuple[float, str]:
    env = {**os.environ, "DANUBE_KERNELS": build}
    out = subprocess.run(
        [sys.executable, "-c", IMPORT], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    return float(out[1]), f"{out[0]} numba-imported={out[2]}"


def broker_mib(build: str) -> float:
    with tempfile.TemporaryDirectory(prefix="danube-kernel-rss-") as work:
        broker = BrokerProcess(
            Path(work) / "data",
            extra_args=("--memory-budget", "256MiB"),
            env={"DANUBE_KERNELS": build},
        )
        with broker:
            time.sleep(2)  # settled after `broker_ready`
            return _vm_rss_mib(broker.pid)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for build in ("jit", "aot"):
        imports = [import_mib(build) for _ in range(args.repeat)]
        brokers = [broker_mib(build) for _ in range(args.repeat)]
        print(
            f"DANUBE_KERNELS={build}: import danube.runtime.server maxrss "
            f"{statistics.median(m for m, _ in imports):.1f} MiB ({imports[0][1]}); "
            f"fresh broker VmRSS {statistics.median(brokers):.1f} MiB "
            f"(runs: {', '.join(f'{b:.1f}' for b in brokers)})"
        )


if __name__ == "__main__":
    main()
