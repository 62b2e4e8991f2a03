"""The tests' one reader of Prometheus text: prometheus_client's parser, as fairbench's own.

`sample_sum(text, name)` is the sum of every sample called `name` (all label sets), the form in
which tests read a counter or a gauge off a server's /metrics.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def samples(text: str, name: str) -> list[float]:
    """The values of every sample called `name` in Prometheus text `text`."""
    return [
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    ]


def sample_sum(text: str, name: str) -> float:
    """The sum of the samples called `name`; AssertionError when the text has none."""
    values = samples(text, name)
    assert values, f"{name} not exported"
    return sum(values)
