"""Environment facts, collected once per run by small ``collect_*`` functions (stdlib first)."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from typing import Any

_ENV_KEYS = (
    "CUDA_VISIBLE_DEVICES",
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


def collect_nvidia_smi() -> tuple[list[dict[str, Any]], str]:
    """(GPUs as the driver lists them: index, UUID, name, memory, driver; problem or "")."""
    fields = "index,uuid,name,memory.total,driver_version"
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except FileNotFoundError:
        return [], "no NVIDIA driver found (no nvidia-smi)"
    except (OSError, subprocess.SubprocessError) as exc:
        return [], f"nvidia-smi failed: {exc}"
    gpus = []
    for line in out.strip().splitlines():
        index, uuid, name, mem, driver = (p.strip() for p in line.split(","))
        gpus.append({"index": int(index), "uuid": uuid, "name": name, "memory_mib": int(float(mem)), "driver": driver})
    return gpus, ""


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
