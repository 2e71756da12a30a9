"""``--set KEY=VALUE``: read as YAML, checked as the YAML is, applied before the matrix, in the
fingerprint, the result, the report and its Reproduce command; passed on to each host of a fleet."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest
from conftest import SCENARIOS, check_points, check_rows, suite_cli, write_scenario

from suite import cli
from suite.record import results
from suite.run import fleet
from suite.spec import plan, scenario
from suite.spec.scenario import ScenarioError

FIXTURES = Path(__file__).parent / "fixtures"

TINY = """\
name: tiny_set
question: Does --set change one setting?
model: {hidden: [32, 16]}
training: {epochs: 3}
data: {allow_synthetic: true, train_samples: 512, test_samples: 256}
repeats: 1
timeout_s: 300
matrix:
  model.hidden.0: [8, 16]
  device: [cpu, "gpu:64"]
variants:
  - name: plain
  - name: prefetch
    set: {training.input_pipeline: tf_data}
smoke:
  training.epochs: 1
  data.train_samples: 256
"""


# The same without sweeping the model or the device, for the rules of those settings' values.
FLAT = TINY.replace('  model.hidden.0: [8, 16]\n  device: [cpu, "gpu:64"]\n', "  training.seed: [1, 2]\n")


def _tiny(tmp_path: Path, text: str = TINY) -> Path:
    return write_scenario(tmp_path, "tiny_set", text)


@pytest.mark.parametrize(
    ("text", "path", "value"),
    [
        ("training.epochs=3", "training.epochs", 3),
        ("model.hidden=[512,256]", "model.hidden", [512, 256]),
        ("model.hidden=[512, 256]", "model.hidden", [512, 256]),
        ("image=null", "image", None),
        ("training.jit_compile=true", "training.jit_compile", True),
        ("device=gpu:2", "device", "gpu:2"),
        ("model.dropout=0.25", "model.dropout", 0.25),
        ("data.data_dir=/data/mnist idx", "data.data_dir", "/data/mnist idx"),
        (" training.seed =7", "training.seed", 7),
    ],
)
def test_values_are_read_as_yaml(text: str, path: str, value: object) -> None:
    [o] = scenario.parse_overrides([text])
    assert (o.path, o.value, o.source) == (path, value, f"--set {text}")


def test_override_flag_reads_back_as_the_same_value() -> None:
    for value in (3, 0.25, True, None, [512, 256], "gpu:2", "null", "true", "3", "a b", "x: y"):
        flag = plan.override_flag("k", value)
        [o] = scenario.parse_overrides([flag])
        assert o.value == value and type(o.value) is type(value), flag
    assert plan.override_flag("model.hidden", [512, 256]) == "model.hidden=[512, 256]"
    assert plan.override_flag("device", "gpu:2") == "device=gpu:2"


def test_applied_before_the_matrix_and_over_the_smoke_size(tmp_path: Path) -> None:
    sc = scenario.load(_tiny(tmp_path))
    given = {"model.hidden.1": 64, "training.epochs": 2}
    specs = plan.expand(sc, smoke=True, overrides=given, data=lambda d: {"source": "synthetic"})
    assert {tuple(s.config["model"]["hidden"]) for s in specs} == {(8, 64), (16, 64)}, "the matrix still sweeps"
    assert all(s.config["training"]["epochs"] == 2 for s in specs), "--set wins over the smoke size's 1"
    assert all(s.config["data"]["train_samples"] == 256 for s in specs), "the rest of the smoke size stays"
    assert all(s.overrides == given for s in specs)
    assert all(s.to_dict()["overrides"] == given for s in specs), "the spec (so the result) records them"
    plain = plan.expand(sc, smoke=True, data=lambda d: {"source": "synthetic"})
    assert all(s.overrides == {} for s in plain)
    assert {s.fingerprint for s in plain}.isdisjoint(s.fingerprint for s in specs)


def _fingerprints(*args: object) -> dict[str, str]:
    proc = suite_cli("check", "--backend", "local", *args)
    assert proc.returncode == 0, proc.stderr
    return {label: row["fingerprint"] for label, row in check_rows(proc.stdout).items()}


def test_fingerprint_is_that_of_the_file_with_the_value_written_in(tmp_path: Path) -> None:
    """--set training.epochs=5 measures what a file saying epochs: 5 measures: the same fingerprints;
    without it, others."""
    flagged = _fingerprints(_tiny(tmp_path), "--set", "training.epochs=5", "--set", "model.activation=tanh")
    other = tmp_path / "edited"
    other.mkdir()
    edited = TINY.replace("training: {epochs: 3}", "training: {epochs: 5}").replace(
        "model: {hidden: [32, 16]}", "model: {hidden: [32, 16], activation: tanh}"
    )
    assert flagged == _fingerprints(write_scenario(other, "tiny_set", edited))
    plain = _fingerprints(_tiny(tmp_path))
    assert flagged.keys() == plain.keys() and not set(flagged.values()) & set(plain.values())


BAD = [
    (
        ["training.epochs=0"],
        "--set training.epochs=0: key 'training.epochs': got 0 (int); allowed: an integer in [1, 10000]",
    ),
    (
        ["training.epoch=3"],
        "--set training.epoch=3: key 'training.epoch': no such setting in the scenario; did you mean",
    ),
    (["training.epochs"], "--set training.epochs: expected KEY=VALUE"),
    (["=3"], "--set =3: expected KEY=VALUE"),
    (["model.hidden=[512,"], "--set model.hidden=[512,: the value is not YAML"),
    (
        ["model.hidden=[512, 0]"],
        "--set model.hidden=[512, 0]: key 'model.hidden.1': got 0 (int); allowed: an integer",
        FLAT,
    ),
    (["training"], "--set training: expected KEY=VALUE"),
    (["training={epochs: 2}"], "--set training={epochs: 2}: key 'training': names a whole section"),
    (["device=tpu"], "--set device=tpu: key 'device': got 'tpu' (str); allowed: 'cpu', 'gpu'", FLAT),
    (["repeats=2"], "--set repeats=2: key 'repeats': not a setting; --repeats N sets the repetitions per point"),
    (
        ["model.hidden.0=64"],
        "--set model.hidden.0=64: key 'model.hidden.0': {file} sweeps model.hidden.0 in its matrix (8, 16); "
        "leave that scenario out (name the files to run, or -k) or drop this --set",
    ),
    (["model.hidden=[64]"], "--set model.hidden=[64]: key 'model.hidden': {file} sweeps model.hidden.0 in its matrix"),
    (
        ["training.input_pipeline=numpy"],
        "--set training.input_pipeline=numpy: key 'training.input_pipeline': {file} sets it in its variants 'prefetch'",
    ),
    (
        ["backend=torch"],
        "{file} --set backend=torch: key 'matrix point [variant=plain, width=8, device=gpu:64]': device 'gpu:64' "
        "runs with MirroredStrategy, which needs backend tensorflow\n",
    ),
    (
        ["training.epochs=2", "training.epochs=4"],
        "--set training.epochs=4: key 'training.epochs': also set by --set training.epochs=2",
    ),
]


@pytest.mark.parametrize("case", BAD, ids=[" ".join(case[0]) for case in BAD])
def test_bad_overrides_exit_2_naming_the_flag(tmp_path: Path, case: tuple) -> None:
    sets, expected, text = (*case, TINY)[:3]
    path = _tiny(tmp_path, text)
    flags = [arg for s in sets for arg in ("--set", s)]
    for command in ("check", "run"):
        proc = suite_cli(command, path, "--backend", "local", "--smoke", *flags)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stderr.startswith("error: " + expected.replace("{file}", str(path))), proc.stderr
        assert "Traceback" not in proc.stderr
        assert "runs on backend" not in proc.stdout, "nothing ran"


def test_a_swept_key_is_checked_only_where_points_are_kept() -> None:
    files = [SCENARIOS / "gpu_knobs.yaml", SCENARIOS / "mnist_mlp_width.yaml"]
    bad = suite_cli("check", *files, "--backend", "local", "--smoke", "--set", "training.batch_size=256")
    assert bad.returncode == 2
    assert "key 'training.batch_size': scenarios/gpu_knobs.yaml sweeps training.batch_size in its matrix" in bad.stderr
    good = suite_cli(
        "check", *files, "--backend", "local", "--smoke", "--set", "training.batch_size=256", "-k", "width=100"
    )
    assert good.returncode == 0, good.stderr
    assert "--set, for every point: training.batch_size=256" in good.stdout


def test_a_problem_some_scenarios_have_names_their_files(tmp_path: Path) -> None:
    other = tmp_path / "other.yaml"
    other.write_text(TINY.replace("tiny_set", "other").replace("model.hidden.0: [8, 16]", "training.seed: [1, 2]"))
    problems = scenario.overrides_problems(
        [scenario.load(_tiny(tmp_path)), scenario.load(other)], scenario.parse_overrides(["training.seed=3"])
    )
    assert problems == [
        f"--set training.seed=3: key 'training.seed': {other} sweeps training.seed in its matrix (1, 2); "
        "leave that scenario out (name the files to run, or -k) or drop this --set"
    ]
    with pytest.raises(ScenarioError, match="also set by"):
        scenario.parse_overrides(["model.hidden=[1]", "model.hidden.0=2"])


def test_run_hosts_passes_k_and_set_to_every_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict = {}

    def fake_run_fleet(hosts, run_args, results_dir, specs, **_):
        seen.update(hosts=hosts, run_args=run_args, specs=specs)
        return 0

    monkeypatch.setattr(fleet, "run_fleet", fake_run_fleet)
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("hosts:\n  a: {docker: 'ssh://a'}\n  b: {docker: 'ssh://b'}\n")
    path = _tiny(tmp_path)
    code = cli.main(
        ["run", str(path), "--smoke", "--hosts", str(hosts), "--results", str(tmp_path / "r"), "-k", "width=8"]
        + ["--set", "training.epochs=2", "--set", "model.activation=tanh"]
    )
    assert code == 0
    args = seen["run_args"]
    assert args[args.index("-k") + 1] == "width=8"
    assert [args[i + 1] for i, a in enumerate(args) if a == "--set"] == ["training.epochs=2", "model.activation=tanh"]
    assert {s.point_label for s in seen["specs"]} == {
        f"variant={v}, width=8, device={d}" for v in ("plain", "prefetch") for d in ("cpu", "gpu:64")
    }
    assert all(s.config["training"]["epochs"] == 2 for s in seen["specs"])
    _, child = fleet.child_commands(seen["hosts"][0], args, tmp_path / "r")
    proc_args = child[child.index("run") + 1 :]
    parsed = cli._parser().parse_args(["run", *proc_args])
    assert parsed.select == "width=8" and parsed.overrides == ["training.epochs=2", "model.activation=tanh"]


def test_report_shows_each_set_of_overrides_apart_and_reproduces_each(tmp_path: Path) -> None:
    """Points measured with other --set (a later -k rerun) get a section of their own that names
    the overrides, and each section's Reproduce command runs exactly its points with its --set."""
    res = tmp_path / "results"
    shutil.copytree(FIXTURES / "results" / "fixture-local" / "fx_width", res / "box" / "fx_width")
    for path in (res / "box" / "fx_width").glob("*.json"):
        data = json.loads(path.read_text())
        data["run"]["machine"] = "box"
        if data["spec"]["point"]["model.hidden.0"] == 750:
            data["spec"]["overrides"] = {"training.epochs": 3, "model.activation": "tanh"}
        path.write_text(json.dumps(data))
    proc = suite_cli("report", "--results", res, "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "out" / "fx_width.md").read_text()
    flags = "`--set training.epochs=3` `--set model.activation=tanh`"  # as the result files hold them
    plain, apart = page.split("\n## On `box`\n", 1)[1].split(f"\n## On `box`, with {flags}\n")
    assert f"- Changed from the scenario file (every point): {flags}" in apart
    assert "--set" not in plain.split("### Reproduce")[0], "the section of the file's own settings names none"
    by_k = {}
    for section in (plain, apart):
        command = section.split("### Reproduce\n\n`")[1].split("`\n")[0]
        runs = [shlex.split(c) for c in command.split(" && ")]
        assert runs[-1] == ["python", "-m", "suite", "report", "--results", str(res)]
        (run,) = runs[:-1]
        assert run[:4] == ["python", "-m", "suite", "run"]
        check = suite_cli("check", *run[4:])
        assert check.returncode == 0, check.stderr
        labels = check_points(check.stdout)
        by_k[tuple(a for i, a in enumerate(run) if i and run[i - 1] == "--set")] = labels
    assert by_k == {
        (): ["width=100, device=cpu", "width=100, device=gpu"],
        ("training.epochs=3", "model.activation=tanh"): ["width=750, device=cpu", "width=750, device=gpu"],
    }


@pytest.mark.slow
def test_run_with_set_end_to_end(tmp_path: Path) -> None:
    """A smoke run with --set: the result holds the overrides and their effect, the report says so,
    and its Reproduce command finds the same runs done."""
    path, res, out = _tiny(tmp_path), tmp_path / "results", tmp_path / "out"
    where = ["--backend", "local", "--results", res, "--machine", "m"]
    k = "variant=plain and width=8 and device=cpu"
    sets = ["--set", "training.epochs=2", "--set", "model.activation=tanh"]
    proc = suite_cli("run", path, "--smoke", *where, "-k", k, *sets)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "--set, for every point: training.epochs=2, model.activation=tanh" in proc.stdout
    [(_, result)] = results.load_folder(res / "m")
    assert result.ok and result.spec["overrides"] == {"training.epochs": 2, "model.activation": "tanh"}
    assert result.spec["config"]["model"]["activation"] == "tanh"
    assert len(result.timing["epoch_s"]) == 2, "--set's 2 epochs, not the smoke size's 1"
    rep = suite_cli("report", "--results", res, "--out", out)
    assert rep.returncode == 0, rep.stderr
    page = (out / "tiny_set.md").read_text()
    assert (
        "- Changed from the scenario file (every point): `--set model.activation=tanh` `--set training.epochs=2`"
        in (page)
    )
    command = page.split("### Reproduce\n\n`")[1].split("`\n")[0]
    first = shlex.split(command.split(" && ")[0])
    assert first[:4] == ["python", "-m", "suite", "run"] and "--smoke" in first
    again = suite_cli(*first[3:], "-k", k, *where)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "1 run already done (ok result on file; --fresh reruns)" in again.stdout.splitlines(), again.stdout


@pytest.mark.slow
def test_a_set_of_the_value_the_runs_have_is_not_recorded(tmp_path: Path) -> None:
    """--set of what the smoke size already gives (training.epochs=1) changes nothing: its run shares the
    scenario's fingerprint, so a later plain run finds it done. It must then be the scenario's own
    point, not a --set view the scenario's own section lacks; a --set that changes something stays."""
    path, res, out = _tiny(tmp_path), tmp_path / "results", tmp_path / "out"
    where = ["--backend", "local", "--results", res, "--machine", "m"]
    k = "variant=plain and width=8 and device=cpu"
    proc = suite_cli("run", path, "--smoke", *where, "-k", k, "--set", "training.epochs=1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [(_, result)] = results.load_folder(res / "m")
    assert result.spec["overrides"] == {}
    plain = suite_cli("check", path, "--smoke", *where, "-k", k)
    assert "1 already done" in plain.stdout, plain.stdout
    rep = suite_cli("report", "--results", res, "--out", out)
    assert rep.returncode == 0, rep.stderr
    page = (out / "tiny_set.md").read_text()
    assert "with `--set" not in page and "| variant=plain, width=8, device=cpu |" in page, page
    sets = {"training.epochs": 3, "data.train_samples": 256}
    spec = plan.expand(scenario.load(path), smoke=True, overrides=sets)[0]
    assert spec.overrides == sets, "3 is the file's, not the smoke size's: it changes the run, and all are kept"
    # A smoke setting the --set overlaps is dropped whole: model.hidden.0=8 on a smoke size of [8, 4]
    # leaves hidden [8, 16], which no plain smoke run has, though its first value is the smoke size's.
    (tmp_path / "s").mkdir()
    smoky = _tiny(
        tmp_path / "s",
        FLAT.replace("  data.train_samples: 256\n", "  data.train_samples: 256\n  model.hidden: [8, 4]\n"),
    )
    plain_specs = plan.expand(scenario.load(smoky), smoke=True)
    spec = plan.expand(scenario.load(smoky), smoke=True, overrides={"model.hidden.0": 8})[0]
    assert spec.config["model"]["hidden"] == [8, 16] and spec.fingerprint not in {s.fingerprint for s in plain_specs}
    assert spec.overrides == {"model.hidden.0": 8}, spec.overrides


@pytest.mark.parametrize("key", ["model.filters.00", "model.filters.01", "model.filters.001"])
def test_a_list_index_with_a_leading_zero_is_refused(key: str) -> None:
    # 00 would name the same filter count as the matrix's model.filters.0 and slip past the sweep check.
    proc = suite_cli("check", SCENARIOS / "mnist_cnn_filters.yaml", "--set", f"{key}=5")
    assert proc.returncode == 2, proc.stdout
    assert "Traceback" not in proc.stderr
    plain = "model.filters." + str(int(key.rsplit(".", 1)[1]))
    assert f"--set {key}=5: key '{key}': a list index is written without leading zeros: write {plain}" in proc.stderr


def test_a_plain_index_still_applies() -> None:
    proc = suite_cli("check", SCENARIOS / "mnist_cnn_filters.yaml", "--set", "model.filters.1=48")
    assert proc.returncode == 0, proc.stderr
