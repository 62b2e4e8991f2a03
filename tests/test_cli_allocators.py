"""`fairbench` asks NumPy not to madvise huge pages and Arrow to allocate with the system's
allocator, unless the user's environment says otherwise (fairbench.cli.main.allocator_settings;
issue 35)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = (
    "from fairbench.cli.main import allocator_settings\n"
    "allocator_settings()\n"
    "import numpy\n"
    "import pyarrow\n"
    "from numpy._core import multiarray\n"
    "print(multiarray._set_madvise_hugepage(True))\n"  # returns the setting in force
    "print(pyarrow.default_memory_pool().backend_name)\n"
)
VARIABLES = ("NUMPY_MADVISE_HUGEPAGE", "ARROW_DEFAULT_MEMORY_POOL")


def _settings(**sets: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    env.update(sets)
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def test_off_by_default_and_the_users_setting_wins() -> None:
    assert _settings() == ["False", "system"]
    assert _settings(NUMPY_MADVISE_HUGEPAGE="1")[0] == "True"
    import pyarrow as pa

    if "jemalloc" not in pa.supported_memory_backends():
        pytest.skip("this pyarrow has no jemalloc to choose")
    assert _settings(ARROW_DEFAULT_MEMORY_POOL="jemalloc")[1] == "jemalloc"


def test_the_command_does_it_before_numpy_and_arrow_load() -> None:
    """The console script's `main` runs it first: nothing before it imports NumPy or Arrow."""
    code = (
        "import sys\nimport fairbench.cli\n"
        "print('numpy' in sys.modules, 'pyarrow' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
