"""What the commands compute, called without the command line (issue 31): the A/B's checks and
design line, the objectives and the front, a sweep's labels, the pages' inputs read from run
directories, `run`'s terminal output and its twin's early-ended count, and `profile`'s flag
checks, design and printed rows. Each refusal is one line naming the flag."""

from __future__ import annotations

import io
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
from fairbench.decide.fidelity import ended_early
from fairbench.decide.objectives import (
    DEFAULT_OBJECTIVES,
    ObjectiveError,
    front,
    parse_objectives,
    point_labels,
)
from fairbench.report.documents import started_at, what_changed
from tests.conftest import live_doc, make_scenario


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


def test_the_front_table_marks_what_the_front_marks() -> None:
    """`sweep` and `pareto`'s table (report.terminal), built without the command: a row per
    run with its objectives, on the front or dominated."""
    from fairbench.report.terminal import front_table

    def summary(goodput: float, ttft: float) -> dict[str, Any]:
        return {
            "metrics": {"overall": {"goodput": {"value": goodput}, "ttft_p99": {"value": ttft}}}
        }

    names, senses = parse_objectives(DEFAULT_OBJECTIVES[:2])
    runs = [summary(10, 1), summary(5, 2)]
    table = front_table("front", ["a", "b"], runs, names, senses)
    assert [c.header for c in table.columns] == [
        "point",
        "goodput (max)",
        "ttft_p99 (min)",
        "front",
    ]
    assert list(table.columns[-1].cells) == ["yes", "dominated"]
    one = front_table("best", ["a", "b"], runs, names[:1], senses[:1])
    assert list(one.columns[-1].cells) == ["yes", "-"]


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


GOLDEN = Path(__file__).parent / "golden"


@pytest.mark.parametrize("name", ["onoff", "ramp", "vtc-overload"])
def test_the_run_terminal_output_is_a_library_call_that_prints_the_golden_text(name: str) -> None:
    """`fairbench run`'s tables and verdict lines, rendered from the golden summary.json without
    the command, are the golden terminal text up to the run directory's line."""
    from rich.console import Console

    from fairbench.report.headline import headline_table
    from fairbench.report.terminal import results_table, verdict_lines

    summary = json.loads((GOLDEN / f"run-{name}.summary.json").read_text(encoding="utf-8"))
    buf = io.StringIO()
    console = Console(file=buf, width=160, color_system=None, force_terminal=False)
    console.print(results_table(summary))
    console.print(headline_table(summary))
    for line in verdict_lines(summary):
        console.print(line, highlight=False)
    golden = (GOLDEN / f"run-{name}.txt").read_text(encoding="utf-8")
    assert buf.getvalue() == golden[: golden.index("run directory:")]


def test_an_invalid_run_says_why_under_its_verdict() -> None:
    from fairbench.report.terminal import verdict_lines

    summary = json.loads((GOLDEN / "run-onoff.summary.json").read_text(encoding="utf-8"))
    summary["valid"], summary["invalid_reasons"] = False, ["send lag p99 9 ms > 5 ms"]
    lines = verdict_lines(summary)
    assert lines[:2] == ["[bold red]INVALID[/]", "  [red]- send lag p99 9 ms > 5 ms[/]"]


def test_live_requests_that_ended_before_max_tokens_are_counted(tmp_path: Path) -> None:
    import pandas as pd

    pd.DataFrame(
        {
            "status": ["ok", "ok", "ok", "error"],
            "output_tokens": [10, 7, 3, 0],
            "max_tokens": [10, 10, 4, 10],
        }
    ).to_parquet(tmp_path / "records.parquet")
    assert ended_early(tmp_path) == 2  # the error is no early end


def test_profile_flags_are_refused_one_line_each_naming_the_flag(tmp_path: Path) -> None:
    from fairbench.targets.profile.command import ProfileUsage, check_out, check_url, probe_url

    assert probe_url("http://127.0.0.1:8000/v1/", "auto") == "http://127.0.0.1:8000"
    refusals = {
        "--target-url is missing": lambda: probe_url(None, "auto"),
        "--engine vlm: not an engine; use one of ": lambda: probe_url("http://h:1", "vlm"),
        "--target-url localhost:8000: not an http(s) URL": lambda: check_url(
            probe_url("localhost:8000", "vllm"), "localhost:8000"
        ),
        "--target-url http://: not an http(s) URL": lambda: check_url("http://", "http://"),
        f"--out {tmp_path}: a directory": lambda: check_out(tmp_path),
    }
    for says, call in refusals.items():
        with pytest.raises(ProfileUsage) as refused:
            call()
        assert str(refused.value).startswith(says) and "\n" not in str(refused.value)
    check_out(tmp_path / "p.yaml")  # a file name is fine


def test_the_probe_design_keeps_the_limits_given_and_defaults_the_rest() -> None:
    from fairbench.targets.profile.command import probe_design

    flags: dict[str, Any] = {
        "max_model_len": 4096,
        "max_num_batched_tokens": None,
        "budget_s": 60.0,
        "max_rounds": 2,
        "seed": 3,
        "load_requests": None,
        "load_prompt": 256,
        "load_prompt_to": None,
        "load_output": 16,
        "idle_reps": 4,
    }
    design, given = probe_design(max_num_seqs=16, kv_cache_tokens=None, **flags)
    assert given == {"max_num_seqs"}
    assert (design.max_num_seqs, design.max_num_batched_tokens) == (16, 2048)
    assert (design.max_model_len, design.budget_s, design.seed) == (4096, 60.0, 3)
    design, given = probe_design(max_num_seqs=None, kv_cache_tokens=9000, **flags)
    assert given == {"kv_cache_tokens"} and design.max_num_seqs == 8


