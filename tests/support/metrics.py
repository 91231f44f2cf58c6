"""Scraping a broker's metrics endpoint over real HTTP and reading the samples, for the
metrics, CLI and cluster tests."""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


class Samples:
    """Every sample of one scrape."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.samples = [
            Sample(sample.name, dict(sample.labels), sample.value)
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        ]

    def matching(self, name: str, **labels: str) -> list[Sample]:
        """Samples of `name` (a sample name: `x_total`, `x_bucket`, `x_count`...) whose
        labels include `labels`."""
        return [
            s
            for s in self.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        ]

    def value(self, name: str, **labels: str) -> float:
        """The sum of the matching samples; 0 when there is none (a series not born yet)."""
        return sum(s.value for s in self.matching(name, **labels))

    def names(self) -> set[str]:
        return {s.name for s in self.samples}


def http_get(url: str, timeout: float = 10.0) -> tuple[int, str, str]:
    """(status, content type, body) of a GET, error statuses included."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read().decode()


def scrape(base_url: str) -> Samples:
    """`GET <base_url>/metrics`, parsed."""
    status, _, body = http_get(f"{base_url}/metrics")
    if status != 200:
        raise AssertionError(f"/metrics answered {status}: {body}")
    return Samples(body)
