"""The tree is the architecture: the import graph is acyclic and layered, and the public API is
exactly what is declared.

The graph counts every import a module can execute — at the top, inside functions, under
TYPE_CHECKING, and the modules a package's lazy `_API` names (fairbench/_lazy.py) — so a lazy
import cannot hide a cycle or a layer broken the wrong way.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Each package may import only packages on its left (and itself).
FAIRBENCH_LAYERS = [
    "fairbench._version",
    "fairbench._lazy",
    "fairbench.workload",
    "fairbench.plan",
    "fairbench.targets",
    "fairbench.run",
    "fairbench.analysis",
    "fairbench.history",
    "fairbench.pipeline",
    "fairbench.decide",
    "fairbench.report",
    "fairbench.cli",
]
REFERENCE_LAYERS = [
    "reference_scheduler.core",
    "reference_scheduler.policies",
    "reference_scheduler.scheduler",
    "reference_scheduler.drivers",
    "reference_scheduler.server",
    "reference_scheduler.gateway",
    "reference_scheduler.__main__",
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (resolved to modules, not names in them)."""
    files = [
        *REPO.joinpath("fairbench").rglob("*.py"),
        *REPO.joinpath("reference_scheduler").rglob("*.py"),
    ]
    modules = {_module_name(p): p for p in files}
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_pkg else name.split(".")[:-1]
                    base = base[: len(base) - node.level + 1]
                    mod = ".".join([*base, node.module] if node.module else base)
                else:
                    mod = node.module or ""
                # `from pkg import sub` imports the module pkg.sub; any other name is pkg's own
                subs = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in modules]
                names = [a for a in node.names if f"{mod}.{a.name}" not in modules]
                targets = subs + ([mod] if names else [])
            elif (
                isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "_API" for t in node.targets)
                and isinstance(node.value, ast.Dict)
            ):
                # a package's lazy names (fairbench/_lazy.py): each value is a module it imports
                targets = [
                    v.value
                    for v in node.value.values
                    if isinstance(v, ast.Constant) and isinstance(v.value, str)
                ]
            for target in targets:
                if target in modules and target != name:
                    graph[name].add(target)
        graph.setdefault(name, set())
    return graph


def _layer(module: str, layers: list[str]) -> int | None:
    for k, prefix in enumerate(layers):
        if module == prefix or module.startswith(prefix + "."):
            return k
    return None


def test_import_graph_is_acyclic() -> None:
    graph = import_graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = [*stack[stack.index(nxt) :], nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


@pytest.mark.parametrize("layers", [FAIRBENCH_LAYERS, REFERENCE_LAYERS], ids=["fairbench", "ref"])
def test_packages_import_only_the_layers_below(layers: list[str]) -> None:
    graph = import_graph()
    broken = []
    for module, deps in graph.items():
        mine = _layer(module, layers)
        if module.split(".")[0] != layers[0].split(".")[0] or module.count(".") == 0:
            continue  # the other project, or the package's own __init__ (the public API)
        assert mine is not None, f"{module} is in no layer: add it to the list or move it"
        for dep in deps:
            theirs = _layer(dep, layers)
            if theirs is not None and theirs > mine:
                broken.append(f"{module} imports {dep} ({layers[theirs]} is above {layers[mine]})")
    assert not broken, "\n".join(broken)


def test_reference_scheduler_never_imports_fairbench() -> None:
    graph = import_graph()
    bad = [
        f"{m} -> {d}"
        for m, deps in graph.items()
        if m.startswith("reference_scheduler")
        for d in deps
        if d.startswith("fairbench")
    ]
    assert not bad


# The public API: adding or removing a name is a decision, made here on purpose.
PUBLIC_API = {
    "fairbench": [
        "CompareRefused",
        "Comparison",
        "Plan",
        "RunOptions",
        "RunOutcome",
        "Scenario",
        "ScenarioError",
        "__version__",
        "build_summary",
        "compare_dirs",
        "comparison_report",
        "evaluate",
        "load_partial_run",
        "load_plan",
        "load_rules",
        "load_scenario",
        "make_target",
        "materialize",
        "metric_value",
        "parse_scenario",
        "read_records",
        "run_scenario",
        "run_sweep",
        "write_run_report",
    ],
}


def _packages() -> list[str]:
    names = []
    for root in ("fairbench", "reference_scheduler"):
        pkg = importlib.import_module(root)
        names.append(root)
        names += [m.name for m in pkgutil.walk_packages(pkg.__path__, root + ".") if m.ispkg]
    return names


def test_top_level_api_is_exactly_the_declared_one() -> None:
    import fairbench

    assert sorted(fairbench.__all__) == PUBLIC_API["fairbench"]
    for name in fairbench.__all__:
        assert getattr(fairbench, name) is not None, name
    with pytest.raises(AttributeError):
        _ = fairbench.not_a_name  # type: ignore[attr-defined]


@pytest.mark.parametrize("package", _packages())
def test_every_package_declares_what_it_exports(package: str) -> None:
    """Each package says why it exists; a package that re-exports names lists them in __all__,
    and each listed name resolves."""
    mod = importlib.import_module(package)
    assert (mod.__doc__ or "").strip(), f"{package} has no docstring saying why it exists"
    exported = getattr(mod, "__all__", None)
    tree = ast.parse(Path(mod.__file__ or "").read_text(encoding="utf-8"))
    reexports = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module != "__future__"]
    if reexports and package != "fairbench":
        assert exported is not None, f"{package} re-exports names but has no __all__"
    for name in exported or []:
        assert hasattr(mod, name), f"{package}.__all__ names {name}, which does not resolve"


def test_every_module_opens_with_why_it_exists() -> None:
    missing = []
    for path in [
        *REPO.joinpath("fairbench").rglob("*.py"),
        *REPO.joinpath("reference_scheduler").rglob("*.py"),
    ]:
        if not ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))):
            missing.append(str(path.relative_to(REPO)))
    assert not missing, missing


def test_no_lazily_exported_name_is_a_submodule() -> None:
    """A package's lazy name (fairbench/_lazy.py) that is also one of its submodules would be
    rebound to the module the moment anything imports that submodule."""
    clashes = []
    for package in _packages():
        mod = importlib.import_module(package)
        api = getattr(mod, "_API", None)
        if not isinstance(api, dict) or not hasattr(mod, "__path__"):
            continue
        subs = {m.name for m in pkgutil.iter_modules(mod.__path__)}
        clashes += [f"{package}.{name}" for name in api if name in subs]
    assert not clashes, clashes
