"""The advice page (`advice.html` of `fairbench advise`): the recommendation against the
scenario's own configuration with intervals, the search's Pareto front, what each knob did
(importance), the verification table, the advised block and every trial.

It renders advice.json (fairbench.decide.advise.outputs) and computes nothing: the front, the
importance and the intervals are the search's and the verification's own figures.
"""

from __future__ import annotations

import html
import json
import math
from typing import Any

import yaml

from fairbench.report.decisions import axis_title
from fairbench.report.html import fig_html, figure, page, table

# What the verification interval's promise was measured to be (benchmarks/bench_advise.py,
# docs/advise.md): the page says it where the interval is shown.
COVERAGE = (
    "Approximate: over 5 seeds of 60 s runs these covered the long-run mean in 86–93% of draws "
    "for a nominal 95% (docs/advise.md), lowest for a class near 100% with rare bad seeds; "
    "longer runs and more seeds bring it closer."
)
GREY, BLUE, RED, BLACK, GREEN = "#9e9e9e", "#1f77b4", "#d62728", "#222222", "#1a7f37"


def _pct(x: Any) -> str:
    return "-" if not isinstance(x, int | float) or not math.isfinite(x) else f"{x:.1%}"


def _num(x: Any) -> str:
    if not isinstance(x, int | float) or not math.isfinite(x):
        return "-"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"


def _ci(entry: dict[str, Any], fmt: Any = _pct, signed: bool = False) -> str:
    """`mean [low, high]`, or the mean and why there is no interval."""
    mean = entry.get("mean")
    show = (lambda v: ("+" if v is not None and v >= 0 else "") + fmt(v)) if signed else fmt
    if entry.get("ci_low") is None or entry.get("ci_high") is None:
        why = entry.get("ci_reason") or "no interval"
        return f"{show(mean)} <span class='note'>({html.escape(str(why))})</span>"
    return f"{show(mean)} [{show(entry['ci_low'])}, {show(entry['ci_high'])}]"


def _headline(doc: dict[str, Any]) -> list[str]:
    rec = doc.get("recommendation")
    out = [f"<h1>Advice for {html.escape(doc['scenario'])}</h1>"]
    if doc.get("refused"):
        out.append(f"<p class='invalid'><b>No advice:</b> {html.escape(doc['refused'])}</p>")
    elif rec is not None:
        sure = (
            "every interval's low end clears its target"
            if rec["confident"]
            else "on average over the verification seeds (not every interval's low end clears "
            "its target)"
        )
        what = "the scenario's own configuration" if rec["trial"] is None else rec["label"]
        out.append(
            f"<p class='valid'><b>Recommended: {html.escape(what)}</b>, meets every SLO {sure}.</p>"
        )
    seeds = doc["verify_seeds"]
    notes = "".join(f" {html.escape(n)}." for n in doc["notes"])
    out.append(
        f"<p class='note'>{doc['budget']} trials on seed {doc['seed']}, verified on seeds "
        f"{seeds[0]}–{seeds[-1]}; simulated on profile <code>{html.escape(doc['profile'])}</code>, "
        f"{html.escape(doc['fidelity'])}.{notes}</p>"
    )
    targets = ", ".join(
        f"{html.escape(t['class'])} {html.escape(t['slo'])} for ≥ {t['needs']:.0%}"
        for t in doc["targets"]
    )
    out.append(f"<p>Targets: {targets}.</p>")
    return out


