"""Reports against golden Markdown, built from real result files the suite produced (tests/fixtures).

UPDATE_GOLDEN=1 rewrites the golden files after an intended change; review the diff.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO

from suite import cli
from suite.report import pages, points, rerun

FIXTURES = Path(__file__).parent / "fixtures" / "results"
GOLDEN = Path(__file__).parent / "golden"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("reports")
    pages.write_reports(FIXTURES, out)
    return out


def test_markdown_matches_golden(rendered: Path) -> None:
    md_pages = sorted(rendered.glob("*.md"))
    assert {p.name for p in md_pages} >= {"README.md", "hardware.md", "fx_width.md", "fx_scaling.md", "fx_knobs.md"}
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.mkdir(exist_ok=True)
        for p in md_pages:
            shutil.copy(p, GOLDEN / p.name)
    for p in md_pages:
        assert p.read_text() == (GOLDEN / p.name).read_text(), f"{p.name} differs from tests/golden/{p.name}"


def test_regeneration_is_byte_identical(rendered: Path, tmp_path: Path) -> None:
    pages.write_reports(FIXTURES, tmp_path)
    for p in rendered.iterdir():
        assert (tmp_path / p.name).read_bytes() == p.read_bytes(), p.name
    assert list(rendered.glob("*.png")), "plots are written"


def test_plots_are_linked(rendered: Path) -> None:
    for name in ("fx_width", "fx_scaling", "fx_knobs"):
        page = (rendered / f"{name}.md").read_text()
        pngs = [p.name for p in rendered.glob(f"{name}.*.png")]
        assert pngs and all(f"]({png})" in page for png in pngs)


def test_hardware_comparison_names_what_differs(tmp_path: Path) -> None:
    """Two machines from one real folder, each given a GPU: its GPU points' runs are edited to have
    reached the worker there (a CPU run's environment, with the machine's GPU), as GPU facts come
    from runs of GPU points alone."""
    src = FIXTURES / "fixture-local"
    for name, gpu in (("box-a", "Fixture GPU"), ("box-b", "Other GPU")):
        shutil.copytree(src, tmp_path / name)
        records = {path: json.loads(path.read_text()) for path in (tmp_path / name).rglob("*.json")}
        seen = next(d["environment"] for d in records.values() if d["environment"])
        for path, data in records.items():
            data["run"]["machine"] = name
            if data["spec"]["config"]["device"].startswith("gpu"):
                driver = "999.1" if name == "box-b" else "550.1"
                card = {"index": 0, "uuid": "GPU-x", "name": gpu, "memory_mib": 1, "driver": driver}
                data["environment"] = {**seen, "gpus_driver": [card]}
            path.write_text(json.dumps(data))
    pages.write_reports(tmp_path, tmp_path / "out", reference="box-a")
    text = (tmp_path / "out" / "hardware.md").read_text()
    assert "Reference: `box-a`" in text
    assert "Differ: GPU model, GPU driver." in text
    assert re.search(r"^\| GPU model +\| Fixture GPU +\| Other GPU +\|$", text, re.M), text
    assert "(95% CI" in text, "ratios against the reference carry intervals"


def test_cells_are_escaped() -> None:
    assert pages.cell("a|b\nc") == "a\\|b c"


REV_A, REV_B = "1a2b3c4d5e6f" + "a" * 28, "9f8e7d6c5b4a" + "b" * 28
LOCK = "requirements/locks/run-py3.11.txt"


def _provenance(revision: str, *, dirty: list[str] | None = None, matches: bool = True) -> dict:
    differences = [] if matches else ["numpy 2.4.6 in the lock, 2.3.0 installed", "a|b *x* installed, not in the lock"]
    return {
        "suite": {
            "version": "0.1.0",
            "git_revision": revision,
            "git_dirty": bool(dirty),
            "dirty_paths": dirty or [],
            "diff_sha256": "d1ff" + "0" * 60 if dirty else None,
        },
        "environment": {
            "kind": "venv",
            "lock_file": LOCK,
            "lock_sha256": "ab12cd34ef56" + "0" * 52,
            "matches_lock": matches,
            "lock_differences": differences,
        },
        "image": None,
    }


def _machine(tmp_path: Path, name: str, section: Any) -> None:
    """A copy of the fixture machine under ``name``; ``section(data)`` gives each result's provenance."""
    shutil.copytree(FIXTURES / "fixture-local", tmp_path / name)
    for path in sorted((tmp_path / name).rglob("*.json")):
        data = json.loads(path.read_text())
        data["run"]["machine"] = name
        data["provenance"] = section(data)
        path.write_text(json.dumps(data))


