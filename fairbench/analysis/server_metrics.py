"""Scraped server metrics, made readable: counters into rates, histograms into quantiles.

Input: the long table fairbench.run.scrape writes (t_ns, metric, labels, value, type, family).
Everything here is pure. Semantics follow Prometheus: a counter that goes down was reset (its
new value is all increase); a histogram's quantile is read from the cumulative bucket counts
gained over a window, interpolating linearly inside the bucket (`histogram_quantile`), and a
quantile that falls in the +Inf bucket is the largest finite bound (a floor, not a value).
Series of one family are summed over their labels (engine replicas, model names).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd


def _family_rows(df: pd.DataFrame, family: str) -> pd.DataFrame:
    if "family" in df.columns:
        rows = df[df["family"] == family]
        if len(rows):
            return rows
    names = [family + suffix for suffix in ("", "_total", "_bucket", "_sum", "_count")]
    return df[df["metric"].isin(names)]


def family_types(df: pd.DataFrame) -> dict[str, str]:
    """family -> counter | gauge | histogram | summary | unknown (older files: from names)."""
    if "family" in df.columns and "type" in df.columns:
        pairs = df[["family", "type"]].drop_duplicates()
        return dict(zip(pairs["family"], pairs["type"], strict=True))
    out: dict[str, str] = {}
    for name in df["metric"].unique():
        if name.endswith("_bucket"):
            out[name[: -len("_bucket")]] = "histogram"
        elif name.endswith("_total"):
            out[name[: -len("_total")]] = "counter"
        elif not name.endswith(("_sum", "_count")):
            out[name] = "gauge"
    return out


def gauge(df: pd.DataFrame, family: str) -> tuple[np.ndarray, np.ndarray]:
    """(t seconds, value summed over labels) per scrape."""
    rows = _family_rows(df, family)
    per_t = rows.groupby("t_ns")["value"].sum().sort_index()
    return per_t.index.to_numpy() / 1e9, per_t.to_numpy(float)


def increases(values: np.ndarray) -> np.ndarray:
    """Per-step increase of one counter series, resets counted as Prometheus does."""
    if len(values) < 2:
        return np.zeros(0)
    d = np.diff(values)
    return np.where(d < 0, values[1:], d)


def counter_steps(df: pd.DataFrame, family: str) -> tuple[np.ndarray, np.ndarray]:
    """(scrape times in seconds, increase between consecutive scrapes summed over labels)."""
    rows = _family_rows(df, family)
    rows = rows[rows["metric"] == rows["metric"].iloc[0]] if len(rows) else rows
    times = np.sort(rows["t_ns"].unique())
    if len(times) < 2:
        return times / 1e9, np.zeros(0)
    total = np.zeros(len(times) - 1)
    for _, series in rows.groupby("labels"):
        s = series.set_index("t_ns")["value"].reindex(times).ffill().fillna(0.0)
        total += increases(s.to_numpy(float))
    return times / 1e9, total


def counter_rate(df: pd.DataFrame, family: str) -> tuple[np.ndarray, np.ndarray]:
    """(t seconds at each step's end, increase per second summed over labels)."""
    times, steps = counter_steps(df, family)
    if not len(steps):
        return np.zeros(0), np.zeros(0)
    return times[1:], steps / np.maximum(np.diff(times), 1e-9)


def histogram_quantile(bounds: np.ndarray, cumulative: np.ndarray, q: float) -> float:
    """Prometheus' histogram_quantile over one set of cumulative bucket counts."""
    order = np.argsort(bounds)
    bounds, cumulative = bounds[order], np.maximum.accumulate(cumulative[order])
    total = cumulative[-1] if len(cumulative) else 0.0
    if total <= 0:
        return float("nan")
    rank = q * total
    i = int(np.searchsorted(cumulative, rank, side="left"))
    if i >= len(bounds) - 1 and np.isinf(bounds[-1]):
        finite = bounds[np.isfinite(bounds)]
        return float(finite[-1]) if len(finite) else float("nan")
    lower = 0.0 if i == 0 else float(bounds[i - 1])
    below = 0.0 if i == 0 else float(cumulative[i - 1])
    inside = float(cumulative[i]) - below
    if inside <= 0:
        return float(bounds[i])
    if i == 0 and bounds[0] <= 0:
        return float(bounds[0])
    return float(lower + (float(bounds[i]) - lower) * (rank - below) / inside)


def _buckets(df: pd.DataFrame, family: str) -> pd.DataFrame:
    """Cumulative counts: rows t_ns, columns le (float), summed over the other labels."""
    rows = _family_rows(df, family)
    rows = rows[rows["metric"] == family + "_bucket"]
    if not len(rows):
        return pd.DataFrame()
    le = rows["labels"].map(lambda text: float(json.loads(text)["le"]))
    table = rows.assign(le=le).pivot_table(
        index="t_ns", columns="le", values="value", aggfunc="sum"
    )
    return table.sort_index().sort_index(axis=1).ffill().fillna(0.0)


def histogram_over_time(
    df: pd.DataFrame, family: str, quantiles: tuple[float, ...] = (0.5, 0.99), steps: int = 5
) -> dict[str, Any]:
    """Quantiles of what each window of `steps` scrapes observed; t at each window's end."""
    table = _buckets(df, family)
    out: dict[str, Any] = {"t": [], **{f"p{round(q * 100):g}": [] for q in quantiles}}
    if len(table) < 2:
        return out
    bounds = table.columns.to_numpy(float)
    values = table.to_numpy(float)
    times = table.index.to_numpy() / 1e9
    for end in range(steps, len(values) + steps - 1, steps):
        end = min(end, len(values) - 1)
        start = max(0, end - steps)
        gained = values[end] - values[start]
        if np.any(gained < 0):  # a reset inside the window: the later counts are all new
            gained = values[end]
        if gained.max(initial=0) <= 0:
            continue
        out["t"].append(float(times[end]))
        for q in quantiles:
            out[f"p{round(q * 100):g}"].append(histogram_quantile(bounds, gained, q))
    return out


def histogram_run(df: pd.DataFrame, family: str) -> dict[str, float] | None:
    """Count, mean, p50 and p99 of what the whole run observed (last scrape minus first)."""
    table = _buckets(df, family)
    if len(table) < 2:
        return None
    bounds = table.columns.to_numpy(float)
    gained = table.iloc[-1].to_numpy(float) - table.iloc[0].to_numpy(float)
    if np.any(gained < 0):
        gained = table.iloc[-1].to_numpy(float)
    count = float(gained.max(initial=0))
    if count <= 0:
        return {"count": 0.0, "mean": float("nan"), "p50": float("nan"), "p99": float("nan")}
    sums = _family_rows(df, family)
    sums = sums[sums["metric"] == family + "_sum"].groupby("t_ns")["value"].sum().sort_index()
    mean = float("nan")
    if len(sums) >= 2 and sums.iloc[-1] >= sums.iloc[0]:
        mean = float(sums.iloc[-1] - sums.iloc[0]) / count
    return {
        "count": count,
        "mean": mean,
        "p50": histogram_quantile(bounds, gained, 0.5),
        "p99": histogram_quantile(bounds, gained, 0.99),
    }


def overview(df: pd.DataFrame, headline: tuple[str, ...]) -> list[dict[str, Any]]:
    """One row per headline family the server exported: what the run saw of it."""
    types = family_types(df)
    rows: list[dict[str, Any]] = []
    for name in headline:
        family = name[: -len("_total")] if name.endswith("_total") else name
        kind = types.get(family) or types.get(name)
        if kind is None:
            continue
        row: dict[str, Any] = {"metric": name, "type": kind}
        if kind == "histogram":
            run = histogram_run(df, family)
            if run is None:
                continue
            row.update(run)
        elif kind == "counter":
            times, steps = counter_steps(df, family)
            if not len(steps):
                continue
            increase = float(steps.sum())
            row.update(
                increase=increase,
                rate_mean=increase / max(float(times[-1] - times[0]), 1e-9),
                rate_max=float(np.max(steps / np.maximum(np.diff(times), 1e-9))),
            )
        else:
            t, v = gauge(df, family)
            if not len(t):
                continue
            row.update(mean=float(np.mean(v)), max=float(np.max(v)), last=float(v[-1]))
        rows.append(row)
    return rows
