"""Telemetry: the samplers against real processes, a real container and recorded nvidia-smi output.

The /proc sampler and the Docker stats sampler are checked against truths the kernel or the
sampled program itself reports (CPU time from wait4, the program's own process_time, bytes the
program touched). No GPU is here: the nvidia-smi parser is checked on output people recorded on
real GPUs and published (tests/fixtures/telemetry/README.md says where), and the NVML sampler only
on this machine's answer that there is no driver.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from docker_fixtures import REPO, backend_factory, engine_client, image_fixture, small_specs  # noqa: F401 - fixtures

from suite import telemetry
from suite.record import results, saving, telemetry_figures
from suite.record.results import RunResult

FIXTURES = Path(__file__).parent / "fixtures" / "telemetry"
MIB = 1024 * 1024


# ---------------------------------------------------------------------------------------------
# Summary maths


@pytest.mark.parametrize("n", [1, 2, 3, 7, 20, 101, 1000])
def test_p95_and_mean_match_numpy(n: int) -> None:
    rng = np.random.default_rng(n)
    values = list(rng.lognormal(3.0, 1.0, n))
    s = telemetry.summarize(values)
    assert s is not None and s["n"] == n
    assert s["p95"] == pytest.approx(float(np.percentile(values, 95)), rel=1e-12)
    assert s["mean"] == pytest.approx(float(np.mean(values)), rel=1e-12)
    assert s["max"] == max(values)
    for q in (0, 50, 99, 100):
        assert telemetry.percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-12)


def test_summary_skips_missing_readings_and_is_none_without_any() -> None:
    assert telemetry.summarize([None, None]) is None
    assert telemetry.summarize([None, 4.0, 2.0]) == {"mean": 3.0, "p95": 3.9, "max": 4.0, "n": 2}


def test_decimation_keeps_short_series_and_averages_long_ones_in_buckets() -> None:
    t = [i * 0.2 for i in range(100)]
    assert telemetry.decimate(t, list(range(100)), 600) == (t, list(range(100)))
    t = [float(i) for i in range(1200)]
    dt, dv = telemetry.decimate(t, [float(i) for i in range(1200)], 600)
    assert len(dt) == 600 and dt[0] == 0.5 and dv[-1] == 1198.5
    assert float(np.mean(dv)) == pytest.approx(float(np.mean(range(1200))))


def test_achieved_rate() -> None:
    assert telemetry.rate_hz([0.0, 0.2, 0.4, 0.6, 0.8, 1.0]) == pytest.approx(5.0)
    assert telemetry.rate_hz([1.0]) is None


def test_clock_reason_decoding_follows_nvml_bits() -> None:
    assert telemetry.decode_reasons(0) == []
    assert telemetry.decode_reasons(0x4 | 0x40) == ["SwPowerCap", "HwThermalSlowdown"]
    assert telemetry.decode_reasons(0x1000) == ["unknown 0x1000"]
    assert telemetry.reason_shares([0x1, 0x1, 0x4, 0x0]) == {"GpuIdle": 0.5, "SwPowerCap": 0.25}


# ---------------------------------------------------------------------------------------------
# The /proc sampler on a real process tree

TREE = textwrap.dedent(
    """
    import subprocess, sys, time
    burn = "import time\\nt = time.time()\\nwhile time.time() - t < {burn_s}: pass"
    hold = (
        "import time\\nb = bytearray({size})\\n"
        "for i in range(0, len(b), 4096): b[i] = 1\\n"  # touch every page: resident, not just reserved
        "time.sleep({hold_s})"
    )
    kids = [subprocess.Popen([sys.executable, "-c", burn]), subprocess.Popen([sys.executable, "-c", hold])]
    for k in kids:
        k.wait()
    """
)


def test_proc_sampler_brackets_a_real_tree_cpu_and_memory() -> None:
    size = 200 * MIB
    code = TREE.format(burn_s=4.0, size=size, hold_s=3.0)
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    recorder = telemetry.Recorder([telemetry.ProcSampler(proc.pid)], time.monotonic()).start()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    section = recorder.stop()
    assert proc.returncode == 0
    (source,) = section["sources"]
    assert source["error"] is None, source
    assert source["rate_hz"] >= 4.5, f"sampled at {source['rate_hz']} Hz, 5 asked"
    cpu = _entry(section, telemetry.CPU_PERCENT)
    # The truth: CPU time of the whole tree as the kernel accounts it (the root waited for both children).
    truth_cpu_s = usage.ru_utime + usage.ru_stime
    assert truth_cpu_s > 1.0, "the burner hardly got the CPU; the check below would prove little"
    t, v = cpu["series"]["t"], cpu["series"]["v"]
    sampled_cpu_s = sum(pct / 100 * (t1 - t0) for t0, t1, pct in zip(t, t[1:], v[1:], strict=False))
    # Missed: the interpreters' start before the first sample and the last ~0.2 s; never more than the truth.
    assert 0.8 * truth_cpu_s <= sampled_cpu_s <= 1.05 * truth_cpu_s, (sampled_cpu_s, truth_cpu_s)
    assert cpu["summary"]["run"]["max"] <= 100 * (os.cpu_count() or 1) + 15
    memory = _entry(section, telemetry.MEMORY_BYTES)["summary"]["run"]["max"]
    # Three small interpreters (about 10 MiB each) beside the 200 MiB the grandchild touched.
    assert size <= memory <= size + 80 * MIB, memory / MIB
    hwm = _entry(section, telemetry.PROCESS_HWM_BYTES)["summary"]["run"]["max"]
    assert size <= hwm <= size + 40 * MIB, hwm / MIB


def test_proc_sampler_ends_quietly_when_the_process_is_gone() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    sampler = telemetry.ProcSampler(proc.pid)
    sampler.run(time.monotonic, threading.Event(), 0.01)
    assert sampler.error is None and sampler.points == {}


def _entry(section: dict[str, Any], name: str) -> dict[str, Any]:
    (entry,) = telemetry.metric_entries(section, name)
    return entry


# ---------------------------------------------------------------------------------------------
# Docker container stats on a real container

CONTAINER = textwrap.dedent(
    """
    import time
    b = bytearray({size})
    for i in range(0, len(b), 4096):
        b[i] = 1
    w, c = time.time(), time.process_time()
    while time.time() - w < {burn_s}:
        pass
    print("share", (time.process_time() - c) / (time.time() - w), flush=True)
    time.sleep(1.5)
    """
)


@pytest.fixture(scope="module")
def base_image(client: Any) -> str:
    """The registry-free Debian base the Docker tests build (python3 is all this test needs)."""
    sys.path.insert(0, str(REPO / "tests"))
    import docker_base

    try:
        return docker_base.ensure_base_image(client, progress=lambda line: None)
    except docker_base.BaseImageError as exc:
        pytest.skip(f"cannot build the registry-free base image: {exc}")
    raise AssertionError("unreachable")


@pytest.mark.docker
def test_docker_stats_sampler_on_a_real_container(client: Any, base_image: str) -> None:
    size = 200 * MIB
    code = CONTAINER.format(size=size, burn_s=6.0)
    container = client.containers.run(
        base_image, ["python3", "-c", code], detach=True, labels={"suite.test": "telemetry"}
    )
    try:
        recorder = telemetry.Recorder([telemetry.DockerStatsSampler(lambda: client, container.id)], time.monotonic())
        recorder.start()
        assert container.wait(timeout=120)["StatusCode"] == 0
        section = recorder.stop()
        logs = container.logs().decode()
    finally:
        container.remove(force=True)
    (source,) = section["sources"]
    assert source["error"] is None, source
    assert source["samples"] >= 5, source
    # The truth: the share of one core the program itself measured while burning.
    share = float(next(line.split()[1] for line in logs.splitlines() if line.startswith("share")))
    assert share > 0.2, "the container hardly got the CPU; the check below would prove little"
    cpu = _entry(section, telemetry.CPU_PERCENT)
    t, v = cpu["series"]["t"], cpu["series"]["v"]
    # Samples inside the burn: from 1.5 s after the first sample (allocation done) to 1 s before its end.
    burning = [x for ti, x in zip(t, v, strict=True) if t[0] + 1.5 <= ti <= t[0] + 5.0 and x is not None]
    assert len(burning) >= 2, (t, v)
    assert abs(float(np.mean(burning)) - 100 * share) <= 15, (burning, share)
    memory = _entry(section, telemetry.MEMORY_BYTES)["summary"]["run"]["max"]
    assert size <= memory <= size + 40 * MIB, memory / MIB


class _HelperBackend:
    """What ``GpuPoller`` needs of the Docker backend: a client, the session's labels, the hardening."""

    def __init__(self, client: Any, session: str):
        self.client, self.session = client, session

    def stream_client(self) -> Any:
        return self.client

    def labels(self) -> dict[str, str]:
        return {"suite.test": "telemetry", "suite.session": self.session}

    def hardening(self) -> dict[str, Any]:
        return {"read_only": True, "cap_drop": ["ALL"], "network_mode": "none"}


