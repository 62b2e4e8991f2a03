"""Merging the probe data of several profile files into one fit.

Imports the values, the fit and the document writer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from fairbench.targets.profile.fit import (
    Fit,
    Limits,
)
from fairbench.targets.profile.load import fit
from fairbench.targets.profile.model import (
    Observation,
)

# ---------------------------------------------------------------- merging probes


class MergeError(Exception):
    """The profiles cannot be merged; the message is one line naming the file."""


# What must agree for two profiles to describe one engine: its limits (the simulator loads
# them) and the experiment's design points (a point's median pools its rounds across probes).
MERGE_LIMITS = ("kv_cache_tokens", "max_num_seqs", "max_num_batched_tokens", "chunked_prefill")
MERGE_ENGINE = ("kind", "model")
MERGE_DESIGN = (
    "prefill_lengths",
    "prefill_reps",
    "decode_batches",
    "decode_prompts",
    "decode_tokens",
    "mixed_batch",
    "mixed_prompts",
)


def _observation(row: Any) -> Observation:
    """One `fit.data` row back as an Observation (TypeError if it is not one)."""
    if not isinstance(row, dict):
        raise TypeError(f"not a mapping: {row!r}")
    return Observation(**{**row, "prompts": tuple(row.get("prompts") or ())})


def probe_data(doc: dict[str, Any], where: str) -> list[Observation]:
    """The raw observations a profile's `fit.data` holds (what `profile_document` wrote)."""
    block = doc.get("fit") if isinstance(doc, dict) else None
    rows = block.get("data") if isinstance(block, dict) else None
    if not isinstance(rows, list) or not rows:
        raise MergeError(
            f"{where}: no probe data (fit.data): only a profile `fairbench profile` fitted "
            "from an engine can be merged"
        )
    for key in ("engine", "design"):
        if not isinstance(block.get(key) or {}, dict):
            raise MergeError(f"{where}: fit.{key} is not a mapping")
    try:
        obs = [_observation(row) for row in rows]
    except TypeError:
        raise MergeError(f"{where}: fit.data is not `fairbench profile`'s probe data") from None
    for o in obs:  # a first-form front-end, an idle or an arrival observation is a difference
        low = -math.inf if o.kind in ("frontend", "idle", "arrival") else 0.0
        if not isinstance(o.ms, int | float) or not math.isfinite(o.ms) or o.ms <= low:
            raise MergeError(f"{where}: fit.data has a step of {o.ms!r} ms ({o.key})")
        if o.kind == "load" and not (
            all(isinstance(v, int) and v >= 1 for v in (o.n, o.batch, o.context))
            and isinstance(o.gap_ms, int | float)
            and math.isfinite(o.gap_ms)
            and o.gap_ms >= 0
            and (not o.prompts or len(o.prompts) == o.batch)
            and all(isinstance(v, int) and v >= 1 for v in o.prompts)
        ):
            raise MergeError(f"{where}: fit.data has a load burst it cannot replay ({o.key})")
    return obs


def merge_profiles(
    docs: Sequence[tuple[str, dict[str, Any]]], name: str
) -> tuple[dict[str, Any], Fit]:
    """One profile fitted from the probe data of several profiles of one engine: every round
    of every probe pooled, the median of each design point taken over all of them, fitted as
    one probe's rounds are (`fit`).

    Why: a profile describes the engine as it was while it was probed. Where the engine's
    speed drifts (a shared machine, a neighbour, clocks), the profile that predicts a run is
    the one measured around it: probe right before and right after the run, and merge. The
    merged document is the first's, with the fit, the pooled data and `fit.merged_from` (each
    source's name, rounds, probe seconds and step constants, so the drift between them shows).

    Refused (MergeError, one line naming the file) unless every profile describes one engine
    with one experiment: the same engine kind and model, the same limits (MERGE_LIMITS) and
    the same design points (MERGE_DESIGN)."""
    if not docs:
        raise MergeError("no profiles to merge")
    first_where, first = docs[0]
    raw: list[Observation] = []
    for where, doc in docs:
        raw += probe_data(doc, where)
        for key in MERGE_LIMITS:
            if doc.get(key) != first.get(key):
                raise MergeError(
                    f"{where}: {key} {doc.get(key)} but {first_where} has {first.get(key)}: "
                    "merge only profiles of one engine, started with the same limits"
                )
        for block, keys in (("engine", MERGE_ENGINE), ("design", MERGE_DESIGN)):
            mine, theirs = doc["fit"].get(block) or {}, first["fit"].get(block) or {}
            for key in keys:
                if mine.get(key) != theirs.get(key):
                    raise MergeError(
                        f"{where}: fit.{block}.{key} {mine.get(key)} but {first_where} has "
                        f"{theirs.get(key)}: merge only probes of one engine with one design"
                    )
    limits = Limits(
        int(first.get("max_num_seqs") or 8),
        int(first.get("max_num_batched_tokens") or 2048),
        bool(first.get("chunked_prefill", True)),
    )
    from reference_scheduler.scheduler.config import SchedulerConfigError

    try:
        the_fit = fit(raw, limits)
    except SchedulerConfigError as error:  # the first profile's limits cannot run a burst
        raise MergeError(
            f"{first_where}: its limits cannot simulate the load phase: {error}"
        ) from None
    out = {**first, "name": name, **the_fit.profile_fields(), "mixed_step": the_fit.form}
    if the_fit.front_end is None:  # no load phase in the pooled data: no front end to carry
        out["front_end_core_ms"] = 0.0
    if the_fit.idle is None:  # nor an idle phase: no wake to carry
        out["idle_wake_ms"] = 0.0
    sources = [
        {
            "profile": where,
            "name": doc.get("name"),
            "rounds": doc["fit"].get("rounds"),
            "probe_seconds": doc["fit"].get("probe_seconds"),
            "seed": (doc["fit"].get("design") or {}).get("seed"),
            **{k: doc.get(k) for k in ("a", "d")},
        }
        for where, doc in docs
    ]
    out["fit"] = {
        **first["fit"],
        **the_fit.summary(),
        "rounds": sum(s["rounds"] for s in sources if isinstance(s["rounds"], int)),
        "probe_seconds": round(
            sum(float(v) for s in sources if isinstance(v := s["probe_seconds"], int | float)), 1
        ),
        "truncated_by_budget": any(doc["fit"].get("truncated_by_budget") for _, doc in docs),
        "merged_from": sources,
        "points": the_fit.residuals,
        "data": the_fit.raw,
    }
    if the_fit.front_end is None:
        out["fit"].pop("front_end", None)
    if the_fit.idle is None:
        out["fit"].pop("idle", None)
    if the_fit.arrival is None:
        out["fit"].pop("arrival", None)
    return out, the_fit
