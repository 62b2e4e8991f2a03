"""summary.json's `metrics` block: every registry figure for every group it exists for, with the
interval its definition declares. Pure: a run's columns in, a dict out.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from scipy import special

from fairbench.analysis.censored import average_ranks
from fairbench.analysis.columns import Cols, rows_of, sub_order
from fairbench.analysis.definitions import METRICS
from fairbench.analysis.intervals import share_interval
from fairbench.analysis.metric import Metric
from fairbench.analysis.metrics import nondecreasing

# a share's population, indicator, whether the run is in time order, and its score with the
# score's order by value over the run (None, None: the share thresholds no score)
_Shares = dict[str, tuple[np.ndarray, np.ndarray, bool, np.ndarray | None, np.ndarray | None]]


def _entry(
    metric: Metric, c: Cols, mask: np.ndarray | None, shares: _Shares | None = None
) -> dict[str, Any]:
    """One figure of one group (`mask`; None: the run). `shares`: what `_share_inputs` made
    for the figure, kept for the next group."""
    assert metric.compute is not None
    est = None
    if metric.latency is not None:
        # the estimate the summary's latency_ci_ms made of this group (Cols.estimate): its
        # value and bound are metric.compute's, censored.quantile of the same observations
        which, q = metric.latency
        est = c.estimate(which, mask, q)
        value, bound = est.value, est.bound
    else:
        value, bound = metric.compute(c, mask)
    entry: dict[str, Any] = {"value": _clean(value * metric.scale), "lower_bound": bound}
    if est is not None:
        entry.update(est.as_dict(scale=metric.scale))
    elif metric.share_of is not None and metric.indicator is not None:
        found = _share_inputs(metric, c, {} if shares is None else shares)
        pop, indicator, in_order, score, by_value = found
        rows = pop if mask is None else pop & mask
        n = int(rows.sum())
        if n and math.isfinite(value):
            at = rows if mask is None else rows_of(rows)  # a group's by index (rows_of)
            x = indicator[at]
            s = z = None
            if score is not None and by_value is not None:
                s = score[at]
                # the group's normal scores from the run's order by value (O(n), no sort)
                sub = sub_order(by_value, rows)
                z = special.ndtri(average_ranks(s[sub], sub) / (n + 1))
            if not in_order:  # else c.t[rows] is in time order: its stable argsort is 0 … n−1
                order = np.argsort(c.t[at], kind="stable")
                x = x[order]
                if s is not None and z is not None:
                    s, z = s[order], z[order]
            it = share_interval(x, scores=s, normal=z)
            entry.update(it.fields(), n=n)
    elif metric.interval is not None:
        entry.update(metric.interval(c, mask).fields(metric.scale))
    return entry


def _share_inputs(
    metric: Metric, c: Cols, shares: _Shares
) -> tuple[np.ndarray, np.ndarray, bool, np.ndarray | None, np.ndarray | None]:
    """A share's population, 0/1 indicator, score and the score's order by value (None: the
    share has none) over the run, made once per figure for every group, and whether the
    run's requests are in time order already (a records window is, in plan order). Why:
    each group's entry made both again (a late indicator is 3 passes over the run) and
    sorted the group's times, 4 share figures x 7 groups on a fleet run, ~0.3 of its metrics
    block's 1.4 CPU s at 1.9M requests (issue 35); a score's order is one argsort for every
    group (`sub_order`)."""
    if metric.name not in shares:
        assert metric.share_of is not None and metric.indicator is not None
        in_order = nondecreasing(c.t)
        score = by_value = None
        if metric.score is not None:
            score = np.asarray(metric.score(c), dtype=np.float64)
            by_value = np.argsort(score)
        shares[metric.name] = (
            metric.share_of(c),
            np.asarray(metric.indicator(c)),
            in_order,
            score,
            by_value,
        )
    return shares[metric.name]


def _entry_once(
    made: dict[tuple[str, bytes], dict[str, Any]],
    metric: Metric,
    c: Cols,
    mask: np.ndarray,
    packed: bytes,
    shares: _Shares,
) -> dict[str, Any]:
    """`_entry` for a group's rows, made once per (figure, rows): keyed by the packed mask
    (exact, not a hash). Why: an entry is a function of the rows alone, and on a fleet run 5
    of the 10 groups repeat another's rows (interactive = chat, batch = reports = summary,
    best-effort = search = embed); their shares' intervals, slowdowns and drift were computed
    again (issue 35). The caller copies it, so no two groups share one dict."""
    key = (metric.name, packed)
    if key not in made:
        made[key] = _entry(metric, c, mask, shares)
    return made[key]


def _clean(v: float) -> float | None:
    return None if not math.isfinite(v) else round(float(v), 6)


def metrics_block(
    c: Cols,
    names: Mapping[str, list[str]],
    timeline_values: Mapping[str, float | None],
    timeline_cis: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """summary.json's `metrics`: every registry figure for every group it exists for.

    `names`: the group keys per dimension (tenant ids, class names, workload names), in the
    order `c`'s codes use; `timeline_values`: the overall timeline figures, and
    `timeline_cis` the interval fields (`Interval.fields`) of those that have one."""
    out: dict[str, Any] = {"overall": {}, "class": {}, "tenant": {}, "workload": {}}
    codes = {"class": c.cls, "tenant": c.tenant, "workload": c.workload}
    # each group's mask made once, not once per figure (a compare of every request each:
    # about 170 of them on a fleet run, issue 35); None for a group with no request
    masks: dict[tuple[str, int], np.ndarray | None] = {}

    def mask_of(group: str, k: int) -> np.ndarray | None:
        if (group, k) not in masks:
            mask = codes[group] == k
            masks[(group, k)] = mask if mask.any() else None
        return masks[(group, k)]

    # each group's entries made once per set of requests: a group with the same requests as
    # another (a fleet's batch class = the reports tenant = the summary workload) gets a copy
    made: dict[tuple[str, bytes], dict[str, Any]] = {}
    packed: dict[tuple[str, int], bytes] = {}
    shares: _Shares = {}

    def packed_of(group: str, k: int) -> bytes:
        if (group, k) not in packed:
            packed[(group, k)] = np.packbits(masks[(group, k)]).tobytes()
        return packed[(group, k)]

    for i, metric in enumerate(METRICS):
        if metric.compute is None:
            if "overall" in metric.groups:
                value = timeline_values.get(metric.name)
                out["overall"][metric.name] = {
                    "value": None if value is None else _clean(value),
                    "lower_bound": False,
                    **(timeline_cis or {}).get(metric.name, {}),
                }
            continue
        if "overall" in metric.groups:
            out["overall"][metric.name] = _entry(metric, c, None, shares)
        for group in ("class", "tenant", "workload"):
            if group not in metric.groups:
                continue
            for k, key in enumerate(names[group]):
                mask = mask_of(group, k)
                if mask is None:
                    continue
                out[group].setdefault(key, {})[metric.name] = copy.deepcopy(
                    _entry_once(made, metric, c, mask, packed_of(group, k), shares)
                )
        following = METRICS[i + 1].latency if i + 1 < len(METRICS) else None
        if metric.latency is not None and (following is None or following[0] != metric.latency[0]):
            c.forget()  # the last percentile of this latency: its curves go (bounded memory)
    return out
