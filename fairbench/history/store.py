"""The history store: one DuckDB file (no server) holding every run's figures over time.

Why DuckDB: an embedded, single-file, transactional column store that answers the time-window
queries `history show` and the gate's drift rule ask, with no server to run in CI; a directory
of JSON files would need its own locking, schema checks and crash safety.

Schema (version `SCHEMA_VERSION`, recorded in `meta`):

    meta(key, value)          format = fairbench-history, schema_version = 1
    runs(run_key, name, source, scenario, plan_digest, seed, started_at, started_iso,
         scheduler, target_kind, valid, path, added_at)
    points(run_key, metric, grp, value, ci_low, ci_high, lower_bound, n)

`run_key` is the sha256 of (scenario, plan digest, start time): adding a run twice, or the same
run from a copied directory, keeps one. `grp` is `overall`, `tenant.<id>`, `class.<name>` or
`workload.<name>`. `started_at` is seconds since the epoch (UTC): a run's time is when it
started.

Safety: an existing file is opened read-only first and checked (a DuckDB database, this format,
a schema this code reads); only then is it opened for writing, and every add is one
transaction, rolled back on any error. A corrupt, truncated or foreign file is one line
(HistoryError), and the file is left as it was.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fairbench.history.errors import HistoryError

SCHEMA_VERSION = 1
FORMAT = "fairbench-history"
DEFAULT_DB = Path("reports/history.duckdb")

_DDL = [
    "CREATE TABLE meta (key VARCHAR PRIMARY KEY, value VARCHAR)",
    """CREATE TABLE runs (
        run_key VARCHAR PRIMARY KEY, name VARCHAR, source VARCHAR, scenario VARCHAR,
        plan_digest VARCHAR, seed BIGINT, started_at DOUBLE, started_iso VARCHAR,
        scheduler VARCHAR, target_kind VARCHAR, valid BOOLEAN, path VARCHAR, added_at VARCHAR)""",
    """CREATE TABLE points (
        run_key VARCHAR, metric VARCHAR, grp VARCHAR, value DOUBLE, ci_low DOUBLE,
        ci_high DOUBLE, lower_bound BOOLEAN, n BIGINT, PRIMARY KEY (run_key, metric, grp))""",
]


@dataclass
class Entry:
    """One run (or one imported time bucket) and its figures, ready to store."""

    run_key: str
    name: str
    source: str  # run | prometheus
    scenario: str
    started_at: float
    plan_digest: str | None = None
    seed: int | None = None
    scheduler: dict[str, Any] | None = None
    target_kind: str | None = None
    valid: bool = True
    path: str | None = None
    # (metric, group, value, ci_low, ci_high, lower_bound, n)
    points: list[tuple[str, str, float, float | None, float | None, bool, int | None]] = field(
        default_factory=list
    )


def _duckdb() -> Any:
    import duckdb

    return duckdb


def _check(con: Any, path: Path) -> None:
    """Raise HistoryError unless `con` is a fairbench history store this code can read."""
    duckdb = _duckdb()
    try:
        tables = {
            r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()
        }
        if "meta" not in tables:
            raise HistoryError(
                f"{path}: a DuckDB file but not a fairbench history store (no meta table); "
                "give another --db"
            )
        meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
    except duckdb.Error as error:
        raise HistoryError(f"{path}: cannot read the store ({_first(error)})") from None
    if meta.get("format") != FORMAT:
        raise HistoryError(f"{path}: not a fairbench history store (format {meta.get('format')!r})")
    version = meta.get("schema_version")
    if version != str(SCHEMA_VERSION):
        raise HistoryError(
            f"{path}: history schema version {version}, this fairbench reads {SCHEMA_VERSION}; "
            "use the fairbench that wrote it or start a new --db"
        )


def _first(error: BaseException) -> str:
    return " ".join(str(error).split())[:200]


@contextmanager
def connect(path: Path, write: bool = False) -> Iterator[Any]:
    """A checked connection. `write` creates the store if the file does not exist; reading a
    missing store is a HistoryError naming the command that fills it."""
    duckdb = _duckdb()
    if path.is_dir():
        raise HistoryError(f"{path}: a directory; --db takes a file (default {DEFAULT_DB})")
    if not path.exists():
        if not write:
            raise HistoryError(
                f"{path}: no history store here; fill one with `fairbench history add RUN... "
                f"--db {path}`"
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        con = duckdb.connect(str(path))
        try:
            con.execute("BEGIN TRANSACTION")
            for ddl in _DDL:
                con.execute(ddl)
            con.execute(
                "INSERT INTO meta VALUES ('format', ?), ('schema_version', ?)",
                [FORMAT, str(SCHEMA_VERSION)],
            )
            con.execute("COMMIT")
        except BaseException:
            con.close()
            raise
    else:
        try:  # read-only first: a foreign or broken file is never opened for writing
            probe = duckdb.connect(str(path), read_only=True)
        except duckdb.Error as error:
            raise HistoryError(
                f"{path}: not a readable DuckDB history store ({_first(error)}); it is left as "
                "it is: give another --db"
            ) from None
        try:
            _check(probe, path)
        finally:
            probe.close()
        try:
            con = duckdb.connect(str(path), read_only=not write)
        except duckdb.Error as error:
            raise HistoryError(f"{path}: cannot open the store ({_first(error)})") from None
    try:
        yield con
    finally:
        con.close()


def add(path: Path, entries: list[Entry]) -> tuple[int, int]:
    """Store the entries in one transaction; (added, already there). Idempotent on run_key."""
    duckdb = _duckdb()
    now = dt.datetime.now(dt.UTC).isoformat()
    added = already = 0
    with connect(path, write=True) as con:
        try:
            con.execute("BEGIN TRANSACTION")
            for e in entries:
                if con.execute("SELECT 1 FROM runs WHERE run_key = ?", [e.run_key]).fetchone():
                    already += 1
                    continue
                con.execute(
                    "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [
                        e.run_key,
                        e.name,
                        e.source,
                        e.scenario,
                        e.plan_digest,
                        e.seed,
                        e.started_at,
                        dt.datetime.fromtimestamp(e.started_at, dt.UTC).isoformat(),
                        None if e.scheduler is None else json.dumps(e.scheduler, sort_keys=True),
                        e.target_kind,
                        e.valid,
                        e.path,
                        now,
                    ],
                )
                if e.points:
                    con.executemany(
                        "INSERT INTO points VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        [(e.run_key, *p) for p in e.points],
                    )
                added += 1
            con.execute("COMMIT")
        except duckdb.Error as error:
            con.execute("ROLLBACK")
            raise HistoryError(f"{path}: nothing added ({_first(error)})") from None
    return added, already


@dataclass(frozen=True)
class Row:
    """A stored figure with its run: what the trends read."""

    run: str
    scenario: str
    source: str
    started_at: float
    value: float
    ci_low: float | None
    ci_high: float | None
    lower_bound: bool


def read(path: Path, metric: str, group: str, scenario: str | None = None) -> list[Row]:
    """Every valid run's figure for (metric, group), in time order (then by name)."""
    sql = (
        "SELECT r.name, r.scenario, r.source, r.started_at, p.value, p.ci_low, p.ci_high, "
        "p.lower_bound FROM points p JOIN runs r USING (run_key) "
        "WHERE p.metric = ? AND p.grp = ? AND r.valid AND p.value IS NOT NULL"
    )
    args: list[Any] = [metric, group]
    if scenario is not None:
        sql += " AND r.scenario = ?"
        args.append(scenario)
    sql += " ORDER BY r.started_at, r.name"
    with connect(path) as con:
        return [Row(*r) for r in con.execute(sql, args).fetchall()]


def names(path: Path) -> dict[str, list[str]]:
    """What the store holds: its metrics, groups and scenarios (for did-you-mean lines)."""
    queries = {
        "metric": "SELECT DISTINCT metric FROM points ORDER BY 1",
        "group": "SELECT DISTINCT grp FROM points ORDER BY 1",
        "scenario": "SELECT DISTINCT scenario FROM runs ORDER BY 1",
    }
    with connect(path) as con:
        return {k: [r[0] for r in con.execute(q).fetchall()] for k, q in queries.items()}


def count_runs(path: Path) -> int:
    with connect(path) as con:
        return int(con.execute("SELECT count(*) FROM runs").fetchone()[0])
