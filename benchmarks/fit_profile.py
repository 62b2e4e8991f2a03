"""Fit the a10g-llama2-7b profile to the VTC artifact's measured runs, or check the shipped fit.

Why: a profile's coefficients are only as good as the measurements they reproduce. The VTC
paper's artifact publishes every request of its FCFS and VTC runs on Llama-2-7B / one A10G
(tests/data/vtc/, Apache-2.0, Ying1123/VTC-artifact @ 192c2e2). Replaying those exact arrivals
and lengths through the simulator, the profile should serve what the A10G served.

The measure (the artifact README's service definition): a request's cost is
`prompt_len + 2·output_len`, spread uniformly over [first token, done]; the served rate is the
cost inside the window [30 s, duration] (after the README's 30 s warm-up, up to the end of
arrivals) divided by its length, in cost units per second. The same function measures the
artifact and the simulation.

The fit: `scipy.optimize.least_squares` over the profile's existing coefficient form (prefill
b ms/token; decode step d + e·B + f·C ms), in log space, minimising the relative error of the
served rate on the four `overload` / `proportional` files plus a weak pull (0.05 per unit of
log change) toward the cited starting values, which the four rates alone do not pin down (all
four coefficients move every rate the same way). Each file is simulated under the policy it
was measured with (FCFS -> fifo, VTC -> vtc). The result is rounded to 4 significant digits and
re-evaluated; those numbers are what the YAML's `fit:` block states.

    python benchmarks/fit_profile.py            # fit from the cited values; print the block
    python benchmarks/fit_profile.py --check    # the shipped profile against its `fit:` block
"""

from __future__ import annotations

import argparse
import json
import lzma
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere

from reference_scheduler.core.costmodel import PROFILE_DIR, Profile, load_profile  # noqa: E402
from reference_scheduler.core.job import Job  # noqa: E402
from reference_scheduler.drivers.virtual import simulate  # noqa: E402
from reference_scheduler.scheduler.config import parse_scheduler_config  # noqa: E402

DATA = REPO / "tests" / "data" / "vtc"
FITTED = (
    "FCFS_all_results_overload",
    "VTC_all_results_overload",
    "FCFS_all_results_proportional",
    "VTC_all_results_proportional",
)
COEFFICIENTS = ("b", "d", "e", "f")
WARMUP_S = 30.0
PRIOR = 0.05  # weight of the pull toward the starting values, per unit of log change
# The coefficients before this fit (the VTC paper's per-operation figures, as first shipped).
START = {"b": 0.214, "d": 16.3, "e": 0.245, "f": 0.00202}


@dataclass(frozen=True)
class ArtifactRun:
    """One published run: its requests (aborted ones dropped) and how it was run."""

    name: str
    policy: str  # the reference policy that schedules as the artifact's scheduler did
    duration_s: float
    tenants: list[str]
    arrival_s: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    ttft_s: np.ndarray  # measured, from arrival
    latency_s: np.ndarray  # measured, from arrival

    @property
    def cost(self) -> np.ndarray:
        return self.prompt + 2 * self.output


def load_run(name: str, folder: Path = DATA) -> ArtifactRun:
    """`<SCHEDULER>_all_results_<workload>` from `folder` (.jsonl, or .jsonl.xz)."""
    plain = folder / f"{name}.jsonl"
    if plain.is_file():
        text = plain.read_text(encoding="utf-8")
    else:
        with lzma.open(f"{plain}.xz", "rt", encoding="utf-8") as packed:
            text = packed.read()
    doc = json.loads(text)
    rows = [r for r in doc["result"]["responses"] if r["first_token_latency"] >= 0]
    rows.sort(key=lambda r: r["req_time"])
    scheduler = name.split("_")[0]
    return ArtifactRun(
        name=name,
        policy={"FCFS": "fifo", "VTC": "vtc", "LCF": "lcf"}[scheduler],
        duration_s=float(doc["config"]["duration"]),
        tenants=[r["adapter_dir"] for r in rows],
        arrival_s=np.array([r["req_time"] for r in rows]),
        prompt=np.array([r["prompt_len"] for r in rows], dtype=np.int64),
        output=np.array([r["output_len"] for r in rows], dtype=np.int64),
        ttft_s=np.array([r["first_token_latency"] for r in rows]),
        latency_s=np.array([r["request_latency"] for r in rows]),
    )


def _present(name: str, folder: Path = DATA) -> bool:
    return (folder / f"{name}.jsonl").is_file() or (folder / f"{name}.jsonl.xz").is_file()


def served_rate(
    start_s: np.ndarray, end_s: np.ndarray, cost: np.ndarray, t0: float, t1: float
) -> float:
    """Cost units per second served inside [t0, t1], each request's cost spread uniformly over
    [start, end] (the artifact README's definition)."""
    inside = np.clip(np.minimum(end_s, t1) - np.maximum(start_s, t0), 0, None)
    length = np.maximum(end_s - start_s, 1e-9)
    return float((cost * inside / length).sum() / (t1 - t0))


