"""summary.json: what a run measured, per tenant, per SLO class and overall.

Schema history (`SUMMARY_SCHEMA_VERSION`):
  1 — schema_version, valid, invalid_reasons, plan_digest, seed, window_s, closed_loop,
      accounting, generator_health, overall / tenants / slo_classes blocks (counts by status,
      latency percentiles in ms — ttft, ttft_sent, tpot, itl_max, e2e, e2e_sent, queue —,
      throughput, goodput, slo_attainment), fairness (Jain over service ÷ fair share,
      slowdown Jain and worst ratio, service difference, windowed Jain, starvation), drift
      (TTFT p99 per rolling window, drift with CI and trend test, queue-depth variance), and
      latency_ci_ms in every group (CIs of p50/p90/p99; since this wave order statistics, see
      fairbench.analysis.intervals), and a per-workload
      block beside tenants and classes.

  2 — latencies count every admitted request: unfinished ones are right-censored
      (fairbench.analysis.censored), percentiles are Kaplan–Meier estimates, and a percentile
      that falls in censored mass is a lower bound (`latency_ms.<m>.lower_bound` lists them);
      `metrics`: every figure of the registry (fairbench.analysis.registry) per group, with
      its interval; `completion`: the unfinished share against the run's limit; fairness:
      `service_difference` is the backlogged service difference (VTC's bounded quantity),
      `jain_windows` Jain's index among backlogged tenants per window, `isolation` per tenant,
      `vtc_service_difference` the VTC artifact's table; `max_service_gap` is gone (it was the
      final demand difference, the same for every policy).

Requests are counted in the measurement window: intended time in [warmup, duration − cooldown].
Throughput divides by the window's length. A run marked INVALID stays INVALID in every output.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from fairbench.analysis import censored, fairness, frame_memo
from fairbench.analysis import intervals as iv
from fairbench.analysis import metrics as m
from fairbench.analysis.backlog import wait_intervals
from fairbench.analysis.blocks import (
    drift_block,
    fairness_over_time,
    latency_cis,
    queue_depth_block,
    slowdown_block,
    starvation_block,
    unloaded_ns,
)
from fairbench.analysis.columns import Cols, rows_of, sub_order
from fairbench.analysis.fairness_ci import service_difference_interval
from fairbench.analysis.isolation import isolation_detail
from fairbench.analysis.registry import metrics_block
from fairbench.analysis.sessions import session_block
from fairbench.run.records import STATUSES
from fairbench.workload.models import Scenario

SUMMARY_SCHEMA_VERSION = 2
_PERCENTILES = (0.50, 0.90, 0.95, 0.99, 0.999)


class _FromCols:
    """A latency of the run's columns, selected per group through `Cols.obs`, so the summary's
    percentiles, its intervals and the registry's figures share one Kaplan–Meier curve."""

    def __init__(self, cols: Cols, which: str) -> None:
        self.cols, self.which = cols, which

    def select(self, rows: np.ndarray | None = None) -> censored.Observations:
        return self.cols.obs(self.which, rows)

    def estimate(self, rows: np.ndarray | None, q: float) -> censored.QuantileEstimate:
        return self.cols.estimate(self.which, rows, q)


class _RunOrdered:
    """A latency outside the run's columns (the ITL max), selected per group; once the run's
    own percentiles have sorted its observations (Kaplan–Meier: some are censored), each
    group's order by value is read off the run's (`columns.sub_order`, O(n)), not argsorted
    again. Why: under three-tier the 10-minute fleet's ITL max is censored, and its groups'
    argsorts (864k, 432k and 1.3M observations, most of them tied) were 0.19 of the summary's
    CPU s (issue 35). Where the run's needed no sort (nothing censored: order statistics by
    partition), its groups are selected as before. Any order by value serves what reads it
    (`censored._km`, `Observations.sorted_time`): the same figures, to the bit."""

    def __init__(self, rows: censored.RowObservations) -> None:
        self.rows = rows
        self._run: censored.Observations | None = None  # until a group is selected
        self._order: np.ndarray | None = None

    def select(self, rows: np.ndarray | None = None) -> censored.Observations:
        if rows is None:
            self._run = self.rows.select()
            return self._run
        self.forget()
        obs = self.rows.select(rows)
        if self._order is not None:
            obs.__dict__["_by_value"] = sub_order(self._order, rows[self.rows.eligible])
        return obs

    def forget(self) -> None:
        """The run's block is made: keep its order (if its percentiles sorted), not its
        observations and curve, which would lie under the run's intervals, the summary's peak
        (the 10-minute three-tier fleet: +125 MB, issue 35)."""
        if self._run is not None:
            self._order = self._run.__dict__.get("_by_value")
            self._run = None


