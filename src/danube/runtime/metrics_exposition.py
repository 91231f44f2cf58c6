"""The broker's `/metrics` text exposition made a metric family at a time (issue 28: a scrape
of 1,000 topics held 4.9 times its body beside it while answered, outside every pool the budget
governs; bench/RESULTS.md, issue 28 part 17): `exposition_parts` formats each family alone
and drops it before the next, and a per-topic histogram family comes in pieces
(`histogram_pieces`) whose later ones are sent without the family's head."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol

from prometheus_client import generate_latest
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector


class Buckets(Protocol):
    """A histogram as `metrics.Histogram` keeps it."""

    total: float

    def buckets(self) -> Sequence[tuple[str, float]]: ...


class _OneFamily(Collector):
    """A registry of one metric family, for `generate_latest`'s formatting of it alone."""

    __slots__ = ("family",)

    def __init__(self, family: Metric) -> None:
        self.family = family

    def collect(self) -> Iterator[Metric]:
        yield self.family


def exposition_parts(registry: Collector) -> list[bytes]:
    """The text exposition of `registry`, a part per metric family, the same bytes as
    `generate_latest(registry)` once joined. `generate_latest` keeps a line string of every
    family's every sample until the end, then joins them into one string and encodes it: at
    1,000 topics a scrape held 4.9 times its body beside it at its peak (14.6 MiB beside a 3.0
    MiB body, `bench/metrics_scrape_memory.py`; bench/RESULTS.md, issue 28 part 17), outside
    every pool the budget governs, and its tens of thousands of small strings spread over
    CPython's arenas among the load's objects. Here a family's lines are formatted, joined and
    encoded at once and dropped before the next family's (its samples too: the collector makes
    them as they are asked for, a per-topic histogram in pieces of 100 topics): the peak is the
    body's bytes and one family's (or piece's) samples and lines.
    """
    parts = []
    for family in registry.collect():
        text = generate_latest(_OneFamily(family))
        # a histogram's later piece: its lines only, after the family's head in the first
        parts.append(text.split(b"\n", 2)[2] if isinstance(family, Continued) else text)
    return parts


HISTOGRAM_PIECE_TOPICS = 100
"""Topics a piece of a per-topic histogram family holds (`histogram_pieces`)."""


class Continued(HistogramMetricFamily):
    """A piece of a histogram family after its first: formatted without the family's `# HELP`
    and `# TYPE` lines (`exposition_parts`), added to the pieces before it when summed
    (`metrics._summed`)."""


def histogram_pieces(
    name: str, doc: str, broker: str, table: Mapping[str, Buckets]
) -> Iterator[Metric]:
    """A per-topic histogram family in pieces of `HISTOGRAM_PIECE_TOPICS` topics, each handed
    on once filled: a topic's histogram is 14-16 samples, each with its own labels dict (about
    330 bytes a sample made and 300 formatted), so the whole family of 1,000 topics held
    5 MiB of samples and 4.7 MiB of lines while it was formatted
    (`bench/metrics_scrape_memory.py`)."""
    topics = sorted(table)
    for start in range(0, max(len(topics), 1), HISTOGRAM_PIECE_TOPICS):
        piece = (Continued if start else HistogramMetricFamily)(
            name, doc, labels=["broker", "topic"]
        )
        for topic in topics[start : start + HISTOGRAM_PIECE_TOPICS]:
            histogram = table[topic]
            piece.add_metric([broker, topic], histogram.buckets(), histogram.total)
        yield piece
        del piece