def measured(run: ArtifactRun) -> tuple[float, float]:
    """(served cost units/s over the window, mean TTFT s) of the published run."""
    rate = served_rate(
        run.arrival_s + run.ttft_s,
        run.arrival_s + run.latency_s,
        run.cost,
        WARMUP_S,
        run.duration_s,
    )
    return rate, float(run.ttft_s.mean())


def simulated(run: ArtifactRun, profile: Profile | str = "a10g-llama2-7b") -> tuple[float, float]:
    """The same two numbers for the simulator replaying the run's arrivals and lengths."""
    cfg = parse_scheduler_config({"policy": run.policy, "profile": "a10g-llama2-7b"})
    prof = load_profile(profile) if isinstance(profile, str) else profile
    cfg = replace(cfg, profile=prof)
    jobs = [
        Job(i, tenant, "batch", int(p), int(o), round(float(t) * 1e9))
        for i, (tenant, p, o, t) in enumerate(
            zip(run.tenants, run.prompt, run.output, run.arrival_s, strict=True)
        )
    ]
    result = simulate(jobs, cfg)
    first = result.column("first_token_ns") / 1e9
    done = result.column("done_ns") / 1e9
    rate = served_rate(first, done, run.cost, WARMUP_S, run.duration_s)
    return rate, float((first - run.arrival_s).mean())


def with_coefficients(profile: Profile, values: dict[str, float]) -> Profile:
    return replace(profile, **values)


def fit(runs: list[ArtifactRun], base: Profile) -> dict[str, float]:
    from scipy.optimize import least_squares

    start = np.array([START[c] for c in COEFFICIENTS])
    targets = np.array([measured(r)[0] for r in runs])

    def residuals(x: np.ndarray) -> np.ndarray:
        values = dict(zip(COEFFICIENTS, (start * np.exp(x)).tolist(), strict=True))
        prof = with_coefficients(base, values)
        rates = np.array([simulated(r, prof)[0] for r in runs])
        return np.concatenate([(rates - targets) / targets, PRIOR * x])

    # Simulated rates are step functions of the coefficients at fine scales: a 5% finite
    # difference sees the slope, not the steps.
    sol = least_squares(residuals, np.zeros(len(COEFFICIENTS)), diff_step=0.05)
    return {c: float(f"{v:.4g}") for c, v in zip(COEFFICIENTS, start * np.exp(sol.x), strict=True)}


def fit_block(runs: list[ArtifactRun], prof: Profile) -> dict[str, Any]:
    """What the YAML states: per run, measured and simulated rate and TTFT, and the residual."""
    rows: dict[str, Any] = {}
    for run in runs:
        (m_rate, m_ttft), (s_rate, s_ttft) = measured(run), simulated(run, prof)
        rows[run.name] = {
            "measured_cost_per_s": round(m_rate, 1),
            "simulated_cost_per_s": round(s_rate, 1),
            "residual_pct": round(100 * (s_rate - m_rate) / m_rate, 2),
            "measured_ttft_mean_s": round(m_ttft, 1),
            "simulated_ttft_mean_s": round(s_ttft, 1),
        }
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="check the shipped fit: block")
    args = parser.parse_args()
    runs = [load_run(name) for name in FITTED]
    shipped = load_profile("a10g-llama2-7b")
    if args.check:
        stated = yaml.safe_load((PROFILE_DIR / "a10g-llama2-7b.yaml").read_text())["fit"]
        bad = []
        for part in ("runs", "held_out"):
            # Held-out files ship compressed beside the fitted ones where present.
            names = [n for n in stated.get(part, {}) if _present(n)]
            now = fit_block([load_run(n) for n in names], shipped)
            print(yaml.safe_dump({part: now}, sort_keys=False), end="")
            bad += [
                f"{name}: stated {stated[part][name]['residual_pct']}%, now {row['residual_pct']}%"
                for name, row in now.items()
                if abs(stated[part][name]["residual_pct"] - row["residual_pct"]) > 0.05
            ]
        print("fit block holds" if not bad else "fit block is stale: " + "; ".join(bad))
        return 1 if bad else 0
    before = with_coefficients(shipped, START)
    values = fit(runs, shipped)
    after = with_coefficients(shipped, values)
    print("# before (the cited values):")
    print(yaml.safe_dump({"runs": fit_block(runs, before)}, sort_keys=False), end="")
    print("# after: coefficients and the fit: block for the YAML")
    print(yaml.safe_dump(values, sort_keys=False), end="")
    print(yaml.safe_dump({"fit": {"runs": fit_block(runs, after)}}, sort_keys=False), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
