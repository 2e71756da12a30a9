"""Export through the real CLI: report.json, points.csv and runs.csv say what the Markdown shows.

References this project did not write: Python's ``json`` and ``csv`` modules read the exports, and
markdown-it-py (CommonMark with GitHub's table rule) reads the Markdown tables. Every figure of every
table row is checked against the exported number at the precision the cell prints it.
"""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import suite_cli
from markdown_it import MarkdownIt

from suite.record import results
from suite.report import figures, stats

FIXTURES = Path(__file__).parent / "fixtures" / "results"
DOC = Path(__file__).resolve().parents[1] / "docs" / "export.md"
GIB = 2**30

# Telemetry added to the fixture copy so the GPU busy and peak memory columns hold numbers (the
# fixtures were recorded before telemetry): per repetition, busy %, sampled memory, kernel
# high-water mark, GPU memory. Only the shape matters to the export; the values are made up.
TELEMETRY = [(12.0, 1.25 * GIB, 0.5 * GIB, 0.3 * GIB), (30.0, 1.5 * GIB, 1.75 * GIB, 0.25 * GIB), (21.0, GIB, GIB, 0)]


def _telemetry(busy: float, memory: float, hwm: float, gpu: float) -> dict[str, Any]:
    def metric(name: str, device: str | None, unit: str, window: str, stat: str, value: float) -> dict[str, Any]:
        return {"name": name, "device": device, "unit": unit, "summary": {window: {stat: value, "n": 9}}}

    return {
        "metrics": [
            metric("gpu_util_percent", "GPU-a", "%", "steady", "mean", busy),
            metric("memory_bytes", None, "bytes", "run", "max", memory),
            metric("process_hwm_bytes", None, "bytes", "run", "max", hwm),
            metric("gpu_memory_used_bytes", "GPU-a", "bytes", "run", "max", gpu),
        ]
    }


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("export")
    res, out = base / "results", base / "out"
    shutil.copytree(FIXTURES, res)
    for path in sorted((res / "fixture-local" / "fx_knobs").glob("*.json")):
        data = json.loads(path.read_text())
        if data["status"] == "ok":
            data["telemetry"] = _telemetry(*TELEMETRY[data["spec"]["repetition"] % 3])
            path.write_text(json.dumps(data))
    proc = suite_cli("report", "--results", res, "--out", out, "--format", "md,json,csv")
    assert proc.returncode == 0, proc.stderr
    return res, out


def _md() -> MarkdownIt:
    return MarkdownIt("commonmark").enable("table")


def _text(inline: Any) -> str:
    """A cell's text as a reader sees it: escapes resolved, code spans as their text."""
    return "".join(c.content for c in inline.children or [] if c.type in ("text", "code_inline")).strip()


def _scenario_tables(page: str) -> dict[str, list[dict[str, str]]]:
    """machine -> the rows of its two tables (Results, Where the time goes) merged per point
    (header -> cell text), with each point's line under "Notes:" as its "notes", from a scenario page."""
    tokens = _md().parse(page)
    tables: dict[str, dict[str, dict[str, str]]] = {}
    machine, section, rows, row = None, "", [], []
    for i, tok in enumerate(tokens):
        if tok.type == "heading_open" and tok.tag == "h2":
            machine = re.fullmatch(r"On (.+)", _text(tokens[i + 1]))
            machine = machine.group(1) if machine else None
        elif tok.type == "heading_open" and tok.tag == "h3":
            section = _text(tokens[i + 1])
        elif tok.type == "tr_open":
            row = []
        elif tok.type in ("th_open", "td_open"):
            row.append(_text(tokens[i + 1]))
        elif tok.type == "tr_close":
            rows.append(row)
        elif tok.type == "table_open":
            rows = []
        elif tok.type == "table_close" and machine and rows[0][0] == "point":
            header = rows[0]
            for r in rows[1:]:
                tables.setdefault(machine, {}).setdefault(r[0], {}).update(dict(zip(header, r, strict=True)))
        elif tok.type == "inline" and machine and section == "Results" and tokens[i - 1].type == "paragraph_open":
            point, _, notes = _text(tok).partition(": ")
            if i > 2 and tokens[i - 2].type == "list_item_open" and point in tables.get(machine, {}):
                tables[machine][point]["notes"] = notes
    return {m: list(points.values()) for m, points in tables.items()}


