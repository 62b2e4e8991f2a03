"""`fairbench sweep`, `ab` and `knee` with `--ray`: every point a Ray task, the results those of
the local pool byte for byte (issue #18, item 5).

The cluster is `ray.cluster_utils.Cluster` on 127.0.0.1: a head and a second node, each with a
custom resource of its own, and `--ray-resource` naming both, so point k runs on node k mod 2.
To compare byte for byte, each command runs first on this machine, its output directory is
moved aside, and it runs again via Ray into the same path: every file but run.json (start and
end times) and report.html (which shows them) must then be the same, and so must the table on
stdout. Where ray is not importable the cluster tests skip with the reason.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

# Ray rewrites 127.0.0.1 to the host's routable address unless told it is not a cluster host;
# the test cluster lives on loopback only. Set before ray is imported (and for the CLI's child).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

from fairbench.decide.points import LocalRunner, PointJob, PointsFailed
from tests.cli import run_cli
from tests.ray_loopback import ray_args, two_nodes

NODES = ("fb_tasks_a", "fb_tasks_b")
TIMED = {"run.json", "report.html"}  # start and end times: the only files that may differ


def sim_scenario(tmp_path: Path, duration: str = "6s") -> Path:
    data = {
        "name": "ray-tasks",
        "workloads": {"c": {"prompt_tokens": 100, "output_tokens": 20}},
        "tenants": [
            {"id": "a", "mix": "c", "arrival": {"process": "poisson", "rate": 20}},
            {"id": "b", "mix": "c", "arrival": {"process": "poisson", "rate": 5}},
        ],
        "slo_classes": {"interactive": {"ttft": "2s"}},
        "run": {"duration": duration, "seed": 3},
        "target": {"kind": "sim"},
        "scheduler": {"policy": "fifo", "max_num_seqs": 4},
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def sweep_file(tmp_path: Path) -> Path:
    sim_scenario(tmp_path)
    spec = {
        "scenario": "s.yaml",
        "points": [
            {"scheduler.policy": "fifo"},
            {"scheduler.policy": "vtc"},
            {"scheduler.policy": "dwrr", "scheduler.max_num_seqs": 8},
        ],
        "parallel": 2,
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def files(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name not in TIMED
    }


def assert_same_tree(local: Path, remote: Path) -> None:
    a, b = files(local), files(remote)
    assert sorted(a) == sorted(b)
    differ = [name for name in a if a[name] != b[name]]
    assert not differ, f"differ between the local pool and Ray: {differ}"


def twice(tmp_path: Path, name: str, args: list[str], ray_args: list[str]) -> tuple[Any, Any]:
    """The command on this machine, then via Ray, each writing to tmp_path/name; the first
    output is moved to tmp_path/name-local. Returns both results."""
    out = tmp_path / name
    local = run_cli(*args, "--out", str(out), timeout=300)
    assert local.returncode == 0, local.stderr + local.stdout
    out.rename(tmp_path / f"{name}-local")
    remote = run_cli(*args, "--out", str(out), *ray_args, timeout=300)
    assert remote.returncode == 0, remote.stderr + remote.stdout
    return local, remote


# --------------------------------------------------------------------------- no Ray needed


def _explode(run_dir: Path) -> None:
    if run_dir.name == "p1":
        raise RuntimeError("the report writer broke")


def test_a_point_that_raises_fails_alone_in_one_line_and_the_others_keep_their_results(
    tmp_path: Path,
) -> None:
    path = sim_scenario(tmp_path, duration="2s")
    data = yaml.safe_load(path.read_text())
    jobs = [
        PointJob(f"point {k}", data, str(path), str(tmp_path / f"p{k}"), None, _explode)
        for k in range(3)
    ]
    seen: list[tuple[str, int, int]] = []
    results = LocalRunner().run(jobs, 1, lambda r, done, n: seen.append((r.job.label, done, n)))
    assert [r.job.label for r in results] == ["point 0", "point 1", "point 2"]
    assert seen == [("point 0", 1, 3), ("point 1", 2, 3), ("point 2", 3, 3)]
    assert [r.failed for r in results] == [False, True, False]
    assert results[1].error == "point 1: RuntimeError: the report writer broke"
    assert results[0].valid and (tmp_path / "p2" / "summary.json").is_file()
    failure = PointsFailed.of([results[1]])
    assert failure.exit_code == 1 and failure.lines == [results[1].error]


def cli_here(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str]]:
    """The CLI in this process (no interpreter start-up): its exit code and stderr lines."""
    from fairbench.cli.main import main

    with pytest.raises(SystemExit) as done:
        main(list(args))
    return int(done.value.code or 0), capsys.readouterr().err.strip().splitlines()


def test_ray_resource_without_ray_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines = cli_here(capsys, "sweep", str(sweep_file(tmp_path)), "--ray-resource", "x")
    assert (code, lines) == (2, ["--ray-resource needs --ray ADDRESS"])


# --------------------------------------------------------------------------- a loopback cluster

ray = pytest.importorskip("ray", reason="ray is not installed: pip install -e '.[dev]'")


@pytest.mark.parametrize(
    ("address", "says"),
    [
        ("127.0.0.1:1", "--ray 127.0.0.1:1: nothing answers there (connection refused); start a"),
        ("nonsense", "--ray nonsense: use auto, local or HOST:PORT (e.g. 10.0.0.5:6379)"),
    ],
)
def test_a_bad_ray_address_is_one_line_and_runs_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], address: str, says: str
) -> None:
    out = tmp_path / "out"
    code, lines = cli_here(
        capsys, "sweep", str(sweep_file(tmp_path)), "--out", str(out), "--ray", address
    )
    assert code == 2 and len(lines) == 1 and lines[0].startswith(says), lines
    assert not out.exists() and not ray.is_initialized()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with two_nodes(NODES) as c:
        yield c


def _ray_args(cluster: Any) -> list[str]:
    return ray_args(cluster, NODES)


def test_a_sweep_on_ray_equals_the_local_pool_byte_for_byte(tmp_path: Path, cluster: Any) -> None:
    args = ["sweep", str(sweep_file(tmp_path)), "--objective", "goodput:max"]
    local, remote = twice(tmp_path, "sweep", args, _ray_args(cluster))
    assert remote.stdout == local.stdout  # the table
    assert_same_tree(tmp_path / "sweep-local", tmp_path / "sweep")
    rows = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert [r["valid"] for r in rows] == [True, True, True]
    for k in range(3):  # every point came back whole, report included (written on the driver)
        point = tmp_path / "sweep" / f"point-{k:03d}"
        assert {"summary.json", "records.parquet", "run.json", "report.html"} <= {
            p.name for p in point.iterdir()
        }
    assert remote.stderr.count("done") == 3  # a line per point as it completes


def test_an_ab_on_ray_equals_the_local_run_byte_for_byte(tmp_path: Path, cluster: Any) -> None:
    path = sim_scenario(tmp_path)
    args = ["ab", str(path), "--a", "scheduler.policy=fifo", "--b", "scheduler.policy=vtc"]
    args += ["--iterations", "2", "--resamples", "200"]
    local, remote = twice(tmp_path, "ab", args, _ray_args(cluster))
    assert remote.stdout == local.stdout  # the verdict table
    assert_same_tree(tmp_path / "ab-local", tmp_path / "ab")
    comparison = json.loads((tmp_path / "ab" / "comparison.json").read_text())
    assert comparison["pairs"] == 2
    assert [Path(p).name for p in comparison["a"]] == ["A-0", "A-1"]
    for line in ("A seed 3: VALID", "B seed 3: VALID", "B seed 4: VALID", "A seed 4: VALID"):
        assert line in remote.stderr


def test_a_knee_on_ray_equals_the_local_search(tmp_path: Path, cluster: Any) -> None:
    path = sim_scenario(tmp_path, duration="4s")
    args = ["knee", str(path), "--low", "1", "--high", "4", "--tolerance", "1.5"]
    local, remote = twice(tmp_path, "knee", args, _ray_args(cluster))
    assert remote.stdout == local.stdout
    assert_same_tree(tmp_path / "knee-local", tmp_path / "knee")
    assert len(json.loads((tmp_path / "knee" / "knee.json").read_text())["trail"]) >= 3


def test_a_failed_point_on_ray_is_one_line_naming_it_and_the_rest_are_kept(
    tmp_path: Path, cluster: Any
) -> None:
    out = tmp_path / "sweep"
    taken = out / "point-001"
    taken.mkdir(parents=True)
    (taken / "run.json").write_text("{}")  # another run's directory: this point must not run
    result = run_cli(
        "sweep", str(sweep_file(tmp_path)), "--out", str(out), *_ray_args(cluster), timeout=300
    )
    assert result.returncode == 2, result.stderr + result.stdout  # bad input, per the CLI
    assert "Traceback" not in result.stderr
    named = [line for line in result.stderr.splitlines() if line.startswith("point 1 ")]
    assert named == [
        f"point 1 (scheduler.policy=vtc): --out {taken} already holds a run; choose a new "
        "directory or remove it"
    ]
    assert "1 of 3 points failed" in result.stderr
    rows = json.loads((out / "sweep.json").read_text())
    assert [r["valid"] for r in rows] == [True, None, True]
    assert rows[1]["error"] == named[0]
    for k in (0, 2):
        assert json.loads((out / f"point-{k:03d}" / "summary.json").read_text())["valid"]
    assert "fifo" in result.stdout and "dwrr" in result.stdout  # the table of those that ran


def test_a_resource_the_cluster_lacks_is_one_line_naming_the_flag(
    tmp_path: Path, cluster: Any
) -> None:
    out = tmp_path / "out"
    result = run_cli(
        "sweep",
        str(sweep_file(tmp_path)),
        "--out",
        str(out),
        "--ray",
        cluster.address,
        "--ray-resource",
        "fb_no_such_node",
    )
    assert result.returncode == 2, result.stderr + result.stdout
    assert result.stderr.strip().splitlines() == [
        "--ray-resource fb_no_such_node: the cluster offers none; start nodes with --resources "
        "'{\"fb_no_such_node\": 1}' or drop the flag (`ray status` lists them)"
    ]
    assert not out.exists()
