"""What the probe measures beyond the step fit (the arrival cost, taken out of the mixed steps
before it; idle wake, burst makespan, front-end core), and `fit`, which joins them to the
coefficients' fit.

Pure functions of observations and a fit; imports fit.py and the values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from fairbench.targets.profile.fit import (
    Fit,
    Limits,
    fit_form,
    floor_test,
    row,
)
from fairbench.targets.profile.model import (
    ARRIVAL_WINDOW,
    Observation,
)


def _median_of(name: str, values: Sequence[float]) -> dict[str, Any]:
    """A charge estimated per burst or pair: `name` the median at least 0 (a charge cannot be
    negative; below-0 estimates are kept so the median is not biased up), with the median,
    the median absolute deviation and the count."""
    array = np.array(values, dtype=float)
    middle = float(np.median(array))
    return {
        name: float(f"{max(0.0, middle):.4g}"),
        "median_ms": round(middle, 4),
        "mad_ms": round(float(np.median(np.abs(array - middle))), 4),
        "observations": len(array),
    }


def idle_wake(idle: Sequence[Observation]) -> dict[str, Any]:
    """What an engine that idled takes to start: per idle observation, the time to first token
    of a request after the quiet less that of the same request at once (no model in it: the
    two cost the same prefill); the median, at least 0, with the median absolute deviation."""
    return {
        **_median_of("wake_ms", [o.ms for o in idle]),
        "after_quiet_ms": float(np.median([o.gap_ms for o in idle])),
        "method": "per pair, the time to first token of a request after the quiet less that "
        "of the same length sent at once; median over pairs, at least 0",
    }


def burst_makespan_ms(
    the_fit: Fit, limits: Limits, o: Observation, front_end_ms: float
) -> float | None:
    """The simulated makespan of a load observation's burst: `o.batch` requests of `o.prompts`
    (or, in profiles written before them, `o.n` each) prompt and `o.context` output tokens,
    sent `o.gap_ms` apart from 0, each reaching the engine after
    the fitted request overhead, through vLLM's FCFS scheduling on the fitted steps, with
    `front_end_ms` charged per request that arrives while the engine runs others; None if the
    simulated engine could not serve the burst (a prompt past its step budget, unchunked)."""
    from reference_scheduler.core.job import Job
    from reference_scheduler.drivers.virtual import simulate
    from reference_scheduler.scheduler.config import parse_scheduler_config

    c = the_fit.coefficients
    profile = {
        "name": "burst",
        **{k: c[k] for k in "abcdef"},
        "floor": c.get("floor", 0.0),  # fits written before the floor was fitted have none
        "mixed_step": the_fit.form,
        "front_end_core_ms": front_end_ms,
        "kv_cache_tokens": 1 << 40,  # vLLM allocates as it goes; the burst is sized to fit
        "max_num_seqs": limits.max_num_seqs,
        "max_num_batched_tokens": limits.max_num_batched_tokens,
        "chunked_prefill": limits.chunked_prefill,
    }
    config = parse_scheduler_config({"engine": "vllm", "policy": "fcfs", "profile": profile})
    arrive, gap = c["overhead"] * 1e6, o.gap_ms * 1e6
    prompts = o.prompts or (o.n,) * o.batch
    jobs = [
        Job(i, "load", "load", n, o.context, round(arrive + i * gap)) for i, n in enumerate(prompts)
    ]
    result = simulate(jobs, config)
    if any(job.status != "finished" for job in result.jobs):
        return None
    return max(job.done_ns for job in result.jobs) / 1e6


# Bounds of one burst's estimate (ms): below 0 it is noise (a burst faster than the fitted steps
# alone), kept so that the median is not biased up but floored so one odd burst cannot outweigh
# the others; at MOST_MS the search stops.
LEAST_MS, MOST_MS = -4.0, 256.0


def _charge_for(makespan: Callable[[float], float | None], measured: float) -> float | None:
    """The charge (ms) at which `makespan(charge)` reaches `measured`, within [LEAST_MS,
    MOST_MS]; None if the simulated burst cannot be served or no charge moves it (the
    simulated engine never queued)."""
    base, at4 = makespan(0.0), makespan(4.0)
    if base is None or at4 is None or at4 <= base:
        return None
    if measured <= base:
        return max(LEAST_MS, (measured - base) / ((at4 - base) / 4.0))
    lo, hi, m = 0.0, 4.0, at4
    while m is not None and m < measured:
        lo, hi = hi, 2 * hi
        if hi > MOST_MS:
            return MOST_MS
        m = makespan(hi)
    for _ in range(14):
        mid = (lo + hi) / 2
        m = makespan(mid)
        lo, hi = (mid, hi) if m is not None and m < measured else (lo, mid)
    return (lo + hi) / 2


def front_end_core(load: Sequence[Observation], the_fit: Fit, limits: Limits) -> dict[str, Any]:
    """The core time one request's front end takes from a busy engine's steps: for each load
    observation, the charge per arriving request that makes the simulated burst's makespan the
    measured one, found by bisection (the makespan grows with the charge: every request after
    the first arrives while the engine runs). A burst faster than the fitted steps alone gives
    a negative estimate, by the slope between no charge and 4 ms (noise, kept so that the
    median is not biased up); the median over observations, at least 0, with the median
    absolute deviation beside it."""
    estimates = []
    for o in load:
        estimate = _charge_for(lambda ms, o=o: burst_makespan_ms(the_fit, limits, o, ms), o.ms)
        if estimate is not None:
            estimates.append(estimate)
    if not estimates:
        return {
            "core_ms": 0.0,
            "median_ms": 0.0,
            "mad_ms": 0.0,
            "observations": 0,
            "method": "no burst of the load phase kept the simulated engine busy",
        }
    return {
        **_median_of("core_ms", estimates),
        "method": "per request, what makes the load phase's burst, simulated with vLLM's "
        "scheduling on the fitted steps, as long as it was measured; median over bursts, "
        "at least 0",
    }


def arrival_line(arrival: Sequence[Observation]) -> tuple[float, float]:
    """(ms at 0 tokens, ms per prompt token) of the arrival cost: Theil-Sen over every
    observation (the median of the slopes between observations of different lengths, then the
    median intercept at that slope; no slope where one length was probed). Why a line over all
    of them, not each length's median: on a loaded machine one arrival reads ±3 ms (its window
    is three gaps of a noisy batch), and two rounds' median per length moved `a` by as much,
    where a line takes every observation for each length; and a longer prompt costs more to
    parse and tokenise (the reference server: 1-2 ms more at 1,024 tokens than at 256)."""
    n = np.array([o.n for o in arrival], dtype=float)
    ms = np.array([o.ms for o in arrival], dtype=float)
    i, j = np.triu_indices(len(n), 1)
    apart = n[i] != n[j]
    slope = float(np.median((ms[j] - ms[i])[apart] / (n[j] - n[i])[apart])) if apart.any() else 0.0
    return float(np.median(ms - slope * n)), slope


def arrival_cost(arrival: Sequence[Observation]) -> dict[str, Any]:
    """What a request's arrival adds to a busy engine's steps with no prefill in them (the
    arrival phase): `by_prompt`, the cost at each probed length on `arrival_line`, at least 0
    (what is taken out of the mixed steps of that length); over every observation, the median
    with its median absolute deviation (`cost_ms`, what the report shows beside the load
    phase's `front_end_core_ms`, which measures the same thing on a burst)."""
    icpt, slope = arrival_line(arrival)
    lengths = sorted({int(o.n) for o in arrival})
    return {
        **_median_of("cost_ms", [o.ms for o in arrival]),
        "by_prompt": {n: round(max(0.0, icpt + slope * n), 4) for n in lengths},
        "per_token_ms": float(f"{slope:.4g}"),
        "method": "per request sent while a full batch decodes (it waits: no slot), the decode "
        f"gaps of its window ({ARRIVAL_WINDOW} from the one it was sent in) less as many median "
        "gaps, median over streams; a Theil-Sen line in the prompt's length over every "
        "observation, at least 0 at each length, taken out of the mixed steps (fit.points' "
        "mixed ms are net of it)",
    }


def net_of_arrival(steps: Sequence[Observation], by_prompt: dict[int, float]) -> list[Observation]:
    """The step observations with each mixed step less what its prompt's arrival costs
    (`by_prompt`, interpolated in the prompt's length). Why: the long prompt of a mixed step
    arrives while the batch decodes, so the two gaps the mixed step is read from carry its
    front end too (the server parsing it, an engine's charge per arrival); fitted as they were,
    that cost landed in `a` (the reference server: 8.8-9.6 against 8 on a loaded machine, 8.9
    with a 6 ms charge on a quiet one), where every prefill pays it, busy engine or not."""
    lengths = sorted(by_prompt)
    costs = [by_prompt[n] for n in lengths]
    out = []
    for o in steps:
        if o.kind == "mixed":
            o = replace(o, ms=max(1e-3, o.ms - float(np.interp(o.n, lengths, costs))))
        out.append(o)
    return out


def fit(raw: Sequence[Observation], limits: Limits | None = None) -> Fit:
    """Both forms of the mixed step fitted (a GPU hides a prefill chunk in the decode step, a
    CPU adds it: the data say which), the form with the smaller residuals kept, each with a step
    floor where the prefill sweep identifies one (`fit.floor_test`). Then the
    front end's core time, from the load phase's observations (`front_end_core`; `limits`
    are the engine's, for simulating its bursts), and what an idle engine takes to start, from
    the idle phase's (`idle_wake`). Observations of the front-end phase's first form (kind
    `frontend`, in profiles written before the load phase) are not used."""
    steps = [o for o in raw if o.kind in ("prefill", "decode", "mixed")]
    arrival = [o for o in raw if o.kind == "arrival"]
    cost = arrival_cost(arrival) if arrival else None
    measured = steps
    if cost is not None:
        steps = net_of_arrival(steps, cost["by_prompt"])
    # Whether there is a floor is asked of the prefills (`floor_test`), the same question for
    # both forms; then the form is the smaller residuals'. Chosen on fits without a floor, a
    # server with a 30 ms floor read sum (RMS 0.0608 against max's 0.0627, and a = 0); a floor
    # kept per form wherever it fitted or predicted better, a CPU vLLM probe read max (0.0425
    # with a 6.7 ms floor against sum's 0.0508 without one; both with one, sum's 0.0391).
    test = floor_test(steps)
    fits = {form: fit_form(steps, form, floor=test["identified"]) for form in ("max", "sum")}
    for form, one in fits.items():
        if test["identified"] and one.floor_binds < 2:  # the fitted floor holds no plateau
            fits[form] = fit_form(steps, form)
    best = min(fits.values(), key=lambda f: f.rms_relative)
    best.rms_by_form = {form: round(f.rms_relative, 4) for form, f in fits.items()}
    best.floor_test = test
    if cost is not None:  # the data as measured (a merge takes the cost out again)
        best.arrival = cost
        best.raw = [row(o) for o in measured] + [row(o) for o in arrival]
    load = [o for o in raw if o.kind == "load"]
    if load and limits is not None:
        best.front_end = front_end_core(load, best, limits)
        best.raw += [row(o) for o in load]
    idle = [o for o in raw if o.kind == "idle"]
    if idle:
        best.idle = idle_wake(idle)
        best.raw += [row(o) for o in idle]
    return best
