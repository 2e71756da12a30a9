"""``-k`` on hostile input: wildcards in linear time, any nesting depth or number of terms, through the CLI.

The expressions here once cost exponential time (``a*a*...*b`` as a regular expression with one
``.*`` per star, against a long value) or a RecursionError traceback (thousands of terms or of
nested parentheses). The timeouts only stop a hang: none of these takes more than a second or two.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import said, suite_cli, write_scenario

from suite.spec import plan, scenario, select

HANG_S = 60  # a hang is a failure; every run here takes seconds
LONG = "a" * 80  # C(80, 13) ways to place 13 a's: a backtracking matcher never finishes

VARIANTS = f"""\
name: hostile_k
question: Does -k stay fast on hostile patterns?
model: {{hidden: [8]}}
training: {{epochs: 1}}
data: {{allow_synthetic: true, train_samples: 512, test_samples: 256}}
device: cpu
repeats: 1
timeout_s: 300
variants:
  - name: {LONG}
  - name: {LONG}b
    set: {{training.epochs: 2}}
  - name: plain
    set: {{training.epochs: 3}}
"""


def _check(tmp_path: Path, path: Path, expr: str) -> tuple[int, str, str]:
    proc = suite_cli("check", path, "--backend", "local", "--results", tmp_path / "results", "-k", expr, timeout=HANG_S)
    return proc.returncode, proc.stdout, proc.stderr


def _taken(stdout: str) -> str:
    """The "N of M points, ... match" line of `check -k`, with the lines it wraps onto."""
    found = re.search(r"^\d+ of \d+ points,", stdout, re.MULTILINE)
    assert found, stdout
    return said(stdout, found.group())


def test_a_hostile_wildcard_matches_in_linear_time(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, "hostile_k", VARIANTS)
    code, out, err = _check(tmp_path, path, "variant=" + "a*" * 13 + "b")
    assert code == 0, out + err
    assert _taken(out).startswith("1 of 3 points"), out
    assert f"variant={LONG}b" in out
    code, out, err = _check(tmp_path, path, "variant=" + "a*" * 13 + "c")
    assert code == 2 and err.startswith("error: -k 'variant=a*a*") and "matches none of the 3 points" in err, err


@pytest.mark.parametrize(
    "expr",
    [
        "(" * 5000 + "variant=plain" + ")" * 5000,
        "not " * 5001 + "variant=plain",  # an odd number of nots: takes every point but plain
        " or ".join(f"variant=v{i}" for i in range(3000)) + " or variant=plain",
        " and ".join(["variant=p*"] * 3000),
    ],
    ids=["5000 parentheses", "5001 nots", "3001 terms or", "3000 terms and"],
)
def test_any_depth_and_number_of_terms_is_read_without_a_traceback(tmp_path: Path, expr: str) -> None:
    path = write_scenario(tmp_path, "hostile_k", VARIANTS)
    code, out, err = _check(tmp_path, path, expr)
    assert code == 0 and "Traceback" not in err, out + err
    expected = "2 of 3 points" if expr.startswith("not") else "1 of 3 points"
    assert _taken(out).startswith(expected), out


def test_a_long_expression_that_fails_is_named_by_its_start_and_length(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, "hostile_k", VARIANTS)
    expr = "(" * 5000 + "variant=plain" + ")" * 4999
    code, out, err = _check(tmp_path, path, expr)
    assert code == 2 and "Traceback" not in err, out + err
    # Quoted as every message quotes a value (docs/limits.md): its first 80 characters and its length.
    assert err.startswith(f"error: -k '{'(' * 80}'... (10,012 characters): the '(' at character 1 is not closed")
    assert len(err) < 400, err


GRID = """\
name: many_points
question: Does the Reproduce line's -k take its points back?
model: {{hidden: [8]}}
training: {{epochs: 1}}
data: {{allow_synthetic: true, train_samples: 512, test_samples: 256}}
device: cpu
repeats: 1
timeout_s: 300
matrix:
  model.hidden.0: {widths}
  training.batch_size: {batches}
"""


def test_the_reproduce_expression_of_many_points_is_read_back(tmp_path: Path) -> None:
    """report/pages.py's "Reproduce" line carries ``expression_for`` of a page's points: 1,199 of 1,200 here,
    an or of 1,199 terms, which the CLI takes back exactly."""
    path = write_scenario(tmp_path, "many_points", GRID.format(widths=list(range(1, 31)), batches=list(range(1, 41))))
    specs = plan.expand(scenario.load(path), repeats=1, data=lambda d: {"source": "synthetic"})
    assert len(specs) == 1200
    kept = specs[:500] + specs[501:]
    expr = select.expression_for([(s.point, s.point_label) for s in kept])
    code, out, err = _check(tmp_path, path, expr)
    assert code == 0 and "Traceback" not in err, out + err
    assert _taken(out).startswith("1199 of 1200 points, 1199 of 1200 runs match"), _taken(out)
    assert f"| {specs[500].point_label} |" not in out and f"| {specs[501].point_label} |" in out
    assert [s.point_label for s in select.select_specs(specs, expr)] == [s.point_label for s in kept]