NUMBER = re.compile(r"(?<![\d.])-?\d[\d,]*(?:\.\d+)?")


def _numbers(text: str) -> list[tuple[float, float]]:
    """Every number a cell prints, with half a unit of its last digit (what rounding can account for)."""
    out = []
    for m in NUMBER.findall(text):
        decimals = len(m.split(".")[1]) if "." in m else 0
        out.append((float(m.replace(",", "")), 0.5 * 10**-decimals + 1e-12))
    return out


def _agrees(text: str, expected: list[float]) -> bool:
    shown = _numbers(text)
    return len(shown) == len(expected) and all(abs(v - e) <= tol for (v, tol), e in zip(shown, expected, strict=True))


def _check_row(p: dict[str, Any], row: dict[str, str]) -> None:
    """One point's exported figures against its Markdown row, column by column."""
    label = p["point"]
    assert row["runs ok"] == f"{p['runs_ok']}/{p['runs_total']}", label
    simple = {
        "fit time (s), geo. mean (min-max)": [p["fit_s_geomean"], p["fit_s_min"], p["fit_s_max"]],
        "steady epoch (s), median (min-max)": [
            p["steady_epoch_s_median"],
            p["steady_epoch_s_min"],
            p["steady_epoch_s_max"],
        ],
        "examples/s": [p["steady_examples_per_s_median"]],
        "first-epoch overhead (s)": [p["first_epoch_overhead_s_median"]],
        "test accuracy": [p["test_accuracy_min"]],
    }
    for column, values in simple.items():
        if values[0] is None:
            assert row[column] == "-", (label, column)
        else:
            assert _agrees(row[column], values), (label, column, row[column], values)
    step, floor = p["step_s_median"], p["step_floor_s_median"]
    if step is None or floor is None:
        assert row["fixed cost per step (ms)"] == "-"
    else:
        share = [] if floor >= step else [100 * p["fixed_cost_fraction"]]
        assert _agrees(row["fixed cost per step (ms)"], [floor * 1e3, step * 1e3, *share]), label
    flops = p["achieved_flops_per_s_median"]
    if flops is None:
        assert row["GFLOP/s (% of peak)"] == "-"
    else:
        share = [] if p["peak_fraction"] is None else [100 * p["peak_fraction"]]
        assert _agrees(row["GFLOP/s (% of peak)"], [flops / 1e9, *share]), (label, row["GFLOP/s (% of peak)"])
    _check_telemetry(p, row)
    _check_speedup(p, row)
    assert row.get("notes", "") == "; ".join(p["notes"]), label


def _check_telemetry(p: dict[str, Any], row: dict[str, str]) -> None:
    busy, host, gpu = p["gpu_busy_percent"], p["peak_memory_bytes"], p["peak_gpu_memory_bytes"]
    # A column no point of the section measured is left out of the table: "-" for each of its rows.
    shown_busy, shown_memory = row.get("GPU busy", "-"), row.get("peak memory", "-")
    assert shown_busy == "-" if busy is None else _agrees(shown_busy, [busy])
    if host is None and gpu is None:
        assert shown_memory == "-"
    else:
        expected = [x / GIB for x in (host, gpu) if x is not None]
        assert _agrees(shown_memory, expected), (shown_memory, expected)


