"""The result record: atomic save that never overwrites, load that refuses what it cannot read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from suite.record import results, saving
from suite.record.results import SCHEMA_VERSION, ResultError, RunResult

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