def _verification(doc: dict[str, Any]) -> list[str]:
    rows_v = doc["verification"]
    if not rows_v:
        return []
    targets = [t["class"] for t in doc["targets"]]
    objectives = [
        o["name"] for o in doc["objectives"] if not o["name"].startswith("slo_attainment.class.")
    ]
    head = [
        "configuration",
        *(f"{c} attainment" for c in targets),
        *(f"{c} gain over own" for c in targets),
    ]
    head += [*objectives, "headroom", "meets"]
    rows = []
    rec = doc.get("recommendation") or {}
    for v in rows_v:
        name = html.escape(v["label"]) + (
            " <b>(recommended)</b>" if v["label"] == rec.get("label") else ""
        )
        rows.append(
            [
                name,
                *(_ci(v["attainment"][c]) for c in targets),
                *(_ci(v["gain"][c], signed=True) if c in v["gain"] else "-" for c in targets),
                *(_ci(v["values"][n], _num) for n in objectives),
                ("+" if (v["headroom"] or 0) >= 0 else "") + _pct(v["headroom"]),
                (
                    "<span class='better'>yes</span>"
                    if v["meets"]
                    else "<span class='worse'>no</span>"
                )
                + (" (confident)" if v["confident"] else ""),
            ]
        )
    first = rows_v[0]["attainment"][targets[0]]
    method = html.escape(
        f"{first.get('ci_method')}, {first.get('ci_confidence', 0):.0%} confidence"
    )
    fig = figure()
    for v in rows_v:
        means = [v["attainment"][c]["mean"] for c in targets]
        lo = [v["attainment"][c]["ci_low"] for c in targets]
        hi = [v["attainment"][c]["ci_high"] for c in targets]
        err = {
            "type": "data",
            "symmetric": False,
            "array": [
                (h - m) if h is not None and m is not None else 0
                for h, m in zip(hi, means, strict=True)
            ],
            "arrayminus": [
                (m - lo_) if lo_ is not None and m is not None else 0
                for lo_, m in zip(lo, means, strict=True)
            ],
        }
        fig.add_bar(x=targets, y=means, name=v["label"], error_y=err)
    for t in doc["targets"]:
        fig.add_scatter(
            x=[t["class"]],
            y=[t["needs"]],
            mode="markers",
            name=f"{t['class']} needs {t['needs']:.0%}",
            marker={"symbol": "line-ew-open", "size": 40, "color": BLACK, "line": {"width": 3}},
        )
    fig.update_layout(
        barmode="group",
        title="SLO attainment on the verification seeds (mean, bars: the interval)",
        yaxis_title="SLO attainment (fraction 0–1, higher is better)",
        yaxis_range=[0, 1.05],
    )
    return [
        "<h2>Recommendation against the scenario's own configuration</h2>",
        fig_html(fig, "verify", height=420),
        table(
            head,
            rows,
            caption=f"Intervals: {method}. Gain: the paired difference per seed. {COVERAGE}",
            left=(0,),
        ),
    ]


