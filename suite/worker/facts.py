"""Environment facts, collected once per run by small ``collect_*`` functions (stdlib first)."""

from __future__ import annotations

import csv
import io
import os
import platform
import re
import socket
import subprocess
from typing import Any

_ENV_KEYS = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "SUITE_GPUS",
    "NVIDIA_VISIBLE_DEVICES",
    "KERAS_BACKEND",
    "TF_XLA_FLAGS",
    "TF_NUM_INTRAOP_THREADS",
    "TF_NUM_INTEROP_THREADS",
    "OMP_NUM_THREADS",
    "XLA_PYTHON_CLIENT_PREALLOCATE",
)


def collect_host() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "python": platform.python_version(),
        "in_container": os.path.exists("/.dockerenv"),
        "env": {k: os.environ[k] for k in _ENV_KEYS if k in os.environ},
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# nvidia-smi --query-gpu fields (``nvidia-smi --help-query-gpu``) -> the record's keys. Asked with
# ``--format=csv,nounits`` and read by the header, so a recording with other columns still parses.
QUERY_FIELDS = {
    "index": "index",
    "uuid": "uuid",
    "name": "name",
    "pci.bus_id": "pci_bus_id",
    "memory.total": "memory_mib",
    "driver_version": "driver",
    "vbios_version": "vbios",
    "power.limit": "power_limit_w",
    "persistence_mode": "persistence_mode",
    "clocks.applications.graphics": "app_clock_graphics_mhz",
    "clocks.applications.memory": "app_clock_memory_mhz",
    "compute_mode": "compute_mode",
}
# Valid on every driver; pci.bus_id among them, since a run's GPUs are matched by bus id where the UUID is unknown.
BASE_FIELDS = ("index", "uuid", "name", "pci.bus_id", "memory.total", "driver_version")
_ALIASES = {  # other names nvidia-smi accepts for the same fields
    "gpu_name": "name",
    "gpu_uuid": "uuid",
    "gpu_bus_id": "pci.bus_id",
    "clocks.applications.gr": "clocks.applications.graphics",
    "clocks.applications.mem": "clocks.applications.memory",
}
_NUMBERS = {"memory_mib": int, "power_limit_w": float, "app_clock_graphics_mhz": int, "app_clock_memory_mhz": int}
# nvidia-smi's words for a value it cannot give: recorded as null.
_NO_VALUE = {"", "n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]", "[insufficient permissions]"}


def collect_nvidia_smi() -> tuple[list[dict[str, Any]], str]:
    """(GPUs as the driver lists them, in its index order; problem or "").

    Each GPU: index, uuid, name, pci_bus_id (as nvidia-smi prints it), memory_mib, driver, vbios,
    power_limit_w, persistence_mode (bool), app_clock_graphics_mhz, app_clock_memory_mhz,
    compute_mode and the CUDA driver version (from ``nvidia-smi -q``'s header). A value the driver
    cannot give is None. An older driver that refuses a field is asked again for the base fields.
    """
    out, problem = _nvidia_smi(f"--query-gpu={','.join(QUERY_FIELDS)}", "--format=csv,nounits")
    note = ""
    if problem and "not a valid field" in problem:
        note = f"this nvidia-smi lacks some fields ({problem}); recorded: {', '.join(BASE_FIELDS)}"
        out, problem = _nvidia_smi(f"--query-gpu={','.join(BASE_FIELDS)}", "--format=csv,nounits")
    if problem:
        return [], problem
    gpus = parse_query_csv(out)
    header, _ = _nvidia_smi("-q", "-d", "COMPUTE")
    cuda = parse_cuda_version(header)
    for gpu in gpus:
        gpu["cuda_driver_version"] = cuda
    return gpus, note


