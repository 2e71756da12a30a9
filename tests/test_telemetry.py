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

from suite import results, telemetry
from suite.results import RunResult

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


@pytest.mark.docker
def test_nvidia_smi_missing_in_the_container_is_recorded_not_raised(client: Any, base_image: str) -> None:
    """The remote-engine GPU path for real, up to where a GPU would be needed: the exec runs in the
    run's container, and a container without nvidia-smi (no GPU runtime here) gives an error record."""
    container = client.containers.run(base_image, ["sleep", "30"], detach=True, labels={"suite.test": "telemetry"})
    try:
        recorder = telemetry.Recorder([telemetry.SmiSampler(lambda: client, container.id)], time.monotonic()).start()
        time.sleep(1.0)
        section = recorder.stop()
    finally:
        container.remove(force=True)
    (source,) = section["sources"]
    assert source["samples"] == 0 and section["metrics"] == []
    assert "nvidia-smi" in (source["error"] or ""), source


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
    result = RunResult(status="ok", spec={"fingerprint": "f"}, telemetry=section)
    loaded = results.load(results.save(result, tmp_path, "r"))
    assert loaded == result
    assert results.gpu_busy_percent(loaded) == 80.0
    assert results.peak_memory_bytes(loaded) == float(MIB * 149)
    assert results.gpu_busy_percent(RunResult(status="ok", spec={})) is None
    # A steady part shorter than a second says too little: the whole fit is used instead.
    recorder.marks = {"fit_start": 3.0, "first_epoch_end": 7.8, "fit_end": 8.0}
    short = RunResult(status="ok", spec={}, telemetry=recorder.section())
    assert _entry(short.telemetry, telemetry.GPU_UTIL_PERCENT)["summary"]["steady"]["n"] == 2
    in_fit = [80.0 if 4.0 <= i * 0.2 <= 8.0 else 20.0 for i in range(50) if 3.0 <= i * 0.2 <= 8.0]
    assert results.gpu_busy_percent(short) == pytest.approx(float(np.mean(in_fit)))


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
    assert {s["name"] for s in section["sources"]} == {"proc"}
    (source,) = section["sources"]
    assert source["error"] is None and source["rate_hz"] >= 4.0, source
    assert set(section["windows"]) >= {"fit", "steady"}
    fit_start, fit_end = section["windows"]["fit"]
    # The window the host saw holds the fit the worker timed (host-side arrival adds a little).
    assert fit_end - fit_start == pytest.approx(result.timing["fit_s"], abs=0.5)
    cpu = _entry(section, telemetry.CPU_PERCENT)
    assert cpu["summary"]["fit"]["mean"] > 20, "training keeps at least part of a core busy"
    peak = results.peak_memory_bytes(result)
    assert peak is not None and peak > 300 * MIB, "TensorFlow alone holds more than this"
    assert results.gpu_busy_percent(result) is None


@pytest.mark.docker
@pytest.mark.slow
def test_docker_backend_run_records_container_stats(backend: Any, tmp_path: Path) -> None:
    """One real run through the Docker backend: the run skeleton starts the container's samplers."""
    (spec,) = small_specs(tmp_path, name="telemetry_docker")
    result = backend().run(spec)
    assert result.ok, result.message + result.log_tail
    (source,) = result.telemetry["sources"]
    assert source["name"] == "docker_stats" and source["error"] is None, source
    assert source["samples"] >= 3 and 0.5 <= source["rate_hz"] <= 1.5, source
    assert set(result.telemetry["windows"]) >= {"fit"}
    # Anonymous memory and active file cache only (docker stats' figure): TensorFlow's mapped
    # libraries, which a local run's RSS counts, are mostly not in it (254 MiB measured here).
    peak = results.peak_memory_bytes(result)
    assert peak is not None and peak > 100 * MIB, "TensorFlow's heap alone holds more than this"
    assert _entry(result.telemetry, telemetry.CPU_PERCENT)["summary"]["run"]["max"] > 20
