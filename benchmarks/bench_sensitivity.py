"""How much does a small error in the engine's speed move each figure a fidelity check compares?

Why: a simulator's error on a figure is its error in the engine's speed times how much that
figure amplifies it, and the amplification is the operating point's, not the simulator's.
Near the knee of a steady load a queue's wait grows as 1/(1 − ρ): there a profile a few
percent slow makes every TTFT far too high, and no profile is that exact (the CPU vLLM's own
speed drifts by more than that between two probes). Bursts that drain before the next one
make a queue whose waits grow in proportion to the steps' cost. This measures both on one
profile: each operating point simulated with vLLM's scheduling, FCFS and priority, at the
profile's step costs and at `--scale` times them, and prints each figure's change — the error
a fidelity check at that point would report for a profile off by that much. The priority
policy's cut of chat's TTFT p99 shows whether the point is still a scheduling experiment.

The scenario is the fidelity test's (`scenarios/vllm-priority.yaml` with its chat shape, four
sequences per step, the flood's rate set from the profile as tests/engines/fidelity_protocol.py
sets it: a steady Poisson load of `--load`, or bursts of 1 s of the engine's time every 4 s).
Simulation only, about 15 s:

    python benchmarks/bench_sensitivity.py
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere

from benchmarks._common import console, show  # noqa: E402
from reference_scheduler.core.costmodel import load_profile  # noqa: E402
from tests.engines.fidelity_protocol import (  # noqa: E402
    BURST_OFF_S,
    BURST_ON_S,
    BURST_WORK_S,
    CHAT_SHAPE,
    POLICIES,
    SCENARIO,
    sim_scenario,
)
from tests.engines.load import burst_point, operating_point  # noqa: E402

FIGURES = [(t, f, q) for t in ("chat", "flood") for f, q in (("e2e", "p50"), ("ttft", "p50"),
                                                              ("ttft", "p99"))]  # fmt: skip


def scaled(profile: str, scale: float, work: Path) -> Path:
    """The profile with every step cost (a–f) times `scale`, as a file."""
    doc = {k: v for k, v in yaml.safe_load(Path(profile).read_text()).items() if k != "fit"}
    for key in "abcdef":
        doc[key] = float(doc.get(key, 0.0)) * scale
    path = work / f"profile-{scale:g}.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def figures(policy: str, profile: Path, point: str, work: Path, name: str) -> dict[str, float]:
    """Each figure of one simulated run (ms)."""
    scenario = sim_scenario(work, policy, profile, name)
    out = work / name
    proc = subprocess.run(
        [sys.executable, "-m", "fairbench.cli", "run", str(scenario), "--out", str(out),
         "--quiet", f"--set={point}", *CHAT_SHAPE],
        capture_output=True, text=True, cwd=REPO, timeout=600,
    )  # fmt: skip
    if proc.returncode not in (0, 1):
        sys.exit(f"bench_sensitivity: fairbench run exited {proc.returncode}: {proc.stderr}")
    tenants = json.loads((out / "summary.json").read_text())["tenants"]
    return {f"{t} {f} {q}": float(tenants[t]["latency_ms"][f][q]) for t, f, q in FIGURES}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--profile", default=str(REPO / "tests" / "engines" / "cpu-vllm-tiny.yaml"),
        help="a profile file (default: one `fairbench profile` fitted of the CPU vLLM's tiny "
        "model, 2026-12-02)",
    )  # fmt: skip
    parser.add_argument("--scale", type=float, default=1.05, help="the step costs' error")
    parser.add_argument("--load", type=float, default=0.8, help="the steady point's load")
    args = parser.parse_args()
    if not Path(args.profile).is_file():
        sys.exit(f"bench_sensitivity: --profile {args.profile}: no such file")
    load_profile(args.profile)  # a bad profile is one line, before anything runs
    work = Path(tempfile.mkdtemp(prefix="bench-sensitivity-"))
    base = Path(args.profile)
    points = {
        f"steady, load {args.load:g}": operating_point(base, SCENARIO, "flood", args.load),
        f"bursts, {BURST_WORK_S:g} s of work every {BURST_ON_S + BURST_OFF_S:g} s": burst_point(
            base, SCENARIO, "flood", BURST_WORK_S, BURST_ON_S, BURST_OFF_S
        ),
    }
    slower = scaled(args.profile, args.scale, work)
    rows = []
    for i, (label, point) in enumerate(points.items()):
        runs = {}
        for policy in POLICIES:
            for tag, profile in (("base", base), ("scaled", slower)):
                name = f"{i}-{policy}-{tag}"
                runs[policy, tag] = figures(policy, profile, point, work, name)
        cut = runs["priority", "base"]["chat ttft p99"] / runs["fcfs", "base"]["chat ttft p99"]
        for policy in POLICIES:
            a, b = runs[policy, "base"], runs[policy, "scaled"]
            for key in a:
                change = 100 * (b[key] / a[key] - 1)
                rows.append([label, policy, key, f"{a[key]:,.1f}", f"{change:+.0f}%",
                             f"{change / (100 * (args.scale - 1)):.1f}×"])  # fmt: skip
        console.print(f"{label}: {point}; priority cuts chat's TTFT p99 by {1 - cut:.0%}")
    show(
        f"each figure's change when every step costs {args.scale:g}× ({Path(args.profile).name})",
        ["operating point", "policy", "figure", "at the profile (ms)", "change", "amplification"],
        rows,
    )
    console.print(f"runs in {work}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