def _environment(page: str, machine: str) -> list[str]:
    section = page.split(f"## On `{machine}`", 1)[1].split("### Environment", 1)[1].split("### Reproduce", 1)[0]
    return [line for line in section.splitlines() if line.startswith("- ")]


def test_the_environment_says_which_code_and_lock_the_runs_came_from(tmp_path: Path) -> None:
    _machine(tmp_path, "clean", lambda d: _provenance(REV_A))
    _machine(tmp_path, "dirty", lambda d: _provenance(REV_A, dirty=["suite/x.py", "suite/y.py"], matches=False))
    pages.write_reports(tmp_path, tmp_path / "out")
    page = (tmp_path / "out" / "fx_knobs.md").read_text()
    clean = _environment(page, "clean")
    assert "- Suite revision: `1a2b3c4d5e6f`" in clean
    assert f"- Environment lock: `{LOCK}` (sha256 `ab12cd34ef56`)" in clean
    dirty = _environment(page, "dirty")
    assert (
        "- Suite revision: `1a2b3c4d5e6f` + uncommitted changes (2 files: `suite/x.py`, `suite/y.py`; "
        "diff sha256 `d1ff00000000`)"
    ) in dirty, "the dirty paths are named: a README edit reads apart from a code change"
    assert (
        f"- Environment lock: `{LOCK}` (sha256 `ab12cd34ef56`); installed packages differ from the lock: "
        "numpy 2.4.6 in the lock, 2.3.0 installed; a\\|b \\*x\\* installed, not in the lock"
    ) in dirty, "user-influenced text is escaped"
    assert not any(line.startswith("- Image:") for line in clean + dirty), "local runs have no image"


def test_a_page_whose_runs_came_from_two_revisions_says_so(tmp_path: Path) -> None:
    _machine(tmp_path, "box", lambda d: _provenance(REV_B if d["spec"]["repetition"] == 2 else REV_A))
    pages.write_reports(tmp_path, tmp_path / "out")
    lines = _environment((tmp_path / "out" / "fx_knobs.md").read_text(), "box")
    assert "- Suite revision: runs on this page came from 2 suite revisions: `1a2b3c4d5e6f` (6 runs); " in "\n".join(
        lines
    )
    assert any(line.endswith("`9f8e7d6c5b4a` (3 runs)") for line in lines), lines
    hardware = (tmp_path / "out" / "hardware.md").read_text()
    assert re.search(r"^\| suite revision +\| 1a2b3c4d5e6f; 9f8e7d6c5b4a +\|$", hardware, re.M), hardware


def test_hardware_says_when_two_machines_ran_different_code_or_environments(tmp_path: Path) -> None:
    _machine(tmp_path, "box-a", lambda d: _provenance(REV_A))
    _machine(tmp_path, "box-b", lambda d: _provenance(REV_B, matches=False))
    pages.write_reports(tmp_path, tmp_path / "out", reference="box-a")
    text = (tmp_path / "out" / "hardware.md").read_text()
    assert "Differ: suite revision, environment lock." in text
    assert "Same: CPU, CPU cores, backend, image ID, Docker engine" in text
    assert "`box-a` and `box-b` ran different suite code: `box-a` 1a2b3c4d5e6f, `box-b` 9f8e7d6c5b4a." in text
    assert (
        "`box-a` and `box-b` ran in different environments: environment lock: "
        f"`box-a` {LOCK} ab12cd34ef56, `box-b` {LOCK} ab12cd34ef56 (installed packages differ from it)."
    ) in text
    assert "Unknown on some machine" not in text

    _machine(tmp_path, "box-c", lambda d: {})  # results made before provenance was recorded
    pages.write_reports(tmp_path, tmp_path / "out2", reference="box-a")
    text = (tmp_path / "out2" / "hardware.md").read_text()
    assert "Not recorded by the results of `box-c`, so not compared there: suite revision, environment lock." in text
    assert "`box-a` and `box-c` ran different" not in text, "an unrecorded revision is not called a difference"
    # One machine of older results does not hide that two others ran different code.
    assert "Differ: suite revision, environment lock." in text
    assert "`box-a` and `box-b` ran different suite code: `box-a` 1a2b3c4d5e6f, `box-b` 9f8e7d6c5b4a." in text
    assert "`box-a` and `box-b` ran in different environments: environment lock: " in text