def _latencies(
    df: pd.DataFrame, timeout_s: float | None, cols: Cols
) -> dict[str, censored.RowObservations | _FromCols | _RunOrdered]:
    return {
        "ttft": _FromCols(cols, "ttft"),
        "ttft_sent": _same_or(censored.ttft_rows(df, timeout_s, sent=True), cols, "ttft"),
        "tpot": _FromCols(cols, "tpot"),
        "itl_max": _RunOrdered(censored.itl_max_rows(df, timeout_s)),
        "e2e": _FromCols(cols, "e2e"),
        "e2e_sent": _same_or(censored.e2e_rows(df, timeout_s, sent=True), cols, "e2e"),
    }


def _same_or(
    rows: censored.RowObservations, cols: Cols, which: str
) -> censored.RowObservations | _FromCols:
    """The from-send latency, or, where it equals the from-intended one request for request (a
    simulated run sends exactly on time), that one's observations: each group's percentiles
    then come from one sort, not two (issue 35). Equal arrays give equal percentiles."""
    time, seen, eligible = (getattr(cols, f"{which}_{s}") for s in ("t", "o", "x"))
    same = (
        np.array_equal(rows.eligible, eligible)
        and np.array_equal(rows.observed, seen)
        and np.array_equal(rows.time, time, equal_nan=True)
    )
    return _FromCols(cols, which) if same else rows


def latency_percentiles(obs: censored.Observations) -> dict[str, Any]:
    """p50 … p99.9 in ms (Kaplan–Meier; see fairbench.analysis.censored), how many were
    unfinished, and which percentiles are only lower bounds."""
    out: dict[str, Any] = {}
    bounds = []
    for q, (value, bound) in zip(_PERCENTILES, censored.quantiles(obs, _PERCENTILES), strict=True):
        key = f"p{q * 100:g}"
        out[key] = None if not np.isfinite(value) else round(value / 1e6, 4)
        if bound:
            bounds.append(key)
    out["n"] = len(obs)
    out["unfinished"] = obs.unfinished
    out["lower_bound"] = bounds
    return out


def measurement_window(scn: Scenario, plan_span_s: float) -> tuple[float, float]:
    end = scn.run.duration if scn.run.duration is not None else plan_span_s
    return scn.run.warmup, max(end - scn.run.cooldown, scn.run.warmup)


def slo_table(scn: Scenario) -> dict[str, dict[str, float | None]]:
    return {
        name: {"ttft": c.ttft, "tpot": c.tpot, "e2e": c.e2e} for name, c in scn.slo_classes.items()
    }


@dataclass(frozen=True)
class _BlockColumns:
    """The columns every group's block reads, converted once: status as its index in
    `STATUSES` (−1 for another), queue time and output tokens as floats (NaN for none).
    Converting them per group (an Arrow string column to Python strs, then five compares) was
    6 of a fleet run's 52 summary seconds (issue 35)."""

    status: np.ndarray
    queue: np.ndarray
    tokens: np.ndarray

    @classmethod
    def of(cls, df: pd.DataFrame) -> _BlockColumns:
        return cls(
            frame_memo.codes_of(df["status"], STATUSES),
            frame_memo.floats(df, "queue_time_ns"),  # the same conversion, kept
            df["output_tokens"].to_numpy(dtype=np.float64),
        )


