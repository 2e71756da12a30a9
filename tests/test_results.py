"""The result record: atomic save that never overwrites, load that refuses what it cannot read."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from suite.record import results, saving, strict_json
from suite.record.results import SCHEMA_VERSION, ResultError, RunResult

FIXTURES = Path(__file__).parent / "fixtures"
SPEC = {"scenario": "s", "point_label": "p", "repetition": 0, "fingerprint": "ab" * 32, "config": {"device": "cpu"}}


def _result(status: str = "ok", finished: str = "2026-01-01T00:00:00") -> RunResult:
    return RunResult(status=status, spec=SPEC, run={"finished_at": finished}, timing={"fit_s": 1.5})


def test_round_trip(tmp_path: Path) -> None:
    path = saving.save(_result(), tmp_path, "run")
    loaded = results.load(path)
    assert loaded == _result()
    assert json.loads(path.read_text())["schema_version"] == SCHEMA_VERSION
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no temp file left"


def test_provenance_round_trips_and_older_records_load_without_it(tmp_path: Path) -> None:
    section = {"suite": {"git_revision": "a" * 40, "git_dirty": False}, "environment": {"kind": "venv"}, "image": None}
    with_it = RunResult(status="skipped", spec=SPEC, message="no GPU", provenance=section)
    assert results.load(saving.save(with_it, tmp_path, "new")).provenance == section
    older = {k: v for k, v in _result().to_dict().items() if k != "provenance"}
    (tmp_path / "old.json").write_text(json.dumps(older))
    assert results.load(tmp_path / "old.json").provenance == {}


def test_never_overwrites(tmp_path: Path) -> None:
    first = saving.save(_result("error", "2026-01-01"), tmp_path, "run")
    second = saving.save(_result("ok", "2026-01-02"), tmp_path, "run")
    assert first != second and first.is_file() and second.is_file()
    assert results.load(first).status == "error"
    latest = results.latest_by_run([r for _, r in results.load_folder(tmp_path)])
    assert latest[(SPEC["fingerprint"], 0)].status == "ok", "the newest attempt wins"


def test_unknown_newer_version_refused_with_advice(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps({**_result().to_dict(), "schema_version": SCHEMA_VERSION + 1}))
    with pytest.raises(ResultError, match="newer than this suite understands.*update the suite"):
        results.load(path)


def test_older_version_without_migration_refused(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps({**_result().to_dict(), "schema_version": 0}))
    with pytest.raises(ResultError, match="no migration.*--fresh"):
        results.load(path)


@pytest.mark.parametrize("text", ["{not json", "[]", '{"status": "ok"}'])
def test_not_a_result_file(tmp_path: Path, text: str) -> None:
    path = tmp_path / "r.json"
    path.write_text(text)
    with pytest.raises(ResultError, match=str(path)):
        results.load(path)


def test_a_file_that_is_not_utf8_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_bytes(b'{"status": "\xff\xfe"}')
    with pytest.raises(ResultError, match=f"{path}: not a readable result file") as err:
        results.load(path)
    assert "results folder" not in str(err.value), "one file given by name is not in a folder"
    with pytest.raises(ResultError, match="; move it out of the results folder"):
        results.load_folder(tmp_path)


def test_show_on_a_file_that_is_not_utf8_exits_2(tmp_path: Path) -> None:
    from conftest import suite_cli

    path = tmp_path / "r.json"
    path.write_bytes(b"\x80\x81 not text")
    proc = suite_cli("show", path)
    assert proc.returncode == 2, proc.stdout
    assert "Traceback" not in proc.stderr
    assert f"{path}: not a readable result file" in proc.stderr and "results folder" not in proc.stderr


def test_unknown_status_rejected() -> None:
    with pytest.raises(ValueError, match="unknown status"):
        RunResult(status="fast", spec=SPEC)


def test_nan_is_written_as_null_and_never_as_nan(tmp_path: Path) -> None:
    """JSON has no NaN: a measurement holding one is still saved (not lost after training), as null."""
    path = saving.save(RunResult(status="error", spec=SPEC, timing={"fit_s": float("nan")}), tmp_path, "run")
    assert "NaN" not in path.read_text() and json.loads(path.read_text())["timing"]["fit_s"] is None


def test_version_1_record_is_recounted_on_load() -> None:
    # A real version-1 result (784-750-150-50-50-10): it counted 3 x forward = 4,266,000 FLOPs per
    # example and divided by a peak from a decaying matmul chain.
    path = Path(__file__).parent / "fixtures" / "schema1" / "width-run.json"
    raw = json.loads(path.read_text())
    assert raw["schema_version"] == 1 and raw["work"]["flops_per_example_train"] == 4_266_000
    r = results.load(path)
    assert r.schema_version == SCHEMA_VERSION == 2
    assert r.work["flops_per_example_train"] == 3_090_000
    eps = r.timing["steady_examples_per_s"]
    assert r.work["achieved_flops_per_s"] == pytest.approx(3_090_000 * eps)
    assert "recounted" in r.work["flops_counted"]
    assert "peak" not in r.work and r.work["peak_schema1"] == raw["work"]["peak"], "moved, not lost"
    assert "step_floor_s" not in r.timing and r.timing["step_floor_s_schema1"] == raw["timing"]["step_floor_s"]


@pytest.mark.parametrize("model", [{"kind": "zzz"}, {"kind": None}, {"kind": "cnn"}])
def test_a_version_1_record_whose_model_cannot_be_recounted_is_refused_by_every_reader(
    tmp_path: Path, model: dict
) -> None:
    """The recount reads the record's model, which the shape does not check: report, show, compare
    and reproduce refuse the file by its key, with exit 2, never a traceback."""
    from conftest import suite_cli

    raw = json.loads((FIXTURES / "schema1" / "width-run.json").read_text())
    raw["spec"]["config"]["model"].update(model)
    folder = tmp_path / "results" / "box" / raw["spec"]["scenario"]
    folder.mkdir(parents=True)
    path = folder / "aaaaaaaaaaaa-r0.json"
    path.write_text(json.dumps(raw))
    for args in (
        ("report", "--results", tmp_path / "results", "--out", tmp_path / "out"),
        ("show", path),
        (
            "compare",
            tmp_path / "results" / "box",
            FIXTURES / "results" / "fixture-local",
        ),  # the first folder is read first
        ("reproduce", path, "--results", tmp_path / "again"),
    ):
        proc = suite_cli(*args)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (args, proc.stderr)
        assert f"{path}: field spec.config.model: a version-1 record's model whose FLOPs cannot be recounted" in (
            proc.stderr
        ), (args, proc.stderr)


def _strict_reference(raw: bytes) -> object:
    """What the record format allows, read by Python's own json module: UTF-8, no NaN or Infinity,
    every float finite, every integer within 64 bits (signed or unsigned)."""

    def refuse(word: str) -> float:
        raise ValueError(word)

    def finite(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise ValueError(text)
        return value

    def integer(text: str) -> int:
        value = int(text)  # past 4,300 digits, int() itself refuses
        if not -(2**63) <= value < 2**64:
            raise ValueError(text)
        return value

    return json.loads(raw.decode("utf-8"), parse_constant=refuse, parse_float=finite, parse_int=integer)


def _outcome(read: Callable[[bytes], object], raw: bytes) -> tuple[str, object]:
    try:
        return "read", read(raw)
    except (ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError and orjson's are ValueErrors
        return "refused", None


def _same(a: object, b: object) -> bool:
    """Equal, and of the same types all the way down (1 is not 1.0, -0.0 is not 0.0); a loop, not
    recursion, as documents nest deeper than Python's stack."""
    pairs = [(a, b)]
    while pairs:
        x, y = pairs.pop()
        if type(x) is not type(y):
            return False
        if isinstance(x, dict) and isinstance(y, dict):
            if list(x) != list(y):
                return False
            pairs += [(x[k], y[k]) for k in x]
        elif isinstance(x, list) and isinstance(y, list):
            if len(x) != len(y):
                return False
            pairs += zip(x, y, strict=True)
        elif repr(x) != repr(y):
            return False
    return True


