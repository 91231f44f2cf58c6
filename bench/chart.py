"""One picture of a peer benchmark run: the systems side by side in each workload, every label
carrying the system's durability, since a throughput means little without it."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from bench.workload import SystemResult

LATENCIES = (
    ("ack_p50_ms", "ack p50"),
    ("ack_p99_ms", "ack p99"),
    ("e2e_p50_ms", "end-to-end p50"),
    ("e2e_p99_ms", "end-to-end p99"),
)
MEMORY = (("base_rss_mib", "at start"), ("idle_rss_mib", "with idle topics"))


def _label(result: SystemResult) -> str:
    # The durability's first clause is its gist: `AOF appendfsync everysec: fsync once ...`.
    short = re.split(r"[:;,]", result.durability, maxsplit=1)[0].strip()
    return f"{result.system}\n" + "\n".join(textwrap.wrap(short, 28))


def _bars(
    axes: Axes, results: list[SystemResult], fields: tuple[tuple[str, str], ...], unit: str
) -> None:
    """Grouped horizontal bars, one group per system (first system on top), with each value
    written beside its bar and "n/a" where a system has no number rather than a zero bar."""
    height = 0.8 / len(fields)
    peak = max(
        (value for r in results for name, _ in fields if (value := getattr(r, name)) is not None),
        default=1.0,
    )
    for slot, (name, legend) in enumerate(fields):
        for row, result in enumerate(results):
            y = row + (slot - (len(fields) - 1) / 2) * height
            value = getattr(result, name)
            if value is None:
                axes.text(0, y, " n/a", va="center", fontsize=8, color="grey")
                continue
            axes.barh(y, value, height, color=f"C{slot}", label=legend if row == 0 else None)
            shown = f"{value:,.0f}" if value >= 100 else f"{value:.3g}"
            axes.text(value, y, f" {shown} {unit}", va="center", fontsize=8)
    axes.set_yticks(range(len(results)), [_label(r) for r in results], fontsize=8)
    axes.set_ylim(len(results) - 0.5, -0.5)
    axes.set_xlim(0, peak * 1.35)
    axes.grid(axis="x", alpha=0.3)
    if len(fields) > 1:
        # Below the panel: inside it, the legend would hide the value written beside a bar.
        axes.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.06), ncol=len(fields))


def write_chart(results: list[SystemResult], path: Path, title: str) -> None:
    """`title` names the run's conditions, e.g. "1 KiB messages, one producer process, 2 vCPU
    loopback"; the panels cannot know them."""
    # The Agg canvas directly, not pyplot: no display, no global backend or figure registry.
    figure = Figure(figsize=(15, 3 + 1.6 * len(results)), layout="constrained")
    FigureCanvasAgg(figure)
    (publish, consume), (latency, memory) = figure.subplots(2, 2)
    _bars(publish, results, (("publish_per_s", "publish"),), "msg/s")
    publish.set_title("Durable publish, msg/s (higher is better)")
    _bars(consume, results, (("consume_per_s", "consume"),), "msg/s")
    consume.set_title("Consume, msg/s (higher is better)")
    _bars(latency, results, LATENCIES, "ms")
    latency.set_title("Latency at the offered rate, ms (lower is better)")
    _bars(memory, results, MEMORY, "MiB")
    memory.set_title("Server RSS, MiB (lower is better)")
    figure.suptitle(title)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