def group_block(
    df: pd.DataFrame | _BlockColumns,
    met: np.ndarray,
    window_s: float,
    latencies: Mapping[str, censored.RowObservations | _FromCols | _RunOrdered],
    rows: np.ndarray | None = None,
) -> dict[str, Any]:
    """A group's block (`rows` of the window's records; all of them when None), read from
    column arrays under a mask: no copy of the frame per group. `df` may be the frame or its
    `_BlockColumns`, converted once for every group."""
    arrays = df if isinstance(df, _BlockColumns) else _BlockColumns.of(df)
    # the group's rows by their indices, taken from each column: the mask's elements in its
    # order, without its branch per element (columns.rows_of, issue 35)
    sel: slice | np.ndarray = slice(None) if rows is None else rows_of(rows)
    status = arrays.status[sel]
    n = len(status)
    found = np.bincount(status[status >= 0], minlength=len(STATUSES))
    counts = {s: int(found[k]) for k, s in enumerate(STATUSES)}
    ok = status == 0
    good_mask = met[sel]
    block: dict[str, Any] = {"requests": n, "counts": counts}
    block["latency_ms"] = {
        name: latency_percentiles(obs.select(rows)) for name, obs in latencies.items()
    }
    queue = arrays.queue[sel][ok]
    queue = queue[np.isfinite(queue)]  # what the target reported, for requests that ended ok
    block["latency_ms"]["queue"] = latency_percentiles(
        censored.Observations(queue, np.ones(len(queue), dtype=bool))
    )
    tokens = arrays.tokens[sel]
    good = int(good_mask.sum())
    block["throughput"] = {
        "requests_per_s": int(ok.sum()) / window_s if window_s > 0 else None,
        "output_tokens_per_s": float(tokens[ok].sum()) / window_s if window_s > 0 else None,
    }
    block["goodput"] = {
        "requests_per_s": float(good) / window_s if window_s > 0 else None,
        "output_tokens_per_s": float(tokens[good_mask].sum()) / window_s if window_s > 0 else None,
    }
    block["slo_attainment"] = float(good / n) if n else None
    block["rejected_share"] = counts["rejected"] / n if n else None
    return block


def _group_once(
    blocks: dict[bytes, dict[str, Any]],
    rows: np.ndarray,
    arrays: _BlockColumns,
    met: np.ndarray,
    window_s: float,
    latencies: Mapping[str, censored.RowObservations | _FromCols | _RunOrdered],
    cols: Cols,
) -> dict[str, Any]:
    """The group's block with its `latency_ci_ms`, made once per set of rows (`blocks`, keyed
    by the packed mask: exact, not a hash). Why: both are functions of the rows alone, and on
    a fleet run the classes and workloads repeat the tenants (interactive = chat, batch =
    reports = summary, best-effort = search = embed): their percentiles, curves and
    dependence were computed again per group, about a third of the groups' rows (issue 35).
    The caller copies it, so no two places of summary.json share one dict."""
    packed = np.packbits(rows).tobytes()
    found = blocks.get(packed)
    if found is None:
        found = group_block(arrays, met, window_s, latencies, rows)
        found["latency_ci_ms"] = latency_cis(latencies, rows)
        cols.forget()
        blocks[packed] = found
    return found


def fairness_block(df: pd.DataFrame, weights: Mapping[str, float]) -> dict[str, Any]:
    """Jain's index over tenants of service ÷ weighted max-min fair share given demand.

    Demand is the weighted tokens each tenant *offered* in the window; capacity is the service
    the system actually delivered; service counts only what was served."""
    tenants = sorted(weights)
    service = m.service_tokens(df)
    offered = df["prompt_tokens"].to_numpy(dtype=np.float64) + 2.0 * df["max_tokens"].to_numpy(
        dtype=np.float64
    )
    names = frame_memo.name_codes(df, "tenant", tenants)  # codes: no str per row
    got = np.array([service[names == k].sum() for k in range(len(tenants))])
    demand = np.array([offered[names == k].sum() for k in range(len(tenants))])
    w = np.array([weights[t] for t in tenants])
    fair = m.water_fill(demand, w, got.sum())
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(fair > 0, got / fair, np.nan)
    present = np.isfinite(ratio)
    return {
        "jain_service": m.jain(ratio[present]) if present.any() else None,
        "tenants": {
            t: {
                "service_tokens": float(g),
                "demand_tokens": float(d),
                "fair_share_tokens": float(f),
                "share_of_fair": None if not np.isfinite(r) else float(r),
            }
            for t, g, d, f, r in zip(tenants, got, demand, fair, ratio, strict=True)
        },
    }


