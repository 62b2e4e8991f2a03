"""What `fairbench profile` computes around the probe: its flags checked (one line each, naming
the flag and the fix), the probe's design from them, `--merge`'s refit with its errors named
by flag, and the rows and lines the command prints.

It exists so that cli/profile.py only parses options, calls these and prints, and so that the
checks and the printed figures are tested without typer (tests/test_command_libraries.py).
Imports this package's `model`, `fit` and `files`; the probe itself is `emit.run_profile`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from fairbench.targets.profile.model import ENGINES, ProbeDesign

if TYPE_CHECKING:
    from fairbench.targets.profile.fit import Fit
    from fairbench.targets.profile.model import ProbeResult


class ProfileUsage(ValueError):
    """A flag of `fairbench profile` that cannot be used as given: one line naming it and what
    to give instead (the command prints it and exits 2)."""


def check_out(out_file: Path) -> None:
    """`--out` must name a file: a directory is refused before anything is probed or read."""
    if out_file.exists() and out_file.is_dir():
        raise ProfileUsage(f"--out {out_file}: a directory; give the profile's file name")


def probe_url(target_url: str | None, engine: str) -> str:
    """The engine's base URL from `--target-url` (no trailing slash or `/v1`), after the flags
    that make a probe possible are checked: a URL is given, `--engine` names an engine."""
    if target_url is None:
        raise ProfileUsage(
            "--target-url is missing: give the engine's base URL, e.g. "
            "--target-url http://127.0.0.1:8000 (or --merge FILE to refit earlier probes)"
        )
    if engine not in (*ENGINES, "auto"):
        raise ProfileUsage(
            f"--engine {engine}: not an engine; use one of {', '.join(ENGINES)} or auto"
        )
    return target_url.rstrip("/").removesuffix("/v1")


def check_url(url: str, target_url: str) -> None:
    """`url` (probe_url's) must be an http(s) URL with a host; `target_url` is the flag as given,
    which the line quotes."""
    if not url.startswith(("http://", "https://")) or url[-3:] == "://":
        raise ProfileUsage(
            f"--target-url {target_url}: not an http(s) URL; e.g. http://127.0.0.1:8000"
        )


def probe_design(
    max_num_seqs: int | None,
    max_num_batched_tokens: int | None,
    kv_cache_tokens: int | None,
    **fields: Any,
) -> tuple[ProbeDesign, set[str]]:
    """The probe's design from the flags (`fields` are ProbeDesign's other fields as given),
    and which engine limits the user gave: those the engine's self-description must not
    override. A limit not given starts at its default and is replaced by what the engine says."""
    limits = {
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max_num_batched_tokens,
        "kv_cache_tokens": kv_cache_tokens,
    }
    design = ProbeDesign(
        max_num_seqs=max_num_seqs or 8,
        max_num_batched_tokens=max_num_batched_tokens or 2048,
        kv_cache_tokens=kv_cache_tokens,
        **fields,
    )
    return design, {k for k, v in limits.items() if v is not None}


def merge(files: list[Path], out_file: Path, name: str | None) -> dict[str, Any]:
    """`--merge FILE...`: refit the sources' pooled probe data into `out_file`; the merged
    document. Every error is one ProfileUsage line naming the flag."""
    from fairbench.targets.profile.files import ProfileFileError, merge_files
    from fairbench.targets.profile.merge import MergeError
    from fairbench.targets.profile.model import ProbeError

    check_out(out_file)
    try:
        return merge_files(files, out_file, name)
    except ProfileFileError as error:
        raise ProfileUsage(str(error)) from None
    except MergeError as error:
        raise ProfileUsage(f"--merge {error}") from None
    except ProbeError as error:  # the pooled data cannot be fitted
        raise ProfileUsage(f"--merge: {error}") from None


def merged_rows(merged: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(profile, rounds, a, d): each source's step constants, then the merged fit's, so the
    drift between the probes shows beside the result."""
    sources: list[dict[str, Any]] = merged["fit"]["merged_from"]
    rows = [(s["profile"], str(s["rounds"]), f"{s['a']}", f"{s['d']}") for s in sources]
    fitted = merged["fit"]["rounds"]
    rows.append(("merged", str(fitted), f"{merged['a']:.4g}", f"{merged['d']:.4g}"))
    return rows


def coefficient_rows(fit: Fit) -> list[tuple[str, str, str]]:
    """(coefficient, value, spread): each fitted coefficient with its standard error, then the
    front end's core time, the arrival phase's direct measure of the same thing, and the idle
    wake, each a median with its median absolute deviation."""
    rows = [(k, f"{v:.4g}", f"{fit.stderr[k]:.2g}") for k, v in fit.coefficients.items()]
    if fit.front_end is not None:
        fe = fit.front_end
        rows.append(("front end (core)", f"{fe['core_ms']:.4g}", f"MAD {fe['mad_ms']:.2g}"))
    if fit.arrival is not None:
        arr = fit.arrival
        rows.append(("arrival (direct)", f"{arr['cost_ms']:.4g}", f"MAD {arr['mad_ms']:.2g}"))
    if fit.idle is not None:
        idle = fit.idle
        rows.append(("idle wake", f"{idle['wake_ms']:.4g}", f"MAD {idle['mad_ms']:.2g}"))
    return rows


def probe_lines(result: ProbeResult, budget_s: float) -> list[str]:
    """What the probe did (rounds, seconds, whether the budget cut it) and what the engine said
    of itself."""
    rounds = f"{result.rounds} round(s) of the probe in {result.seconds:.0f} s" + (
        f" (the --budget of {budget_s:g} s allowed no more)" if result.truncated else ""
    )
    info = result.engine
    said = ", ".join(f"{k} {getattr(info, k)}" for k in sorted(info.source) if k != "version")
    engine = (
        f"engine: {info.kind} ({info.detected_by})"
        + (f", version {info.version}" if info.version else "")
        + (f"; it said {said}" if said else "; it said nothing of its limits")
    )
    return [rounds, engine]