def test_hardware_does_not_call_a_publishing_commit_other_code(tmp_path: Path) -> None:
    def with_tree(revision: str, tree: str) -> dict:
        section = _provenance(revision)
        section["suite"]["code_tree"] = tree
        return section

    _machine(tmp_path, "box-a", lambda d: with_tree(REV_A, "c0de" * 16))
    _machine(tmp_path, "box-b", lambda d: with_tree(REV_B, "c0de" * 16))  # a commit of reports/ later
    _machine(tmp_path, "box-c", lambda d: with_tree(REV_B, "beef" * 16))
    pages.write_reports(tmp_path, tmp_path / "out", reference="box-a")
    text = (tmp_path / "out" / "hardware.md").read_text()
    assert "`box-a` and `box-b` ran the same suite code at different revisions" in text
    assert "`box-a` and `box-b` ran different suite code" not in text
    assert "`box-a` and `box-c` ran different suite code: `box-a` c0dec0dec0de, `box-c` beefbeefbeef." in text


def test_the_environment_names_up_to_five_dirty_paths_and_untracked_files(tmp_path: Path) -> None:
    dirty = ["README.md", *[f"suite/m{i}.py" for i in range(5)], "suite/new_mod.py (untracked)"]
    _machine(tmp_path, "box", lambda d: _provenance(REV_A, dirty=dirty))
    pages.write_reports(tmp_path, tmp_path / "out")
    lines = _environment((tmp_path / "out" / "fx_knobs.md").read_text(), "box")
    assert (
        "- Suite revision: `1a2b3c4d5e6f` + uncommitted changes (7 files: `README.md`, `suite/m0.py`, "
        "`suite/m1.py`, `suite/m2.py`, `suite/m3.py` and 2 more; diff sha256 `d1ff00000000`)"
    ) in lines
    _machine(tmp_path, "box-u", lambda d: _provenance(REV_A, dirty=["suite/new|mod.py (untracked)"]))
    pages.write_reports(tmp_path, tmp_path / "out2")
    lines = _environment((tmp_path / "out2" / "fx_knobs.md").read_text(), "box-u")
    assert any("(1 file: `suite/new|mod.py` (untracked); diff sha256" in line for line in lines), lines


def test_the_environment_says_when_the_code_changed_while_runs_ran(tmp_path: Path) -> None:
    at_end = _provenance(REV_A, dirty=["suite/x.py"])["suite"]

    def changed_in_one(d: dict) -> dict:
        section = _provenance(REV_A)
        if d["spec"]["repetition"] == 1 and d["spec"]["point_label"] == _first_label():
            section["suite_changed_during_run"] = at_end
        return section

    _machine(tmp_path, "box", changed_in_one)
    pages.write_reports(tmp_path, tmp_path / "out")
    lines = _environment((tmp_path / "out" / "fx_knobs.md").read_text(), "box")
    assert "- Suite revision: `1a2b3c4d5e6f`" in lines, "the code at launch"
    changed = [line for line in lines if "changed while" in line]
    assert changed == [
        "- **The suite's code changed while 1 of 9 runs ran** (above: the code at launch); at the end: "
        "`1a2b3c4d5e6f` + uncommitted changes (1 file: `suite/x.py`; diff sha256 `d1ff00000000`)"
    ], lines


def _first_label() -> str:
    first = sorted((FIXTURES / "fixture-local" / "fx_knobs").glob("*.json"))[0]
    return json.loads(first.read_text())["spec"]["point_label"]


def test_the_image_line_gives_the_digest(tmp_path: Path) -> None:
    shutil.copytree(FIXTURES / "fixture-docker", tmp_path / "fixture-docker")
    for path in (tmp_path / "fixture-docker").rglob("*.json"):
        data = json.loads(path.read_text())
        data["run"]["repo_digests"] = ["suite-bench@sha256:" + "d" * 64]
        path.write_text(json.dumps(data))
    pages.write_reports(tmp_path, tmp_path / "out")
    page = (tmp_path / "out" / "fx_width.md").read_text()
    assert f"- Image: ID `5a942f222e6c`, digest `suite-bench@sha256:{'d' * 64}`, recipe not recorded" in page
    golden = (GOLDEN / "fx_width.md").read_text()
    assert "- Image: ID `5a942f222e6c`, digest none (built locally, not pushed), recipe" in golden


def _reproduce_commands(page: str, machine: str) -> tuple[list[list[str]], str]:
    """The ``run`` commands (as argument lists) of a machine's "Reproduce" section, and its check line."""
    section = page.split(f"## On `{machine}`", 1)[1].split("\n## ", 1)[0]
    block = section.split("### Reproduce\n\n", 1)[1]
    command = block.split("\n", 1)[0].strip("`")
    check = next(line for line in block.splitlines() if line.startswith("To check these numbers: "))
    parts = [shlex.split(part) for part in command.split(" && ")]
    assert all(p[:3] == ["python", "-m", "suite"] for p in parts), command
    return [p[3:] for p in parts], check


