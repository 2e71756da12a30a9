"""The training-FLOP count against the compiler's: XLA's cost analysis of the compiled train step.

The reference is XLA's ``HloCostAnalysis`` (through JAX: ``jit(step).lower(...).compile()
.cost_analysis()``), which counts every dot as 2*M*N*K plus one FLOP per elementwise operation, of
the step the suite's own Keras model computes: forward pass in training mode, loss, gradients of
every weight, an SGD update. The analytic count leaves out the elementwise terms, so it must sit a
little below XLA's, within 5%. Dropout is off here: its random bits come from XLA's threefry
generator, dozens of integer operations per unit that the cost analysis counts as FLOPs (at width
100 they add 5% to the step), which are not the model's arithmetic.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from conftest import REPO

from suite.worker import model as model_mod

SHAPES = {
    "784-100-150-50-50-10": [100, 150, 50, 50],
    "784-750-150-50-50-10": [750, 150, 50, 50],
    "784-2000-150-50-50-10": [2000, 150, 50, 50],
    "784-4096-2048-512-64-10": [4096, 2048, 512, 64],
    "784-64-10": [64],
}
BATCH = 128

XLA_COUNT = r"""
import json, sys
import jax, jax.numpy as jnp, keras
from suite.worker import model as model_mod

batch = int(sys.argv[2])
out = {}
for name, hidden in json.loads(sys.argv[1]).items():
    model = model_mod.build(keras, {"hidden": hidden, "activation": "relu", "dropout": 0.0,
                                    "output_activation": "softmax"})
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]

    def loss_fn(weights, x, y):
        probs, _ = model.stateless_call(weights, non_trainable, x, training=True)
        return keras.losses.categorical_crossentropy(y, probs).mean()

    def step(weights, x, y):
        grads = jax.grad(loss_fn)(weights, x, y)
        return [w - 0.01 * g for w, g in zip(weights, grads)]

    x = jnp.zeros((batch, 784), jnp.float32)
    y = jnp.zeros((batch, 10), jnp.float32)
    cost = jax.jit(step).lower(trainable, x, y).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost  # a list before jax 0.4.38
    out[name] = cost["flops"] / batch
    print(name, out[name], file=sys.stderr)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def xla_flops() -> dict[str, float]:
    if importlib.util.find_spec("jax") is None:
        pytest.skip("jax is not installed (requirements/dev.txt installs it): no XLA cost analysis to check against")
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", XLA_COUNT, json.dumps(SHAPES), str(BATCH)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", list(SHAPES))
def test_training_flops_within_5_percent_of_xla(name: str, xla_flops: dict[str, float]) -> None:
    counted = model_mod.flops_per_example({"hidden": SHAPES[name]})["train"]
    compiler = xla_flops[name]
    assert counted <= compiler, "the analytic count leaves out XLA's elementwise terms, so it cannot exceed it"
    assert counted == pytest.approx(compiler, rel=0.05), (name, counted, compiler)


def test_first_layer_has_no_input_gradient() -> None:
    # 784-750-150-50-50-10: products 2ab = 1,176,000 + 225,000 + 15,000 + 5,000 + 1,000.
    flops = model_mod.flops_per_example({"hidden": [750, 150, 50, 50]})
    assert flops["forward"] == 1_422_000
    assert flops["train"] == 3 * 1_422_000 - 1_176_000 == 3_090_000
