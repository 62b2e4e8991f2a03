"""The profile YAML files `fairbench profile` reads and writes: a fitted profile written with
its header line (what it was fitted from, its residual, how to load it), and `--merge`'s
sources read and their pooled refit written.

It exists so that the command line only parses flags and prints the coefficients; the file
format lives beside the document it holds (`emit.profile_document`, `merge.merge_profiles`).
Imports `emit`, `merge` and their models.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from fairbench.targets.profile.emit import profile_document
from fairbench.targets.profile.fit import Fit
from fairbench.targets.profile.merge import merge_profiles
from fairbench.targets.profile.model import ProbeResult


class ProfileFileError(ValueError):
    """A --merge source that is missing or not a profile (one line naming the file)."""


def write_profile(result: ProbeResult, fit: Fit, out_file: Path, name: str | None) -> None:
    """The fitted profile at `out_file` (named `name`, default the file's stem)."""
    doc = profile_document(result, fit, name or out_file.stem)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    header = (
        f"# Fitted by `fairbench profile` from {result.engine.model}: "
        f"{fit.n} observations in {result.seconds:.0f} s, RMS relative residual "
        f"{fit.rms_relative:.1%}. Load it with scheduler: {{profile: {out_file.name}}}.\n"
    )
    out_file.write_text(header + yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")


def read_sources(files: list[Path]) -> list[tuple[str, dict[str, Any]]]:
    """Each --merge source as (path, document); ProfileFileError names the one that is not."""
    docs: list[tuple[str, dict[str, Any]]] = []
    for path in files:
        if not path.is_file():
            raise ProfileFileError(f"--merge {path}: no such file; give a profile YAML that "
                                   "`fairbench profile` wrote")  # fmt: skip
        try:
            doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError) as error:
            why = str(error).splitlines()[0]
            raise ProfileFileError(f"--merge {path}: not YAML ({why})") from None
        if not isinstance(doc, dict):
            raise ProfileFileError(f"--merge {path}: not a profile (a YAML mapping)")
        docs.append((str(path), doc))
    return docs


def merge_files(files: list[Path], out_file: Path, name: str | None) -> dict[str, Any]:
    """Refit the pooled probe data of `files` and write the merged profile at `out_file`; the
    merged document. Raises ProfileFileError, MergeError or ProbeError (one line each)."""
    docs = read_sources(files)
    merged, the_fit = merge_profiles(docs, name or out_file.stem)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    header = (
        f"# Merged by `fairbench profile --merge` from {len(docs)} probes of "
        f"{(merged['fit'].get('engine') or {}).get('model')}: {the_fit.n} design points, "
        f"{len(the_fit.raw)} observations, RMS relative residual {the_fit.rms_relative:.1%}. "
        f"Load it with scheduler: {{profile: {out_file.name}}}.\n"
    )
    out_file.write_text(header + yaml.safe_dump(merged, sort_keys=False), encoding="utf-8")
    return merged
