"""The engine tests' retry of a generator-invalidated live run (tests/engines/valid_run.py):
once for the generator's own reasons, never for the engine's, and a second INVALID stands."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pandas as pd

from fairbench.analysis.health import generator_health
from tests.conftest import make_scenario
from tests.engines.valid_run import GENERATOR_REASON, generator_invalid, valid_run

LATE = "generator read responses too late for their stamps: receive error p99 795.46 ms > 1 ms"
EMPTY = "no request succeeded (218 error): the run measured failures"


class FakeCli:
    """`fairbench run` that writes, try by try, the summaries it is given (None: valid)."""

    def __init__(self, outcomes: list[list[str] | None]) -> None:
        self.outcomes = outcomes
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        self.calls.append(args)
        out = Path(args[args.index("--out") + 1])
        out.mkdir(parents=True)
        reasons = self.outcomes[len(self.calls) - 1] or []
        summary = {"valid": not reasons, "invalid_reasons": reasons}
        (out / "summary.json").write_text(json.dumps(summary))
        return subprocess.CompletedProcess(args, 1 if reasons else 0, "VALID", "")


def test_a_run_the_generator_invalidated_is_run_again_once(tmp_path: Path) -> None:
    cli, log = FakeCli([[LATE], None]), []
    proc = valid_run(cli, tmp_path / "fcfs-1", "scenario.yaml", "--quiet", log=log)
    assert proc.returncode == 0 and len(cli.calls) == 2
    assert cli.calls[0] == ("run", "scenario.yaml", "--quiet", "--out", str(tmp_path / "fcfs-1"))
    kept = json.loads((tmp_path / "fcfs-1-invalid-1" / "summary.json").read_text())
    assert kept["invalid_reasons"] == [LATE]  # the refused attempt is kept beside it
    assert json.loads((tmp_path / "fcfs-1" / "summary.json").read_text())["valid"]
    assert len(log) == 1 and "fcfs-1: INVALID by the generator" in log[0]


def test_a_second_invalid_run_stands(tmp_path: Path) -> None:
    cli = FakeCli([[LATE], [LATE], None])
    proc = valid_run(cli, tmp_path / "run", "scenario.yaml")
    assert proc.returncode == 1 and len(cli.calls) == 2


def test_reasons_that_are_not_the_generators_are_never_retried(tmp_path: Path) -> None:
    for name, reasons in (("empty", [EMPTY]), ("mixed", [LATE, EMPTY])):
        cli = FakeCli([reasons, None])
        proc = valid_run(cli, tmp_path / name, "scenario.yaml")
        assert proc.returncode == 1 and len(cli.calls) == 1, name
        assert generator_invalid(tmp_path / name) == []


def test_every_reason_the_health_module_gives_the_generator_is_recognised() -> None:
    """The retry knows a reason by its first word: the real verdict's generator reasons (late
    sends, untrustworthy stamps) must start with it, and its others must not."""
    frame = pd.DataFrame(
        {
            "tenant": ["a"] * 10,
            "t_intended_ns": [i * 100_000_000 for i in range(10)],
            "t_sent_ns": [i * 100_000_000 + 8_000_000 for i in range(10)],  # 8 ms late
            "status": ["ok"] * 10,
            "rx_delay_ns": [500_000] * 10,
            "rx_error_ns": [0] * 8 + [795_000_000] * 2,
        }
    )
    reasons = generator_health(frame, make_scenario(rate=10, duration="1s"))["invalid_reasons"]
    assert len(reasons) == 2 and all(r.startswith(GENERATOR_REASON) for r in reasons), reasons
    failed = generator_health(frame.assign(status="error"), make_scenario(rate=10, duration="1s"))
    others = [r for r in failed["invalid_reasons"] if not r.startswith(GENERATOR_REASON)]
    assert others and others[0].startswith("no request succeeded")
