"""Where a shift in TTFT p99 between two runs of one scenario comes from, and its likely cause.

Why: a p99 that drifts +5% while p50, p95 and throughput stay flat says nothing of its cause; the
field's incident had three (issue 34). This module takes two runs' records (baseline and
candidate) and returns, all from the records alone:

- `shift`: the candidate's TTFT p99 over the baseline's, minus 1, with an interval. Same plan
  (equal request ids and intended times: an A/B of one seed) — paired: a block bootstrap over
  the plan's requests in send order (blocks of ~2.5% of the run, both runs resampled alike,
  percentile interval of the log ratio). Different plans (other seeds) — independent: the drift
  interval (fairbench.analysis.drift: each run's order-statistic interval, delta method).
- `groups`: the same shift per tenant and per SLO class (which of them carry it).
- `components`: the tail requests' TTFT split into front end + first step (`other`), queue wait,
  prefill, KV transfer and decode wait (records' queue_time_ns, prefill_ns, kv_transfer_ns,
  decode_wait_ns); the tail is each run's requests at or above its own TTFT p98. Each
  component's growth is the candidate's tail mean minus the baseline's (ms) with a 95% bootstrap
  interval (tail requests resampled, runs independent).
- `queue_length`: the waiting queue's length through each run, per window, and the variance
  ratio with its interval (fairbench.analysis.explain_queue);
- `causes`, ranked by share of the tail's growth, each with its evidence:
  - `kv_transfer_variance`: the growth in KV transfer, plus — when that growth's interval
    excludes 0 — the decode wait's growth that the policy causes below do not account for;
  - `priority_without_fairness`: the tail's wait (queue plus decode wait) times the rise in the
    share of it spent behind requests that arrived later and overtook (a policy serving one
    tenant's burst first), that rise taken at its bootstrap interval's lower end (95%);
  - `slo_mismatch`: the same for the share spent behind long prompts that arrived earlier (one
    FIFO shared by short and long requests: head-of-line blocking);
  - `capacity`: the offered work (tokens per second of ok requests) rose;
  - `within_noise`: the shift's interval holds 0; it then ranks first, whatever the rest say.

A tail request's waits (the queue's, and the decode pool's from its KV's arrival) are split
between "overtaken" and "blocked" in proportion to the prompt tokens admitted while it waited
(from the other records' admission times) by overtakers and by earlier long prompts (≥ 4× the
run's median prompt); the rest
of its wait is neither. Pure: frames in, a dict out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from fairbench.analysis import censored
from fairbench.analysis.drift import drift
from fairbench.analysis.explain_queue import queue_length

TAIL_Q = 0.98
BOOT = 400
PAIRED_METHOD = (
    "paired block bootstrap over the plan's requests in send order (40 blocks, "
    f"{BOOT} resamples, percentile interval of the log ratio)"
)
COMPONENTS = ("queue", "prefill", "kv_transfer", "decode_wait", "other")
CAUSES = (
    "priority_without_fairness",
    "kv_transfer_variance",
    "slo_mismatch",
    "capacity",
    "within_noise",
)


@dataclass(frozen=True)
class Run:
    """One run's records and the columns explain reads, in request-id order."""

    df: pd.DataFrame

    @property
    def ok(self) -> np.ndarray:
        return (self.df["status"] == "ok").to_numpy() & self.df["t_first_token_ns"].notna()

    def col(self, name: str) -> np.ndarray:
        if name not in self.df:
            return np.zeros(len(self.df))
        return self.df[name].to_numpy(dtype=float, na_value=np.nan)

    def ttft(self) -> np.ndarray:
        return self.col("t_first_token_ns") - self.col("t_intended_ns")


def _p99(df: pd.DataFrame) -> float:
    obs = censored.ttft_rows(df, None)
    value, _ = censored.quantile(obs.select(), 0.99)
    return float(value)


