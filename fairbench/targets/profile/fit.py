"""The fit of the cost model's coefficients to the probe's observations.

Pure numpy: imports only the values (model.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from fairbench.targets.profile.model import (
    COEFFICIENTS,
    Observation,
    ProbeError,
)
from reference_scheduler.core.costmodel import Profile

# ---------------------------------------------------------------- the fit


def predict(obs: Sequence[Observation], x: np.ndarray, form: str = "max") -> np.ndarray:
    """Milliseconds the coefficient vector `x` (COEFFICIENTS order) predicts per observation,
    with the mixed step's `form` (costmodel's `mixed_step`: max or sum)."""
    a, b, c, floor, d, e, f, overhead = (float(v) for v in x)
    prof = Profile(
        "fit", a=a, b=b, c=c, floor=floor, d=d, e=e, f=f, kv_cache_tokens=1, mixed_step=form
    )
    out = np.empty(len(obs))
    for i, o in enumerate(obs):
        ms = prof.step_ms(o.n, o.batch, o.context)
        out[i] = ms + (overhead if o.kind == "prefill" else 0.0)
    return out


def _plateau(pre: Sequence[Observation]) -> tuple[float, float, float]:
    """(floor ms, intercept, slope) of the prefill medians as `max(floor, intercept + slope·n)`:
    the shortest k lengths on the floor (their mean) and a line through the rest, the k with
    the smallest relative squared error; a floor of 0 when no k beats one line. Why: the
    least-squares fit cannot find a floor by itself, since the floor's gradient is zero while it
    binds no point, so it is started where the data put it."""
    pts = sorted((o.n, o.ms) for o in pre)
    n = np.array([p[0] for p in pts], dtype=float)
    ms = np.array([p[1] for p in pts], dtype=float)
    slope, icpt = np.polyfit(n, ms, 1)
    best = (float(np.sum(((icpt + slope * n - ms) / ms) ** 2)), 0.0, float(icpt), float(slope))
    for k in range(2, len(pts) - 1):
        s_, i_ = np.polyfit(n[k:], ms[k:], 1)
        level = float(np.mean(ms[:k]))
        if s_ <= 0 or i_ + s_ * n[k - 1] >= level:  # the line must pass under the plateau
            continue
        pred = np.maximum(level, i_ + s_ * n)
        err = float(np.sum(((pred - ms) / ms) ** 2))
        if err < best[0]:
            best = (err, level, float(i_), float(s_))
    return best[1], best[2], best[3]


def _start(obs: Sequence[Observation]) -> np.ndarray:
    """Linear fits of each phase: prefill ms on n (a + overhead, b, and the floor the shortest
    prompts sit on), decode ms on B and C; the mixed steps, where the compute term binds, put
    `a` apart from the overhead (prefill = overhead + a + b·n, a mixed step a + b·(n + B) + f·C
    with no overhead in it), else half the intercept each."""
    pre = [o for o in obs if o.kind == "prefill"]
    dec = [o for o in obs if o.kind == "decode"]
    b, a0, level = 0.01, 1.0, 0.0
    if len(pre) >= 4:
        level, icpt, slope = _plateau(pre)
        b, a0 = max(float(slope), 1e-6), max(float(icpt), 0.0)
    elif len(pre) >= 2:
        slope, icpt = np.polyfit([o.n for o in pre], [o.ms for o in pre], 1)
        b, a0 = max(float(slope), 1e-6), max(float(icpt), 0.0)
    d, e, f = 1.0, 0.01, 1e-5
    if len(dec) >= 3:
        A = np.array([[1.0, o.batch, o.context] for o in dec])
        sol, *_ = np.linalg.lstsq(A, np.array([o.ms for o in dec]), rcond=None)
        d, e, f = (max(float(v), 1e-6) for v in sol)
    a = a0 / 2
    mixed = [
        o.ms - b * (o.n + o.batch) - f * o.context
        for o in obs
        if o.kind == "mixed" and o.ms - f * o.context > d + e * o.batch
    ]
    if mixed:
        a = min(a0, max(0.0, float(np.median(mixed))))
    overhead = a0 - a
    floor = max(0.0, level - overhead) if level else 0.0
    return np.array([a, b, 1e-9, floor, d, e, f, overhead])


@dataclass
class Fit:
    coefficients: dict[str, float]
    stderr: dict[str, float]
    residuals: list[dict[str, Any]]  # per design point: its median, the fit, the residual
    rms_relative: float
    form: str  # the mixed step's form the residuals chose (max | sum)
    rms_by_form: dict[str, float]
    n: int  # design points
    raw: list[dict[str, Any]]  # every observation of every round
    # the front end's core time per request, from the load phase (None: not probed)
    front_end: dict[str, Any] | None = None
    # what an idle engine takes to start, from the idle phase (None: not probed)
    idle: dict[str, Any] | None = None

    def summary(self) -> dict[str, Any]:
        """What the profile's `fit:` block says of this fit (a probe's or a merge's)."""
        return {
            "overhead_ms": self.coefficients["overhead"],
            **({"front_end": self.front_end} if self.front_end is not None else {}),
            **({"idle": self.idle} if self.idle is not None else {}),
            "stderr": self.stderr,
            "rms_relative_residual": round(self.rms_relative, 4),
            "mixed_step": f"{self.form}: the smaller RMS relative residual of the two forms, "
            f"sum only if 5% smaller ({self.rms_by_form})",
            "design_points": self.n,
            "observations": len(self.raw),
        }

    def profile_fields(self) -> dict[str, float]:
        """The profile's fields: the step coefficients, and the request overhead as
        `request_overhead_ms` (the sim target adds it to each request's way in)."""
        fields = {k: v for k, v in self.coefficients.items() if k != "overhead"}
        fields["request_overhead_ms"] = self.coefficients["overhead"]
        if self.front_end is not None:
            fields["front_end_core_ms"] = self.front_end["core_ms"]
        if self.idle is not None:
            fields["idle_wake_ms"] = self.idle["wake_ms"]
        return fields


