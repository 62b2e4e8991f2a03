"""Do fairbench's 95% intervals cover the truth 95% of the time? The full coverage table.

Why: an interval is a promise, and only a coverage table proves it. This measures every interval
kind the summary prints against a known truth, at the sizes users have:

- percentiles (p50, p90, p99) of i.i.d. lognormal and Pareto(2.5) samples, n = 50 … 100,000;
- the same of serially correlated series (exp of a Gaussian AR(1), φ = 0.5 and 0.9), as a queue
  makes them, n = 1,000 and 10,000;
- the drift interval of stationary series (it should contain 0);
- SLO attainment shares (0.9, 0.99, 0.995) of the same i.i.d. and AR(1) series, n = 50 … 5,000;
- run to run on the simulator: 30 seeds of `scenarios/calibration/queue.yaml` (two tenants on
  one simulated H100, constant Poisson load) at two loads; each run's TTFT p50/p90/p99 interval
  and drift interval against the long-run percentiles (pooled over the 30 runs) and 0;
- the fairness figures: 30 seeds of `scenarios/calibration/fairness.yaml` (two tenants asking
  2:1 near capacity) under FIFO and VTC; each run's jain_backlogged interval against the mean
  of every contended window of every run; and on every simulated arm (both queues), the
  intervals of `isolation` (overall and tenant a: against the pooled mix p99 ÷ the pooled p99
  of the tenant run alone, 30 more seeds per tenant), `worst_slowdown_ratio` and
  `jain_slowdown` (against the figure of the per-tenant mean slowdowns pooled over the runs),
  and `service_difference` (declined by design: a run's maximum has no long-run value).

The goal is every coverage in [93%, 97%] where an interval is given, and the table also says how
often an interval is one-sided (n cannot bound the tail) or declined (the run is too short for
its own correlation). A coverage measured on a few hundred replications is itself uncertain, so
each cell is judged by its own 95% Clopper–Pearson interval (`judge`): `in goal` when that
interval meets [93%, 97%], `above` or `below` when it lies wholly outside, `not judged` under 20
given. `below` breaks the promise (the intervals are narrower than they claim): it is printed as
FAIL and the script exits 1. `above` is conservative (wider than needed) and is listed, not
failed.

    python benchmarks/bench_calibration.py            # the full table, ~10 min on 2 cores
    python benchmarks/bench_calibration.py --quick    # fewer replications, ~2 min
    python benchmarks/bench_calibration.py --fairness-only --seeds 40   # the fairness queue alone
    python benchmarks/bench_calibration.py --sim-only --seeds 60   # simulator rows, ~7 min
    python benchmarks/bench_calibration.py --no-sim --reps 300   # the synthetic rows, ~1 min
    python benchmarks/bench_calibration.py --only lognormal:50:p99,drift-ar1-0.5:20000 --reps 1000
    python benchmarks/bench_calibration.py --markdown fairbench/analysis/calibration_table.md
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import console, finish, show, verdict

from fairbench.analysis import calibration as cal

MIN_JUDGED = 20  # fewer given intervals cannot tell 95% from 80% (Clopper–Pearson ±10 points)
REPO = Path(__file__).resolve().parents[1]
SCENARIO = REPO / "scenarios" / "calibration" / "queue.yaml"
FAIRNESS = REPO / "scenarios" / "calibration" / "fairness.yaml"
GOAL = (0.93, 0.97)


def synthetic(reps: int, quick: bool, only: set[str] | None = None) -> list[cal.Coverage]:
    """The synthetic cells; `only` (names as `cell_name` spells them) runs those alone, each at
    `reps` replications (no per-size reduction: a subset is rerun to settle its coverage)."""
    sizes = [50, 100, 300, 1000, 10_000] + ([] if quick else [100_000])
    cells: list[tuple[str, str, int, float, int, int]] = []  # (what, kind, n, q, reps, seed)
    for kind in ("lognormal", "pareto"):
        for n in sizes:
            r = reps if n <= 10_000 else max(reps // 10, 50)
            cells += [("percentile", kind, n, q, r, n) for q in (0.5, 0.9, 0.99)]
    for kind in ("ar1-0.5", "ar1-0.9"):
        for n in (1000, 10_000):
            r = reps if n <= 1000 else reps // 2
            cells += [("percentile", kind, n, q, r, n + 1) for q in (0.5, 0.9, 0.99)]
    for kind in ("lognormal", "ar1-0.5"):
        for n in (5000, 20_000):
            cells.append(("drift", kind, n, 0.99, reps // 2, n + 2))
    for kind in ("lognormal", "ar1-0.5", "ar1-0.9"):
        for n in (50, 1000) if quick else (50, 1000, 5000):
            cells += [("share", kind, n, p, reps, n + 3) for p in (0.9, 0.99, 0.995)]
    if only is not None:
        unknown = only - {cell_name(c[0], c[1], c[2], c[3]) for c in cells}
        if unknown:
            sys.exit(f"--only: no synthetic cell {sorted(unknown)[0]!r} (e.g. lognormal:50:p99)")
        cells = [c for c in cells if cell_name(c[0], c[1], c[2], c[3]) in only]
        cells = [(what, kind, n, q, reps, seed) for what, kind, n, q, _, seed in cells]
    out = []
    for what, kind, n, q, r, seed in cells:
        if what == "drift":
            out.append(_said([cal.drift_coverage(kind, n, r, seed=seed)])[0])
        elif what == "share":
            out.append(_said([cal.share_coverage(kind, n, q, r, seed=seed)])[0])
        else:
            out.append(_said([cal.percentile_coverage(kind, n, q, r, seed=seed)])[0])
    return out


def cell_name(what: str, kind: str, n: int, q: float) -> str:
    """A synthetic cell's name for --only: `lognormal:50:p99`, `drift-ar1-0.5:20000`,
    `share-ar1-0.9:1000:p99.5` (an SLO attainment whose long-run share is 0.995)."""
    if what == "drift":
        return f"drift-{kind}:{n}"
    return f"{'share-' if what == 'share' else ''}{kind}:{n}:p{q * 100:g}"


FIGURES = ("isolation", "worst_slowdown_ratio", "jain_slowdown", "service_difference")


@dataclass
class Arm:
    """What `seeds` runs of one scenario gave: each run's interval of every figure, and what
    the long-run values are pooled from."""

    entries: dict[str, list[dict]] = field(default_factory=dict)
    ttft: dict[str, list] = field(default_factory=dict)  # per tenant (and "overall")
    slow_sum: dict[str, float] = field(default_factory=dict)
    slow_n: dict[str, float] = field(default_factory=dict)
    solo: dict[str, list] = field(default_factory=dict)
    windows: list[float] = field(default_factory=list)

    def add(self, name: str, entry: dict) -> None:
        self.entries.setdefault(name, []).append(entry)

    def interval(self, name: str) -> tuple[list[float], list[float]]:
        lows = [math.nan if e.get("ci_low") is None else e["ci_low"] for e in self.entries[name]]
        return lows, [_high(e) for e in self.entries[name]]


def _said(rows: list[cal.Coverage]) -> list[cal.Coverage]:
    """Each arm's rows as soon as they are known (a long table is not lost to a late error)."""
    for r in rows:
        console.print(f"  {r.case}: {r.row()}")
    return rows


