"""The CI gate: rule parsing, golden outputs, and this project's own dogfood gate."""

from __future__ import annotations

import copy
import math
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from fairbench.decide.gate import (
    GateError,
    as_junit,
    as_markdown,
    as_text,
    evaluate,
    exit_code,
    parse_rules,
)
from tests.cli import REPO, run_cli

GOLDEN = Path(__file__).parent / "golden"

RULES = parse_rules(
    {
        "rules": [
            "valid == true",
            "jain_slowdown >= 0.8",
            "slo_attainment.interactive >= 0.95",
            "ttft_p99.interactive: no significant increase > 10%",
            "goodput >= 5",
        ]
    }
)


def summary(
    p99: float, ci: tuple[float, float], attainment: float, jain: float, valid: bool = True
) -> dict[str, Any]:
    """A hand-made summary.json (schema 2: figures under `metrics`, as the registry names them)."""
    entry = lambda v, **kw: {"value": v, "lower_bound": False, **kw}  # noqa: E731
    return {
        "schema_version": 2,
        "scenario": "golden",
        "valid": valid,
        "invalid_reasons": [] if valid else ["generator fell behind: send lag p99 9 ms > 5 ms"],
        "metrics": {
            "overall": {"goodput": entry(12.5), "jain_slowdown": entry(jain)},
            "class": {
                "interactive": {
                    "slo_attainment": entry(attainment),
                    "ttft_p99": entry(p99, ci_low=ci[0], ci_high=ci[1], n=1000),
                }
            },
        },
    }


# three replicated baseline runs (seeds): a relative rule judges against their run-to-run spread
BASELINE = [
    summary(200.0, (190.0, 210.0), 0.97, 0.91),
    summary(188.0, (179.0, 198.0), 0.97, 0.91),
    summary(211.0, (200.0, 222.0), 0.97, 0.91),
]
CASES = {
    # +4% and overlapping intervals: noise, not a regression
    "pass": summary(208.0, (198.0, 219.0), 0.96, 0.90),
    # +50%, separate intervals; fairness below its floor; attainment below its floor
    "fail": summary(300.0, (285.0, 320.0), 0.90, 0.70),
    # an INVALID candidate cannot be judged
    "unevaluable": summary(208.0, (198.0, 219.0), 0.96, 0.90, valid=False),
}


@pytest.mark.parametrize(("case", "code"), [("pass", 0), ("fail", 1), ("unevaluable", 2)])
def test_golden_outputs(case: str, code: int) -> None:
    results, blocker = evaluate(RULES, BASELINE, CASES[case])
    assert exit_code(results, blocker) == code
    for suffix, render in (("txt", as_text), ("xml", as_junit), ("md", as_markdown)):
        expected = (GOLDEN / f"gate-{case}.{suffix}").read_text(encoding="utf-8")
        assert render(results, blocker) == expected, f"gate-{case}.{suffix}"


def test_a_baseline_of_another_scenario_blocks_the_gate() -> None:
    other = copy.deepcopy(BASELINE)
    other[1]["scenario"] = "something-else"
    results, blocker = evaluate(RULES, other, CASES["pass"])
    assert exit_code(results, blocker) == 2
    assert blocker is not None and "scenario" in blocker


def test_an_unknown_metric_is_refused_before_anything_runs() -> None:
    with pytest.raises(GateError) as info:
        parse_rules({"rules": ["goodptu >= 1"]})
    assert info.value.lines == ["rules[0]: unknown metric 'goodptu'; did you mean 'goodput'?"]


def test_a_figure_the_run_lacks_is_an_error_with_a_hint() -> None:
    rules = parse_rules({"rules": ["slo_attainment.class.interactiv >= 0.5"]})
    results, blocker = evaluate(rules, None, CASES["pass"])
    assert exit_code(results, blocker) == 2
    assert results[0].outcome == "error"
    assert "did you mean slo_attainment.class.interactive?" in results[0].detail