def completion_block(df: pd.DataFrame, limit: float) -> dict[str, Any]:
    """How much of the window never finished, against the run's limit: a tail computed with
    many unfinished requests is mostly bounds, and the run says so beside VALID/INVALID."""
    timeout, cancelled = (frame_memo.equals(df, "status", s) for s in ("timeout", "cancelled"))
    unfinished = int((timeout | cancelled).sum())
    share = unfinished / len(df) if len(df) else 0.0
    within = share <= limit
    line = (
        f"{unfinished} of {len(df)} requests in the window unfinished ({share:.1%}; limit "
        f"{limit:.1%})"
    )
    return {"unfinished": unfinished, "share": share, "limit": limit, "ok": within, "line": line}


def _timeline(df: pd.DataFrame, scn: Scenario, timeout_s: float | None) -> fairness.Timeline:
    col = lambda name: frame_memo.floats(df, name)  # noqa: E731
    ok = frame_memo.equals(df, "status", "ok")
    client, present = frame_memo.codes(df, "tenant")  # codes into the sorted names
    seen = censored.last_seen_ns(df, timeout_s)
    first = censored.first_response_ns(df)
    wait_start, wait_end, _ = wait_intervals(df, timeout_s)  # waiting for the scheduler
    end = np.where(ok, col("t_done_ns"), seen)
    return fairness.build_timeline(
        client,
        {t.id: t.weight for t in scn.tenants},
        wait_start / 1e9,
        wait_end / 1e9,
        first / 1e9,
        end / 1e9,
        m.service_tokens(df),
        names=present,
    )


def backlogged_fairness(
    df: pd.DataFrame, scn: Scenario, start: float, end: float, window_s: float
) -> dict[str, Any]:
    """The timeline fairness figures: the backlogged service difference and Jain's index among
    backlogged tenants per window (fairbench.analysis.fairness)."""
    tl = _timeline(df, scn, scn.run.timeout)
    sd = fairness.backlogged_service_difference(tl)
    _, values = fairness.backlogged_jain(tl, start, end, window_s)
    finite = values[np.isfinite(values)]
    jain_ci = iv.window_mean_interval(
        values, bounds=(0.0, 1.0), what="contended windows", window_s=window_s
    )
    _, _, known = wait_intervals(df, scn.run.timeout)
    basis = "scheduler" if known.all() else ("proxy" if not known.any() else "mixed")
    return {
        "service_difference": {
            # no two tenants ever waited for the scheduler at once: no contention, difference 0
            "max": sd.max if sd.max is not None else 0.0,
            "reason": None if sd.max is not None else "no contention",
            "backlog_basis": basis,
            "pair": list(sd.pair) if sd.pair else None,
            "both_backlogged_s": sd.both_backlogged_s,
            "unit": "tokens (1·prompt + 2·output, ÷ weight)",
        },
        "jain_windows": {
            "window_s": window_s,
            "start_s": float(start),
            "contended": len(finite),
            "reason": None if len(finite) else "no contended window",
            "mean": float(finite.mean()) if len(finite) else None,
            "mean_ci": jain_ci.fields() if len(finite) else None,
            "min": float(finite.min()) if len(finite) else None,
            "median": float(np.median(finite)) if len(finite) else None,
            "values": [None if not np.isfinite(x) else round(float(x), 4) for x in values],
        },
    }


