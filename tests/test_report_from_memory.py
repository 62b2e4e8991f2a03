"""A run's report from the records it still holds (issue 35).

`fairbench run` keeps the records' Arrow table (`run_scenario(keep_records=True)`) and the
report reads it instead of records.parquet: the 10-minute fleet's 15 columns took 0.36-0.74
CPU s to read back and 0.03-0.06 to convert from memory. What would break if it were wrong:
the report drawing another frame (other rows, order, columns or dtypes) than the one read
back from the file, so the page would depend on whether it was written at the end of the run
or later by `fairbench report`.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from fairbench.pipeline import RunOutcome, run_scenario
from fairbench.report.run import report_frame, report_records, run_report
from fairbench.run import RunOptions
from fairbench.workload.loading import parse_scenario
from tests.cli import REPO


def _run(name: str, out: Path, keep: bool) -> RunOutcome:
    path = REPO / "scenarios" / name
    scn = parse_scenario(yaml.safe_load(path.read_text(encoding="utf-8")), str(path), path.parent)
    return run_scenario(scn, RunOptions(out=out, progress=False), keep_records=keep)


# incident-fifo: records as Arrow columns; sessions-chat: a list of records (edited per turn),
# made into the table by the pipeline
@pytest.mark.parametrize("name", ["incident-fifo.yaml", "sessions-chat.yaml"])
def test_the_report_from_memory_is_the_report_from_disk(tmp_path: Path, name: str) -> None:
    outcome = _run(name, tmp_path / "run", keep=True)
    records = outcome.records
    assert records is not None and records.num_rows == outcome.summary["accounting"]["planned"]
    run_dir = outcome.run_dir
    from_disk = report_records(run_dir / "records.parquet")
    from_memory = report_frame(records)
    pd.testing.assert_frame_equal(from_memory, from_disk, check_exact=True)
    assert list(from_memory.dtypes) == list(from_disk.dtypes)
    assert run_report(run_dir, records) == run_report(run_dir)


def test_records_are_not_kept_unless_asked(tmp_path: Path) -> None:
    outcome = _run("incident-fifo.yaml", tmp_path / "run", keep=False)
    assert outcome.records is None
