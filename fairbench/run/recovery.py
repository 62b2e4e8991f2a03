"""Read back a run whose generator died (kill -9, power loss) as an incomplete measurement.

The journals are fsynced as the run goes, so everything up to about the last second before the
crash is on disk; planned requests without a record are counted as missing by the accounting,
and the run is marked incomplete rather than silently short.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from fairbench.plan.model import load_plan
from fairbench.run.measure import Measurement
from fairbench.run.rundir import read_journals
from fairbench.workload.loading import parse_scenario


def read_partial(run_dir: Path) -> Measurement:
    header = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    scn = parse_scenario(yaml.safe_load((run_dir / "scenario.yaml").read_text(encoding="utf-8")))
    plan = load_plan(run_dir / "plan.parquet")
    return Measurement(
        run_dir,
        scn,
        plan,
        read_journals(run_dir),
        header,
        dict(header.get("target", {})),
        stopped=True,
        loop_lags=None,
        workers=int(header.get("workers", 1)),
        complete=False,
    )
