"""A platform's own metrics into the history: a Prometheus range-query export (the JSON of
`/api/v1/query_range`, docs/history.md shows it) of TTFT histograms and queue lengths.

What is read:
- TTFT histograms, `vllm:time_to_first_token_seconds_bucket` (or any `*time_to_first_token*` or
  `*ttft*` `_bucket` series with an `le` label, in seconds; other histograms are left out):
  cumulative counters, turned into increments between consecutive samples (a
  counter that goes down was reset: its new value is the increment, as Prometheus' `increase`
  counts it; an increment belongs to the bucket of the earlier sample's time), summed over
  series with the same `le` and over each `--step` bucket of time. Each
  bucket gets `ttft_p99` (ms) by the standard `histogram_quantile` interpolation, and an
  interval bounded by bucket resolution: the lower edge of the bucket holding rank
  q·n − 1.96·√(n·q(1−q)) to the upper edge of the one holding q·n + 1.96·√(…) (binomial ranks,
  95%). No interval can be finer than the buckets; a rank in the +Inf bucket has no upper end.
- Queue lengths, `vllm:num_requests_waiting` or our `scheduler_queue_depth` (gauges), summed
  over series (pods) at each sample time, then the sums' mean and variance in each step bucket
  (`queue_depth_mean`, `queue_depth_var`, group `overall`); the reference scheduler's
  `scheduler_queue_depth_by{dimension="tenant"|"slo_class", name}` the same per group
  (`tenant.<name>`, `class.<name>`).

Or scrape files: the text exposition format (what `/metrics` answers, saved one scrape a file),
read with prometheus_client's parser. A sample's time is its own timestamp when the exposition
writes one, else the file's name: epoch seconds or an ISO time (`1800000000.prom`,
`2026-12-03T12:00:00Z.txt`).

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
QUEUE_BY = "scheduler_queue_depth_by"  # {dimension="tenant"|"slo_class", name}
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


Series = tuple[dict[str, str], list[tuple[float, float]]]


def read_export(path: Path) -> list[Series]:
    """The (labels, [(time, value)]) series of a range-query JSON export."""
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
    out: list[Series] = []
    for k, series in enumerate(result):
        labels = series.get("metric") if isinstance(series, dict) else None
        raw = series.get("values") if isinstance(series, dict) else None
        if not isinstance(labels, dict) or not isinstance(raw, list):
            raise HistoryError(f"{path}: data.result[{k}] needs `metric` and `values`")
        try:
            values = [(float(t), float(v)) for t, v in raw]
        except (TypeError, ValueError):
            raise HistoryError(f'{path}: data.result[{k}].values: pairs [time, "value"]') from None
        out.append(({str(a): str(b) for a, b in labels.items()}, values))
    return out


def _file_time(path: Path) -> float | None:
    import datetime as dt

    stem = path.name.split(".prom")[0].removesuffix(".txt")
    try:
        return float(stem)
    except ValueError:
        pass
    try:
        stamp = dt.datetime.fromisoformat(stem.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (stamp if stamp.tzinfo else stamp.replace(tzinfo=dt.UTC)).timestamp()


def read_scrapes(paths: list[Path]) -> list[Series]:
    """The series of text-exposition scrape files (one scrape each), by prometheus_client's
    parser; a sample's time is its timestamp, else its file's name (module docstring)."""
    from prometheus_client.parser import text_string_to_metric_families

    series: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = defaultdict(list)
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise HistoryError(f"{path}: file not found") from None
        except (OSError, UnicodeDecodeError) as error:
            raise HistoryError(f"{path}: cannot read it ({error})") from None
        at = _file_time(path)
        try:
            samples = [s for fam in text_string_to_metric_families(text) for s in fam.samples]
        except Exception as error:  # the parser raises ValueError, TypeError, IndexError...
            raise HistoryError(
                f"{path}: not a Prometheus text exposition ({' '.join(str(error).split())[:120]})"
            ) from None
        for s in samples:
            t = s.timestamp if s.timestamp is not None else at
            if t is None:
                raise HistoryError(
                    f"{path}: sample {s.name} has no timestamp; name the file by its scrape "
                    "time (e.g. 1800000000.prom or 2026-12-03T12:00:00Z.prom)"
                )
            key = tuple(sorted({"__name__": s.name, **s.labels}.items()))
            series[key].append((float(t), float(s.value)))
    return [(dict(k), sorted(v)) for k, v in series.items()]


def _is_ttft(metric: str) -> bool:
    """A TTFT histogram's bucket series: vLLM's, or any `*time_to_first_token*_bucket` /
    `*ttft*_bucket` in seconds (a scrape holds other histograms too, never mixed in)."""
    return metric in TTFT or (
        metric.endswith("_bucket") and ("time_to_first_token" in metric or "ttft" in metric)
    )


def _queue_group(labels: dict[str, str]) -> str | None:
    """The group a queue-length series counts in, or None when it is not one."""
    metric = labels.get("__name__", "")
    if metric in QUEUE:
        return "overall"
    if metric == QUEUE_BY and labels.get("name"):
        dim = {"tenant": "tenant", "slo_class": "class"}.get(labels.get("dimension", ""))
        return f"{dim}.{labels['name']}" if dim else None
    return None


def entries(path: Path | list[Path], name: str, step_s: float) -> list[Entry]:
    """The TTFT p99 and queue-length entries, one per (metric, group, step bucket), of a
    range-query JSON export or of text scrape files."""
    paths = [path] if isinstance(path, Path) else list(path)
    if len(paths) == 1 and paths[0].suffix == ".json":
        found = read_export(paths[0])
    else:
        found = read_scrapes(paths)
    return entries_of(found, name, step_s, ", ".join(str(p) for p in paths))


def entries_of(series: list[Series], name: str, step_s: float, where: str) -> list[Entry]:
    hist: dict[float, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    # group -> sample time -> the sum over series (pods) of the queue length then
    queue: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    for labels, values in series:
        metric = labels.get("__name__", "")
        if _is_ttft(metric) and "le" in labels:
            le = float(labels["le"])
            for t, inc in _increments(sorted(values)):
                hist[math.floor(t / step_s) * step_s][le] += inc
        elif (group := _queue_group(labels)) is not None:
            for t, v in values:
                queue[group][t] += v
    if not hist and not queue:
        raise HistoryError(
            f"{where}: no series of {', '.join((*TTFT, *QUEUE, QUEUE_BY))} (by `__name__`)"
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
                        "overall",
                        value * 1e3,
                        low * 1e3,
                        None if math.isinf(high) else high * 1e3,
                        False,
                        int(cum[-1]),
                    )
                ],
            )
        )
    steps: dict[float, list[tuple[Any, ...]]] = defaultdict(list)
    for group, sums in sorted(queue.items()):
        per_step: dict[float, list[float]] = defaultdict(list)
        for t, v in sums.items():
            per_step[math.floor(t / step_s) * step_s].append(v)
        for t, samples in per_step.items():
            v = np.asarray(samples)
            steps[t].append(("queue_depth_mean", group, float(v.mean()), None, None, False, len(v)))
            steps[t].append(("queue_depth_var", group, float(v.var()), None, None, False, len(v)))
    for t, points in sorted(steps.items()):
        out.append(_entry(name, "queue_depth", t, points))
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
        points=points,
    )


def import_export(db: Path, path: Path | list[Path], name: str, step_s: float) -> tuple[int, int]:
    from fairbench.history import store

    return store.add(db, entries(path, name, step_s))
