"""How long does `fairbench advise` take, and how much does its advice gain over the scenario's
own configuration? (issue 38 part B)

Two scenarios whose shipped configuration misses the interactive SLO:

- `scenarios/advise-three-tier.yaml` under its own `three-tier` preset (interactive, p95 of TTFT
  within 300 ms, attains about 10%);
- `scenarios/control-tiers.yaml` under FIFO (`--set scheduler.policy=fifo`), every class at
  95% attainment (`--attainment 0.95`; at its default p99 no configuration of the space meets
  it, and advise says so with exit 2).

Each runs `fairbench advise` as a user does (the default budget of 40 trials, five verification
seeds, one process), timed on the wall clock, and reads advice.json: the own configuration's and
the recommendation's interactive attainment on the verification seeds, and the paired gain with
its interval. Goal: on both, a recommendation that meets every SLO on the seeds the search did
not see, and a paired gain whose interval lies above zero. The time is printed, not judged (it
is the simulator's speed times the budget; `bench_sim.py` holds that target).

The verification's promise is measured too (`--seeds`, default 120): the advised and the
shipped configuration of the first scenario each run on that many seeds (3001 onwards, none the
search or the verification used); their mean attainment per class is the long-run truth, and
the Student t interval of 5 seeds (what advise prints) is drawn for 2,000 random 5-seed subsets.
Goal: coverage at least 90% for a nominal 95% wherever the seeds spread (a class that attains
100% on every seed has no interval to cover, and advise prints none).

    python benchmarks/bench_advise.py            # ~3 min on 2 cores
    python benchmarks/bench_advise.py --budget 24 --seeds 60
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import console, finish, show, verdict

REPO = Path(__file__).resolve().parents[1]
CASES: dict[str, list[str]] = {
    "advise-three-tier (own: three-tier)": ["scenarios/advise-three-tier.yaml"],
    "control-tiers (own: fifo, 95%)": [
        "scenarios/control-tiers.yaml",
        "--set",
        "scheduler.policy=fifo",
        "--attainment",
        "0.95",
    ],
}


def _ci(entry: dict[str, Any], signed: bool = False) -> str:
    sign = "+" if signed else ""
    text = f"{entry['mean']:{sign}.1%}"
    if entry.get("ci_low") is not None:
        text += f" [{entry['ci_low']:{sign}.1%}, {entry['ci_high']:{sign}.1%}]"
    return text


COVERAGE_K = 5  # advise's default --verify
COVERAGE_DRAWS = 2000
COVERAGE_GOAL = 0.90


def coverage(advice_dir: Path, seeds: int) -> None:
    """The Student t interval over COVERAGE_K seeds, against the mean over `seeds` new ones."""
    import numpy as np

    from fairbench.decide.advise.verify import seed_interval
    from fairbench.decide.points import LocalRunner, PointJob
    from fairbench.workload import read_yaml

    doc = json.loads((advice_dir / "advice.json").read_text(encoding="utf-8"))
    source = REPO / doc["scenario"]
    data = read_yaml(source.read_text(encoding="utf-8"))
    configs = [(v["label"], v["block"]) for v in doc["verification"]]
    rng = np.random.default_rng(7)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, block in configs:
            jobs = [
                PointJob(
                    f"{label} seed {seed}",
                    {**data, "scheduler": block},
                    str(source),
                    str(Path(tmp) / f"{label.replace(' ', '-')}-{seed}"),
                    seed,
                )
                for seed in range(3001, 3001 + seeds)
            ]
            results = LocalRunner().run(jobs, parallel=2)
            for target in doc["targets"]:
                cls = target["class"]
                got = np.array(
                    [
                        r.summary["metrics"]["class"][cls]["slo_attainment"]["value"]
                        for r in results
                        if not r.failed
                    ]
                )
                truth = float(got.mean())
                hits = spread = 0
                for _ in range(COVERAGE_DRAWS):
                    pick = rng.choice(got, COVERAGE_K, replace=False)
                    it = seed_interval(list(pick), 0.95, "t", (0.0, 1.0))
                    if it.declined:
                        continue
                    spread += 1
                    hits += it.low <= truth <= it.high
                rate = hits / spread if spread else float("nan")
                rows.append(
                    [
                        label,
                        cls,
                        str(len(got)),
                        f"{truth:.2%}",
                        f"{got.std(ddof=1):.2%}",
                        f"{spread / COVERAGE_DRAWS:.0%}",
                        "-" if not spread else f"{rate:.1%}",
                    ]
                )
                if spread >= COVERAGE_DRAWS // 10:
                    verdict(
                        rate >= COVERAGE_GOAL,
                        f"{label}, {cls}: 5-seed interval covers the {len(got)}-seed mean in "
                        f"{rate:.1%} of {spread} draws (goal >= {COVERAGE_GOAL:.0%}, nominal 95%)",
                    )
    show(
        f"the verification interval's coverage: Student t over {COVERAGE_K} seeds, 95%, "
        f"{COVERAGE_DRAWS} random subsets ({doc['scenario']})",
        ["configuration", "class", "seeds", "truth (mean)", "sd", "with an interval", "coverage"],
        rows,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=40, help="trials per search")
    parser.add_argument("--seeds", type=int, default=120, help="seeds for the coverage truth")
    args = parser.parse_args()
    rows = []
    keep = Path(tempfile.mkdtemp(prefix="bench-advise-"))
    for name, argv in CASES.items():
        out = keep / name.split()[0]
        cmd = [sys.executable, "-m", "fairbench.cli", "advise", *argv]
        cmd += ["--budget", str(args.budget), "--out", str(out)]
        started = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - started
        if proc.returncode not in (0, 2):
            console.print(proc.stderr[-2000:], markup=False)
            verdict(False, f"{name}: advise exited {proc.returncode}")
            continue
        doc = json.loads((out / "advice.json").read_text(encoding="utf-8"))
        own = doc["verification"][0] if doc["verification"] else None
        rec_label = (doc.get("recommendation") or {}).get("label")
        rec = next((v for v in doc["verification"] if v["label"] == rec_label), None)
        runs = len(doc["trials"]) + 1 + len(doc["verification"]) * len(doc["verify_seeds"])
        rows.append(
            [
                name,
                f"{wall:.1f}",
                str(runs),
                f"{wall / runs:.2f}",
                _ci(own["attainment"]["interactive"]) if own else "-",
                _ci(rec["attainment"]["interactive"]) if rec else "-",
                _ci(rec["gain"]["interactive"], signed=True) if rec and rec["gain"] else "-",
                "-" if rec is None else json.dumps(rec["block"].get("policy")),
            ]
        )
        gain = (rec or {}).get("gain", {}).get("interactive", {})
        verdict(
            rec is not None
            and rec["meets"]
            and rec["trial"] is not None
            and (gain.get("ci_low") or 0) > 0,
            f"{name}: advice meets every SLO on unseen seeds with a paired interactive gain "
            f"above zero ({doc.get('refused') or 'recommended ' + str(rec_label)})",
        )
    show(
        f"fairbench advise, budget {args.budget}, 5 verification seeds, one process "
        "(interactive SLO attainment on the verification seeds, 95% Student t)",
        [
            "scenario",
            "wall s",
            "sim runs",
            "s / run",
            "own",
            "advice",
            "paired gain",
            "advised policy",
        ],
        rows,
    )
    first = keep / next(iter(CASES)).split()[0]
    if args.seeds > COVERAGE_K and (first / "advice.json").is_file():
        coverage(first, args.seeds)
    shutil.rmtree(keep, ignore_errors=True)
    finish()


if __name__ == "__main__":
    main()
