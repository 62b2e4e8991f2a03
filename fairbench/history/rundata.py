"""A run directory as a history entry: its summary's registry figures per group with their
intervals, the queue length's mean and variance, its plan digest, scheduler config and start.

Reads summary.json's `metrics` block through the registry's lookups (`known_names`,
`metric_entry`), so a stored `ttft_p99.tenant.vip` means what the gate and compare mean by it,
and run.json's `started_at` (a run's time is when it started; fairbench.run.rundir writes it).

Queue length per run (`queue_depth_mean`, `queue_depth_var`, overall only) comes from the
summary's `drift.queue_depth` block, which gives the two halves of the run: the run's mean is the
halves' mean and its variance the halves' mean variance plus the variance of the half means
(exact for halves of equal length; the block's halves differ by at most one sample).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from pathlib import Path
from typing import Any

from fairbench.analysis import registry
from fairbench.history.errors import HistoryError
from fairbench.history.store import Entry


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise HistoryError(
            f"{path}: missing; give a finished run directory (its summary is written last)"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise HistoryError(f"{path}: cannot read it as JSON ({error})") from None
    if not isinstance(data, dict):
        raise HistoryError(f"{path}: not a JSON object")
    return data


def _scheduler(run_dir: Path) -> dict[str, Any] | None:
    import yaml

    try:
        data = yaml.safe_load((run_dir / "scenario.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    block = data.get("scheduler") if isinstance(data, dict) else None
    return block if isinstance(block, dict) else None


def started_at(header: dict[str, Any], where: Path) -> float:
    raw = header.get("started_at")
    try:
        stamp = dt.datetime.fromisoformat(str(raw))
    except ValueError:
        raise HistoryError(f"{where}: started_at {raw!r} is not an ISO time") from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.UTC)
    return stamp.timestamp()


def _points(summary: dict[str, Any]) -> list[tuple[Any, ...]]:
    out = []
    for name in registry.known_names(summary):
        entry = registry.metric_entry(summary, name) or {}
        parsed = registry.parse_name(name)
        assert parsed is not None  # known_names gives registry names only
        group = "overall" if parsed.group == "overall" else f"{parsed.group}.{parsed.key}"
        value = entry.get("value")
        if not isinstance(value, int | float) or isinstance(value, bool):
            continue
        num = lambda v: float(v) if isinstance(v, int | float) else None  # noqa: E731
        n = entry.get("n")
        out.append(
            (
                parsed.metric.name,
                group,
                float(value),
                num(entry.get("ci_low")),
                num(entry.get("ci_high")),
                bool(entry.get("lower_bound")),
                int(n) if isinstance(n, int) else None,
            )
        )
    q = (summary.get("drift") or {}).get("queue_depth") or {}
    halves = [q.get(k) for k in ("mean_first_half", "mean_second_half")]
    var = [q.get(k) for k in ("variance_first_half", "variance_second_half")]
    if all(isinstance(v, int | float) for v in [*halves, *var]):
        mean = (halves[0] + halves[1]) / 2
        variance = (var[0] + var[1]) / 2 + ((halves[0] - halves[1]) / 2) ** 2
        out.append(("queue_depth_mean", "overall", float(mean), None, None, False, None))
        out.append(("queue_depth_var", "overall", float(variance), None, None, False, None))
    return out


def read_run(run_dir: Path) -> Entry:
    """The entry for one finished run directory; HistoryError (one line) when it is not one."""
    if not run_dir.is_dir():
        raise HistoryError(f"{run_dir}: not a run directory")
    header = _json(run_dir / "run.json")
    summary = _json(run_dir / "summary.json")
    if "metrics" not in summary:
        raise HistoryError(
            f"{run_dir / 'summary.json'}: no `metrics` block; not a fairbench summary"
        )
    scenario = str(summary.get("scenario") or header.get("scenario") or "")
    digest = str(summary.get("plan_digest") or header.get("plan_digest") or "")
    start = started_at(header, run_dir / "run.json")
    key = hashlib.sha256(f"{scenario}\0{digest}\0{start!r}".encode()).hexdigest()[:32]
    target = header.get("target") if isinstance(header.get("target"), dict) else {}
    return Entry(
        run_key=key,
        name=run_dir.name,
        source="run",
        scenario=scenario,
        started_at=start,
        plan_digest=digest,
        seed=summary.get("seed") if isinstance(summary.get("seed"), int) else None,
        scheduler=_scheduler(run_dir),
        target_kind=str(target.get("kind")) if target.get("kind") else None,
        valid=bool(summary.get("valid")),
        path=str(run_dir),
        points=_points(summary),
    )


def add_runs(db: Path, run_dirs: list[Path]) -> tuple[int, int]:
    """Read every run first (a bad one refuses the whole add), then store them in one
    transaction: (added, already in the store)."""
    from fairbench.history import store

    entries = [read_run(d) for d in run_dirs]
    return store.add(db, entries)