def test_a_merge_of_a_missing_file_is_one_line_naming_merge(tmp_path: Path) -> None:
    from fairbench.targets.profile.command import ProfileUsage, merge

    with pytest.raises(ProfileUsage, match=r"^--merge .*missing.yaml: no such file"):
        merge([tmp_path / "missing.yaml"], tmp_path / "out.yaml", None)
    with pytest.raises(ProfileUsage, match=r"a directory; give the profile's file name"):
        merge([tmp_path / "missing.yaml"], tmp_path, None)


def test_profile_rows_and_lines_are_what_the_command_prints() -> None:
    from fairbench.targets.profile.command import coefficient_rows, merged_rows, probe_lines

    fit = SimpleNamespace(
        coefficients={"a": 12.345678, "d": 0.5},
        stderr={"a": 0.01234, "d": 0.5},
        front_end={"core_ms": 0.25, "mad_ms": 0.01},
        arrival={"cost_ms": 0.5, "mad_ms": 0.2},
        idle=None,
    )
    assert coefficient_rows(fit) == [  # type: ignore[arg-type]
        ("a", "12.35", "0.012"),
        ("d", "0.5", "0.5"),
        ("front end (core)", "0.25", "MAD 0.01"),
        ("arrival (direct)", "0.5", "MAD 0.2"),
    ]
    merged = {
        "a": 1.23456,
        "d": 2.0,
        "fit": {"rounds": 5, "merged_from": [{"profile": "p.yaml", "rounds": 5, "a": 1, "d": 2}]},
    }
    assert merged_rows(merged) == [("p.yaml", "5", "1", "2"), ("merged", "5", "1.235", "2")]
    engine = SimpleNamespace(
        kind="vllm",
        detected_by="GET /version",
        version="0.9",
        source={"max_num_seqs", "version"},
        max_num_seqs=16,
    )
    result = SimpleNamespace(rounds=3, seconds=41.6, truncated=True, engine=engine)
    assert probe_lines(result, 40.0) == [  # type: ignore[arg-type]
        "3 round(s) of the probe in 42 s (the --budget of 40 s allowed no more)",
        "engine: vllm (GET /version), version 0.9; it said max_num_seqs 16",
    ]


def test_the_twin_of_a_live_scenario_is_computed_without_the_command(tmp_path: Path) -> None:
    """workload.twin: the engine mode, the priorities SGLang was sent (negated: it runs higher
    first), the line, and the same-plan check by the digests the caller gives."""
    from fairbench.workload.loading import parse_scenario
    from fairbench.workload.twin import TwinRefused, check_twin, twin_document, twin_line

    doc = live_doc("sglang", priority={"by": "tenant", "values": {"chat": 5, "flood": 1}})
    scn = parse_scenario(doc, "test", tmp_path)
    data, spec = twin_document(doc, scn, "h100-llama3-8b")
    assert spec == "h100-llama3-8b" and data["target"] == {"kind": "sim"}
    assert data["scheduler"] == {"engine": "vllm", "policy": "fcfs", "profile": spec}
    assert {k: c["priority"] for k, c in data["slo_classes"].items()} == {
        "interactive": -5,
        "batch": -1,
    }
    assert doc["target"]["kind"] == "sglang"  # the live document is not touched
    line = twin_line(data["scheduler"], "my.yaml", "sglang")
    assert line == (
        "target sim, scheduler {engine: vllm, policy: fcfs, profile: my.yaml} "
        "(no sglang mode: vLLM's scheduling model)"
    )
    sim = parse_scenario(data, "test", tmp_path)
    check_twin(scn, sim, "--simulate p", lambda s: "same")
    with pytest.raises(TwinRefused, match=r"^--simulate p: changes the plan \(b"):
        check_twin(scn, sim, "--simulate p", lambda s: "b" if s is sim else "a")
    with pytest.raises(TwinRefused, match="must stay sim"):
        check_twin(scn, scn, "--simulate-set target.kind=vllm", lambda s: "same")


@pytest.mark.parametrize(
    ("target", "says"),
    [
        ({"kind": "sim"}, "--simulate: the scenario's target is sim already"),
        ({"kind": "reference", "faults": {"seed": 1}}, "--simulate: target.faults injects"),
        (
            {"kind": "vllm", "base_url": "http://127.0.0.1:9", "extra_body": {"priority": 1}},
            "--simulate: target.extra_body sends a priority",
        ),
    ],
)
def test_a_live_scenario_without_a_twin_is_one_line(
    tmp_path: Path, target: dict[str, Any], says: str
) -> None:
    from fairbench.workload.loading import parse_scenario
    from fairbench.workload.twin import TwinRefused, twin_document

    doc = {**live_doc(), "target": target}
    scn = parse_scenario(doc, "test", tmp_path)
    with pytest.raises(TwinRefused) as refused:
        twin_document(doc, scn, "h100-llama3-8b")
    assert str(refused.value).startswith(says) and "\n" not in str(refused.value)


def test_a_missing_profile_is_refused_naming_simulate(tmp_path: Path) -> None:
    from fairbench.workload.twin import TwinRefused, profile_spec

    with pytest.raises(TwinRefused, match=r"^--simulate .*nope.yaml: no such profile file"):
        profile_spec(str(tmp_path / "nope.yaml"))
    assert profile_spec("h100-llama3-8b") == "h100-llama3-8b"
