"""The broker's latency breakdown from its own histograms (issue 23, point 2):
`danube_stage_latency_ms{stage=...}` scraped from a broker's metrics endpoint, printed as a
table of count, mean, p50 and p99 per stage (quantiles interpolated within the buckets, as
Prometheus' `histogram_quantile` does). Given two scrapes, the table is of what happened
between them (`bench.e2e_reliable --stages` scrapes around its latency phase).

    .venv/bin/python -m bench.stage_breakdown http://127.0.0.1:9040
"""

from __future__ import annotations

import argparse
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from danube.runtime.stage_metrics import STAGES

FAMILY = "danube_stage_latency_ms"

Scrape = dict[str, tuple[list[tuple[float, float]], float]]
"""stage -> (cumulative buckets as (upper bound, count), sum in ms)."""


def scrape(metrics_url: str) -> Scrape:
    with urllib.request.urlopen(f"{metrics_url}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return parse(text)


def parse(text: str) -> Scrape:
    out: Scrape = {}
    for family in text_string_to_metric_families(text):
        if family.name != FAMILY:
            continue
        for sample in family.samples:
            stage = sample.labels.get("stage", "")
            buckets, _ = out.setdefault(stage, ([], 0.0))
            if sample.name.endswith("_bucket"):
                buckets.append((float(sample.labels["le"]), sample.value))
            elif sample.name.endswith("_sum"):
                out[stage] = (buckets, sample.value)
    return out


def difference(after: Scrape, before: Scrape | None) -> Scrape:
    if before is None:
        return after
    out: Scrape = {}
    for stage, (buckets, total) in after.items():
        old_buckets, old_total = before.get(stage, ([], 0.0))
        old = dict(old_buckets)
        out[stage] = ([(le, n - old.get(le, 0.0)) for le, n in buckets], total - old_total)
    return out


def quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """`histogram_quantile`: linear within the bucket holding rank q·count."""
    ordered = sorted(buckets)
    count = ordered[-1][1] if ordered else 0.0
    if count <= 0:
        return float("nan")
    rank = q * count
    lower_bound, lower_count = 0.0, 0.0
    for bound, cumulative in ordered:
        if cumulative >= rank:
            if bound == float("inf"):
                return lower_bound
            width = cumulative - lower_count
            share = (rank - lower_count) / width if width else 1.0
            return lower_bound + (bound - lower_bound) * share
        lower_bound, lower_count = bound, cumulative
    return lower_bound


def table(stages: Scrape) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for stage in STAGES:
        if stage not in stages:
            continue
        buckets, total = stages[stage]
        count = max((n for _, n in buckets), default=0.0)
        rows.append(
            {
                "stage": stage,
                "count": int(count),
                "mean_ms": round(total / count, 4) if count else None,
                "p50_ms": round(quantile(buckets, 0.5), 4) if count else None,
                "p99_ms": round(quantile(buckets, 0.99), 4) if count else None,
            }
        )
    return rows


def render(rows: list[dict[str, object]]) -> str:
    lines = ["| stage | count | mean ms | p50 ms | p99 ms |", "|---|---|---|---|---|"]
    for row in rows:
        lines.append(
            f"| {row['stage']} | {row['count']} | {row['mean_ms']} | {row['p50_ms']} "
            f"| {row['p99_ms']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics_url", help="the broker's metrics endpoint, http://host:port")
    args = parser.parse_args()
    print(render(table(scrape(args.metrics_url))))


if __name__ == "__main__":
    main()
