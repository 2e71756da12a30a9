"""A result file from another machine may hold anything: every field a reader uses is checked when
the file is read, so report, show and compare end with exit 2 naming the file and the field, never
with a traceback, whatever one field holds. Through the real CLI's entry point, in-process (a few
hundred cases). And the fast yes-or-no check a report runs on every file (``shape.valid``)
against the worded one it must agree with (``shape.problem``)."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest

from suite import cli
from suite.record import shape

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


# -- the fast check against the worded one: real records changed at one random place (fixed seed) --

FIXTURES = Path(__file__).parent / "fixtures" / "results"
ODD_VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    7,
    10**9,
    10**9 + 1,
    10**19,
    -(10**19),
    1e-13,
    1e-12,
    0.5,
    1,
    1.0000001,
    1e18,
    1.1e18,
    -1e18,
    -1.1e18,
    float("nan"),
    float("inf"),
    -float("inf"),
    "",
    "x",
    "ok",
    "abc1234",
    "ABC1234",
    "0123456789abcdef",
    "a" * 65,
    "../up",
    [],
    [1],
    [None],
    ["x"],
    [1e19],
    {},
    {"a": 1},
    {"fit_s": "x"},
]


def _records() -> list[dict[str, Any]]:
    files = [*sorted(FIXTURES.rglob("*.json")), *sorted(RICH.rglob("*.json"))]
    return [json.loads(p.read_text(encoding="utf-8")) for p in files]


def _places(data: Any, at: tuple = ()) -> list[tuple]:
    """The path of every value inside ``data``."""
    out = [at]
    if isinstance(data, dict):
        for key, value in data.items():
            out += _places(value, (*at, key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            out += _places(value, (*at, i))
    return out


def _changed(record: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    out = copy.deepcopy(record)
    place = rng.choice(_places(out)[1:])
    parent = out
    for step in place[:-1]:
        parent = parent[step]
    last = place[-1]
    what = rng.random()
    if what < 0.1 and isinstance(parent, dict):
        del parent[last]  # a missing field
    elif what < 0.2 and isinstance(parent, dict):
        parent[rng.choice(["extra", "fit_s", "status", "*", "name?", "!x"])] = rng.choice(ODD_VALUES)
    else:
        parent[last] = copy.deepcopy(rng.choice(ODD_VALUES))
    return out


def test_the_fast_check_and_the_worded_one_agree_on_thousands_of_changed_records() -> None:
    records = _records()
    assert len(records) >= 40 and all(shape.valid(r) for r in records), "the fixtures are valid records"
    rng = random.Random(20261203)
    verdicts = {True: 0, False: 0}
    for trial in range(6000):
        record = _changed(rng.choice(records), rng)
        fast, worded = shape.valid(record), shape.problem(record)
        assert fast == (worded is None), f"trial {trial}: valid() says {fast}, problem() says {worded!r}"
        verdicts[fast] += 1
    assert min(verdicts.values()) > 1000, verdicts  # both answers are exercised


def test_every_number_word_keeps_its_bounds() -> None:
    """Each bound, on both sides, through a field of each number word."""
    base = _records()[0]
    cases = [
        (("timing", "fit_s"), [1e-12, 1e18], [0, 1e-13, 1.1e18, -1.0, True]),  # positive
        (("timing", "first_epoch_overhead_s"), [-1e18, 0, 1e18], [-1.1e18, 1.1e18, "1"]),  # number
        (("timing", "evaluate_s"), [0, 1e18], [-1e-9, 1.1e18, False]),  # nonneg
    ]
    nullable = copy.deepcopy(base)  # a key the shape marks "may be null" ("image?"), and its mapping
    nullable.setdefault("provenance", {})["image"] = None
    assert shape.valid(nullable) and shape.problem(nullable) is None
    nullable["provenance"]["image"] = {"tag": 1}
    assert not shape.valid(nullable) and shape.problem(nullable) is not None
    for (section, key), good, bad in cases:
        for value, expected in [(v, True) for v in good] + [(v, False) for v in bad]:
            record = copy.deepcopy(base)
            record.setdefault(section, {})[key] = value
            assert shape.valid(record) is expected, (key, value)
            assert (shape.problem(record) is None) is expected, (key, value)


def test_a_list_of_numbers_is_checked_item_by_item_whatever_its_length() -> None:
    """A series of hundreds of numbers is checked in one pass, as each number is: one item out of
    bounds, NaN, a boolean or a text anywhere in it refuses the record; null only where allowed."""
    base = _records()[0]
    cases = [
        (("telemetry", "load", "loadavg_start"), [[], [0, 1e18], [0.0] * 500 + [7]], [[-1e-9], [1.1e18], [None]]),
        (("telemetry", "windows", "steady"), [[None] * 3 + [1.5], [-1e18, 1e18], [10**18]], [[10**19], [-(10**19)]]),
    ]
    for bad_item in (float("nan"), float("inf"), True, "1", [1], {}):
        cases[1][2].append([0.5] * 300 + [bad_item] + [0.5] * 300)
    for place, good, bad in cases:
        for value, expected in [(v, True) for v in good] + [(v, False) for v in bad]:
            record = copy.deepcopy(base)
            parent = record
            for step in place[:-1]:
                parent = parent.setdefault(step, {})
            parent[place[-1]] = value
            assert shape.valid(record) is expected, (place, value[:3], len(value))
            assert (shape.problem(record) is None) is expected, (place, value[:3], len(value))
