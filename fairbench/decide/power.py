"""Power: how many pairs of runs it takes to detect a relative change of a given size.

The field's question is "is this 5% move in TTFT p99 real, and how many runs does it take to
know?". One run cannot answer it: a run-level p99 varies from seed to seed (and on a live engine
from run to run) by more than 5%. What answers it is the spread of the paired change over pilot
pairs, which `fairbench ab` runs anyway.

Method (paired log-ratio, t test):

- each pair i gives d_i = ln(B_i / A_i), the metric's log ratio; a relative change δ moves the
  mean of d by ln(1 + δ); the pairs' sample SD s of d is the run-to-run noise of the paired
  change (the plan is shared within a pair, so it cancels what the plan alone decides);
- n pairs detect δ at two-sided confidence 1 − α with power 1 − β when the noncentral t with
  n − 1 degrees of freedom and noncentrality √n · |ln(1 + δ)| / s exceeds t(n − 1, 1 − α/2)
  with probability 1 − β (exact for normal d; scipy.stats.nct). `pairs_needed` is the least
  such n ≥ 2; `normal_pairs` is the textbook approximation ((z₁₋α/₂ + z₁₋β) · s / ln(1 + δ))²
  it improves on at small n;
- the SD comes from the pilot pairs and is re-estimated as pairs are added (an internal pilot):
  `ab --detect` stops when the pairs run reach the number the current SD asks for, or at its
  maximum. `simulate_power` checks the formula by Monte Carlo (tests/test_power.py).

How long a run instead: where the pair-to-pair SD is the runs' own sampling noise it shrinks as
1/√duration, so n pairs of duration T carry about the information of one pair of n · T; where
drift between runs dominates (a live engine), only more pairs help. Both are stated, the first
as an upper bound on what longer runs buy.

Pure functions; `fairbench ab` and `fairbench compare` call them (fairbench.cli).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats as sps

POWER = 0.8  # the conventional target: a real change of the stated size is found 4 times in 5
MAX_PAIRS = 10_000  # where pairs_needed gives up (the change is lost in the noise)
METHOD = (
    "paired log-ratio t test: ln(B/A) per pair, its SD over the pairs run so far, noncentral t "
    "(scipy.stats.nct)"
)


class PowerError(ValueError):
    """Pilot data that cannot give a power calculation; the message says why and what would."""


def log_ratios(a: Sequence[float], b: Sequence[float]) -> np.ndarray:
    """ln(B_i / A_i) per pair; both arms' values must be positive and finite."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.shape != y.shape:
        raise PowerError(f"{len(x)} A values but {len(y)} B values: give one of each per pair")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y)) and np.all(x > 0) and np.all(y > 0)):
        raise PowerError("a power calculation needs a positive value of the metric in every run")
    return np.log(y / x)


def pilot_sd(a: Sequence[float], b: Sequence[float]) -> float:
    """The run-to-run SD of the paired log ratio over the pilot pairs (ddof 1; ≥ 2 pairs)."""
    d = log_ratios(a, b)
    if len(d) < 2:
        raise PowerError(
            f"{len(d)} pair: the run-to-run spread needs 2 or more pilot pairs (--iterations 3)"
        )
    return float(np.std(d, ddof=1))


def power(n: int, sd: float, change: float, confidence: float = 0.95) -> float:
    """Probability that n pairs' two-sided t test at `confidence` finds a relative `change`
    when ln(B/A) has SD `sd` across pairs (noncentral t; exact for normal log ratios)."""
    if n < 2:
        return 0.0
    effect = abs(math.log1p(change))
    if sd <= 0:
        return 1.0 if effect > 0 else 0.0
    df = n - 1
    crit = float(sps.t.ppf(0.5 + confidence / 2, df))
    ncp = math.sqrt(n) * effect / sd
    return float(sps.nct.sf(crit, df, ncp) + sps.nct.cdf(-crit, df, ncp))


def pairs_needed(
    sd: float, change: float, confidence: float = 0.95, target: float = POWER
) -> int | None:
    """The least n ≥ 2 pairs with power(n) ≥ target, or None past MAX_PAIRS."""
    if change == 0 or change <= -1:
        raise PowerError(f"a change of {change:+.0%} cannot be detected; give e.g. 5%")
    guess = max(2, normal_pairs(sd, change, confidence, target))
    n = 2 if guess <= 2 else guess - 1  # the t test needs at least the normal approximation's n
    while n <= MAX_PAIRS:
        if power(n, sd, change, confidence) >= target:
            return n
        n += 1
    return None


