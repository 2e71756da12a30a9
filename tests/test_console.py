"""The console of `suite run`, captured from the real CLI on the local backend: lines that fit 120
columns, skips said once per reason, an ETA from the first line, the accuracy gate named, and a
closing summary per scenario; -q and -v."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import suite_cli, write_scenario

from suite.run import progress

# Two CPU points (one that cannot learn, one that does) and their two GPU points, which this
# CPU-only machine skips.
TINY = """\
name: tiny
question: Does the console read at a glance?
model: {hidden: [32]}
training: {epochs: 2}
data: {allow_synthetic: true, train_samples: 2048, test_samples: 512}
repeats: 1
matrix:
  device: [cpu, gpu]
variants:
  - name: stuck
    set: {training.optimizer: sgd, training.learning_rate: 1.0e-9}
  - name: fine
"""
GATE = re.compile(r"below the accuracy gate \(0\.\d{3} < 0\.80\): left out of comparisons")


class Plan:
    def __init__(self, base: Path):
        self.base = base
        self.scenario = write_scenario(base, "tiny", TINY)
        self.res = base / "results"

    def run(self, *extra: str) -> str:
        proc = suite_cli(
            "run", self.scenario, "--backend", "local", "--smoke", "--results", self.res, "--machine", "box", *extra,
            env={"KERAS_HOME": str(self.base / "keras"), "NO_COLOR": "1"},
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Plan, str]:
    plan = Plan(tmp_path_factory.mktemp("console"))
    return plan, plan.run()


def _runs(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("[")]


@pytest.mark.slow
def test_every_line_fits_120_columns_and_the_result_path_is_said_once(tiny: tuple[Plan, str]) -> None:
    plan, out = tiny
    assert all(len(line) <= 120 for line in out.splitlines()), out
    assert sum(str(plan.res) in line for line in out.splitlines()) == 2, "the folder at the start, report at the end"
    assert out.splitlines()[0] == f"4 runs on backend local, results in {plan.res / 'box'}"
    assert not any(".json" in line for line in out.splitlines()), "result files are for -v and `suite show`"


@pytest.mark.slow
def test_skips_of_one_reason_are_said_once_when_the_plan_starts(tiny: tuple[Plan, str]) -> None:
    _, out = tiny
    skips = [line for line in out.splitlines() if "skipped" in line and not line.startswith(("tiny", "runs:"))]
    assert skips == ["2 GPU points skipped: needs 1 GPU(s); this machine has no GPU"], out
    lines = out.splitlines()
    assert lines.index(skips[0]) < lines.index(_runs(out)[0])


@pytest.mark.slow
def test_the_eta_is_there_from_the_first_line_and_comes_from_earlier_runs_after(tiny: tuple[Plan, str]) -> None:
    plan, out = tiny
    first = _runs(out)[0]
    before = out.splitlines()[out.splitlines().index(first) - 1]
    assert before == "2 runs to run; ETA at most 2 h 0 min (the runs' timeout_s: no earlier result to go by)", out
    assert "?" not in out
    again = plan.run("--repeats", "2", "-k", "variant=fine")
    lines = again.splitlines()
    plan_line = lines[lines.index(_runs(again)[0]) - 1]
    assert re.fullmatch(r"1 run to run; ETA \d+ s \(from earlier runs of the same points\)", plan_line), again
    assert "1 run already done (ok result on file; --fresh reruns)" in lines
    assert _runs(again)[0].startswith("[1/1] tiny [variant=fine, device=cpu] run 2 of 2: ok, fit ")


@pytest.mark.slow
def test_a_run_below_the_accuracy_gate_is_not_ok_and_counted_apart(tiny: tuple[Plan, str]) -> None:
    _, out = tiny
    stuck, fine = _runs(out)
    assert stuck.startswith("[1/2] tiny [variant=stuck, device=cpu] run 1 of 1: below the accuracy gate (")
    assert GATE.search(stuck) and ": ok" not in stuck, stuck
    assert fine.startswith("[2/2] tiny [variant=fine, device=cpu] run 1 of 1: ok, fit "), fine
    assert "runs: 1 ok, 1 below the accuracy gate, 2 skipped" in out.splitlines()


@pytest.mark.slow
def test_the_run_ends_with_the_answer_per_scenario(tiny: tuple[Plan, str]) -> None:
    plan, out = tiny
    lines = out.splitlines()
    start = lines.index("tiny, 4 points: 1 ok, 1 below the accuracy gate, 2 skipped")
    assert lines[start + 1].startswith("  verdict: ") and len(lines[start + 1]) > len("  verdict: ")
    assert any(re.fullmatch(r"  only point timed: \[variant=fine, device=cpu\] \d+\.\d\d s \(1 run\)", line)
               for line in lines[start:]), out  # fmt: skip
    assert lines[-1] == f"pages: python -m suite report --results {plan.res}"


@pytest.mark.slow
def test_quiet_says_only_the_summary_and_verbose_every_run_with_its_file(tiny: tuple[Plan, str]) -> None:
    plan, _ = tiny
    quiet = plan.run("-q")
    assert not any(line.startswith(("[", "backend", "4 runs", "2 GPU")) for line in quiet.splitlines()), quiet
    assert "tiny, 4 points: 1 ok, 1 below the accuracy gate, 2 skipped" in quiet
    assert "runs: 2 skipped, 2 already done" in quiet and "\x1b" not in quiet
    verbose = plan.run("-v")
    done = [line for line in verbose.splitlines() if ": already done (" in line]
    assert len(done) == 2 and all(" run 1 of 1: " in line for line in done), verbose
    skipped = [line for line in verbose.splitlines() if "skipped, as recorded before: needs 1 GPU(s)" in line]
    assert len(skipped) == 3, verbose  # one per run, and the grouped line
    assert " rep 0" not in verbose and "\x1b" not in verbose


def test_a_line_quoting_a_control_character_is_printed_escaped_line_by_line() -> None:
    """A line may quote a worker's message or a Ray node's label: the terminal shows it, never obeys it."""
    said: list[str] = []
    progress.Progress(say=said.append).line("skipped: no node offers gpu_model:\x1b[2J\nsecond\tline\x07")
    assert said == ["skipped: no node offers gpu_model:\\x1b[2J\nsecond\\tline\\x07"], said


def test_the_live_eta_counts_down_while_a_run_goes() -> None:
    now = [0.0]
    prog = progress.Progress(say=lambda _: None, clock=lambda: now[0])
    prog.plan(["a", "b"], {"a": 600.0, "b": 600.0}, earlier={"a": [20.0]})
    prog.start("[1/2] s [width=16] run 1 of 1", "a")
    assert prog.status().endswith("; ETA 40 s"), "a: its earlier 20 s, b: the median of what is known"
    now[0] = 5.0
    assert prog.status().endswith("; ETA 35 s")
    now[0] = 30.0
    assert prog.status().endswith("; ETA 20 s"), "a run that overruns takes nothing off the others' share"


def test_points_that_share_a_long_start_are_told_apart_on_a_line_that_must_be_cut() -> None:
    """gpu_knobs' labels share their first 30 characters; a skip's long message is cut first."""
    before = "[2/21] gpu_knobs "
    after = " run 1 of 1: skipped: needs 1 GPU(s); this machine has no GPU (NVML: " + "x" * 80
    labels = [f"variant=steps_per_execution={n}, batch_size={b}" for n in (10, 100) for b in (128, 1024)]
    lines = [progress.fit_line(before, label, after) for label in labels]
    assert all(len(line) == progress.WIDTH for line in lines) and len(set(lines)) == 4, lines
    assert all(f"[{label}]" in line for label, line in zip(labels, lines, strict=True)), "shorter than the floor: whole"
    longer = "model.dense=1024, training.batch_size=4096, training.optimizer=adam, device=gpu:0"
    cut = progress.fit_line(before, longer, after)
    shown = cut[cut.index("[", 2) + 1 : cut.index("] run")]
    assert len(shown) == progress.LABEL_FLOOR and len(cut) == progress.WIDTH, cut
    assert shown == longer[:23] + "..." + longer[-22:], "its start and its end (the device) kept"


@pytest.mark.slow
@pytest.mark.parametrize("width", [120, 111])
def test_a_long_scenario_name_gives_way_before_the_outcome(tmp_path: Path, width: int) -> None:
    """A scenario name may be 100 characters (docs/limits.md): the run's line still says what came of
    the run, and the closing line its counts, a long name giving way in its middle instead. Under
    ``run --hosts`` each host's run fits its lines to 120 columns less its ``[host] `` prefix, which
    the fleet says in SUITE_LINE_WIDTH (111: a host name of 7 characters)."""
    name = "a_scenario_whose_name_says_everything_" + "x" * 62
    scenario = write_scenario(
        tmp_path, name, TINY.replace("name: tiny", f"name: {name}").replace("name: stuck", "name: " + "s" * 60)
    )
    narrower = {} if width == 120 else {"SUITE_LINE_WIDTH": str(width)}
    proc = suite_cli(
        "run", scenario, "--backend", "local", "--smoke", "--results", tmp_path / "results", "--machine", "box",
        env={"KERAS_HOME": str(tmp_path / "keras"), "NO_COLOR": "1", **narrower},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert all(len(line) <= width for line in lines if str(tmp_path) not in line), proc.stdout
    assert any(len(line) > width - 5 for line in lines), "the long name fills the lines it is in"
    runs = _runs(proc.stdout)
    # Narrower, the label and the name reach their floors first, and then the outcome is cut too.
    assert len(runs) == 2 and "below the acc" in runs[0] and "ok, fit" in runs[1], proc.stdout
    closing = [line for line in lines if line.endswith("2 skipped") and "points:" in line]
    assert len(closing) == 1 and "1 ok, 1 below the accuracy gate, 2 skipped" in closing[0], proc.stdout


def test_a_line_width_in_another_script_s_digits_is_ignored() -> None:
    # str.isdigit takes '²' and '٣', which int() refuses: read at import, it stopped every command.
    for value in ("²", "٣٠", "", "abc", "99999"):
        proc = suite_cli("--version", env={"SUITE_LINE_WIDTH": value})
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (value, proc.stderr)


@pytest.mark.slow
def test_a_scenario_without_an_ok_run_ends_on_its_counts_and_verdict(tmp_path: Path) -> None:
    """Every point skipped: no line about the accuracy gate, which no run met or missed. Every ok run
    below the gate: the line says so."""
    gpu_only = write_scenario(tmp_path, "gpuonly", TINY.replace("name: tiny", "name: gpuonly").replace("cpu, ", ""))
    stuck = write_scenario(tmp_path, "stuck", TINY.replace("name: tiny", "name: stuck").replace("  - name: fine\n", ""))
    said = {}
    for scenario in (gpu_only, stuck):
        proc = suite_cli(
            "run", scenario, "--backend", "local", "--smoke", "--results", tmp_path / "results", "--machine", "box",
            env={"KERAS_HOME": str(tmp_path / "keras"), "NO_COLOR": "1"},
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        said[scenario.stem] = proc.stdout.splitlines()
    lines = said["gpuonly"]
    start = lines.index("gpuonly, 2 points: 2 skipped")
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("runs: "))
    assert lines[start + 1].startswith("  verdict: ") and all(
        line.startswith("    ") for line in lines[start + 2 : end]
    ), lines[start:]  # the counts, and the verdict on a line or more: no line about fit times
    assert "  no point ran ok above the accuracy gate: no fit time to show" in said["stuck"], said["stuck"]
