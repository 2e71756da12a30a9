"""benchmarks/gpu_evidence.sh: its preconditions, and a whole run on this machine's CPU with JAX.

Without a GPU here the script runs with --allow-no-gpu: the CPU points must run on the Keras JAX
backend and the GPU points be recorded as skipped with the reason. The real GPU run is the
script's own job on a GPU machine; nothing here pretends to be one.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml
from conftest import REPO, write_scenario

from suite.backends.local import LocalBackend
from suite.record import results
from suite.spec import plan, scenario
from suite.worker import probes, train

SCRIPT = REPO / "benchmarks" / "gpu_evidence.sh"
TINY = ["--widths", "32", "--epochs", "2", "--repeats", "1", "--train-samples", "1024", "--test-samples", "256"]
needs_jax = pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="JAX is not installed here")


def run_script(*args: str, env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


# --------------------------------------------------------------------------- preconditions


def test_no_nvidia_smi_is_refused_with_the_way_out(tmp_path: Path) -> None:
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has nvidia-smi")
    proc = run_script("--python", sys.executable, "--results", tmp_path / "r", "--reports", tmp_path / "p")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "nvidia-smi not found" in proc.stderr and "--allow-no-gpu" in proc.stderr
    assert not (tmp_path / "r").exists()


@needs_jax
def test_jax_without_a_gpu_is_refused(tmp_path: Path) -> None:
    """nvidia-smi answers (a stand-in here), but the JAX of --python sees no GPU."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'GPU 0: Stand-in GPU (UUID: GPU-00000000-0000-0000-0000-000000000000)'\n")
    fake.chmod(0o755)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "CUDA_VISIBLE_DEVICES": ""}
    proc = run_script("--python", sys.executable, "--results", tmp_path / "r", env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"JAX in {sys.executable} sees no GPU" in proc.stderr


def test_an_interpreter_that_does_not_exist(tmp_path: Path) -> None:
    proc = run_script("--allow-no-gpu", "--python", tmp_path / "nope" / "python3")
    assert proc.returncode == 2
    assert f"--python {tmp_path / 'nope' / 'python3'}: no such interpreter" in proc.stderr


def _python_without(tmp_path: Path, hidden: tuple[str, ...]) -> Path:
    """An interpreter that sees this venv's packages except ``hidden`` (a folder of links, no site)."""
    site = Path(next(p for p in sys.path if p.endswith("site-packages") and Path(p, "yaml").is_dir()))
    farm = tmp_path / "site"
    farm.mkdir()
    for entry in site.iterdir():
        if not entry.name.lower().startswith(hidden):
            (farm / entry.name).symlink_to(entry)
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{farm}" exec "{sys.executable}" -S "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def test_an_interpreter_without_jax(tmp_path: Path) -> None:
    py = _python_without(tmp_path, ("jax",))
    proc = run_script("--allow-no-gpu", "--python", py)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"JAX is not importable in {py}" in proc.stderr


@needs_jax
def test_missing_packages_without_wheels_say_how_to_get_them(tmp_path: Path) -> None:
    py = _python_without(tmp_path, ("tabulate", "matplotlib"))
    empty = tmp_path / "wheels"
    proc = run_script("--allow-no-gpu", "--python", py, "--wheels", empty, "--results", tmp_path / "r")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{py} lacks tabulate matplotlib and there is no wheel folder {empty}" in proc.stderr
    assert "--prepare-wheels" in proc.stderr


@needs_jax
def test_real_digits_asked_for_but_not_there(tmp_path: Path) -> None:
    proc = run_script("--allow-no-gpu", "--python", sys.executable, "--data", "t10k", "--mnist", tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"--data t10k: no t10k-images-idx3-ubyte(.gz) in {tmp_path}" in proc.stderr


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--widths", "0,750"], "flag --widths: got '0,750'; allowed: integers >= 1, comma-separated"),
        (["--data", "real"], "flag --data: got 'real'; allowed: synthetic, t10k"),
        (["--repeats"], "flag --repeats needs a value"),
        (["--epochs", "two"], "flag --epochs: got 'two'; allowed: an integer >= 1"),
        (["--fast"], "unknown flag '--fast'"),
    ],
)
def test_bad_flags_are_named(flags: list[str], message: str) -> None:
    proc = run_script(*flags)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