def normal_pairs(sd: float, change: float, confidence: float = 0.95, target: float = POWER) -> int:
    """The normal approximation: ⌈((z(1 − α/2) + z(power)) · sd / ln(1 + change))²⌉."""
    z = float(sps.norm.ppf(0.5 + confidence / 2) + sps.norm.ppf(target))
    return math.ceil((z * sd / abs(math.log1p(change))) ** 2) if sd > 0 else 1


def simulate_power(
    n: int,
    sd: float,
    change: float,
    confidence: float = 0.95,
    reps: int = 4000,
    seed: int = 0,
) -> float:
    """Monte Carlo check of `power`: the share of `reps` experiments of n pairs with normal log
    ratios (mean ln(1 + change), SD `sd`) whose paired t test rejects at `confidence`."""
    rng = np.random.default_rng(seed)
    d = rng.normal(math.log1p(change), sd, size=(reps, n))
    t = d.mean(axis=1) / (d.std(axis=1, ddof=1) / math.sqrt(n))
    crit = float(sps.t.ppf(0.5 + confidence / 2, n - 1))
    return float(np.mean(np.abs(t) > crit))


def parse_change(text: str) -> float:
    """'5%' or '5' -> 0.05 (a relative change, positive or negative)."""
    raw = text.strip().removesuffix("%").strip()
    try:
        value = float(raw) / 100
    except ValueError:
        raise PowerError(f"{text!r} is not a percentage; write e.g. --detect 5%") from None
    if value == 0 or value <= -1 or not math.isfinite(value):
        raise PowerError(f"--detect {text}: give a non-zero change above -100%, e.g. 5%")
    return value


@dataclass(frozen=True)
class PowerPlan:
    """What the pilot pairs say about detecting `change` in `metric`."""

    metric: str
    change: float
    confidence: float
    pairs_run: int
    sd: float  # SD of ln(B/A) over the pairs run
    needed: int | None  # pairs for POWER at `confidence`; None: more than MAX_PAIRS
    window_s: float  # one run's measurement window

    @property
    def reached(self) -> bool:
        return self.needed is not None and self.pairs_run >= self.needed

    @property
    def power_now(self) -> float:
        return power(self.pairs_run, self.sd, self.change, self.confidence)

    def sentence(self) -> str:
        level = f"{self.confidence:.0%} confidence"
        head = (
            f"{self.metric}: detecting a {self.change:+.0%} change at {level} with "
            f"{POWER:.0%} power"
        )
        noise = f"run-to-run SD of ln(B/A) {self.sd:.3f} over {self.pairs_run} pairs"
        if self.needed is None:
            return f"{head} needs more than {MAX_PAIRS} pairs ({noise}): the noise hides it"
        longer = self.needed * self.window_s
        return (
            f"{head} needs {self.needed} pairs ({noise}; {METHOD}); or, where that SD is "
            f"sampling noise within runs, about one pair of {longer:,.0f} s windows; "
            f"power with the {self.pairs_run} pairs run: {self.power_now:.0%}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "change": self.change,
            "confidence": self.confidence,
            "power_target": POWER,
            "pairs_run": self.pairs_run,
            "sd_log_ratio": round(self.sd, 6),
            "pairs_needed": self.needed,
            "power_with_pairs_run": round(self.power_now, 4),
            "reached": self.reached,
            "method": METHOD,
            "sentence": self.sentence(),
        }


def plan(
    metric: str,
    change: float,
    a: Sequence[float],
    b: Sequence[float],
    confidence: float = 0.95,
    window_s: float = 0.0,
) -> PowerPlan:
    """The power plan from the pairs run so far (their metric values, A then B per pair)."""
    sd = pilot_sd(a, b)
    return PowerPlan(
        metric, change, confidence, len(a), sd, pairs_needed(sd, change, confidence), window_s
    )


def from_comparison(comparison: Any, metric: str, change: float, window_s: float) -> PowerPlan:
    """The plan from a Comparison's row `metric` (its per-pair A and B values)."""
    row = comparison.get(metric)
    if row is None:
        raise PowerError(f"{metric!r} is not among the compared rows")
    if comparison.pairs < 2:
        raise PowerError("one pair shows no run-to-run spread: --detect needs 2 or more pairs")
    return plan(metric, change, row.a_runs, row.b_runs, comparison.confidence, window_s)


def stop_reason(p: PowerPlan, max_pairs: int) -> str | None:
    """Why `ab --detect` stops after the pairs run (None: add a pair)."""
    if p.needed is None:
        return p.sentence() + "; stopped"
    if p.reached:
        return p.sentence() + f"; reached after {p.pairs_run}"
    if p.pairs_run >= max_pairs:
        return p.sentence() + f"; --max-iterations {max_pairs} reached first"
    return None