def test_a_lower_bound_never_passes_a_ceiling() -> None:
    """p99 ≥ 3,000 ms (unfinished requests): it proves p99 >= 100, and cannot prove <= 5,000."""
    cand = copy.deepcopy(CASES["pass"])
    cand["metrics"]["class"]["interactive"]["ttft_p99"] = {
        "value": 3000.0,
        "lower_bound": True,
        "ci_low": 3000.0,
        "ci_high": None,
    }
    rules = parse_rules(
        {
            "rules": [
                "ttft_p99.class.interactive >= 100",
                "ttft_p99.interactive <= 5000",
                "ttft_p99.class.interactive: no significant increase > 10%",
            ]
        }
    )
    results, _ = evaluate(rules, BASELINE, cand)
    assert [r.outcome for r in results] == ["pass", "fail", "fail"]
    assert "lower bound" in results[1].detail and results[1].candidate == "≥ 3000"


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ("jain_slowdown >= high", "'high' is not a number"),
        ("jain_slowdown => 0.9", "cannot read 'jain_slowdown => 0.9'"),
        ("jain >= 0.9", "unknown metric 'jain'"),
        ("ttft_p99: no significant rise > 5%", "cannot read"),
        (42, "a rule is a string"),
    ],
)
def test_rule_typos_get_clear_errors(rule: object, message: str) -> None:
    with pytest.raises(GateError) as info:
        parse_rules({"rules": ["valid == true", rule]})
    assert len(info.value.lines) == 1
    assert info.value.lines[0].startswith("rules[1]: ") and message in info.value.lines[0]


def test_yaml_mapping_form_of_a_relative_rule_is_read() -> None:
    rules = parse_rules(yaml.safe_load("rules:\n  - ttft_p99: no significant increase > 5%\n"))
    assert rules[0].relative and rules[0].threshold == pytest.approx(0.05)


def gate_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, timeout=300)


def run_dogfood(tmp_path: Path, name: str, policy: str, seed: int) -> Path:
    data = yaml.safe_load((REPO / "scenarios" / "gate-dogfood.yaml").read_text())
    data["scheduler"]["policy"] = policy
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / name
    assert (
        gate_cli("run", str(path), "--out", str(out), "--quiet", "--seed", str(seed)).returncode
        == 0
    )
    return out


def test_the_dogfood_gate_fails_fifo_and_passes_another_seed(tmp_path: Path) -> None:
    rules = str(REPO / ".ci" / "gate.yaml")
    baseline = str(REPO / ".ci" / "baseline")  # five seeds of DWRR
    unfair = run_dogfood(tmp_path, "fifo", "fifo", 1)
    result = gate_cli(
        "gate",
        "--baseline",
        baseline,
        "--candidate",
        str(unfair),
        "--rules",
        rules,
        "--junit",
        str(tmp_path / "j.xml"),
    )
    assert result.returncode == 1, result.stdout
    assert "gate: FAIL: regression" in result.stdout
    assert "<failure" in (tmp_path / "j.xml").read_text()
    fair = run_dogfood(tmp_path, "seed7", "dwrr", 7)
    result = gate_cli("gate", "--baseline", baseline, "--candidate", str(fair), "--rules", rules)
    assert result.returncode == 0, result.stdout


def test_one_baseline_run_cannot_judge_a_relative_rule_and_says_what_would() -> None:
    """One run shows nothing of run-to-run noise: the relative rule is `cannot evaluate` (exit
    2) naming the fix, while the absolute rules are still judged."""
    results, blocker = evaluate(RULES, BASELINE[0], CASES["pass"])
    relative = results[3]
    assert relative.outcome == "error" and exit_code(results, blocker) == 2
    assert "baseline has 1 run" in relative.detail and "≥ 3 replicated runs" in relative.detail
    assert "fairbench ab" in relative.detail
    assert [r.outcome for r in results if not r.rule.relative] == ["pass"] * 4
    copies = [BASELINE[0]] * 3  # three copies of one seed replicate nothing
    results, _ = evaluate(RULES, copies, CASES["pass"])
    assert results[3].outcome == "error" and "identical" in results[3].detail


def _p99_summary(value: float) -> dict[str, Any]:
    return summary(value, (value * 0.95, value * 1.05), 0.97, 0.91)


