#!/usr/bin/env bash
# Run the test suite in .venv (set up on first use from requirements/locks/dev-py<X.Y>.txt).
# Arguments go to pytest, e.g. -k scenario.
# Docker tests run when an engine answers and skip with the reason otherwise;
# SUITE_REQUIRE_DOCKER=1 makes a missing engine a failure (CI sets it where the engine exists).
set -euo pipefail
cd "$(dirname "$0")"
. requirements/ensure_venv.sh
VENV=${SUITE_VENV:-.venv}
ensure_venv "$VENV" dev
# Bytecode is written (into the ignored __pycache__ folders): hundreds of `python -m suite` and
# worker processes import the package, and where PYTHONDONTWRITEBYTECODE is set each of them would
# compile it again (0.15 s a process on a 2-core machine).
unset PYTHONDONTWRITEBYTECODE
"$VENV/bin/python" -m ruff check suite tests benchmarks setup.py
"$VENV/bin/python" -m ruff format --check suite tests benchmarks setup.py
"$VENV/bin/python" -m mypy  # over suite/, as [tool.mypy] in pyproject.toml says
# Two pytest-xdist workers, each taking whole test files (a file's fixtures are made once): one
# file's waits on TensorFlow workers, containers and Ray nodes leave room for the other's. A later
# -n wins: ./run_tests.sh -n 0 runs in this one process.
exec "$VENV/bin/python" -m pytest -n 2 --dist loadfile "$@"
