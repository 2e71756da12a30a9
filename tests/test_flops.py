"""The training-FLOP count against the compiler's: XLA's cost analysis of the compiled train step.

The reference is XLA's ``HloCostAnalysis`` (through JAX: ``jit(step).lower(...).compile()
.cost_analysis()``), which counts every dot as 2*M*N*K plus one FLOP per elementwise operation, of
the step the suite's own Keras model computes: forward pass in training mode, loss, gradients of
every weight, an SGD update. The analytic count leaves out the elementwise terms, so it must sit a
little below XLA's, within 5%. Dropout is off here: its random bits come from XLA's threefry
generator, dozens of integer operations per unit that the cost analysis counts as FLOPs (at width
100 they add 5% to the step), which are not the model's arithmetic.

Each kind of model (``suite.worker.kinds``) is held to the same reference. For the CNN the residual
is the elementwise work on its activation maps (bias, ReLU, max pooling and its gradient), which
scales with the maps rather than with the products: 6.7% of the step at filters [8, 16], under 5%
from [16, 32] on. Its convolutions alone are counted exactly: each conv layer's count equals XLA's
for that convolution by itself, and for each of its two gradient convolutions (with respect to the
weights and to the input).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from conftest import REPO

from suite.worker import kinds
from suite.worker import model as model_mod

SHAPES = {
    "784-100-150-50-50-10": [100, 150, 50, 50],
    "784-750-150-50-50-10": [750, 150, 50, 50],
    "784-2000-150-50-50-10": [2000, 150, 50, 50],
    "784-4096-2048-512-64-10": [4096, 2048, 512, 64],
    "784-64-10": [64],
}
MLP = {"activation": "relu", "dropout": 0.0, "output_activation": "softmax"}
CNN = {"kind": "cnn", "kernel_size": 3, "pool": "max", "dense": 128, **MLP}
CONFIGS = {name: {"hidden": hidden, **MLP} for name, hidden in SHAPES.items()}
CONFIGS.update(
    {
        f"cnn {filters} k{k} pool {pool}": {**CNN, "filters": filters, "kernel_size": k, "pool": pool}
        for filters, k, pool in [
            ([16, 32], 3, "max"),
            ([32, 64], 3, "max"),
            ([64, 128], 3, "max"),
            ([16], 5, "none"),
            ([8, 16, 32, 64], 5, "max"),
        ]
    }
)
# The smallest CNN of scenarios/mnist_cnn_filters.yaml: its elementwise work is 6.7% of XLA's count.
CNN_SMALL = ("cnn [8, 16]", {**CNN, "filters": [8, 16]}, 0.07)
BATCH = 128

XLA_COUNT = r"""
import json, sys
import jax, jax.numpy as jnp, keras
from suite.worker import model as model_mod

batch = int(sys.argv[2])
out = {}
for name, cfg in json.loads(sys.argv[1]).items():
    model = model_mod.build(keras, cfg)
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
        [sys.executable, "-c", XLA_COUNT, json.dumps({**CONFIGS, CNN_SMALL[0]: CNN_SMALL[1]}), str(BATCH)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", list(CONFIGS))
def test_training_flops_within_5_percent_of_xla(name: str, xla_flops: dict[str, float]) -> None:
    counted = model_mod.flops_per_example(CONFIGS[name])["train"]
    compiler = xla_flops[name]
    assert counted <= compiler, "the analytic count leaves out XLA's elementwise terms, so it cannot exceed it"
    assert counted == pytest.approx(compiler, rel=0.05), (name, counted, compiler)


def test_small_cnn_residual_is_its_elementwise_work(xla_flops: dict[str, float]) -> None:
    name, cfg, residual = CNN_SMALL
    counted, compiler = model_mod.flops_per_example(cfg)["train"], xla_flops[name]
    assert counted <= compiler
    assert counted == pytest.approx(compiler, rel=residual), (name, counted, compiler)


CONV_COUNT = r"""
import json, sys
import jax, jax.numpy as jnp
from jax import lax
out = []
for side, k, cin, cout in json.loads(sys.argv[1]):
    x, w = jnp.zeros((1, side, side, cin)), jnp.zeros((k, k, cin, cout))
    conv = lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    input_grad = lambda x, w, g: jax.vjp(lambda x: conv(x, w), x)[1](g)[0]
    weight_grad = lambda x, w, g: jax.vjp(lambda w: conv(x, w), w)[1](g)[0]
    def flops(f, *args):
        cost = jax.jit(f).lower(*args).compile().cost_analysis()
        return (cost[0] if isinstance(cost, list) else cost)["flops"]
    g = jnp.zeros((1, side, side, cout))
    out.append([flops(conv, x, w), flops(weight_grad, x, w, g), flops(input_grad, x, w, g)])
print(json.dumps(out))
"""


def test_each_conv_layer_counted_exactly_as_xla_counts_it() -> None:
    """Conv counts, padding taps left out, against XLA's count of each convolution alone: the forward
    one and its two gradients, which the training count takes to cost the same (the input gradient
    for every conv but the first)."""
    if importlib.util.find_spec("jax") is None:
        pytest.skip("jax is not installed (requirements/dev.txt installs it)")
    cfgs = [
        {**CNN, "filters": [8, 16, 32, 64], "kernel_size": k, "pool": pool} for k in (3, 5, 7) for pool in kinds.POOLS
    ]
    layers = [shape for cfg in cfgs for shape in kinds.conv_shapes(cfg)]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", CONV_COUNT, json.dumps(layers)], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    compiler = json.loads(proc.stdout.strip().splitlines()[-1])
    for (side, k, cin, cout), (forward, weight_grad, input_grad) in zip(layers, compiler, strict=True):
        counted = 2 * cin * cout * kinds._same_taps(side, k) ** 2
        assert counted == forward, ((side, k, cin, cout), counted, forward)
        assert counted == weight_grad, ("weight gradient", (side, k, cin, cout), counted, weight_grad)
        assert counted == input_grad, ("input gradient", (side, k, cin, cout), counted, input_grad)
        assert counted < 2 * k * k * cin * cout * side * side  # taps on the zero padding are not arithmetic


def test_cnn_count_by_hand() -> None:
    # filters [8, 16], k 3, pooling, dense 128: 28x28 has 82 taps a side, 14x14 has 40.
    cfg = {**CNN, "filters": [8, 16]}
    conv1, conv2 = 2 * 1 * 8 * 82**2, 2 * 8 * 16 * 40**2
    dense = 2 * 7 * 7 * 16 * 128 + 2 * 128 * 10
    flops = model_mod.flops_per_example(cfg)
    assert flops["forward"] == conv1 + conv2 + dense
    assert flops["train"] == 3 * (conv1 + conv2 + dense) - conv1


def test_first_layer_has_no_input_gradient() -> None:
    # 784-750-150-50-50-10: products 2ab = 1,176,000 + 225,000 + 15,000 + 5,000 + 1,000.
    flops = model_mod.flops_per_example({"hidden": [750, 150, 50, 50]})
    assert flops["forward"] == 1_422_000
    assert flops["train"] == 3 * 1_422_000 - 1_176_000 == 3_090_000
