"""Model kinds: one registry, each kind owning its keys, build, exact FLOP count and step-cost probe.

A kind's settings are declared as data, one JSON Schema fragment per key (with its default): the
host's scenario checker and ``python -m suite schema`` read them from here, the worker builds from
them. Standard library only at import time, so the host imports this without Keras; ``build``
receives the ``keras`` module from its caller, after the backend is chosen.

The data reaches every model as flat float vectors of ``PIXELS`` values (``suite.worker.data``);
a kind that wants images reshapes them in its first layer.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from suite.worker.data import CLASSES, PIXELS

SIDE = 28  # MNIST digits are SIDE x SIDE x 1
ACTIVATIONS = ("relu", "tanh", "sigmoid", "gelu", "elu", "linear")
OUTPUT_ACTIVATIONS = ("softmax",)
POOLS = ("max", "none")
MAX_CONV_LAYERS = 4  # with 2x2 pooling after each conv, 28 -> 14 -> 7 -> 3 -> 1
# Upper bounds, far above any model these questions need, that refuse a typo before a run: two dense
# layers of MAX_WIDTH hold 4.3 G weights (17 GB as float32), MAX_FILTERS conv filters a 4096x4096 kernel.
MAX_WIDTH = 65_536
MAX_FILTERS = 4096
MAX_LAYERS = 64

# Keys every kind shares, with the same meaning and fragment (a test holds the kinds to that).
_ACTIVATION = {"enum": list(ACTIVATIONS), "default": "relu", "description": "activation of every hidden layer"}
_DROPOUT = {
    "type": "number",
    "minimum": 0,
    "exclusiveMaximum": 1,
    "default": 0.0,
    "description": "dropout rate after every hidden dense layer",
}
_OUTPUT = {"enum": list(OUTPUT_ACTIVATIONS), "default": "softmax", "description": "activation of the output layer"}


@dataclass(frozen=True)
class ModelKind:
    """What the suite needs of one kind of model; every function takes the scenario's ``model`` section."""

    name: str
    description: str
    keys: dict[str, dict[str, Any]]  # key -> JSON Schema fragment with its default; the closed key set
    axis_names: dict[str, str]  # matrix path -> the name reports give the axis
    flops_counted: str  # what flops_per_example counts, in words (it goes into every result)
    build: Callable[[Any, dict[str, Any]], Any]  # (keras, model_cfg) -> uncompiled Keras model
    flops_per_example: Callable[[dict[str, Any]], dict[str, int]]  # {"forward": .., "train": ..}
    parameter_count: Callable[[dict[str, Any]], int]
    floor_config: Callable[[dict[str, Any]], dict[str, Any]]  # the step-cost probe's model: arithmetic taken away

    def defaults(self) -> dict[str, Any]:
        return {key: copy.deepcopy(frag["default"]) for key, frag in self.keys.items()}


# --------------------------------------------------------------------------- mlp


def layer_sizes(model_cfg: dict[str, Any]) -> list[int]:
    return [PIXELS, *model_cfg["hidden"], CLASSES]


def _dense_products(sizes: list[int]) -> list[int]:
    return [2 * a * b for a, b in zip(sizes, sizes[1:], strict=False)]


MLP_FLOPS_COUNTED = (
    "dense-layer matmuls of one training step per example: forward 2ab per layer, weight gradient 2ab per "
    "layer, input gradient 2ab per layer but the first (its input is data, whose gradient is never formed); "
    "bias, activation, dropout, loss and optimizer updates (O(width), not O(width^2)) left out"
)


def _mlp_flops(model_cfg: dict[str, Any]) -> dict[str, int]:
    """FLOPs of the dense layers' matrix products, one multiply-add counted as 2.

    The train step computes, per Dense layer a -> b: the forward product (2ab per example), the
    weight gradient (2ab), and the gradient with respect to its input (2ab) for every layer but
    the first: the first layer's input is the data, and both TensorFlow's tape and XLA skip a
    gradient nobody asked for. "3 x forward" overcounts by the first layer's 2ab, a third of the
    total for the MNIST MLPs, whose first layer dominates. tests/test_flops.py checks this count
    against XLA's cost analysis of the compiled training step.
    """
    products = _dense_products(layer_sizes(model_cfg))
    forward = sum(products)
    return {"forward": forward, "train": 2 * forward + forward - products[0]}


