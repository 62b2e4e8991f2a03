"""The summary at fleet size (issue 35): the same summary.json, each figure's work done once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fairbench.analysis import censored
from fairbench.pipeline import run_scenario
from fairbench.run.rundir import RunOptions
from fairbench.workload.loading import parse_scenario


def small_sim(**run: Any) -> Any:
    """Two tenants in two classes on the simulated reference scheduler, near its capacity."""
    return parse_scenario(
        {
            "name": "small",
            "workloads": {
                "chat": {"endpoint": "chat", "prompt_tokens": 200, "output_tokens": 40},
                "long": {"endpoint": "completions", "prompt_tokens": 2000, "output_tokens": 80},
            },
            "tenants": [
                {
                    "id": "a",
                    "mix": "chat",
                    "slo_class": "interactive",
                    "arrival": {"process": "poisson", "rate": "30/s"},
                },
                {
                    "id": "b",
                    "mix": "long",
                    "slo_class": "batch",
                    "arrival": {"process": "poisson", "rate": "6/s"},
                },
            ],
            "run": {"duration": "20s", "warmup": "2s", "cooldown": "2s", "seed": 3, **run},
            "target": {"kind": "sim"},
            "scheduler": {"policy": "vtc", "profile": "h100-llama3-8b"},
        }
    )


def test_each_percentile_interval_is_computed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """latency_ci_ms and the `metrics` block ask for the same group's same percentile: it is
    estimated once (its dependence costs two FFTs of the group) and both read it."""
    seen: Counter[tuple[int, float, float]] = Counter()
    estimate = censored.quantile_estimate

    def counted(obs: censored.Observations, q: float, confidence: float = 0.95) -> Any:
        seen[(len(obs), float(obs.time.sum()), q)] += 1
        return estimate(obs, q, confidence)

    monkeypatch.setattr(censored, "quantile_estimate", counted)
    outcome = run_scenario(small_sim(), RunOptions(out=tmp_path / "run"))
    # p50 and p90 are asked for by those two alone (p99 also by the drift's and isolation's own
    # windows and arms, on other observations of the same size)
    twice = [k for k, n in seen.items() if n > 1 and k[2] in (0.5, 0.9)]
    assert seen and not twice, twice
    metrics = outcome.summary["metrics"]
    for tenant, block in outcome.summary["tenants"].items():  # the two read the same estimate
        ci = block["latency_ci_ms"]["ttft"]["p99"]
        entry = metrics["tenant"][tenant]["ttft_p99"]
        assert (entry["value"], entry["ci_low"], entry["ci_high"]) == (
            ci["value"],
            ci["ci_low"],
            ci["ci_high"],
        )


def _shares_by_mask(df: Any, weights: dict[str, float], window_s: float) -> list[list[float]]:
    """The report's service and fair shares per window as they were computed before issue 35:
    every window a mask over every request per tenant (the definition the faster code keeps)."""
    from fairbench.analysis import metrics as m

    tenants = sorted(weights)
    cost_all = m.service_tokens(df)
    served = df[cost_all > 0]
    start = (m.ttft_ns(served) + served["t_intended_ns"].to_numpy(np.float64)) / 1e9
    last = served["t_done_ns"].to_numpy(dtype=np.float64, na_value=np.nan)
    last = (
        np.where(
            np.isnan(last), served["t_last_token_ns"].to_numpy(np.float64, na_value=np.nan), last
        )
        / 1e9
    )
    start = np.where(np.isnan(start), last, start)
    end = np.maximum(last, start)
    known = np.isfinite(start) & np.isfinite(end)
    start, end = start[known], end[known]
    cost, names = cost_all[cost_all > 0][known], served["tenant"].to_numpy()[known]
    span = np.maximum(end - start, 1e-9)
    arrive = df["t_intended_ns"].to_numpy(float) / 1e9
    demand = df["prompt_tokens"].to_numpy(float) + 2 * df["max_tokens"].to_numpy(float)
    who = df["tenant"].to_numpy()
    rows = []
    for lo in np.arange(float(arrive.min()), float(end.max()) + 1e-9, window_s):
        hi = lo + window_s
        overlap = np.clip(np.minimum(end, hi) - np.maximum(start, lo), 0, None) / span
        instant = (end - start <= 0) & (start >= lo) & (start < hi)
        inside = np.where(end - start <= 0, instant.astype(float), overlap)
        got = np.array([(cost * inside)[names == t].sum() for t in tenants])
        want = [demand[(who == t) & (arrive >= lo) & (arrive < hi)].sum() for t in tenants]
        if got.sum() <= 0:
            continue
        fair = m.water_fill(np.maximum(np.array(want), got), np.ones(len(tenants)), got.sum())
        rows.append([float(lo), *(got / got.sum()).tolist(), *(fair / got.sum()).tolist()])
    return rows


def test_report_shares_are_the_masked_sums_to_the_last_bit(tmp_path: Path) -> None:
    """The report's service shares, per tenant apart instead of a mask per window, add the same
    numbers in the same order: equal bit for bit to the masked definition."""
    from fairbench.analysis.series import shares_over_time
    from fairbench.run.records import read_records

    outcome = run_scenario(small_sim(), RunOptions(out=tmp_path / "run"))
    df = read_records(outcome.run_dir / "records.parquet")
    weights = {"a": 1.0, "b": 1.0}
    got = shares_over_time(df, weights, 2.0)
    rows = [
        [t, *(got["service"][x][k] for x in "ab"), *(got["fair"][x][k] for x in "ab")]
        for k, t in enumerate(got["t"])
    ]
    assert rows and rows == _shares_by_mask(df, weights, 2.0)
    shuffled = df.sample(frac=1.0, random_state=1)  # arrivals out of order: the masked path
    assert shares_over_time(shuffled, weights, 2.0)["t"] == got["t"]


def test_a_simulated_run_never_imports_aiohttp_and_quiet_prints_the_run_directory(
    tmp_path: Path,
) -> None:
    """`fairbench run --quiet` of a sim target, in one process: the live path's HTTP client
    (aiohttp, about 0.3 s of imports) is never loaded, and stdout is the run directory alone
    (no tables; a VALID run has no warning to print)."""
    import subprocess
    import sys

    out = tmp_path / "run"
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['fairbench', 'run', 'scenarios/onoff.yaml', '--out', {str(out)!r}, "
        "'--quiet']\n"
        "try:\n"
        "    runpy.run_module('fairbench.cli', run_name='__main__')\n"
        "except SystemExit as done:\n"
        "    assert not done.code, done.code\n"
        "print('aiohttp' in sys.modules)\n"
    )
    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=repo, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == [f"run directory: {out}", "False"], proc.stdout


def test_quiet_keeps_what_is_loud() -> None:
    """INVALID with its reasons, warnings and a censored tail survive --quiet; the rest goes."""
    from fairbench.report.terminal import loud_lines, verdict_lines

    summary = json_of("tests/golden/run-vtc-overload.summary.json")
    summary["valid"], summary["invalid_reasons"] = False, ["send lag p99 9 ms > 5 ms"]
    summary["warnings"] = ["a warning"]
    loud = loud_lines(summary)
    assert loud[:2] == ["[bold red]INVALID[/]", "  [red]- send lag p99 9 ms > 5 ms[/]"]
    assert "[yellow]warning: a warning[/]" in loud
    assert any("TAIL CENSORED" in line for line in loud)  # vtc-overload's tail is censored
    assert not any(line.startswith("accounting") for line in loud)
    assert set(loud) < set(verdict_lines(summary))


def json_of(path: str) -> dict[str, Any]:
    import json

    return json.loads((Path(__file__).resolve().parents[1] / path).read_text(encoding="utf-8"))


def test_the_jobs_are_gone_before_the_record_columns_are_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """run_sim reads what the records need of the jobs (job_fields), drops them, then builds
    the columns (columns_of): at fleet size the jobs (960 MB) no longer sit beside the columns
    (600 MB) at the run's peak. The columns are record_columns' all the same."""
    import gc

    import fairbench.targets.sim as sim
    from fairbench.plan.materialize import materialize
    from reference_scheduler.core.job import Job

    def jobs_alive() -> int:
        return sum(isinstance(o, Job) for o in gc.get_objects())

    built = []
    columns_of = sim.columns_of

    def watched(fields: dict[str, Any], plan: Any) -> Any:
        built.append(jobs_alive())
        return columns_of(fields, plan)

    monkeypatch.setattr(sim, "columns_of", watched)
    scn = small_sim(duration="5s", warmup="0s", cooldown="0s")
    plan = materialize(scn, None)
    # jobs another test left alive count in both readings (in the whole suite, two did)
    gc.collect()
    before = jobs_alive()
    columns, _ = sim.run_sim(plan, scn, columns=True)
    assert len(plan) > 10 and len(built) == 1
    assert built[0] <= before  # none of this run's jobs is left
    assert len(columns["request_id"][0]) == len(plan)


@pytest.mark.parametrize(
    "ids",
    [[0, 1, 2, 3], [3, 0, 2, 1], [0, 1, 1, 3], [0, 2, 5, 7], [-1, 0, 1, 2], []],
)
def test_accounting_of_ids_in_order_is_np_unique_s(ids: list[int]) -> None:
    """check_accounting skips np.unique for ids already in order and distinct (a simulated
    run's): the same duplicates and missing counts as with it, whatever the ids."""
    import pyarrow as pa

    from fairbench.run.records import ARROW_SCHEMA, check_accounting

    table = pa.Table.from_pylist(
        [{"request_id": i, "status": "ok"} for i in ids], schema=ARROW_SCHEMA
    )
    got = check_accounting(4, table)
    unique = np.unique(np.array(ids, dtype=np.int64))
    assert got.duplicates == len(ids) - len(unique)
    assert got.missing == 4 - int(np.count_nonzero((unique >= 0) & (unique < 4)))
    assert got.counts["ok"] == len(ids)


def test_the_report_reads_its_columns_of_any_schema(tmp_path: Path) -> None:
    """The report reads only REPORT_COLUMNS, and of an older records file (no receive-delay
    column: schema 2) those it has; its values are pd.read_parquet's."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    from fairbench.report.run import REPORT_COLUMNS, report_records

    rows = {name: [1, 2] for name in REPORT_COLUMNS if name not in ("tenant", "slo_class")}
    rows.update(tenant=["a", "b"], slo_class=["x", "x"], status=["ok", "ok"], worker=[0, 0])
    del rows["rx_delay_ns"]
    path = tmp_path / "records.parquet"
    pq.write_table(pa.table(rows), str(path))
    got = report_records(path)
    assert list(got.columns) == [c for c in REPORT_COLUMNS if c != "rx_delay_ns"]
    pd.testing.assert_frame_equal(got, pd.read_parquet(path)[list(got.columns)])