def _run(data: dict, out_dir: Path, arm: Arm, solo: bool) -> None:
    """One run: its summary's intervals, and its records' share of the pooled truths (TTFT per
    tenant, slowdown sums per tenant); with `solo`, each tenant alone for isolation's truth."""
    from fairbench.analysis import censored
    from fairbench.analysis.blocks import unloaded_ns
    from fairbench.pipeline import run_scenario
    from fairbench.run.records import read_records
    from fairbench.run.rundir import RunOptions
    from fairbench.workload import parse_scenario

    scn = parse_scenario(data)
    outcome = run_scenario(scn, RunOptions(out=out_dir, progress=False))
    metrics = outcome.summary["metrics"]
    for q in ("p50", "p90", "p99"):
        arm.add(f"ttft_{q}", metrics["overall"][f"ttft_{q}"])
    arm.add("ttft_p99_drift", metrics["overall"]["ttft_p99_drift"])
    arm.add("jain_backlogged", metrics["overall"]["jain_backlogged"])
    for name in FIGURES:
        arm.add(name, metrics["overall"][name])
    for tenant, entries in metrics["tenant"].items():
        arm.add(f"isolation.tenant.{tenant}", entries["isolation"])
    values = outcome.summary["fairness"]["jain_windows"]["values"]
    arm.windows += [v for v in values if v is not None]
    df = read_records(out_dir / "records.parquet")
    lo_ns, hi_ns = _window_ns(scn)
    df = df[(df["t_intended_ns"] >= lo_ns) & (df["t_intended_ns"] <= hi_ns)].reset_index(drop=True)
    ttft = censored.ttft_rows(df, scn.run.timeout)
    e2e = censored.e2e_rows(df, scn.run.timeout)
    slow = e2e.time / np.maximum(unloaded_ns(df, scn)[0], 1.0)
    tenants = df["tenant"].to_numpy()
    arm.ttft.setdefault("overall", []).append(ttft.select())
    for tenant in sorted(set(tenants)):
        rows = tenants == tenant
        arm.ttft.setdefault(tenant, []).append(ttft.select(rows))
        sel = rows & e2e.eligible
        arm.slow_sum[tenant] = arm.slow_sum.get(tenant, 0.0) + float(slow[sel].sum())
        arm.slow_n[tenant] = arm.slow_n.get(tenant, 0.0) + float(sel.sum())
    if not solo:
        return
    for tenant in data["tenants"]:
        alone = json.loads(json.dumps(data))
        alone["tenants"] = [tenant]
        alone["analysis"] = {"isolation": "off"}
        alone_scn = parse_scenario(alone)
        alone_dir = out_dir.with_name(out_dir.name + "-" + tenant["id"])
        run_scenario(alone_scn, RunOptions(out=alone_dir, progress=False))
        adf = read_records(alone_dir / "records.parquet")
        adf = adf[(adf["t_intended_ns"] >= lo_ns) & (adf["t_intended_ns"] <= hi_ns)]
        arm.solo.setdefault(tenant["id"], []).append(
            censored.ttft_rows(adf, alone_scn.run.timeout).select()
        )


