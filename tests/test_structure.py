"""The package's shape: data flows one way, so imports go down the layer table, form no cycle, and the host
keeps off worker training."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SUITE = Path(__file__).resolve().parents[1] / "suite"


def _module(path: Path) -> str:
    parts = path.relative_to(SUITE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph(types_too: bool = True) -> dict[str, set[str]]:
    """suite module -> the suite modules it imports, at any depth in the file (lazy imports count too);
    without ``types_too``, less those under ``if TYPE_CHECKING:`` (read by the type checker only)."""
    modules = {_module(p): p for p in SUITE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        typing_only = {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
            for stmt in node.body
            for inner in ast.walk(stmt)
        }
        for node in ast.walk(tree):
            if not types_too and id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                # "from suite.spec import plan" and "from suite.spec.plan import RunSpec" both import suite.spec.plan.
                subs = {f"{node.module}.{a.name}" for a in node.names}
                found |= (subs & set(modules)) or {node.module}
        graph[name] = {m for m in found if m in modules and m != name and m != "suite"}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle_in_the_package() -> None:
    # A module may name a type of a module that imports it (the Ray pool's functions in head and
    # stopping take the pool), as the type checker alone reads that import.
    cycle = _cycle(_graph(types_too=False))
    assert cycle is None, " -> ".join(cycle or [])


# The stages of suite/, bottom up. A module may import its own stage and the stages of lower rows,
# never a stage of its own row or of a row above: data flows scenario -> plan -> run -> record ->
# report, and what a stage stands on sits below it. A new package or top-level module needs a row.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("worker", "telemetry"),  # the worker imports nothing of the host (test_worker_imports)
    ("paths", "safe"),  # where files lie; untrusted input made safe
    ("environment",),  # images, locks, the Docker engine, MNIST on the host, host facts
    ("spec",),  # scenario files, settings, names, plan, -k, schema
    ("record",),  # the result record and its provenance
    ("report",),  # results -> points, figures, verdicts, pages
    ("backends",),  # a RunSpec -> a RunResult
    ("run",),  # the plan loop, fleet, progress
    ("reproduce",),
    ("command line",),  # cli/, envinfo, __main__
)
COMMAND_LINE = {"suite.cli", "suite.envinfo", "suite.__main__"}  # and the modules of suite.cli


def _stage(module: str) -> str:
    if module in COMMAND_LINE or module.startswith("suite.cli."):
        return "command line"
    return module.split(".")[1]


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import from one stage to another that is not in a lower row of LAYERS."""
    row = {stage: i for i, stages in enumerate(LAYERS) for stage in stages}
    return [
        f"{module} ({_stage(module)}) imports {dep} ({_stage(dep)})"
        for module, deps in sorted(graph.items())
        for dep in sorted(deps)
        if _stage(dep) != _stage(module) and row[_stage(dep)] >= row[_stage(module)]
    ]


def test_every_module_belongs_to_a_stage_of_the_layer_table() -> None:
    stages = {stage for stages in LAYERS for stage in stages}
    unplaced = sorted(m for m in _graph() if m != "suite" and _stage(m) not in stages)
    assert not unplaced, f"add a row (or a stage to a row) of LAYERS for: {unplaced}"


def test_no_import_goes_up_the_layer_table() -> None:
    assert _upward(_graph()) == []


def test_the_layer_check_sees_an_import_that_goes_up_or_sideways() -> None:
    graph = {
        "suite.spec.select": {"suite.report.points", "suite.spec.plan", "suite.environment.datasets"},
        "suite.backends.ray_cluster": {"suite.run.runner"},
        "suite.worker.train": {"suite.telemetry.core"},
        "suite.cli": {"suite.envinfo", "suite.reproduce"},
    }
    assert _upward(graph) == [
        "suite.backends.ray_cluster (backends) imports suite.run.runner (run)",
        "suite.spec.select (spec) imports suite.report.points (report)",
        "suite.worker.train (worker) imports suite.telemetry.core (telemetry)",
    ]


def test_plan_does_not_import_the_yaml_loader() -> None:
    assert "suite.spec.scenario" not in _graph()["suite.spec.plan"]


def test_host_side_never_imports_the_worker_training_module() -> None:
    graph = _graph()
    users = [m for m, deps in graph.items() if "suite.worker.train" in deps and not m.startswith("suite.worker")]
    assert not users, f"host modules importing suite.worker.train: {users}"


@pytest.mark.parametrize(
    "module", ["suite.spec.settings", "suite.spec.plan", "suite.spec.scenario", "suite.run.runner", "suite.cli"]
)
def test_each_module_imports_alone(module: str) -> None:
    proc = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_local_backend_cli_and_catalog_never_import_docker() -> None:
    code = (
        "import sys; from pathlib import Path; "
        "from suite import backends, cli; from suite.environment import image_catalog; "
        "backends.make('local', backends.BackendOptions('m', Path('r'))); "
        "assert 'docker' not in sys.modules, 'docker-py was imported'"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


READERS = [
    "report/pages",
    "report/points",
    "report/verdicts",
    "report/plots",
    "report/compare",
    "run/runner",
    "run/closing",
]


@pytest.mark.parametrize("module", READERS)
def test_readers_name_statuses_and_figures_by_the_constants_in_results(module: str) -> None:
    from suite.record import results

    fields = [v for v in vars(results).values() if isinstance(v, results.Field)]
    # run and environment keys also name settings (a config's "backend", "image"): only figures are checked.
    spelled_once = {f.key for f in fields if f.section in ("timing", "quality", "work")} | set(results.STATUSES)
    path = SUITE / f"{module}.py"
    literals = {
        node.value
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }
    assert not literals & spelled_once, f"{module} spells {sorted(literals & spelled_once)}; use suite.record.results"
