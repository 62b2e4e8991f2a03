"""The fit of the cost model's coefficients to the probe's observations.

Pure numpy: imports only the values (model.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
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


def _curve(n: np.ndarray, ms: np.ndarray) -> tuple[float, float, float]:
    """(intercept, b, c) of `ms ≈ intercept + b·n + c·n²` by least squares on relative error
    (as the fit weighs it), b and c at least 0: a line where the points bend down or are too
    few for a parabola. Why the parabola: a line through a sweep whose longest prompts bend up
    (the CPU vLLM's 1,938-token prefill at 149 ms, c·n² a third of it) crosses 0 below the
    shortest ones, and an intercept of 0 started `a` and the overhead at 0."""
    w = 1.0 / np.maximum(ms, 1e-3)
    if len(n) >= 3:
        c2, b2, i2 = np.polyfit(n, ms, 2, w=w)
        if c2 >= 0 and b2 >= 0:
            return float(i2), float(b2), float(c2)
    if len(n) >= 2:
        b1, i1 = np.polyfit(n, ms, 1, w=w)
        return float(i1), max(float(b1), 1e-6), 0.0
    return float(ms[0]) / 2, 1e-6, 0.0


def _plateau(pre: Sequence[Observation]) -> tuple[float, float, float, float]:
    """(floor ms, intercept, b, c) of the prefill medians as `max(floor, intercept + b·n +
    c·n²)`: the shortest k lengths on the floor (their mean) and a curve (`_curve`) through the
    rest, the k with the smallest relative squared error; a floor of 0 when no k beats one
    curve. Why: the least-squares fit cannot find a floor by itself, since the floor's gradient
    is zero while it binds no point, so it is started where the data put it."""
    pts = sorted((o.n, o.ms) for o in pre)
    n = np.array([p[0] for p in pts], dtype=float)
    ms = np.array([p[1] for p in pts], dtype=float)

    def err(pred: np.ndarray) -> float:
        return float(np.sum(((pred - ms) / ms) ** 2))

    icpt, b, c = _curve(n, ms)
    best = (err(icpt + b * n + c * n * n), 0.0, icpt, b, c)
    for k in range(2, len(pts) - 1):
        i_, b_, c_ = _curve(n[k:], ms[k:])
        level = float(np.mean(ms[:k]))
        if b_ <= 0 or i_ + b_ * n[k - 1] + c_ * n[k - 1] ** 2 >= level:
            continue  # the curve must pass under the plateau
        e = err(np.maximum(level, i_ + b_ * n + c_ * n * n))
        if e < best[0]:
            best = (e, level, i_, b_, c_)
    return best[1], best[2], best[3], best[4]


def _start(obs: Sequence[Observation], form: str = "max") -> np.ndarray:
    """Where the least squares starts: the prefill sweep's plateau and curve (`_plateau`:
    overhead + a, b, c and overhead + floor), the decode sweep's plane (d, e, f), and `a`
    apart from the overhead by the mixed steps, read in the fitted `form` (a prefill's TTFT
    holds both, a mixed step only `a`: in the max form its compute term a + b·(n + B) + c·n²
    where that term binds, in the sum form its chunk a + b·n + c·n² after the decode step);
    without mixed steps, half the intercept each."""
    pre = [o for o in obs if o.kind == "prefill"]
    dec = [o for o in obs if o.kind == "decode"]
    b, c, icpt, level = 0.01, 0.0, 1.0, 0.0
    if len(pre) >= 4:
        level, icpt, b, c = _plateau(pre)
    elif pre:
        icpt, b, c = _curve(
            np.array([o.n for o in pre], dtype=float), np.array([o.ms for o in pre], dtype=float)
        )
    icpt = max(icpt, 0.0)
    d, e, f = 1.0, 0.01, 1e-5
    if len(dec) >= 3:
        A = np.array([[1.0, o.batch, o.context] for o in dec])
        sol, *_ = np.linalg.lstsq(A, np.array([o.ms for o in dec]), rcond=None)
        d, e, f = (max(float(v), 1e-6) for v in sol)
    mixed = []
    for o in obs:
        if o.kind != "mixed":
            continue
        decode, chunk = d + e * o.batch, b * o.n + c * o.n * o.n
        if form == "sum":
            mixed.append(o.ms - f * o.context - decode - chunk)
        elif o.ms - f * o.context > decode:  # the compute term binds: it shows `a`
            mixed.append(o.ms - f * o.context - b * o.batch - chunk)
    # the mixed steps have no overhead in them: they set `a` even where it passes the
    # prefills' intercept (the overhead is then 0), which the least squares settles
    a = max(0.0, float(np.median(mixed))) if mixed else icpt / 2
    overhead = max(0.0, icpt - a)
    floor = max(0.0, level - overhead) if level else 0.0
    return np.array([a, b, max(c, 1e-9), floor, d, e, f, overhead])


def _typical(obs: Sequence[Observation], x0: np.ndarray) -> np.ndarray:
    """Each coefficient's scale for the least squares (it works in x / typical): its start,
    or, for one started at or near 0, what moves a step by about a decode step's time. Why:
    a scale of its start froze a coefficient started at 0 (a and the overhead on the CPU vLLM,
    scaled by 1e-6, stayed at 0 while the floor and b took their part)."""
    unit = float(np.median([o.ms for o in obs if o.kind == "decode"] or [1.0]))
    longest = max([o.n for o in obs if o.kind in ("prefill", "mixed")] or [1])
    batch = max([o.batch for o in obs] or [1]) or 1
    context = max([o.context for o in obs] or [1]) or 1
    least = {
        "a": unit, "b": unit / longest, "c": unit / longest**2, "floor": unit, "d": unit,
        "e": unit / batch, "f": unit / context, "overhead": unit,
    }  # fmt: skip
    return np.maximum(np.abs(x0), [0.1 * least[k] for k in COEFFICIENTS])


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
    # what an arrival adds to a full batch's steps, from the arrival phase (None: not probed)
    arrival: dict[str, Any] | None = None
    floor_binds: int = 0  # prefill lengths the fitted floor binds (0: no floor fitted)
    floor_test: dict[str, Any] = field(default_factory=dict)  # `floor_test`'s answer

    def summary(self) -> dict[str, Any]:
        """What the profile's `fit:` block says of this fit (a probe's or a merge's)."""
        return {
            "overhead_ms": self.coefficients["overhead"],
            **({"front_end": self.front_end} if self.front_end is not None else {}),
            **({"idle": self.idle} if self.idle is not None else {}),
            **({"arrival": self.arrival} if self.arrival is not None else {}),
            "stderr": self.stderr,
            "rms_relative_residual": round(self.rms_relative, 4),
            "mixed_step": f"{self.form}: the smaller RMS relative residual of the two forms "
            f"({self.rms_by_form})",
            **({"floor_test": self.floor_test} if self.floor_test else {}),
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


FLOOR = COEFFICIENTS.index("floor")
_FLOOR_MASK = np.arange(len(COEFFICIENTS)) == FLOOR


def _solve(
    obs: Sequence[Observation], form: str, x0: np.ndarray, typical: np.ndarray, floor: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Least squares of the relative residuals (soft-L1, coefficients at least 0) from `x0`:
    (coefficients, Jacobian of the residuals by coefficient, residuals). Without `floor` the
    floor is held at 0 (its column of the Jacobian is 0), not fitted."""
    from scipy.optimize import least_squares

    y = np.array([o.ms for o in obs])
    scale = np.maximum(y, 1e-3)
    free = ~_FLOOR_MASK if not floor else np.ones(len(x0), dtype=bool)
    base = np.where(free, 0.0, x0)

    def full(u: np.ndarray) -> np.ndarray:
        x = base.copy()
        x[free] = u * typical[free]
        return x

    def residuals(u: np.ndarray) -> np.ndarray:
        return (predict(obs, full(u), form) - y) / scale

    sol = least_squares(
        residuals,
        x0[free] / typical[free],
        bounds=(0.0, np.inf),
        loss="soft_l1",
        f_scale=0.25,
        diff_step=1e-3,
        max_nfev=4000,
    )
    jac = np.zeros((len(obs), len(x0)))
    jac[:, free] = sol.jac / typical[free]
    return full(sol.x), jac, residuals(sol.x)


def _on_floor(obs: Sequence[Observation], x: np.ndarray) -> list[Observation]:
    """The prefill design points the floor binds at the coefficients `x`."""
    a, b, c, floor = (float(v) for v in x[:4])
    return [o for o in obs if o.kind == "prefill" and floor > a + b * o.n + c * o.n * o.n]


def floor_test(raw: Sequence[Observation]) -> dict[str, Any]:
    """Whether the prefill sweep identifies a step floor, on the prefills alone (a TTFT is
    `overhead + max(floor, a + b·n + c·n²)` in either form of the mixed step, so the answer is
    the same for both): the sweep's best split into a level and a curve (`_plateau`) puts two
    lengths or more on the level; two of them or more lie above the curve fitted to the
    other lengths by more than those lengths' noise (2% at least), since a floor is identified
    only by steps whose cost without it is below it; and the split predicts each length held
    out (refitted without it) better than a curve alone does. Why each: one high short prompt
    is not a floor (16 tokens 40% high, 32 on the curve: one length above it); a floor is one
    coefficient more, so it always fits as well or better; and a floor fitted where the data do
    not hold one took `a`'s part on the CPU vLLM (a = 1e-16, the overhead 7.3 ms: its twin ran
    31% fast). `identified` says; the rest is what it was decided on."""
    pts = sorted((o.n, o.ms) for o in medians(raw) if o.kind == "prefill")
    out: dict[str, Any] = {"identified": False, "on_level": 0, "above_curve": 0}
    if len(pts) < 5:
        return out
    n = np.array([p[0] for p in pts], dtype=float)
    ms = np.array([p[1] for p in pts], dtype=float)

    def split(keep: np.ndarray) -> tuple[float, float, float, float]:
        kept = zip(n[keep], ms[keep], strict=True)
        return _plateau([Observation("prefill", int(v), 0, 0, float(m)) for v, m in kept])

    everything = np.ones(len(n), dtype=bool)
    level, icpt, b, c = split(everything)
    on = np.flatnonzero(level > icpt + b * n + c * n * n) if level else np.array([], int)
    out["on_level"] = len(on)
    if len(on) < 2 or len(n) - len(on) < 3:
        return out
    rest = np.ones(len(n), dtype=bool)
    rest[on] = False
    i_, b_, c_ = _curve(n[rest], ms[rest])
    fitted = (i_ + b_ * n[rest] + c_ * n[rest] ** 2) / ms[rest] - 1.0
    margin = 1.0 + max(0.02, 2.0 * float(np.sqrt(np.mean(fitted**2))))
    out["above_curve"] = int(np.sum(ms[on] > margin * (i_ + b_ * n[on] + c_ * n[on] ** 2)))
    errors = {"level": 0.0, "curve": 0.0}
    for k in range(len(n)):
        keep = everything.copy()
        keep[k] = False
        lv, i1, b1, c1 = split(keep)
        errors["level"] += abs(max(lv, i1 + b1 * n[k] + c1 * n[k] ** 2) / ms[k] - 1.0)
        i2, b2, c2 = _curve(n[keep], ms[keep])
        errors["curve"] += abs((i2 + b2 * n[k] + c2 * n[k] ** 2) / ms[k] - 1.0)
    out["held_out"] = {k: round(float(v) / len(n), 4) for k, v in errors.items()}
    out["identified"] = bool(out["above_curve"] >= 2 and errors["level"] < errors["curve"])
    return out


def fit_form(raw: Sequence[Observation], form: str, floor: bool = False) -> Fit:
    """Least squares over the cost model's coefficients (and the request overhead), on the
    median of each design point, with the mixed step's `form`; with `floor`, the floor is fitted
    too, started where the prefill sweep's shortest prompts sit level (`_plateau`), else it is
    held at 0; `floor_binds` counts the prefill lengths the fitted floor binds."""
    obs = medians(raw)
    kinds = {o.kind for o in obs}
    if not {"prefill", "decode"} <= kinds or len(obs) < len(COEFFICIENTS):
        raise ProbeError(
            f"too few observations to fit ({len(obs)}: {sorted(kinds)}); raise --budget"
        )
    y = np.array([o.ms for o in obs])
    scale = np.array([max(v, 1e-3) for v in y])
    x0 = _start(obs, form)
    typical = _typical(obs, x0)
    floor = floor and x0[FLOOR] > 0  # no level in the sweep: nothing to start a floor from
    if not floor:
        x0 = np.where(_FLOOR_MASK, 0.0, x0)
    x, jac, r = _solve(obs, form, x0, typical, floor)
    dof = max(1, len(obs) - len(COEFFICIENTS))
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
        floor_binds=len(_on_floor(obs, x)) if floor else 0,
    )
