"""A result file from another machine may hold anything: every field a reader uses is checked when
the file is read, so report, show and compare end with exit 2 naming the file and the field, never
with a traceback, whatever one field holds. Through the real CLI's entry point, in-process (a few
hundred cases)."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from suite import cli

RICH = Path(__file__).parent / "fixtures" / "rich"  # one ok run of a real smoke plan: telemetry, load, provenance
DELETE = object()
WRONG = ["text", [], {}, None, -1, 0, True, 1e308, DELETE]


def _paths(value: Any, path: tuple = ()) -> list[tuple]:
    """Every field of a record (the first item of each list), its series' points left out."""
    out = [path] if path else []
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*path, key))
    elif isinstance(value, list) and value and "series" not in path:
        out += _paths(value[0], (*path, 0))
    return out


def _with(record: dict, path: tuple, value: Any) -> dict:
    out = json.loads(json.dumps(record))
    node = out
    for key in path[:-1]:
        node = node[key]
    if value is DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return out


def _cli(*argv: object) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = cli.main([str(a) for a in argv])
    return code, err.getvalue()


def test_every_field_of_a_result_holding_a_wrong_value_is_a_clean_exit(tmp_path: Path) -> None:
    [source] = RICH.rglob("*.json")
    record = json.loads(source.read_text())
    paths = _paths(record)
    assert len(paths) > 200  # the whole record, telemetry and provenance included
    res = tmp_path / "res"
    shutil.copytree(RICH, res)
    target = res / source.relative_to(RICH)
    outcomes: dict[int, int] = {}
    for i, path in enumerate(paths):
        for value in (WRONG[i % len(WRONG)], WRONG[(i + 4) % len(WRONG)]):  # two values a field, all over the set
            target.write_text(json.dumps(_with(record, path, value)))
            for argv in (
                ("report", "--results", res, "--out", tmp_path / "out", "--format", "md,json,csv"),
                ("show", target),
                ("compare", RICH, res),
            ):
                code, err = _cli(*argv)  # an exception here fails the test with its traceback
                assert code in (0, 2), (path, value, argv[0], err)
                if code == 2:
                    assert str(target) in err, err
                outcomes[code] = outcomes.get(code, 0) + 1
    assert outcomes.get(2, 0) > 100 and outcomes.get(0, 0) > 100, outcomes  # refused where wrong, read where harmless


@pytest.mark.parametrize(
    "path, value, said",
    [
        (
            ("timing", "fit_s"),
            "1.2",
            "field timing.fit_s: got '1.2' (str); allowed: a number from 1e-12 to 1e18 or null",
        ),
        (("timing", "fit_s"), -1, "field timing.fit_s: got -1 (int); allowed: a number from 1e-12 to 1e18 or null"),
        (("spec", "config"), [], "field spec.config: got [] (list); allowed: a mapping"),
        (("spec", "fingerprint"), DELETE, "field spec.fingerprint: missing; every result has it"),
        (
            ("quality", "test_accuracy"),
            7,
            "field quality.test_accuracy: got 7 (int); allowed: a number in [0, 1] or null",
        ),
        (("telemetry", "metrics", 0, "summary"), "x", "field telemetry.metrics.0.summary: got 'x' (str)"),
        (("provenance", "suite", "dirty_paths"), 3, "field provenance.suite.dirty_paths: got 3 (int); allowed: a list"),
    ],
)
def test_a_wrong_field_is_named_with_what_is_allowed(tmp_path: Path, path: tuple, value: Any, said: str) -> None:
    [source] = RICH.rglob("*.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_with(json.loads(source.read_text()), path, value)))
    code, err = _cli("show", bad)
    assert code == 2 and f"error: {bad}: {said}" in err, err
