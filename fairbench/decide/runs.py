"""The runs a comparison reads: a run directory's summary and its records in the measurement
window, the metadata two runs must share to be compared, and the refusal when they do not.

It exists so that reading and checking runs stays apart from the statistics of
`decide.compare`, which pairs them. Imports nothing of fairbench.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

CHECKED_METADATA = ("plan_digest", "scenario", "schema_version")


class CompareRefused(Exception):
    """The runs cannot be compared; the message says why."""


@dataclass(frozen=True)
class RunData:
    path: Path
    summary: dict[str, Any]
    records: pd.DataFrame  # measurement window only, sorted by request_id


def load_run(path: Path) -> RunData:
    try:
        summary = json.loads((path / "summary.json").read_text(encoding="utf-8"))
        records = pd.read_parquet(path / "records.parquet")
    except FileNotFoundError as error:
        missing = Path(str(error.filename)).name
        raise CompareRefused(f"{path}: not a run directory ({missing} missing)") from None
    except (ValueError, OSError) as error:
        raise CompareRefused(f"{path}: unreadable run ({type(error).__name__}: {error})") from None
    lo, hi = summary["window_s"]
    t = records["t_intended_ns"].to_numpy(dtype=np.float64) / 1e9
    records = records[(t >= lo) & (t <= hi)].sort_values("request_id").reset_index(drop=True)
    return RunData(path, summary, records)


def check_comparable(a: RunData, b: RunData) -> None:
    for key in CHECKED_METADATA:
        if a.summary.get(key) != b.summary.get(key):
            raise CompareRefused(
                f"{key} differs: {a.summary.get(key)!r} ({a.path}) vs {b.summary.get(key)!r} "
                f"({b.path}); A and B must replay the same plan"
            )
    for run in (a, b):
        if not run.summary.get("valid", False):
            reasons = "; ".join(run.summary.get("invalid_reasons", [])) or "unknown"
            raise CompareRefused(
                f"{run.path} is INVALID ({reasons}); an invalid run is not compared"
            )
