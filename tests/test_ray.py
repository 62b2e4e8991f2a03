"""`fairbench run --ray`: one plan sharded over Ray actors on two nodes, one clock, nothing lost.

The cluster is real but local: `ray.cluster_utils.Cluster` with a head and a second node on
127.0.0.1, each with a custom resource of its own, so placing actor k on node k is Ray's doing.
The clock arithmetic is tested without Ray. Where ray is not importable the cluster tests skip
with the reason (`pip install -e '.[dev]'`; .ci/run installs it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

# Ray rewrites 127.0.0.1 to the host's routable address unless told it is not a cluster host;
# the test cluster lives on loopback only. Set before ray is imported (and for the CLI's child).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

from fairbench.analysis.actors import actor_health
from fairbench.run.ray_actor import ActorRun
from fairbench.run.ray_clock import ClockOffset, drift, estimate_offset, to_driver_timeline
from fairbench.run.ray_sync import clock_reasons
from fairbench.workload.loading import parse_scenario
from tests.cli import run_cli
from tests.ray_loopback import ray_args, two_nodes

NODES = ("fb_node_a", "fb_node_b")


def scenario(
    tmp_path: Path, rate: str = "30/s", duration: str = "3s", lag_budget: str = "10s"
) -> Path:
    data = {
        "name": "ray-e2e",
        "workloads": {"chat": {"endpoint": "chat", "prompt_tokens": 40, "output_tokens": 8}},
        "tenants": [
            {"id": "alpha", "mix": "chat", "arrival": {"process": "poisson", "rate": rate}},
            {"id": "beta", "mix": "chat", "arrival": {"process": "constant", "rate": "10/s"}},
        ],
        "run": {"duration": duration, "seed": 5, "grace": "5s", "timeout": "20s"},
        # the machine running the suite is shared and small: judge the plumbing, not its load
        # (beside a CPU-bound process two actors sent 2 s late; tests/test_health.py judges lag)
        "health": {
            "max_send_lag_p99": lag_budget,
            "max_receive_error_p99": "10s",
            "min_rate_ratio": 0.5,
        },
        "target": {"kind": "reference"},
        "scheduler": {"policy": "vtc", "profile": "h100-llama3-8b"},
    }
    path = tmp_path / "ray.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# --------------------------------------------------------------------------- the clock, no Ray


def test_offset_comes_from_the_tightest_round_trips_and_is_within_its_bound() -> None:
    rng = np.random.default_rng(1)
    true = 7_000_000_123  # the actor's clock runs this far ahead of the driver's
    samples = []
    t = 0
    for _ in range(40):
        out, back = (int(x) for x in rng.exponential(400_000, 2))  # queueing, either way
        if len(samples) == 3:
            out, back = 5_000_000, 100  # one lopsided, slow trip: its midpoint is 2.5 ms off
        samples.append((t, t + out + true, t + out + back))
        t += 10_000_000
    est = estimate_offset(samples, k=5)
    assert abs(est.offset_ns - true) <= est.uncertainty_ns
    assert est.kept == 5 and est.samples == 40
    rtts = sorted(r - s for s, _, r in samples)
    assert est.rtt_min_ns == rtts[0] and est.uncertainty_ns == (rtts[4] + 1) // 2
    with pytest.raises(ValueError, match="no clock samples"):
        estimate_offset([])


def test_drift_within_the_estimates_noise_is_no_drift_and_a_real_one_widens_the_bound() -> None:
    before = ClockOffset(1_000_000, 200_000, 300_000, 40, 5)
    still = drift(before, ClockOffset(1_150_000, 100_000, 150_000, 40, 5))
    assert not still.significant and still.uncertainty_ns == 200_000
    moved = drift(before, ClockOffset(4_000_000, 100_000, 150_000, 40, 5))
    assert moved.significant and moved.drift_ns == 3_000_000
    assert moved.uncertainty_ns == 200_000 + 3_000_000
    assert drift(before, None).uncertainty_ns == 200_000  # an actor that died: the start bound


def test_a_significant_drift_is_corrected_linearly_and_noise_is_left_alone() -> None:
    before = ClockOffset(0, 100_000, 150_000, 40, 5)
    span = 100_000_000_000  # 100 s
    row = {"t_intended_ns": span // 2, "t_sent_ns": span // 2 + 1_000, "t_done_ns": None}
    ran_ahead = drift(before, ClockOffset(2_000_000, 100_000, 150_000, 40, 5))  # +2 ms in 100 s
    fixed = to_driver_timeline(dict(row), ran_ahead, span)
    assert fixed["t_intended_ns"] == span // 2 - 1_000_000  # half-way: half the drift
    assert fixed["t_sent_ns"] - fixed["t_intended_ns"] == 1_000  # a 1 us lag stays 1 us
    assert fixed["t_done_ns"] is None
    noise = drift(before, ClockOffset(150_000, 100_000, 150_000, 40, 5))
    assert to_driver_timeline(dict(row), noise, span) == row


def test_a_clock_bound_past_the_send_lag_budget_makes_the_run_invalid_naming_the_actor(
    tmp_path: Path,
) -> None:
    doc = yaml.safe_load(scenario(tmp_path, lag_budget="250ms").read_text())
    scn = parse_scenario(doc)
    tight = ActorRun(0, None, node={"hostname": "gen-a"})
    tight.before = tight.after = ClockOffset(0, 1_000_000, 2_000_000, 40, 5)
    loose = ActorRun(1, None, node={"hostname": "gen-b"})
    loose.before = ClockOffset(0, 300_000_000, 600_000_000, 40, 5)
    reasons = clock_reasons([tight, loose], scn)
    assert len(reasons) == 1 and "ray actor 1 (gen-b)" in reasons[0]
    assert "300.00 ms > the 250 ms send-lag budget" in reasons[0]


def test_an_actor_that_fell_behind_is_named() -> None:
    scn = parse_scenario(
        {
            "name": "h",
            "workloads": {"w": {"endpoint": "chat", "prompt_tokens": 4, "output_tokens": 2}},
            "tenants": [
                {"id": "t", "mix": "w", "arrival": {"process": "constant", "rate": "10/s"}}
            ],
            "run": {"duration": "2s"},
            "target": {"kind": "sim"},
        }
    )
    n = 40
    intended = np.arange(n) * 50_000_000
    worker = np.arange(n) % 2
    lag = np.where(worker == 1, 40_000_000, 100_000)  # actor 1 sends 40 ms late
    frame = pd.DataFrame(
        {
            "request_id": np.arange(n),
            "tenant": "t",
            "t_intended_ns": intended,
            "t_sent_ns": intended + lag,
            "worker": worker,
            "status": "ok",
        }
    )
    actors = [{"worker": k, "hostname": f"h{k}", "status": "finished"} for k in (0, 1)]
    per_actor, reasons = actor_health(frame, scn, actors, None)
    assert [a["valid"] for a in per_actor] == [True, False]
    assert len(reasons) == 1 and reasons[0].startswith("ray actor 1 (h1): generator fell behind")


def test_salvage_waits_for_the_orphaned_generator_and_returns_whole_lines(
    tmp_path: Path,
) -> None:
    import subprocess
    import sys

    from fairbench.run.ray_actor import salvage

    node_dir = tmp_path / "node"
    node_dir.mkdir()
    journal = node_dir / "journal-1.jsonl"
    journal.write_bytes(b'{"request_id": 1}\n{"request_id": 3}\n{"request_')  # a torn last line
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    try:
        assert salvage(str(journal), proc.pid, wait_s=30) == (
            b'{"request_id": 1}\n{"request_id": 3}\n'
        )
        assert proc.poll() is not None  # it waited for the generator to end
    finally:
        proc.wait()
    assert not node_dir.exists()  # and left no copy of the run on the node


def test_without_ray_the_flag_says_how_to_install_it(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.cli import REPO

    code = "import sys; sys.modules['ray'] = None; from fairbench.cli import main; main()"
    out = tmp_path / "no-ray"
    args = ["run", str(scenario(tmp_path)), "--ray", "auto", "--out", str(out), "--quiet"]
    result = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "--ray needs the ray package: pip install 'fairbench-llm[ray]' (or pip install 'ray>=2.40')"
    ]
    assert not out.exists()  # refused before anything was planned or written


# --------------------------------------------------------------------------- a loopback cluster

ray = pytest.importorskip("ray", reason="ray is not installed: pip install -e '.[dev]'")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with two_nodes(NODES) as c:
        yield c


def _ray_args(cluster: Any) -> list[str]:
    return ray_args(cluster, NODES)


def test_two_actors_on_two_nodes_give_the_single_process_plan_and_accounting(
    tmp_path: Path, cluster: Any
) -> None:
    path = scenario(tmp_path)
    single, sharded = tmp_path / "single", tmp_path / "ray"
    one = run_cli("run", str(path), "--out", str(single), "--quiet", "--workers", "1")
    assert one.returncode == 0, one.stderr + one.stdout
    two = run_cli(
        "run", str(path), "--out", str(sharded), "--quiet", "--workers", "2", *_ray_args(cluster)
    )
    assert two.returncode == 0, two.stderr + two.stdout
    a, b = (json.loads((d / "summary.json").read_text()) for d in (single, sharded))
    assert a["plan_digest"] == b["plan_digest"]
    assert a["accounting"] == b["accounting"] and b["accounting"]["holds"]
    header = json.loads((sharded / "run.json").read_text())
    # the driver's scraper reports as the local one does (before, Ray's report was dropped)
    local = json.loads((single / "run.json").read_text())["target"]
    assert "scrape" in local and header["target"]["scrape"].keys() == local["scrape"].keys()
    assert header["target"]["scrape_warnings"] == local["scrape_warnings"] == []
    actors = header["ray"]["actors"]
    assert [x["worker"] for x in actors] == [0, 1]
    assert len({x["node_id"] for x in actors}) == 2  # placed by resource: one per node
    assert header["ray"]["placement"] == {"resources": list(NODES)}
    for actor in actors:
        clock = actor["clock"]
        assert actor["status"] == "finished" and clock["before"]["kept"] >= 1
        assert clock["after"] is not None and clock["uncertainty_ns"] > 0
        # one machine, one CLOCK_MONOTONIC: the true offset is 0, and it lies within the bound
        assert abs(clock["before"]["offset_ns"]) <= clock["before"]["uncertainty_ns"]
        assert not clock["drift_corrected"]
    per_actor = header["generator_health"]["actors"]
    assert [x["worker"] for x in per_actor] == [0, 1]
    assert all(x["send_lag_ms"]["p99"] is not None for x in per_actor)
    assert all(x["event_loop_lag_ms"] is not None for x in per_actor)
    records = pd.read_parquet(sharded / "records.parquet")
    assert records["request_id"].is_unique and set(records["worker"]) == {0, 1}
    from fairbench.plan.model import load_plan

    offsets = load_plan(sharded / "plan.parquet").columns["offset_ns"]
    assert (records.sort_values("request_id")["t_intended_ns"].to_numpy() == offsets).all()


def test_a_killed_actor_loses_nothing_and_the_run_is_incomplete(
    tmp_path: Path, cluster: Any
) -> None:
    from fairbench.pipeline import run_scenario
    from fairbench.run import RunOptions

    scn = parse_scenario(yaml.safe_load(scenario(tmp_path, duration="4s").read_text()))
    out = tmp_path / "killed"
    killed: list[int] = []

    def progress(c: Any) -> None:
        if not killed and c.done >= 60:  # mid-run: some of its shard journalled, more to come
            ray.kill(ray.get_actor(f"fairbench-{out.name}-1"), no_restart=True)
            killed.append(c.done)

    options = RunOptions(
        out=out, workers=2, ray=cluster.address, ray_resources=NODES, progress=False
    )
    outcome = run_scenario(scn, options, progress)
    assert killed, "the run ended before the actor could be killed"
    summary, header = outcome.summary, json.loads((out / "run.json").read_text())
    assert summary["accounting"]["holds"]  # a record for every planned request, none twice
    assert summary["incomplete"] and header["status"] == "incomplete" and not summary["valid"]
    died = header["ray"]["actors"][1]
    assert died["status"] == "died" and header["ray"]["actors"][0]["status"] == "finished"
    assert sum(died["records_filled"].values()) > 0
    assert any(r.startswith("incomplete run: ray actor 1") for r in summary["invalid_reasons"])
    records = pd.read_parquet(out / "records.parquet")
    mine = records[records["worker"] == 1]
    # streamed, fetched from its node's journal afterwards, or filled in: every one of its shard
    got = died["records_streamed"] + died["records_salvaged"] + sum(died["records_filled"].values())
    assert got == len(mine) == len(range(1, header["planned"], 2))
    assert (mine["status"] == "ok").any()  # what it journalled before dying is real
    assert (mine["status"] == "cancelled").any()  # what it never sent, recorded as such
    assert mine.loc[mine["status"] != "ok", "error_detail"].str.contains("ray actor 1").all()
    assert (records[records["worker"] == 0]["status"] == "ok").all()


def test_ctrl_c_on_the_driver_stops_every_actor_and_keeps_every_record(
    tmp_path: Path, cluster: Any
) -> None:
    from fairbench.pipeline import run_scenario
    from fairbench.run import RunOptions

    scn = parse_scenario(yaml.safe_load(scenario(tmp_path, duration="6s").read_text()))
    out = tmp_path / "stopped"
    pressed: list[int] = []

    def progress(c: Any) -> None:  # Ctrl-C reaches the driver as KeyboardInterrupt
        if not pressed and c.done >= 20:
            pressed.append(c.done)
            raise KeyboardInterrupt

    options = RunOptions(
        out=out, workers=2, ray=cluster.address, ray_resources=NODES, progress=False
    )
    outcome = run_scenario(scn, options, progress)
    assert pressed and outcome.stopped and outcome.exit_code == 130
    summary, header = outcome.summary, json.loads((out / "run.json").read_text())
    assert summary["accounting"]["holds"] and header["status"] == "complete"
    assert [a["status"] for a in header["ray"]["actors"]] == ["finished", "finished"]
    records = pd.read_parquet(out / "records.parquet")
    for k in (0, 1):  # both actors stopped early: each has unsent requests recorded
        mine = records[records["worker"] == k]
        assert (mine["status"] == "ok").any() and (mine["status"] == "cancelled").any()
    assert "the run was stopped before its schedule ended" in summary["invalid_reasons"]


def test_a_resource_the_cluster_lacks_is_one_line_naming_the_flag(
    tmp_path: Path, cluster: Any
) -> None:
    path = scenario(tmp_path)
    out = tmp_path / "nowhere"
    args = ["--ray", cluster.address, "--ray-resource", "fb_no_such_node"]
    result = run_cli("run", str(path), "--out", str(out), "--quiet", "--workers", "2", *args)
    assert result.returncode == 2, result.stderr + result.stdout
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if "--ray-resource" in line]
    assert (
        len(lines) == 1
        and "fb_no_such_node: 2 actors need 2 unit(s), the cluster offers 0; start" in lines[0]
    )


def test_a_lost_node_leaves_its_shard_recorded_by_the_driver(tmp_path: Path, cluster: Any) -> None:
    """The node itself goes (its raylet, actor and generator with it): nothing can be fetched
    from it, so the driver records the rest of the shard: sent ones as errors, the rest cancelled.
    """
    from fairbench.pipeline import run_scenario
    from fairbench.run import RunOptions

    node = cluster.add_node(node_ip_address="127.0.0.1", num_cpus=1, resources={"fb_node_c": 1})
    scn = parse_scenario(yaml.safe_load(scenario(tmp_path, duration="4s").read_text()))
    out = tmp_path / "lost"
    removed: list[int] = []

    def progress(c: Any) -> None:
        if not removed and c.done >= 60:
            removed.append(c.done)
            cluster.remove_node(node, allow_graceful=False)

    options = RunOptions(
        out=out, workers=2, ray=cluster.address, ray_resources=(NODES[0], "fb_node_c")
    )
    outcome = run_scenario(scn, options, progress)
    assert removed
    summary, header = outcome.summary, json.loads((out / "run.json").read_text())
    assert summary["accounting"]["holds"] and summary["incomplete"]
    lost = header["ray"]["actors"][1]
    assert lost["status"] == "died" and lost["salvage"].startswith("failed")
    # run.json names where the lost node kept its journal (here: this machine's temp dir)
    import shutil

    shutil.rmtree(Path(lost["journal"]).parent, ignore_errors=True)
    assert lost["records_salvaged"] == 0 and lost["records_filled"].get("cancelled", 0) > 0
    records = pd.read_parquet(out / "records.parquet")
    mine = records[records["worker"] == 1]
    filled = mine[mine["error_detail"].fillna("").str.contains("ray actor 1 died")]
    assert len(filled) == sum(lost["records_filled"].values())
    assert set(filled["status"]) == {"cancelled"}
    # one in flight when the actor died is censored at the last time it was heard from: it was
    # sent and stays in the latency population; one never sent has no send time
    flight = filled[filled["error_detail"].str.contains("in flight")]
    assert flight["t_sent_ns"].notna().all()
    assert (flight["t_end_ns"] >= flight["t_intended_ns"]).all()
    assert filled.loc[~filled.index.isin(flight.index), "t_sent_ns"].isna().all()
