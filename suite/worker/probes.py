"""Where the time goes: the device's calibrated peak, and the fixed cost of one training step.

Both run in the worker after the timed ``fit``, in the same process, image and device set, so
they see exactly what the measured run saw.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

# Square matmul sizes: big enough to saturate the device, small enough to time in a few seconds.
MATMUL_N = {"cpu": 2048, "gpu": 8192}
BATCH_SECONDS = 0.2  # each timed batch of chained matmuls lasts about this long
BATCHES = 7  # timed batches; the figure is their median
MAX_CHAIN = 512
# jax_default_matmul_precision values that keep float32 matmuls in full float32 (no TF32 passes).
JAX_FULL_FLOAT32 = ("float32", "highest", "precision.highest", "f32_f32_f32", "f64_f64_f64")
FLOOR_EPOCHS = 4  # the step-cost probe trains this many epochs; the first (tracing) is left out


def peak_flops(keras: Any, kind: str, dtype: str) -> dict[str, Any]:
    """Matmul throughput of one device in the run's compute dtype: the median of timed batches.

    Each batch chains ``c = c @ q`` with ``q`` orthogonal, so every product depends on the last
    (none can be skipped or overlapped away) and ``c`` keeps its norm: its entries stay O(1)
    however long the chain. (Scaling by 1/n instead lets them decay to zero within ~20 links, and
    multiplying zeros draws less power on a GPU, which inflates the peak.)
    """
    n = MATMUL_N[kind]
    ops = keras.ops
    a = keras.random.normal((n, n), dtype="float32", seed=1)
    q, _ = ops.qr(keras.random.normal((n, n), dtype="float32", seed=2))
    a, q = ops.cast(a, dtype), ops.cast(q, dtype)

    def chain(links: int) -> float:
        t = time.perf_counter()
        c = a
        for _ in range(links):
            c = ops.matmul(c, q)
        ops.convert_to_numpy(ops.cast(c[0, 0], "float32"))  # one sync for the batch (numpy has no bfloat16)
        return time.perf_counter() - t

    chain(1)  # warm-up: kernel selection, allocation
    links = 1
    while links < MAX_CHAIN and chain(links) < BATCH_SECONDS / 2:
        links *= 2
    rates = [links * 2 * n**3 / chain(links) for _ in range(BATCHES)]
    c = a
    for _ in range(links):
        c = ops.matmul(c, q)
    rms = float(ops.convert_to_numpy(ops.sqrt(ops.mean(ops.square(ops.cast(c, "float32"))))))
    return {
        "flops_per_s": statistics.median(rates),
        "batches_flops_per_s": rates,
        "chain_links": links,
        "matmul_n": n,
        "dtype": dtype,
        "device_kind": kind,
        "rms_after_chain": rms,  # about 1 (the inputs' scale): the values did not decay
        "tf32": _tf32(keras) if kind == "gpu" and dtype == "float32" else None,
    }


def _tf32(keras: Any) -> bool | None:
    """Whether float32 matmuls may run as TF32 on Ampere and later GPUs, as the backend is set.

    TensorFlow: on by default. JAX: its default matmul precision lets XLA use TF32 for float32 on
    those GPUs; only "float32"/"highest" forbid it. PyTorch: off by default for matmuls.
    """
    backend = keras.config.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return bool(tf.config.experimental.is_tensor_float_32_execution_enabled())
    if backend == "jax":
        import jax

        precision = jax.config.jax_default_matmul_precision
        return str(precision).lower() not in JAX_FULL_FLOAT32
    if backend == "torch":
        import torch

        return bool(torch.backends.cuda.matmul.allow_tf32)
    return None


def floor_config(model_cfg: dict[str, Any]) -> dict[str, Any]:
    """The model with its arithmetic taken away, as its kind defines it: an MLP with every hidden width
    1, a CNN with one filter per conv and a dense width of 1; same depth, activation, dropout, output."""
    from suite.worker.kinds import kind_of

    return kind_of(model_cfg).floor_config(model_cfg)


def step_floor(
    keras: Any,
    build: Any,
    compile_model: Any,
    fit_inputs: dict[str, Any],
    model_cfg: dict[str, Any],
    training: dict[str, Any],
    scope: Any,
) -> dict[str, Any]:
    """Epoch times of the model with its arithmetic taken away, trained exactly as the model was.

    Same depth, activation, dropout, optimizer, data, batch, steps_per_execution, dtype policy and
    device set; only the widths are 1. What is left: Python and runtime dispatch, kernel launches,
    input copies, synchronisation, all-reduce of a few weights. The first epoch (tracing) is left
    out and the median of the rest taken.
    """
    from suite.worker.timing import epoch_timer

    with scope:
        tiny = build(keras, floor_config(model_cfg))
        compile_model(keras, tiny, training)
    timer = epoch_timer(keras)
    tiny.fit(*fit_inputs["xy"], epochs=FLOOR_EPOCHS, verbose=0, callbacks=[timer], **fit_inputs["kw"])
    timed = timer.epoch_s[1:]
    return {"epoch_s": statistics.median(timed), "epochs_s": timed}