def _pooled_p99(parts: list, q: float = 0.99) -> float:
    from fairbench.analysis import censored

    everything = censored.Observations(
        np.concatenate([o.time for o in parts]), np.concatenate([o.observed for o in parts])
    )
    return censored.quantile(everything, q)[0]


def _figure_rows(label: str, arm: Arm) -> list[cal.Coverage]:
    """Coverage of the fairness figures' intervals against their pooled long-run values."""
    from fairbench.analysis.metrics import jain

    out = []
    tenants = sorted(arm.slow_n)
    means = np.array([arm.slow_sum[t] / arm.slow_n[t] for t in tenants])
    worst, jain_true = float(means.max() / means.min()), float(jain(means))
    console.print(
        f"{label}: long-run mean slowdown per tenant "
        + ", ".join(f"{t} {m:.3f}" for t, m in zip(tenants, means, strict=True))
        + f", "
        f"worst ratio {worst:.4f}, Jain {jain_true:.6f} (pooled over the runs)"
    )
    out.append(
        cal.run_coverage(
            f"{label} worst_slowdown_ratio", worst, *arm.interval("worst_slowdown_ratio"), 0.0
        )
    )
    out.append(
        cal.run_coverage(f"{label} jain_slowdown", jain_true, *arm.interval("jain_slowdown"), 0.0)
    )
    if arm.solo:
        ratios = {t: _pooled_p99(arm.ttft[t]) / _pooled_p99(arm.solo[t]) for t in arm.solo}
        console.print(
            f"{label}: long-run isolation (mix p99 ÷ solo p99, pooled) "
            + ", ".join(f"{t} {r:.3f}" for t, r in ratios.items())
        )
        first = sorted(ratios)[0]
        out.append(
            cal.run_coverage(
                f"{label} isolation.tenant.{first}",
                ratios[first],
                *arm.interval(f"isolation.tenant.{first}"),
            )
        )
        out.append(
            cal.run_coverage(f"{label} isolation", max(ratios.values()), *arm.interval("isolation"))
        )
    out.append(
        cal.run_coverage(
            f"{label} service_difference", math.nan, *arm.interval("service_difference"), 0.0
        )
    )
    return out


