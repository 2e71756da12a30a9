"""``python -m suite.worker spec.json result.json``: one run, one result file, always.

Runs inside the container (or as a local subprocess). Imports only the standard library, numpy
and the framework: never the host side (yaml, docker, tabulate), which a test enforces.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

T_START = time.time()  # as early as possible: the host's launch time is compared with it
DEADLINE_ENV = "SUITE_DEADLINE_S"  # seconds after start at which the worker ends itself
DEADLINE_EXIT_CODE = 124  # as timeout(1): the worker gave up at its own deadline
HARD_STOP_S = 10  # after the deadline, the kernel ends the process even if Python cannot run


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m suite.worker spec.json result.json", file=sys.stderr)
        return 2
    spec_path, result_path = argv
    from suite.worker import lifeline  # here, not at the top: T_START is taken first

    lifeline.end_with_parent()  # first: a host that dies while TensorFlow loads takes this worker with it
    record: dict[str, Any] = {"status": "error", "message": ""}
    record.update({section: {} for section in ("timing", "quality", "work", "environment")})
    own_deadline = _arm_own_deadline(result_path)
    try:
        with open(spec_path, encoding="utf-8") as fh:
            spec = json.load(fh)
        from suite.worker.timing import emit

        emit({"event": "phase", "phase": "setup"})
        from suite.worker.train import run

        run(spec, record)
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a status, written below
        record["status"] = _classify(exc)
        record["message"] = f"{type(exc).__name__}: {exc}"[:4000]
        record["traceback"] = traceback.format_exc()[-8000:]
        traceback.print_exc()
    if own_deadline is not None:
        own_deadline.cancel()
    _write(result_path, record)
    return 0 if record["status"] == "ok" else 1


def _arm_own_deadline(result_path: str) -> threading.Timer | None:
    """End this process at SUITE_DEADLINE_S, whoever is left to watch it.

    The host enforces the run's limit itself and sets this a little later: it matters when the
    host is gone (killed, or its link to a remote engine lost), so no run outlives its limit.
    A timer thread writes a ``timeout`` result and exits; as a backstop, SIGALRM with its default
    action ends the process a little later even if the timer thread never gets the interpreter.
    """
    try:
        seconds = float(os.environ.get(DEADLINE_ENV, ""))
    except ValueError:
        return None
    if not seconds > 0:
        return None

    def give_up() -> None:
        record: dict[str, Any] = {
            "status": "timeout",
            "message": f"the worker ended itself at its own deadline of {seconds:g} s",
        }
        record.update({section: {} for section in ("timing", "quality", "work", "environment")})
        try:
            _write(result_path, record)
        finally:
            os._exit(DEADLINE_EXIT_CODE)

    timer = threading.Timer(seconds, give_up)
    timer.daemon = True
    timer.start()
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(int(math.ceil(seconds)) + HARD_STOP_S)
    return timer


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
