"""``python -m suite.worker spec.json result.json``: one run, one result file, always.

Runs inside the container (or as a local subprocess). Imports only the standard library, numpy
and the framework: never the host side (yaml, docker, tabulate), which a test enforces.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback
from typing import Any

T_START = time.time()  # as early as possible: the host's launch time is compared with it


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m suite.worker spec.json result.json", file=sys.stderr)
        return 2
    spec_path, result_path = argv
    record: dict[str, Any] = {"status": "error", "message": ""}
    record.update({section: {} for section in ("timing", "quality", "work", "environment")})
    try:
        with open(spec_path, encoding="utf-8") as fh:
            spec = json.load(fh)
        from suite.worker.train import run

        run(spec, record)
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a status, written below
        record["status"] = _classify(exc)
        record["message"] = f"{type(exc).__name__}: {exc}"[:4000]
        record["traceback"] = traceback.format_exc()[-8000:]
        traceback.print_exc()
    _write(result_path, record)
    return 0 if record["status"] == "ok" else 1


def _classify(exc: BaseException) -> str:
    from suite.worker.train import DeviceMismatch

    if isinstance(exc, DeviceMismatch):
        return "device_mismatch"
    # By name: the class lives in tensorflow, which may be absent (jax, torch backends).
    names = {cls.__name__ for cls in type(exc).__mro__}
    if "ResourceExhaustedError" in names or "OutOfMemoryError" in names:
        return "gpu_oom"
    text = str(exc)
    if "RESOURCE_EXHAUSTED" in text or "CUDA out of memory" in text:
        return "gpu_oom"
    return "error"


def _write(path: str, record: dict[str, Any]) -> None:
    record["timing"]["worker_start_unix"] = T_START
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(_finite(record), fh, indent=1, sort_keys=True)
    os.replace(tmp, path)


def _finite(value: Any) -> Any:
    """JSON has no NaN: a NaN loss is stored as null (the status already says nan_loss)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
