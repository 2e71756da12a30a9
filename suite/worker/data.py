"""MNIST for the worker: the Keras cache (checked by SHA-256), a download, IDX files, or synthetic.

Order of preference: ``data_dir`` (IDX files) when the spec names one; else ``mnist.npz`` in the
Keras cache (``$KERAS_HOME/datasets``) with a matching hash; else a download through Keras where
the network allows; else, only if the scenario allows it, synthetic data of the same shape,
always marked as such so no report can pass it off as MNIST.
"""

from __future__ import annotations

import gzip
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MNIST_NPZ_SHA256 = "731c5ac602752760c8e48fbffcf8c3b850d9dc2a2aedcf2cc48468fc17b673d1"
TRAIN_SIZE, TEST_SIZE, CLASSES, PIXELS = 60000, 10000, 10, 784
IDX_TRAIN = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte")
IDX_TEST = ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


class DataUnavailable(Exception):
    pass


@dataclass
class Dataset:
    x_train: np.ndarray  # float32, (n, 784), scaled to [0, 1]
    y_train: np.ndarray  # int labels, (n,)
    x_test: np.ndarray
    y_test: np.ndarray
    source: str  # mnist.npz | download | idx | idx-t10k-split | synthetic
    detail: str

    @property
    def synthetic(self) -> bool:
        return self.source == "synthetic"


def keras_home() -> Path:
    return Path(os.environ.get("KERAS_HOME") or Path.home() / ".keras")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def load(data_cfg: dict[str, Any], seed: int) -> Dataset:
    if data_cfg.get("data_dir"):
        ds = _from_idx_dir(Path(data_cfg["data_dir"]), data_cfg)
    else:
        ds, problems = _from_cache_or_download()
        if ds is None and data_cfg.get("allow_synthetic"):
            # Only as many samples as the run uses: generating all 70,000 takes seconds.
            n_train, n_test = data_cfg.get("train_samples") or TRAIN_SIZE, data_cfg.get("test_samples") or TEST_SIZE
            ds = _synthetic(seed, "; ".join(problems), min(n_train, TRAIN_SIZE), min(n_test, TEST_SIZE))
        elif ds is None:
            raise DataUnavailable(
                "MNIST is not available: " + "; ".join(problems) + ". Put mnist.npz (sha256 "
                f"{MNIST_NPZ_SHA256}) in $KERAS_HOME/datasets/, or set data.allow_synthetic: true"
            )
    ds = _subset(ds, data_cfg)
    if data_cfg.get("shuffle_labels"):
        # A control: labels permuted, so no real signal is left to learn.
        ds.y_train = np.random.default_rng(seed).permutation(ds.y_train)
        ds.detail += "; training labels shuffled (control)"
    return ds


def _from_cache_or_download() -> tuple[Dataset | None, list[str]]:
    cached = keras_home() / "datasets" / "mnist.npz"
    problems = []
    if cached.is_file():
        digest = sha256_of(cached)
        if digest == MNIST_NPZ_SHA256:
            return _from_npz(cached, "mnist.npz", f"{cached} (sha256 verified)"), []
        problems.append(f"{cached} has sha256 {digest[:12]}..., expected {MNIST_NPZ_SHA256[:12]}...")
    else:
        problems.append(f"no {cached}")
    try:
        # Keras checks the same hash; a read-only cache (as mounted in containers) makes this fail
        # cleanly, which lands in the message below. Its returned arrays are used as they are:
        # where Keras stores the file depends on its version and settings, not only on KERAS_HOME.
        import keras

        (x_train, y_train), (x_test, y_test) = keras.datasets.mnist.load_data()
    except Exception as exc:  # noqa: BLE001 - any failure here means "not available", reported
        problems.append(f"download failed: {type(exc).__name__}: {str(exc)[:200]}")
        return None, problems
    detail = "keras.datasets.mnist.load_data() (downloaded or from its own cache)"
    return Dataset(_scale(x_train), y_train, _scale(x_test), y_test, "download", detail), []


