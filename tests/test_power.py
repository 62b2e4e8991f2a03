"""Power calculations (fairbench.decide.power): the formula against simulation, the least n,
and `ab --detect` end to end on a tiny noisy simulation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from fairbench.decide.power import (
    POWER,
    PowerError,
    normal_pairs,
    pairs_needed,
    parse_change,
    pilot_sd,
    plan,
    power,
    simulate_power,
)
from tests.cli import REPO, run_cli


@pytest.mark.parametrize(("n", "sd", "change"), [(3, 0.05, 0.1), (9, 0.05, 0.05), (35, 0.1, 0.05)])
def test_the_power_formula_agrees_with_simulation(n: int, sd: float, change: float) -> None:
    """Noncentral t against 20,000 seeded experiments of n pairs: within 1.5 points."""
    simulated = simulate_power(n, sd, change, reps=20_000, seed=n)
    assert abs(power(n, sd, change) - simulated) < 0.015, (power(n, sd, change), simulated)


@pytest.mark.parametrize("sd", [0.02, 0.05, 0.1, 0.2])
def test_pairs_needed_is_the_least_n_with_80_percent_power(sd: float) -> None:
    n = pairs_needed(sd, 0.05)
    assert n is not None and power(n, sd, 0.05) >= POWER
    assert n == 2 or power(n - 1, sd, 0.05) < POWER
    # the t test needs a little more than the normal approximation, never less
    assert normal_pairs(sd, 0.05) <= n <= normal_pairs(sd, 0.05) + 3
    # what the plan promises holds when the pairs are run: a true +5% is found ≥ 78% of times
    assert simulate_power(n, sd, 0.05, reps=8000, seed=int(sd * 100)) >= 0.78


def test_a_textbook_value_and_the_null() -> None:
    """SD 0.1 of ln(B/A), a 5% change: the normal formula gives ((1.96 + 0.84) · 0.1 /
    ln 1.05)² = 33 pairs, the t test 35; with no change the test rejects at its 5% level."""
    assert normal_pairs(0.1, 0.05) == 33 and pairs_needed(0.1, 0.05) == 35
    assert abs(simulate_power(10, 0.1, 0.0, reps=20_000, seed=3) - 0.05) < 0.01


def test_pilot_data_that_cannot_plan_say_why() -> None:
    with pytest.raises(PowerError, match="2 or more pilot pairs"):
        pilot_sd([200.0], [210.0])
    with pytest.raises(PowerError, match="positive value"):
        pilot_sd([200.0, 0.0], [210.0, 1.0])
    with pytest.raises(PowerError, match="not a percentage"):
        parse_change("five")
    assert parse_change("5%") == pytest.approx(0.05) and parse_change("-10") == pytest.approx(-0.1)
    found = plan("ttft_p99", 0.05, [240.0, 250.0, 245.0], [252.0, 262.0, 250.0], window_s=30.0)
    assert found.pairs_run == 3 and found.needed is not None and found.needed >= 2
    assert "ttft_p99" in found.sentence() and "pairs" in found.sentence()


def test_ab_detect_adds_pairs_until_the_plan_is_met_or_the_maximum(tmp_path: Path) -> None:
    data = yaml.safe_load((REPO / "scenarios" / "power-ttft.yaml").read_text())
    data["run"]["duration"] = "15s"
    scenario = tmp_path / "power.yaml"
    scenario.write_text(yaml.safe_dump(data))
    out = tmp_path / "ab"
    args = ["ab", str(scenario), "--a", "scheduler.seed=1", "--b", "scheduler.seed=2"]
    done = run_cli(
        *args,
        "--detect",
        "5%",
        "--iterations",
        "2",
        "--max-iterations",
        "3",
        "--out",
        str(out),
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((out / "comparison.json").read_text())
    p = report["power"]
    assert p["metric"] == "ttft_p99" and p["pairs_run"] in (2, 3), p
    assert p["pairs_run"] == 3 or p["reached"], p  # a pair was added unless the pilot sufficed
    assert "power" in report["stopped"] and "pairs" in report["stopped"]
    bad = run_cli(*args, "--detect", "five", "--out", str(tmp_path / "x"), timeout=120)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "not a percentage" in bad.stderr and "Traceback" not in bad.stderr
    both = run_cli(*args, "--detect", "5", "--precision", "5", timeout=120)
    assert both.returncode == 2 and "choose one" in both.stderr
