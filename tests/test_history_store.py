"""The history store: idempotent adds, a schema version, and files that are not ours (corrupt,
truncated, foreign) refused in one line with the existing store untouched."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fairbench.history import store
from fairbench.history.errors import HistoryError
from fairbench.history.rundata import add_runs
from fairbench.history.view import history_view

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fairbench.pipeline import run_scenario
    from fairbench.run import RunOptions
    from fairbench.workload.loading import load_scenario

    out = tmp_path_factory.mktemp("runs") / "dog"
    run_scenario(
        load_scenario(REPO / "scenarios/gate-dogfood.yaml"),
        RunOptions(out=out, workers=1, progress=False),
    )
    return out


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fairbench.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


def test_adding_twice_keeps_one(run_dir: Path, tmp_path: Path) -> None:
    db = tmp_path / "h.duckdb"
    assert add_runs(db, [run_dir]) == (1, 0)
    copy = tmp_path / "copied"
    shutil.copytree(run_dir, copy)
    assert add_runs(db, [run_dir, copy]) == (0, 2)  # the same run from a copy is the same run
    assert store.count_runs(db) == 1
    rows = store.read(db, "ttft_p99", "overall")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert rows[0].value == summary["metrics"]["overall"]["ttft_p99"]["value"]
    assert rows[0].ci_low == summary["metrics"]["overall"]["ttft_p99"]["ci_low"]
    assert store.read(db, "ttft_p99", "tenant.support-bot")


def test_foreign_corrupt_and_truncated_files_are_one_line_and_untouched(
    run_dir: Path, tmp_path: Path
) -> None:
    import duckdb

    good = tmp_path / "good.duckdb"
    add_runs(good, [run_dir])
    data = good.read_bytes()
    truncated = tmp_path / "truncated.duckdb"
    truncated.write_bytes(data[: len(data) // 3])
    junk = tmp_path / "junk.duckdb"
    junk.write_text("not a database\n" * 100)
    foreign = tmp_path / "foreign.duckdb"
    con = duckdb.connect(str(foreign))
    con.execute("CREATE TABLE t (a INT)")
    con.close()
    for path in (truncated, junk, foreign):
        before = path.read_bytes()
        with pytest.raises(HistoryError):
            add_runs(path, [run_dir])
        assert path.read_bytes() == before
        done = _cli("history", "add", str(run_dir), "--db", str(path))
        assert done.returncode == 2
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "Traceback" not in done.stderr and str(path) in done.stderr
        assert path.read_bytes() == before
    assert store.count_runs(good) == 1


def test_a_newer_schema_is_refused(run_dir: Path, tmp_path: Path) -> None:
    import duckdb

    db = tmp_path / "h.duckdb"
    add_runs(db, [run_dir])
    con = duckdb.connect(str(db))
    con.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    con.close()
    with pytest.raises(HistoryError, match="schema version 99"):
        store.read(db, "ttft_p99", "overall")


def test_show_json_has_the_issue_shape(run_dir: Path, tmp_path: Path) -> None:
    db = tmp_path / "h.duckdb"
    add_runs(db, [run_dir])
    done = _cli("history", "show", "--metric", "ttft_p99", "--db", str(db), "--json")
    assert done.returncode == 0, done.stderr
    view = json.loads(done.stdout)
    assert set(view) == {"metric", "points", "change_points", "drift"}
    assert set(view["points"][0]) == {"run", "time", "value", "ci_low", "ci_high"}
    assert view["change_points"] == [] and view["drift"]["scenario"]
    assert view["drift"]["status"] == "cannot evaluate"  # one run: too short
    assert "too short" in view["drift"]["reason"]
    page = tmp_path / "page" / "history.html"
    done = _cli("history", "show", "--metric", "ttft_p99", "--db", str(db), "--html", str(page))
    assert done.returncode == 0, done.stderr
    assert (page.parent / "plotly.min.js").is_file() and "ttft_p99" in page.read_text()
    assert history_view(db, "ttft_p99", 86400.0)["points"][0]["run"] == "dog"


@pytest.mark.parametrize(
    "args",
    [
        ["--metric", "ttft_p99", "--db", "absent.duckdb"],
        ["--metric", "ttft_p99", "--window", "fortnight"],
        ["--metric", "ttft_p99", "--group", "tenant"],
    ],
)
def test_bad_show_input_is_one_line(args: list[str], tmp_path: Path) -> None:
    done = _cli("history", "show", *[a.replace("absent", str(tmp_path / "absent")) for a in args])
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr


def test_an_unknown_metric_has_a_did_you_mean(run_dir: Path, tmp_path: Path) -> None:
    db = tmp_path / "h.duckdb"
    add_runs(db, [run_dir])
    with pytest.raises(HistoryError, match="did you mean 'ttft_p99'"):
        history_view(db, "ttft_p98", 86400.0)