def _isolation_detail(summary: dict[str, Any], df: pd.DataFrame, scn: Scenario) -> dict[str, Any]:
    """Each tenant's isolation with its absolute difference and flag (fairbench.analysis.isolation):
    the SLO is the strictest TTFT SLO of the classes the tenant sent in the window."""
    tenants, tenant_names = frame_memo.codes(df, "tenant")
    classes, class_names = frame_memo.codes(df, "slo_class")
    slo: dict[str, float | None] = {}
    for t in summary["tenants"]:
        code = tenant_names.index(t) if t in tenant_names else -2  # −2: no row
        sent = {class_names[c] for c in m.distinct(classes[tenants == code]) if c >= 0}
        limits = [scn.slo_classes[c].ttft for c in sent if c in scn.slo_classes]
        limits = [x for x in limits if x is not None]
        slo[t] = min(limits) * 1e3 if limits else None
    mix = {t: b["latency_ms"]["ttft"]["p99"] for t, b in summary["tenants"].items()}
    return isolation_detail(mix, summary["fairness"]["solo_ttft_p99_ms"], slo)


def _window(records: pd.DataFrame, start: float, end: float) -> pd.DataFrame:
    """The records whose intended time is in [start, end] s. Records come in plan order, so the
    window is one contiguous slice: taken without copying a million-row frame."""
    t = records["t_intended_ns"].to_numpy(dtype=np.float64) / 1e9
    if m.nondecreasing(t):
        a, b = np.searchsorted(t, start, side="left"), np.searchsorted(t, end, side="right")
        return records.iloc[a:b].reset_index(drop=True)
    return records[(t >= start) & (t <= end)].reset_index(drop=True)


def build_summary(
    records: pd.DataFrame,
    scn: Scenario,
    plan_digest: str,
    seed: int,
    plan_span_s: float,
    health: Mapping[str, Any],
    accounting: Mapping[str, Any],
    closed_loop: bool = False,
    solo_ttft_p99_ns: Mapping[str, float] | None = None,
    solo_ttft_p99_log_se: Mapping[str, float | None] | None = None,
) -> dict[str, Any]:
    """summary.json from a run's records. `solo_ttft_p99_ns`: each tenant's TTFT p99 when its
    requests run alone (the isolation figure's solo arm), where the caller could measure it;
    `solo_ttft_p99_log_se` the standard error of its log (the isolation interval's solo side)."""
    start, end = measurement_window(scn, plan_span_s)
    df = _window(records, start, end)
    with frame_memo.converted_once(df):  # each column of the window converted once
        return _build_summary(
            records,
            df,
            scn,
            plan_digest,
            seed,
            (start, end),
            health,
            accounting,
            closed_loop,
            solo_ttft_p99_ns,
            solo_ttft_p99_log_se,
        )