def simulated(seeds: int, rates: list[float], duration_s: int) -> list[cal.Coverage]:
    """Run-to-run coverage on the simulator (in this process, virtual time): the TTFT p99 and
    drift intervals, and the fairness figures' (isolation against each tenant's pooled mix p99 ÷
    its pooled p99 alone, the slowdown figures against the pooled per-tenant means)."""
    from rich.progress import Progress

    from fairbench.workload import read_yaml

    base = read_yaml(SCENARIO.read_text())
    out = []
    with Progress(console=console, transient=True) as bar, tempfile.TemporaryDirectory() as tmp:
        for rate in rates:
            task = bar.add_task(f"simulator, {rate:g}/s per tenant", total=seeds)
            arm = Arm()
            for seed in range(seeds):
                data = json.loads(json.dumps(base))
                for tenant in data["tenants"]:
                    tenant["arrival"]["rate"] = f"{rate}/s"
                data["run"]["duration"] = f"{duration_s}s"
                data["run"]["seed"] = 1000 + seed
                _run(data, Path(tmp) / f"r{rate}-{seed}", arm, solo=True)
                bar.advance(task)
            true_ms = _pooled_p99(arm.ttft["overall"]) / 1e6
            p99 = [e["value"] for e in arm.entries["ttft_p99"]]
            sd = float(np.std(p99, ddof=1))
            console.print(
                f"{rate:g}/s per tenant: long-run TTFT p99 {true_ms:.1f} ms (pooled over "
                f"{seeds} runs), run p99 mean {np.mean(p99):.1f} ms, SD {sd:.1f} ms"
            )
            for q in (0.5, 0.9):
                truth = _pooled_p99(arm.ttft["overall"], q) / 1e6
                name = f"ttft_p{q * 100:g}"
                out.append(
                    cal.run_coverage(f"sim p{q * 100:g} {rate:g}/s", truth, *arm.interval(name), q)
                )
            out.append(cal.run_coverage(f"sim p99 {rate:g}/s", true_ms, *arm.interval("ttft_p99")))
            out.append(
                cal.run_coverage(f"sim drift {rate:g}/s", 0.0, *arm.interval("ttft_p99_drift"))
            )
            out += _figure_rows(f"sim {rate:g}/s", arm)
            _said(out[-8:])
    return out


def fairness(seeds: int, policies: list[str], duration_s: int) -> list[cal.Coverage]:
    """Run-to-run coverage of jain_backlogged's interval: `seeds` runs of the fairness queue
    per policy, each run's interval against the mean of every contended window of every run;
    and of the fairness figures' intervals, as in `simulated`."""
    from rich.progress import Progress

    from fairbench.workload import read_yaml

    base = read_yaml(FAIRNESS.read_text())
    out = []
    with Progress(console=console, transient=True) as bar, tempfile.TemporaryDirectory() as tmp:
        for policy in policies:
            task = bar.add_task(f"fairness queue, {policy}", total=seeds)
            arm = Arm()
            for seed in range(seeds):
                data = json.loads(json.dumps(base))
                data["scheduler"]["policy"] = policy
                data["run"]["duration"] = f"{duration_s}s"
                data["run"]["seed"] = 2000 + seed
                _run(data, Path(tmp) / f"{policy}-{seed}", arm, solo=True)
                bar.advance(task)
            truth = float(np.mean(arm.windows)) if arm.windows else math.nan
            console.print(
                f"{policy}: long-run Jain among the backlogged {truth:.4f} (mean of "
                f"{len(arm.windows)} contended windows over {seeds} runs)"
            )
            out.append(
                cal.run_coverage(
                    f"sim jain_backlogged {policy}", truth, *arm.interval("jain_backlogged"), 0.0
                )
            )
            out += _figure_rows(f"sim {policy}", arm)
            _said(out[-5:])
    return out


