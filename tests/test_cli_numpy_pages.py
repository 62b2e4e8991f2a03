"""`fairbench` asks NumPy not to madvise huge pages, unless the user's environment says
otherwise (fairbench.cli.main.numpy_without_huge_pages; issue 35)."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = (
    "from fairbench.cli.main import numpy_without_huge_pages\n"
    "numpy_without_huge_pages()\n"
    "import numpy\n"
    "from numpy._core import multiarray\n"
    "print(multiarray._set_madvise_hugepage(True))\n"  # returns the setting in force
)


def _huge_pages(env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "NUMPY_MADVISE_HUGEPAGE"}
    if env_value is not None:
        env["NUMPY_MADVISE_HUGEPAGE"] = env_value
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_off_by_default_and_the_users_setting_wins() -> None:
    assert _huge_pages(None) == "False"
    assert _huge_pages("1") == "True"


def test_the_command_does_it_before_numpy_loads() -> None:
    """The console script's `main` runs it first: nothing before it imports NumPy."""
    code = "import sys\nimport fairbench.cli\nprint('numpy' in sys.modules)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
