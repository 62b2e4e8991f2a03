"""Latency under overload: every admitted request counts, finished or not.

A request that timed out, was cancelled, or failed after it was sent has no latency, but it is
not missing either: its latency is *at least* the time it had been waiting when the client last
saw it. Dropping it computes the tail over survivors, and a scheduler that times out its worst
requests then wins every p99 comparison. Here each admitted request is an observation
`(time, observed)`: observed latencies, and right-censored ones at the time last seen.

The population is every request in the group that was sent and not rejected (a 429/503 is
reported as a share of its own, not as a latency). Quantiles come from the Kaplan–Meier estimate
of the latency distribution:

    F(t) = 1 − Π_{event times s ≤ t} (1 − d_s / n_s)
    p_q  = min { event time t : F(t) ≥ q }

which, without censoring, is the ceil(q·n)-th order statistic — the definition the exact
bootstrap (fairbench.analysis.stats) uses, so a point estimate and its interval always share one
quantile definition. The quantile falls in censored mass, and the value is reported as a lower
bound, when F never reaches q, and also whenever more requests are unfinished than the tail
beyond q holds (more than n − ceil(q·n)): then the ceil(q·n)-th latency could be any of the
unfinished ones', however long, and a value Kaplan–Meier reaches is only its assumption that an
unfinished request would have fared like those still running when it was cut. An overloaded
queue breaks that assumption (the requests cut at the run's end are the late arrivals, which
wait longest): vtc-overload, 60% unfinished, printed its TTFT p99 as 447,638 ms
[447,099, 447,638], the largest latency of the early arrivals that finished. The lower bound,
the ceil(q·n)-th order statistic of all times, censored ones included, holds whatever the
censoring mechanism (an unfinished request might have finished the instant after it was last
seen, never sooner). With at most n − ceil(q·n) unfinished, ceil(q·n) requests are known to
have finished, and Kaplan–Meier's value lies between that bound and the ceil(q·n)-th finished
latency whatever the censoring. Intervals (fairbench.analysis.intervals): order statistics with
binomial ranks without censoring, the Brookmeyer–Crowley inversion of Greenwood's variance of F with
it, never narrower than those ranks read on F — both widened for serial correlation when the
observations carry their times (`t`), or declined when the run is too short for its correlation; for
a bound, [T_(l), ∞), the time seen at the one-sided binomial rank (`bound_interval`), not the value
itself, which bounds only this sample's percentile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pandas as pd
from scipy import special

from fairbench.analysis import frame_memo
from fairbench.analysis import intervals as iv
from fairbench.analysis.metrics import nondecreasing


@dataclass(frozen=True)
class Observations:
    """Latencies (ns) of a group's admitted requests; `observed` False = right-censored.

    The Kaplan–Meier curve is computed once per instance (`km`), so every percentile and
    interval of one group costs one sort."""

    time: np.ndarray
    observed: np.ndarray
    t: np.ndarray | None = None  # each observation's intended send time: the series' order
    # its percentiles get intervals (the summary's groups): then one argsort gives both the
    # sorted times and the normal scores' ranks, where a sort and scipy's rankdata (another
    # argsort) were a third of a fleet run's summary (issue 35)
    ranked: bool = False

    def __len__(self) -> int:
        return len(self.time)

    @cached_property
    def _time_order(self) -> np.ndarray | None:
        """The stable order by send time, None where the times already are in it (a summary's
        groups: a records window comes in plan order), where the argsort is the identity and
        the two gathers of the whole group through it copies (issue 35)."""
        t = self.t
        if t is None or nondecreasing(t):
            return None
        return np.argsort(t, kind="stable")

    @cached_property
    def in_time_order(self) -> np.ndarray | None:
        """The latencies in send order (None without times): what dependence is measured on."""
        if self.t is None:
            return None
        order = self._time_order
        return self.time if order is None else self.time[order]

    @cached_property
    def dependence(self) -> iv.Dependence:
        series = self.in_time_order
        if series is None or self.t is None:
            return iv.IID
        span_s = (float(np.max(self.t)) - float(np.min(self.t))) / 1e9 if len(self.t) else 0.0
        rate = len(self.t) / span_s if span_s > 0 else None
        return iv.with_rate(iv.batching(series), rate)

    @cached_property
    def score_acf(self) -> np.ndarray:
        """The normal scores' autocorrelations in time order (`iv.copula_factor` reads them)."""
        series = self.in_time_order
        if series is None:
            return np.zeros(0)
        lags = iv.copula_lags(len(series), self.dependence)
        if len(series) < 2:
            return iv.normal_scores_acf(series, lags)
        # the scores from this sample's own sort, not rankdata's: the same ranks, value for
        # value (ties averaged), and ndtri is norm.ppf on (0, 1) without its checks
        ranks = average_ranks(self.sorted_time, self._by_value)
        if self._time_order is not None:
            ranks = ranks[self._time_order]
        return iv.normal_scores_acf(series, lags, special.ndtri(ranks / (len(series) + 1)))

    def dependence_at(self, threshold: float) -> iv.Dependence:
        """The batching with τ of the indicator 1{latency ≤ threshold} in time order: the largest
        of batch means', the Gaussian copula's and, for a tail rarer than p95, the p95
        indicator's batch means (see fairbench.analysis.intervals); with the batch means'
        effective degrees of freedom (no more than the exceedances' bursts give: `iv.cluster_df`)
        and, where dependence counts, how many independent bursts the exceedances come in
        (fewer than `iv.MIN_CLUSTERS` decline the interval).

        Why the p95 floor: a p99 indicator's τ rests on about n/100 exceedances and follows
        the run's own percentile, so a quiet run (no large burst) measured a small τ and printed
        a narrow interval that missed the long-run p99 (4 of 60 seeds of the calibration queue
        at 9/s); the p95 indicator sees the same bursts with five times the exceedances."""
        series = self.in_time_order
        if series is None:
            return iv.IID
        dep = self.dependence
        below = series <= threshold
        share = float(below.mean())
        copula = iv.copula_factor(self.score_acf, len(series), share)
        batched = iv.long_run_factor(below, dep)
        factor = max(batched, copula)
        if factor <= 1.0:
            return iv.with_factor(dep, factor)
        df = None
        exceed = ~below if share >= 0.5 else below
        if batched > copula:  # the tail clusters beyond what a Gaussian copula implies
            df = iv.batch_means_df(below, dep)
            bursts_df = iv.cluster_df(exceed)
            if df is not None and bursts_df is not None:
                df = min(df, bursts_df)
            if share > iv.TAIL_FLOOR_Q:
                k = max(1, math.ceil(iv.TAIL_FLOOR_Q * len(series)))
                floor_at = float(self.sorted_time[k - 1])
                factor = max(factor, iv.long_run_factor(series <= floor_at, dep))
        # bursts are counted where there are enough exceedances to show them (≥ 2 × the
        # minimum): fewer already leave the tail one-sided, and an i.i.d. sample's 3
        # exceedances are 3 bursts, not a run too short
        bursts = None
        if int(exceed.sum()) >= 2 * iv.MIN_CLUSTERS:
            bursts = iv.exceedance_clusters(exceed)
        return iv.with_factor(dep, factor, df=df, clusters=bursts, n=len(series))

    @cached_property
    def km(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return _km(self)

    @cached_property
    def _by_value(self) -> np.ndarray:
        return np.argsort(self.time)

    @cached_property
    def sorted_time(self) -> np.ndarray:
        if self.ranked or "_by_value" in self.__dict__:  # the argsort serves both
            return self.time[self._by_value]
        return np.sort(self.time)

    @property
    def unfinished(self) -> int:
        return int((~self.observed).sum())

    def take(self, idx: np.ndarray) -> Observations:
        t = None if self.t is None else self.t[idx]
        return Observations(self.time[idx], self.observed[idx], t)


def average_ranks(sorted_values: np.ndarray, order: np.ndarray) -> np.ndarray:
    """`scipy.stats.rankdata(x, method="average")` from x's sorted values and any argsort of
    x (`sorted_values = x[order]`): ties get the mean of their ranks, so which tie comes first
    does not matter, and the arithmetic is rankdata's, to the bit."""
    n = len(sorted_values)
    if n == 0:
        return np.zeros(0)
    starts = np.empty(n, dtype=bool)
    starts[0] = True
    np.not_equal(sorted_values[1:], sorted_values[:-1], out=starts[1:])
    # int32 where it fits, summed in place: the same integers (≤ 2n + 1), so the same halves,
    # with a third of the bytes of int64 temporaries (issue 35: 37 calls of up to 1.7M)
    idx = np.int32 if n < 2**30 else np.int64
    dense = np.cumsum(starts, dtype=idx)
    ranks = np.empty(n)
    if int(dense[-1]) == n:  # no ties: rank k is (k + (k − 1) + 1) / 2 = k exactly
        ranks[order] = np.arange(1, n + 1, dtype=np.float64)
        return ranks
    count = np.append(np.flatnonzero(starts).astype(idx), np.array([n], dtype=idx))
    total = count[dense]
    dense -= 1
    total += count[dense]
    total += 1
    ranks[order] = 0.5 * total
    return ranks


@dataclass(frozen=True)
class QuantileEstimate:
    """A quantile with its interval; `bound` means `value` is only a lower bound. `low`/`high`
    are NaN where the interval is declined and `high` is inf where it is one-sided; `interval`
    says which method, at what confidence, and why it is open or declined."""

    value: float
    low: float
    high: float
    n: int
    unfinished: int
    bound: bool
    interval: iv.Interval | None = None

    def as_dict(self, scale: float = 1.0) -> dict[str, float | int | bool | str | None]:
        f = lambda v: None if not math.isfinite(v) else round(v * scale, 6)  # noqa: E731
        out: dict[str, float | int | bool | str | None] = {
            "value": f(self.value),
            "ci_low": f(self.low),
            "ci_high": f(self.high),
            "n": self.n,
            "unfinished": self.unfinished,
            "lower_bound": self.bound,
        }
        if self.interval is not None:
            fields = self.interval.fields(scale)
            out.update(
                ci_method=fields["ci_method"],
                ci_confidence=fields["ci_confidence"],
                ci_reason=fields["ci_reason"],
            )
        return out


NAN_QUANTILE = QuantileEstimate(
    math.nan, math.nan, math.nan, 0, 0, False, iv.declined(0.95, iv.METHOD_EXACT, "no requests")
)


def _col(df: pd.DataFrame, name: str) -> np.ndarray:
    if name not in df:
        return np.full(len(df), np.nan)
    return frame_memo.floats(df, name)  # converted once per summary (frame_memo)


def admitted(df: pd.DataFrame) -> np.ndarray:
    """Requests that were sent and not rejected: the latency population."""
    return frame_memo.memo(df, "admitted", lambda: _admitted(df))


def _admitted(df: pd.DataFrame) -> np.ndarray:
    return (df["status"] != "rejected").to_numpy() & np.isfinite(_col(df, "t_sent_ns"))


def last_seen_ns(df: pd.DataFrame, timeout_s: float | None = None) -> np.ndarray:
    """When the client last knew about each request (relative to t0): `t_end_ns` where the
    generator recorded it, else the latest stage reached (and, for a timeout, the deadline)."""
    return frame_memo.memo(df, ("last_seen_ns", timeout_s), lambda: _last_seen(df, timeout_s))


def _last_seen(df: pd.DataFrame, timeout_s: float | None) -> np.ndarray:
    seen = _col(df, "t_end_ns").copy()  # filled in place: no new array per stage (issue 35)
    for name in (
        "t_done_ns",
        "t_last_token_ns",
        "t_first_token_ns",
        "t_first_byte_ns",
        "t_sent_ns",
    ):
        np.copyto(seen, _col(df, name), where=np.isnan(seen))
    if timeout_s is not None:
        deadline = _col(df, "t_intended_ns") + timeout_s * 1e9
        timed_out = frame_memo.equals(df, "status", "timeout")
        seen = np.where(timed_out, np.fmax(seen, deadline), seen)
    return seen


@dataclass(frozen=True)
class RowObservations:
    """Per request of a frame: the latency or censoring time, whether it was observed, and
    whether the request belongs to the metric's population at all."""

    time: np.ndarray
    observed: np.ndarray
    eligible: np.ndarray
    t: np.ndarray | None = None

    def select(self, mask: np.ndarray | None = None) -> Observations:
        # a group's rows by their indices: a boolean mask gathers each column element by
        # element, a branch each (fairbench.analysis.columns.rows_of, issue 35)
        keep = self.eligible if mask is None else np.flatnonzero(self.eligible & mask)
        t = None if self.t is None else self.t[keep]
        return Observations(self.time[keep], self.observed[keep], t)


def _rows(
    df: pd.DataFrame, event_ns: np.ndarray, origin_ns: np.ndarray, timeout_s: float | None
) -> RowObservations:
    seen = last_seen_ns(df, timeout_s)
    observed = np.isfinite(event_ns)
    time = np.fmax(np.where(observed, event_ns, seen) - origin_ns, 0.0)
    eligible = admitted(df) & np.isfinite(time)
    return RowObservations(time, observed, eligible, _col(df, "t_intended_ns"))


def first_response_ns(df: pd.DataFrame) -> np.ndarray:
    """When each request's first response came: its first token, or (for a response that
    streams none) the end of a successful one; NaN otherwise."""
    return frame_memo.memo(df, "first_response_ns", lambda: _first_response(df))


def _first_response(df: pd.DataFrame) -> np.ndarray:
    first = _col(df, "t_first_token_ns")
    whole = np.where(frame_memo.equals(df, "status", "ok"), _col(df, "t_done_ns"), np.nan)
    return np.where(np.isnan(first), whole, first)


def ttft_rows(
    df: pd.DataFrame, timeout_s: float | None = None, sent: bool = False
) -> RowObservations:
    """TTFT from the intended send (or the actual one, `sent`): observed when a first token (or,
    for a response that streams none, the whole successful response) arrived."""
    origin = _col(df, "t_sent_ns" if sent else "t_intended_ns")
    return _rows(df, first_response_ns(df), origin, timeout_s)


def e2e_rows(
    df: pd.DataFrame, timeout_s: float | None = None, sent: bool = False
) -> RowObservations:
    """E2E from the intended send (or the actual one): observed for requests that ended ok."""
    done = np.where(frame_memo.equals(df, "status", "ok"), _col(df, "t_done_ns"), np.nan)
    origin = _col(df, "t_sent_ns" if sent else "t_intended_ns")
    return _rows(df, done, origin, timeout_s)


def tpot_rows(df: pd.DataFrame, timeout_s: float | None = None) -> RowObservations:
    """Time per output token after the first, over admitted requests with a first token and at
    least 2 tokens planned: observed for ok streams of ≥ 2 tokens. A stream that never finished
    is censored at what it provably was at least: (last seen − first token) ÷ (max_tokens − 1),
    since it would have produced at most max_tokens. Dividing by the tokens seen so far would be
    no bound (a stream cut after k tokens can still end faster per token); without a known
    max_tokens the value is unknown, censored at 0 (it leaves the risk set, nothing claimed)."""
    first = _col(df, "t_first_token_ns")
    tokens = _col(df, "output_tokens")
    cap = _col(df, "max_tokens")
    ok = frame_memo.equals(df, "status", "ok")
    span_ok = _col(df, "t_last_token_ns") - first
    span_open = last_seen_ns(df, timeout_s) - first
    with np.errstate(invalid="ignore", divide="ignore"):
        bound = np.where(np.isfinite(cap) & (cap >= 2), span_open / (cap - 1), 0.0)
        value = np.where(ok, span_ok / (tokens - 1), bound)
    eligible = admitted(df) & np.isfinite(first) & (cap >= 2)
    eligible &= (~ok | (tokens >= 2)) & np.isfinite(value)
    return RowObservations(np.fmax(value, 0.0), ok, eligible, _col(df, "t_intended_ns"))


def itl_max_rows(df: pd.DataFrame, timeout_s: float | None = None) -> RowObservations:
    """The largest gap between consecutive tokens: observed for ok streams of ≥ 2 tokens;
    censored at the larger of the gaps seen and the silence since the last token otherwise."""
    ok = frame_memo.equals(df, "status", "ok")
    gap = _col(df, "itl_max_ns")
    silence = last_seen_ns(df, timeout_s) - _col(df, "t_last_token_ns")
    value = np.where(ok, gap, np.fmax(np.nan_to_num(gap, nan=0.0), silence))
    eligible = admitted(df) & np.isfinite(_col(df, "t_first_token_ns")) & np.isfinite(value)
    return RowObservations(np.fmax(value, 0.0), ok, eligible, _col(df, "t_intended_ns"))


def _km(obs: Observations) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Event times, F at each, and Greenwood's variance of F there (events before censorings
    at equal times).

    Any order by time serves, the observations' own (`_by_value`, which their percentiles
    share) included, once the events of each run of equal times are put before its
    censorings (`_events_first`): tied events are interchangeable, and so are tied
    censorings, since a position's factor depends only on whether it is an event and on how
    many stand at risk there. Why: a stable argsort, then a lexsort wherever times tie (a
    simulator's steps end many requests at one instant), were 2 sorts per group, most of a
    summary's CPU where requests are cut off (issue 35: 164,550 cancelled under three-tier
    on the 10-minute fleet). The same arrays, to the bit, as the stable sort and lexsort
    (tests/test_censored_km.py keeps them as the reference)."""
    order = obs._by_value
    t = obs.time[order]
    d = obs.observed[order]
    if len(t) and np.isnan(t[-1]):  # NaN (sorted last): the former rule, stable order and all
        order = np.argsort(obs.time, kind="stable")
        t = obs.time[order]
        if len(t) > 1 and np.any(t[1:] == t[:-1]):
            order = np.lexsort((~obs.observed, obs.time))
            t = obs.time[order]
        d = obs.observed[order]
    elif len(t) > 1:
        same = t[1:] == t[:-1]
        if same.any():  # ties: events first, as Kaplan–Meier wants
            d = _events_first(d, same)
    # the products and sums over the events alone: a censoring's factor is 1.0 and its
    # Greenwood term 0.0, and x · 1.0 = x and x + 0.0 = x exactly (cumprod and cumsum
    # accumulate in order, pairing nothing), so F and its variance at the events are the
    # whole array's read at them, to the bit, with no array of every position (issue 35: the
    # 10-minute fleet's overall curves under three-tier, 1.5-1.7M each). The same operations
    # in place, the kept times taken first: fresh temporaries laid out around the kept arrays
    # raised the three-tier summary's peak RSS by 45 MB
    at = np.flatnonzero(d)
    times = t[at]
    at_risk = np.subtract(len(t), at, dtype=np.float64)  # exact: both below 2**53
    del at
    with np.errstate(divide="ignore", invalid="ignore"):
        surv = np.divide(1.0, at_risk)
        np.subtract(1.0, surv, out=surv)
        np.cumprod(surv, out=surv)
        green = at_risk - 1.0
        green *= at_risk  # (n − 1) · n, the same product as n · (n − 1)
        np.divide(1.0, green, out=green)
        green[at_risk <= 1] = 0.0
        np.cumsum(green, out=green)
    del at_risk
    var = surv * surv
    var *= green  # (S · S) · G, as S * S * G associates
    del green
    np.subtract(1.0, surv, out=surv)
    return times, surv, var


def _events_first(d: np.ndarray, same: np.ndarray) -> np.ndarray:
    """The event flags of observations in time order (`d`; `same[i]`: time i+1 equals time
    i) with each run of equal times reordered events first: the run's first e positions are
    events, the rest censorings. Only the flags move: the times of a run are equal.

    Only the runs of two or more are read and rewritten: a run of one is its own order.
    Why: the run starts, lengths and per-position arrays of every observation cost a group
    with a few hundred ties as much as one where most times tie (issue 35: the TTFT and E2E
    of the 10-minute fleet under three-tier, 1.7M observations and under 1,100 ties)."""
    edge = np.diff(same.astype(np.int8), prepend=np.int8(0), append=np.int8(0))
    lo = np.flatnonzero(edge == 1)  # each tied run's first position
    hi = np.flatnonzero(edge == -1) + 1  # and one past its last
    lengths = hi - lo
    begin = np.cumsum(lengths) - lengths  # each run's first place among the tied positions
    place = np.arange(int(lengths.sum()))
    within = place - np.repeat(begin, lengths)  # position within its run
    at = within + np.repeat(lo, lengths)  # the tied positions, run after run
    events = np.add.reduceat(d[at].astype(np.int64), begin)
    out = d.copy()
    out[at] = within < np.repeat(events, lengths)
    return out


def quantile(obs: Observations, q: float) -> tuple[float, bool]:
    """(p_q, is_lower_bound): the one quantile definition of every latency figure."""
    n = len(obs)
    if n == 0:
        return math.nan, False
    k = max(1, math.ceil(q * n))
    if obs.observed.all():
        return float(obs.sorted_time[k - 1]), False
    if n - int(obs.observed.sum()) > n - k:  # more unfinished than the tail beyond p_q
        return float(obs.sorted_time[k - 1]), True
    times, cdf, _ = obs.km
    hit = np.searchsorted(cdf, q - 1e-12, side="left")
    if hit < len(times):
        return float(times[hit]), False
    return float(obs.sorted_time[k - 1]), True


def quantiles(obs: Observations, qs: tuple[float, ...]) -> list[tuple[float, bool]]:
    """`quantile` at each q, the same values. Where nothing has sorted the observations and
    nothing else will (no interval is asked of them: a group's ITL max and queue time), the
    order statistics at the percentiles' ranks come from one np.partition, O(n), instead of
    a sort: exactly the values the sort puts there. Why: those 11 sorts were 0.63 of a
    10-minute fleet summary's CPU s (issue 35). Kaplan–Meier values go through `quantile`."""
    n = len(obs)
    if n == 0 or obs.ranked or "sorted_time" in obs.__dict__ or "_by_value" in obs.__dict__:
        return [quantile(obs, q) for q in qs]
    ks = [max(1, math.ceil(q * n)) for q in qs]
    unfinished = n - int(obs.observed.sum())
    if unfinished and any(unfinished <= n - k for k in ks):  # Kaplan–Meier's, not a rank's
        return [quantile(obs, q) for q in qs]
    at = np.partition(obs.time, sorted({k - 1 for k in ks}))
    return [(float(at[k - 1]), unfinished > 0) for k in ks]


def quantile_estimate(obs: Observations, q: float, confidence: float = 0.95) -> QuantileEstimate:
    """The quantile and its interval (see the module docstring for which interval when)."""
    n, unfinished = len(obs), obs.unfinished
    if n == 0:
        return NAN_QUANTILE
    value, bound = quantile(obs, q)
    if bound:
        it = bound_interval(obs, q, value, confidence)
    elif unfinished == 0:
        it = iv.percentile_interval(obs.sorted_time, q, confidence, obs.dependence_at(value))
    else:
        times, cdf, var = obs.km
        dep = obs.dependence_at(value)
        it = iv.km_interval(times, cdf, var, q, value, confidence, dep)
        it = _at_least_the_ranks(it, times, cdf, len(obs), q, dep)
    low, high = it.low, it.high
    if not it.declined:  # the point always lies inside its interval
        low, high = min(low, value), max(high, value)
    return QuantileEstimate(value, low, high, n, unfinished, bound, it)


METHOD_KM_RANKS = "; at least the binomial ranks' Kaplan–Meier quantiles (Greenwood's tail)"


def _at_least_the_ranks(
    km: iv.Interval, times: np.ndarray, cdf: np.ndarray, n: int, q: float, dep: iv.Dependence
) -> iv.Interval:
    """Brookmeyer–Crowley's interval, never narrower than the ranks l, u an uncensored sample
    of n gets (`iv.percentile_interval`'s, widened alike for dependence) read on Kaplan–Meier's
    scale: the first event times where F reaches l/n and u/n (without censoring, X_(l) and
    X_(u)); unbounded above where u is (n too small) or F never reaches u/n. Why: Greenwood's
    variance is 0 where F reaches 1, so with one unfinished request the upper end of p99 at
    n = 100 was the sample maximum, below the true p99 37% of the time (59.5% coverage of 400
    exponential samples with one early cancel; uncensored, the interval is one-sided)."""
    if km.declined:
        return km
    tail = (1 - km.confidence) / 2

    def ranks(tail: float) -> tuple[float, float]:
        lo, hi = iv._exact_ranks(n, q, tail)
        if dep.factor > 1.0:
            dlo, dhi = iv._dependent_ranks(n, q, dep, tail)
            lo, hi = min(lo, dlo), max(hi, dhi)
        return lo, hi

    def at(rank: float) -> float:  # the first event time where F ≥ rank / n (∞: never)
        hit = int(np.searchsorted(cdf, rank / n - 1e-12, side="left"))
        return float(times[hit]) if hit < len(times) else math.inf

    lo_rank, hi_rank = ranks(tail)
    if not math.isfinite(hi_rank):  # one-sided, as percentile_interval: the full confidence
        lo_rank = ranks(2 * tail)[0]
    # the lower rank's floor: `iv.percentile_interval` interpolates between X_(⌊l⌋) and X_(⌈l⌉)
    low = min(km.low, 0.0 if lo_rank < 1 else at(math.floor(lo_rank)))
    high = max(km.high, at(hi_rank) if math.isfinite(hi_rank) else math.inf)
    if (low, high) == (km.low, km.high):
        return km
    reason = km.reason
    if math.isinf(high) and not math.isinf(km.high):
        level = f"{km.confidence:.0%}"
        why = (
            f"n = {n} cannot bound p{iv._pct(q)} from above at {level} (needs n ≥ "
            f"{iv.needed_n(q, km.confidence, dep)})"
            if not math.isfinite(hi_rank)
            else f"too few requests finished beyond p{iv._pct(q)}"
        )
        reason = f"upper end unbounded, the lower end a one-sided {level} bound: {why}"
    return iv.Interval(low, high, km.confidence, km.method + METHOD_KM_RANKS, reason)


METHOD_BOUND = "lower bound (censored mass): binomial rank of every time seen, finished or not"


def bound_interval(
    obs: Observations, q: float, value: float, confidence: float = 0.95
) -> iv.Interval:
    """`[T_(l), ∞)` for a percentile in censored mass: T the times seen (an unfinished request's
    latency is at least its), l the binomial rank whose one-sided coverage is `confidence`
    (lowered for serial correlation as the percentiles' ranks are). Why not `[value, ∞)`: the
    value, T_(ceil(q·n)), bounds the *sample's* percentile, and the true one lies below it about
    half the time when few are unfinished (vtc-overload: 19 of 1,091, just over the 10 beyond
    p99); T_(l) ≤ X_(l) ≤ ξ_q whenever at least l true latencies are ≤ ξ_q, which has the stated
    probability whatever the unfinished would have taken. All of the 5% is on the lower side,
    where a two-sided interval puts 2.5%."""
    n = len(obs)
    reason = (
        f"p{iv._pct(q)} falls among unfinished requests ({obs.unfinished} of {n}, more than the "
        f"{n - max(1, math.ceil(q * n))} beyond p{iv._pct(q)})"
    )
    dep = obs.dependence_at(value)
    lo, _ = iv._exact_ranks(n, q, 1.0 - confidence)
    if dep.factor > 1.0:
        if not dep.enough:
            why = f"{reason}: ≥ value, no bound at {confidence:.0%}; {iv._too_short(dep)}"
            return iv.declined(confidence, METHOD_BOUND, why)
        lo = min(lo, iv._dependent_ranks(n, q, dep, 1.0 - confidence)[0])
    low = 0.0 if lo < 1 else iv._at_rank(obs.sorted_time, lo)
    reason += f": a one-sided {confidence:.0%} lower bound"
    return iv.Interval(min(low, value), math.inf, confidence, METHOD_BOUND, reason)