def coverage_interval(covered: int, given: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Clopper–Pearson (exact binomial) interval of a coverage measured as covered / given.
    Why: a coverage read off 300 replications is ±2.5 points at 95%, so a cell at 97.4% of 300
    can be an honest 95% interval and one at 97.4% of 1,000 cannot; the verdict reads this,
    not the point (NaN where nothing was given)."""
    if given <= 0:
        return math.nan, math.nan
    from scipy import stats as sps

    ci = sps.binomtest(covered, given).proportion_ci(confidence, method="exact")
    return float(ci.low), float(ci.high)


def judge(covered: int, given: int, goal: tuple[float, float] = GOAL) -> str:
    """A cell's verdict: `in goal` when its coverage's own 95% interval meets `goal`, `above`
    (conservative: wider than needed) or `below` (the promise broken) when it lies wholly
    outside, `not judged` under MIN_JUDGED given intervals."""
    if given < MIN_JUDGED:
        return "not judged"
    low, high = coverage_interval(covered, given)
    if high < goal[0]:
        return "below"
    if low > goal[1]:
        return "above"
    return "in goal"


def _figure(q: float) -> str:
    return "figure" if q == 0 else f"p{q * 100:g}"


def _high(entry: dict) -> float:
    if entry.get("ci_low") is None and entry.get("ci_high") is None:
        return math.nan  # declined (or no value, so no interval)
    return math.inf if entry.get("ci_high") is None else entry["ci_high"]


def _window_ns(scn) -> tuple[float, float]:
    """The measurement window (intended time, ns): [warmup, duration − cooldown]."""
    return scn.run.warmup * 1e9, (scn.run.duration - scn.run.cooldown) * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer replications (~2 min)")
    parser.add_argument("--reps", type=int, default=None, help="replications per synthetic cell")
    parser.add_argument("--seeds", type=int, default=30, help="simulator runs per load (≥ 30)")
    parser.add_argument("--no-sim", action="store_true", help="synthetic cases only")
    parser.add_argument("--sim-only", action="store_true", help="simulator runs only (~6 min)")
    parser.add_argument(
        "--only",
        default=None,
        help="only these synthetic cells, comma-separated, each at --reps replications "
        "(e.g. lognormal:50:p99,ar1-0.5:1000:p90,drift-ar1-0.5:20000); no simulator runs",
    )
    parser.add_argument(
        "--fairness-only", action="store_true", help="only the fairness figure's runs (~5 min)"
    )
    parser.add_argument(
        "--markdown",
        type=Path,
        default=None,
        help="also write the table as Markdown; rows already in that file (same columns) are "
        "replaced where measured now and kept otherwise (docs/metrics.md quotes "
        "fairbench/analysis/calibration_table.md; then `fairbench metrics --markdown`)",
    )
    args = parser.parse_args()
    reps = args.reps or (300 if args.quick else 1000)
    only = None if args.only is None else {c.strip() for c in args.only.split(",") if c.strip()}
    if args.fairness_only:
        rows = fairness(args.seeds, ["fifo", "vtc"], 300)
    else:
        rows = [] if args.sim_only else synthetic(reps, args.quick, only)
    if not args.no_sim and not args.fairness_only and only is None:
        rows += simulated(args.seeds, [7.0, 9.0], 120 if args.quick else 300)
        rows += fairness(args.seeds, ["fifo", "vtc"], 300)
    table = [_cells(r) for r in rows]
    show(
        "coverage of 95% intervals (given = two-sided + one-sided; verdict on the coverage's own "
        "95% Clopper–Pearson interval against [93%, 97%])",
        COLUMNS,
        table,
    )
    if args.markdown is not None:
        _write_markdown(args.markdown, table)
    above = []
    for r in rows:
        said = judge(r.covered, r.given)
        text = f"{r.case} n={r.n} {_figure(r.q)}: {r.rate:.1%} of {r.given}"
        if said == "above":
            above.append(text)
        elif said != "not judged":
            verdict(said == "in goal", f"{text} ({said})")
    for text in above:
        console.print(f"[yellow]ABOVE[/] (conservative: wider than needed): {text}")
    finish()


COLUMNS = [
    "case",
    "n",
    "quantile",
    "reps",
    "given",
    "coverage",
    "95% CI",
    "verdict",
    "two-sided",
    "one-sided",
    "declined",
]


def _cells(r: cal.Coverage) -> list[str]:
    low, high = coverage_interval(r.covered, r.given)
    return [
        r.case,
        f"{r.n:,}" if r.n else "-",
        _figure(r.q),
        str(r.reps),
        str(r.given),
        "-" if math.isnan(r.rate) else f"{r.rate:.1%}",
        "-" if math.isnan(low) else f"{low:.1%}–{high:.1%}",
        judge(r.covered, r.given),
        f"{r.two_sided / r.reps:.0%}",
        f"{r.one_sided / r.reps:.0%}",
        f"{r.declined / r.reps:.0%}",
    ]


def _write_markdown(path: Path, table: list[list[str]]) -> None:
    """Write the table as Markdown; where `path` already holds a table of these columns, the
    rows measured now replace theirs (case, n, quantile) in place and the others stay, so one
    table is built from several runs (`--only … --reps 1000` on top of `--reps 300`)."""
    head = "| " + " | ".join(COLUMNS) + " |"
    rows = {tuple(r[:3]): r for r in table}
    kept: list[list[str]] = []
    old = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    if old and old[0] == head:
        for line in old[2:]:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            kept.append(rows.pop(tuple(cells[:3]), cells))
    kept += rows.values()
    lines = [head, "|" + "---|" * len(COLUMNS), *("| " + " | ".join(r) + " |" for r in kept)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