def collect_gpus(asked: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """``collect_nvidia_smi``'s facts for the GPUs a run was given (matched by UUID or PCI bus id).

    nvidia-smi lists every GPU of the machine whatever CUDA_VISIBLE_DEVICES says; a run records
    those it was given. When it was given none (a CPU run), or not all of them are found, every GPU
    is recorded, each marked ``given`` or not, so nothing is dropped silently.
    """
    from suite.worker.identity import normalise_bus_id, normalise_uuid

    gpus, _ = collect_nvidia_smi()
    if not asked:
        return gpus
    uuids = {a.get("uuid") for a in asked} - {None}
    buses = {a.get("pci_bus_id") for a in asked} - {None}
    for gpu in gpus:
        gpu["given"] = normalise_uuid(gpu.get("uuid")) in uuids or normalise_bus_id(gpu.get("pci_bus_id")) in buses
    mine = [g for g in gpus if g["given"]]
    if len(mine) == len(asked):
        for gpu in mine:
            del gpu["given"]
        return mine
    return gpus


def _nvidia_smi(*args: str) -> tuple[str, str]:
    """(stdout, problem or "")."""
    try:
        done = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        return "", "no NVIDIA driver found (no nvidia-smi)"
    except (OSError, subprocess.SubprocessError) as exc:
        return "", f"nvidia-smi failed: {exc}"
    if done.returncode != 0:
        said = (done.stdout.strip() or done.stderr.strip())[:300]
        return "", f"nvidia-smi exited with code {done.returncode}: {said}"
    return done.stdout, ""


def parse_query_csv(text: str) -> list[dict[str, Any]]:
    """GPUs from ``nvidia-smi --query-gpu=... --format=csv`` output (with its header; units or not).

    Columns are found by the header's field names (``memory.total [MiB]`` is ``memory.total``);
    fields the output lacks are absent from the record. Without an index column, a GPU's index is
    its row: nvidia-smi lists GPUs in index order.
    """
    rows = [r for r in csv.reader(io.StringIO(text.strip()), skipinitialspace=True) if r]
    if not rows:
        return []
    names = [re.sub(r"\s*\[.*\]$", "", h.strip()) for h in rows[0]]
    names = [_ALIASES.get(n, n) for n in names]
    gpus = []
    for row_number, row in enumerate(rows[1:]):
        gpu: dict[str, Any] = {}
        for name, raw in zip(names, row, strict=False):  # a short row lacks its last fields
            key = QUERY_FIELDS.get(name)
            if key is not None:
                gpu[key] = _value(key, raw)
        gpu.setdefault("index", row_number)
        if gpu["index"] is None:
            gpu["index"] = row_number
        gpus.append(gpu)
    return gpus


def _value(key: str, raw: str) -> Any:
    text = raw.strip()
    if text.lower() in _NO_VALUE:
        return None
    if key == "index":
        return int(text)
    if key == "persistence_mode":
        return {"enabled": True, "disabled": False}.get(text.lower())
    if key in _NUMBERS:
        number = re.match(r"[-+]?\d+(?:\.\d+)?", text)  # "300.00 W" with units, "300.00" without
        if number is None:
            return None
        value = float(number.group())
        return int(value) if _NUMBERS[key] is int else value
    return text


def parse_cuda_version(text: str) -> str | None:
    """The CUDA version the driver supports, from the header of ``nvidia-smi -q`` or plain ``nvidia-smi``."""
    match = re.search(r"CUDA Version\s*:\s*([0-9][0-9.]*)", text or "")
    return match.group(1) if match else None


def collect_versions(backend: str) -> dict[str, Any]:
    import keras
    import numpy

    versions: dict[str, Any] = {"keras": keras.__version__, "numpy": numpy.__version__, "keras_backend": backend}
    try:
        import tensorflow as tf

        build = dict(tf.sysconfig.get_build_info())
        versions.update(
            tensorflow=tf.__version__,
            tf_built_with_cuda=bool(tf.test.is_built_with_cuda()),
            tf_cuda_build=build.get("cuda_version"),
            tf_cudnn_build=build.get("cudnn_version"),
        )
    except ImportError:
        versions["tensorflow"] = None
    if backend == "jax":
        import jax

        versions["jax"] = jax.__version__
    if backend == "torch":
        import torch

        versions.update(torch=torch.__version__, torch_cuda=torch.version.cuda)
    return versions


def collect_tf_devices() -> dict[str, Any]:
    import tensorflow as tf

    gpus = []
    for dev in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(dev)
        gpus.append({"name": details.get("device_name"), "compute_capability": details.get("compute_capability")})
    return {
        "logical": [d.name for d in tf.config.list_logical_devices()],
        "gpus": gpus,
        "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
        "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
        "tensor_float_32": bool(tf.config.experimental.tensor_float_32_execution_enabled()),
    }
