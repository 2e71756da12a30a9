"""The run itself: devices, data, model, timed ``fit``, evaluation, facts. Fills ``record``."""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

import numpy as np

from suite.worker import data as data_mod
from suite.worker import facts, identity, probes
from suite.worker import model as model_mod
from suite.worker import timing as timing_mod
from suite.worker.devices import parse_device

T0 = time.time()


class DeviceMismatch(Exception):
    """The framework sees other devices than the spec asks for: never a number."""


class NeedsTensorFlow(Exception):
    """A setting that only TensorFlow provides (tf.data, MirroredStrategy), asked of a run without it."""


def run(spec: dict[str, Any], record: dict[str, Any]) -> None:
    cfg = spec["config"]
    backend, training = cfg["backend"], cfg["training"]
    kind = parse_device(cfg["device"])[0]
    timing = record["timing"]
    device_names = _environment(cfg, record["environment"])
    import keras

    launch = float(os.environ.get("SUITE_LAUNCH_UNIX", T0))
    timing["launch_to_ready_s"] = time.time() - launch

    keras.utils.set_random_seed(training["seed"])
    if training["mixed_precision"]:
        # float16 where Tensor Cores run it; bfloat16 on CPUs, where float16 has no fast kernels.
        keras.mixed_precision.set_global_policy("mixed_float16" if kind == "gpu" else "mixed_bfloat16")

    t = time.perf_counter()
    ds = data_mod.load(cfg["data"], training["seed"])
    timing["data_load_s"] = time.perf_counter() - t
    record["quality"].update(data_source=ds.source, data_detail=ds.detail, synthetic=ds.synthetic)

    replicas = len(device_names)
    per_replica = training["batch_mode"] == "per_replica"
    global_batch = training["batch_size"] * (replicas if per_replica else 1)

    strategy = _strategy(backend, device_names)
    t = time.perf_counter()
    with strategy.scope() if strategy else contextlib.nullcontext():
        model = model_mod.build(keras, cfg["model"])
        compiled = model_mod.compile_model(keras, model, training)
    timing["build_compile_s"] = time.perf_counter() - t
    record["settings"] = {
        **compiled,
        "global_batch": global_batch,
        "per_replica_batch": global_batch / replicas,
        "replicas": replicas,
        "strategy": type(strategy).__name__ if strategy else None,
        "input_pipeline": training["input_pipeline"],
    }

    y_train, y_test = _labels(keras, ds, training["loss"])
    timer = timing_mod.epoch_timer(keras)
    fit_args = _fit_inputs(ds.x_train, y_train, global_batch, training)
    t = time.perf_counter()
    model.fit(*fit_args["xy"], epochs=training["epochs"], verbose=0, callbacks=[timer], **fit_args["kw"])
    timing["fit_s"] = time.perf_counter() - t
    timing["epoch_s"] = timer.epoch_s
    timing["first_step_s"] = timer.first_step_s
    record["quality"]["train_loss"] = timer.losses
    if timer.nan:
        record["status"] = "nan_loss"
        record["message"] = f"training loss became {timer.losses[-1]} in epoch {len(timer.losses)}; stopped"
        return

    t = time.perf_counter()
    scores = model.evaluate(ds.x_test, y_test, batch_size=global_batch, verbose=0, return_dict=True)
    timing["evaluate_s"] = time.perf_counter() - t
    record["quality"].update(
        final_loss=timer.losses[-1],
        test_loss=float(scores["loss"]),
        test_accuracy=float(scores["accuracy"]),
        train_samples=len(ds.x_train),
        test_samples=len(ds.x_test),
    )
    _derive(record, cfg["model"], len(ds.x_train), global_batch)
    _probe(keras, spec, record, kind, fit_args, strategy)
    record["status"] = "ok"


def _environment(cfg: dict[str, Any], env: dict[str, Any]) -> list[str]:
    """Chooses the Keras backend and the devices before Keras is imported, and records the host,
    its GPUs, the versions and the devices seen into ``env``; the names of the devices the run uses."""
    backend = cfg["backend"]
    kind, count = parse_device(cfg["device"])
    os.environ["KERAS_BACKEND"] = backend  # before keras is imported anywhere
    if backend == "jax" and kind == "cpu":
        # Only the CPU client: JAX's CUDA plugin, where installed, would otherwise try to start on
        # a machine whose GPUs this run hides (CUDA_VISIBLE_DEVICES=""), and fail or cost seconds.
        os.environ["JAX_PLATFORMS"] = "cpu"

    env["host"] = facts.collect_host()
    asked = identity.asked_from_env(os.environ)  # the GPUs the host gave this run
    env["gpus_driver"] = facts.collect_gpus(asked)
    if asked is not None:
        asked = identity.complete(asked, env["gpus_driver"])
    device_names, env["gpu_identity"] = _setup_devices(backend, kind, count, cfg["threads"], asked)
    env["versions"] = facts.collect_versions(backend)
    if backend == "tensorflow":
        env["devices"] = facts.collect_tf_devices()
    env["devices_used"] = device_names
    return device_names


