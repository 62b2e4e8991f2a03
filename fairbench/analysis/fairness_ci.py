"""Intervals of the fairness figures: slowdown ratio and Jain's index, isolation, and why the
backlogged service difference has none.

Why this module exists: `worst_slowdown_ratio`, `jain_slowdown` and `isolation` were printed
bare, so a ratio of 1.3 from one run read as a fact. Each is a smooth function of quantities a
run estimates (tenants' mean slowdowns, two TTFT p99s), and each quantity is computed over
serially correlated requests, so the intervals come from methods built for dependent data:

**Slowdown figures** (mean slowdown per tenant, then max ÷ min, or Jain's index over them).
The group's requests in time order are cut into B contiguous batches, each at least two
Politis–White block lengths of the slowdown series and at least n/10, and the figure is
jackknifed over the batches (t on the pseudo-values' effective degrees of freedom, as
fairbench.analysis.intervals reads batch means' kurtosis): delete one batch,
recompute every tenant's mean, and read the spread of the B leave-one-out values (Law & Kelton's
jackknifed batch means for a ratio of means). With two tenants both figures are functions of
one number, θ = log(mean_a ÷ mean_b): worst ratio = exp|θ|, Jain = (1 + r)² ÷ (2(1 + r²)) with
r = exp|θ|. θ gets θ̂ ± t_{B−1}·se, and each figure the image of that interval, which is honest
at a tie (θ = 0 is covered whenever θ's interval covers it, where a delta method on exp|θ|
would shrink to nothing). With more tenants the figure itself is jackknifed (delta method; a
near-tie between the top two makes it conservative, not narrow). Fewer than 10 batches decline,
with the requests and seconds that would do. So does a ratio that rests on fewer than 10
effective independent contention episodes (`effective_episodes`: stretches in which someone is
always waiting, weighted by their influence on the log ratio): near capacity a few long backlog
episodes make a tenant's mean slowdown, and a run that saw no large one reads a low ratio with
little spread, which no batching of that run can show (VTC on the fairness queue: every run
rests on 1.0–4.8 episodes; the time-batch jackknife covered 77% of 60 seeds, the run-to-run
variance of the log ratio 2.6 times the batches' mean estimate, still 1.6 times with 3 batches).

**Isolation** (a tenant's TTFT p99 in the mix ÷ alone). Each p99 has its order-statistic
interval (widened for serial correlation, fairbench.analysis.intervals) at 68.27%, read as a
standard error of its log; log ratio ± z·√(se_mix² + se_solo²), the two taken as independent.
They share the tenant's arrivals, which correlates them positively, so this only overstates the
variance, and little: across seeds of the calibration queue the two arms' log p99s correlate
0.11 at 7/s and 0.19 at 9/s per tenant (60 and 200 seeds), so pairing the arms would shrink
the interval by under 10%. Isolation's over-coverage at 7/s (98–100%) comes from each side's
own standard error instead: median 0.26 against a run-to-run SD of the log ratio of 0.17.
Where either p99 has no two-sided interval, neither has the ratio, with that side's reason.
The overall figure is the worst tenant's; its interval is [max lows, max highs] over the
tenants' intervals at 1 − α/k each (Bonferroni), declined if any tenant's is.

**Service difference** (max over tenant pairs and intervals in which both were backlogged).
A maximum over the run, not an estimate of a long-run mean: under an unfair policy it grows
with the run's length, so no long-run value exists for an interval to cover, and the run's value
is exact for the run. It is declined, with that reason, everywhere it is printed.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as sps

from fairbench.analysis import censored
from fairbench.analysis import intervals as iv
from fairbench.analysis.columns import Cols
from fairbench.analysis.drift import ONE_SE
from fairbench.analysis.metrics import distinct, jain, nondecreasing

CONFIDENCE = 0.95
METHOD_SLOWDOWN_PAIR = (
    "jackknife over time batches (batch means, {batches} of {batch} requests{first}), t on "
    "log(mean ratio), its image for max ÷ min and Jain"
)
METHOD_SLOWDOWN_MANY = (
    "jackknife over time batches (batch means, {batches} of {batch} requests{first}), t on the "
    "figure (delta method)"
)
METHOD_ISOLATION = (
    "log ratio of the mix's and the solo arm's p99 order-statistic intervals (delta method, "
    "taken as independent)"
)
METHOD_ISOLATION_WORST = (
    "the worst tenant's: from the largest of the tenants' lows to the largest high, each "
    "tenant's at {each:.1%} (Bonferroni)"
)
METHOD_MAXIMUM = "none: a maximum over the run"
REASON_MAXIMUM = (
    "no interval: a maximum over the run's backlogged intervals, not an estimate of a long-run "
    "mean (it grows with the run's length under an unfair policy); the value is exact for this run"
)


REASON_NO_CONTENTION = (
    "no interval: no two tenants were ever backlogged at once (no contention), so there is no "
    "backlogged interval to take a maximum over; the 0 printed is not a measured difference"
)


def service_difference_interval(contended: bool = True) -> iv.Interval:
    """The backlogged service difference's declined interval, with the reason (module
    docstring); where no two tenants were ever backlogged at once (`contended` false) the
    reason says so. Why: the maximum's reason ("exact for this run") read as if a 0 had been
    measured over backlogged intervals that never existed."""
    return iv.declined(
        CONFIDENCE, METHOD_MAXIMUM, REASON_MAXIMUM if contended else REASON_NO_CONTENTION
    )


# ------------------------------------------------------------------ slowdown


def _slowdown_batches(c: Cols, mask: np.ndarray | None) -> tuple[np.ndarray, ...] | iv.Interval:
    """Per batch (rows) and tenant (columns): slowdown sums and counts of the group's requests in
    time order, with the batching (the first batch also holds the n mod batch first requests,
    so the batches hold every request the figure averages); or the declined interval when
    there are too few batches."""
    sel = c.e2e_x if mask is None else c.e2e_x & mask
    rows = np.flatnonzero(sel)
    t = c.t[rows]
    # a records window is in time order already: then no argsort
    order = rows if nondecreasing(t) else rows[np.argsort(t, kind="stable")]
    slow = c.e2e_t[order] / c.unloaded[order]
    tenant = c.tenant[order]
    finite = np.isfinite(slow) & (tenant >= 0)
    slow, tenant = slow[finite], tenant[finite]
    n = len(slow)
    dep = _batching(slow)
    if n < iv.MIN_DEPENDENCE_N or dep.batches < iv.MIN_BATCHES:
        need = dep.batch * iv.MIN_BATCHES if n >= iv.MIN_DEPENDENCE_N else iv.MIN_DEPENDENCE_N
        span_s = (float(np.ptp(c.t[order])) / 1e9) if len(order) > 1 else 0.0
        rate = n / span_s if span_s > 0 else None
        seconds = f", ≈ {need / rate:,.0f} s at this rate" if rate else ""
        return iv.declined(
            CONFIDENCE,
            _method(METHOD_SLOWDOWN_MANY, dep.batches, dep.batch, 0),
            f"run too short for its own correlation: {dep.batches} batches of {dep.batch} "
            f"requests, an interval needs ≥ {iv.MIN_BATCHES} (≥ {need:,} requests{seconds})",
        )
    # every request in a batch: the n mod batch first ones join the first batch. Why: the
    # figure is every request's mean; batching only the last batches·batch left the interval
    # centred on other means, and the printed ratio fell outside it (1.034 beside [1.0, 1.022]
    # when 9 of 1,599 requests were slow: tests/test_audit_fairness_slowdown.py)
    batch_of = np.repeat(np.arange(dep.batches), dep.batch)
    batch_of = np.concatenate([np.zeros(n - len(batch_of), dtype=batch_of.dtype), batch_of])
    k = int(tenant.max()) + 1
    sums = np.zeros((dep.batches, k))
    counts = np.zeros((dep.batches, k))
    np.add.at(sums, (batch_of, tenant), slow)
    np.add.at(counts, (batch_of, tenant), 1.0)
    present = counts.sum(axis=0) > 0
    codes = np.flatnonzero(present)
    shape = np.array([dep.batch, dep.batches, n - (dep.batches - 1) * dep.batch])
    return sums[:, present], counts[:, present], shape, codes


def _method(template: str, batches: int, batch: int, first: int) -> str:
    """The slowdown interval's method with its batching: B of b requests, and the first
    batch's size where it holds the n mod b first requests too."""
    more = f", the first of {first}" if first > batch else ""
    return template.format(batches=batches, batch=batch, first=more)