def _from_npz(path: Path, source: str, detail: str) -> Dataset:
    with np.load(path) as f:
        return Dataset(_scale(f["x_train"]), f["y_train"], _scale(f["x_test"]), f["y_test"], source, detail)


def _scale(images: np.ndarray) -> np.ndarray:
    return images.reshape(len(images), PIXELS).astype("float32") / 255.0


def _read_idx(folder: Path, stem: str) -> np.ndarray | None:
    for name, opener in ((stem + ".gz", gzip.open), (stem, open)):
        path = folder / name
        if path.is_file():
            with opener(path, "rb") as fh:
                raw = fh.read()
            magic = int.from_bytes(raw[:4], "big")
            ndim = magic & 0xFF
            if magic >> 8 != 0x08:  # 0x08: unsigned bytes
                raise DataUnavailable(f"{path}: not an IDX file of unsigned bytes (magic {magic:#x})")
            dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
            return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)
    return None


def _from_idx_dir(folder: Path, data_cfg: dict[str, Any]) -> Dataset:
    if not folder.is_dir():
        raise DataUnavailable(f"data.data_dir {folder} is not a folder")
    test_x, test_y = (_read_idx(folder, s) for s in IDX_TEST)
    train_x, train_y = (_read_idx(folder, s) for s in IDX_TRAIN)
    if train_x is not None and train_y is not None and test_x is not None and test_y is not None:
        return Dataset(_scale(train_x), train_y, _scale(test_x), test_y, "idx", str(folder))
    if test_x is None or test_y is None:
        raise DataUnavailable(f"{folder} holds neither train-* nor t10k-* IDX files (optionally .gz)")
    # Only the 10,000-digit test set: train on its head, test on its tail, never overlapping.
    n_test = data_cfg.get("test_samples") or 2000
    cut = len(test_x) - n_test
    if cut <= 0:
        raise DataUnavailable(f"data.test_samples {n_test} leaves no training digits in {folder}")
    return Dataset(
        _scale(test_x[:cut]),
        test_y[:cut],
        _scale(test_x[cut:]),
        test_y[cut:],
        "idx-t10k-split",
        f"{folder}: t10k digits 0..{cut - 1} train, {cut}..{len(test_x) - 1} test",
    )


def _synthetic(seed: int, reason: str, n_train: int = TRAIN_SIZE, n_test: int = TEST_SIZE) -> Dataset:
    """Ten sparse class prototypes with pixel noise, at MNIST's shapes and ink density.

    Learnable, but plainly not MNIST. Sparse like real digits (about 19% of pixels inked, mean
    intensity about 0.13): dense random inputs would give wide ReLU layers far larger activations
    than MNIST does and make optimizers behave unlike on the real data.
    """
    rng = np.random.default_rng(seed)
    prototypes = (rng.random((CLASSES, PIXELS)) < 0.19) * rng.uniform(0.5, 1.0, (CLASSES, PIXELS))

    def make(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, CLASSES, n)
        kept = prototypes[y] * (rng.random((n, PIXELS)) > 0.25)  # strokes partly missing
        stray = (rng.random((n, PIXELS)) < 0.04) * rng.random((n, PIXELS))  # stray ink
        return np.clip(kept + stray, 0.0, 1.0).astype("float32"), y.astype("uint8")

    x_train, y_train = make(n_train)
    x_test, y_test = make(n_test)
    return Dataset(x_train, y_train, x_test, y_test, "synthetic", f"synthetic, same shapes as MNIST ({reason})")


def _subset(ds: Dataset, data_cfg: dict[str, Any]) -> Dataset:
    n_train, n_test = data_cfg.get("train_samples"), data_cfg.get("test_samples")
    if n_train and n_train > len(ds.x_train):
        raise DataUnavailable(f"data.train_samples {n_train} > {len(ds.x_train)} available ({ds.source})")
    if n_test and n_test > len(ds.x_test):
        raise DataUnavailable(f"data.test_samples {n_test} > {len(ds.x_test)} available ({ds.source})")
    ds.x_train, ds.y_train = ds.x_train[:n_train], ds.y_train[:n_train]
    ds.x_test, ds.y_test = ds.x_test[:n_test], ds.y_test[:n_test]
    return ds