def _build_summary(
    records: pd.DataFrame,
    df: pd.DataFrame,
    scn: Scenario,
    plan_digest: str,
    seed: int,
    span: tuple[float, float],
    health: Mapping[str, Any],
    accounting: Mapping[str, Any],
    closed_loop: bool,
    solo_ttft_p99_ns: Mapping[str, float] | None,
    solo_ttft_p99_log_se: Mapping[str, float | None] | None,
) -> dict[str, Any]:
    start, end = span
    window = end - start
    timeout_s = scn.run.timeout
    names = {
        "tenant": [t.id for t in scn.tenants],
        "class": list(scn.slo_classes),
        "workload": list(scn.workloads),
    }
    window_s = max(10.0, min(60.0, window / 10)) if window > 0 else 10.0
    # the timeline first, before the run's columns (Cols) and the overall block are held: it
    # is the summary's largest transient (+270 MB at 1.9M requests), and after them it lay on
    # top of them (the 10-minute fleet's peak 1,980 -> 1,810 MB, its summary rebuilt alone).
    # The columns it converts stay for the rest (frame_memo), none converted twice (issue 35)
    backlogged = backlogged_fairness(df, scn, start, end, window_s) if len(df) else {}
    cols = Cols.of(
        df,
        slos=slo_table(scn),
        classes=names["class"],
        tenants=names["tenant"],
        workloads=names["workload"],
        window_s=window,
        timeout_s=timeout_s,
        unloaded_ns=unloaded_ns(df, scn)[0] if len(df) else np.zeros(0),
        solo_ttft_p99_ns=solo_ttft_p99_ns,
        solo_ttft_p99_log_se=solo_ttft_p99_log_se,
    )
    met = cols.met
    latencies = _latencies(df, timeout_s, cols)
    arrays = _BlockColumns.of(df)
    reasons = list(health.get("invalid_reasons", []))
    if not accounting.get("holds", False):
        reasons.append(f"accounting broken: {accounting.get('line')}")
    summary: dict[str, Any] = {
        "schema_version": SUMMARY_SCHEMA_VERSION,
        "valid": not reasons,
        "invalid_reasons": reasons,
        "plan_digest": plan_digest,
        "seed": seed,
        "scenario": scn.name,
        "window_s": [start, end],
        "closed_loop": closed_loop,
        "accounting": dict(accounting),
        "generator_health": dict(health),
        "completion": completion_block(df, scn.run.max_unfinished),
        "overall": group_block(arrays, met, window, latencies),
        "tenants": {},
        "slo_classes": {},
    }
    summary["workloads"] = {}
    for source in latencies.values():  # the run's ITL max: its order kept, not its curve
        if isinstance(source, _RunOrdered):
            source.forget()
    # each group's curves go once its block and intervals are made (bounded memory); the
    # estimates stay in `cols` for the metrics block (Cols.estimate)
    summary["overall"]["latency_ci_ms"] = latency_cis(latencies, None) if len(df) else {}
    cols.forget()
    # a group with the same requests as one already made (a class that is one tenant, a
    # workload that is one class: 5 of a fleet run's 10 groups) gets a copy of its block
    blocks: dict[bytes, dict[str, Any]] = {}
    for key, column in (
        ("tenants", "tenant"),
        ("slo_classes", "slo_class"),
        ("workloads", "workload"),
    ):
        # the groups as codes into their sorted names: one pass over the column, not a string
        # compare per group, and the frame's memo (the timeline made the tenants' already)
        codes, present = frame_memo.codes(df, column)
        for k, name in enumerate(present):
            rows = codes == k
            summary[key][name] = copy.deepcopy(
                _group_once(blocks, rows, arrays, met, window, latencies, cols)
            )
    summary["fairness"] = fairness_block(df, {t.id: t.weight for t in scn.tenants})
    timeline: dict[str, float | None] = {}
    if len(df):
        summary["fairness"].update(slowdown_block(df, scn))
        summary["fairness"]["starvation"] = starvation_block(df, scn)
        summary["fairness"].update(fairness_over_time(df, scn, window_s))
        summary["fairness"].update(backlogged)
        summary["drift"] = {
            "ttft_p99": drift_block(df, window_s, window_s / 2),
            "queue_depth": queue_depth_block(df),
        }
        jw = summary["fairness"]["jain_windows"]
        timeline = {
            "service_difference": summary["fairness"]["service_difference"]["max"],
            "jain_backlogged": jw["mean"],
            "jain_backlogged_min": jw["min"],
        }
    contended = bool(timeline) and summary["fairness"]["service_difference"]["reason"] is None
    cis: dict[str, Any] = {"service_difference": service_difference_interval(contended).fields()}
    if len(df) and jw["mean_ci"]:
        cis["jain_backlogged"] = jw["mean_ci"]
    summary["metrics"] = metrics_block(cols, names, timeline, cis)
    summary["fairness"]["solo_ttft_p99_ms"] = {
        t: round(v / 1e6, 4) for t, v in (solo_ttft_p99_ns or {}).items()
    }
    iso = summary["metrics"]["tenant"]
    summary["fairness"]["isolation"] = {
        tenant: iso.get(tenant, {}).get("isolation", {}).get("value") for tenant in names["tenant"]
    }
    summary["fairness"]["isolation_detail"] = _isolation_detail(summary, df, scn)
    overall = summary["metrics"]["overall"]
    for name in ("worst_slowdown_ratio", "jain_slowdown"):
        summary["fairness"][name] = overall[name]["value"]
    sessions = session_block(records, timeout_s, (start, end))  # multi-turn runs only
    if sessions:
        summary["sessions"] = sessions
    return summary
