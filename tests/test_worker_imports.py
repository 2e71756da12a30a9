"""The worker runs inside containers with only stdlib, numpy and the framework: enforce it."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

WORKER = Path(__file__).resolve().parents[1] / "suite" / "worker"
ALLOWED_THIRD_PARTY = {"numpy", "tensorflow", "keras", "jax", "torch"}


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_worker_imports_only_stdlib_numpy_framework_and_itself() -> None:
    files = sorted(WORKER.glob("*.py"))
    assert files
    for path in files:
        for name in _imports(path):
            top = name.split(".")[0]
            if name.startswith("suite."):
                assert name.startswith("suite.worker"), f"{path.name} imports host-side {name}"
            elif top == "suite":
                raise AssertionError(f"{path.name} imports the host package {name}")
            else:
                assert top in sys.stdlib_module_names or top in ALLOWED_THIRD_PARTY, f"{path.name} imports {name}"


def test_worker_package_init_pulls_in_nothing() -> None:
    assert not _imports(WORKER / "__init__.py")
    assert not _imports(WORKER.parent / "__init__.py"), "suite/__init__ would load host code into the worker"