def test_the_reproduce_command_plans_exactly_the_runs_on_the_page(tmp_path: Path, monkeypatch: Any) -> None:
    """As if run with ``--repeats 2 -k ... --results <tmp> --machine box``: the command the page gives,
    fed to the suite's own parser and planner, plans the very runs whose files the page read."""
    shutil.copytree(FIXTURES / "fixture-local" / "fx_knobs", tmp_path / "box" / "fx_knobs")
    files = sorted((tmp_path / "box").rglob("*.json"))
    labels = sorted({json.loads(p.read_text())["spec"]["point_label"] for p in files})
    for path in files:
        data = json.loads(path.read_text())
        if data["spec"]["repetition"] == 2 or data["spec"]["point_label"] == labels[0]:
            path.unlink()  # the runs a --repeats 2 -k run without that point would not have made
            continue
        data["run"]["machine"] = "box"
        path.write_text(json.dumps(data))
    kept = sorted(
        (d["spec"]["point_label"], d["spec"]["repetition"])
        for d in (json.loads(p.read_text()) for p in (tmp_path / "box").rglob("*.json"))
    )
    pages.write_reports(tmp_path, tmp_path / "out")
    page = (tmp_path / "out" / "fx_knobs.md").read_text()
    (run, again), check = _reproduce_commands(page, "box")
    monkeypatch.chdir(REPO)
    args = cli._parser().parse_args(run)
    assert args.command == "run" and args.repeats == 2 and args.machine == "box"
    assert args.results == tmp_path and args.select
    planned = sorted((s.point_label, s.repetition) for s in cli.common.load_plan(args))
    assert planned == kept
    remake = cli._parser().parse_args(again)
    assert remake.command == "report" and remake.results == tmp_path
    assert check == f"To check these numbers: `python -m suite reproduce {tmp_path / 'box' / 'fx_knobs'}`"


def test_the_reproduce_command_carries_the_overrides_and_the_repository_folder(tmp_path: Path) -> None:
    """A folder inside the repository is named from its top; the default folder is not named;
    ``--set`` overrides each get a ``run``."""
    page = (GOLDEN / "fx_knobs.md").read_text()
    (run, again), check = _reproduce_commands(page, "fixture-local")
    assert run[run.index("--results") + 1] == "tests/fixtures/results" and "-k" not in run
    assert check == "To check these numbers: `python -m suite reproduce tests/fixtures/results/fixture-local/fx_knobs`"
    shutil.copytree(FIXTURES / "fixture-local" / "fx_knobs", tmp_path / "box" / "fx_knobs")
    for path in sorted((tmp_path / "box").rglob("*.json")):
        data = json.loads(path.read_text())
        data["run"]["machine"] = "box"
        data["spec"]["overrides"] = {"training.batch_size": 64}
        path.write_text(json.dumps(data))
    view = next(v for v in points.load_views(tmp_path) if v.machine == "box")
    assert "--set training.batch_size=64" in rerun.run_commands(view, tmp_path)
    default = rerun.run_commands(view, REPO / "reports" / "results")
    assert "--results" not in default and "reports/results" in rerun.check_command(view, None)


def test_the_image_line_names_the_base(tmp_path: Path) -> None:
    """A registry base is named with its digest; a Debian-made one as made on the build machine, by ID."""
    bases = {
        "pulled": {"suite.base.source": "registry", "suite.base.digest": "sha256:" + "b" * 64},
        "made": {"suite.base.source": "debian", "suite.base.ref": "suite-base:21ab", "suite.base.digest": ""},
    }
    names = {"pulled": "docker.io/library/python:3.11-slim-bookworm", "made": "suite-base:21ab"}
    for machine, labels in bases.items():
        shutil.copytree(FIXTURES / "fixture-docker", tmp_path / machine)
        for path in sorted((tmp_path / machine).rglob("*.json")):
            data = json.loads(path.read_text())
            data["run"]["machine"] = machine
            if "image_labels" in data["run"]:  # a run that got its image
                data["run"]["image_labels"] = {**data["run"]["image_labels"], **labels}
                data["run"]["oci_labels"] = {"org.opencontainers.image.base.name": names[machine]}
            path.write_text(json.dumps(data))
    pages.write_reports(tmp_path, tmp_path / "out")
    page = (tmp_path / "out" / "fx_width.md").read_text()
    image_id = "`17868520377b`"  # the fixture base's suite.base.id label
    pulled = [line for line in _environment(page, "pulled") if line.startswith("- Image:")]
    assert pulled and pulled[0].endswith(
        f", base: registry `docker.io/library/python:3.11-slim-bookworm@sha256:{'b' * 64}` (ID {image_id})"
    ), pulled
    made = [line for line in _environment(page, "made") if line.startswith("- Image:")]
    assert made and made[0].endswith(
        f", base: Debian packages, made on the build machine: `suite-base:21ab` (ID {image_id})"
    ), made