def _check_speedup(p: dict[str, Any], row: dict[str, str]) -> None:
    text = row.get("vs baseline (fit time)")
    if text is None:  # a column without a ratio in any row is left out of the table
        assert p["speedup"] is None, p["point"]
        return
    # The cell says the ratio as a factor of 1 or more with its word, the interval inverted with it.
    runs = (p["speedup_runs_baseline"], p["speedup_runs_point"])
    r = None if p["speedup"] is None else stats.Ratio(p["speedup"], p["speedup_ci_low"], p["speedup_ci_high"], runs)
    if p["is_baseline"]:
        assert text == "baseline"
    elif r is None:
        assert text == "-"
    elif p["speedup_ci_low"] is None:
        assert _agrees(text, [r.factor, min(runs), 3]) and "no interval" in text, text
        assert text.startswith(f"{r.factor:.2f}x {r.direction}"), text
    else:
        bounds = [r.factor, 95, *r.factor_interval]
        assert _agrees(text, bounds), (text, bounds)
        assert text.startswith(f"{r.factor:.2f}x {r.direction}"), text
        assert ("not significant" in text) == (p["speedup_significant"] is False)


def _from_csv(value: str) -> Any:
    """A points.csv cell as the JSON holds it: empty is None, true/false, numbers, else text."""
    if value == "":
        return None
    if value in ("true", "false"):
        return value == "true"
    try:
        return int(value)
    except ValueError:
        pass
    try:
        return float(value)
    except ValueError:
        return value


def _json(out: Path) -> dict[str, Any]:
    with (out / "report.json").open(encoding="utf-8") as fh:
        return json.load(fh)


def _csv_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def test_json_has_its_versioned_shape(exported) -> None:
    doc = _json(exported[1])
    assert doc["format"] == "keras-speed-suite/report" and doc["version"] == 1
    assert doc["interval"]["level"] == 0.95
    assert {(v["machine"], v["scenario"]) for v in doc["views"]} == {
        ("fixture-docker", "fx_width"),
        ("fixture-local", "fx_knobs"),
        ("fixture-local", "fx_scaling"),
        ("fixture-local", "fx_width"),
    }


@pytest.mark.parametrize("source", ["json", "csv"])
def test_every_figure_equals_the_markdown_table(exported, source: str) -> None:
    out = exported[1]
    if source == "json":
        points = _json(out)["points"]
    else:
        points = []
        for r in _csv_rows(out / "points.csv"):
            p = {k: _from_csv(v) for k, v in r.items()}
            p["notes"] = [n for n in r["notes"].split("; ") if n]
            p["point"], p["status"] = r["point"], r["status"]  # text, even where it looks like a number
            points.append(p)
    tables = {}
    for page in ("fx_width", "fx_scaling", "fx_knobs"):
        for machine, rows in _scenario_tables((out / f"{page}.md").read_text()).items():
            tables[(machine, page)] = {r["point"]: r for r in rows}
    shown = sum(len(rows) for rows in tables.values())
    ran = [p for p in points if p["runs_ok"]]
    assert len(points) == 15 and len(ran) == shown == 11, "one table row per exported point that ran"
    for p in ran:
        _check_row(p, tables[(p["machine"], p["scenario"])][p["point"]])
    busy = [p for p in points if p["gpu_busy_percent"] is not None]
    assert len(busy) == 3 and all(p["gpu_busy_percent"] == 21.0 for p in busy), "the telemetry columns are exercised"
    assert any(p["speedup_ci_low"] is not None for p in points), "intervals are exercised"


def test_points_csv_holds_the_json_numbers_exactly(exported) -> None:
    out = exported[1]
    rows = _csv_rows(out / "points.csv")
    points = _json(out)["points"]
    assert len(rows) == len(points)
    for row, p in zip(rows, points, strict=True):
        for key, value in row.items():
            if key == "notes":
                assert value == "; ".join(p["notes"])
            elif key == "overrides":
                assert value == figures.overrides_text(p["overrides"])
            elif key.startswith(figures.COORD_PREFIX):
                axis = key.removeprefix(figures.COORD_PREFIX)
                expected = p["coords"].get(axis)
                assert value == ("" if expected is None else str(expected)), (p["point"], key, value)
            elif key.startswith("runs_") and key not in p:
                assert int(value) == p["status_counts"].get(key.removeprefix("runs_"), 0)
            elif key in ("point", "status", "machine", "scenario", "device", "baseline"):
                assert value == (p[key] or "")
            else:
                assert _from_csv(value) == p[key], (p["point"], key, value, p[key])
    assert "fit_s_geomean" in rows[0] and rows[0]["gpu_busy_percent"] == "", "units in names; empty for not measured"