def test_the_noise_band_holds_its_false_alarm_rate_and_catches_a_real_increase() -> None:
    """Seeded A/A: 2,000 gates of a candidate drawn from the baseline runs' own distribution
    (lognormal run-to-run spread, 20% SD) against 3 and 5 replicated runs, a 0% allowance. The
    one-sided 2.5% side of the 95% prediction interval must fail 1-4% of them — not 0 (a band
    that cannot fail proves nothing) and not the 20-50% the per-run intervals gave; a 2x
    regression fails a third of them with 3 baseline runs (t with 2 degrees of freedom is wide)
    and more than half with 5."""
    rng = np.random.default_rng(32)
    rule = parse_rules({"rules": ["ttft_p99.interactive: no significant increase > 0%"]})
    for k in (3, 5):
        fails = doubled = 0
        for _ in range(2000):
            draws = np.exp(rng.normal(math.log(200.0), 0.2, k + 1))
            bases = [_p99_summary(v) for v in draws[:k]]
            results, _ = evaluate(rule, bases, _p99_summary(draws[k]))
            fails += results[0].outcome == "fail"
            results, _ = evaluate(rule, bases, _p99_summary(2 * draws[k]))
            doubled += results[0].outcome == "fail"
        assert 0.01 <= fails / 2000 <= 0.04, (k, fails)
        assert doubled / 2000 >= (0.3 if k == 3 else 0.55), (k, doubled)


def test_a_decrease_rule_uses_the_lower_side_of_the_band() -> None:
    rule = parse_rules({"rules": ["slo_attainment.interactive: no significant decrease > 5%"]})
    bases = [summary(200.0, (190.0, 210.0), a, 0.9) for a in (0.95, 0.96, 0.94)]
    assert evaluate(rule, bases, summary(200.0, (190.0, 210.0), 0.5, 0.9))[0][0].outcome == "fail"
    assert evaluate(rule, bases, summary(200.0, (190.0, 210.0), 0.95, 0.9))[0][0].outcome == "pass"


def _queue_summaries(tmp_path: Path, seeds: range, **scheduler: object) -> list[dict[str, Any]]:
    """Simulated runs of the calibration queue (two tenants, 4/s each, 30 s), in this process."""
    from fairbench.pipeline import run_scenario
    from fairbench.run.rundir import RunOptions
    from fairbench.workload import parse_scenario

    data = yaml.safe_load((REPO / "scenarios" / "calibration" / "queue.yaml").read_text())
    for tenant in data["tenants"]:
        tenant["arrival"]["rate"] = "4/s"
    data["run"].update(duration="30s", warmup="5s", cooldown="2s")
    data["scheduler"].update(scheduler)
    out = []
    for seed in seeds:
        data["run"]["seed"] = seed
        run_dir = tmp_path / f"q-{seed}-{len(scheduler)}"
        out.append(run_scenario(parse_scenario(data), RunOptions(out=run_dir, progress=False)))
    return [o.summary for o in out]


def test_real_runs_of_one_configuration_do_not_fail_and_a_slower_engine_does(
    tmp_path: Path,
) -> None:
    """Seeded A/A on the simulator: 6 seeds of one configuration, each gated against every 3 of
    the other 5 (60 gates, two relative rules at a 5% allowance): at most 5% fail. A slower
    engine (4 batch slots instead of 16) fails every gate against the same baselines."""
    import itertools

    rules = parse_rules(
        {
            "rules": [
                "ttft_p99: no significant increase > 5%",
                "ttft_p99.tenant.a: no significant increase > 5%",
            ]
        }
    )
    same = _queue_summaries(tmp_path, range(401, 407))
    slower = _queue_summaries(tmp_path, range(401, 403), max_num_seqs=4)
    fails = gates = 0
    for i, cand in enumerate(same):
        for subset in itertools.combinations([j for j in range(6) if j != i], 3):
            results, blocker = evaluate(rules, [same[j] for j in subset], cand)
            assert blocker is None and all(r.outcome != "error" for r in results)
            gates += 1
            fails += exit_code(results, blocker) == 1
    assert gates == 60 and fails <= 3, fails
    for cand in slower:
        for subset in itertools.combinations(range(6), 3):
            results, blocker = evaluate(rules, [same[j] for j in subset], cand)
            assert exit_code(results, blocker) == 1, as_text(results, blocker)