@pytest.mark.docker
def test_gpu_poller_refused_is_recorded_and_its_helper_removed(client: Any, base_image: str) -> None:
    """The remote-engine GPU path for real, up to where a GPU would be needed: nvidia-smi's helper
    container is made on the engine with the run's device request, labelled with the session's
    labels; this engine has no GPU runtime, so it cannot start: the source records why, nothing
    raises, and the helper is gone afterwards."""
    from suite.backends.docker_run import GpuPoller

    session = f"telemetry-{os.getpid()}-{time.monotonic_ns()}"
    poller = GpuPoller(_HelperBackend(client, session), base_image, ["GPU-00000000-0000-0000-0000-000000000000"])
    kwargs = poller.kwargs(telemetry.smi_command())
    assert kwargs["environment"]["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    (request,) = kwargs["device_requests"]
    assert request["DeviceIDs"] == poller.uuids and request["Capabilities"] == [["gpu"]]
    assert kwargs["labels"]["suite.session"] == session and kwargs["labels"]["suite.helper"] == "gpu-telemetry"
    recorder = telemetry.Recorder([telemetry.SmiSampler(poller.stream, GpuPoller.method)], time.monotonic()).start()
    time.sleep(1.0)
    section = recorder.stop()
    poller.close()
    (source,) = section["sources"]
    assert source["samples"] == 0 and section["metrics"] == []
    assert "nvidia-smi" in (source["error"] or ""), source
    assert "helper container" in source["method"]
    left = client.containers.list(ignore_removed=True, all=True, filters={"label": f"suite.session={session}"})
    assert left == [], "the helper container was not removed"


def test_docker_formulas_follow_the_cli() -> None:
    # docker/cli stats_helpers.go: (cpuDelta / systemDelta) * onlineCPUs * 100; usage - inactive file.
    prev = {"cpu_usage": {"total_usage": 1_000}, "system_cpu_usage": 10_000}
    cur = {"cpu_usage": {"total_usage": 1_500}, "system_cpu_usage": 12_000, "online_cpus": 4}
    assert telemetry.docker_cpu_percent(prev, cur) == pytest.approx(100.0)
    assert telemetry.docker_memory_bytes({"usage": 100, "stats": {"total_inactive_file": 30}}) == 70
    assert telemetry.docker_memory_bytes({"usage": 100, "stats": {"inactive_file": 40}}) == 60
    assert telemetry.docker_memory_bytes({"usage": 100, "stats": {"inactive_file": 400}}) == 100


# ---------------------------------------------------------------------------------------------
# nvidia-smi parsing on recorded output (recorded by others on real GPUs; no GPU here)


def _recorded(name: str) -> tuple[list[str], list[dict[str, Any]]]:
    header, *rows = (FIXTURES / name).read_text().splitlines()
    fields = telemetry.parse_smi_header(header)
    parsed = [telemetry.parse_smi_line(row, fields) for row in rows]
    assert all(p is not None for p in parsed)
    return fields, parsed  # type: ignore[return-value]


def test_recorded_utilization_and_memory_parse_to_their_values() -> None:
    fields, rows = _recorded("utilization-memory.csv")
    assert fields[3:] == ["utilization.gpu", "utilization.memory", "memory.total", "memory.free", "memory.used"]
    assert [r["utilization.gpu"] for r in rows] == [100.0, 100.0, 100.0]
    assert [r["utilization.memory"] for r in rows] == [55.0, 54.0, 55.0]
    assert rows[0]["memory.used"] == 9941.0 and rows[0]["pstate"] == "P2" and rows[0]["temperature.gpu"] == 85.0
    metrics = telemetry.smi_metrics(rows[0])
    assert metrics[(telemetry.GPU_UTIL_PERCENT, None)] == 100.0
    assert metrics[(telemetry.GPU_MEMORY_BYTES, None)] == 9941 * MIB
    assert metrics[(telemetry.GPU_TEMPERATURE_C, None)] == 85.0


def test_recorded_power_and_clocks_parse_to_their_values() -> None:
    fields, rows = _recorded("power-clocks.csv")
    assert "clocks.sm" in fields  # printed as "clocks.current.sm [MHz]"
    metrics = [telemetry.smi_metrics(r) for r in rows]
    assert [m[(telemetry.GPU_POWER_W, "0")] for m in metrics] == [208.36, 249.62, 205.51]
    assert [m[(telemetry.GPU_SM_CLOCK_MHZ, "0")] for m in metrics] == [1545.0, 1560.0, 1545.0]


def test_recorded_reason_bitmask_decodes_to_every_reason_nvml_defined() -> None:
    _, (row,) = _recorded("throttle-reasons-supported.csv")
    mask = row["clocks_throttle_reasons.supported"]
    assert mask == 0x1FF
    assert telemetry.decode_reasons(mask) == [telemetry.CLOCK_REASONS[1 << i] for i in range(9)]


def test_rows_without_units_parse_as_with_units() -> None:
    # The suite asks for nounits; derived from the recorded rows by removing their units.
    fields, rows = _recorded("power-clocks.csv")
    line = (FIXTURES / "power-clocks.csv").read_text().splitlines()[1]
    bare = ", ".join(p.split(" ")[0] if i >= 2 else p for i, p in enumerate(line.split(", ")))
    assert telemetry.parse_smi_line(bare, fields) == rows[0]
    assert telemetry.parse_smi_line("[N/A], 3", ["utilization.gpu", "memory.used"]) == {
        "utilization.gpu": None,
        "memory.used": 3.0,
    }
    assert telemetry.parse_smi_line("Failed to initialize NVML", fields) is None


def test_nvml_without_a_driver_is_recorded_not_raised() -> None:
    """No GPU driver here: the NVML sampler's failure lands in the section and nothing raises."""
    recorder = telemetry.Recorder([telemetry.NvmlSampler(["GPU-x"])], time.monotonic()).start()
    section = recorder.stop()
    (source,) = section["sources"]
    assert source["name"] == "nvml" and source["samples"] == 0
    assert source["error"] and ("NVML" in source["error"] or "pynvml" in source["error"]), source
    assert section["metrics"] == []


# ---------------------------------------------------------------------------------------------
# Windows, the result section, round trip


def test_fit_window_comes_from_the_worker_progress_lines() -> None:
    clock = iter([1.0, 2.0, 3.0, 9.0, 10.0])
    recorder = telemetry.Recorder([], 0.0)
    recorder.clock = lambda: next(clock)  # type: ignore[method-assign]
    for event in (
        {"event": "phase", "phase": "setup"},
        {"event": "phase", "phase": "fit"},
        {"event": "epoch", "phase": "fit", "epoch": 1},
        {"event": "phase", "phase": "evaluate"},
        {"event": "phase", "phase": "probe"},
    ):
        recorder.mark(event)
    assert recorder.windows() == {"fit": [2.0, 9.0], "steady": [3.0, 9.0]}


def test_summaries_per_window_and_round_trip(tmp_path: Path) -> None:
    sampler = telemetry.Sampler()
    for i in range(50):  # 10 s at 5 Hz: 20% busy before the fit, 80% in it
        t = i * 0.2
        sampler.add((telemetry.GPU_UTIL_PERCENT, "GPU-a"), t, 80.0 if 4.0 <= t <= 8.0 else 20.0)
        sampler.add((telemetry.MEMORY_BYTES, None), t, float(MIB * (100 + i)))
        sampler.reads.append(t)
    recorder = telemetry.Recorder([sampler], 0.0)
    recorder.marks = {"fit_start": 3.0, "first_epoch_end": 4.0, "fit_end": 8.0}
    section = recorder.section()
    util = _entry(section, telemetry.GPU_UTIL_PERCENT)
    assert util["summary"]["steady"]["mean"] == 80.0
    assert util["summary"]["run"]["mean"] == pytest.approx((21 * 80 + 29 * 20) / 50)
    spec = {"scenario": "s", "point_label": "p", "repetition": 0, "fingerprint": "ab" * 32, "config": {"device": "cpu"}}
    result = RunResult(status="ok", spec=spec, telemetry=section)
    loaded = results.load(saving.save(result, tmp_path, "r"))
    assert loaded == result
    assert telemetry_figures.figures_of(loaded).gpu_busy_percent == 80.0
    assert telemetry_figures.figures_of(loaded).peak_memory_bytes == float(MIB * 149)
    assert telemetry_figures.figures_of(RunResult(status="ok", spec={})).gpu_busy_percent is None
    # A steady part shorter than a second says too little: the whole fit is used instead.
    recorder.marks = {"fit_start": 3.0, "first_epoch_end": 7.8, "fit_end": 8.0}
    short = RunResult(status="ok", spec={}, telemetry=recorder.section())
    assert _entry(short.telemetry, telemetry.GPU_UTIL_PERCENT)["summary"]["steady"]["n"] == 2
    in_fit = [80.0 if 4.0 <= i * 0.2 <= 8.0 else 20.0 for i in range(50) if 3.0 <= i * 0.2 <= 8.0]
    assert telemetry_figures.figures_of(short).gpu_busy_percent == pytest.approx(float(np.mean(in_fit)))


def test_busy_is_not_measured_without_a_fit_window() -> None:
    """90% busy during the fit, idle around it: without the fit's window the whole run's mean (30%)
    would pass for a starved GPU; it must read as not measured instead."""
    sampler = telemetry.Sampler()
    for i in range(150):  # 30 s at 5 Hz: the fit from 10 s to 20 s
        t = i * 0.2
        sampler.add((telemetry.GPU_UTIL_PERCENT, "GPU-a"), t, 90.0 if 10.0 <= t < 20.0 else 0.0)
        sampler.reads.append(t)
    recorder = telemetry.Recorder([sampler], 0.0)
    section = recorder.section()
    assert _entry(section, telemetry.GPU_UTIL_PERCENT)["summary"]["run"]["mean"] == pytest.approx(30.0)
    assert telemetry_figures.figures_of(RunResult(status="ok", spec={}, telemetry=section)).gpu_busy_percent is None
    recorder.marks = {"fit_start": 10.0, "fit_end": 19.9}
    fitted = RunResult(status="ok", spec={}, telemetry=recorder.section())
    assert telemetry_figures.figures_of(fitted).gpu_busy_percent == pytest.approx(90.0)


# ---------------------------------------------------------------------------------------------
# End to end: one real local-backend run carries CPU and memory telemetry


@pytest.mark.slow
def test_local_run_records_cpu_and_memory_over_its_fit(tmp_path: Path) -> None:
    from suite.backends.local import LocalBackend

    (spec,) = small_specs(tmp_path, name="telemetry_e2e")
    backend = LocalBackend(machine="test")
    try:
        result = backend.run(spec)
    finally:
        backend.close()
    assert result.ok, result.message + result.log_tail
    section = result.telemetry
    assert {s["name"] for s in section["sources"]} == {"proc", "load"}  # load: tests/test_busy_machine.py
    (source,) = [s for s in section["sources"] if s["name"] == "proc"]
    assert source["error"] is None and source["rate_hz"] >= 4.0, source
    assert set(section["windows"]) >= {"fit", "steady"}
    fit_start, fit_end = section["windows"]["fit"]
    # The window the host saw holds the fit the worker timed (host-side arrival adds a little).
    assert fit_end - fit_start == pytest.approx(result.timing["fit_s"], abs=0.5)
    cpu = _entry(section, telemetry.CPU_PERCENT)
    assert cpu["summary"]["fit"]["mean"] > 20, "training keeps at least part of a core busy"
    peak = telemetry_figures.figures_of(result).peak_memory_bytes
    assert peak is not None and peak > 300 * MIB, "TensorFlow alone holds more than this"
    assert telemetry_figures.figures_of(result).gpu_busy_percent is None


@pytest.mark.docker
@pytest.mark.slow
def test_docker_backend_run_records_container_stats(backend: Any, tmp_path: Path) -> None:
    """One real run through the Docker backend: the run skeleton starts the container's samplers."""
    (spec,) = small_specs(tmp_path, name="telemetry_docker")
    result = backend().run(spec)
    assert result.ok, result.message + result.log_tail
    # Beside it the machine's load (an engine on this machine): tests/test_busy_machine.py.
    (source,) = [s for s in result.telemetry["sources"] if s["name"] != "load"]
    assert source["name"] == "docker_stats" and source["error"] is None, source
    assert source["samples"] >= 3 and 0.5 <= source["rate_hz"] <= 1.5, source
    assert set(result.telemetry["windows"]) >= {"fit"}
    # Anonymous memory and active file cache only (docker stats' figure): TensorFlow's mapped
    # libraries, which a local run's RSS counts, are mostly not in it (254 MiB measured here).
    peak = telemetry_figures.figures_of(result).peak_memory_bytes
    assert peak is not None and peak > 100 * MIB, "TensorFlow's heap alone holds more than this"
    assert _entry(result.telemetry, telemetry.CPU_PERCENT)["summary"]["run"]["max"] > 20


# ---------------------------------------------------------------------------------------------
# nvidia-smi on two GPUs: one read per tick, timed by nvidia-smi's timestamp


def _burst_stream(text: str) -> Any:
    """A stream that delivers the whole output in one burst, as a buffered pipe may."""

    def stream(command: list[str]) -> Any:
        assert command[1].startswith("--query-gpu=timestamp,uuid,"), command
        yield text.encode()

    return stream


def test_two_gpus_count_one_sample_per_tick_timed_by_nvidia_smi() -> None:
    # Constructed rows (tests/fixtures/telemetry/README.md): 2 GPUs, 5 ticks 200 ms apart.
    text = (FIXTURES / "two-gpus-constructed.csv").read_text()
    sampler = telemetry.SmiSampler(_burst_stream(text))
    recorder = telemetry.Recorder([sampler], time.monotonic())
    sampler.run(recorder.clock, threading.Event(), 0.2)  # in this thread: to the end of the output
    section = recorder.section()
    (source,) = section["sources"]
    assert source["error"] is None, source
    assert source["samples"] == 5, source  # ticks, not rows (10)
    assert source["rate_hz"] == pytest.approx(5.0, rel=1e-3), source
    util = {e["device"]: e for e in telemetry.metric_entries(section, telemetry.GPU_UTIL_PERCENT)}
    assert set(util) == {"GPU-11111111-1111-1111-1111-111111111111", "GPU-22222222-2222-2222-2222-222222222222"}
    first, second = util.values()
    # Both GPUs on the same tick times, 0.2 s apart as nvidia-smi stamped them, though all arrived at once.
    assert first["series"]["t"] == second["series"]["t"]
    steps = np.diff(first["series"]["t"])
    assert np.allclose(steps, 0.2, atol=2e-3), first["series"]["t"]
    assert first["series"]["v"] == [100.0] * 5 and second["series"]["v"] == [3.0, 4.0, 3.0, 3.0, 3.0]
    power = {e["device"]: e["series"]["v"] for e in telemetry.metric_entries(section, telemetry.GPU_POWER_W)}
    assert power["GPU-11111111-1111-1111-1111-111111111111"] == [208.36, 249.62, 205.51, 210.0, 230.0]


def test_recorded_timestamps_parse_to_their_spacing() -> None:
    # Recorded rows (power-clocks.csv): nvidia-smi -l 1, stamped 1.003 s and 1.005 s apart.
    _, rows = _recorded("power-clocks.csv")
    times = [telemetry.smi_time(r["timestamp"]) for r in rows]
    assert np.allclose(np.diff(times), [1.003, 1.005], atol=1e-6)
    assert telemetry.smi_time("N/A") is None and telemetry.smi_time(None) is None


# ---------------------------------------------------------------------------------------------
# NVML on a driver older than the binding (a fake pynvml: no GPU here)


class _FakeNvml:
    """The calls NvmlSampler makes, with known answers; the newer calls raise FunctionNotFound, as
    NVML does when the binding is newer than the installed driver."""

    NVML_TEMPERATURE_GPU, NVML_CLOCK_SM, NVML_ERROR_FUNCTION_NOT_FOUND = 0, 1, 13

    class NVMLError(Exception):
        def __init__(self, value: int = 999):
            super().__init__(f"NVML error {value}")
            self.value = value

    class NVMLError_FunctionNotFound(NVMLError):  # noqa: N801 - pynvml's own name
        def __init__(self) -> None:
            super().__init__(13)

    def __init__(self, fail_handles: bool = False) -> None:
        self.inits = self.shutdowns = 0
        self.calls: dict[str, int] = {}
        self.fail_handles = fail_handles

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def nvmlInit(self) -> None:  # noqa: N802
        self.inits += 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.shutdowns += 1

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:  # noqa: N802
        if self.fail_handles:
            raise self.NVMLError(5)
        return uuid

    def nvmlDeviceGetUtilizationRates(self, h: str) -> Any:  # noqa: N802
        return type("Util", (), {"gpu": 42})()

    def nvmlDeviceGetMemoryInfo(self, h: str) -> Any:  # noqa: N802
        return type("Mem", (), {"used": 123 * MIB})()

    def nvmlDeviceGetClockInfo(self, h: str, clock: int) -> int:  # noqa: N802
        return 1410

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:  # noqa: N802
        return 71500  # mW

    def nvmlDeviceGetTemperatureV(self, h: str, sensor: int) -> int:  # noqa: N802
        self._count("TemperatureV")
        raise self.NVMLError_FunctionNotFound()

    def nvmlDeviceGetTemperature(self, h: str, sensor: int) -> int:  # noqa: N802
        self._count("Temperature")
        return 57

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: str) -> int:  # noqa: N802
        self._count("EventReasons")
        raise self.NVMLError_FunctionNotFound()

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: str) -> int:  # noqa: N802
        self._count("ThrottleReasons")
        return 0x4