def test_runs_csv_has_one_row_per_result_file_with_every_timing(exported) -> None:
    res, out = exported
    rows = _csv_rows(out / "runs.csv")
    files = sorted(p.relative_to(res).as_posix() for p in res.rglob("*.json"))
    assert sorted(r["file"] for r in rows) == files
    for row in rows:
        raw = json.loads((res / row["file"]).read_text())
        timing = raw["timing"]
        unexported = set(timing) - set(figures.RUN_TIMINGS) - set(figures.TIMINGS_LEFT_OUT)
        assert not {k for k in unexported if not k.endswith("_schema1")}, f"timings not exported: {unexported}"
        for key in figures.RUN_TIMINGS:
            if key in figures.LIST_COLUMNS:
                values = timing.get(key) or []
                cells = [row.get(figures.LIST_COLUMNS[key].format(i)) for i in range(1, len(values) + 1)]
                assert [float(c) for c in cells] == values, (row["file"], key)
            elif isinstance(timing.get(key), bool):
                assert row[key] == str(timing[key]).lower()
            else:
                assert _from_csv(row[key]) == timing.get(key), (row["file"], key)
        assert row["status"] == raw["status"] and int(row["repetition"]) == raw["spec"]["repetition"]
        assert row["counted"] == "true", "every fixture file is the newest attempt of its run"


def test_every_exported_field_is_documented(exported) -> None:
    doc, text = _json(exported[1]), DOC.read_text()
    fields = set(doc) | set(doc["views"][0]) | set(doc["points"][0]) | set(doc["runs"][0])
    fields |= set(_csv_rows(exported[1] / "points.csv")[0])
    fields = {"coord.<axis>" if f.startswith(figures.COORD_PREFIX) else f for f in fields}
    missing = sorted(f for f in fields if f"`{f}`" not in text and not re.fullmatch(r"runs_\w+", f))
    assert not missing, f"docs/export.md does not describe: {missing}"
    assert "`runs_<status>`" in text and "`epoch_<i>_s`" in text


