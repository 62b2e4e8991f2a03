"""A platform's own metrics into the history: a Prometheus range-query export (the JSON of
`/api/v1/query_range`, docs/history.md shows it) of TTFT histograms and queue lengths.

What is read:
- TTFT histograms, `vllm:time_to_first_token_seconds_bucket` (or any `*_bucket` series with an
  `le` label): cumulative counters, turned into increments between consecutive samples (a
  counter that goes down was reset: its new value is the increment, as Prometheus' `increase`
  counts it; an increment belongs to the bucket of the earlier sample's time), summed over
  series with the same `le` and over each `--step` bucket of time. Each
  bucket gets `ttft_p99` (ms) by the standard `histogram_quantile` interpolation, and an
  interval bounded by bucket resolution: the lower edge of the bucket holding rank
  q·n − 1.96·√(n·q(1−q)) to the upper edge of the one holding q·n + 1.96·√(…) (binomial ranks,
  95%). No interval can be finer than the buckets; a rank in the +Inf bucket has no upper end.
- Queue lengths, `vllm:num_requests_waiting` or our `scheduler_queue_depth` (gauges): the
  samples' mean and variance in each step bucket (`queue_depth_mean`, `queue_depth_var`).

Each (metric, bucket) is one entry of source `prometheus`, scenario `--name`, its time the
bucket's start; importing the same export twice keeps one.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from fairbench.history.errors import HistoryError
from fairbench.history.store import Entry

TTFT = ("vllm:time_to_first_token_seconds_bucket",)
QUEUE = ("vllm:num_requests_waiting", "scheduler_queue_depth")
Z95 = 1.959963984540054


def _bucket_of(cum: np.ndarray, rank: float) -> int:
    return int(np.searchsorted(cum, rank, side="left"))


def histogram_quantile(les: list[float], cum: list[float], q: float) -> tuple[float, ...]:
    """(value, ci_low, ci_high) in the buckets' unit; ci_high is inf past the last finite le."""
    c = np.asarray(cum, dtype=float)
    n = c[-1]
    edges = [0.0, *les]
    rank = q * n
    i = _bucket_of(c, rank)
    if math.isinf(les[i]):
        value = les[i - 1] if i > 0 else math.nan
    else:
        below = c[i - 1] if i > 0 else 0.0
        width = c[i] - below
        value = edges[i] + (edges[i + 1] - edges[i]) * ((rank - below) / width if width else 1.0)
    half = Z95 * math.sqrt(n * q * (1 - q))
    lo = _bucket_of(c, max(rank - half, 0.0))
    hi = min(_bucket_of(c, min(rank + half, n)), len(les) - 1)
    return float(value), float(edges[lo]), float(les[hi])


def _increments(values: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out = []
    for (t, prev), (_, v) in itertools.pairwise(values):  # counted from the earlier sample
        out.append((t, v - prev if v >= prev else v))
    return out


def read_export(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise HistoryError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise HistoryError(f"{path}: not a JSON export ({error})") from None
    ok = isinstance(data, dict) and data.get("status") == "success"
    inner = data.get("data") if ok else None
    if not isinstance(inner, dict) or inner.get("resultType") != "matrix":
        raise HistoryError(
            f"{path}: not a Prometheus range-query export "
            '({"status": "success", "data": {"resultType": "matrix", ...}})'
        )
    result = inner.get("result")
    if not isinstance(result, list):
        raise HistoryError(f"{path}: data.result is not a list")
    return result


def entries(path: Path, name: str, step_s: float) -> list[Entry]:
    """The export's TTFT p99 and queue-length entries, one per (metric, step bucket)."""
    hist: dict[float, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    queue: dict[float, list[float]] = defaultdict(list)
    for k, series in enumerate(read_export(path)):
        labels = series.get("metric") if isinstance(series, dict) else None
        raw = series.get("values") if isinstance(series, dict) else None
        if not isinstance(labels, dict) or not isinstance(raw, list):
            raise HistoryError(f"{path}: data.result[{k}] needs `metric` and `values`")
        try:
            values = [(float(t), float(v)) for t, v in raw]
        except (TypeError, ValueError):
            raise HistoryError(f'{path}: data.result[{k}].values: pairs [time, "value"]') from None
        metric = str(labels.get("__name__", ""))
        if metric in TTFT or (metric.endswith("_bucket") and "le" in labels):
            le = float(labels["le"])
            for t, inc in _increments(sorted(values)):
                hist[math.floor(t / step_s) * step_s][le] += inc
        elif metric in QUEUE:
            for t, v in values:
                queue[math.floor(t / step_s) * step_s].append(v)
    if not hist and not queue:
        raise HistoryError(
            f"{path}: no series of {', '.join(TTFT + QUEUE)} (by `__name__`) in the export"
        )
    out = []
    for t, counts in sorted(hist.items()):
        les = sorted(counts)
        cum = list(np.maximum.accumulate([counts[le] for le in les]))
        if not les or not math.isinf(les[-1]) or cum[-1] <= 0:
            continue
        value, low, high = histogram_quantile(les, cum, 0.99)
        if math.isnan(value):
            continue
        out.append(
            _entry(
                name,
                "ttft_p99",
                t,
                [
                    (
                        "ttft_p99",
                        value * 1e3,
                        low * 1e3,
                        None if math.isinf(high) else high * 1e3,
                        False,
                        int(cum[-1]),
                    )
                ],
            )
        )
    for t, samples in sorted(queue.items()):
        v = np.asarray(samples)
        out.append(
            _entry(
                name,
                "queue_depth",
                t,
                [
                    ("queue_depth_mean", float(v.mean()), None, None, False, len(v)),
                    ("queue_depth_var", float(v.var()), None, None, False, len(v)),
                ],
            )
        )
    return out


def _entry(name: str, kind: str, t: float, points: list[tuple[Any, ...]]) -> Entry:
    import datetime as dt

    key = hashlib.sha256(f"prometheus\0{name}\0{kind}\0{t!r}".encode()).hexdigest()[:32]
    stamp = dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M")
    return Entry(
        run_key=key,
        name=f"{name}@{stamp}",
        source="prometheus",
        scenario=name,
        started_at=t,
        points=[(p[0], "overall", *p[1:]) for p in points],
    )


def import_export(db: Path, path: Path, name: str, step_s: float) -> tuple[int, int]:
    from fairbench.history import store

    return store.add(db, entries(path, name, step_s))