def test_nvml_on_an_older_driver_reads_through_the_old_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    sampler = telemetry.NvmlSampler(["GPU-a"])
    sampler.open()
    try:
        reads = [sampler.read() for _ in range(3)]
    finally:
        sampler.close()
        sampler.close()  # safe twice
    for values in reads:
        assert values == {
            (telemetry.GPU_UTIL_PERCENT, "GPU-a"): 42.0,
            (telemetry.GPU_MEMORY_BYTES, "GPU-a"): float(123 * MIB),
            (telemetry.GPU_SM_CLOCK_MHZ, "GPU-a"): 1410.0,
            (telemetry.GPU_POWER_W, "GPU-a"): 71.5,
            (telemetry.GPU_TEMPERATURE_C, "GPU-a"): 57.0,
            (telemetry.GPU_CLOCK_REASONS, "GPU-a"): 4.0,
        }
    assert sampler.error is None
    # The new calls are tried once; from then on only the old ones.
    assert fake.calls == {"TemperatureV": 1, "Temperature": 3, "EventReasons": 1, "ThrottleReasons": 3}
    assert (fake.inits, fake.shutdowns) == (1, 1)


def test_a_gpu_section_recorded_through_nvml_is_read_back_by_report_and_show(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """What a GPU run records (clock event reasons' shares among its summaries) is a result the
    suite's own reader takes: the report and ``show`` read it, and the page gives the GPU's busy."""
    import json

    from conftest import suite_cli

    from suite import paths

    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml())
    recorder = telemetry.Recorder([telemetry.NvmlSampler(["GPU-a"])], time.monotonic(), interval_s=0.05).start()
    time.sleep(0.5)
    section = recorder.stop()
    [reasons] = [m for m in section["metrics"] if m["name"] == telemetry.GPU_CLOCK_REASONS]
    assert reasons["summary"]["run"]["reasons"], reasons["summary"]
    rich = REPO / "tests" / "fixtures" / "rich" / "box" / "mnist_mlp_width" / "763c6bd727d3-r0.json"
    record = json.loads(rich.read_text())
    record["telemetry"] = {**section, "windows": record["telemetry"]["windows"]}
    folder = tmp_path / "res" / "box" / "mnist_mlp_width"
    folder.mkdir(parents=True)
    (folder / rich.name).write_text(json.dumps(record))
    env = {paths.CACHE_ENV: str(tmp_path / "cache")}
    shown = suite_cli("show", folder / rich.name, env=env)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    made = suite_cli("report", "--results", tmp_path / "res", "--out", tmp_path / "out", env=env)
    assert made.returncode == 0, made.stdout + made.stderr


