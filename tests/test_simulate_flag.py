"""`fairbench run SCENARIO --simulate PROFILE` (issue #16, item 3): a live run, then the same
plan simulated into RUN/sim/, then the fidelity files `fairbench fidelity RUN RUN/sim` writes.

What would break if it were wrong: the simulation replaying another plan (its digest would
differ from the live one's); fidelity figures other than the ones the `fidelity` command
computes from the two directories; a missing or bad profile found only after a live run has
been spent, or printed as a traceback; `--simulate` accepted on a run that is already
simulated; a vLLM target simulated in the wrong engine mode, with the wrong policy, or with
its priorities not carried to the classes the simulated vLLM ranks by.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from fairbench.cli.inputs import UsageFailure
from fairbench.cli.simulate import simulated_scenario
from fairbench.workload.loading import parse_scenario
from tests.cli import run_cli
from tests.conftest import live_doc

PROFILE = "h100-llama3-8b"


def short_scenario(tmp: Path) -> Path:
    """Two tenants for five seconds on the reference server (kind: reference, FIFO): about 50
    requests, enough for every figure of every tenant."""
    doc = {
        "name": "simulate-flag",
        "workloads": {
            "chat": {"endpoint": "completions", "output_tokens": 20,
                     "prompt_tokens": {"dist": "uniform", "low": 50, "high": 200}},
            "doc": {"endpoint": "completions", "output_tokens": 30,
                    "prompt_tokens": {"dist": "uniform", "low": 500, "high": 1000}},
        },
        "tenants": [
            {"id": "chat", "slo_class": "interactive", "mix": "chat",
             "arrival": {"process": "poisson", "rate": "5/s"}},
            {"id": "flood", "slo_class": "batch", "mix": "doc",
             "arrival": {"process": "poisson", "rate": "5/s"}},
        ],
        "run": {"duration": "5s", "seed": 3, "timeout": "60s", "grace": "30s"},
        # the generator's schedule is not what this test measures; on a loaded machine a late
        # send would make the live run INVALID, and an INVALID run is not compared
        "health": {"max_send_lag_p99": "10s", "max_receive_error_p99": "10s",
                   "min_rate_ratio": 0.5},
        "target": {"kind": "reference"},
        "scheduler": {"policy": "fifo", "profile": PROFILE},
    }  # fmt: skip
    path = tmp / "short.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    tmp = tmp_path_factory.mktemp("simulate")
    run = tmp / "run"
    proc = run_cli(
        "run", str(short_scenario(tmp)), "--simulate", PROFILE, "--out", str(run), "--quiet",
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return run, proc.stdout


def test_the_simulation_replays_the_live_plan(simulated: tuple[Path, str]) -> None:
    run, stdout = simulated
    live = json.loads((run / "summary.json").read_text())
    sim = json.loads((run / "sim" / "summary.json").read_text())
    assert live["plan_digest"] == sim["plan_digest"]
    assert json.loads((run / "sim" / "run.json").read_text())["plan_digest"] == live["plan_digest"]
    # the twin is the live scenario on the simulator: its own scheduler block, the profile
    twin = yaml.safe_load((run / "sim" / "scenario.yaml").read_text())
    assert twin["target"]["kind"] == "sim"
    assert twin["scheduler"]["policy"] == "fifo" and twin["scheduler"]["profile"] == PROFILE
    assert live["generator_health"].get("virtual_time") is not True
    assert sim["generator_health"]["virtual_time"] is True
    assert sim["accounting"]["planned"] == live["accounting"]["planned"] > 0
    assert f"simulated: {run / 'sim'}" in stdout and "the live run's" in stdout
    assert "is not the live run's" not in stdout


def test_fidelity_files_are_those_of_the_fidelity_command(
    simulated: tuple[Path, str], tmp_path: Path
) -> None:
    run, stdout = simulated
    for name in ("fidelity.json", "fidelity.md", "fidelity.html"):
        assert (run / "sim" / name).is_file(), name
    again = tmp_path / "again"
    proc = run_cli("fidelity", str(run), str(run / "sim"), "--out", str(again), timeout=120)
    assert proc.returncode == 0, proc.stderr
    ours = json.loads((run / "sim" / "fidelity.json").read_text())
    theirs = json.loads((again / "fidelity.json").read_text())
    assert ours["rows"] and ours["rows"] == theirs["rows"]
    assert ours["mape_pct"] == theirs["mape_pct"] and ours["plan_digest"] == theirs["plan_digest"]
    assert ours["mape_by_group"] == theirs["mape_by_group"]
    assert (run / "sim" / "fidelity.md").read_text() == (again / "fidelity.md").read_text()
    # the headline printed is the fidelity command's MAPE line
    mape = next(line for line in proc.stdout.splitlines() if line.startswith("MAPE "))
    assert f"fidelity (sim vs live): {mape}" in stdout


def test_a_missing_profile_is_one_line_before_the_live_run(tmp_path: Path) -> None:
    scenario = short_scenario(tmp_path)
    missing = tmp_path / "nope.yaml"
    proc = run_cli("run", str(scenario), "--simulate", str(missing), "--out", str(tmp_path / "r"))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"--simulate {missing}: no such profile file")
    assert not (tmp_path / "r").exists()  # nothing ran
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: broken\na: 1.0\n", encoding="utf-8")
    proc = run_cli("run", str(scenario), "--simulate", str(bad), "--out", str(tmp_path / "r"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"--simulate {bad}: profile"), lines
    assert not (tmp_path / "r").exists()


def test_simulate_on_a_sim_target_and_stray_overrides_are_refused(tmp_path: Path) -> None:
    scenario = short_scenario(tmp_path)
    out = str(tmp_path / "r")
    proc = run_cli("run", str(scenario), "--set", "target.kind=sim", "--simulate", PROFILE,
                   "--out", out)  # fmt: skip
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "target is sim already" in lines[0]
    proc = run_cli("run", str(scenario), "--simulate-set", "scheduler.policy=vtc", "--out", out)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "--simulate-set needs --simulate PROFILE"
    # an override that would change the plan is refused: fidelity needs the same plan
    proc = run_cli("run", str(scenario), "--simulate", PROFILE, "--simulate-set", "run.seed=9",
                   "--out", out)  # fmt: skip
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "changes the plan" in lines[0]
    assert not (tmp_path / "r").exists()


def vllm_doc(**scheduler: Any) -> dict[str, Any]:
    """A live vLLM scenario whose target sends each class a priority (interactive 0, batch 10);
    `scheduler` is its `scheduler:` block, if any."""
    priority = {"by": "slo_class", "values": {"interactive": 0, "batch": 10}}
    doc = {**live_doc("vllm", priority=priority), "name": "live-vllm"}
    if scheduler:
        doc["scheduler"] = scheduler
    return doc


def twin_of(doc: dict[str, Any], tmp: Path, overrides: list[str] | None = None) -> Any:
    scn = parse_scenario(doc, "test", tmp)
    return simulated_scenario(doc, scn, tmp / "live.yaml", PROFILE, overrides)


def test_a_vllm_target_is_simulated_by_vllms_scheduling_model(tmp_path: Path) -> None:
    twin = twin_of(vllm_doc(), tmp_path)
    assert twin.scn.target.kind == "sim"
    assert twin.scn.scheduler == {"engine": "vllm", "policy": "fcfs", "profile": PROFILE}
    # the numbers the live target sent are the classes' priorities the simulated vLLM ranks by
    assert twin.scn.slo_classes["interactive"].priority == 0
    assert twin.scn.slo_classes["batch"].priority == 10
    assert "engine: vllm, policy: fcfs" in twin.line
    # the scenario says priority (its scheduler block, which a live vLLM run does not read)
    twin = twin_of(vllm_doc(policy="priority", max_num_seqs=4), tmp_path)
    assert twin.scn.scheduler == {
        "engine": "vllm", "policy": "priority", "profile": PROFILE, "max_num_seqs": 4,
    }  # fmt: skip
    # or the command line does
    twin = twin_of(vllm_doc(), tmp_path, ["scheduler.policy=priority"])
    assert twin.scn.scheduler["policy"] == "priority"
    with pytest.raises(UsageFailure, match=r"--simulate-set scheduler\.policy=dwrr"):
        twin_of(vllm_doc(), tmp_path, ["scheduler.policy=dwrr"])  # not a vLLM policy
    reference = {**vllm_doc(), "target": {"kind": "reference"}}
    with pytest.raises(UsageFailure, match="must stay sim"):  # the twin would be a live run
        twin_of(reference, tmp_path, ["target.kind=reference"])


def test_engines_without_a_mode_get_vllms_and_the_line_says_so(tmp_path: Path) -> None:
    doc = vllm_doc()
    doc["target"] = {"kind": "tgi", "base_url": "http://127.0.0.1:9"}
    twin = twin_of(doc, tmp_path)
    assert twin.scn.scheduler["engine"] == "vllm" and "no tgi mode" in twin.line
    # priorities by tenant reach the classes when each class was sent one value
    doc = vllm_doc()
    doc["target"] = {"kind": "sglang", "base_url": "http://127.0.0.1:9",
                     "priority": {"by": "tenant", "values": {"chat": 5, "flood": 1}}}  # fmt: skip
    twin = twin_of(doc, tmp_path)
    # SGLang runs higher values first, the simulated vLLM lower first: the order is kept
    assert twin.scn.slo_classes["interactive"].priority == -5
    assert twin.scn.slo_classes["batch"].priority == -1
    # a class no tenant was sent a priority for ranks at the engines' default, 0
    doc["target"]["priority"] = {"by": "tenant", "values": {"chat": 5}}
    twin = twin_of(doc, tmp_path)
    assert twin.scn.slo_classes["batch"].priority == 0
    doc["target"]["priority"] = {"by": "tenant", "values": {"chat": 5, "flood": 1}}
    doc["tenants"][1]["slo_class"] = "interactive"  # one class, two values: say which
    with pytest.raises(UsageFailure, match=r"slo_classes\.interactive\.priority"):
        twin_of(doc, tmp_path)


def test_classes_rank_as_the_live_engine_saw_them(tmp_path: Path) -> None:
    # no target.priority: vLLM got no priority field, so every class ranks at 0 in the twin,
    # whatever the scenario's own class priorities say (those are the reference scheduler's)
    doc = vllm_doc(policy="priority")
    del doc["target"]["priority"]
    doc["slo_classes"] = {"interactive": {"ttft": "300ms", "priority": 0},
                          "batch": {"ttft": "10s", "priority": 1}}  # fmt: skip
    twin = twin_of(doc, tmp_path)
    assert {n: c.priority for n, c in twin.scn.slo_classes.items()} == {
        "interactive": 0, "batch": 0,
    }  # fmt: skip
    # a priority hidden in an extra body is not modelled: refused, with the way out
    doc["target"]["class_extra_body"] = {"batch": {"priority": 3}}
    with pytest.raises(UsageFailure, match=r"class_extra_body\.batch sends a priority"):
        twin_of(doc, tmp_path)
