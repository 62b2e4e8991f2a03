"""The shipped profiles reproduce what they cite (issue #16, item 5).

The a10g-llama2-7b profile is fitted to the VTC artifact's measured runs: replaying their
arrivals and lengths (tests/data/vtc/), the simulator must serve the A10G's cost units/s within
3%, and the residuals its YAML states must be the ones the simulator gives today (a changed
engine or coefficient that moves them fails here, not silently in a paper reproduction). Every
other shipped profile states what it was checked against, and those numbers must be true.
"""

from __future__ import annotations

import pytest
import yaml

from benchmarks.fit_profile import FITTED, fit_block, load_run, measured, simulated
from reference_scheduler.core.costmodel import PROFILE_DIR, load_profile, shipped_profiles


def stated_fit(name: str) -> dict:
    return yaml.safe_load((PROFILE_DIR / f"{name}.yaml").read_text(encoding="utf-8"))["fit"]


@pytest.mark.parametrize("run_name", FITTED)
def test_a10g_serves_the_artifacts_measured_rate_within_3_percent(run_name: str) -> None:
    run = load_run(run_name)
    rate, ttft = measured(run)
    sim_rate, sim_ttft = simulated(run, "a10g-llama2-7b")
    assert abs(sim_rate - rate) / rate < 0.03, (run_name, rate, sim_rate)
    # The queueing that follows from the rate: mean TTFT within 15% (it was a third low).
    assert abs(sim_ttft - ttft) / ttft < 0.15, (run_name, ttft, sim_ttft)


def test_the_residuals_the_a10g_yaml_states_are_the_simulators() -> None:
    stated = stated_fit("a10g-llama2-7b")["runs"]
    now = fit_block([load_run(name) for name in FITTED], load_profile("a10g-llama2-7b"))
    assert set(stated) == set(FITTED)
    for name, row in now.items():
        assert stated[name]["measured_cost_per_s"] == pytest.approx(
            row["measured_cost_per_s"], abs=0.05
        )
        assert stated[name]["residual_pct"] == pytest.approx(row["residual_pct"], abs=0.05)


def test_the_unfitted_starting_values_served_too_much() -> None:
    """The reason for the fit, kept true: the paper's per-operation figures, as first shipped,
    serve ~6–10% more than the A10G did."""
    from dataclasses import replace

    from benchmarks.fit_profile import START

    before = replace(load_profile("a10g-llama2-7b"), **START)
    run = load_run("FCFS_all_results_proportional")
    assert simulated(run, before)[0] > 1.05 * measured(run)[0]


def test_the_loader_ignores_the_fit_block_and_every_profile_has_one() -> None:
    for name in shipped_profiles():
        profile = load_profile(name)  # a `fit:` key would be refused as a coefficient
        assert profile.name == name
        assert "method" in stated_fit(name)


@pytest.mark.parametrize("name", ["h100-llama3-8b", "h100-llama3-70b-tp4"])
def test_the_h100_profiles_checks_are_true(name: str) -> None:
    profile = load_profile(name)
    checks = stated_fit(name)["checks"]
    assert checks
    for check in checks:
        ms = profile.step_ms(0, check["batch"], check["batch"] * check["context"])
        assert check["profile_ms"] == pytest.approx(ms, abs=5e-4)
        residual = 100 * (ms - check["cited_ms"]) / check["cited_ms"]
        assert check["residual_pct"] == pytest.approx(residual, abs=0.01)
        assert abs(residual) <= 6  # close to the figure it cites
