"""`fairbench fidelity REAL SIM` (issue #16, item 3): the simulator's error against a run of the
same plan, per tenant and class, with a noise floor.

What would break if it were wrong: two identical runs would show an error; a slower profile
would show latency errors of the wrong sign (or none); throughput, which the plan fixes when
every request finishes, would move; runs of different plans would be compared instead of
refused; the judgement against the noise floor would not follow |error| ≤ noise.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from fairbench.decide.fidelity import FidelityRefused, fidelity
from fairbench.pipeline import run_scenario
from fairbench.run import RunOptions
from fairbench.workload.loading import parse_scenario
from reference_scheduler.core.costmodel import PROFILE_DIR
from tests.cli import run_cli


def scenario(profile: str | Path, seed: int = 1) -> dict[str, Any]:
    """Chat (priority 0) against a document flood on the simulated vLLM: queues form, so the
    step costs show in every latency."""
    return {
        "name": "fidelity-two-tenants",
        "workloads": {
            "chat": {"endpoint": "chat", "prompt_tokens": 200, "output_tokens": 40},
            "doc": {
                "endpoint": "completions",
                "prompt_tokens": {"dist": "uniform", "low": 1000, "high": 3000},
                "output_tokens": {"dist": "uniform", "low": 50, "high": 150},
            },
        },
        "tenants": [
            {"id": "chat", "slo_class": "interactive", "mix": "chat",
             "arrival": {"process": "poisson", "rate": "4/s"}},
            {"id": "flood", "slo_class": "batch", "mix": "doc",
             "arrival": {"process": "poisson", "rate": "12/s"}},
        ],
        "run": {"duration": "12s", "seed": seed, "grace": "10min"},
        "target": {"kind": "sim"},
        "scheduler": {"engine": "vllm", "policy": "priority", "profile": str(profile),
                      "kv_cache_tokens": 40000},
    }  # fmt: skip


def run(tmp: Path, name: str, profile: str | Path, seed: int = 1) -> Path:
    scn = parse_scenario(scenario(profile, seed), "test", tmp)
    run_scenario(scn, RunOptions(out=tmp / name, workers=1))
    return tmp / name


def slower_profile(tmp: Path, factor: float) -> Path:
    """The shipped H100 profile with every step `factor` times as long."""
    data = yaml.safe_load((PROFILE_DIR / "h100-llama3-8b.yaml").read_text(encoding="utf-8"))
    data.pop("fit", None)
    for key in ("a", "b", "c", "floor", "d", "e", "f"):
        data[key] = data[key] * factor
    path = tmp / f"slow-{factor}.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("fidelity")
    return {
        "base": run(tmp, "base", "h100-llama3-8b"),
        "again": run(tmp, "again", "h100-llama3-8b"),
        "slow": run(tmp, "slow", slower_profile(tmp, 1.25)),
        "other-plan": run(tmp, "other-plan", "h100-llama3-8b", seed=2),
    }


def test_identical_runs_have_zero_error(runs: dict[str, Path]) -> None:
    fid = fidelity(runs["base"], runs["again"])
    assert fid.rows and fid.finite()
    assert {r.figure for r in fid.rows} >= {
        "ttft_p50", "ttft_p99", "tpot_p50", "itl_p99", "e2e_p50", "e2e_p99", "throughput",
        "service_difference", "isolation",
    }  # fmt: skip
    for group in ("tenant", "class"):
        assert {r.key for r in fid.rows if r.group == group} == (
            {"chat", "flood"} if group == "tenant" else {"interactive", "batch"}
        )
    assert all(r.error_pct == 0 for r in fid.finite())
    assert fid.mape() == 0


def test_a_slower_profile_shows_positive_latency_errors(runs: dict[str, Path]) -> None:
    fid = fidelity(runs["base"], runs["slow"])
    for key in ("chat", "flood"):
        for figure in ("ttft_p50", "tpot_p50", "e2e_p50", "e2e_p99"):
            row = fid.get(f"{figure}.tenant.{key}")
            assert row is not None and row.sim > row.real, (figure, key)
            assert row.error_pct > 0
    # every step 25% longer: TPOT (steps per token) is ~25% longer, not 2× and not 2%
    tpot = fid.get("tpot_p50.tenant.chat")
    assert tpot is not None and 10 < tpot.error_pct < 40
    # every request still finishes: the plan fixes throughput
    assert fid.get("throughput.tenant.flood").error_pct == pytest.approx(0, abs=1e-9)  # type: ignore[union-attr]
    # MAPE is the mean of the absolute errors
    errors = [abs(r.error_pct) for r in fid.finite()]
    assert fid.mape() == pytest.approx(sum(errors) / len(errors))
    # reversed, the signs flip
    back = fidelity(runs["slow"], runs["base"])
    assert back.get("e2e_p50.tenant.chat").error_pct < 0  # type: ignore[union-attr]


def test_noise_floor_judges_each_error(runs: dict[str, Path]) -> None:
    # the "second real run" is the slow one: a wide floor, so the identical sim is within it
    fid = fidelity(runs["base"], runs["again"], noise_dir=runs["slow"])
    row = fid.get("e2e_p50.tenant.flood")
    assert row is not None and row.noise_pct > 0
    assert row.judged() == "within noise"
    # and the slow sim judged against a zero floor (an identical second run) is beyond it
    fid = fidelity(runs["base"], runs["slow"], noise_dir=runs["again"])
    row = fid.get("e2e_p50.tenant.flood")
    assert row is not None and row.noise_pct == 0 and row.judged() == "beyond noise"
    for r in fid.finite():
        expected = "within noise" if abs(r.error_pct) <= r.noise_pct else "beyond noise"
        assert r.judged() == expected


def test_the_terminal_table_is_the_pages_rows_with_judgements_coloured(
    runs: dict[str, Path],
) -> None:
    """`fairbench fidelity`'s table, built without the command: a row per figure and group, the
    page's cells, and each judgement in its colour."""
    from fairbench.report.fidelity import fidelity_table, head, intro

    fid = fidelity(runs["base"], runs["slow"], noise_dir=runs["again"])
    table = fidelity_table(fid)
    assert [c.header for c in table.columns] == ["group", *head(fid)]
    assert table.row_count == len(fid.rows) and table.caption == intro(fid)
    judged = list(table.columns[-1].cells)
    assert "[red]beyond noise[/]" in judged
    assert all(c.startswith(("[green]", "[red]", "[white]")) for c in judged)


