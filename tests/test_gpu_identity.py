"""The GPUs a run is given, by identity: pool, CUDA_VISIBLE_DEVICES by UUID, the worker's check, GPU facts.

No GPU is needed. What is checked on REAL recorded output (tests/fixtures/nvidia-smi/, each file names
its source): the nvidia-smi CSV parser (an HPE server with two A100s, netdata's Tesla P100), the CUDA
driver version in ``nvidia-smi -q`` and plain ``nvidia-smi`` headers, the suite's query fields against
a real driver's ``--help-query-gpu`` list, and the bus id in TensorFlow's device descriptions. A fake
``nvidia-smi`` on PATH prints those recordings, so the host inventory and the worker's facts run end to
end through the real subprocess code. Constructed (not recorded) inputs are marked as such: the
"[N/A]"-style markers in our own fields, and the inventories of the pool rules (pure logic).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from suite.backends import BackendUnavailable
from suite.backends.base import worker_env
from suite.backends.gpu_pool import inherit_pool, restrict_gpus
from suite.backends.local import LocalBackend
from suite.environment import host_facts
from suite.spec import plan, scenario
from suite.worker import facts, identity

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia-smi"
REPO = Path(__file__).resolve().parents[1]
P100_UUID = "GPU-ef1b2c9b-38d8-2090-2bd1-f567a3eb42a6"


def recorded(name: str) -> str:
    """A fixture without its '#' source header."""
    lines = (FIXTURES / name).read_text(encoding="utf-8").splitlines()
    return "\n".join(line for line in lines if not line.startswith("#")).strip("\n") + "\n"


def valid_fields() -> set[str]:
    names: set[str] = set()
    for line in recorded("netdata-help-query-gpu.fields.txt").splitlines():
        names.update(part.strip().strip('"') for part in line.split(" or "))
    return names - {""}


@pytest.fixture
def fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Put a fake ``nvidia-smi`` first on PATH: it prints recorded output and logs its arguments.

    Like nvidia-smi, it refuses a --query-gpu field the recorded driver does not list.
    """

    def install(query_csv: str, q_text: str = "hpe-a100x2.q-performance.txt", fields: set[str] | None = None) -> Path:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        (bin_dir / "query.csv").write_text(recorded(query_csv), encoding="utf-8")
        (bin_dir / "q.txt").write_text(recorded(q_text), encoding="utf-8")
        (bin_dir / "fields.json").write_text(json.dumps(sorted(fields or valid_fields())), encoding="utf-8")
        script = bin_dir / "nvidia-smi"
        script.write_text(
            textwrap.dedent(
                f"""\
                #!{sys.executable}
                import json, sys
                here = {str(bin_dir)!r}
                with open(here + "/calls.log", "a") as log:
                    log.write(json.dumps(sys.argv[1:]) + "\\n")
                args = sys.argv[1:]
                query = [a for a in args if a.startswith("--query-gpu=")]
                if query:
                    valid = set(json.load(open(here + "/fields.json")))
                    for field in query[0].split("=", 1)[1].split(","):
                        if field not in valid:
                            print(f'Field "{{field}}" is not a valid field to query.')
                            sys.exit(2)
                    sys.stdout.write(open(here + "/query.csv").read())
                elif "-q" in args:
                    sys.stdout.write(open(here + "/q.txt").read())
                else:
                    sys.exit(9)
                """
            ),
            encoding="utf-8",
        )
        script.chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setitem(sys.modules, "pynvml", None)  # NVML absent: nvidia-smi is asked, on any machine
        return bin_dir

    return install


def calls(bin_dir: Path) -> list[list[str]]:
    return [json.loads(line) for line in (bin_dir / "calls.log").read_text().splitlines()]


# -- parsers, on recorded output ------------------------------------------------------------------


