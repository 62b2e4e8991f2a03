"""`fairbench` run as a user runs it: its own process, from the repository root."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "fairbench.cli"]


def run_cli(*args: str, timeout: float = 120, **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run to the end, output captured."""
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, cwd=REPO, timeout=timeout, **kw
    )


def start_cli(*args: str, **popen: Any) -> subprocess.Popen[str]:
    """Start and return at once, for tests that signal or kill the process."""
    return subprocess.Popen([*CLI, *args], cwd=REPO, text=True, **popen)
