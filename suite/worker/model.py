"""Build and compile the model from the spec, every knob explicit; count its FLOPs analytically.

What differs between kinds of model lives in ``suite.worker.kinds``; these functions dispatch on
``model.kind``.
"""

from __future__ import annotations

from typing import Any

from suite.worker import kinds

# Registries: YAML names -> Keras classes (resolved lazily, after the backend is chosen).
OPTIMIZERS = {
    "nadam": "Nadam",
    "rmsprop": "RMSprop",
    "adam": "Adam",
    "adamw": "AdamW",
    "sgd": "SGD",
    "adagrad": "Adagrad",
}


# What the MLP's count includes; each kind states its own (``flops_counted``).
FLOPS_COUNTED = kinds.MLP_FLOPS_COUNTED


def flops_counted(model_cfg: dict[str, Any]) -> str:
    """What ``flops_per_example`` counts for this model's kind, in words."""
    return kinds.kind_of(model_cfg).flops_counted


def flops_per_example(model_cfg: dict[str, Any]) -> dict[str, int]:
    """Exact FLOPs of one training step per example ("train") and of the forward pass, by the model's kind.

    tests/test_flops.py checks each kind's count against XLA's cost analysis of the compiled step.
    """
    return kinds.kind_of(model_cfg).flops_per_example(model_cfg)


def parameter_count(model_cfg: dict[str, Any]) -> int:
    return kinds.kind_of(model_cfg).parameter_count(model_cfg)


def build(keras: Any, model_cfg: dict[str, Any]) -> Any:
    return kinds.kind_of(model_cfg).build(keras, model_cfg)


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