MANGLES = [b"", b"0", b"9" * 19, b"-", b".", b"e", b"[", b"{", b'"', b",", b"\\", b"\xff", b"1e999"]


def _number(rng: random.Random) -> str:
    digits = "".join(rng.choice("0123456789") for _ in range(rng.choice([1, 2, 17, 18, 19, 20, 21, 25])))
    token = rng.choice(["", "-"]) + (digits.lstrip("0") or "0")
    if rng.random() < 0.5:
        token += "." + "".join(rng.choice("0123456789") for _ in range(rng.choice([1, 3, 17, 19, 20, 22, 30])))
    if rng.random() < 0.3:
        token += rng.choice("eE") + rng.choice(["", "+", "-"]) + str(rng.choice([0, 5, 300, 308, 309, 400, 10**20]))
    return token


def test_results_are_read_as_pythons_json_reads_them() -> None:
    """Result files are decoded by orjson where it gives what Python's json gives, and by json where
    it might not (an integer beyond 64 bits, deep nesting, a lone surrogate): across numbers of
    every length and exponent, in every place, deep nesting and mangled records, each document is
    read into the same objects, of the same types, or refused, as json with the format's checks."""
    rng = random.Random(20261206)
    record = (FIXTURES / "rich" / "box" / "mnist_mlp_width" / "763c6bd727d3-r0.json").read_bytes()
    docs = [p.read_bytes() for p in sorted(FIXTURES.rglob("*.json"))]
    for _ in range(3000):
        n = _number(rng)
        docs += [f'{{"a": {n}}}'.encode(), f"[{n}]".encode(), f'{{"s": "x{n}", "f": [0.5,{n}, 1]}}'.encode()]
        docs.append(f"[0.{n.lstrip('-').replace('.', '')}, {n}]".encode())
    for depth in (10, 500, 599, 600, 601, 900, 990, 1000, 1024, 1025, 2000):
        docs.append(b"[" * depth + b"]" * depth)
        docs.append(b'{"a":' * depth + b"1" + b"}" * depth)
    escapes = (b"\\ud800", b"\\udc00x", b"\\ud83d\\ude00", b"\\u0000", b"\x01", b"\xff", b"\xed\xa0\x80", b"\xc3\xa9")
    for escape in escapes:
        docs.append(b'{"s": "a' + escape + b'"}')
    for _ in range(1500):
        mangled = bytearray(record)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(mangled))
            what = rng.choice(MANGLES)
            mangled[at : at + rng.randint(0, 2)] = what
        docs.append(bytes(mangled))
    read = refused = 0
    for raw in docs:
        ours, reference = _outcome(strict_json.decoded, raw), _outcome(_strict_reference, raw)
        assert ours[0] == reference[0] and _same(ours[1], reference[1]), raw[:200]
        read, refused = read + (ours[0] == "read"), refused + (ours[0] == "refused")
    assert read > 5000 and refused > 1000, (read, refused)  # both kinds of document were met
