"""The Docker backend against a real engine: runs, GPU requests, OOM, timeouts, Ctrl-C, cleanup.

The image is the project's Dockerfile built on a base made without any registry (docker_base.py).
Without an engine these tests skip with the reason; with SUITE_REQUIRE_DOCKER=1 they fail instead,
so CI cannot pass by skipping them where an engine exists.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import said, suite_cli, write_scenario
from docker_fixtures import (  # noqa: F401 - fixtures
    REPO,
    SMALL_SCENARIO,
    assert_no_container_left,
    backend_factory,
    engine_client,
    image_fixture,
    small_specs,
    with_config,
)

from suite.backends.docker import auto_choice, container_data_dir, engine_answers, engine_facts
from suite.backends.docker_run import ContainerRun
from suite.backends.local import LocalBackend
from suite.backends.worker_output import Deadline
from suite.record import results, saving

pytestmark = pytest.mark.docker

# -- engine facts ---------------------------------------------------------------------------------


def test_engine_facts_name_the_engine(client: Any) -> None:
    facts = engine_facts()
    assert "error" not in facts, facts
    assert facts["version"] and facts["api_version"]
    assert facts["address_source"] in ("default socket", "DOCKER_HOST", "argument")
    assert isinstance(facts["nvidia_runtime"], bool) and facts["gpu_note"]
    assert engine_answers() is True


def test_no_engine_is_reported_not_raised(tmp_path: Path) -> None:
    nowhere = f"unix://{tmp_path}/no-such.sock"
    assert engine_answers(nowhere) is False
    facts = engine_facts(nowhere)
    assert facts["address"] == nowhere and facts["address_source"] == "argument"
    assert "no Docker engine answers" in facts["error"]
    choice, why = auto_choice(nowhere)
    assert choice == "local" and nowhere in why


# -- runs -----------------------------------------------------------------------------------------


def test_cpu_smoke_run_in_container_matches_local_schema(backend, client: Any, tmp_path: Path) -> None:
    spec = small_specs(tmp_path)[0]
    docker_backend = backend()
    result = docker_backend.run(spec)
    assert result.status == "ok", (result.message, result.log_tail)
    run = result.run
    assert run["backend"] == "docker" and run["image_id"].startswith("sha256:")
    assert run["engine_version"] and run["daemon"]
    assert run["image_labels"]["suite.image"] == "tf2.21-cpu" and run["context_hash"]
    assert run["base_id"].startswith("sha256:")  # the imported base has no registry digest
    assert run["engine_device_requests"] in (None, [])  # CPU: no device request at all
    assert set(run["container_s"]) == {"create", "put_archive", "start", "wait", "fetch_result", "remove"}
    isolation = run["isolation"]  # as the engine stored it, not as asked
    assert isolation["bind_mounts"] == [] and [m["type"] for m in isolation["mounts"]] == ["volume"]
    assert isolation["user"] == "65534:65534" and isolation["read_only_rootfs"] is True
    assert isolation["cap_drop"] == ["ALL"] and isolation["security_opt"] == ["no-new-privileges"]
    assert isolation["network_mode"] == "none" and "/tmp" in isolation["tmpfs"]
    env = result.environment
    assert env["host"]["in_container"] is True
    assert env["host"]["env"]["CUDA_VISIBLE_DEVICES"] == ""
    assert env["devices"]["gpus"] == [] and env["versions"]["tensorflow"] == "2.21.0"
    assert result.timing["launch_to_ready_s"] > 0 and len(result.timing["epoch_s"]) == 2
    assert_no_container_left(client, f"suite.session={docker_backend.session}")

    saved = saving.save(result, tmp_path / "results", spec.run_id)
    assert results.load(saved).to_dict() == json.loads(saved.read_text())
    local = LocalBackend(machine="test").run(spec)
    assert local.status == "ok", local.message
    for section in ("timing", "quality", "work"):
        assert set(getattr(result, section)) == set(getattr(local, section)), section
    assert set(result.environment) == set(local.environment)


def test_real_mnist_digits_placed_once_in_a_volume(backend, client: Any, mnist_dir: Path, tmp_path: Path) -> None:
    spec = small_specs(tmp_path)[0]
    data = {
        **spec.config["data"],
        "data_dir": str(mnist_dir),
        "allow_synthetic": False,
        "train_samples": 4000,
        "test_samples": 1000,
    }
    spec = with_config(spec, data=data, training={**spec.config["training"], "epochs": 3})
    docker_backend = backend()
    result = docker_backend.run(spec)
    assert result.status == "ok", (result.message, result.log_tail)
    assert result.quality["data_source"] == "idx-t10k-split"
    assert result.quality["test_accuracy"] > 0.8  # real digits, learnt: not a broken fast run
    (placed,) = result.run["data_volumes"]
    assert placed["target"] == str(mnist_dir) and len(placed["sha256"]) == 64
    mounts = {m["target"]: m for m in result.run["isolation"]["mounts"]}
    assert mounts[str(mnist_dir)] == {"target": str(mnist_dir), "type": "volume", "read_only": True}
    volume = client.volumes.get(placed["volume"])
    assert volume.attrs["Labels"]["suite.data_sha256"] == placed["sha256"]
    # A new session finds the volume, checks its sha256 and does not place it again.
    again = backend()._data(client, spec, result.run["image_id"])[2]
    assert again[0]["volume"] == placed["volume"] and again[0]["placed"] is False


def test_data_volume_that_differs_is_placed_again(client: Any, test_image: str, tmp_path: Path) -> None:
    import io
    import tarfile

    from suite.backends import docker_parts as parts

    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "digits.bin").write_bytes(os.urandom(4096))  # unique: a volume of its own
    files = parts.data_files(folder)
    labels = {"suite.session": "test-data"}
    image = client.images.get(test_image).id
    first = parts.ensure_data_volume(client, image, files, labels)
    try:
        assert first["placed"] is True
        assert parts.ensure_data_volume(client, image, files, labels)["placed"] is False
        # Damage the content's proof as a half-finished placement would leave it.
        helper = client.containers.create(
            image, ["true"], mounts=[{"Target": "/data", "Source": first["volume"], "Type": "volume"}]
        )
        try:
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:
                info = tarfile.TarInfo(parts.DATA_MARKER)
                info.size = 3
                tar.addfile(info, io.BytesIO(b"bad"))
            helper.put_archive("/data", buf.getvalue())
        finally:
            helper.remove(force=True)
        again = parts.ensure_data_volume(client, image, files, labels)
        assert again["placed"] is True and again["sha256"] == first["sha256"]
        assert parts.ensure_data_volume(client, image, files, labels)["placed"] is False
    finally:
        client.volumes.get(first["volume"]).remove(force=True)


def test_relative_data_dir_maps_into_the_container() -> None:
    assert container_data_dir("../shared/data/mnist") == "/shared/data/mnist"  # the worker runs in /work
    assert container_data_dir("/data/mnist") == "/data/mnist"


def test_gpu_point_requests_exact_uuids_and_fails_clearly_without_nvidia_runtime(
    backend, client: Any, tmp_path: Path
) -> None:
    if engine_facts().get("nvidia_runtime"):
        pytest.skip("this engine has the NVIDIA runtime: the start would succeed (GPU checks are scripts)")
    fake = {"gpus": [{"index": i, "uuid": f"GPU-test-{i}", "name": "test GPU"} for i in range(3)], "cpus": 2}
    docker_backend = backend(inventory=fake)
    spec = with_config(small_specs(tmp_path)[0], device="gpu:2")
    assert docker_backend.skip_reason(spec) is None
    result = docker_backend.run(spec)
    assert result.status == "error"
    assert "cannot give this container GPUs" in result.message
    assert "could not select device driver" in result.message  # the engine's own words
    requests = result.run["engine_device_requests"]  # HostConfig.DeviceRequests as the engine stored it
    assert len(requests) == 1
    assert requests[0]["DeviceIDs"] == ["GPU-test-0", "GPU-test-1"] and requests[0]["Capabilities"] == [["gpu"]]
    assert not requests[0].get("Count")  # ids, never a count: count+ids is an error, count alone "first N"
    assert result.run["gpu_uuids"] == ["GPU-test-0", "GPU-test-1"] and result.run["gpu_ids"] == ["0", "1"]
    assert_no_container_left(client, f"suite.session={docker_backend.session}")


def test_more_gpus_than_the_host_has_is_skipped(backend, tmp_path: Path) -> None:
    one = {"gpus": [{"index": 0, "uuid": "GPU-test-0", "name": "test GPU"}], "cpus": 2}
    spec = with_config(small_specs(tmp_path)[0], device="gpu:2")
    reason = backend(inventory=one).skip_reason(spec)
    assert reason and "needs 2 GPU(s)" in reason and "1 GPU(s)" in reason


def test_small_memory_limit_is_host_oom(backend, client: Any, tmp_path: Path) -> None:
    # The limit leaves room to import TensorFlow (a tighter one makes the kernel thrash its mapped
    # libraries for minutes instead of killing), then the full synthetic set (60,000 x 784 floats,
    # generated in float64) does not fit: the kernel's OOM killer ends the container quickly.
    docker_backend = backend(mem_limit="600m")
    spec = small_specs(tmp_path)[0]
    spec = with_config(spec, data={**spec.config["data"], "train_samples": None})
    result = docker_backend.run(spec)
    assert result.status == "host_oom", (result.status, result.message, result.log_tail)
    assert result.run["oom_killed"] is True, "host_oom only on the engine's word"
    assert "600m" in result.message
    assert_no_container_left(client, f"suite.session={docker_backend.session}")


def test_timeout_kills_the_container(backend, client: Any, tmp_path: Path) -> None:
    docker_backend = backend()
    spec = with_config(small_specs(tmp_path)[0], timeout_s=3)
    t = time.monotonic()
    result = docker_backend.run(spec)
    elapsed = time.monotonic() - t
    assert result.status == "timeout", (result.status, result.message)
    assert "3 s" in result.message and elapsed < 30
    assert_no_container_left(client, f"suite.session={docker_backend.session}")


def test_timeout_whose_kill_finds_the_container_exited_is_no_timeout(client: Any, test_image: str) -> None:
    # The deadline marks itself fired before it kills; the engine's refusal to kill a container that
    # already ended on its own takes the mark back, so such a run keeps its own exit's status.
    container = client.containers.run(test_image, ["python3", "-c", "pass"], detach=True, network_mode="none")
    try:
        assert container.wait(timeout=60)["StatusCode"] == 0
        deadline = Deadline(0.01)
        deadline.arm(ContainerRun(None, container, {"container_s": {}}).kill)
        time.sleep(0.5)  # the timer fires and tries its kill meanwhile
        assert deadline.disarm() is False
    finally:
        container.remove(force=True)


def test_missing_image_is_image_unavailable_with_what_to_do(backend, tmp_path: Path) -> None:
    spec = small_specs(tmp_path)[0]
    result = backend(image="suite-bench:no-such-image").run(spec)
    assert result.status == "image_unavailable"
    assert "python -m suite images build" in result.message
    unknown = with_config(spec, image="tf9.99-nothing")
    result = backend(image=None).run(unknown)
    assert result.status == "image_unavailable" and "tf9.99-nothing" in result.message


def test_ctrl_c_during_a_run_removes_the_container(backend, client: Any, tmp_path: Path) -> None:
    docker_backend = backend()
    spec = small_specs(tmp_path)[0]
    label = f"suite.run_id={spec.run_id}"  # the run's container, not a data or probe helper of the session
    sent = threading.Event()

    def interrupt_once_running() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if client.containers.list(ignore_removed=True, filters={"label": label, "status": "running"}):
                sent.set()
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.2)

    threading.Thread(target=interrupt_once_running, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        docker_backend.run(spec)
        time.sleep(5)  # the run ended before the signal came: let it arrive here
    assert sent.is_set()
    assert_no_container_left(client, f"suite.session={docker_backend.session}")


# -- through the command line ---------------------------------------------------------------------


def _suite(*args: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "suite", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
    )


def test_smoke_scenarios_end_to_end_in_containers(test_image: str, client: Any, tmp_path: Path) -> None:
    # The shipped scenarios' first point of each model kind (an MLP, a CNN), on the CPU and on a GPU
    # (skipped without one): every other point runs the same container path again.
    out = tmp_path / "results"
    proc = _suite(
        "run",
        "--backend",
        "docker",
        "--smoke",
        "-k",
        "width=100 or filters=8",
        "--results",
        str(out),
        "--machine",
        "dockertest",
        env={"SUITE_DOCKER_IMAGE": test_image},
    )
    log, _ = proc.communicate(timeout=1800)
    assert proc.returncode == 0, log
    found = results.load_folder(out)
    assert found, log
    statuses = {r.status for _, r in found}
    assert statuses <= {"ok", "skipped"} and "ok" in statuses, log
    kinds = {r.spec["config"]["model"]["kind"] for _, r in found if r.ok}
    assert kinds == {"mlp", "cnn"}, log
    for _, r in found:
        if r.ok:
            assert r.run["backend"] == "docker" and r.run["image_id"].startswith("sha256:")
            assert r.run["engine_version"]
    # Only this run's: other sessions may have containers on the same engine meanwhile.
    mine = [
        c.name
        for c in client.containers.list(ignore_removed=True, all=True, filters={"label": "suite.scenario"})
        if c.labels.get("suite.orchestrator", "").split(":")[1:2] == [str(proc.pid)]
    ]
    assert mine == [], f"containers left behind by the run: {mine}"
    report = subprocess.run(
        [sys.executable, "-m", "suite", "report", "--results", str(out), "--out", str(tmp_path / "reports")],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert report.returncode == 0, report.stdout + report.stderr
    assert list((tmp_path / "reports").rglob("*.md"))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_to_suite_run_leaves_no_container_and_keeps_results(
    signum: int, test_image: str, client: Any, tmp_path: Path
) -> None:
    name = f"docker_signal_{signum}_{os.getpid()}"
    path = tmp_path / f"{name}.yaml"
    path.write_text(SMALL_SCENARIO.format(name=name, widths="[32, 48, 64, 80]"), encoding="utf-8")
    out = tmp_path / "results"
    proc = _suite(
        "run",
        str(path),
        "--backend",
        "docker",
        "--smoke",
        "--results",
        str(out),
        "--machine",
        "m",
        env={"SUITE_DOCKER_IMAGE": test_image},
    )
    label = f"suite.scenario={name}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            done = list((out / "m").rglob("*.json")) if out.exists() else []
            if done and client.containers.list(ignore_removed=True, filters={"label": label, "status": "running"}):
                break  # one result on file, the next run in flight
            time.sleep(0.3)
        else:
            pytest.fail(f"never saw a result and a running container: {proc.communicate(timeout=60)[0]}")
        proc.send_signal(signum)
        log, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0, log
    assert_no_container_left(client, label)
    kept = results.load_folder(out)
    assert kept and all(r.ok for _, r in kept), log
    assert len(kept) < 4


def test_unbuildable_image_says_why(client: Any) -> None:
    from suite.environment import images

    with pytest.raises(images.ImageError, match="cannot pull base image registry.invalid/nothing:1"):
        images.build_images(
            ["tf2.21-cpu"],
            base_override={"BASE_IMAGE": "registry.invalid/nothing:1"},
            progress=lambda line: None,
            client=client,
        )


def test_a_gpu_point_the_engine_cannot_serve_says_whose_gpus_were_counted(client: Any, tmp_path: Path) -> None:
    """A container sees the GPUs the engine's runtime hands it, not its host's: a GPU server without
    the NVIDIA runtime is no machine without a GPU, and the skip says which it is."""
    scenario = write_scenario(tmp_path, "many_gpus", SMALL_SCENARIO.format(name="many_gpus", widths="[64]"))
    scenario.write_text(scenario.read_text().replace("device: [cpu]", "device: [gpu:64]"))
    proc = suite_cli("check", scenario, "--backend", "docker", "--results", tmp_path / "res", "--machine", "m")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    full = said(proc.stdout, "skipped, in full: ")
    assert full.startswith("skipped, in full: needs 64 GPU(s); the Docker engine gives its containers "), full
    assert "this machine has" not in proc.stdout, proc.stdout
