"""Every command refuses bad input in one line, exit 2, never a traceback; overrides reach
tenants (by id or index) and workloads (by name) and are blamed by flag; the knee search says
when attainment is not monotone in load.

The fuzz table drives each subcommand through `tests/cli.py` (its own process, as a user runs
it). Inputs that must be valid are tiny simulated scenarios written to a temporary directory;
nothing in the table runs a benchmark, so the file stays quick.
"""

from __future__ import annotations

import json
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from fairbench._version import __version__
from fairbench.cli.inputs import UsageFailure, confidence_level, scenario_with
from fairbench.decide.sweep import apply, knee, search_knee
from fairbench.workload.errors import ScenarioError
from fairbench.workload.paths import resolve_path
from tests.cli import REPO, run_cli

TINY = {
    "name": "tiny",
    "workloads": {"chat": {"endpoint": "chat", "prompt_tokens": 32, "output_tokens": 8}},
    "tenants": [
        {"id": "a", "mix": "chat", "arrival": {"process": "poisson", "rate": "5/s"}},
        {"id": "b.team", "weight": 2, "mix": "chat", "arrival": {"process": "poisson", "rate": 5}},
    ],
    "run": {"duration": "2s", "seed": 1},
    "target": {"kind": "sim"},
    "scheduler": {"policy": "dwrr", "profile": "h100-llama3-8b"},
}


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny valid scenario, a sweep over it, a broken scenario, and a directory that is not
    a run."""
    root = tmp_path_factory.mktemp("cli-errors")
    (root / "tiny.yaml").write_text(yaml.safe_dump(TINY), encoding="utf-8")
    (root / "sweep.yaml").write_text(
        yaml.safe_dump({"scenario": "tiny.yaml", "grid": {"scheduler.policy": ["fifo", "dwrr"]}}),
        encoding="utf-8",
    )
    (root / "sweep-missing.yaml").write_text(
        yaml.safe_dump({"scenario": "absent.yaml", "grid": {"run.seed": [1]}}), encoding="utf-8"
    )
    (root / "broken.yaml").write_text("name: [unclosed\n", encoding="utf-8")
    (root / "not-a-run").mkdir()
    (root / "ab-done" / "A-0").mkdir(parents=True)
    (root / "knee-done").mkdir()
    (root / "knee-done" / "knee.json").write_text("{}", encoding="utf-8")
    (root / "rules.yaml").write_text("rules: []\n", encoding="utf-8")
    return root


# (case id, argv with {w} for the work directory). Each must exit 2 with one line on stderr.
CASES: list[tuple[str, list[str]]] = [
    # missing files
    ("validate-missing", ["validate", "{w}/absent.yaml"]),
    ("plan-missing", ["plan", "{w}/absent.yaml"]),
    ("run-missing", ["run", "{w}/absent.yaml"]),
    ("ab-missing", ["ab", "{w}/absent.yaml", "--a", "run.seed=1", "--b", "run.seed=2"]),
    ("sweep-missing", ["sweep", "{w}/absent.yaml"]),
    ("sweep-scenario-missing", ["sweep", "{w}/sweep-missing.yaml", "--out", "{w}/s1"]),
    ("knee-missing", ["knee", "{w}/absent.yaml"]),
    ("report-missing", ["report", "{w}/absent-run"]),
    ("report-not-a-run", ["report", "{w}/not-a-run"]),
    ("report-history-missing", ["report", "--history", "{w}/absent-run"]),
    ("report-compare-missing", ["report", "--compare", "{w}/absent-a", "{w}/absent-b"]),
    ("pareto-missing", ["pareto", "{w}/absent-run"]),
    ("compare-missing", ["compare", "{w}/absent-a", "{w}/absent-b"]),
    ("gate-missing", ["gate", "--candidate", "{w}/absent-run", "--rules", "{w}/rules.yaml"]),
    ("plan-broken-yaml", ["plan", "{w}/broken.yaml"]),
    # bad flags
    ("root-bad-flag", ["--bogus"]),
    ("unknown-command", ["frobnicate"]),
    ("schema-bad-flag", ["schema", "--bogus"]),
    ("run-bad-flag", ["run", "{w}/tiny.yaml", "--bogus"]),
    ("plan-bad-seed", ["plan", "{w}/tiny.yaml", "--seed", "abc"]),
    ("ab-missing-b", ["ab", "{w}/tiny.yaml", "--a", "run.seed=1"]),
    (
        "ab-netperf-confidence",
        ["ab", "{w}/tiny.yaml", "--a", "run.seed=1", "--b", "run.seed=2", "--confidence", "99,5"],
    ),
    (
        "ab-unknown-metric",
        [
            "ab",
            "{w}/tiny.yaml",
            "--a",
            "run.seed=1",
            "--b",
            "run.seed=2",
            "--precision",
            "5",
            "--metric",
            "nope",
        ],
    ),
    ("compare-fraction-confidence", ["compare", "{w}/x", "{w}/y", "--confidence", "0.95"]),
    ("compare-one-run", ["compare", "{w}/not-a-run"]),
    ("sweep-objective-no-sense", ["sweep", "{w}/sweep.yaml", "--objective", "goodput"]),
    ("sweep-objective-unknown", ["sweep", "{w}/sweep.yaml", "--objective", "goodputt:max"]),
    ("pareto-objective-bad", ["pareto", "{w}/not-a-run", "--objective", "ttft_p99:lowest"]),
    ("knee-high-below-low", ["knee", "{w}/tiny.yaml", "--low", "2", "--high", "1"]),
    ("knee-bad-tolerance", ["knee", "{w}/tiny.yaml", "--tolerance", "0"]),
    ("report-nothing", ["report"]),
    ("report-history-unknown-metric", ["report", "--history", "{w}/x", "--metric", "gooput"]),
    ("metrics-bad-flag", ["metrics", "--bogus"]),
    ("report-two-modes", ["report", "--history", "--compare", "{w}/x", "{w}/y"]),
    ("gate-no-rules", ["gate", "--candidate", "{w}/not-a-run"]),
    (
        "ab-out-taken",
        ["ab", "{w}/tiny.yaml", "--a", "run.seed=1", "--b", "run.seed=2", "--out", "{w}/ab-done"],
    ),
    (
        "ab-arms-differ-in-plan",
        ["ab", "{w}/tiny.yaml", "--a", "run.duration=3s", "--b", "scheduler.policy=fifo"],
    ),
    ("knee-out-taken", ["knee", "{w}/tiny.yaml", "--out", "{w}/knee-done"]),
    # bad overrides
    ("ab-top-level-typo", ["ab", "{w}/tiny.yaml", "--a", "policy=fifo", "--b", "run.seed=2"]),
    ("ab-no-equals", ["ab", "{w}/tiny.yaml", "--a", "run.seed=1", "--b", "scheduler.policy"]),
    (
        "ab-unknown-tenant",
        ["ab", "{w}/tiny.yaml", "--a", "tenants.zz.weight=3", "--b", "run.seed=2"],
    ),
    ("ab-bad-value", ["ab", "{w}/tiny.yaml", "--a", "run.seed=1", "--b", "tenants.a.weight=-1"]),
    (
        "ab-bad-policy",
        ["ab", "{w}/tiny.yaml", "--a", "scheduler.policy=bogus", "--b", "run.seed=2"],
    ),
    ("run-set-into-string", ["run", "{w}/tiny.yaml", "--set", "name.x=1"]),
    ("plan-set-bad-yaml", ["plan", "{w}/tiny.yaml", "--set", "run.seed=[1"]),
    ("knee-set-bad-index", ["knee", "{w}/tiny.yaml", "--set", "tenants.7.weight=2"]),
]


@pytest.fixture(scope="module")
def fuzz(work: Path) -> dict[str, subprocess.CompletedProcess[str]]:
    """Every case run once, two at a time (each is a process start and little else)."""

    def one(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return run_cli(*(a.replace("{w}", str(work)) for a in argv), timeout=60)

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(one, [argv for _, argv in CASES]))
    return {name: result for (name, _), result in zip(CASES, results, strict=True)}


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_bad_input_is_one_line_and_exit_2(
    fuzz: dict[str, subprocess.CompletedProcess[str]], case: str
) -> None:
    result = fuzz[case]
    lines = result.stderr.splitlines()
    assert "Traceback" not in result.stderr + result.stdout
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1, result.stderr
    assert lines[0].strip(), "the one line says something"


def test_validate_prints_one_line_per_problem(work: Path, tmp_path: Path) -> None:
    bad = dict(TINY, run={"duration": "-1s", "seed": -3})
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad), encoding="utf-8")
    result = run_cli("validate", str(tmp_path / "bad.yaml"), str(work / "absent.yaml"))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 3, result.stderr  # two problems in bad.yaml, one missing file
    assert sum("run.duration" in line for line in lines) == 1
    assert sum("run.seed" in line for line in lines) == 1
    assert lines[-1] == f"{work / 'absent.yaml'}: file not found"


def test_errors_name_the_flag_and_the_fix(
    work: Path, fuzz: dict[str, subprocess.CompletedProcess[str]]
) -> None:
    tiny = str(work / "tiny.yaml")
    typo = fuzz["ab-top-level-typo"]  # `ab tiny --a policy=fifo --b run.seed=2`, run once
    assert typo.stderr.startswith("--a policy=fifo: ")
    assert "did you mean scheduler.policy?" in typo.stderr
    assert tiny not in typo.stderr  # the file is fine; the flag is not
    value = run_cli("ab", tiny, "--a", "run.seed=1", "--b", "tenants.b.team.weight=0")
    assert value.stderr.startswith("--b tenants.b.team.weight=0: tenants[1].weight: ")
    netperf = run_cli("compare", "x", "y", "--confidence", "99,5")
    assert "--precision" in netperf.stderr and "--confidence" in netperf.stderr
    bad_flag = fuzz["run-bad-flag"]  # `run tiny --bogus`, run once for both tests
    assert "--bogus" in bad_flag.stderr and "fairbench run --help" in bad_flag.stderr


def test_version() -> None:
    result = run_cli("--version")
    assert result.returncode == 0
    assert result.stdout == f"fairbench {__version__}\n"


# ------------------------------------------------------------------ overrides


def test_overrides_address_tenants_by_id_or_index_and_workloads_by_name(work: Path) -> None:
    raw = yaml.safe_load((work / "tiny.yaml").read_text(encoding="utf-8"))
    assert resolve_path(raw, "tenants.b.team.weight") == ["tenants", 1, "weight"]  # dotted id
    assert resolve_path(raw, "tenants.0.weight") == ["tenants", 0, "weight"]
    assert resolve_path(raw, "workloads.chat.output_tokens") == [
        "workloads",
        "chat",
        "output_tokens",
    ]
    data = apply(
        raw,
        {"tenants.b.team.weight": 3, "tenants.0.slo_class": "batch", "scheduler.policy": "vtc"},
    )
    assert data["tenants"][1]["weight"] == 3
    assert data["tenants"][0]["slo_class"] == "batch"
    assert raw["tenants"][1]["weight"] == 2, "apply copies; the document is untouched"
    with pytest.raises(ScenarioError, match=r"use an id \(a, b\.team\) or an index 0\.\.1"):
        resolve_path(raw, "tenants.nobody.weight")
    with pytest.raises(ScenarioError, match="not a mapping"):
        resolve_path(raw, "tenants.a.mix.x")

    _, scn = scenario_with(
        work / "tiny.yaml",
        ["tenants.b.team.weight=3", "workloads.chat.output_tokens=16", "tenants.0.weight=0.5"],
        "--set",
    )
    assert [t.weight for t in scn.tenants] == [0.5, 3.0]
    assert scn.workloads["chat"].output_tokens.value == 16  # type: ignore[union-attr]


def test_an_overridden_scenario_is_validated_like_the_file(work: Path) -> None:
    with pytest.raises(UsageFailure) as caught:
        scenario_with(work / "tiny.yaml", ["run.duration=1s", "run.warmup=2s"], "--b")
    (line,) = caught.value.lines
    assert line.startswith("--b run.warmup=2s: run.warmup: ")


def test_the_incident_fifo_comment_is_a_command_that_works() -> None:
    path = REPO / "scenarios" / "incident-fifo.yaml"
    comment = " ".join(
        line.lstrip("# ").strip()
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.startswith("#")
    )
    command = re.search(r"`fairbench ab (\S+) (.*?)`", comment)
    assert command is not None, "the comment suggests an A/B command"
    args = command.group(2).split()
    arms: dict[str, list[str]] = {"--a": [], "--b": []}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        arms[flag].append(value)
    scenarios = {
        flag: scenario_with(REPO / command.group(1), items, flag)[1] for flag, items in arms.items()
    }
    assert scenarios["--a"].scheduler["policy"] == "fifo"
    assert scenarios["--b"].scheduler["policy"] == "dwrr"


# ------------------------------------------------------------------ confidence, compare


def test_confidence_is_one_percentage_everywhere() -> None:
    assert confidence_level("95") == pytest.approx(0.95)
    assert confidence_level("99.9%") == pytest.approx(0.999)
    for bad in ("0.95", "99,5", "40", "lots"):
        with pytest.raises(UsageFailure):
            confidence_level(bad)


def test_compare_and_ab_agree_and_compare_suggests_only_its_own_flags(work: Path) -> None:
    out = work / "ab-run"
    ab = run_cli(
        "ab", str(work / "tiny.yaml"), "--a", "scheduler.policy=fifo", "--b",
        "scheduler.policy=dwrr", "--iterations", "1", "--confidence", "99", "--resamples", "200",
        "--out", str(out),
        timeout=300,
    )  # fmt: skip
    assert ab.returncode == 0, ab.stderr
    assert "99% CI" in ab.stdout
    saved = json.loads((out / "comparison.json").read_text(encoding="utf-8"))
    assert saved["confidence"] == pytest.approx(0.99)
    pair = [str(out / "A-0"), str(out / "B-0"), "--resamples", "200"]
    compare = run_cli("compare", *pair, "--confidence", "99")
    assert compare.returncode == 0, compare.stderr
    assert "99% CI" in compare.stdout
    assert "--iterations" not in compare.stdout  # an ab flag
    assert "--a RUN --b RUN" in " ".join(compare.stdout.split())
    as_json = run_cli("compare", *pair, "--json")
    payload = json.loads(as_json.stdout)
    assert "--iterations" not in payload["design"] and payload["confidence"] == 0.95
    # the same level gives the same intervals through either command
    again = run_cli("compare", *pair, "--json", "--confidence", "99")
    assert json.loads(again.stdout)["verdicts"] == saved["verdicts"]
    # one B run cannot stand in for two A runs of its plan: refused in one line, exit 2
    twice = run_cli("compare", "--a", pair[0], "--a", pair[0], "--b", pair[1])
    assert twice.returncode == 2, twice.stderr
    assert "2 A run(s) but 1 B run(s)" in twice.stderr and "Traceback" not in twice.stderr
    assert len(twice.stderr.strip().splitlines()) == 1, twice.stderr


def test_sweep_with_one_objective_ranks_the_points(work: Path) -> None:
    out = work / "sweep-one"
    result = run_cli(
        "sweep", str(work / "sweep.yaml"), "--objective", "goodput:max", "--out", str(out),
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "best" in result.stdout and "scheduler.policy=fifo" in result.stdout
    assert len(json.loads((out / "sweep.json").read_text(encoding="utf-8"))) == 2


# ------------------------------------------------------------------ knee


def test_knee_on_a_monotone_threshold_is_verified() -> None:
    calls: list[float] = []

    def holds(x: float) -> bool:
        calls.append(x)
        return x <= 3.7

    result = search_knee(holds, 0.5, 16.0, tolerance=0.02)
    assert result.best is not None and 3.7 / 1.02 <= result.best <= 3.7
    assert result.monotone and result.verified and result.note is None
    assert [x for x, _ in result.trail] == calls
    assert result.roles[-2:] == ["verify", "verify"]
    assert result.trail[-2] == (result.best, True), "the answer is evaluated again"
    assert result.trail[-1][0] == pytest.approx(result.best * 1.02)
    assert knee(holds, 0.5, 16.0, tolerance=0.02)[0] == result.best


def test_knee_says_when_attainment_is_not_monotone() -> None:
    # Attainment dips in two narrow bands (around x1.41, where bisection first probes, and
    # x1.335-1.36) and holds everywhere else up to x3: bisection settles on the first edge it
    # meets (x1.30), and the step above it (x1.37) holds, which bisection alone never sees.
    def holds(x: float) -> bool:
        return x <= 3.0 and not (1.41 < x < 1.42 or 1.335 < x < 1.36)

    result = search_knee(holds, 0.25, 8.0, tolerance=0.05)
    assert not result.monotone and not result.verified
    assert result.note is not None and "not monotone" in result.note
    assert result.best is not None and result.best < 1.335
    assert result.highest_held is not None and result.highest_held > 1.36
    held_above_a_miss = [
        x for x, ok in result.trail if ok and x > min(y for y, ok2 in result.trail if not ok2)
    ]
    assert held_above_a_miss, "the trail shows the contradiction"


def test_knee_that_does_not_hold_twice_moves_down() -> None:
    seen: dict[float, int] = {}

    def holds(x: float) -> bool:  # deterministic threshold, but the answer fails its re-run
        seen[x] = seen.get(x, 0) + 1
        return x <= 2.0 and seen[x] == 1

    result = search_knee(holds, 0.5, 8.0, tolerance=0.05)
    assert not result.monotone
    assert result.note is not None and "held on one run and missed on another" in result.note
    first_answer = result.trail[-2][0]
    assert result.best is not None and result.best < first_answer


def test_knee_when_even_low_misses_or_high_holds() -> None:
    none = search_knee(lambda x: False, 1, 2)
    assert none.best is None and len(none.trail) == 1
    top = search_knee(lambda x: True, 1, 2)
    assert top.best == 2 and not top.verified and "raise --high" in (top.note or "")
