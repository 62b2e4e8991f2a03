"""The objectives `sweep` and `pareto` rank runs on: NAME:max|min specs checked against the
metric registry before anything runs (a typo must not cost a sweep), each run's values of
them, which runs are on the Pareto front, and a sweep point's label.

It exists so that the front a command prints is computed outside the command line. It imports
`analysis.registry` and `decide.sweep`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

DEFAULT_OBJECTIVES = ["goodput:max", "ttft_p99:min", "jain_backlogged:max"]


class ObjectiveError(ValueError):
    """An --objective that is not NAME:max or NAME:min of a known metric (one line)."""


def parse_objectives(specs: list[str]) -> tuple[list[str], list[str]]:
    """NAME:max|min specs as (names, senses); ObjectiveError names the spec and the fix."""
    from fairbench.analysis.registry import MetricError, parse_name

    names, senses = [], []
    for spec in specs:
        name, _, sense = spec.rpartition(":")
        if sense not in ("max", "min") or not name:
            raise ObjectiveError(
                f"--objective {spec!r}: use NAME:max or NAME:min, e.g. goodput:max"
            )
        try:
            parse_name(name)
        except MetricError as error:
            raise ObjectiveError(f"--objective {spec!r}: {error}") from None
        names.append(name)
        senses.append(sense)
    return names, senses


def front(
    summaries: list[dict[str, Any]], names: list[str], senses: list[str]
) -> tuple[np.ndarray, np.ndarray]:
    """Each run's value of each objective (a row per run) and whether it is on the front."""
    from fairbench.analysis.registry import metric_value
    from fairbench.decide.sweep import pareto_front

    values = np.array([[metric_value(s, n) for n in names] for s in summaries])
    return values, pareto_front(values, senses)


def point_labels(rows: list[dict[str, Any]]) -> list[str]:
    """A sweep row's label: its parameters, and its seed where the sweep varies it."""
    return [
        " ".join(f"{k}={v}" for k, v in r["params"].items())
        + (f" seed={r['seed']}" if r["seed"] is not None else "")
        for r in rows
    ]