def row(o: Observation) -> dict[str, Any]:
    """An observation as the profile's `fit.data` keeps it (`gap_ms` on load and idle rows
    only, `prompts` on load rows only)."""
    out = {**asdict(o), "ms": round(o.ms, 3)}
    if o.kind in ("load", "idle"):
        out["gap_ms"] = round(o.gap_ms, 3)
    else:
        del out["gap_ms"]
    if o.kind == "load" and o.prompts:
        out["prompts"] = list(o.prompts)
    else:
        del out["prompts"]
    return out


def medians(obs: Sequence[Observation]) -> list[Observation]:
    """One observation per design point: the median over its repetitions (a late wake or a
    neighbour's burst in one round does not move it)."""
    groups: dict[str, list[Observation]] = {}
    for o in obs:
        groups.setdefault(o.key or f"{o.kind} {o.n} {o.batch} {o.context}", []).append(o)
    out = []
    for key, rows in groups.items():
        med = lambda f, rows=rows: float(np.median([getattr(r, f) for r in rows]))  # noqa: E731
        out.append(
            Observation(
                rows[0].kind,
                round(med("n")),
                rows[0].batch,
                round(med("context")),
                med("ms"),
                key,
            )
        )
    return out


@dataclass(frozen=True)
class Limits:
    """The engine's limits the load phase's burst is simulated under."""

    max_num_seqs: int
    max_num_batched_tokens: int
    chunked_prefill: bool = True


def fit_form(raw: Sequence[Observation], form: str) -> Fit:
    """Least squares over the cost model's coefficients (and the request overhead), on the
    median of each design point, with the mixed step's `form`."""
    from scipy.optimize import least_squares

    obs = medians(raw)
    kinds = {o.kind for o in obs}
    if not {"prefill", "decode"} <= kinds or len(obs) < len(COEFFICIENTS):
        raise ProbeError(
            f"too few observations to fit ({len(obs)}: {sorted(kinds)}); raise --budget"
        )
    y = np.array([o.ms for o in obs])
    scale = np.array([max(v, 1e-3) for v in y])
    x0 = _start(obs)
    at = COEFFICIENTS.index("floor")
    typical = np.maximum(np.abs(x0), 1e-6)
    typical[at] = max(typical[at], 1.0)  # a floor started at 0 must still be able to move

    def residuals(u: np.ndarray) -> np.ndarray:
        return (predict(obs, u * typical, form) - y) / scale

    starts = [x0]
    if x0[at] > 0:  # and from no floor: the smaller cost wins, so a false plateau cannot stick
        starts.append(np.where(np.arange(len(x0)) == at, 0.0, x0))
    lengths = sorted({o.n for o in obs if o.kind == "prefill"})

    def on_floor(u: np.ndarray) -> int:
        """Prefill lengths the floor binds at the coefficients `u` (scaled)."""
        a, b, c, floor = (float(v) for v in (u * typical)[:4])
        return sum(1 for n in lengths if floor > a + b * n + c * n * n)

    found = [
        least_squares(
            residuals,
            start / typical,
            bounds=(0.0, np.inf),
            loss="soft_l1",
            f_scale=0.25,
            diff_step=1e-3,
            max_nfev=4000,
        )
        for start in starts
    ]
    # A floor must hold two prompt lengths or more: one short prompt's noise is not a floor
    # (against the reference server with none, a noisy 16-token point once gave 15 ms).
    kept = [f for f in found if on_floor(f.x) != 1] or found[-1:]
    sol = min(kept, key=lambda f: float(f.cost))
    x = sol.x * typical
    if not on_floor(sol.x):
        x[at] = 0.0  # a floor under every prompt probed binds nothing: the data say no floor
    r = residuals(sol.x)
    dof = max(1, len(obs) - len(COEFFICIENTS))
    jac = sol.jac / typical  # d residual / d coefficient
    try:
        cov = np.linalg.pinv(jac.T @ jac) * float(r @ r) / dof
        se = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    except np.linalg.LinAlgError:
        se = np.full(len(x), math.nan)
    pred = predict(obs, x, form)
    rows = [
        {**row(o), "fit_ms": round(float(p), 3),
         "residual_pct": round(100 * (float(p) - o.ms) / o.ms, 2) if o.ms > 0 else None,
         "repeats": sum(1 for r in raw if r.key == o.key)}
        for o, p in zip(obs, pred, strict=True)
    ]  # fmt: skip
    return Fit(
        coefficients={k: float(f"{v:.4g}") for k, v in zip(COEFFICIENTS, x, strict=True)},
        stderr={k: float(f"{v:.3g}") for k, v in zip(COEFFICIENTS, se, strict=True)},
        residuals=rows,
        rms_relative=float(np.sqrt(np.mean(((pred - y) / scale) ** 2))),
        form=form,
        rms_by_form={},
        n=len(obs),
        raw=[row(o) for o in raw],
    )
