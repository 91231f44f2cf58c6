"""Runs the hostile-input suite (tests/hostile) against real broker processes and prints its
numbers: inputs tried, statuses, worst HealthCheck latency, broker memory before and after.

    python -m bench.hostile [--report bench/hostile.json] [pytest arguments, e.g. -k rapid]

The numbers are written as JSON to the report file (bench/RESULTS.md, "Hostile input",
quotes it). The suite's size is tuned by the HOSTILE_* variables the test modules name
(HOSTILE_EXAMPLES, HOSTILE_RESETS, ...). Exits with pytest's exit code: a failing assertion
is a finding, and the numbers are printed either way.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", type=Path, default=ROOT / "bench" / "hostile.json")
    args, pytest_args = parser.parse_known_args()
    env = {**os.environ, "HOSTILE_REPORT": str(args.report)}
    started = time.monotonic()
    code = subprocess.call(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/hostile",
            *pytest_args,
        ],
        cwd=ROOT,
        env=env,
    )
    took = time.monotonic() - started
    if not args.report.exists():
        print("no report written", file=sys.stderr)
        return code or 1
    report = json.loads(args.report.read_text())
    report["suite_seconds"] = round(took, 1)
    args.report.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    print(f"\nhostile suite: {took:.0f} s, pytest exit code {code}")
    print(f"inputs tried: {report['inputs_tried']}")
    print(
        f"HealthCheck: {report['health_checks']} calls, worst {report['worst_health_ms']:.1f} ms"
        f", {report['slow_health_checks']} over {report['health_limit_ms']:.0f} ms"
    )
    print(f"statuses: {report['statuses']}")
    print(f"unclean outcomes: {report['unclean']}")
    for offender in report["offenders"][:10]:
        print(f"  {offender}")
    for broker in report["brokers"]:
        print(
            f"  {broker['name']}: RSS {broker['rss_before_mb']:.0f} -> "
            f"{broker['rss_after_mb']:.0f} MB (peak {broker['rss_peak_mb']:.0f}), worst "
            f"HealthCheck {broker['worst_health_ms']:.0f} ms, tracebacks {broker['tracebacks']}"
        )
    return code


if __name__ == "__main__":
    sys.exit(main())
