"""fairbench explain (issue 34): the shift, its components and causes, on simulated runs.

The runs are scenarios/incident-q1.yaml as shipped (20 minutes, ~28,600 requests), each cause
switched on by the override its header documents, read from the file, so the test runs what the
docs show. explain was built on seeds 1-3; it is held to its ranking on seeds it was not built
on (RANKED: 4-6 and 11-13), and to `within_noise` for two seeds of the baseline; the other
checks use HELD_OUT (11-13). Runtime: 24 simulated runs and 23 explains, 87 s wall, 51 s
CPU, at load 3 on two cores.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from fairbench.analysis.explain import explain
from fairbench.cli.inputs import apply_overrides
from fairbench.plan.materialize import materialize
from fairbench.run.records import records_frame
from fairbench.targets.sim import run_sim
from fairbench.workload.loading import parse_scenario, read_yaml

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "incident-q1.yaml"
HELD_OUT = (11, 12, 13)
RANKED = (4, 5, 6, *HELD_OUT)  # seeds explain was not built on
CAUSES = ("priority_without_fairness", "kv_transfer_variance", "slo_mismatch")


def _overrides() -> dict[str, str]:
    """The header's `(n) [cause]  --set PATH=VALUE` lines, by cause."""
    found = {}
    for line in SCENARIO.read_text(encoding="utf-8").splitlines():
        match = re.match(r"#\s+\(\d\) \[(\w+)\]\s+--set '?(.+?)'?$", line)
        if match:
            found[match.group(1)] = match.group(2)
    return found


@functools.cache
def _run(seed: int, cause: str | None = None) -> pd.DataFrame:
    raw = read_yaml(SCENARIO.read_text(encoding="utf-8"))
    if cause is not None:
        raw, _ = apply_overrides(raw, [_overrides()[cause]], "--set")
    scn = parse_scenario(raw)
    rows, _ = run_sim(materialize(scn, seed), scn)
    return records_frame(rows)


@functools.cache
def _explained(seed: int, cause: str) -> dict[str, Any]:
    return explain(_run(seed), _run(seed, cause))


def _names(out: dict[str, Any]) -> list[str]:
    return [c["name"] for c in out["causes"]]


def test_the_header_documents_one_override_per_cause() -> None:
    assert set(_overrides()) == set(CAUSES)


@pytest.mark.parametrize(("a", "b"), [(11, 12), (12, 13)])
def test_one_configuration_two_seeds_is_within_noise(a: int, b: int) -> None:
    out = explain(_run(a), _run(b))
    assert not out["shift"]["paired"]  # two plans: the independent (drift) interval
    assert _names(out)[0] == "within_noise"


def test_the_same_run_twice_has_no_shift() -> None:
    base = _run(HELD_OUT[0])
    out = explain(base, base.copy())
    assert out["shift"]["paired"] and out["shift"]["relative"] == 0
    assert _names(out)[0] == "within_noise"
    assert all(c["share"] == 0 for c in out["causes"] if c["name"] != "within_noise")


@pytest.mark.parametrize("seed", RANKED)
@pytest.mark.parametrize("cause", CAUSES)
def test_each_cause_ranks_first_on_held_out_seeds(cause: str, seed: int) -> None:
    """Ranked first among the causes; the shift itself may read within_noise on a seed whose
    tail moved less (its interval is reported, and ranks first then, as it should)."""
    out = _explained(seed, cause)
    ranked = [n for n in _names(out) if n != "within_noise"]
    assert ranked[0] == cause, out["causes"]
    assert out["shift"]["relative"] > 0


@pytest.mark.parametrize("seed", HELD_OUT)
def test_priority_raises_the_queue_length_variance(seed: int) -> None:
    """The incident's one server-side signal: the waiting queue's variance rose (x1.8)."""
    assert _explained(seed, "priority_without_fairness")["queue_length"]["variance_ratio"] > 1


@pytest.mark.parametrize("seed", HELD_OUT)
def test_kv_stalls_grow_the_transfer_component(seed: int) -> None:
    out = _explained(seed, "kv_transfer_variance")
    assert out["components"]["kv_transfer"]["ci_low_ms"] > 0
    for policy in ("priority_without_fairness", "slo_mismatch"):  # a policy leaves the link be
        assert abs(_explained(seed, policy)["components"]["kv_transfer"]["growth_ms"]) < 5


@pytest.mark.parametrize("cause", [None, "kv_transfer_variance"])
def test_components_sum_to_ttft_in_every_record(cause: str | None) -> None:
    """Queue + prefill + KV transfer + decode wait + the rest is TTFT; the rest (front end and
    the decode pool's first step) is positive and one decode step's order (70B TP8: ~12 ms).
    The exact form (the rest is the decode pool's first step, to the ns) is
    tests/test_disaggregation.py's."""
    df = _run(HELD_OUT[0], cause)
    ok = df[df["status"] == "ok"]
    ttft = (ok["t_first_token_ns"] - ok["t_intended_ns"]).astype(float)
    parts = ok["queue_time_ns"] + ok["prefill_ns"] + ok["kv_transfer_ns"] + ok["decode_wait_ns"]
    rest = (ttft - parts).astype(float).to_numpy()
    assert len(rest) == len(df)
    assert (rest > 0).all() and (rest < 50e6).all()
    columns = ["queue_time_ns", "prefill_ns", "kv_transfer_ns", "decode_wait_ns"]
    assert (ok[columns] >= 0).all().all()


def test_cli_json_writes_explain_json(tmp_path: Path) -> None:
    from fairbench.cli.main import main
    from fairbench.run.records import write_records

    base = _run(HELD_OUT[0])
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


def test_priority_evidence_names_the_bursting_tenant() -> None:
    """Who overtook the tail, and how bursty: vip sends for 2 s of every 10, so its busiest
    second is ~5x its mean (10 s bins would read ~1.5x and hide the burst)."""
    evidence = next(
        c["evidence"]
        for c in _explained(HELD_OUT[0], "priority_without_fairness")["causes"]
        if c["name"] == "priority_without_fairness"
    )
    found = re.search(r"most overtaking by (\S+) .*busiest 1 s ([0-9.]+)×", evidence)
    assert found, evidence
    assert found.group(1) == "vip" and float(found.group(2)) >= 3, evidence
