"""Build and compile the model from the spec, every knob explicit; count its FLOPs analytically."""

from __future__ import annotations

from typing import Any

from suite.worker.data import CLASSES, PIXELS

# Registries: YAML names -> Keras classes (resolved lazily, after the backend is chosen).
OPTIMIZERS = {
    "nadam": "Nadam",
    "rmsprop": "RMSprop",
    "adam": "Adam",
    "adamw": "AdamW",
    "sgd": "SGD",
    "adagrad": "Adagrad",
}


def layer_sizes(model_cfg: dict[str, Any]) -> list[int]:
    return [PIXELS, *model_cfg["hidden"], CLASSES]


FLOPS_COUNTED = (
    "dense-layer matmuls of one training step per example: forward 2ab per layer, weight gradient 2ab per "
    "layer, input gradient 2ab per layer but the first (its input is data, whose gradient is never formed); "
    "bias, activation, dropout, loss and optimizer updates (O(width), not O(width^2)) left out"
)


def flops_per_example(model_cfg: dict[str, Any]) -> dict[str, int]:
    """FLOPs of the dense layers' matrix products, one multiply-add counted as 2.

    The train step computes, per Dense layer a -> b: the forward product (2ab per example), the
    weight gradient (2ab), and the gradient with respect to its input (2ab) for every layer but
    the first: the first layer's input is the data, and both TensorFlow's tape and XLA skip a
    gradient nobody asked for. "3 x forward" overcounts by the first layer's 2ab, a third of the
    total for the MNIST MLPs, whose first layer dominates. tests/test_flops.py checks this count
    against XLA's cost analysis of the compiled training step.
    """
    sizes = layer_sizes(model_cfg)
    products = [2 * a * b for a, b in zip(sizes, sizes[1:], strict=False)]
    forward = sum(products)
    return {"forward": forward, "train": 2 * forward + forward - products[0]}


def parameter_count(model_cfg: dict[str, Any]) -> int:
    sizes = layer_sizes(model_cfg)
    return sum(a * b + b for a, b in zip(sizes, sizes[1:], strict=False))


def build(keras: Any, model_cfg: dict[str, Any]) -> Any:
    layers = [keras.Input(shape=(PIXELS,))]
    for width in model_cfg["hidden"]:
        layers.append(keras.layers.Dense(width, activation=model_cfg["activation"]))
        if model_cfg["dropout"]:
            layers.append(keras.layers.Dropout(model_cfg["dropout"]))
    # float32 output keeps softmax and the loss stable under mixed precision.
    layers.append(keras.layers.Dense(CLASSES, activation=model_cfg["output_activation"], dtype="float32"))
    return keras.Sequential(layers, name="mlp")


def compile_model(keras: Any, model: Any, training: dict[str, Any]) -> dict[str, Any]:
    """Compile with every setting stated; return the settings as Keras holds them after compile."""
    cls = getattr(keras.optimizers, OPTIMIZERS[training["optimizer"]])
    optimizer = cls() if training["learning_rate"] is None else cls(learning_rate=training["learning_rate"])
    model.compile(
        optimizer=optimizer,
        loss=training["loss"],
        metrics=["accuracy"],
        jit_compile=bool(training["jit_compile"]),
        steps_per_execution=int(training["steps_per_execution"]),
        run_eagerly=False,
    )
    return {
        "optimizer": type(optimizer).__name__,
        "learning_rate": float(keras.ops.convert_to_numpy(optimizer.learning_rate)),
        "jit_compile": bool(getattr(model, "jit_compile", training["jit_compile"])),
        "steps_per_execution": int(getattr(model, "steps_per_execution", training["steps_per_execution"])),
        "dtype_policy": keras.config.dtype_policy().name,
    }