def _mlp_parameters(model_cfg: dict[str, Any]) -> int:
    sizes = layer_sizes(model_cfg)
    return sum(a * b + b for a, b in zip(sizes, sizes[1:], strict=False))


def _mlp_build(keras: Any, model_cfg: dict[str, Any]) -> Any:
    layers = [keras.Input(shape=(PIXELS,))]
    for width in model_cfg["hidden"]:
        layers.append(keras.layers.Dense(width, activation=model_cfg["activation"]))
        if model_cfg["dropout"]:
            layers.append(keras.layers.Dropout(model_cfg["dropout"]))
    # float32 output keeps softmax and the loss stable under mixed precision.
    layers.append(keras.layers.Dense(CLASSES, activation=model_cfg["output_activation"], dtype="float32"))
    return keras.Sequential(layers, name="mlp")


MLP = ModelKind(
    name="mlp",
    description="dense layers on the 784 pixels",
    keys={
        "kind": {"const": "mlp", "default": "mlp", "description": "the kind of model"},
        "hidden": {
            "type": "array",
            "items": {"type": "integer", "minimum": 1, "maximum": MAX_WIDTH},
            "minItems": 1,
            "maxItems": MAX_LAYERS,
            "default": [512],
            "description": "widths of the hidden dense layers, first to last",
        },
        "activation": _ACTIVATION,
        "dropout": _DROPOUT,
        "output_activation": _OUTPUT,
    },
    axis_names={"model.hidden.0": "width"},
    flops_counted=MLP_FLOPS_COUNTED,
    build=_mlp_build,
    flops_per_example=_mlp_flops,
    parameter_count=_mlp_parameters,
    # Same depth, activation, dropout and output; every width 1.
    floor_config=lambda cfg: {**cfg, "hidden": [1] * len(cfg["hidden"])},
)


# --------------------------------------------------------------------------- cnn


def _same_taps(n: int, k: int) -> int:
    """Pairs (output position, kernel tap) along one axis of a stride-1 'same' convolution that land
    on the input rather than on its zero padding: the multiply-adds a convolution really does."""
    before = (k - 1) // 2
    return sum(1 for o in range(n) for t in range(k) if 0 <= o + t - before < n)


def conv_shapes(model_cfg: dict[str, Any]) -> list[tuple[int, int, int, int]]:
    """(side, kernel, in channels, out channels) of every conv layer, its side the input's (and, with
    'same' padding, its output's)."""
    side, cin, out = SIDE, 1, []
    for f in model_cfg["filters"]:
        out.append((side, model_cfg["kernel_size"], cin, f))
        cin = f
        if model_cfg["pool"] == "max":
            side //= 2
    return out


def _cnn_head(model_cfg: dict[str, Any]) -> list[int]:
    side, _, _, cout = conv_shapes(model_cfg)[-1]
    if model_cfg["pool"] == "max":
        side //= 2
    return [side * side * cout, model_cfg["dense"], CLASSES]


CNN_FLOPS_COUNTED = (
    "conv and dense products of one training step per example: per conv layer (stride 1, 'same' padding) "
    "2*cin*cout times the (output pixel, kernel tap) pairs that land on the image, not its zero padding "
    "(k*k*H*W less the border), for the forward pass, the same for the weight gradient, and the same for "
    "the input gradient of every conv but the first (its input is data); dense layers as an MLP's, each "
    "with its input gradient; bias, activation, pooling, dropout, loss and optimizer updates left out"
)


