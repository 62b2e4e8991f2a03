"""End-to-end known-truth audit: a simulated run's printed backlogged figures against an oracle
that reads only its records.parquet and the definitions' words (docs/metrics.md,
fairbench.analysis.backlog): the measurement window's requests; waits from the scheduler's
report (`passed_over_ns`, `backlog_ns`) or, without one, arrival → first response; service
1·prompt + 2·output spread from first response to end (done, else last seen); D = S_f − S_g
read at every request's start and end inside each both-backlogged piece, and its left limit.
This checks the wiring (columns, units, window, weights) the unit oracles cannot see."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fairbench.analysis.metrics import jain
from fairbench.analysis.summary import build_summary
from fairbench.pipeline import run_scenario
from fairbench.run import RunOptions
from fairbench.workload.loading import parse_scenario, read_yaml

REPO = Path(__file__).resolve().parents[1]


def _union(lo: np.ndarray, hi: np.ndarray) -> list[list[float]]:
    keep = np.isfinite(lo) & np.isfinite(hi) & (hi > lo)
    out: list[list[float]] = []
    for a, b in sorted(zip(lo[keep].tolist(), hi[keep].tolist(), strict=True)):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


class _Tenant:
    """One tenant's merged waits and served requests (cost ÷ weight), seconds."""

    def __init__(self, waits: list[list[float]], s: np.ndarray, e: np.ndarray, c: np.ndarray):
        self.waits, self.s, self.e, self.c = waits, s, e, c
        self.points = np.unique(np.concatenate([s, e]))

    def service(self, t: np.ndarray, left: bool = False) -> np.ndarray:
        t = np.asarray(t, dtype=float)[:, None]
        span = self.e - self.s
        spread = np.clip((t - self.s) / np.where(span > 0, span, 1.0), 0.0, 1.0)
        jump = (t > self.e) if left else (t >= self.e)
        return (np.where(span > 0, spread, jump) * self.c).sum(axis=1)


def oracle(records: pd.DataFrame, window: tuple[float, float], weights: dict, timeout_s: float):
    """(service difference or None, Jain per window) from the records alone."""
    lo_w, hi_w = window
    t_int = records["t_intended_ns"].to_numpy(float) / 1e9
    df = records[(t_int >= lo_w) & (t_int <= hi_w)].reset_index(drop=True)

    def col(name: str) -> np.ndarray:
        return df[name].to_numpy(float) if name in df else np.full(len(df), np.nan)

    status = df["status"].to_numpy()
    ok = status == "ok"
    intended, sent = col("t_intended_ns"), col("t_sent_ns")
    first = col("t_first_token_ns")
    first = np.where(np.isnan(first), np.where(ok, col("t_done_ns"), np.nan), first)
    seen = col("t_end_ns")
    for name in ("t_done_ns", "t_last_token_ns", "t_first_token_ns", "t_first_byte_ns"):
        seen = np.where(np.isnan(seen), col(name), seen)
    seen = np.where(np.isnan(seen), sent, seen)
    seen = np.where(status == "timeout", np.fmax(seen, intended + timeout_s * 1e9), seen)
    backlog, passed = col("backlog_ns"), col("passed_over_ns")
    admitted = (status != "rejected") & np.isfinite(sent)
    told = np.isfinite(backlog)
    waited = told & (backlog > 0)
    w_lo = np.where(told, np.where(waited, sent + passed, np.nan), intended)
    w_hi = np.where(told, np.where(waited, sent + passed + backlog, np.nan), first)
    w_hi = np.where(~told & np.isnan(first), seen, w_hi)
    w_lo, w_hi = (
        np.where(told | admitted, w_lo, np.nan) / 1e9,
        np.where(told | admitted, w_hi, np.nan) / 1e9,
    )
    cost = np.where(
        ok | (col("output_tokens") > 0), col("prompt_tokens") + 2 * col("output_tokens"), 0.0
    )
    start, end = first / 1e9, np.where(ok, col("t_done_ns"), seen) / 1e9
    served = (cost > 0) & np.isfinite(start) & np.isfinite(end)
    tenants = {}
    for name in sorted(set(df["tenant"])):
        m = df["tenant"].to_numpy() == name
        k = m & served
        w = weights.get(name, 1.0)
        tenants[name] = _Tenant(_union(w_lo[m], w_hi[m]), start[k], end[k], cost[k] / w)
    names = list(tenants)
    best = None
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            f, g = tenants[a], tenants[b]
            for x, y in f.waits:
                for u, v in g.waits:
                    lo, hi = max(x, u), min(y, v)
                    if hi <= lo:
                        continue
                    pts = np.concatenate([[lo, hi], f.points, g.points])
                    pts = np.unique(pts[(pts >= lo) & (pts <= hi)])
                    inner = pts[pts > lo]
                    d = np.concatenate(
                        [
                            f.service(pts) - g.service(pts),
                            f.service(inner, True) - g.service(inner, True),
                        ]
                    )
                    best = max(best or 0.0, float(d.max() - d.min()))
    return best, tenants


def jain_windows(tenants: dict, window: tuple[float, float], window_s: float) -> np.ndarray:
    lo_w, hi_w = window
    out = []
    for a in np.arange(lo_w, hi_w, window_s):
        b = min(a + window_s, hi_w)
        got = [
            float(t.service([b])[0] - t.service([a])[0])
            for t in tenants.values()
            if sum(max(0.0, min(y, b) - max(x, a)) for x, y in t.waits) >= 0.5 * (b - a)
        ]
        out.append(jain(np.array(got)) if len(got) >= 2 else np.nan)
    return np.array(out)


def _check(summary: dict, records: pd.DataFrame, weights: dict, timeout_s: float) -> None:
    window = tuple(summary["window_s"])
    want, tenants = oracle(records, window, weights, timeout_s)
    sd = summary["fairness"]["service_difference"]
    if want is None:
        assert sd["reason"] == "no contention"
    else:
        assert sd["max"] == pytest.approx(want, rel=1e-9)
    jw = summary["fairness"]["jain_windows"]
    values = np.array([np.nan if v is None else v for v in jw["values"]])
    expect = jain_windows(tenants, window, jw["window_s"])
    assert np.allclose(np.round(expect, 4), values, equal_nan=True, atol=1e-4)


@pytest.mark.parametrize("basis", ["scheduler", "proxy"])
def test_a_runs_backlogged_figures_equal_the_oracle_from_its_records(
    basis: str, tmp_path: Path
) -> None:
    path = REPO / "scenarios" / "gate-dogfood.yaml"
    scn = parse_scenario(read_yaml(path.read_text()), str(path), REPO / "scenarios")
    result = run_scenario(scn, RunOptions(out=tmp_path / "run", seed=1))
    records = pd.read_parquet(tmp_path / "run" / "records.parquet")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    if basis == "proxy":  # an opaque engine: no scheduler report
        records = records.drop(columns=["backlog_ns", "passed_over_ns"])
        summary = build_summary(records, scn, "proxy", 1, float(scn.run.duration), {}, {})
        summary = json.loads(json.dumps(summary, default=str))
    assert summary["fairness"]["service_difference"]["backlog_basis"] == basis
    assert result.summary["fairness"]["service_difference"]["backlog_basis"] == "scheduler"
    weights = {t.id: t.weight for t in scn.tenants}
    _check(summary, records, weights, float(scn.run.timeout))
