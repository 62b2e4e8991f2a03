"""fairbench explain (issue 34): the shift, its components and causes, on simulated runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from fairbench.analysis.explain import explain
from fairbench.plan.materialize import materialize
from fairbench.run.records import records_frame
from fairbench.targets.sim import run_sim
from fairbench.workload.loading import parse_scenario

ROOT = Path(__file__).resolve().parent.parent
HEAVY = {"dist": "lognormal", "median": "2ms", "p99": "80ms"}


def _run(seed: int, **scheduler: Any) -> pd.DataFrame:
    raw = yaml.safe_load((ROOT / "scenarios" / "incident-q1.yaml").read_text())
    raw["run"]["duration"] = "90s"
    raw["tenants"][0]["phases"] = raw["tenants"][0]["phases"][:1]
    for key, value in scheduler.items():
        if key == "jitter":
            raw["scheduler"]["disaggregation"]["kv_transfer"]["jitter"] = value
        else:
            raw["scheduler"][key] = value
    scn = parse_scenario(raw)
    rows, _ = run_sim(materialize(scn, seed), scn)
    return records_frame(rows)


@pytest.fixture(scope="module")
def base() -> pd.DataFrame:
    return _run(21)


def _names(out: dict[str, Any]) -> list[str]:
    return [c["name"] for c in out["causes"]]


def test_one_configuration_two_seeds_is_within_noise(base: pd.DataFrame) -> None:
    out = explain(base, _run(22))
    assert not out["shift"]["paired"]  # two plans: the independent (drift) interval
    assert _names(out)[0] == "within_noise"


def test_the_same_run_twice_has_no_shift(base: pd.DataFrame) -> None:
    out = explain(base, base.copy())
    assert out["shift"]["paired"] and out["shift"]["relative"] == 0
    assert _names(out)[0] == "within_noise"
    assert all(c["share"] == 0 for c in out["causes"] if c["name"] != "within_noise")


@pytest.mark.parametrize(
    ("cause", "override"),
    [
        ("kv_transfer_variance", {"jitter": HEAVY}),
        ("priority_without_fairness", {"policy": "priority"}),
        ("slo_mismatch", {"policy": "fifo"}),
    ],
)
def test_each_cause_ranks_first_on_an_untuned_seed(
    base: pd.DataFrame, cause: str, override: dict[str, Any]
) -> None:
    """The scoring was looked at on seed 1 (the scenario's); this is seed 21, 90 s, one burst."""
    out = explain(base, _run(21, **override))
    ranked = [n for n in _names(out) if n != "within_noise"]
    assert ranked[0] == cause, out["causes"]


def test_kv_jitter_grows_the_transfer_component(base: pd.DataFrame) -> None:
    out = explain(base, _run(21, jitter=HEAVY))
    assert out["components"]["kv_transfer"]["ci_low_ms"] > 0


def test_components_sum_to_ttft_in_every_record(base: pd.DataFrame) -> None:
    ok = base[base["status"] == "ok"]
    ttft = ok["t_first_token_ns"] - ok["t_intended_ns"]
    parts = ok["queue_time_ns"] + ok["prefill_ns"] + ok["kv_transfer_ns"] + ok["decode_wait_ns"]
    rest = (ttft - parts).astype(float)
    assert (rest > 0).all()  # the front end and the decode pool's first step
    assert (rest < 0.2e9).all()


def test_cli_json_writes_explain_json(tmp_path: Path, base: pd.DataFrame) -> None:
    from fairbench.cli.main import main
    from fairbench.run.records import write_records

    a, b = tmp_path / "a", tmp_path / "b"
    for d, df in ((a, base), (b, base)):
        d.mkdir()
        write_records(
            df.astype(object).where(df.notna(), None).to_dict("records"), d / "records.parquet"
        )
    main(["explain", str(a), str(b), "--json"])  # exit 0: returns
    written = json.loads((b / "explain.json").read_text())
    assert set(written) >= {"metric", "shift", "components", "causes"}
    assert {"name", "share", "evidence"} <= set(written["causes"][0])
    with pytest.raises(SystemExit) as bad:
        main(["explain", str(a), str(b), "--metric", "tpot_p50"])
    assert bad.value.code == 2
