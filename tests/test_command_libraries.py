"""What the decide-across-runs commands compute, called without the command line (issue 31):
the A/B's checks and design line, the objectives and the front, a sweep's labels, and the
pages' inputs read from run directories. Each refusal is one line naming the flag."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from fairbench.decide.ab import (
    AB_ADVICE,
    ABRefused,
    check_metric,
    check_same_plan,
    compare_payload,
    design_note,
)
from fairbench.decide.objectives import (
    DEFAULT_OBJECTIVES,
    ObjectiveError,
    front,
    parse_objectives,
    point_labels,
)
from fairbench.report.documents import started_at, what_changed
from tests.conftest import make_scenario


def test_arms_that_plan_different_requests_are_refused_naming_both_flags() -> None:
    same = {"A": make_scenario(rate=20), "B": make_scenario(rate=20)}
    check_same_plan(same, ["scheduler.policy=fifo"], ["scheduler.policy=vtc"])
    other = {"A": make_scenario(rate=20), "B": make_scenario(rate=40)}
    with pytest.raises(ABRefused) as refused:
        check_same_plan(other, ["x=1"], ["tenants.a.arrival.rate=40"])
    (line,) = str(refused.value).splitlines()
    assert line.startswith("--a x=1 / --b tenants.a.arrival.rate=40: the arms plan different")


def test_a_watched_metric_the_comparison_lacks_is_refused_with_the_closest() -> None:
    scn = make_scenario()
    check_metric(scn, "ttft_p99")
    with pytest.raises(ABRefused, match=r"--metric 'ttft_p98': not a compared metric; did you"):
        check_metric(scn, "ttft_p98")


def test_one_pair_gets_the_commands_advice_and_more_pairs_keep_the_design() -> None:
    one = SimpleNamespace(design="one pair — anything", pairs=1)
    three = SimpleNamespace(design="3 pairs — paired runs", pairs=3)
    assert design_note(one, AB_ADVICE) == "one pair — " + AB_ADVICE  # type: ignore[arg-type]
    assert design_note(three, AB_ADVICE) == "3 pairs — paired runs"  # type: ignore[arg-type]


def test_the_json_payload_carries_power_only_when_asked() -> None:
    comparison = SimpleNamespace(as_dict=lambda: {"verdicts": []})
    plain = compare_payload(comparison, "note", 0.95, None)  # type: ignore[arg-type]
    assert plain == {"verdicts": [], "design": "note", "confidence": 0.95}
    found = SimpleNamespace(as_dict=lambda: {"pairs": 7})
    with_power = compare_payload(comparison, "note", 0.95, found)  # type: ignore[arg-type]
    assert list(with_power) == ["verdicts", "design", "confidence", "power"]


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("goodput", "--objective 'goodput': use NAME:max or NAME:min"),
        (":max", "--objective ':max': use NAME:max or NAME:min"),
        ("no_such_metric:max", "--objective 'no_such_metric:max': "),
    ],
)
def test_a_bad_objective_is_one_line_naming_it(spec: str, says: str) -> None:
    with pytest.raises(ObjectiveError) as refused:
        parse_objectives([spec])
    assert str(refused.value).startswith(says) and "\n" not in str(refused.value)


def test_the_front_marks_the_non_dominated_runs() -> None:
    names, senses = parse_objectives(DEFAULT_OBJECTIVES[:2])
    assert (names, senses) == (["goodput", "ttft_p99"], ["max", "min"])

    def summary(goodput: float, ttft: float) -> dict[str, Any]:
        return {
            "metrics": {"overall": {"goodput": {"value": goodput}, "ttft_p99": {"value": ttft}}}
        }

    values, on = front([summary(10, 1), summary(5, 2), summary(12, 3)], names, senses)
    assert values.tolist() == [[10, 1], [5, 2], [12, 3]]
    assert on.tolist() == [True, False, True]  # the second is worse on both


def test_a_sweep_label_names_its_parameters_and_a_varied_seed() -> None:
    rows = [{"params": {"p": "fifo", "w": 2}, "seed": None}, {"params": {"p": "vtc"}, "seed": 3}]
    assert point_labels(rows) == ["p=fifo w=2", "p=vtc seed=3"]


def test_the_history_order_and_the_ab_diff_come_from_the_run_directories(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "run.json").write_text(json.dumps({"started_at": "2026-12-01T00:00:00Z"}))
    (b / "run.json").write_text("not json")
    assert started_at(a) == "2026-12-01T00:00:00Z" and started_at(b) == ""
    assert started_at(tmp_path / "missing") == ""
    (a / "scenario.yaml").write_text("name: x\nscheduler:\n  policy: fifo\n")
    (b / "scenario.yaml").write_text("name: x\nscheduler:\n  policy: vtc\n")
    assert what_changed(a, b).splitlines() == [
        "--- A",
        "+++ B",
        "-  policy: fifo",
        "+  policy: vtc",
    ]
    assert what_changed(a, a).startswith("the scenarios are identical")