def test_query_csv_of_a_real_two_a100_server() -> None:
    gpus = facts.parse_query_csv(recorded("hpe-a100x2.query-gpu.csv"))
    assert [g["index"] for g in gpus] == [0, 1], "no index column: the row order, which is nvidia-smi's"
    assert [g["pci_bus_id"] for g in gpus] == ["00000000:12:00.0", "00000000:8A:00.0"]
    first = gpus[0]
    assert first["name"] == "NVIDIA A100-PCIE-40GB" and first["vbios"] == "92.00.25.00.08"
    assert first["memory_mib"] == 40960, "'40960 MiB' read with its unit"
    assert (first["app_clock_graphics_mhz"], first["app_clock_memory_mhz"]) == (765, 1215)
    assert "uuid" not in first and "power_limit_w" not in first, "a field the output lacks is absent, not made up"


def test_query_csv_of_a_real_p100_with_uuid() -> None:
    (gpu,) = facts.parse_query_csv(recorded("netdata-tesla-p100.query-gpu.csv"))
    assert gpu == {"name": "Tesla P100-PCIE-16GB", "uuid": P100_UUID, "index": 0}


def test_values_nvidia_smi_cannot_give_are_null() -> None:
    # Constructed, not recorded: our own fields holding the markers nvidia-smi prints ("[N/A]" is in
    # the recorded P100 output, under a field the suite does not ask for).
    text = (
        "index, uuid, power.limit [W], persistence_mode, clocks.applications.graphics [MHz], compute_mode, "
        "vbios_version\n"
        f"0, {P100_UUID}, [N/A], Enabled, [Not Supported], Default, N/A\n"
        f"1, {P100_UUID}, 250.00 W, Disabled, 1328 MHz, Exclusive_Process, 86.00.4D.00.04\n"
    )
    first, second = facts.parse_query_csv(text)
    assert first["power_limit_w"] is None and first["app_clock_graphics_mhz"] is None and first["vbios"] is None
    assert first["persistence_mode"] is True and second["persistence_mode"] is False
    assert second["power_limit_w"] == 250.0 and second["app_clock_graphics_mhz"] == 1328
    assert second["compute_mode"] == "Exclusive_Process"


def test_cuda_driver_version_from_real_headers() -> None:
    assert facts.parse_cuda_version(recorded("hpe-a100x2.q-performance.txt")) == "12.5"
    assert facts.parse_cuda_version(recorded("hpe-a100x2.nvidia-smi.txt")) == "12.5", "plain nvidia-smi's header"
    assert facts.parse_cuda_version(recorded("rtx4070-laptop.q.txt")) == "12.7"
    assert facts.parse_cuda_version("Driver Version : 396.44\n") is None


def test_the_suite_asks_only_fields_a_real_driver_knows() -> None:
    unknown = set(facts.QUERY_FIELDS) - valid_fields()
    assert not unknown, f"not in the recorded --help-query-gpu: {unknown}"


def test_tensorflow_device_descriptions_give_the_bus_id() -> None:
    for line in recorded("tensorflow-device-descriptions.txt").splitlines():
        description, expected = line.split("\t")
        assert identity.bus_id_from_description(description) == expected


# -- a fake nvidia-smi on PATH: host inventory and worker facts, end to end -----------------------


def test_host_inventory_through_nvidia_smi(fake_smi) -> None:
    bin_dir = fake_smi("hpe-a100x2.query-gpu.csv")
    gpus, note = host_facts.gpu_inventory()
    assert note == "nvidia-smi"
    assert [(g["index"], g["pci_bus_id"]) for g in gpus] == [(0, "00000000:12:00.0"), (1, "00000000:8A:00.0")]
    assert {g["cuda_driver_version"] for g in gpus} == {"12.5"}
    query, header = calls(bin_dir)
    assert query == [f"--query-gpu={','.join(facts.QUERY_FIELDS)}", "--format=csv,nounits"]
    assert header[0] == "-q"


def test_an_older_driver_refusing_a_field_is_asked_for_the_base_fields(fake_smi) -> None:
    bin_dir = fake_smi("netdata-tesla-p100.query-gpu.csv", fields=valid_fields() - {"vbios_version"})
    gpus, note = facts.collect_nvidia_smi()
    assert [g["uuid"] for g in gpus] == [P100_UUID]
    assert 'Field "vbios_version" is not a valid field' in note
    assert calls(bin_dir)[1] == [f"--query-gpu={','.join(facts.BASE_FIELDS)}", "--format=csv,nounits"]