# --------------------------------------------------------------------------- what JAX cannot run


def _spec(tmp_path: Path, text: str) -> plan.RunSpec:
    return plan.expand(scenario.load(write_scenario(tmp_path, "s", text)), repeats=1)[0]


BASE = """\
name: s
question: q?
model: {hidden: [8]}
data: {allow_synthetic: true}
backend: jax
"""


@needs_jax
def test_tf_data_without_tensorflow_is_a_skip_with_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _spec(tmp_path, BASE + "training: {input_pipeline: tf_data}\n")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorflow" else real(name, *a))
    reason = LocalBackend(machine="m").skip_reason(spec)
    assert reason is not None and "training.input_pipeline tf_data needs TensorFlow" in reason
    numpy_spec = _spec(tmp_path, BASE)
    assert LocalBackend(machine="m").skip_reason(numpy_spec) is None


@needs_jax
def test_tf_data_runs_where_tensorflow_is_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _spec(tmp_path, BASE + "training: {input_pipeline: tf_data}\n")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "tensorflow" else real(name, *a)
    )
    assert LocalBackend(machine="m").skip_reason(spec) is None


def test_worker_tf_data_without_tensorflow_fails_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # import tensorflow now raises ImportError
    training = {"input_pipeline": "tf_data", "shuffle": True, "seed": 1}
    with pytest.raises(train.NeedsTensorFlow, match="tf_data builds a tf.data pipeline, which needs TensorFlow"):
        train._fit_inputs([[0.0]], [0], 1, training)
    with pytest.raises(train.NeedsTensorFlow, match="backend tensorflow only"):
        train._strategy("jax", ["/cpu:0", "/cpu:1"])
    assert train._strategy("jax", ["/cpu:0"]) is None


@needs_jax
def test_tf32_under_jax_follows_its_matmul_precision() -> None:
    import jax

    class Keras:
        class config:  # noqa: N801 - stands in for keras.config
            @staticmethod
            def backend() -> str:
                return "jax"

    before = jax.config.jax_default_matmul_precision
    try:
        jax.config.update("jax_default_matmul_precision", None)
        assert probes._tf32(Keras) is True  # JAX's default lets XLA use TF32 on Ampere and later
        jax.config.update("jax_default_matmul_precision", "highest")
        assert probes._tf32(Keras) is False
        jax.config.update("jax_default_matmul_precision", "float32")
        assert probes._tf32(Keras) is False
    finally:
        jax.config.update("jax_default_matmul_precision", before)


# --------------------------------------------------------------------------- the whole run, on the CPU


