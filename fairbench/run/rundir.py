"""The run directory: where a run's files go, how they are named, what never reaches them.

Layout (`reports/<scenario>-<UTC timestamp>/` or `--out`):
    scenario.yaml          the resolved scenario (secrets redacted)
    plan.parquet           the plan, with its digest
    run.json               header: versions, plan digest, seed, target, host, health, validity
                           (written first with status "running", so a killed run has a header)
    journal*.jsonl         records as they complete (one journal per worker process)
    records.parquet        all records, consolidated at the end
    server_metrics.parquet Prometheus samples scraped during live runs
    summary.json           the summary (see fairbench.analysis.summary)
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fairbench.run.records import read_journal
from fairbench.workload.scenario import Scenario

RUN_SCHEMA_VERSION = 1
REDACTED = "***redacted***"


@dataclass
class RunOptions:
    out: Path | None = None
    seed: int | None = None
    workers: int | None = None
    reports_dir: Path = Path("reports")
    progress: bool = True
    base_url: str | None = None  # override the target's URL
    # Ray: a cluster address ("auto": the one `ray start` or RAY_ADDRESS names; "local": start
    # one here for this run), None to stay on this machine (fairbench.run.ray_shards)
    ray: str | None = None
    ray_resources: tuple[str, ...] = ()  # actor k needs one unit of resource k mod len


def redacted(scn: Scenario) -> dict[str, Any]:
    data = scn.model_dump(mode="json")
    for tenant in data["tenants"]:
        if tenant.get("api_key"):
            tenant["api_key"] = REDACTED
    if data["target"].get("api_key"):
        data["target"]["api_key"] = REDACTED
    for key in list(data["target"].get("headers", {})):
        if key.lower() in ("authorization", "x-api-key", "api-key"):
            data["target"]["headers"][key] = REDACTED
    return data


def host_info() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
    }


def new_run_dir(scn: Scenario, options: RunOptions) -> Path:
    if options.out is not None:
        path = options.out
        if (path / "run.json").exists() or any(path.glob("journal*.jsonl")):
            # Appending to another run's journal would merge two runs into one broken one.
            raise FileExistsError(
                f"--out {path} already holds a run; choose a new directory or remove it"
            )
    else:
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
        path = options.reports_dir / f"{scn.name}-{stamp}"
        n = 1
        while path.exists():
            n += 1
            path = options.reports_dir / f"{scn.name}-{stamp}-{n}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    tmp.replace(path)


def read_journals(run_dir: Path) -> list[dict[str, Any]]:
    """Every record the run's journals hold, journal by journal (worker order)."""
    rows: list[dict[str, Any]] = []
    for journal in sorted(run_dir.glob("journal*.jsonl")):
        rows.extend(read_journal(journal))
    return rows
