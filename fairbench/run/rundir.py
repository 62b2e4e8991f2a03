"""The run directory: where a run's files go, how they are named, what never reaches them.

Layout (`reports/<scenario>-<UTC timestamp>/` or `--out`):
    scenario.yaml          the resolved scenario (secrets redacted)
    plan.parquet           the plan, with its digest
    run.json               header: versions, plan digest, seed, target, host, health, validity
                           (written first with status "running", so a killed run has a header)
    journal*.jsonl         records as they complete (one journal per worker process)
    records.parquet        all records, consolidated at the end
    server_metrics.parquet Prometheus samples scraped during live runs
    scrape.json            what the scraper did (scrapes, failures, last error, ready)
    summary.json           the summary (see fairbench.analysis.summary)
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from fairbench.run.records import read_journal
from fairbench.workload.models import Scenario

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


# Parts of a field name that mark its value as a credential (`api_key`, `accessToken`,
# `X-Auth-Token`, `client_secret`...); `max_tokens` is not one (its part is "tokens").
SECRET_PARTS = frozenset(
    {
        "key",
        "apikey",
        "token",
        "secret",
        "password",
        "passwd",
        "auth",
        "authorization",
        "credential",
        "credentials",
        "bearer",
        "cookie",
        "session",
        "signature",
    }
)


def _secret_name(name: str) -> bool:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return any(part.lower() in SECRET_PARTS for part in re.split(r"[^A-Za-z0-9]+", spaced))


def _scrub(value: Any) -> Any:
    """A body fragment with every credential-named field's value redacted, at any depth."""
    if isinstance(value, dict):
        return {k: REDACTED if _secret_name(str(k)) else _scrub(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    return value


def _url(url: str | None) -> str | None:
    """A URL without its user-info and with credential-named query parameters redacted."""
    if not url:
        return url
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rsplit('@', 1)[1]}"
    query = parse_qsl(parts.query, keep_blank_values=True)
    query = [(k, REDACTED if _secret_name(k) else v) for k, v in query]
    return urlunsplit((parts.scheme, netloc, parts.path, urlencode(query), parts.fragment))


def redacted(scn: Scenario) -> dict[str, Any]:
    """The scenario as written into the run directory, with every place a secret can live
    redacted: api keys (target and tenants), every HTTP header value (target and tenants: any
    header can carry a credential, and a header's value is not needed to reproduce a run, its
    name is kept), credential-named fields at any depth of an extra body (target, tenants, SLO
    classes), user-info or credential-named query parameters of the target's URLs, and the keys
    of the engines behind a gateway target (`target.upstreams`)."""
    data = scn.model_dump(mode="json")
    target = data["target"]
    for holder in [target, *data["tenants"]]:
        if holder.get("api_key"):
            holder["api_key"] = REDACTED
        holder["headers"] = {name: REDACTED for name in holder.get("headers") or {}}
        if holder.get("extra_body"):
            holder["extra_body"] = _scrub(holder["extra_body"])
    if target.get("class_extra_body"):
        target["class_extra_body"] = _scrub(target["class_extra_body"])
    for field in ("base_url", "metrics_url"):
        if target.get(field):
            target[field] = _url(target[field])
    for upstream in target.get("upstreams") or []:  # the engines behind a gateway target
        if upstream.get("api_key"):
            upstream["api_key"] = REDACTED
        upstream["url"] = _url(upstream["url"])
    return data


def host_info() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
    }


def refuse_taken(path: Path) -> None:
    """Raise FileExistsError when `path` already holds a run: appending to another run's journal
    would merge two runs into one broken one. (A point run elsewhere, as a Ray task, is checked
    here on the driver, where its files will land.)"""
    if (path / "run.json").exists() or any(path.glob("journal*.jsonl")):
        raise FileExistsError(
            f"--out {path} already holds a run; choose a new directory or remove it"
        )


def new_run_dir(scn: Scenario, options: RunOptions) -> Path:
    if options.out is not None:
        path = options.out
        refuse_taken(path)
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