def test_nvml_one_failing_field_leaves_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeNvml()

    def broken(h: str) -> Any:
        raise ValueError("not an NVMLError")

    fake.nvmlDeviceGetPowerUsage = broken  # type: ignore[method-assign]
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    sampler = telemetry.NvmlSampler(["GPU-a"])
    sampler.open()
    values = sampler.read()
    sampler.close()
    assert values[(telemetry.GPU_POWER_W, "GPU-a")] is None
    assert values[(telemetry.GPU_UTIL_PERCENT, "GPU-a")] == 42.0
    assert "ValueError" in (sampler.error or "")


def test_nvml_open_that_half_succeeds_shuts_nvml_down(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeNvml(fail_handles=True)  # nvmlInit works, the device lookup fails
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    recorder = telemetry.Recorder([telemetry.NvmlSampler(["GPU-a"])], time.monotonic()).start()
    section = recorder.stop()
    (source,) = section["sources"]
    assert "NVML error 5" in (source["error"] or ""), source
    assert (fake.inits, fake.shutdowns) == (1, 1), "an init reference leaked"


# ---------------------------------------------------------------------------------------------
# Stopping, Docker stats edge cases, the engine's memory high-water mark


class _Stuck(telemetry.Sampler):
    name = "stuck"

    def run(self, clock: Any, stop: threading.Event, interval_s: float) -> None:
        time.sleep(telemetry.STOP_JOIN_S + 2.0)  # ignores stop


def test_halt_waits_for_all_samplers_within_one_deadline() -> None:
    recorder = telemetry.Recorder([_Stuck(), _Stuck(), _Stuck()], time.monotonic()).start()
    started = time.monotonic()
    recorder.halt()
    took = time.monotonic() - started
    assert telemetry.STOP_JOIN_S - 0.1 <= took <= telemetry.STOP_JOIN_S + 0.5, took


class _StatsClient:
    def __init__(self, samples: list[dict[str, Any]]):
        self.api = self
        self.samples = samples

    def stats(self, container_id: str, stream: bool, decode: bool) -> Any:
        return iter(self.samples)


def _stats(read: str, usage: int | None, total: int, system: int, **memory: Any) -> dict[str, Any]:
    memory_stats = {"stats": {}, **memory}
    if usage is not None:
        memory_stats["usage"] = usage
    return {
        "read": read,
        "memory_stats": memory_stats,
        "cpu_stats": {"cpu_usage": {"total_usage": total}, "system_cpu_usage": system, "online_cpus": 2},
        "precpu_stats": {"cpu_usage": {"total_usage": total - 500}, "system_cpu_usage": system - 1000},
    }


def test_docker_stats_without_memory_usage_is_not_the_end() -> None:
    samples = [
        _stats("2026-12-01T00:00:01Z", None, 500, 10_000),  # no usage in a live sample
        _stats("2026-12-01T00:00:02Z", 300 * MIB, 1000, 11_000, max_usage=900 * MIB),
        _stats("0001-01-01T00:00:00Z", 0, 0, 0),  # the container ended
        _stats("2026-12-01T00:00:04Z", 1, 1, 1),  # never read
    ]
    sampler = telemetry.DockerStatsSampler(lambda: _StatsClient(samples), "c")
    recorder = telemetry.Recorder([sampler], time.monotonic())
    sampler.run(recorder.clock, threading.Event(), 0.2)
    section = recorder.section()
    (source,) = section["sources"]
    assert source["samples"] == 2 and source["error"] is None, source
    cpu = _entry(section, telemetry.CPU_PERCENT)["series"]["v"]
    assert cpu == [100.0, 100.0]  # 500 of 1000 system ns, times 2 CPUs
    # The sampled peak is 300 MiB; the engine's high-water mark (cgroup v1, file cache included) saw
    # 900 MiB. It is kept, but the peak shown stays the cache-free figure every engine reports.
    assert _entry(section, telemetry.CONTAINER_MAX_USAGE_BYTES)["summary"]["run"]["max"] == 900 * MIB
    figures = telemetry_figures.figures_of(RunResult(status="ok", spec={}, telemetry=section))
    assert figures.peak_memory_bytes == 300 * MIB


def test_docker_stats_that_end_before_a_sample_say_so() -> None:
    sampler = telemetry.DockerStatsSampler(lambda: _StatsClient([_stats("0001-01-01T00:00:00Z", 0, 0, 0)]), "c")
    sampler.run(time.monotonic, threading.Event(), 0.2)
    assert sampler.reads == [] and "no samples" in (sampler.error or "")


def test_one_test_of_a_local_engine() -> None:
    from suite.backends.docker_run import engine_is_local

    assert engine_is_local("unix:///var/run/docker.sock") and engine_is_local("/var/run/docker.sock")
    assert engine_is_local("npipe:////./pipe/docker_engine")
    assert not engine_is_local("ssh://gpu-box") and not engine_is_local("tcp://10.0.0.2:2376")


# ---------------------------------------------------------------------------------------------
# The run skeleton: the section is built after the log has drained


class _LateLogExecution:
    """A worker that has ended while its last progress lines are still on their way to the host."""

    def __init__(self) -> None:
        self.facts: dict[str, Any] = {}
        self.sampler = telemetry.Sampler()
        for i in range(40):
            self.sampler.add((telemetry.GPU_UTIL_PERCENT, "GPU-a"), i * 0.05, 90.0)

    def telemetry_sources(self) -> list[telemetry.Sampler]:
        return [self.sampler]

    def lines(self) -> Any:
        yield '@@suite {"event": "phase", "phase": "fit"}'
        time.sleep(0.5)  # the exit is seen before the rest of the output arrives
        yield '@@suite {"event": "phase", "phase": "evaluate"}'

    def wait(self) -> Any:
        from suite.backends.base import Exit

        return Exit(code=0)

    def kill(self) -> bool:
        return False

    def result(self) -> bytes | None:
        return None

    def cleanup(self) -> None:
        pass


def test_run_skeleton_marks_the_fit_from_progress_lines_that_arrive_after_the_exit(tmp_path: Path) -> None:
    from test_classify_exit import FakeBackend, spec_with_timeout

    result = FakeBackend(_LateLogExecution()).run(spec_with_timeout(tmp_path, 30.0))  # type: ignore[arg-type]
    assert "fit" in result.telemetry["windows"], result.telemetry["windows"]