@pytest.mark.slow
@needs_jax
def test_cpu_run_with_jax_records_gpu_points_as_skipped(tmp_path: Path) -> None:
    res, rep, out = tmp_path / "results", tmp_path / "reports", tmp_path / "out"
    out.mkdir()
    proc = run_script(
        "--allow-no-gpu", "--python", sys.executable, *TINY, "--results", res, "--reports", rep,
        "--machine", "cpu-test", env={"OUT": str(out)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]

    runs = [r for _, r in results.load_folder(res / "cpu-test")]
    by_scenario = {
        name: [r for r in runs if r.spec["scenario"] == name] for name in ("mnist_mlp_width_jax", "gpu_knobs_jax")
    }
    cpu = [r for r in by_scenario["mnist_mlp_width_jax"] if r.spec["config"]["device"] == "cpu"]
    gpu = [r for r in runs if r.spec["config"]["device"].startswith("gpu")]
    assert cpu and all(r.ok for r in cpu), [r.message for r in cpu]
    for r in cpu:
        assert r.environment["versions"]["keras_backend"] == "jax"
        assert r.spec["config"]["backend"] == "jax" and r.spec["config"]["training"]["jit_compile"] is True
        assert r.run["settings"]["jit_compile"] is True
    assert len(gpu) == 1 + 7  # one width's GPU point; 7 knob variants at batch 128 (jit_compile left out, a twin added)
    assert all(r.status == "skipped" and "needs 1 GPU(s); this machine has no GPU" in r.message for r in gpu)

    derived = yaml.safe_load((res / "cpu-test" / "scenarios" / "gpu_knobs_jax.yaml").read_text())
    names = [v["name"] for v in derived["variants"]]
    assert "jit_compile" not in names and "all of the above, NumPy input" in names
    assert derived["backend"] == "jax" and derived["training"]["jit_compile"] is True

    page = (rep / "mnist_mlp_width_jax.md").read_text()
    assert "(backend jax)" in page and "skipped" in page and "- Data: **synthetic** (MNIST" in page
    assert "scenarios/mnist_mlp_width_jax.yaml" in page  # the Reproduce line names the derived file
    assert (rep / "gpu_knobs_jax.md").is_file()
    assert "budget" not in proc.stdout.split("== runs took")[0]

    with tarfile.open(out / "gpu_evidence.tar.gz") as tar:
        members = tar.getnames()
    assert any(m.startswith("results/cpu-test/mnist_mlp_width_jax/") for m in members)
    assert "./mnist_mlp_width_jax.md" in members
    assert (out / "gpu_evidence.log").read_text().count("ok, fit") == len(cpu)
    assert (out / "mnist_mlp_width_jax.md").is_file()


@pytest.mark.slow
@pytest.mark.network  # --prepare-wheels downloads the wheels from the package index
@needs_jax
def test_missing_packages_come_from_the_wheel_folder(tmp_path: Path) -> None:
    """As on the GPU machine: JAX there, Keras, PyYAML, tabulate and matplotlib not; no index at run time."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    wheels = tmp_path / "wheels"
    prep = run_script("--prepare-wheels", "--python", sys.executable, "--target-python", version, "--wheels", wheels)
    if prep.returncode != 0:
        pytest.skip(f"the package index cannot be reached here: {prep.stderr.strip()[-300:]}")
    assert "MiB in all (limit 56 MiB)" in prep.stdout
    assert list(wheels.glob("nvidia_ml_py-*.whl")) and not list(wheels.glob("numpy-*.whl"))
    # Every file fetched is one the run lock hashes (the download itself checks none).
    assert f"every wheel's sha256 is one {REPO}/requirements/locks/run-py{version}.txt lists for it" in prep.stdout

    py = _python_without(tmp_path, ("keras", "yaml", "pyyaml", "_yaml", "tabulate", "matplotlib", "mpl_toolkits"))
    res = tmp_path / "results"
    proc = run_script(
        "--allow-no-gpu", "--python", py, "--wheels", wheels, *TINY, "--no-knobs",
        "--results", res, "--reports", tmp_path / "reports", "--machine", "jax-only",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "installing keras PyYAML tabulate matplotlib from" in proc.stdout
    venv_python = str(REPO / "benchmarks" / ".gpu-evidence-venv" / "bin" / "python")
    assert f"python={venv_python}" in proc.stdout
    runs = [r for _, r in results.load_folder(res / "jax-only")]
    assert any(r.ok and r.environment["versions"]["keras_backend"] == "jax" for r in runs)


@pytest.mark.slow
@needs_jax
def test_t10k_data_dir_is_written_relative_to_the_repository(tmp_path: Path, mnist_dir: Path) -> None:
    """The derived scenarios' data_dir is part of every fingerprint: it must not name where the checkout lies."""
    res = tmp_path / "results"
    proc = run_script(
        "--allow-no-gpu", "--python", sys.executable, *TINY, "--no-knobs", "--data", "t10k", "--mnist", mnist_dir,
        "--results", res, "--reports", tmp_path / "reports", "--machine", "t10k-test",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    derived = yaml.safe_load((res / "t10k-test" / "scenarios" / "mnist_mlp_width_jax.yaml").read_text())
    data_dir = derived["data"]["data_dir"]
    assert not Path(data_dir).is_absolute(), data_dir
    assert (REPO / data_dir).resolve() == mnist_dir.resolve()
    runs = [r for _, r in results.load_folder(res / "t10k-test")]
    cpu = [r for r in runs if r.spec["config"]["device"] == "cpu"]
    assert cpu and all(r.ok and r.quality["data_source"] == "idx-t10k-split" for r in cpu), [r.message for r in cpu]
    assert all(r.spec["config"]["data"]["data_dir"] == data_dir for r in cpu)