BATCHES = 10  # the most batches the slowdown figures are cut into (see `_batching`)


def _batching(slow: np.ndarray) -> iv.Dependence:
    """Batches of at least two Politis–White block lengths and n / BATCHES requests. Why not
    the percentiles' 30: a tenant's slowdown comes in backlog episodes that last longer than
    the block length read off all requests, so fewer, longer batches are less biased (Law &
    Kelton's lower end). Measured on the fairness queue under VTC, 63% coverage with 30
    batches and B − 1 degrees of freedom, 70–77% with 10 and the pseudo-values' effective ones:
    no batching shows a run its own backlog episodes, so such runs are declined by the
    episode count instead (`effective_episodes`)."""
    n = len(slow)
    if n < iv.MIN_DEPENDENCE_N:
        return iv.Dependence(batch=1, batches=max(n, 1))
    batch = max(math.ceil(2 * iv.block_length(slow)), n // BATCHES, 1)
    return iv.Dependence(batch=batch, batches=n // batch)


def _leave_one_out(sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Each tenant's mean without each batch (rows: the batch left out); NaN where a tenant's
    requests all lie in that batch."""
    total_s, total_n = sums.sum(axis=0), counts.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (total_s - sums) / (total_n - counts)


def slowdowns(c: Cols) -> np.ndarray:
    """Each request's E2E ÷ its E2E alone, made once per run (the columns' memo): every group's
    slowdown figures divide the same two columns (issue 35)."""
    return c.memo("slowdown_ratio", None, lambda: c.e2e_t / c.unloaded)


def waiting_episodes(c: Cols) -> np.ndarray:
    """Each request's contention episode: requests in time order, a new episode wherever the
    request arrives after every earlier one's first response (nobody is waiting), so an
    episode is a maximal stretch of overlapping waits [intended send, first response]. A
    request never answered waits until it was last seen. Computed once per run (the columns'
    memo): every group's figures read the same episodes."""
    return c.memo("waiting_episodes", None, lambda: _episodes(c))


def _episodes(c: Cols) -> np.ndarray:
    end = c.t + np.where(c.ttft_x, c.ttft_t, 0.0)
    order = np.argsort(c.t, kind="stable")
    start, stop = c.t[order], end[order]
    new = np.ones(len(start), dtype=bool)
    new[1:] = start[1:] > np.maximum.accumulate(stop)[:-1]
    out = np.empty(len(start), dtype=np.int64)
    out[order] = np.cumsum(new) - 1
    return out


def effective_episodes(c: Cols, mask: np.ndarray | None, pair: tuple[int, int]) -> float:
    """How many independent contention episodes the log ratio of two tenants' mean slowdowns
    rests on: each episode's influence on it, I_e = Σ_e (s − m_a)/(m_a·N_a) over tenant a's
    requests minus the same for b, and n_eff = (Σ I_e²)² / Σ I_e⁴ (1 when one episode carries
    it all, the number of episodes when they carry it alike). Why: near capacity a tenant's
    mean slowdown is made by a few long backlog episodes, heavy-tailed in size, and a run that
    saw none large reads a low mean with little spread (VTC on the fairness queue: time-batch
    jackknife covered 70–77%; run-to-run variance of the log ratio 2.6 times the batches'
    mean estimate). Episodes are independent where time batches are not: they end where
    nobody waits."""
    sel = c.e2e_x if mask is None else c.e2e_x & mask
    slow = slowdowns(c)
    episode = waiting_episodes(c)
    influence = np.zeros(int(episode.max()) + 1 if len(episode) else 0)
    for sign, k in zip((1.0, -1.0), pair, strict=True):
        rows = sel & (c.tenant == k) & np.isfinite(slow)
        m, count = float(slow[rows].mean()), int(rows.sum())
        weights = (slow[rows] - m) / (m * count)
        influence += sign * np.bincount(episode[rows], weights, minlength=len(influence))
    sq = influence * influence
    return float(sq.sum() ** 2 / (sq * sq).sum()) if sq.sum() > 0 else math.inf


MIN_EPISODES = 10  # the jackknife's 10 batches must rest on as many independent episodes


def largest_episode_share(c: Cols, mask: np.ndarray | None) -> float:
    """The share of the group's requests in its largest contention episode. Why: the effective
    count weighs episodes by their influence on the ratio, and where one episode holds nearly
    every request (an overloaded queue never drains) the tenants' deviations inside it cancel
    and a handful of tiny episodes before it pass for independent evidence."""
    sel = c.e2e_x if mask is None else c.e2e_x & mask
    if not sel.any():
        return 0.0
    return float(np.bincount(waiting_episodes(c)[sel]).max() / sel.sum())


def _too_few_episodes(c: Cols, mask: np.ndarray | None, n_eff: float) -> str:
    """Why the slowdown figures have no interval: the effective count, and how long a run
    would do if its episodes kept their size (they may not: a longer run meets larger ones)."""
    span = c.t[c.e2e_x if mask is None else c.e2e_x & mask]
    span_s = float(np.ptp(span)) / 1e9 if len(span) > 1 else 0.0
    need = f" (≈ {span_s * MIN_EPISODES / max(n_eff, 1.0):,.0f} s if episodes stay this size)"
    return (
        f"run too short for its backlog episodes: the slowdown ratio rests on {n_eff:.1f} "
        f"effective independent contention episodes (one carries {1 / max(n_eff, 1.0):.0%} or "
        f"more of its variance), an interval needs ≥ {MIN_EPISODES}"
        + (need if span_s > 0 else "")
        + "; or compare independent runs (fairbench ab)"
    )


def slowdown_intervals(c: Cols, mask: np.ndarray | None = None) -> tuple[iv.Interval, iv.Interval]:
    """(worst_slowdown_ratio's interval, jain_slowdown's) for a group (module docstring)."""
    got = _slowdown_batches(c, mask)
    if isinstance(got, iv.Interval):
        return got, got
    sums, counts, (batch, batches, first), codes = got
    k = sums.shape[1]
    if k < 2:  # the method said with its numbers: the bare template was printed
        method = _method(METHOD_SLOWDOWN_MANY, int(batches), int(batch), int(first))
        none = iv.declined(CONFIDENCE, method, "fewer than two tenants")
        return none, none
    means = sums.sum(axis=0) / counts.sum(axis=0)
    loo = _leave_one_out(sums, counts)
    pair = k == 2
    template = METHOD_SLOWDOWN_PAIR if pair else METHOD_SLOWDOWN_MANY
    method = _method(template, int(batches), int(batch), int(first))
    if not np.all(np.isfinite(loo)) or np.any(loo <= 0) or np.any(means <= 0):
        reason = "a tenant's requests lie in one batch: its mean has no spread to read"
        return iv.declined(CONFIDENCE, method, reason), iv.declined(CONFIDENCE, method, reason)
    worst_pair = (int(codes[int(np.argmax(means))]), int(codes[int(np.argmin(means))]))
    n_eff = effective_episodes(c, mask, worst_pair)
    largest = largest_episode_share(c, mask)
    if largest > 0.5:
        reason = (
            f"one contention episode holds {largest:.0%} of the requests (someone waited for a "
            "first token from its start to its end): the tenants' means rest on that one "
            "episode, whose batches are not independent, and a longer run adds no episodes "
            "while waits keep overlapping; compare independent runs (fairbench ab)"
        )
        return iv.declined(CONFIDENCE, method, reason), iv.declined(CONFIDENCE, method, reason)
    if n_eff < MIN_EPISODES:
        reason = _too_few_episodes(c, mask, n_eff)
        return iv.declined(CONFIDENCE, method, reason), iv.declined(CONFIDENCE, method, reason)
    t = float(sps.t.ppf(0.5 + CONFIDENCE / 2, int(batches) - 1))
    if pair:
        theta = math.log(means[0] / means[1])
        low, high = _jackknife(theta, np.log(loo[:, 0] / loo[:, 1]), t)
        small, large = _abs_image(low, high)
        worst = iv.Interval(math.exp(small), math.exp(large), CONFIDENCE, method)
        jain_it = iv.Interval(_jain_pair(large), _jain_pair(small), CONFIDENCE, method)
        return worst, jain_it
    log_worst = math.log(means.max() / means.min())
    low, high = _jackknife(log_worst, np.log(loo.max(axis=1) / loo.min(axis=1)), t)
    worst = iv.Interval(math.exp(max(low, 0.0)), math.exp(high), CONFIDENCE, method)
    j_low, j_high = _jackknife(jain(means), np.array([jain(row) for row in loo]), t)
    jain_it = iv.Interval(max(j_low, 1.0 / k), min(j_high, 1.0), CONFIDENCE, method)
    return worst, jain_it


def _jackknife(point: float, leave_one_out: np.ndarray, t: float) -> tuple[float, float]:
    """point ± t·se, se² = (B − 1)/B · Σ (θ₋ᵦ − mean θ₋)² (Efron's jackknife); t on the
    pseudo-values' effective degrees of freedom (`iv.effective_df`: fewer than B − 1 when
    one batch's backlog episode dominates)."""
    b = len(leave_one_out)
    se = math.sqrt((b - 1) / b * float(((leave_one_out - leave_one_out.mean()) ** 2).sum()))
    pseudo = b * point - (b - 1) * leave_one_out
    df = iv.effective_df(pseudo)
    if df is not None:
        t = max(t, float(sps.t.ppf(0.5 + CONFIDENCE / 2, df)))
    return point - t * se, point + t * se


def _abs_image(low: float, high: float) -> tuple[float, float]:
    """The image of [low, high] under |·|."""
    if low <= 0.0 <= high:
        return 0.0, max(-low, high)
    return min(abs(low), abs(high)), max(abs(low), abs(high))


def _jain_pair(abs_log_ratio: float) -> float:
    """Jain's index of two values whose ratio is exp(abs_log_ratio)."""
    r = math.exp(abs_log_ratio)
    return (1.0 + r) ** 2 / (2.0 * (1.0 + r * r))


# ------------------------------------------------------------------ isolation


def log_se(obs: censored.Observations, q: float = 0.99) -> float | None:
    """The standard error of log p_q from its central 68.27% interval (± one se; as the drift
    reads each window's), or None where that interval is not two-sided. Where the interval was
    widened for dependence on ν effective degrees of freedom, the se is scaled by
    t_ν(97.5%) / (1.96 · t_ν(84.1%)), so that ± 1.96 se reaches as far as the 95% interval's
    own t would: read at one se, a heavy-tailed τ's few degrees of freedom were lost (isolation
    covered 89% at 9/s per tenant on the calibration queue)."""
    est = censored.quantile_estimate(obs, q, ONE_SE)
    if est.bound or not (math.isfinite(est.low) and math.isfinite(est.high)) or est.low <= 0:
        return None
    z = float(sps.norm.ppf(0.5 + ONE_SE / 2))
    se = (math.log(est.high) - math.log(est.low)) / (2 * z)
    dep = obs.dependence_at(est.value)
    if dep.factor > 1.0:
        nu, z95 = dep.degrees, float(sps.norm.ppf(0.5 + CONFIDENCE / 2))
        wide = float(sps.t.ppf(0.5 + CONFIDENCE / 2, nu)) / float(sps.t.ppf(0.5 + ONE_SE / 2, nu))
        se *= max(1.0, wide * z / z95)
    return se


def _why_mix(obs: censored.Observations) -> str:
    est = censored.quantile_estimate(obs, 0.99, ONE_SE)
    if est.interval is not None and est.interval.reason:
        return est.interval.reason
    return f"{est.n} requests"


def tenant_isolation_interval(c: Cols, k: int, confidence: float = CONFIDENCE) -> iv.Interval:
    """Tenant k's isolation interval (module docstring)."""
    solo = float(c.solo_ttft[k]) if 0 <= k < len(c.solo_ttft) else math.nan
    if not math.isfinite(solo) or solo <= 0:
        return iv.declined(CONFIDENCE, METHOD_ISOLATION, "no solo arm")
    obs = c.obs("ttft", c.tenant == k)
    mix, bound = censored.quantile(obs, 0.99)
    if bound or not mix > 0:
        return iv.declined(CONFIDENCE, METHOD_ISOLATION, "the mix's p99 is only a lower bound")
    se_solo = float(c.solo_ttft_se[k]) if 0 <= k < len(c.solo_ttft_se) else math.nan
    if not math.isfinite(se_solo):
        return iv.declined(
            CONFIDENCE,
            METHOD_ISOLATION,
            "the solo arm cannot bound its p99 (too few requests, or too short for its "
            "correlation)",
        )
    se_mix = log_se(obs)
    if se_mix is None:
        return iv.declined(
            CONFIDENCE, METHOD_ISOLATION, f"no two-sided interval of the mix's p99: {_why_mix(obs)}"
        )
    z = float(sps.norm.ppf(0.5 + confidence / 2))
    centre, half = math.log(mix / solo), z * math.hypot(se_mix, se_solo)
    return iv.Interval(
        math.exp(centre - half), math.exp(centre + half), confidence, METHOD_ISOLATION
    )


def isolation_tenants(c: Cols, mask: np.ndarray | None = None) -> list[int]:
    """The tenants the group's isolation figure reads, and so its interval: in the group, with
    a solo arm (finite, > 0) and an admitted request in the mix (a p99 to divide)."""
    ks = sorted({int(k) for k in distinct(c.tenant if mask is None else c.tenant[mask])})
    return [
        k
        for k in ks
        if 0 <= k < len(c.solo_ttft)
        and np.isfinite(c.solo_ttft[k])
        and c.solo_ttft[k] > 0
        and len(c.obs("ttft", c.tenant == k)) > 0
    ]


def isolation_interval(c: Cols, mask: np.ndarray | None = None) -> iv.Interval:
    """A group's isolation interval: one tenant's, or for several the worst tenant's as
    [max of lows, max of highs] of the tenants' intervals at 1 − α/k each (Bonferroni: the
    worst is bounded only where every tenant's interval holds at once; at 95% each, two
    tenants' worst covered 89% at 9/s on the calibration queue); declined where any tenant
    with a value has none. The tenants are the figure's (`isolation_tenants`). Why: a tenant
    whose requests were all rejected has no p99 and no isolation, yet it declined the worst
    tenant's interval as "only a lower bound"."""
    ks = isolation_tenants(c, mask)
    if not ks:
        return iv.declined(CONFIDENCE, METHOD_ISOLATION, "no solo arm")
    if len(ks) == 1:
        return tenant_isolation_interval(c, ks[0])
    each = 1.0 - (1.0 - CONFIDENCE) / len(ks)
    found = [tenant_isolation_interval(c, k, each) for k in ks]
    missing = [it for it in found if it.declined]
    if missing:
        method = METHOD_ISOLATION_WORST.format(each=each)
        return iv.declined(CONFIDENCE, method, missing[0].reason or "")
    return iv.Interval(
        max(it.low for it in found),
        max(it.high for it in found),
        CONFIDENCE,
        METHOD_ISOLATION_WORST.format(each=each),
    )
