"""Issue 36 item 6: in CI an engine test fails instead of skipping (FAIRBENCH_REQUIRE_ENGINE=1,
exported by .ci/run before the tests; the vLLM setup is tried twice and then fails CI, its first
attempt in the background while the project installs); elsewhere it still skips with the
reason. The setup's logic runs for real in the last test, with a stand-in setup script."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.engines.vllm_server import engine_python


@pytest.mark.parametrize("python", ["", "unavailable: pip said no", "/nonexistent/python"])
def test_no_engine_skips_locally_and_fails_where_required(
    monkeypatch: pytest.MonkeyPatch, python: str
) -> None:
    monkeypatch.setenv("FAIRBENCH_VLLM_PYTHON", python)
    monkeypatch.delenv("FAIRBENCH_REQUIRE_ENGINE", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no real vLLM"):
        engine_python()
    monkeypatch.setenv("FAIRBENCH_REQUIRE_ENGINE", "1")
    with pytest.raises(pytest.fail.Exception, match="may not skip"):
        engine_python()


def test_ci_requires_the_engine_and_retries_its_setup_once() -> None:
    run = (Path(__file__).resolve().parents[1] / ".ci" / "run").read_text()
    lines = [line.strip() for line in run.splitlines()]
    assert "export FAIRBENCH_REQUIRE_ENGINE=1" in lines
    assert "for attempt in 1 2; do" in lines
    setup = lines.index("for attempt in 1 2; do")
    assert "exit 1" in lines[setup:], "a setup that failed twice must fail CI"
    assert lines.index("export FAIRBENCH_REQUIRE_ENGINE=1") < lines.index(
        "pip install -e '.[dev]' && pytest"
    )
    # the first attempt starts before the project's install, the wait comes after the gate
    assert lines.index("vllm_setup 1 &") < lines.index("python3 -m venv .venv-ci")
    assert lines.index(
        "fairbench run scenarios/gate-dogfood.yaml --out .ci-out/dogfood --quiet"
    ) < (lines.index("for attempt in 1 2; do"))


_STAND_IN = """#!/usr/bin/env bash
# fails the first $FAILS calls, then prints a python as the real setup does (last line)
n=$(cat calls 2>/dev/null || echo 0); echo $((n + 1)) > calls
echo "installing" >&2
if [ "$n" -lt "$FAILS" ]; then echo "pip said no (call $((n + 1)))" >&2; exit 1; fi
echo "some progress"
command -v python3
"""


def _setup_part(run: str) -> str:
    """.ci/run's vLLM setup: the function, its background start, and the wait-and-retry loop
    through the export (the install, the gate and the tests left out)."""
    lines = run.splitlines()
    end = lines.index('export FAIRBENCH_VLLM_PYTHON="$VLLM_PY"')
    loop = lines.index('VLLM_PY=""')
    return "\n".join([*_setup_start(lines), *lines[loop : end + 1]])


def _setup_start(lines: list[str]) -> list[str]:
    """.ci/run's lines from the setup's function to the trap that stops it on an early exit."""
    start = lines.index("vllm_setup() {")
    trap = next(i for i, line in enumerate(lines) if line.startswith("trap "))
    return ["set -euo pipefail", "mkdir -p .ci-out", *lines[start : trap + 1]]


@pytest.mark.parametrize(
    ("fails", "rc", "said"),
    [(0, 0, []), (1, 0, ["attempt 1"]), (2, 1, ["attempt 1", "attempt 2", "twice"])],
)
def test_the_setup_is_waited_for_and_retried_once(
    tmp_path: Path, fails: int, rc: int, said: list[str]
) -> None:
    run = (Path(__file__).resolve().parents[1] / ".ci" / "run").read_text()
    script = _setup_part(run) + '\necho "engine=$FAIRBENCH_VLLM_PYTHON"\n'
    (tmp_path / "tests" / "engines").mkdir(parents=True)
    (tmp_path / "tests" / "engines" / "setup_vllm_cpu.sh").write_text(_STAND_IN)
    proc = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env={**os.environ, "FAILS": str(fails)},
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == rc, out
    assert (tmp_path / "calls").read_text().strip() == str(min(fails + 1, 2))
    for words in said:
        assert words in out, out
    if rc == 0:
        assert f"engine={shutil.which('python3')}" in proc.stdout, out
        assert "attempt 2" not in out


def test_a_failure_before_the_wait_stops_the_setup(tmp_path: Path) -> None:
    """The gate (or ruff) failing ends .ci/run at once under `set -e`: the setup in the
    background is stopped with it, not left installing for up to 25 minutes."""
    run = (Path(__file__).resolve().parents[1] / ".ci" / "run").read_text()
    script = "\n".join([*_setup_start(run.splitlines()), "sleep 1", "false", "echo unreachable"])
    (tmp_path / "tests" / "engines").mkdir(parents=True)
    (tmp_path / "tests" / "engines" / "setup_vllm_cpu.sh").write_text(
        "echo $$ > pid\nsleep 60\necho done > finished\n"
    )
    proc = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 1 and "unreachable" not in proc.stdout
    pid = int((tmp_path / "pid").read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        raise AssertionError("the background setup outlived the script")
    assert not (tmp_path / "finished").exists()
