"""No measurement hidden or mixed in silently: real runs with the scenario as written, a `--set`
run and an edited scenario into one results folder, then the report, read back with markdown-it."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import suite_cli, write_scenario
from docker_fixtures import SMALL_SCENARIO
from markdown_it import MarkdownIt


def _sections(page: str) -> dict[str, dict[str, list[str]]]:
    """h2 title -> h3 title -> the text of its table rows and list items, as a reader sees them."""
    tokens = MarkdownIt("commonmark").enable("table").parse(page)

    def plain(text: str) -> str:
        return text.replace("`", "").replace("\\", "")

    out: dict[str, dict[str, list[str]]] = {}
    h2 = h3 = ""
    for i, tok in enumerate(tokens):
        if tok.type == "heading_open":
            text = plain(tokens[i + 1].content)
            if tok.tag == "h2":
                h2, h3 = text, ""
            else:
                h3 = text
        elif tok.type == "tr_open":
            cells = []
            j = i + 1
            while tokens[j].type != "tr_close":
                if tokens[j].type == "inline":
                    cells.append(plain(tokens[j].content).strip())
                j += 1
            out.setdefault(h2, {}).setdefault(h3, []).append(" | ".join(cells))
        elif tok.type == "inline" and tokens[i - 2].type == "list_item_open":
            out.setdefault(h2, {}).setdefault(h3, []).append(plain(tok.content))
    return out


@pytest.mark.slow
def test_a_set_run_and_an_edited_scenario_are_never_merged_into_the_published_rows(tmp_path: Path) -> None:
    text = SMALL_SCENARIO.format(name="tiny_views", widths="[32, 64]") + "report:\n  verdict: none\n"
    path = write_scenario(tmp_path, "tiny_views", text)
    res, env = tmp_path / "results", {"KERAS_HOME": str(tmp_path / "keras")}
    run = ("run", path, "--smoke", "--backend", "local", "--results", res, "--machine", "box")
    assert (proc := suite_cli(*run, env=env)).returncode == 0, proc.stdout + proc.stderr
    # An exploratory run of one point with another optimizer, into the same folder.
    explore = (*run, "-k", "width=64", "--set", "training.optimizer=sgd")
    assert (proc := suite_cli(*explore, env=env)).returncode == 0, proc.stdout + proc.stderr
    # The scenario file edited (another dropout), and one point run again.
    path.write_text(text.replace("dropout: 0.1", "dropout: 0.2"), encoding="utf-8")
    assert (proc := suite_cli(*run, "-k", "width=32", env=env)).returncode == 0, proc.stdout + proc.stderr
    files = sorted((res / "box" / "tiny_views").glob("*.json"))
    assert len(files) == 4

    out = tmp_path / "out"
    proc = suite_cli("report", "--results", res, "--out", out, "--format", "md,csv", env=env)
    assert proc.returncode == 0, proc.stderr
    page = (out / "tiny_views.md").read_text()
    sections = _sections(page)
    assert [h for h in sections if h] == ["On box", "On box, with --set training.optimizer=sgd"], (
        "as the file says, first"
    )
    plain, apart = sections["On box"], sections["On box, with --set training.optimizer=sgd"]

    def points(lines: list[str]) -> list[str]:
        return [r.split(" | ")[0] for r in lines if " | " in r and not r.startswith("point")]

    assert points(plain["Results"]) == ["width=32, device=cpu", "width=64, device=cpu"], plain["Results"]
    assert points(apart["Results"]) == ["width=64, device=cpu"], apart["Results"]
    # The --set runs are named where they are shown, and the plain section does not mention them.
    assert "Changed from the scenario file (every point): --set training.optimizer=sgd" in apart["Environment"]
    assert not any("sgd" in line for h3 in plain.values() for line in h3 if "show" not in line)
    # width=32 shows the newest settings; the run under the old dropout is named, with the command.
    (left,) = plain["Not shown: runs under other settings"]
    assert left.startswith("width=32, device=cpu: 1 run with other settings (model.dropout 0.1 (shown: 0.2))"), left
    shown = re.search(r"python -m suite show (\S+)", left)
    assert shown and (res.parent / shown.group(1)).exists() or Path(shown.group(1)).exists(), left
    old = json.loads(Path(shown.group(1)).read_text()) if Path(shown.group(1)).exists() else {}
    assert old.get("spec", {}).get("config", {}).get("model", {}).get("dropout") == 0.1
    # width=32 (dropout 0.2) and width=64 (dropout 0.1) differ beyond the matrix: never compared.
    assert any("other settings" in line for line in plain.get("Not compared", [])), plain
    # Every result file is shown once or named: none is dropped without a word.
    index = (out / "README.md").read_text()
    assert index.count("[tiny_views](tiny_views.md)") == 2 and "--set training.optimizer=sgd" in index

    # A sweep of the user's own (verdict: none) gets a verdict of its own and a plot along its axis.
    verdict = page.split("- **On `box`, smoke size:** ", 1)[1].split("\n", 1)[0]
    assert "points ran ok" not in verdict and "baseline width=32, device=cpu" in verdict, verdict
    assert (out / "tiny_views.box.png").read_bytes().startswith(b"\x89PNG") and "](tiny_views.box.png)" in page
    rows = list(csv.DictReader((out / "points.csv").open(newline="", encoding="utf-8")))
    assert sorted(r["coord.model.hidden.0"] for r in rows) == ["32", "64", "64"], "a column per axis"
    assert {r["coord.device"] for r in rows} == {"cpu"}, rows[0]


def test_a_point_run_again_alone_keeps_its_row_and_shows_its_newest_attempt(tmp_path: Path) -> None:
    """`run -k "width=750 and device=cpu" --fresh` runs a plan of one point, numbered from 0: its new
    attempt stands for its repetition, and its row stays where the scenario's plan put it."""
    fixture = Path(__file__).parent / "fixtures" / "results" / "fixture-local" / "fx_width"
    results = tmp_path / "results" / "fixture-local" / "fx_width"
    results.parent.mkdir(parents=True)
    shutil.copytree(fixture, results)

    def rows() -> list[str]:
        done = suite_cli("report", "--results", tmp_path / "results", "--out", tmp_path / "out")
        assert done.returncode == 0, done.stdout + done.stderr
        page = (tmp_path / "out" / "fx_width.md").read_text()
        return [r for r in _sections(page)["On fixture-local"]["Results"] if " | " in r and "width=" in r]

    before = rows()
    record = json.loads((results / "8795d9598222-r0.json").read_text())
    record["spec"]["order"] = 0  # first of its own plan
    record["run"]["finished_at"] = "2026-12-01T09:00:00+00:00"
    record["timing"]["fit_s"] = 9.876
    (results / "8795d9598222-r0.2.json").write_text(json.dumps(record))
    after = rows()
    assert [r.split(" | ")[0] for r in after] == [r.split(" | ")[0] for r in before], after
    [rerun] = [r for r in after if r.startswith("width=750, device=cpu")]
    assert rerun != [r for r in before if r.startswith("width=750, device=cpu")][0], "the newest attempt is shown"
