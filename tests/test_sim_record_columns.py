"""A simulated run's records as columns (issue 35 item 3) are the per-record dicts, exactly.

Why: the pipeline takes a simulated run's records as one Arrow table built column by column
(fairbench.targets.sim.record_columns -> fairbench.run.records.records_table), with no Python
object per record, to keep a fleet run's peak memory down; the dicts (`records_from`) remain
the rule a plan with sessions and the tests read. The two must agree value for value, null for
null and type for type — records.parquet and summary.json are compared byte for byte on the
goldens — so each branch of the rule is exercised here: finished, rejected (400 too long, 429
queue full), cut off by its timeout mid-stream or before a token, cancelled at the end of the
grace, left by the simulation, preempted (recompute and swap), disaggregated, zero output."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from fairbench.run.records import (
    ARROW_SCHEMA,
    check_accounting,
    records_frame,
    records_table,
    write_records,
)
from fairbench.targets.sim import record_columns, records_from
from reference_scheduler.core.job import Job
from reference_scheduler.drivers.virtual import simulate
from reference_scheduler.scheduler.config import parse_scheduler_config


class _Plan:
    """The plan as records_from and record_columns read it: send offsets, planned max_tokens,
    and the names as codes into their tables (record_columns takes tenant and class from the
    plan, records_from from the jobs: equal columns hold the two the same)."""

    def __init__(self, jobs: list[Job]) -> None:
        self.tenants = sorted({j.tenant for j in jobs})
        self.slo_classes = sorted({j.slo_class for j in jobs})
        self.workloads = ["w0", "w1", "w2"]
        self._tables = {
            "tenant": self.tenants,
            "slo_class": self.slo_classes,
            "workload": self.workloads,
            "endpoint": ["chat", "completions", "embeddings"],
        }
        self.columns = {
            "offset_ns": np.array([j.arrival_ns for j in jobs], dtype=np.int64),
            "max_tokens": np.array([j.max_tokens for j in jobs], dtype=np.int64),
            "tenant": np.array([self.tenants.index(j.tenant) for j in jobs], dtype=np.int16),
            "slo_class": np.array(
                [self.slo_classes.index(j.slo_class) for j in jobs], dtype=np.int16
            ),
            "workload": np.array([j.id % 3 for j in jobs], dtype=np.int16),
            "endpoint": np.zeros(len(jobs), dtype=np.int16),
        }

    def names(self, column: str) -> np.ndarray:
        return np.asarray(self._tables[column], dtype=object)[self.columns[column]]


def _jobs(n: int, seed: int) -> list[Job]:
    rng = random.Random(seed)
    t, jobs = 0, []
    for i in range(n):
        t += rng.randint(0, 3_000_000)
        tier = rng.randint(0, 2)
        prompt = 200_000 if rng.random() < 0.01 else rng.randint(1, 3000)  # some too long: 400
        jobs.append(
            Job(
                i,
                f"t{rng.randint(0, 3)}",
                ("interactive", "batch", "best-effort")[tier],
                prompt,
                rng.choice([0, 1, 2, rng.randint(3, 400)]),
                t,
                priority=tier,
            )
        )
    return jobs


DISAGGREGATED = {"prefill_replicas": 1, "decode_replicas": 2}
CONFIGS: list[tuple[str, dict[str, Any]]] = [
    ("vtc", {}),
    ("fifo", {"admission": {"max_queue_per_tenant": 20}}),
    ("three-tier", {"preemption": {"mode": "recompute"}, "max_num_seqs": 8}),
    ("three-tier", {"preemption": {"mode": "swap"}, "max_num_seqs": 8}),
    ("dwrr", {"disaggregation": DISAGGREGATED}),
    (
        "priority",
        {"engine": "vllm", "replicas": 1, "kv_cache_tokens": 12000},
    ),  # KV runs out: preemptions
]
CUTS = [(None, None), (6_000_000_000, None), (4_000_000_000, 3_000_000_000), (None, 2_500_000_000)]


@pytest.mark.parametrize(
    ("policy", "extra"), CONFIGS, ids=[c[0] + str(i) for i, c in enumerate(CONFIGS)]
)
@pytest.mark.parametrize(("timeout_ns", "stop_ns"), CUTS, ids=["none", "timeout", "both", "grace"])
def test_columns_are_the_records_exactly(
    policy: str, extra: dict[str, Any], timeout_ns: int | None, stop_ns: int | None
) -> None:
    jobs = _jobs(700, 35)
    plan = _Plan(jobs)
    config = parse_scheduler_config(
        {"policy": policy, "profile": "a10g-llama2-7b", "replicas": 3, **extra}
    )
    result = simulate(jobs, config, timeout_ns=timeout_ns, stop_ns=stop_ns)
    rows = records_from(result, plan, timeout_ns, stop_ns)  # type: ignore[arg-type]
    columns = record_columns(result, plan, timeout_ns, stop_ns)  # type: ignore[arg-type]
    table = records_table(columns, len(rows))
    expected = pa.Table.from_pylist(rows, schema=ARROW_SCHEMA)
    for name in ARROW_SCHEMA.names:
        assert table.column(name).to_pylist() == expected.column(name).to_pylist(), name
    assert table.equals(expected)
    assert check_accounting(len(rows), table) == check_accounting(len(rows), rows)
    assert records_frame(table).equals(records_frame(rows))


def test_the_cases_are_covered() -> None:
    """The parametrized runs above reach every branch of the rule (else they prove little)."""
    seen: set[str] = set()
    for policy, extra in CONFIGS:
        config = parse_scheduler_config(
            {"policy": policy, "profile": "a10g-llama2-7b", "replicas": 3, **extra}
        )
        for timeout_ns, stop_ns in CUTS:
            jobs = _jobs(700, 35)
            result = simulate(jobs, config, timeout_ns=timeout_ns, stop_ns=stop_ns)
            for row in records_from(result, _Plan(jobs), timeout_ns, stop_ns):  # type: ignore[arg-type]
                seen.add(f"{row['status']}/{row.get('http_status')}")
                if row.get("preemptions"):
                    seen.add("preempted")
                if row.get("kv_transfer_ns"):
                    seen.add("disaggregated")
                if row["status"] in ("timeout", "cancelled") and row["output_tokens"] > 1:
                    seen.add("cut mid-stream")
    assert {
        "ok/200",
        "error/400",
        "rejected/429",
        "timeout/200",
        "timeout/None",
        "cancelled/None",
        "cancelled/200",
        "preempted",
        "disaggregated",
        "cut mid-stream",
    } <= seen, seen


def test_parquet_is_the_same_bytes(tmp_path: Any) -> None:
    """records.parquet from the table is the file the dicts made, byte for byte; rows out of
    request_id order are sorted as the dicts were (stable)."""
    jobs = _jobs(300, 7)
    plan = _Plan(jobs)
    config = parse_scheduler_config({"policy": "vtc", "profile": "a10g-llama2-7b"})
    result = simulate(jobs, config, timeout_ns=5_000_000_000)
    rows = records_from(result, plan, 5_000_000_000)  # type: ignore[arg-type]
    table = records_table(record_columns(result, plan, 5_000_000_000), len(jobs))  # type: ignore[arg-type]
    order = np.random.default_rng(1).permutation(len(jobs))
    write_records(rows, tmp_path / "a.parquet")
    write_records(table.take(pa.array(order)), tmp_path / "b.parquet")
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
