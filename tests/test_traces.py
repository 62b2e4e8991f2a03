"""Trace replay: the shipped production traces parse; malformed rows name file and line."""

from __future__ import annotations

import lzma
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fairbench.plan.materialize import materialize
from fairbench.workload.loading import parse_scenario
from fairbench.workload.traces import TraceError, detect_tick, read_trace, spread_ties

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "scenarios" / "traces" / "AzureLLMInferenceTrace_conv.csv"
# The other production traces, unchanged but xz-compressed (origin and licence:
# tests/data/SOURCES.md). The readers take plain files, so each is unpacked once per session.
DATA = REPO / "tests" / "data" / "traces"


@pytest.fixture(scope="session")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the decompressed traces, by their original names."""
    folder = tmp_path_factory.mktemp("traces")
    for packed in sorted(DATA.glob("*.xz")):
        with lzma.open(packed) as src, (folder / packed.stem).open("wb") as dst:
            shutil.copyfileobj(src, dst)
    return folder


def test_azure_conv_parses_every_row() -> None:
    rows = read_trace("azure", SHIPPED)
    assert len(rows) == 19366
    assert rows.t[0] == 0 and np.all(np.diff(rows.t) >= 0)
    assert 55 * 60 < rows.t[-1] < 60 * 60  # 58 minutes
    # First rows of the file: 18:15:46.6805900, 374 → 44; then 18:15:50.9951690.
    assert rows.input_tokens[0] == 374 and rows.output_tokens[0] == 44
    assert rows.t[1] == pytest.approx(4.314579, abs=1e-6)


def test_azure_code_and_mooncake_traces_parse(traces: Path) -> None:
    code = read_trace("azure", traces / "AzureLLMInferenceTrace_code.csv")
    assert len(code) == 8819
    conv = read_trace("mooncake", traces / "conversation_trace.jsonl")
    assert len(conv) == 12031
    assert conv.hash_offsets is not None and conv.hash_values is not None
    # Row 1 of the file: 6758 tokens, hash ids 0..13 (14 blocks of 512).
    first = conv.hash_values[conv.hash_offsets[0] : conv.hash_offsets[1]]
    assert conv.input_tokens[0] == 6758 and list(first) == list(range(14))
    synthetic = read_trace("mooncake", traces / "synthetic_trace.jsonl")
    assert len(synthetic) == 3993


def test_azure_2024_timestamps_with_utc_offset(tmp_path: Path) -> None:
    path = tmp_path / "week.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2024-05-10 00:00:00.009930+00:00,100,10\n"
        "2024-05-10 00:00:01.509930+00:00,200,20\n"
    )
    rows = read_trace("azure", path)
    assert list(rows.t) == pytest.approx([0.0, 1.5])


def test_burstgpt_columns_by_name_and_failed_rows_dropped(tmp_path: Path) -> None:
    path = tmp_path / "burst.csv"
    path.write_text(
        "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,"
        "Log Type\n"
        "5,s1,0,ChatGPT,100,20,120,Conversation log\n"
        "7,s1,2,ChatGPT,50,0,50,Conversation log\n"
        "9,s2,0,GPT-4,300,40,340,API log\n"
    )
    rows = read_trace("burstgpt", path)
    assert list(rows.t) == [0.0, 4.0]
    assert list(rows.input_tokens) == [100, 300]
    assert rows.dropped == 1


@pytest.mark.parametrize(
    ("fmt", "text", "line", "what"),
    [
        (
            "azure",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,1,1\nyesterday,1,1\n",
            3,
            "bad timestamp",
        ),
        (
            "azure",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,1,1\n"
            "2023-11-16 18:15:47.68,-4,1\n",
            3,
            "ContextTokens must be an integer",
        ),
        (
            "mooncake",
            '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 3,',
            2,
            "not valid JSON",
        ),
        (
            "mooncake",
            '{"timestamp": 0, "input_length": 5, "output_length": 1}\n'
            '{"timestamp": 1, "output_length": 1}\n',
            2,
            "missing field 'input_length'",
        ),
    ],
)
def test_malformed_row_names_file_and_line(
    tmp_path: Path, fmt: str, text: str, line: int, what: str
) -> None:
    path = tmp_path / "bad.trace"
    path.write_text(text)
    with pytest.raises(TraceError) as info:
        read_trace(fmt, path)
    assert str(info.value).startswith(f"{path}:{line}: ")
    assert what in str(info.value)


def test_missing_trace_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="trace file not found"):
        read_trace("azure", tmp_path / "nope.csv")


def test_coarse_ticks_are_detected_and_spread() -> None:
    t = np.array([0.0, 0.0, 0.0, 3.0, 3.0, 9.0])
    assert detect_tick(t) == 3.0
    assert list(spread_ties(t, 3.0)) == [0.0, 1.0, 2.0, 3.0, 4.5, 9.0]


def _trace_scenario(**trace: Any) -> Any:
    spec = {"format": "azure", "path": str(SHIPPED), **trace}
    return parse_scenario(
        {
            "workloads": {"c": {"prompt_tokens": 1}},
            "traces": {"conv": spec},
            "tenants": [
                {
                    "id": "a",
                    "mix": "c",
                    "arrival": {"process": "trace", "trace": "conv", "share": 3},
                },
                {
                    "id": "b",
                    "mix": "c",
                    "arrival": {"process": "trace", "trace": "conv", "share": 1},
                },
            ],
        }
    )


def test_window_scale_and_share_split() -> None:
    plan = materialize(_trace_scenario(start="60s", end="660s", time_scale=2.0))
    rows = read_trace("azure", SHIPPED)
    in_window = ((rows.t >= 60) & (rows.t < 660)).sum()
    assert len(plan) == in_window
    assert plan.columns["offset_ns"][-1] / 1e9 < 1200
    share_a = (plan.names("tenant") == "a").mean()
    assert abs(share_a - 0.75) <= 4 * np.sqrt(0.75 * 0.25 / len(plan))
    # lengths come from the trace, not the workload
    assert plan.columns["prompt_tokens"].max() > 1000


def test_hash_split_keeps_shared_prefixes_with_one_tenant(traces: Path) -> None:
    path = traces / "conversation_trace.jsonl"
    scn = parse_scenario(
        {
            "workloads": {"c": {"prompt_tokens": 1}},
            "traces": {
                "m": {
                    "format": "mooncake",
                    "path": str(path),
                    "split": "hash",
                    "spread": "auto",
                    "end": "600s",
                }
            },
            "tenants": [
                {"id": "a", "mix": "c", "arrival": {"process": "trace", "trace": "m", "share": 1}},
                {"id": "b", "mix": "c", "arrival": {"process": "trace", "trace": "m", "share": 1}},
            ],
        }
    )
    plan = materialize(scn)
    assert plan.block_offsets is not None and plan.block_values is not None
    owner: dict[int, str] = {}
    tenants = plan.names("tenant")
    for i in range(len(plan)):
        ids = plan.block_values[plan.block_offsets[i] : plan.block_offsets[i + 1]]
        key = int(ids[min(len(ids), 2) - 1])
        assert owner.setdefault(key, tenants[i]) == tenants[i]
    assert 0.35 < (tenants == "a").mean() < 0.65
    # spreading removed the ~3 s bursts: no two requests share an offset any more
    assert len(np.unique(plan.columns["offset_ns"])) == len(plan)


def test_every_shipped_data_file_is_attributed_and_unchanged() -> None:
    """Each data file the repository carries is named, with its origin and licence, in the
    README beside it; the compressed ones decompress to the sha256 recorded there."""
    import hashlib

    sources = (REPO / "tests" / "data" / "SOURCES.md").read_text(encoding="utf-8")
    for packed in sorted((REPO / "tests" / "data").rglob("*.xz")):
        rel = packed.relative_to(REPO / "tests" / "data").as_posix()
        line = next((x for x in sources.splitlines() if f"`{rel}`" in x), None)
        assert line is not None, f"{rel} is not listed in tests/data/SOURCES.md"
        assert "CC-BY-4.0" in line or "Apache-2.0" in line, rel
        with lzma.open(packed) as handle:
            digest = hashlib.file_digest(handle, "sha256").hexdigest()  # type: ignore[arg-type]
        assert f"`{digest}`" in line, f"{rel} no longer decompresses to the recorded file"
    readme = (SHIPPED.parent / "README.md").read_text(encoding="utf-8")
    for shipped in sorted(SHIPPED.parent.iterdir()):
        if shipped.name != "README.md":
            assert f"`{shipped.name}`" in readme and "CC-BY-4.0" in readme, shipped.name