def _probe(keras: Any, spec: dict[str, Any], record: dict[str, Any], kind: str, fit_args: dict, strategy: Any) -> None:
    """After the timed fit: the fixed cost per step, and (when the host asks) the device's peak."""
    cfg = spec["config"]
    timing, work = record["timing"], record["work"]
    if cfg["measure"]["step_overhead"]:
        scope = strategy.scope() if strategy else contextlib.nullcontext()
        floor = probes.step_floor(
            keras, model_mod.build, model_mod.compile_model, fit_args, cfg["model"], cfg["training"], scope
        )
        timing["step_floor_s"] = floor["epoch_s"] / timing["steps_per_epoch"]
        timing["step_floor_epochs_s"] = floor["epochs_s"]
        # Not clamped: a floor at or above the step time is noise, and the report says so.
        timing["overhead_share"] = timing["step_floor_s"] / timing["step_s"] if timing["step_s"] else None
    if spec.get("calibrate_peak"):
        work["peak"] = probes.peak_flops(keras, kind, keras.config.dtype_policy().compute_dtype)


def _derive(record: dict[str, Any], model_cfg: dict[str, Any], n_train: int, global_batch: int) -> None:
    timing, work = record["timing"], record["work"]
    epochs = timing["epoch_s"]
    # With one epoch there is nothing after the first: the "steady" figure then holds tracing
    # and compilation, and the record says so.
    timing["steady_includes_first_epoch"] = len(epochs) < 2
    median = float(np.median(epochs[1:] if len(epochs) > 1 else epochs))
    timing["steady_epoch_s"] = median
    timing["steady_examples_per_s"] = n_train / median if median > 0 else None
    # Kept as measured, also when negative (a first epoch faster than the median of the rest is noise).
    timing["first_epoch_overhead_s"] = epochs[0] - median if len(epochs) > 1 else None
    timing["steps_per_epoch"] = -(-n_train // global_batch)
    timing["step_s"] = median / timing["steps_per_epoch"]
    flops = model_mod.flops_per_example(model_cfg)
    eps = timing["steady_examples_per_s"]
    work.update(
        flops_per_example_forward=flops["forward"],
        flops_per_example_train=flops["train"],
        flops_counted=model_mod.flops_counted(model_cfg),
        parameters=model_mod.parameter_count(model_cfg),
        achieved_flops_per_s=flops["train"] * eps if eps else None,
    )


def _setup_devices(
    backend: str, kind: str, count: int, threads: dict[str, int], asked: list[dict[str, Any]] | None
) -> tuple[list[str], dict[str, Any] | None]:
    """(device names to train on, how their identity was confirmed); DeviceMismatch when they are
    not the GPUs asked for. Each framework reports its GPUs' UUID or PCI bus id as far as it can."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")
    if backend == "tensorflow":
        return _setup_tf(kind, count, threads, visible, asked)
    if backend == "jax":
        import jax

        gpus = [d for d in jax.devices() if d.platform == "gpu"]
        seen = [str(d) for d in jax.devices()]
        # JAX names no UUID or bus id: its GPU's local_hardware_id is the CUDA ordinal, which the
        # CUDA driver in this same process describes.
        driver = identity.cuda_driver_devices() if gpus else []
        found = [
            driver[d.local_hardware_id]
            if driver and isinstance(getattr(d, "local_hardware_id", None), int) and d.local_hardware_id < len(driver)
            else identity.identity()
            for d in gpus
        ]
    else:
        import torch

        gpus = list(range(torch.cuda.device_count()))
        seen = [f"cuda:{i}" for i in gpus] or ["cpu"]
        if threads["intra_op"]:
            torch.set_num_threads(threads["intra_op"])
        found = []
        for i in gpus:
            props = torch.cuda.get_device_properties(i)  # uuid and pci_* fields in recent versions
            bus = None
            if all(hasattr(props, f) for f in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
                bus = f"{props.pci_domain_id:x}:{props.pci_bus_id:x}:{props.pci_device_id:x}.0"
            found.append(identity.identity(getattr(props, "uuid", None), bus))
    checked = _verify(kind, count, found, visible, asked)
    return (seen if kind == "gpu" else ["cpu"]), checked


def _setup_tf(
    kind: str, count: int, threads: dict[str, int], visible: str, asked: list[dict[str, Any]] | None
) -> tuple[list[str], dict | None]:
    import tensorflow as tf

    if threads["intra_op"]:
        tf.config.threading.set_intra_op_parallelism_threads(threads["intra_op"])
    if threads["inter_op"]:
        tf.config.threading.set_inter_op_parallelism_threads(threads["inter_op"])
    gpus = tf.config.list_physical_devices("GPU")
    found = [identity.identity() for _ in gpus]
    if kind == "gpu" and gpus:
        from tensorflow.python.client import device_lib

        # TensorFlow's own description of each GPU it made a device of: "device: 0, name: ...,
        # pci bus id: 0000:3b:00.0, compute capability: 9.0". The GPU allocators it creates are
        # the process-wide ones training uses next, with the same (default) options.
        described = [d.physical_device_desc for d in device_lib.list_local_devices() if d.device_type == "GPU"]
        found = [identity.identity(pci_bus_id=identity.bus_id_from_description(t), description=t) for t in described]
    checked = _verify(kind, count, found, visible, asked)
    if kind == "cpu" and count > 1:
        # Several logical CPU devices: MirroredStrategy's multi-replica path without GPUs.
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)
    return [f"/{kind}:{i}" for i in range(count)], checked


def _verify(
    kind: str, count: int, found: list[dict[str, Any]], visible: str, asked: list[dict[str, Any]] | None
) -> dict[str, Any] | None:
    """Raise DeviceMismatch unless the framework's GPUs are those asked for: their number, then
    (for GPU runs the host described in SUITE_GPUS: ``asked``) their UUIDs or PCI bus ids."""
    n_gpus = len(found)
    if kind == "cpu" and n_gpus:
        raise DeviceMismatch(
            f"asked for the CPU only, but the framework sees {n_gpus} GPU(s) (CUDA_VISIBLE_DEVICES={visible})"
        )
    if kind == "gpu" and n_gpus != count:
        raise DeviceMismatch(f"asked for {count} GPU(s), the framework sees {n_gpus} (CUDA_VISIBLE_DEVICES={visible})")
    if kind != "gpu":
        return None
    if asked is None:
        return {"status": "unconfirmed", "message": f"the host named no GPUs ({identity.ASKED_ENV} unset)"}
    checked = identity.compare(asked, found)
    if checked["status"] == "mismatch":
        raise DeviceMismatch(f"{checked['message']} (CUDA_VISIBLE_DEVICES={visible})")
    return checked


def _strategy(backend: str, device_names: list[str]) -> Any:
    """No strategy for one device (as a plain script runs); MirroredStrategy for several."""
    if len(device_names) == 1:
        return None
    if backend != "tensorflow":
        raise NeedsTensorFlow(
            f"{len(device_names)} devices need tf.distribute.MirroredStrategy, which the suite uses with "
            f"backend tensorflow only (this run: backend {backend})"
        )
    import tensorflow as tf

    return tf.distribute.MirroredStrategy(devices=device_names)


def _labels(keras: Any, ds: data_mod.Dataset, loss: str) -> tuple[Any, Any]:
    if loss == "sparse_categorical_crossentropy":
        return ds.y_train.astype("int32"), ds.y_test.astype("int32")
    return (
        keras.utils.to_categorical(ds.y_train, data_mod.CLASSES).astype("float32"),
        keras.utils.to_categorical(ds.y_test, data_mod.CLASSES).astype("float32"),
    )


def _fit_inputs(x: Any, y: Any, global_batch: int, training: dict[str, Any]) -> dict[str, Any]:
    if training["input_pipeline"] == "numpy":
        return {"xy": (x, y), "kw": {"batch_size": global_batch, "shuffle": training["shuffle"]}}
    try:
        import tensorflow as tf
    except ImportError:
        # Keras feeds a tf.data pipeline to any backend, but only where TensorFlow is installed.
        raise NeedsTensorFlow(
            "training.input_pipeline tf_data builds a tf.data pipeline, which needs TensorFlow; it is not "
            "installed here (use input_pipeline: numpy, or install TensorFlow)"
        ) from None

    ds = tf.data.Dataset.from_tensor_slices((x, y))
    if training["shuffle"]:
        ds = ds.shuffle(len(x), seed=training["seed"], reshuffle_each_iteration=True)
    return {"xy": (ds.batch(global_batch).prefetch(tf.data.AUTOTUNE),), "kw": {}}