def test_the_base_fields_keep_the_bus_id_and_a_real_driver_knows_them(fake_smi) -> None:
    assert set(facts.BASE_FIELDS) <= valid_fields()
    bin_dir = fake_smi("hpe-a100x2.query-gpu.csv", fields=valid_fields() - {"vbios_version"})
    gpus, note = facts.collect_nvidia_smi()
    asked = calls(bin_dir)[1][0].split("=", 1)[1].split(",")
    assert "pci.bus_id" in asked, "an older driver is still asked for the bus id"
    assert [g["pci_bus_id"] for g in gpus] == ["00000000:12:00.0", "00000000:8A:00.0"]
    assert "pci.bus_id" in note


def test_no_nvidia_smi_is_said_never_raised(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert facts.collect_nvidia_smi() == ([], "no NVIDIA driver found (no nvidia-smi)")


def test_a_run_records_the_facts_of_the_gpus_it_was_given(fake_smi) -> None:
    fake_smi("hpe-a100x2.query-gpu.csv")
    asked = [identity.identity(pci_bus_id="0000:8a:00.0")]  # TF's spelling of the second A100
    (gpu,) = facts.collect_gpus(asked)
    assert gpu["index"] == 1 and gpu["pci_bus_id"] == "00000000:8A:00.0" and gpu["cuda_driver_version"] == "12.5"
    everything = facts.collect_gpus([identity.identity(pci_bus_id="0000:99:00.0")])
    assert [g["given"] for g in everything] == [False, False], "a GPU not found: all recorded, none hidden"
    assert len(facts.collect_gpus(None)) == 2


# -- the identity check --------------------------------------------------------------------------


def test_bus_id_and_uuid_forms_compare_equal() -> None:
    assert identity.normalise_bus_id("00000000:3B:00.0") == identity.normalise_bus_id("0000:3b:00.0") == "0000:3b:00.0"
    assert identity.normalise_bus_id("3b:00.0") == "0000:3b:00.0"
    assert identity.normalise_bus_id("not a bus") is None and identity.normalise_bus_id(None) is None
    torch_style = "ef1b2c9b-38d8-2090-2bd1-f567a3eb42a6"  # str(torch.cuda.get_device_properties(i).uuid)
    raw = bytes.fromhex(torch_style.replace("-", ""))  # the CUDA driver's CUuuid bytes
    assert identity.normalise_uuid(torch_style) == identity.normalise_uuid(raw) == P100_UUID
    assert identity.normalise_uuid(P100_UUID.upper()) == P100_UUID
    assert identity.normalise_uuid("GPU-8932f937") is None, "a prefix is not a UUID"


A = identity.identity("GPU-3fb142e7-7102-c7ac-bd5a-fc829e11ed84", "00000000:12:00.0")
B = identity.identity("GPU-14ac2834-0d81-0508-69eb-e25264c08d21", "00000000:8A:00.0")


def test_the_gpus_asked_for_are_confirmed() -> None:
    by_uuid = identity.compare([A, B], [identity.identity(B["uuid"]), identity.identity(A["uuid"])])
    assert by_uuid["status"] == "confirmed" and by_uuid["by"] == "uuid", "order does not matter"
    tf_style = [identity.identity(pci_bus_id="0000:12:00.0"), identity.identity(None, "8a:00.0")]
    by_bus = identity.compare([A, B], tf_style)
    assert by_bus["status"] == "confirmed" and by_bus["by"] == "pci_bus_id"


def test_a_wrong_gpu_or_count_is_a_mismatch_naming_both_lists() -> None:
    wrong = identity.compare([A], [identity.identity(pci_bus_id="0000:8a:00.0")])
    assert wrong["status"] == "mismatch"
    assert "0000:12:00.0" in wrong["message"] and "0000:8a:00.0" in wrong["message"]
    count = identity.compare([A, B], [A])
    assert count["status"] == "mismatch" and "count" in count["message"]
    unknown = identity.compare([A], [identity.identity()])
    assert unknown["status"] == "unconfirmed"


def test_the_worker_refuses_to_train_on_another_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from suite.worker import train

    monkeypatch.setenv(identity.ASKED_ENV, json.dumps([{"uuid": A["uuid"], "pci_bus_id": "00000000:12:00.0"}]))
    asked = identity.asked_from_env(os.environ)
    with pytest.raises(train.DeviceMismatch, match="asked .*0000:12:00.0.*framework sees .*0000:8a:00.0"):
        train._verify("gpu", 1, [identity.identity(pci_bus_id="0000:8A:00.0")], "GPU-3fb142e7", asked)
    checked = train._verify("gpu", 1, [identity.identity(pci_bus_id="0000:12:00.0")], "GPU-3fb142e7", asked)
    assert checked["status"] == "confirmed"
    with pytest.raises(train.DeviceMismatch, match="asked for 1 GPU"):
        train._verify("gpu", 1, [], "GPU-3fb142e7", asked)
    assert train._verify("gpu", 1, [A], "0", None)["status"] == "unconfirmed"


def test_a_gpu_known_by_uuid_only_is_checked_by_the_drivers_bus_id() -> None:
    # The Docker engine's probe names GPUs by UUID; TensorFlow reports bus ids. The driver's own
    # list, as the worker reads it from nvidia-smi in its container, pairs them (constructed input).
    driver = [{"uuid": A["uuid"], "pci_bus_id": "00000000:12:00.0"}, {"uuid": B["uuid"], "pci_bus_id": None}]
    (filled,) = identity.complete([identity.identity(A["uuid"])], driver)
    assert filled["pci_bus_id"] == "0000:12:00.0"
    seen = [identity.identity(pci_bus_id=identity.bus_id_from_description("device: 0, pci bus id: 0000:12:00.0"))]
    assert identity.compare([filled], seen)["status"] == "confirmed"
    (unknown,) = identity.complete([identity.identity(B["uuid"])], driver)
    assert unknown["pci_bus_id"] is None and identity.compare([unknown], seen)["status"] == "unconfirmed"


def test_no_cuda_driver_is_none() -> None:
    assert identity.cuda_driver_devices("libcuda-that-does-not-exist.so") is None


# -- the pool: inherited CUDA_VISIBLE_DEVICES, then --gpus ------------------------------------------

# Constructed inventories (the rules are pure logic); the UUIDs are those the recorded A100 server lists.
HOST = [
    {"index": 0, "uuid": "GPU-3fb142e7-7102-c7ac-bd5a-fc829e11ed84", "name": "NVIDIA A100-PCIE-40GB"},
    {"index": 1, "uuid": "GPU-14ac2834-0d81-0508-69eb-e25264c08d21", "name": "NVIDIA A100-PCIE-40GB"},
    {"index": 2, "uuid": "GPU-14ac9999-0000-0000-0000-000000000000", "name": "NVIDIA A100-PCIE-40GB"},
]


def pool(value: str, order: str | None = None, gpus: list[dict[str, Any]] = HOST) -> list[int]:
    return [g["index"] for g in identity.visible_pool(value, gpus, order)[0]]


def test_inherited_cuda_visible_devices_as_cuda_reads_it() -> None:
    assert pool("2,0") == [2, 0], "indices, in the listed order"
    assert pool("GPU-14ac2834-0d81-0508-69eb-e25264c08d21") == [1]
    assert pool("GPU-3fb1,GPU-14ac2") == [0, 1], "unambiguous UUID prefixes"
    assert pool("0,2,-1,1") == [0, 2], "nothing after an entry that names no GPU (CUDA's documented example)"
    assert pool("") == [], "empty: no GPU"
    assert "names no GPU" in identity.visible_pool("7", HOST, None)[1]


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("MIG-GPU-3fb142e7-7102-c7ac-bd5a-fc829e11ed84/1/0", "MIG instance"),
        ("GPU-14ac", "start of 2 GPUs"),
        ("0,0", "twice"),
    ],
)
def test_what_cannot_be_honoured_exactly_is_refused(value: str, why: str) -> None:
    with pytest.raises(identity.PoolError, match=why):
        identity.visible_pool(value, HOST, "PCI_BUS_ID")


