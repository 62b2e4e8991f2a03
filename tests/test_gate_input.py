"""`fairbench gate` given a summary it cannot use exits 2 with one line naming the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from fairbench.decide.gate import GateError, load_summary
from tests.cli import run_cli


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no summary here"),
        ('{"valid": true, "overall": {', "not valid JSON (line 1"),
        ("[1, 2]", "not a fairbench summary"),
        ('{"rules": []}', "not a fairbench summary"),
        (b"\xff\xfe\x00binary", "cannot read the summary"),
    ],
)
def test_unusable_summaries_are_one_line(
    tmp_path: Path, content: str | bytes | None, message: str
) -> None:
    file = tmp_path / "summary.json"
    if isinstance(content, bytes):
        file.write_bytes(content)
    elif content is not None:
        file.write_text(content)
    for given in (file, tmp_path):  # the file itself, or the run directory holding it
        with pytest.raises(GateError) as info:
            load_summary(given)
        assert len(info.value.lines) == 1
        assert info.value.lines[0].startswith(f"{file}: ") and message in info.value.lines[0]


def test_the_gate_command_exits_2_with_one_line(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - valid == true\n")
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "summary.json").write_text('{"valid": tr')
    missing = tmp_path / "missing"
    missing.mkdir()
    for candidate in (corrupt, missing):
        result = run_cli("gate", "--candidate", str(candidate), "--rules", str(rules))
        assert result.returncode == 2, result.stdout + result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
        assert lines[0].startswith(str(candidate / "summary.json"))
