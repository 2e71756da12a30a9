"""Where the time goes: the device's calibrated peak, and the fixed cost of one training step.

Both run in the worker after the timed ``fit``, in the same process, image and device set, so
they see exactly what the measured run saw.
"""

from __future__ import annotations

import time
from typing import Any

# Square matmul sizes: big enough to saturate the device, small enough to finish in about a second.
MATMUL_N = {"cpu": 2048, "gpu": 8192}
PEAK_SECONDS = 1.0


def peak_flops(keras: Any, kind: str) -> dict[str, Any]:
    """Float32 matmul throughput of one device: the best of repeated timed batches of matmuls."""
    n = MATMUL_N[kind]
    ops = keras.ops
    a = keras.random.normal((n, n), dtype="float32", seed=1)
    b = keras.random.normal((n, n), dtype="float32", seed=2)
    ops.convert_to_numpy(ops.matmul(a, b)[0, 0])  # warm-up: kernel selection, allocation
    best, reps, deadline = 0.0, 1, time.perf_counter() + PEAK_SECONDS
    while time.perf_counter() < deadline:
        t = time.perf_counter()
        c = a
        for _ in range(reps):
            c = ops.matmul(c, b) * (1.0 / n)  # chained so none can be skipped; scaled to stay finite
        ops.convert_to_numpy(c[0, 0])  # one sync for the batch
        elapsed = time.perf_counter() - t
        best = max(best, reps * 2 * n**3 / elapsed)
        reps = min(reps * 2, 64)
    return {"flops_per_s": best, "matmul_n": n, "dtype": "float32", "device_kind": kind}


def step_floor(
    keras: Any, build: Any, compile_model: Any, fit_inputs: dict[str, Any], training: dict[str, Any], scope: Any
) -> dict[str, Any]:
    """Time per step of a near-empty model (one hidden unit) with the same data, batch and settings.

    What is left when the arithmetic is taken away: Python and runtime dispatch, kernel launches,
    input copies, synchronisation, all-reduce of a few weights. Two epochs; the second is timed.
    """
    from suite.worker.timing import epoch_timer

    with scope:
        tiny = build(keras, {"hidden": [1], "activation": "relu", "dropout": 0.0, "output_activation": "softmax"})
        compile_model(keras, tiny, training)
    timer = epoch_timer(keras)
    tiny.fit(*fit_inputs["xy"], epochs=2, verbose=0, callbacks=[timer], **fit_inputs["kw"])
    return {"epoch_s": timer.epoch_s[-1]}