def test_different_plans_are_refused(runs: dict[str, Path]) -> None:
    with pytest.raises(FidelityRefused, match="plan_digest differs"):
        fidelity(runs["base"], runs["other-plan"])
    with pytest.raises(FidelityRefused, match="plan_digest differs"):
        fidelity(runs["base"], runs["again"], noise_dir=runs["other-plan"])


def test_cli_writes_json_markdown_and_page(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "fid"
    proc = run_cli(
        "fidelity", str(runs["base"]), str(runs["slow"]), "--noise", str(runs["again"]),
        "--out", str(out), timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = json.loads((out / "fidelity.json").read_text())
    assert data["mape_pct"] > 0 and data["beyond_noise"] > 0
    names = {r["name"] for r in data["rows"]}
    assert {"ttft_p99.tenant.chat", "e2e_p50.class.batch", "itl_p99"} <= names
    assert "| ttft_p99 |" in (out / "fidelity.md").read_text()
    page = (out / "fidelity.html").read_text()
    assert page.count('class="plot js-plotly-lazy"') == 6 and "real solid, sim dotted" in page
    assert (out / "plotly.min.js").is_file()


def test_cli_refuses_mismatched_plans_in_one_line(runs: dict[str, Path], tmp_path: Path) -> None:
    proc = run_cli(
        "fidelity", str(runs["base"]), str(runs["other-plan"]), "--out", str(tmp_path / "x"),
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "plan_digest differs" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    proc = run_cli("fidelity", str(runs["base"]), str(tmp_path / "missing"), timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
