"""How far a simulated run is from a real one on the same plan: `fairbench fidelity REAL SIM`.

A simulator is worth sweeping in only if it predicts the engine it stands for. fairbench can
run one plan, byte for byte, against the real engine and against the simulator, so the two
runs' figures are comparable request set for request set: the plan digests must be equal
(otherwise the error would measure the workload's difference, not the simulator's).

For the run overall, each tenant and each SLO class, every figure below is read from the two
summaries — the registry's definitions (fairbench.analysis.registry), never recomputed here —
and the signed error `(sim − real) ÷ real` and its absolute value are given in percent, with
the mean absolute percentage error (MAPE) over all of them and per group:

- latency: TTFT p50 and p99, TPOT p50, E2E p50 and p99 (registry metrics);
- ITL p99: the p99 over requests of each request's largest inter-token gap
  (`latency_ms.itl_max.p99` of the summary: records keep each request's largest gap, not every
  gap, so this is the tail the records can show);
- throughput (requests that ended ok per second);
- fairness: the backlogged service difference and Jain's index among backlogged tenants
  (overall: they are timeline figures of the whole run), and isolation where the run has it
  (a simulated run computes its solo arm; a live run has none, and the row says so).

The noise floor: a second real run of the same plan (`--noise RUN2`) gives, per figure,
`|real₂ − real| ÷ real` — how much the engine differs from itself. Each simulator error is
judged against it: `within noise` when |error| ≤ factor × noise, `beyond noise` otherwise
(factor 1 by default). Without a second run no error is judged: `no noise run`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fairbench.analysis import registry

# (figure, registry name or summary path template, unit, groups). `{g}` in a path is the
# group's block (`overall`, `tenants.<id>`, `slo_classes.<name>`).
LATENCY = ("ttft_p50", "ttft_p99", "tpot_p50", "e2e_p50", "e2e_p99")
ITL = "itl_p99"
ITL_PATH = "{g}.latency_ms.itl_max.p99"
PER_GROUP = (*LATENCY[:3], ITL, *LATENCY[3:], "throughput")
FAIRNESS_OVERALL = ("service_difference", "jain_backlogged", "isolation")
PER_TENANT_EXTRA = ("isolation",)
GROUP_BLOCK = {"tenant": "tenants", "class": "slo_classes"}


class FidelityRefused(Exception):
    """The runs cannot be compared for fidelity; the message (one line) says why."""


@dataclass(frozen=True)
class Row:
    """One figure of one group: real, simulated, (second real), the error and its judgement."""

    figure: str
    group: str  # overall | tenant | class
    key: str | None
    unit: str
    real: float
    sim: float
    noise_run: float = math.nan

    @property
    def name(self) -> str:
        return self.figure if self.group == "overall" else f"{self.figure}.{self.group}.{self.key}"

    @property
    def error_pct(self) -> float:
        """Signed: (sim − real) ÷ real, in percent; NaN where real is 0 or either is missing."""
        return _pct(self.sim, self.real)

    @property
    def noise_pct(self) -> float:
        """|real₂ − real| ÷ real in percent; NaN without a noise run."""
        return abs(_pct(self.noise_run, self.real))

    def judged(self, factor: float = 1.0) -> str:
        err, noise = self.error_pct, self.noise_pct
        if not math.isfinite(err):
            return "cannot evaluate"
        if not math.isfinite(noise):
            return "no noise run"
        return "within noise" if abs(err) <= factor * noise else "beyond noise"

    def as_dict(self, factor: float = 1.0) -> dict[str, Any]:
        err = self.error_pct
        return {
            "name": self.name,
            "figure": self.figure,
            "group": self.group,
            "key": self.key,
            "unit": self.unit,
            "real": _clean(self.real),
            "sim": _clean(self.sim),
            "noise_run": _clean(self.noise_run),
            "error_pct": _clean(err),
            "abs_error_pct": _clean(abs(err)),
            "noise_pct": _clean(self.noise_pct),
            "judgement": self.judged(factor),
        }


def _pct(x: float, ref: float) -> float:
    if not (math.isfinite(x) and math.isfinite(ref)) or ref == 0:
        return math.nan
    return 100.0 * (x - ref) / ref


def _clean(v: float) -> float | None:
    return None if not math.isfinite(v) else round(float(v), 6)


@dataclass
class Fidelity:
    real: Path
    sim: Path
    noise: Path | None
    plan_digest: str
    factor: float = 1.0
    rows: list[Row] = field(default_factory=list)

    def finite(self, group: str | None = None, key: str | None = None) -> list[Row]:
        return [
            r
            for r in self.rows
            if math.isfinite(r.error_pct)
            and (group is None or r.group == group)
            and (key is None or r.key == key)
        ]

    def mape(self, group: str | None = None, key: str | None = None) -> float:
        rows = self.finite(group, key)
        return sum(abs(r.error_pct) for r in rows) / len(rows) if rows else math.nan

    def get(self, name: str) -> Row | None:
        return next((r for r in self.rows if r.name == name), None)

    def groups(self) -> list[tuple[str, str | None]]:
        seen: list[tuple[str, str | None]] = []
        for r in self.rows:
            if (r.group, r.key) not in seen:
                seen.append((r.group, r.key))
        return seen

    def as_dict(self) -> dict[str, Any]:
        judged = [r.judged(self.factor) for r in self.rows]
        return {
            "real": str(self.real),
            "sim": str(self.sim),
            "noise": None if self.noise is None else str(self.noise),
            "plan_digest": self.plan_digest,
            "noise_factor": self.factor,
            "mape_pct": _clean(self.mape()),
            "mape_by_group": {
                ("overall" if g == "overall" else f"{g}.{k}"): _clean(self.mape(g, k))
                for g, k in self.groups()
            },
            "within_noise": judged.count("within noise"),
            "beyond_noise": judged.count("beyond noise"),
            "rows": [r.as_dict(self.factor) for r in self.rows],
        }


def read_summary(path: Path) -> dict[str, Any]:
    """A run directory's summary.json, or a one-line refusal."""
    file = path / "summary.json"
    if not path.is_dir():
        raise FidelityRefused(f"{path}: no such run directory")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FidelityRefused(f"{path}: not a run directory (no summary.json)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise FidelityRefused(f"{file}: cannot read ({error})") from None
    if not isinstance(data, dict):
        raise FidelityRefused(f"{file}: not a summary (expected a JSON object)")
    return data


def _value(summary: Mapping[str, Any], figure: str, group: str, key: str | None) -> float:
    if figure == ITL:
        block = "overall" if group == "overall" else f"{GROUP_BLOCK[group]}.{key}"
        return registry.metric_value(summary, ITL_PATH.format(g=block))
    name = figure if group == "overall" else f"{figure}.{group}.{key}"
    return registry.metric_value(summary, name)


def _unit(figure: str) -> str:
    return "ms" if figure == ITL else registry.get(figure).unit


def check_same_plan(real: Mapping[str, Any], other: Mapping[str, Any], a: Path, b: Path) -> str:
    digest = real.get("plan_digest")
    if not digest or digest != other.get("plan_digest"):
        raise FidelityRefused(
            f"plan_digest differs: {str(digest)[:19]}… ({a}) vs "
            f"{str(other.get('plan_digest'))[:19]}… ({b}); fidelity needs both runs of the same "
            "plan (same scenario workload and seed)"
        )
    return str(digest)


def fidelity(
    real_dir: Path, sim_dir: Path, noise_dir: Path | None = None, factor: float = 1.0
) -> Fidelity:
    """The fidelity rows of `sim_dir` against `real_dir` (and the noise floor of `noise_dir`,
    a second real run of the same plan). Raises FidelityRefused with one line."""
    real, sim = read_summary(real_dir), read_summary(sim_dir)
    digest = check_same_plan(real, sim, real_dir, sim_dir)
    noise = None
    if noise_dir is not None:
        noise = read_summary(noise_dir)
        check_same_plan(real, noise, real_dir, noise_dir)
    for path, s in ((real_dir, real), (sim_dir, sim), (noise_dir, noise)):
        if s is not None and not s.get("valid", False):
            reasons = "; ".join(s.get("invalid_reasons", [])) or "unknown"
            raise FidelityRefused(f"{path} is INVALID ({reasons}); its figures are not compared")
    out = Fidelity(real_dir, sim_dir, noise_dir, digest, factor)

    def add(figure: str, group: str, key: str | None) -> None:
        a, b = _value(real, figure, group, key), _value(sim, figure, group, key)
        if not (math.isfinite(a) or math.isfinite(b)):
            return  # a figure neither run has (isolation of a live run): where present only
        c = math.nan if noise is None else _value(noise, figure, group, key)
        out.rows.append(Row(figure, group, key, _unit(figure), a, b, c))

    for figure in (*PER_GROUP, *FAIRNESS_OVERALL):
        add(figure, "overall", None)
    for group, block in (("tenant", "tenants"), ("class", "slo_classes")):
        keys = sorted(set(real.get(block, {})) | set(sim.get(block, {})))
        for key in keys:
            for figure in PER_GROUP:
                add(figure, group, key)
            if group == "tenant":
                for figure in PER_TENANT_EXTRA:
                    add(figure, group, key)
    return out


def write_outputs(fid: Fidelity, out_dir: Path, markdown: str) -> list[Path]:
    """fidelity.json and fidelity.md in `out_dir` (the HTML page is written by the caller:
    `report` sits above this package)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    js = out_dir / "fidelity.json"
    js.write_text(json.dumps(fid.as_dict(), indent=2) + "\n", encoding="utf-8")
    md = out_dir / "fidelity.md"
    md.write_text(markdown, encoding="utf-8")
    return [js, md]


def ended_early(run_dir: Path) -> int:
    """How many ok requests of a live run produced fewer tokens than they asked for (EOS or a
    stop): a simulated twin runs each to its max_tokens, so its output-length figures differ
    from the live run's by these requests, not by the simulator's speed."""
    import pandas as pd

    records = pd.read_parquet(
        run_dir / "records.parquet", columns=["status", "output_tokens", "max_tokens"]
    )
    ok = records[records["status"] == "ok"]
    return int((ok["output_tokens"] < ok["max_tokens"]).sum())