def test_indices_on_mixed_gpus_need_pci_bus_order() -> None:
    mixed = [HOST[0], {**HOST[1], "name": "NVIDIA GeForce RTX 3090"}]
    with pytest.raises(identity.PoolError, match="fastest first"):
        identity.visible_pool("1", mixed, None)
    assert pool("1", "PCI_BUS_ID", mixed) == [1]
    assert pool(HOST[1]["uuid"], None, mixed) == [1], "UUIDs do not depend on the order"


def test_gpus_flag_chooses_inside_the_inherited_pool() -> None:
    inventory = inherit_pool({"gpus": HOST, "gpu_note": "NVML"}, {"CUDA_VISIBLE_DEVICES": "2,1"})
    assert [g["index"] for g in inventory["gpus"]] == [2, 1]
    assert inventory["pool"]["source"] == "CUDA_VISIBLE_DEVICES inherited by the suite"
    assert inventory["pool"]["cuda_visible_devices"] == "2,1"
    kept = restrict_gpus(inventory, ["1"])
    assert [g["index"] for g in kept["gpus"]] == [1] and kept["pool"]["gpus_flag"] == ["1"]
    with pytest.raises(BackendUnavailable, match=r"--gpus names GPU 0 .*outside .*CUDA_VISIBLE_DEVICES=2,1"):
        restrict_gpus(inventory, ["GPU-3fb142e7-7102-c7ac-bd5a-fc829e11ed84"])
    assert "not on this host: 9" in restrict_gpus(inventory, ["9"])["gpu_note"]
    everything = inherit_pool({"gpus": HOST}, {})
    assert everything["pool"]["source"] == "every GPU of the host" and len(everything["gpus"]) == 3
    with pytest.raises(BackendUnavailable, match="MIG"):
        inherit_pool({"gpus": HOST}, {"CUDA_VISIBLE_DEVICES": "MIG-GPU-3fb142e7/1/0"})


