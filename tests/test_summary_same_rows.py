"""Groups with the same requests are summarised once (issue 35): a class that is one tenant's,
a workload that is one class's (on the fleet run 5 of the 10 groups) get a copy of the block
and of the `metrics` entries already made for those rows, not a second computation of their
percentiles, curves and intervals. The copy must be what computing them again gives, byte for
byte, and a dict of its own."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_summary_speed import small_sim

from fairbench.analysis import metrics_block, summary
from fairbench.pipeline import run_scenario
from fairbench.run.rundir import RunOptions


def _run(tmp_path: Path, name: str) -> tuple[dict[str, Any], bytes]:
    outcome = run_scenario(small_sim(), RunOptions(out=tmp_path / name, progress=False))
    return outcome.summary, (outcome.run_dir / "summary.json").read_bytes()


def test_same_rows_made_once_and_copied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks: Counter[bytes] = Counter()
    entries: Counter[tuple[str, bytes]] = Counter()
    group_block, entry = summary.group_block, metrics_block._entry

    def counted_block(*args: Any, **kwargs: Any) -> Any:
        rows = args[4] if len(args) > 4 else kwargs.get("rows")
        blocks[b"all" if rows is None else np.packbits(rows).tobytes()] += 1
        return group_block(*args, **kwargs)

    def counted_entry(metric: Any, c: Any, mask: Any, shares: Any = None) -> Any:
        if mask is not None:
            entries[(metric.name, np.packbits(mask).tobytes())] += 1
        return entry(metric, c, mask, shares)

    monkeypatch.setattr(summary, "group_block", counted_block)
    monkeypatch.setattr(metrics_block, "_entry", counted_entry)
    got, _ = _run(tmp_path, "run")
    # small_sim: tenant a is the interactive class and the chat workload, b batch and long
    assert sum(blocks.values()) == 3 and set(blocks.values()) == {1}
    assert entries and set(entries.values()) == {1}
    for tenant, cls, workload in (("a", "interactive", "chat"), ("b", "batch", "long")):
        assert got["slo_classes"][cls] == got["tenants"][tenant] == got["workloads"][workload]
        assert got["slo_classes"][cls] is not got["tenants"][tenant]
        by_class, by_tenant = got["metrics"]["class"][cls], got["metrics"]["tenant"][tenant]
        common = set(by_class) & set(by_tenant)  # some figures exist for one dimension only
        assert len(common) > 5
        assert all(by_class[name] == by_tenant[name] for name in common)
    got["slo_classes"]["batch"]["counts"]["ok"] = -1  # a copy: the tenant's stays
    assert got["tenants"]["b"]["counts"]["ok"] != -1
    first = got["metrics"]["class"]["batch"]["slo_attainment"]
    first["value"] = -1.0
    assert got["metrics"]["tenant"]["b"]["slo_attainment"]["value"] != -1.0


def test_copies_equal_computing_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """summary.json with the memos is byte-identical to the one computed group by group."""
    _, once = _run(tmp_path, "once")

    def every_time(blocks: Any, rows: Any, arrays: Any, met: Any, w: Any, lat: Any, cols: Any):
        found = summary.group_block(arrays, met, w, lat, rows)
        found["latency_ci_ms"] = summary.latency_cis(lat, rows)
        cols.forget()
        return found

    def every_entry(made: Any, metric: Any, c: Any, mask: Any, packed: Any, shares: Any) -> Any:
        return metrics_block._entry(metric, c, mask)  # shares made afresh too

    monkeypatch.setattr(summary, "_group_once", every_time)
    monkeypatch.setattr(metrics_block, "_entry_once", every_entry)
    _, again = _run(tmp_path, "again")
    assert once == again