def _cnn_flops(model_cfg: dict[str, Any]) -> dict[str, int]:
    """Exact multiply-adds (x2) of the conv and dense layers; tests/test_flops.py checks them against XLA."""
    conv = [2 * cin * cout * _same_taps(side, k) ** 2 for side, k, cin, cout in conv_shapes(model_cfg)]
    dense = _dense_products(_cnn_head(model_cfg))
    forward = sum(conv) + sum(dense)
    # Weight gradients: one more of each product; input gradients: every product but the first conv's.
    return {"forward": forward, "train": 3 * forward - conv[0]}


def _cnn_parameters(model_cfg: dict[str, Any]) -> int:
    conv = sum(k * k * cin * cout + cout for _, k, cin, cout in conv_shapes(model_cfg))
    sizes = _cnn_head(model_cfg)
    return conv + sum(a * b + b for a, b in zip(sizes, sizes[1:], strict=False))


def _cnn_build(keras: Any, model_cfg: dict[str, Any]) -> Any:
    layers = [keras.Input(shape=(PIXELS,)), keras.layers.Reshape((SIDE, SIDE, 1))]
    for f in model_cfg["filters"]:
        layers.append(
            keras.layers.Conv2D(f, model_cfg["kernel_size"], padding="same", activation=model_cfg["activation"])
        )
        if model_cfg["pool"] == "max":
            layers.append(keras.layers.MaxPooling2D(2))
    layers += [keras.layers.Flatten(), keras.layers.Dense(model_cfg["dense"], activation=model_cfg["activation"])]
    if model_cfg["dropout"]:
        layers.append(keras.layers.Dropout(model_cfg["dropout"]))
    layers.append(keras.layers.Dense(CLASSES, activation=model_cfg["output_activation"], dtype="float32"))
    return keras.Sequential(layers, name="cnn")


CNN = ModelKind(
    name="cnn",
    description="conv layers on the 28x28x1 digit, each followed by 2x2 max pooling, then a dense head",
    keys={
        "kind": {"const": "cnn", "default": "cnn", "description": "the kind of model"},
        "filters": {
            "type": "array",
            "items": {"type": "integer", "minimum": 1, "maximum": MAX_FILTERS},
            "minItems": 1,
            "maxItems": MAX_CONV_LAYERS,
            "default": [32, 64],
            "description": "filters of the conv layers (stride 1, 'same' padding), first to last",
        },
        "kernel_size": {
            "type": "integer",
            "minimum": 1,
            "maximum": 7,
            "default": 3,
            "description": "k of every k x k kernel",
        },
        "pool": {
            "enum": list(POOLS),
            "default": "max",
            "description": "2x2 max pooling after every conv layer, or none",
        },
        "dense": {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_WIDTH,
            "default": 128,
            "description": "width of the dense layer after the convs",
        },
        "activation": _ACTIVATION,
        "dropout": {**_DROPOUT, "description": "dropout rate after the dense layer"},
        "output_activation": _OUTPUT,
    },
    axis_names={"model.filters": "filters", "model.filters.0": "filters", "model.dense": "dense"},
    flops_counted=CNN_FLOPS_COUNTED,
    build=_cnn_build,
    flops_per_example=_cnn_flops,
    parameter_count=_cnn_parameters,
    # Same depth, kernel, pooling, activation, dropout and output; one filter per conv, dense width 1.
    floor_config=lambda cfg: {**cfg, "filters": [1] * len(cfg["filters"]), "dense": 1},
)


KINDS: dict[str, ModelKind] = {k.name: k for k in (MLP, CNN)}
DEFAULT_KIND = "mlp"


def kind_of(model_cfg: dict[str, Any]) -> ModelKind:
    """The kind a model section names (the default kind when it names none)."""
    return KINDS[model_cfg.get("kind", DEFAULT_KIND)]


def axis_name(path: str) -> str | None:
    """The name a kind gives a matrix path (model.hidden.0 -> width), or None when no kind names it."""
    return next((k.axis_names[path] for k in KINDS.values() if path in k.axis_names), None)