def _spread_most(
    objectives: list[dict[str, Any]], trials: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The two objectives whose values varied most across the trials, relative to their size
    (range ÷ largest magnitude), in the order advice.json lists them: an axis on which every
    trial reads 100% shows nothing."""

    def spread(name: str) -> float:
        got = [t["values"].get(name) for t in trials]
        vals = [v for v in got if isinstance(v, int | float) and math.isfinite(v)]
        if not vals:
            return -1.0
        size = max(abs(v) for v in vals)
        return (max(vals) - min(vals)) / size if size > 0 else 0.0

    ranked = sorted(range(len(objectives)), key=lambda i: (-spread(objectives[i]["name"]), i))
    return [objectives[i] for i in sorted(ranked[:2])]


def _front(doc: dict[str, Any]) -> list[str]:
    objectives = doc["objectives"]
    trials = [t for t in doc["trials"] if t["error"] is None]
    if len(objectives) < 2 or not trials:
        return []
    shown = _spread_most(objectives, trials)
    (x, sx), (y, sy) = ((o["name"], o["sense"]) for o in shown)
    rec = (doc.get("recommendation") or {}).get("trial")
    groups = (
        ("infeasible (misses an SLO)", lambda t: not t["feasible"], GREY, "x"),
        ("feasible, dominated", lambda t: t["feasible"] and not t["front"], BLUE, "circle"),
        ("feasible, on the front", lambda t: t["feasible"] and t["front"], RED, "circle"),
    )
    fig = figure()
    for name, keep, color, symbol in groups:
        chosen = [t for t in trials if keep(t)]
        fig.add_scatter(
            x=[t["values"][x] for t in chosen],
            y=[t["values"][y] for t in chosen],
            mode="markers+text",
            name=f"{name} ({len(chosen)})",
            marker={"color": color, "size": 10, "symbol": symbol},
            text=[f"#{t['number']}" + (" ★" if t["number"] == rec else "") for t in chosen],
            textposition="top center",
            hovertext=[json.dumps(t["used"]) for t in chosen],
        )
    own = doc["own"]
    if own["error"] is None:
        fig.add_scatter(
            x=[own["values"][x]],
            y=[own["values"][y]],
            mode="markers",
            name="the scenario's own configuration",
            marker={"color": BLACK, "size": 14, "symbol": "star"},
        )
    fig.update_layout(
        title=f"The search on seed {doc['seed']}: each number is a trial (★ recommended)",
        xaxis_title=axis_title(x, "higher is better" if sx == "max" else "lower is better"),
        yaxis_title=axis_title(y, "higher is better" if sy == "max" else "lower is better"),
    )
    prog = figure()
    prog.add_scatter(
        x=[t["number"] for t in trials],
        y=[t["headroom"] for t in trials],
        mode="markers+lines",
        name="headroom of each trial",
        marker={"color": BLUE},
    )
    prog.add_scatter(
        x=[0, max(t["number"] for t in trials)],
        y=[0, 0],
        mode="lines",
        name="every SLO just met",
        line={"color": GREEN, "dash": "dot"},
    )
    prog.update_layout(
        title="Headroom by trial: the tightest SLO's attainment − what it needs",
        xaxis_title="trial",
        yaxis_title="headroom (fraction, > 0 meets every SLO)",
    )
    more = ", ".join(html.escape(o["name"]) for o in objectives if o not in shown)
    note = (
        f" The front is over every objective ({more} too); the plot shows the two that varied "
        "most across the trials (range over the largest magnitude)."
        if more
        else ""
    )
    return [
        "<h2>The search</h2>",
        f"<p class='note'>Feasible: every target met on the search seed.{note}</p>",
        fig_html(fig, "front", height=480),
        fig_html(prog, "progress", height=340),
    ]


def _importance(doc: dict[str, Any]) -> list[str]:
    imp = doc.get("importance") or {}
    out = [
        "<h2>What each knob did</h2>",
        f"<p class='note'>{html.escape(doc['importance_method'])}</p>",
    ]
    if imp:
        knobs = [k["name"] for k in doc["knobs"]]
        fig = figure()
        for target, shares in imp.items():
            fig.add_bar(
                y=knobs, x=[shares.get(k, 0.0) for k in knobs], name=target, orientation="h"
            )
        fig.update_layout(
            barmode="group",
            title="What each knob explains alone of each figure's variance across trials (ω²)",
            xaxis_title="ω² (share of variance, 0–1; ≈ 0: the knob did not move it)",
            yaxis={"autorange": "reversed"},
        )
        out.append(
            fig_html(fig, "importance", height=max(360, 26 * len(knobs) * max(1, len(imp)) // 2))
        )
    rows = [
        [html.escape(k["name"]), html.escape(k["range"]), html.escape(k["sets"])]
        for k in doc["knobs"]
    ]
    out.append(
        table(["knob", "range", "what it sets"], rows, caption="The searched space", left=(0, 1, 2))
    )
    return out


def _trials(doc: dict[str, Any]) -> list[str]:
    targets = [t["class"] for t in doc["targets"]]
    names = [o["name"] for o in doc["objectives"]]
    rows = []
    for t in doc["trials"]:
        used = ", ".join(
            f"{k}={_num(v) if isinstance(v, float) else v}" for k, v in t["used"].items()
        )
        rows.append(
            [
                f"#{t['number']}",
                html.escape(used),
                *(_pct(t["attainment"].get(c)) for c in targets),
                *(_num(t["values"].get(n)) for n in names),
                _pct(t["headroom"]),
                "front"
                if t["front"]
                else ("feasible" if t["feasible"] else html.escape(t["error"] or "misses")),
                f"<a href='{html.escape(t['run_dir'])}/summary.json'>run</a>",
            ]
        )
    head = [
        "trial",
        "knobs it used",
        *(f"{c} attainment" for c in targets),
        *names,
        "headroom",
        "",
        "run",
    ]
    return [
        f"<details><summary>Every trial ({len(rows)})</summary>",
        table(head, rows, left=(0, 1)),
        "</details>",
    ]


def advice_report(doc: dict[str, Any]) -> str:
    """The page of one advice search, from its advice.json."""
    body = _headline(doc)
    rec = doc.get("recommendation")
    if rec is not None:
        block = yaml.safe_dump({"scheduler": rec["block"]}, sort_keys=False, width=100)
        body += ["<h2>The advised block (advice.yaml)</h2>", f"<pre>{html.escape(block)}</pre>"]
    body += _verification(doc) + _front(doc) + _importance(doc) + _trials(doc)
    return page(f"fairbench advise {doc['scenario']}", body)