def _same_plan(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    return len(a) == len(b) and bool(
        np.array_equal(a["request_id"].to_numpy(), b["request_id"].to_numpy())
        and np.array_equal(a["t_intended_ns"].to_numpy(), b["t_intended_ns"].to_numpy())
    )


def _ok_quantile(x: np.ndarray, q: float) -> float:
    x = x[np.isfinite(x)]
    return float(np.quantile(x, q, method="inverted_cdf")) if len(x) else math.nan


def _paired_shift(a: Run, b: Run, confidence: float, seed: int) -> dict[str, Any]:
    """Block bootstrap of log(p99_b / p99_a) on one plan: both runs resampled by the same blocks
    of requests in send order. An unfinished request counts at +inf (a lower bound on it)."""
    ta, tb = a.ttft(), b.ttft()
    ta[~a.ok], tb[~b.ok] = np.inf, np.inf
    order = np.argsort(a.col("t_intended_ns"), kind="stable")
    ta, tb = ta[order], tb[order]
    n = len(ta)
    blocks = np.array_split(np.arange(n), min(40, max(n // 25, 1)))
    rng = np.random.default_rng(seed)
    logs = []
    for _ in range(BOOT):
        pick = np.concatenate([blocks[k] for k in rng.integers(0, len(blocks), len(blocks))])
        qa = np.quantile(ta[pick], 0.99, method="inverted_cdf")
        qb = np.quantile(tb[pick], 0.99, method="inverted_cdf")
        if math.isfinite(qa) and math.isfinite(qb) and qa > 0:
            logs.append(math.log(qb / qa))
    base, cand = _p99(a.df), _p99(b.df)
    tail = (1 - confidence) / 2
    lo, hi = np.quantile(logs, [tail, 1 - tail]) if len(logs) >= BOOT // 2 else (np.nan, np.nan)
    return {
        "baseline_ms": base / 1e6,
        "candidate_ms": cand / 1e6,
        "relative": cand / base - 1 if base > 0 else None,
        "ci_low": None if not math.isfinite(lo) else math.expm1(lo),
        "ci_high": None if not math.isfinite(hi) else math.expm1(hi),
        "ci_method": PAIRED_METHOD,
        "ci_confidence": confidence,
        "paired": True,
    }


def _independent_shift(a: pd.DataFrame, b: pd.DataFrame, confidence: float) -> dict[str, Any]:
    oa, ob = censored.ttft_rows(a, None), censored.ttft_rows(b, None)
    found = drift(oa.select(), ob.select(), q=0.99, confidence=confidence)
    base, cand = _p99(a), _p99(b)
    fields = found.interval.fields()
    return {
        "baseline_ms": base / 1e6,
        "candidate_ms": cand / 1e6,
        "relative": None if not math.isfinite(found.value) else found.value,
        "ci_low": fields["ci_low"],
        "ci_high": fields["ci_high"],
        "ci_method": fields["ci_method"],
        "ci_confidence": confidence,
        "ci_reason": fields.get("ci_reason"),
        "paired": False,
    }


def shift(
    base: pd.DataFrame, cand: pd.DataFrame, confidence: float = 0.95, seed: int = 0
) -> dict[str, Any]:
    """TTFT p99's relative shift, paired on one plan, independent otherwise (module doc)."""
    if _same_plan(base, cand):
        return _paired_shift(Run(base), Run(cand), confidence, seed)
    return _independent_shift(base, cand, confidence)


def _components(run: Run, overhead_ns: np.ndarray) -> dict[str, np.ndarray]:
    """Each ok request's TTFT split; `other` is what is left (front end, first decode step)."""
    queue = np.nan_to_num(run.col("queue_time_ns"))
    prefill = np.nan_to_num(run.col("prefill_ns"))
    kv = np.nan_to_num(run.col("kv_transfer_ns"))
    wait = np.nan_to_num(run.col("decode_wait_ns"))
    other = run.ttft() - queue - prefill - kv - wait
    del overhead_ns
    return {
        "queue": queue,
        "prefill": prefill,
        "kv_transfer": kv,
        "decode_wait": wait,
        "other": other,
    }


def _tail(run: Run) -> np.ndarray:
    ttft = run.ttft()
    ok = run.ok
    cut = _ok_quantile(ttft[ok], TAIL_Q)
    return np.flatnonzero(ok & (ttft >= cut))


def _wait_split(run: Run, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per tail request, its waits spent overtaken (by later arrivals) and blocked (behind
    earlier long prompts), in proportion to the prompt tokens admitted while it waited: its queue
    wait in the (prefill) pool, and its decode wait in the decode pool (arrival there: its KV's)."""
    sent = run.col("t_intended_ns")
    queue = np.nan_to_num(run.col("queue_time_ns"))
    prefill = np.nan_to_num(run.col("prefill_ns"))
    kv = np.nan_to_num(run.col("kv_transfer_ns"))
    wait = np.nan_to_num(run.col("decode_wait_ns"))
    prompt = run.col("prompt_tokens")
    has = run.df["queue_time_ns"].notna().to_numpy()
    long_cut = 4 * float(np.median(prompt)) if len(prompt) else math.inf
    at_decode = sent + queue + prefill + kv
    over = np.zeros(len(rows))
    block = np.zeros(len(rows))
    for arrive, waited in ((sent, queue), (at_decode, wait)):
        admit = arrive + waited
        for k, i in enumerate(rows):
            if waited[i] <= 0:
                continue
            during = has & (admit > arrive[i]) & (admit <= admit[i])
            during[i] = False
            tokens = prompt[during]
            total = tokens.sum()
            if total <= 0:
                continue
            later = arrive[during] > arrive[i]
            longer = (~later) & (tokens >= long_cut)
            over[k] += waited[i] * tokens[later].sum() / total
            block[k] += waited[i] * tokens[longer].sum() / total
    return over, block


def _tail_wait(run: Run, rows: np.ndarray) -> np.ndarray:
    """Each tail request's waiting: its queue wait plus its decode wait (ns)."""
    return (
        np.nan_to_num(run.col("queue_time_ns"))[rows]
        + np.nan_to_num(run.col("decode_wait_ns"))[rows]
    )


def _fraction(part: np.ndarray, whole: np.ndarray) -> float:
    total = float(whole.sum())
    return float(part.sum()) / total if total > 0 else 0.0


def _fraction_rise_low(
    part_a: np.ndarray,
    whole_a: np.ndarray,
    part_b: np.ndarray,
    whole_b: np.ndarray,
    rng: np.random.Generator,
) -> float:
    """The 2.5% point of the bootstrap of the candidate's share minus the baseline's (each
    run's tail resampled on its own)."""
    if not len(whole_a) or not len(whole_b):
        return 0.0
    draws = []
    for _ in range(BOOT):
        ia = rng.integers(0, len(whole_a), len(whole_a))
        ib = rng.integers(0, len(whole_b), len(whole_b))
        draws.append(_fraction(part_b[ib], whole_b[ib]) - _fraction(part_a[ia], whole_a[ia]))
    return float(np.quantile(draws, 0.025))


def _boot_delta(a: np.ndarray, b: np.ndarray, rng: np.random.Generator) -> tuple[float, float]:
    if not len(a) or not len(b):
        return math.nan, math.nan
    draws = [
        b[rng.integers(0, len(b), len(b))].mean() - a[rng.integers(0, len(a), len(a))].mean()
        for _ in range(BOOT)
    ]
    lo, hi = np.quantile(draws, [0.025, 0.975])
    return float(lo), float(hi)


def _offered(run: Run) -> float:
    ok = run.ok
    t = run.col("t_intended_ns")
    span = (t.max() - t.min()) / 1e9 if len(t) > 1 else math.nan
    tokens = run.col("prompt_tokens")[ok].sum() + run.col("output_tokens")[ok].sum()
    return float(tokens / span) if span and span > 0 else math.nan


def _group_shifts(base: pd.DataFrame, cand: pd.DataFrame, column: str) -> dict[str, Any]:
    out = {}
    for name in sorted(set(base[column]) & set(cand[column])):
        a, b = base[base[column] == name], cand[cand[column] == name]
        pa, pb = _p99(a), _p99(b)
        out[str(name)] = {
            "baseline_p99_ms": pa / 1e6,
            "candidate_p99_ms": pb / 1e6,
            "relative": pb / pa - 1 if pa > 0 else None,
            "baseline_p50_ms": _ok_quantile(Run(a).ttft()[Run(a).ok], 0.5) / 1e6,
            "candidate_p50_ms": _ok_quantile(Run(b).ttft()[Run(b).ok], 0.5) / 1e6,
        }
    return out


def explain(
    base: pd.DataFrame, cand: pd.DataFrame, metric: str = "ttft_p99", seed: int = 0
) -> dict[str, Any]:
    """The whole explanation (module doc): metric, shift, groups, components, ranked causes."""
    if metric != "ttft_p99":
        raise ValueError(f"--metric: explain decomposes ttft_p99 only, got {metric!r}")
    base = base.sort_values("request_id").reset_index(drop=True)
    cand = cand.sort_values("request_id").reset_index(drop=True)
    a, b = Run(base), Run(cand)
    moved = shift(base, cand, seed=seed)
    rng = np.random.default_rng(seed + 1)
    ta, tb = _tail(a), _tail(b)
    ca, cb = _components(a, np.zeros(0)), _components(b, np.zeros(0))
    components: dict[str, Any] = {}
    delta: dict[str, float] = {}
    for name in COMPONENTS:
        xa, xb = ca[name][ta], cb[name][tb]
        d = float(xb.mean() - xa.mean()) if len(xa) and len(xb) else math.nan
        lo, hi = _boot_delta(xa, xb, rng)
        delta[name] = d
        components[name] = {
            "baseline_tail_mean_ms": float(xa.mean() / 1e6) if len(xa) else None,
            "candidate_tail_mean_ms": float(xb.mean() / 1e6) if len(xb) else None,
            "growth_ms": d / 1e6,
            "ci_low_ms": lo / 1e6,
            "ci_high_ms": hi / 1e6,
        }
    components["tail"] = {
        "definition": f"ok requests at or above their run's TTFT p{TAIL_Q * 100:g}",
        "baseline_n": len(ta),
        "candidate_n": len(tb),
        "ci_method": f"bootstrap of each run's tail ({BOOT} resamples, percentile, 95%)",
    }
    over_a, block_a = _wait_split(a, ta)
    over_b, block_b = _wait_split(b, tb)
    wait_a, wait_b = _tail_wait(a, ta), _tail_wait(b, tb)
    f_over = (_fraction(over_a, wait_a), _fraction(over_b, wait_b))
    f_block = (_fraction(block_a, wait_a), _fraction(block_b, wait_b))
    # the mix's rise counts from its interval's lower end: a tail of ~50 requests changes its
    # mix by a few points by chance alone
    rise_over = _fraction_rise_low(over_a, wait_a, over_b, wait_b, rng)
    rise_block = _fraction_rise_low(block_a, wait_a, block_b, wait_b, rng)
    growth = sum(max(v, 0.0) for v in delta.values() if math.isfinite(v))
    # A policy cause is a change in what the tail waited behind (its mix), not more of the same
    # waiting: the candidate's tail wait times the rise in the share spent overtaken / blocked.
    mean_wait = float(wait_b.mean()) if len(wait_b) else 0.0
    pri = mean_wait * max(rise_over, 0.0)
    slo = mean_wait * max(rise_block, 0.0)
    # The KV link: the transfer's growth, and — where that growth is real (its interval excludes
    # 0) — the decode wait's growth the mix does not explain (late KV arriving in clumps).
    kv_real = components["kv_transfer"]["ci_low_ms"] > 0
    residual = max(max(delta["decode_wait"], 0.0) - pri - slo, 0.0) if kv_real else 0.0
    load_a, load_b = _offered(a), _offered(b)
    load_rise = load_b / load_a - 1 if load_a > 0 else 0.0
    rel = moved["relative"] or 0.0
    scores = {
        "kv_transfer_variance": max(delta["kv_transfer"], 0.0) + residual,
        "priority_without_fairness": pri,
        "slo_mismatch": slo,
    }
    shares = {k: (min(v / growth, 1.0) if growth > 0 else 0.0) for k, v in scores.items()}
    # capacity: the offered work's rise against the shift (a rise as large as the shift: all)
    shares["capacity"] = min(1.0, max(load_rise, 0.0) / rel) if rel > 0 else 0.0
    lo, hi = moved["ci_low"], moved["ci_high"]
    noise = lo is None or hi is None or (lo <= 0 <= hi)
    shares["within_noise"] = 1.0 if noise else 0.0
    evidence = {
        "kv_transfer_variance": (
            f"tail KV transfer {delta['kv_transfer'] / 1e6:+.1f} ms, decode wait "
            f"{delta['decode_wait'] / 1e6:+.1f} ms of {growth / 1e6:.1f} ms tail growth"
        ),
        "priority_without_fairness": (
            f"tail wait spent behind later arrivals that overtook: {f_over[0]:.0%} -> "
            f"{f_over[1]:.0%} of {mean_wait / 1e6:.1f} ms; " + _overtakers(b, tb)
        ),
        "slo_mismatch": (
            f"tail wait spent behind earlier long prompts: {f_block[0]:.0%} -> "
            f"{f_block[1]:.0%} of {mean_wait / 1e6:.1f} ms"
        ),
        "capacity": (f"offered work {load_a:,.0f} -> {load_b:,.0f} tokens/s ({load_rise:+.1%})"),
        "within_noise": (
            "the shift's interval "
            + ("is declined" if lo is None or hi is None else f"[{lo:+.2%}, {hi:+.2%}]")
            + (" holds 0" if noise else " excludes 0")
        ),
    }
    causes = [
        {"name": name, "share": round(shares[name], 4), "evidence": evidence[name]}
        for name in CAUSES
    ]
    causes.sort(key=lambda c: (-(c["name"] == "within_noise" and noise), -c["share"]))
    return {
        "metric": metric,
        "shift": moved,
        "groups": {
            "tenant": _group_shifts(base, cand, "tenant"),
            "slo_class": _group_shifts(base, cand, "slo_class"),
        },
        "components": components,
        "queue_length": queue_length(base, cand, seed=seed),
        "causes": causes,
    }


def _overtakers(run: Run, rows: np.ndarray) -> str:
    """Which tenant's requests overtook the tail requests most (prompt tokens), and its burst:
    its busiest second against its mean rate. A second, not ten: bursts of a few seconds (the
    incident's vip sends for 2 s of every 10) average out in 10 s bins (1.5x where the 1 s bins
    read 5x)."""
    if not len(rows):
        return "no tail"
    arrive = run.col("t_intended_ns")
    admit = arrive + np.nan_to_num(run.col("queue_time_ns"))
    tenants = run.df["tenant"].to_numpy()
    counts: dict[str, int] = {}
    for i in rows:
        during = (admit > arrive[i]) & (admit <= admit[i]) & (arrive > arrive[i])
        for t in tenants[during]:
            counts[str(t)] = counts.get(str(t), 0) + 1
    if not counts:
        return "no request overtook the tail"
    top = max(sorted(counts), key=lambda k: counts[k])
    t = arrive[tenants == top] / 1e9
    span = t.max() - t.min() if len(t) > 1 else 0.0
    bins = np.histogram(t, bins=max(int(span), 1))[0] if span > 0 else np.array([len(t)])
    burst = bins.max() / bins.mean() if bins.mean() > 0 else math.nan
    return f"most overtaking by {top} ({counts[top]} overtakes; busiest 1 s {burst:.1f}× its mean)"