def _verdicts(page: str) -> list[str]:
    """The verdict bullets at the top of a scenario page, as a reader sees them."""
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("commonmark").parse(page.split("\n## ", 1)[0])
    return [t.content for i, t in enumerate(tokens) if t.type == "inline" and tokens[i - 2].type == "list_item_open"]


def test_pages_are_read_at_a_glance(rendered: Path) -> None:
    """Verdicts of at most two sentences and ~300 characters, tables a screen wide, the column
    definitions on one linked page, each skip reason said once."""
    for name in ("fx_width", "fx_scaling", "fx_knobs"):
        page = (rendered / f"{name}.md").read_text()
        said = _verdicts(page)
        assert said, name
        for line in said:
            verdict = line.split(":** ", 1)[1]
            assert len(re.findall(r"\.(?:\s+(?=[A-Z])|$)", verdict)) <= 2 and len(verdict) <= 320, verdict
            depth = max(verdict[: i + 1].count("(") - verdict[: i + 1].count(")") for i in range(len(verdict)))
            assert depth <= 1, f"parentheses nest: {verdict}"
        table_rows = [line for line in page.splitlines() if line.startswith("|")]
        assert max(len(row) for row in table_rows) <= 200, name
        assert max(row.count("|") for row in table_rows) <= 8, "at most 7 columns a table"
        assert "How each column is computed" not in page and "(docs/reading-a-report.md)" in page
        assert "?" not in "".join(line for line in page.splitlines() if line.startswith("- CPU"))
        failures = page.split("### Skips and failures", 1)[1].split("###", 1)[0] if "Skips and" in page else ""
        reasons = [line.split(": ", 1)[-1] for line in failures.splitlines() if line.startswith("- ")]
        assert len(reasons) == len(set(reasons)), "one line per reason"
    index = (rendered / "README.md").read_text()
    cells = [row.split("|")[3].strip() for row in index.splitlines() if row.startswith("| [")]
    assert cells and all(len(re.findall(r"\.(?:\s+(?=[A-Z])|$)", c)) == 1 for c in cells), cells


def test_a_page_of_skips_only_says_what_it_knows_of_the_host(tmp_path: Path) -> None:
    for path in sorted((FIXTURES / "fixture-local" / "fx_width").glob("*.json")):
        data = json.loads(path.read_text())
        if data["status"] == "skipped":
            (tmp_path / "box" / "fx_width").mkdir(parents=True, exist_ok=True)
            (tmp_path / "box" / "fx_width" / path.name).write_text(json.dumps(data))
    pages.write_reports(tmp_path, tmp_path / "out")
    page = (tmp_path / "out" / "fx_width.md").read_text()
    assert "CPU: ?" not in page and "Python ?" not in page
    assert "- CPU, GPUs and versions: not recorded, as no run reached the worker here (needs 1 GPU(s); this " in page
    assert "2 of 2 points have no ok run" in page


def test_a_verdict_from_smoke_size_runs_says_so_where_it_is_read(tmp_path: Path) -> None:
    """The verdict opens the page and fills the index, above the section's caveat: where its runs
    were at smoke size, it says so there too. Full-size views say nothing of size."""
    res = tmp_path / "results"
    shutil.copytree(FIXTURES / "fixture-local" / "fx_width", res / "fixture-local" / "fx_width")
    shutil.copytree(FIXTURES / "fixture-docker" / "fx_width", res / "fixture-docker" / "fx_width")
    for path in (res / "fixture-local").rglob("*.json"):
        data = json.loads(path.read_text())
        data["spec"]["smoke"] = True
        path.write_text(json.dumps(data))
    assert cli.main(["report", "--results", str(res), "--out", str(tmp_path / "out")]) == 0
    page = (tmp_path / "out" / "fx_width.md").read_text()
    bullets = [line for line in page.splitlines() if line.startswith("- **On ")]
    assert [b.split(":**")[0] for b in bullets] == ["- **On `fixture-docker`", "- **On `fixture-local`, smoke size"]
    index = (tmp_path / "out" / "README.md").read_text()
    rows = {line.split("|")[2].strip() for line in index.splitlines() if line.startswith("| [fx_width]")}
    assert rows == {"fixture-docker", "fixture-local, smoke size"}, index