def test_format_json_alone_writes_no_markdown(tmp_path: Path) -> None:
    proc = suite_cli("report", "--results", FIXTURES, "--out", tmp_path, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


@pytest.mark.parametrize("value", ["xml", "md,xml", ","])
def test_unknown_format_exits_2_naming_the_flag(tmp_path: Path, value: str) -> None:
    proc = suite_cli("report", "--results", FIXTURES, "--out", tmp_path, "--format", value)
    assert proc.returncode == 2
    assert "--format" in proc.stderr and "allowed: md, json, csv" in proc.stderr and "Traceback" not in proc.stderr
    assert not list(tmp_path.iterdir()), "nothing written"


RESULT = FIXTURES / "fixture-local" / "fx_width" / "8795d9598222-r0.json"


def test_show_prints_one_result_readably() -> None:
    proc = suite_cli("show", RESULT)
    assert proc.returncode == 0, proc.stderr
    raw = json.loads(RESULT.read_text())
    text = proc.stdout
    assert "status:       ok" in text and "point width=750, device=cpu" in text
    assert f"fit_s: {raw['timing']['fit_s']:.4g}" in text
    assert "model.hidden: [750, 150, 50, 50]" in text and "tensorflow 2.21.0" in text
    assert "telemetry:\n  not recorded" in text
    assert "provenance:\n  not recorded (a result made before the suite recorded it)" in text


def test_show_json_is_the_record_after_migration(tmp_path: Path) -> None:
    proc = suite_cli("show", RESULT, "--json")
    assert proc.returncode == 0, proc.stderr
    record, raw = json.loads(proc.stdout), json.loads(RESULT.read_text())
    assert {k: record[k] for k in raw} == raw and record["telemetry"] == {}
    old = dict(raw, schema_version=1, work={**raw["work"], "peak": {"flops_per_s": 1.0}})
    (tmp_path / "old.json").write_text(json.dumps(old))
    migrated = json.loads(suite_cli("show", tmp_path / "old.json", "--json").stdout)
    assert migrated["schema_version"] == results.SCHEMA_VERSION
    assert "peak" not in migrated["work"] and migrated["work"]["peak_schema1"] == {"flops_per_s": 1.0}


def test_show_refuses_what_is_not_a_result(tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text('{"name": "not a result"}')
    for path in (tmp_path / "missing.json", other, tmp_path):
        proc = suite_cli("show", path)
        assert proc.returncode == 2, path
        assert str(path) in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_env_json_says_what_env_says() -> None:
    text, as_json = suite_cli("env"), suite_cli("env", "--json")
    assert text.returncode == as_json.returncode == 0, text.stderr + as_json.stderr
    facts = json.loads(as_json.stdout)
    python = re.search(r"^python:\s+(.+)$", text.stdout, re.M)
    assert python and facts["python"] == python.group(1)
    assert facts["python"].split()[0].count(".") == 2 and facts["machine"] in text.stdout
    # Within 120 columns, the engine's facts in words (its runtimes a list, NVIDIA's a yes or no).
    assert all(len(line) <= 120 for line in text.stdout.splitlines()), text.stdout
    if "error" not in facts.get("docker", {"error": ""}):
        flat = " ".join(text.stdout.split())
        assert f"runtimes: {', '.join(facts['docker']['runtimes']) or 'none'};" in flat, text.stdout
        assert f"nvidia_runtime: {'yes' if facts['docker']['nvidia_runtime'] else 'no'};" in flat, text.stdout


def test_compare_json_holds_the_numbers_the_text_shows() -> None:
    a, b = FIXTURES / "fixture-local", FIXTURES / "fixture-docker"
    proc, text = suite_cli("compare", a, b, "--json"), suite_cli("compare", a, b)
    assert proc.returncode == text.returncode == 0, proc.stderr + text.stderr
    doc = json.loads(proc.stdout)
    assert doc["format"] == "keras-speed-suite/compare" and doc["version"] == 1
    assert doc["reference"] == str(a) and doc["machines"] == [str(a), str(b)]
    assert [s["scenario"] for s in doc["scenarios"]] == ["fx_width"]
    assert {n["scenario"] for n in doc["not_compared"]} == {"fx_knobs", "fx_scaling"}
    tokens = _md().parse(text.stdout)
    cells = [_text(tokens[i + 1]) for i, t in enumerate(tokens) if t.type in ("th_open", "td_open")]
    width = 3  # point, reference, other
    rows = [cells[i : i + width] for i in range(0, len(cells), width)]
    shown = {r[0]: r for r in rows}
    compared, skipped = 0, []
    for point in doc["scenarios"][0]["points"]:
        ref, other = (point["machines"][m] for m in doc["machines"])
        if ref["status"] == other["status"] == "skipped":  # no row: named in one sentence below the table
            assert point["point"] not in shown and ref["fit_s_geomean"] is None is other["fit_s_geomean"]
            skipped.append(point["point"])
            continue
        row = shown[point["point"]]
        if ref["fit_s_geomean"] is None:
            assert row[1] == ref["status"] and row[2] == other["status"]
            continue
        assert _agrees(row[1], [ref["fit_s_geomean"]])
        # The cell shows the ratio as a factor of 1 or more with its word, the interval inverted with it.
        runs = (other["speedup_runs_reference"], other["speedup_runs_machine"])
        r = stats.Ratio(other["speedup_vs_reference"], other["speedup_ci_low"], other["speedup_ci_high"], runs)
        expected = [other["fit_s_geomean"], r.factor, 95, *r.factor_interval]
        assert _agrees(row[2], expected), (row[2], expected)
        assert row[2].endswith(other["speedup_text"]) and f"x {r.direction} than the reference" in row[2]
        compared += 1
    assert compared == 2
    assert f"{len(skipped)} points skipped on every machine: {'; '.join(skipped)}." in text.stdout, text.stdout
    facts_a, facts_b = doc["facts"][str(a)], doc["facts"][str(b)]
    unrecorded = [f for f in facts_a if "not recorded" in (facts_a[f], facts_b[f])]
    # Neither fixture ran a GPU point, so neither records GPU facts; nor do these older results record
    # provenance or the data's identity.
    assert (
        doc["facts_unrecorded"]
        == unrecorded
        == [
            "GPU model",
            "GPU driver",
            "data",
            "suite revision",
            "suite code",
            "environment lock",
            "image recipe",
        ]
    )
    assert doc["facts_differ"] == [f for f in facts_a if facts_a[f] != facts_b[f] and f not in unrecorded]


def test_compare_json_refuses_a_missing_folder(tmp_path: Path) -> None:
    proc = suite_cli("compare", FIXTURES / "fixture-local", tmp_path / "nope", "--json")
    assert proc.returncode == 2 and str(tmp_path / "nope") in proc.stderr and "Traceback" not in proc.stderr


def test_k_selects_the_same_points_in_every_format(tmp_path: Path) -> None:
    proc = suite_cli("report", "--results", FIXTURES, "--out", tmp_path, "--format", "md,json", "-k", "device=cpu")
    assert proc.returncode == 0, proc.stderr
    assert not list(tmp_path.glob("*.*")), "a cut writes nothing over the full report"
    doc = _json(tmp_path / "selected")
    shown = set()
    for page in (tmp_path / "selected").glob("fx_*.md"):
        for machine, rows in _scenario_tables(page.read_text()).items():
            shown |= {(machine, page.stem, r["point"]) for r in rows}
    assert {(p["machine"], p["scenario"], p["point"]) for p in doc["points"]} == shown
    assert all(p["device"] == "cpu" for p in doc["points"]) and len(shown) == 4
    assert doc["runs"] and all(r["device"] == "cpu" for r in doc["runs"])


def test_show_summarizes_telemetry(exported) -> None:
    res = exported[0]
    path = next(p for p in sorted((res / "fixture-local" / "fx_knobs").glob("*-r0.json")))
    busy, memory, hwm, gpu = TELEMETRY[0]
    proc = suite_cli("show", path)
    assert proc.returncode == 0, proc.stderr
    assert f"gpu_util_percent [GPU-a] (%): steady: mean {busy:g}, n 9" in proc.stdout
    assert f"memory_bytes (GiB): run: max {memory / GIB:.2f}, n 9" in proc.stdout
    assert f"gpu_memory_used_bytes [GPU-a] (GiB): run: max {gpu / GIB:.2f}" in proc.stdout


def test_exports_are_the_same_bytes_from_the_same_results(exported, tmp_path: Path) -> None:
    res, out = exported
    proc = suite_cli("report", "--results", res, "--out", tmp_path, "--format", "json,csv")
    assert proc.returncode == 0, proc.stderr
    for name in ("report.json", "points.csv", "runs.csv"):
        assert (tmp_path / name).read_bytes() == (out / name).read_bytes(), name


def test_a_point_measured_with_other_settings_gets_no_speedup(tmp_path: Path) -> None:
    # As after `run -k "device=cpu:2" --set training.epochs=1` following a full run.
    res, out = tmp_path / "results", tmp_path / "out"
    shutil.copytree(FIXTURES, res)
    for path in sorted((res / "fixture-local" / "fx_scaling").glob("*.json")):
        data = json.loads(path.read_text())
        if data["spec"]["point"]["device"] == "cpu:2" and data["spec"]["point"]["training.batch_mode"] == "global":
            data["spec"]["overrides"] = {"training.epochs": 1}
            data["spec"]["config"]["training"]["epochs"] = 1
            path.write_text(json.dumps(data))
    proc = suite_cli("report", "--results", res, "--out", out, "--format", "md,json,csv")
    assert proc.returncode == 0, proc.stderr
    why = "not compared: no run of its baseline with the same --set"
    points = {p["point"]: p for p in _json(out)["points"] if p["scenario"] == "fx_scaling"}
    changed, same = points["batch_mode=global, device=cpu:2"], points["batch_mode=per_replica, device=cpu:2"]
    assert changed["speedup"] is None and changed["speedup_ci_low"] is None, changed
    assert changed["speedup_significant"] is None and why in changed["notes"], changed["notes"]
    assert same["speedup"] is not None and not any("not compared" in n for n in same["notes"]), same
    sections = _scenario_tables((out / "fx_scaling.md").read_text())
    plain = {r["point"]: r for r in sections["fixture-local"]}
    apart = {r["point"]: r for r in sections["fixture-local, with --set training.epochs=1"]}
    assert "batch_mode=global, device=cpu:2" not in plain, "a --set run is never a row of the plain scenario"
    assert list(apart) == ["batch_mode=global, device=cpu:2"]
    # Its section's table has no ratio to show: the column is left out, and the line below says why.
    assert "vs baseline (fit time)" not in apart["batch_mode=global, device=cpu:2"]
    section = (out / "fx_scaling.md").read_text().split("## On `fixture-local`, with `--set training.epochs=1`")[1]
    assert "No ratio to a baseline: no point that ran here could be compared with its baseline." in section
    assert why in apart["batch_mode=global, device=cpu:2"]["notes"]
    assert plain["batch_mode=per_replica, device=cpu:2"]["vs baseline (fit time)"].endswith(")")
    csv_rows = {r["point"]: r for r in _csv_rows(out / "points.csv") if r["scenario"] == "fx_scaling"}
    assert csv_rows["batch_mode=global, device=cpu:2"]["speedup"] == ""
    assert why in csv_rows["batch_mode=global, device=cpu:2"]["notes"]
    # Every record says which --set it was measured with.
    assert changed["overrides"] == {"training.epochs": 1} and same["overrides"] == {}
    assert csv_rows["batch_mode=global, device=cpu:2"]["overrides"] == "training.epochs=1"
    assert csv_rows["batch_mode=per_replica, device=cpu:2"]["overrides"] == ""
    runs = [r for r in _json(out)["runs"] if r["scenario"] == "fx_scaling"]
    assert {r["point"] for r in runs if r["overrides"]} == {"batch_mode=global, device=cpu:2"}
    assert all(r["overrides"] in ({}, {"training.epochs": 1}) for r in runs)
    csv_runs = [r for r in _csv_rows(out / "runs.csv") if r["scenario"] == "fx_scaling"]
    assert {r["point"] for r in csv_runs if r["overrides"] == "training.epochs=1"} == {changed["point"]}


PROVENANCE = {
    "suite": {
        "version": "0.1.0",
        "git_revision": "1a2b3c4d5e6f" + "a" * 28,
        "git_dirty": True,
        "dirty_paths": ["suite/x.py", "suite/y.py"],
        "diff_sha256": "d1ff" + "0" * 60,
    },
    "environment": {
        "kind": "venv",
        "lock_file": "requirements/locks/run-py3.11.txt",
        "lock_sha256": "ab12" + "0" * 60,
        "matches_lock": False,
        "lock_differences": ["numpy 2.4.6 in the lock, 2.3.0 installed", "foo installed, not in the lock"],
    },
    "image": None,
}


def test_show_and_exports_carry_the_provenance(tmp_path: Path) -> None:
    res, out = tmp_path / "results", tmp_path / "out"
    shutil.copytree(FIXTURES, res)
    data = json.loads((res / RESULT.relative_to(FIXTURES)).read_text())
    data["provenance"] = PROVENANCE
    (res / RESULT.relative_to(FIXTURES)).write_text(json.dumps(data))
    shown = suite_cli("show", res / RESULT.relative_to(FIXTURES))
    assert shown.returncode == 0, shown.stderr
    suite, environment = PROVENANCE["suite"], PROVENANCE["environment"]
    assert all(len(line) <= 120 or str(res) in line for line in shown.stdout.splitlines()), "paths whole"
    flat = " ".join(shown.stdout.split())  # the facts read across the lines they wrap onto
    assert f"git_revision {suite['git_revision']}, git_dirty true, diff_sha256 {suite['diff_sha256']}" in flat
    assert "dirty paths: suite/x.py, suite/y.py" in flat
    assert f"lock_sha256 {environment['lock_sha256']}, matches_lock false" in flat
    assert "    numpy 2.4.6 in the lock, 2.3.0 installed\n" in shown.stdout and "  image:        none" in shown.stdout

    proc = suite_cli("report", "--results", res, "--out", out, "--format", "json,csv")
    assert proc.returncode == 0, proc.stderr
    file = RESULT.relative_to(FIXTURES).as_posix()
    runs = {r["file"]: r for r in _json(out)["runs"]}
    mine, other = (
        runs[file],
        runs[
            "fixture-local/fx_knobs/" + sorted(p.name for p in (res / "fixture-local" / "fx_knobs").glob("*.json"))[0]
        ],
    )
    assert mine["provenance_recorded"] is True and other["provenance_recorded"] is False
    assert mine["git_revision"] == suite["git_revision"] and mine["dirty_paths"] == suite["dirty_paths"]
    assert mine["lock_sha256"] == environment["lock_sha256"] and mine["matches_lock"] is False
    assert mine["lock_differences"] == environment["lock_differences"] and mine["image_id"] is None
    assert other["git_revision"] is None and other["lock_differences"] == []
    docker = next(r for r in runs.values() if r["machine"] == "fixture-docker" and r["status"] == "ok")
    assert docker["environment_kind"] == "image" and docker["image_id"].startswith("sha256:"), docker
    labels = json.loads((res / docker["file"]).read_text())["run"]["image_labels"]
    assert docker["image_base_id"] == labels["suite.base.id"] and docker["image_base_digest"] is None, docker
    assert docker["image_base_name"] == labels["suite.base.ref"] and docker["image_base_source"] is None
    rows = {r["file"]: r for r in _csv_rows(out / "runs.csv")}
    assert rows[file]["git_revision"] == suite["git_revision"] and rows[file]["matches_lock"] == "false"
    assert rows[file]["dirty_paths"] == "suite/x.py; suite/y.py"
    assert rows[file]["lock_differences"] == "; ".join(environment["lock_differences"])
    assert rows[file]["provenance_recorded"] == "true" and rows[file]["image_id"] == ""
    assert mine["suite_changed_during_run"] is False and other["suite_changed_during_run"] is None
    assert mine["git_revision_at_end"] is None and rows[file]["suite_changed_during_run"] == "false"


def test_exports_say_when_the_code_changed_while_a_run_ran(tmp_path: Path) -> None:
    res, out = tmp_path / "results", tmp_path / "out"
    shutil.copytree(FIXTURES, res)
    at_end = {**PROVENANCE["suite"], "git_revision": "9f8e7d6c5b4a" + "b" * 28, "diff_sha256": "e2" * 32}
    data = json.loads((res / RESULT.relative_to(FIXTURES)).read_text())
    data["provenance"] = {**PROVENANCE, "suite_changed_during_run": at_end}
    (res / RESULT.relative_to(FIXTURES)).write_text(json.dumps(data))
    proc = suite_cli("report", "--results", res, "--out", out, "--format", "json,csv")
    assert proc.returncode == 0, proc.stderr
    file = RESULT.relative_to(FIXTURES).as_posix()
    mine = {r["file"]: r for r in _json(out)["runs"]}[file]
    assert mine["git_revision"] == PROVENANCE["suite"]["git_revision"], "the code at launch"
    assert mine["suite_changed_during_run"] is True
    assert (mine["git_revision_at_end"], mine["diff_sha256_at_end"]) == (at_end["git_revision"], at_end["diff_sha256"])
    row = {r["file"]: r for r in _csv_rows(out / "runs.csv")}[file]
    assert row["suite_changed_during_run"] == "true" and row["diff_sha256_at_end"] == at_end["diff_sha256"]
