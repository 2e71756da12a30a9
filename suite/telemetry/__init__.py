"""What the machine was doing during a run: CPU, memory and GPU, sampled while the worker trains.

The report's question "why is my small network slower on the GPU?" is answered by how busy the GPU
was during each step; these samplers measure that, and what the CPU and memory did beside it.

Samplers, each a thread started by ``Recorder`` once the worker is launched (``RunSkeleton.run``):

- ``ProcSampler`` (local backend): the worker's whole process tree from ``/proc``. CPU is the sum of
  utime + stime + cutime + cstime of every process in the tree (the worker and its descendants; a
  process left behind in the worker's session after its parent died is counted only where the kernel
  keeps no children lists and every process is scanned), differenced between samples: **percent of
  one core** (100 = one core busy all the time, like ``top`` and ``docker stats``; divide by the
  machine's cores for a share of the machine). Memory is the tree's summed resident set size (RSS);
  the largest per-process high-water mark the kernel kept (``VmHWM``) is recorded beside it, because
  a spike between two samples is in the kernel's mark and not in the sampled sum.
- ``DockerStatsSampler`` (Docker backend, local or remote engine): the Engine API's container stats
  stream, which the engine publishes about once a second (not 5 Hz: see the class). CPU percent is
  docker CLI's formula (docker/cli ``cli/command/container/stats_helpers.go``
  ``calculateCPUPercentUnix``): delta of ``cpu_stats.cpu_usage.total_usage`` over delta of
  ``system_cpu_usage``, times ``online_cpus`` x 100, against ``precpu_stats``: also percent of one
  core. Memory is ``usage`` minus ``total_inactive_file`` (cgroup v1) or ``inactive_file`` (cgroup
  v2), the CLI's ``calculateMemUsageUnixNoCache``. A peak between two samples is caught only where the
  engine keeps a high-water mark: ``memory_stats.max_usage`` on cgroup v1 (``container_max_usage_bytes``;
  it includes file cache, so it can exceed the sampled figure by the cache); on cgroup v2 the engine
  reports no maximum, and the peak is the largest 1 Hz sample.
- ``NvmlSampler`` (GPUs on this machine: local backend, or a Docker engine on this host): NVML through
  ``nvidia-ml-py``, devices by UUID. Utilization is NVML's "percent of time over the past sample
  period during which one or more kernels was executing" (a period of 1/6 s to 1 s by product).
- ``SmiSampler`` (GPUs of a remote engine): ``nvidia-smi --query-gpu=... --format=csv,noheader,nounits
  -lms 200`` in a helper container of its own on the engine, given the run's GPUs (so its CPU and
  memory are not in the run container's stats); the rows of one tick (one per GPU, one timestamp)
  are one sample, timed by nvidia-smi's timestamp.

- ``LoadSampler`` (local backend, or a Docker engine on this host): the machine's load around the
  run, from ``/proc`` once a second: CPU used by processes that are not the run's own, CPU steal,
  the load average at the start and the end, and other compute processes on the run's GPUs (NVML).
  ``suite.telemetry.load``'s docstring says exactly what is counted; ``suite.record.under_load.load_note``
  says when a result was measured under load.

Sampling never fails a run: a sampler that cannot start or breaks records its error in the section.

The ``telemetry`` section of a result (``Recorder.section``)::

    {"interval_s": 0.2,
     "windows": {"fit": [start, end], "steady": [start, end]},   # seconds from the run's start
     "sources": [{"name", "method", "samples", "rate_hz", "error"}],
     "metrics": [{"name", "device", "unit", "source",
                  "summary": {"run"|"fit"|"steady": {"mean", "p95", "max", "n"}},
                  "series": {"t": [...], "v": [...], "decimated_from": N}}],
     "load": {...}}   # LoadSampler's block (suite.telemetry.load), where it ran

``fit`` is the timed ``model.fit`` (from the worker's "fit" phase line to its "evaluate" line, as the
host received them), ``steady`` the part after the first epoch. The clock-event-reasons metric has
``reasons`` (reason -> share of samples) in place of mean/p95/max. Series longer than
``SERIES_POINTS`` are decimated for storage by averaging consecutive equal-count buckets (time and
value); every summary is computed from the full series before that.
"""

from suite.telemetry.core import (
    CLOCK_REASONS,
    CONTAINER_MAX_USAGE_BYTES,
    CPU_PERCENT,
    CPU_STEAL_PERCENT,
    GPU_CLOCK_REASONS,
    GPU_MEMORY_BYTES,
    GPU_POWER_W,
    GPU_SM_CLOCK_MHZ,
    GPU_TEMPERATURE_C,
    GPU_UTIL_PERCENT,
    INTERVAL_S,
    MAX_CONSECUTIVE_ERRORS,
    MEMORY_BYTES,
    OTHER_CPU_PERCENT,
    PROCESS_HWM_BYTES,
    SERIES_POINTS,
    STOP_JOIN_S,
    UNITS,
    Ended,
    Key,
    PolledSampler,
    Recorder,
    Sampler,
    decimate,
    decode_reasons,
    metric_entries,
    percentile,
    rate_hz,
    reason_shares,
    summarize,
    window_stat,
)
from suite.telemetry.gpu import (
    SMI_FIELDS,
    NvmlSampler,
    SmiSampler,
    parse_smi_header,
    parse_smi_line,
    smi_command,
    smi_metrics,
    smi_time,
)
from suite.telemetry.host import (
    CLK_TCK,
    PAGE_SIZE,
    DockerStatsSampler,
    ProcSampler,
    docker_cpu_percent,
    docker_memory_bytes,
    docker_sample,
    ended_stats,
)
from suite.telemetry.load import (
    LOAD_INTERVAL_S,
    LoadSampler,
    LoadTracker,
    Ownership,
    parse_cpu_line,
    read_process,
    sample_machine,
)

__all__ = [
    "CLK_TCK",
    "CLOCK_REASONS",
    "CONTAINER_MAX_USAGE_BYTES",
    "CPU_PERCENT",
    "CPU_STEAL_PERCENT",
    "DockerStatsSampler",
    "Ended",
    "GPU_CLOCK_REASONS",
    "GPU_MEMORY_BYTES",
    "GPU_POWER_W",
    "GPU_SM_CLOCK_MHZ",
    "GPU_TEMPERATURE_C",
    "GPU_UTIL_PERCENT",
    "INTERVAL_S",
    "Key",
    "LOAD_INTERVAL_S",
    "LoadSampler",
    "LoadTracker",
    "MAX_CONSECUTIVE_ERRORS",
    "MEMORY_BYTES",
    "NvmlSampler",
    "OTHER_CPU_PERCENT",
    "Ownership",
    "PAGE_SIZE",
    "PROCESS_HWM_BYTES",
    "PolledSampler",
    "ProcSampler",
    "Recorder",
    "SERIES_POINTS",
    "SMI_FIELDS",
    "STOP_JOIN_S",
    "Sampler",
    "SmiSampler",
    "UNITS",
    "decimate",
    "decode_reasons",
    "docker_cpu_percent",
    "docker_memory_bytes",
    "docker_sample",
    "ended_stats",
    "metric_entries",
    "parse_cpu_line",
    "parse_smi_header",
    "parse_smi_line",
    "percentile",
    "rate_hz",
    "read_process",
    "reason_shares",
    "sample_machine",
    "smi_command",
    "smi_metrics",
    "smi_time",
    "summarize",
    "window_stat",
]