def test_cli_refuses_gpus_outside_the_inherited_pool(fake_smi, tmp_path: Path) -> None:
    fake_smi("hpe-a100x2.query-gpu.csv")
    blocker = tmp_path / "no_nvml"
    blocker.mkdir()
    (blocker / "pynvml.py").write_text("raise ImportError('NVML left out by this test')\n")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0", "PYTHONPATH": f"{blocker}{os.pathsep}{REPO}"}
    scenario_file = tmp_path / "identity_small.yaml"
    scenario_file.write_text(SCENARIO, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "suite", "run", str(scenario_file), "--backend", "local", "--gpus", "1", "--smoke",
         "--results", str(tmp_path / "results")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--gpus names GPU 1" in done.stderr and "CUDA_VISIBLE_DEVICES=0" in done.stderr
    assert "Traceback" not in done.stderr


# 0,00 names one GPU twice; a MIG instance is never handed out (worker/identity), so it would match nothing.
@pytest.mark.parametrize(
    "value", ["", "0,", "0,0", "0,00", "first", "GPU-", "0\x1b[2J", "GPU-a b", "-1", "MIG-GPU-3fb142e7/1/0"]
)
def test_cli_refuses_a_gpus_value_that_names_no_gpu(tmp_path: Path, value: str) -> None:
    # Before this check '' meant every GPU, '0,' one of them, and a word was noted and every GPU point skipped.
    scenario_file = tmp_path / "identity_small.yaml"
    scenario_file.write_text(SCENARIO, encoding="utf-8")
    for command in ("run", "check"):
        done = subprocess.run(
            [sys.executable, "-m", "suite", command, str(scenario_file), "--backend", "local", f"--gpus={value}",
             "--smoke", "--results", str(tmp_path / "results")],
            cwd=REPO, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 2, done.stdout + done.stderr
        assert f"--gpus {value!r}: comma-separated distinct GPU indices" in done.stderr, done.stderr
        assert "\x1b" not in done.stderr and not (tmp_path / "results").exists()


# -- the local backend: what the worker process really gets ------------------------------------

SCENARIO = """\
name: identity_small
question: Which GPUs does a point see?
model:
  kind: mlp
  hidden: [16]
  activation: relu
  dropout: 0.0
training:
  optimizer: adam
  loss: categorical_crossentropy
  batch_size: 128
  epochs: 1
data:
  dataset: mnist
  allow_synthetic: true
  train_samples: 256
  test_samples: 128
repeats: 1
timeout_s: 120
matrix:
  device: [cpu]
"""


def spec_for(tmp_path: Path, device: str) -> plan.RunSpec:
    path = tmp_path / "identity_small.yaml"
    path.write_text(SCENARIO, encoding="utf-8")
    spec = plan.expand(scenario.load(path), smoke=True)[0]
    changed = replace(spec, config={**spec.config, "device": device}, fingerprint="")
    return replace(changed, fingerprint=plan.fingerprint_of(changed))


def env_dumping_python(tmp_path: Path) -> Path:
    """Stands in for the worker's Python: writes the environment it was started with as its result."""
    script = tmp_path / "python-env-dump"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "result = sys.argv[-1]\n"
        "json.dump({'status': 'ok', 'environment': {'started_with': dict(os.environ)}}, open(result, 'w'))\n",
        encoding="utf-8",
    )
    script.chmod(0o755)
    return script


def test_local_worker_gets_uuids_and_pci_bus_order(fake_smi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_smi("netdata-tesla-p100.query-gpu.csv")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # a scheduler's allocation, by index
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    backend = LocalBackend(python=str(env_dumping_python(tmp_path)))
    gpu = backend.run(spec_for(tmp_path, "gpu:1"))
    seen = gpu.environment["started_with"]
    assert seen["CUDA_VISIBLE_DEVICES"] == P100_UUID, "the inherited index is replaced by the GPU's UUID"
    assert seen["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert [g["uuid"] for g in json.loads(seen[identity.ASKED_ENV])] == [P100_UUID]
    assert gpu.run["gpu_pool"]["cuda_visible_devices"] == "0" and gpu.run["gpu_pool"]["uuids"] == [P100_UUID]
    cpu = backend.run(spec_for(tmp_path, "cpu")).environment["started_with"]
    assert cpu["CUDA_VISIBLE_DEVICES"] == "" and cpu["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert json.loads(cpu[identity.ASKED_ENV]) == []


def test_every_backend_sets_pci_bus_order(tmp_path: Path) -> None:
    assert worker_env(spec_for(tmp_path, "cpu"))["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


# -- the docker backend: the container's GPU request and environment ------------------------------


def test_container_gets_cuda_visible_devices_by_the_uuids_it_requests(tmp_path: Path) -> None:
    pytest.importorskip("docker")
    from types import SimpleNamespace

    from suite.backends.docker import DockerBackend
    from suite.backends.gpu_pool import gpu_env, gpus_for

    inventory = {"gpus": [HOST[2], HOST[0]], "cpus": 2}
    backend = DockerBackend(inventory=inventory)
    spec = spec_for(tmp_path, "gpu:2")
    image = SimpleNamespace(id="sha256:0", labels={})
    uuids = [g["uuid"] for g in gpus_for(spec, inventory)]
    kwargs = backend._container_kwargs(spec, image, {**worker_env(spec), **gpu_env(spec, inventory)}, [], uuids)
    environment = kwargs["environment"]
    assert environment["CUDA_VISIBLE_DEVICES"] == ",".join(uuids) == f"{HOST[2]['uuid']},{HOST[0]['uuid']}"
    assert kwargs["device_requests"][0]["DeviceIDs"] == uuids and environment["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert [g["uuid"] for g in json.loads(environment[identity.ASKED_ENV])] == uuids


def test_inherited_pool_applies_to_a_local_engine_only(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("docker")
    from suite.backends.docker import DockerBackend

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    found = {"gpus": HOST, "cpus": 8}
    local = DockerBackend(docker_host="unix:///var/run/docker.sock")._engine_pool(found)
    assert [g["index"] for g in local["gpus"]] == [1] and local["pool"]["cuda_visible_devices"] == "1"
    remote = DockerBackend(docker_host="tcp://10.0.0.5:2376")._engine_pool(found)
    assert len(remote["gpus"]) == 3 and "engine's host" in remote["pool"]["source"]


def test_env_command_shows_the_pool_and_the_recorded_facts(fake_smi, monkeypatch: pytest.MonkeyPatch) -> None:
    from suite import envinfo

    fake_smi("hpe-a100x2.query-gpu.csv")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    gpus, note = host_facts.gpu_inventory()
    facts_ = {"machine": "m", "python": "p", "cpu": "c", "packages": {}, "gpus": gpus, "gpu_note": note}
    shown = envinfo.render({**facts_, "pool": envinfo._pool(gpus), "docker": {"error": "none here"}})
    assert all(len(line) <= 120 for line in shown.splitlines()), shown
    text = " ".join(shown.split())
    assert "bus 00000000:8A:00.0" in text and "VBIOS 92.00.25.00.08" in text and "CUDA 12.5" in text
    assert "application clocks 765/1215 MHz" in text and "power limit ? W" not in text and "power limit ?" in text
    assert "pool: GPUs 1 (CUDA_VISIBLE_DEVICES inherited by the suite)" in text
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-GPU-1/0/0")
    assert "pool: the inherited CUDA_VISIBLE_DEVICES=MIG-GPU-1/0/0 names a MIG instance" in envinfo.render(
        {**facts_, "pool": envinfo._pool(gpus), "docker": {"error": "none here"}}
    )


@pytest.mark.parametrize("raw", ["[{", "{}", '"GPU-3fb142e7"', '[{"uuid": "GPU-3fb142e7"}, 3]'])
def test_a_malformed_suite_gpus_is_named_as_such_not_taken_as_unset(raw: str) -> None:
    with pytest.raises(identity.AskedError, match=rf"{identity.ASKED_ENV}=.* is malformed") as err:
        identity.asked_from_env({identity.ASKED_ENV: raw})
    assert "unset" not in str(err.value) and "JSON list" in str(err.value)
    assert identity.asked_from_env({}) is None, "unset stays unset"
    assert identity.asked_from_env({identity.ASKED_ENV: "[]"}) == []


@pytest.mark.parametrize(
    ("limit", "said"),
    [
        ({"flag": "1"}, "needs 2 GPU(s); --gpus allows 1 GPU(s)"),
        ({"CUDA_VISIBLE_DEVICES": "1"}, "needs 2 GPU(s); CUDA_VISIBLE_DEVICES allows 1 GPU(s)"),
        ({}, None),  # both GPUs: none short
    ],
)
def test_a_point_skipped_for_the_users_limit_names_the_limit(
    fake_smi, tmp_path: Path, limit: dict[str, str], said: str | None
) -> None:
    """Two GPUs on the host (a recorded nvidia-smi): a 2-GPU point left with one by --gpus or by the
    inherited CUDA_VISIBLE_DEVICES says which, not that the machine has one."""
    fake_smi("hpe-a100x2.query-gpu.csv")
    blocker = tmp_path / "no_nvml"
    blocker.mkdir()
    (blocker / "pynvml.py").write_text("raise ImportError('NVML left out by this test')\n")
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env |= {"PYTHONPATH": f"{blocker}{os.pathsep}{REPO}", **{k: v for k, v in limit.items() if k != "flag"}}
    scenario_file = tmp_path / "identity_small.yaml"
    scenario_file.write_text(SCENARIO.replace("device: [cpu]", "device: [gpu:2]"), encoding="utf-8")
    flag = ["--gpus", limit["flag"]] if "flag" in limit else []
    done = subprocess.run(
        [sys.executable, "-m", "suite", "check", str(scenario_file), "--backend", "local", *flag, "--smoke",
         "--results", str(tmp_path / "results")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    full = [line for line in done.stdout.splitlines() if line.startswith("skipped, in full: ")]
    if said is None:
        assert "needs 2 GPU(s)" not in done.stdout, done.stdout  # (the local build may lack GPU support)
    else:
        assert len(full) == 1 and full[0].startswith(f"skipped, in full: {said} ("), done.stdout
