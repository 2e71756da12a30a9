"""MNIST for the worker: exactly the data the host resolved, checked by SHA-256, or marked synthetic.

The host decides which data a run uses before anything runs (``suite.environment.datasets``) and writes that
decision into the spec as ``config.data.identity``: ``{"source": "mnist.npz" | "idx", "sha256": ...}``
(``"npz (sha256 override)"`` for an npz accepted under an overridden hash),
``{"source": "synthetic", "note": why}`` or ``{"source": "missing", "note": why}``. The worker
never looks for data on its own and never downloads: it opens the file or folder it was given
(``SUITE_DATA_PATH``, else where the identity lives by default), checks the sha256 it was told,
and fails clearly when they differ. Synthetic data is always marked as such, so no report can pass
it off as MNIST.
"""

from __future__ import annotations

import gzip
import hashlib
import math
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MNIST_NPZ_SHA256 = "731c5ac602752760c8e48fbffcf8c3b850d9dc2a2aedcf2cc48468fc17b673d1"
# The source of an npz the host accepted under another expected sha256 (SUITE_MNIST_SHA256): read
# like mnist.npz, but never named so, since it need not be Keras' file.
NPZ_OVERRIDE_SOURCE = "npz (sha256 override)"
NPZ_SOURCES = ("mnist.npz", NPZ_OVERRIDE_SOURCE)
TRAIN_SIZE, TEST_SIZE, CLASSES, PIXELS = 60000, 10000, 10, 784
IDX_TRAIN = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte")
IDX_TEST = ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
# MNIST's IDX files as they are, decompressed: a file is read no further than its size (and one byte
# more, to tell that it is bigger), so a small .gz that inflates to gigabytes costs megabytes, not gigabytes.
IDX_BYTES = {
    "train-images-idx3-ubyte": 16 + TRAIN_SIZE * PIXELS,  # 47,040,016
    "train-labels-idx1-ubyte": 8 + TRAIN_SIZE,
    "t10k-images-idx3-ubyte": 16 + TEST_SIZE * PIXELS,
    "t10k-labels-idx1-ubyte": 8 + TEST_SIZE,
}
IDX_FOLDER = "mnist-idx"  # in the Keras cache's datasets/: IDX files imported with `suite data fetch --from`
PATH_ENV = "SUITE_DATA_PATH"  # where the backend put the data the identity names, as the worker sees it


class DataUnavailable(Exception):
    pass


@dataclass
class Dataset:
    x_train: np.ndarray  # float32, (n, 784), scaled to [0, 1]
    y_train: np.ndarray  # int labels, (n,)
    x_test: np.ndarray
    y_test: np.ndarray
    source: str  # mnist.npz | npz (sha256 override) | idx | idx-t10k-split | synthetic
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


def read_idx_files(folder: Path) -> dict[str, bytes]:
    """The four MNIST IDX files a folder holds (``.gz`` or not), by stem, decompressed.

    A file that cannot be read or decompressed (cut off, not gzip, no permission), or that holds more
    than MNIST's file of that name (``IDX_BYTES``), is DataUnavailable naming it.
    """
    found = {}
    for stem in IDX_TRAIN + IDX_TEST:
        for name, opener in ((stem + ".gz", gzip.open), (stem, open)):
            path = folder / name
            if path.is_file():
                most = IDX_BYTES[stem]
                try:
                    with opener(path, "rb") as fh:
                        found[stem] = fh.read(most + 1)
                except EOFError:
                    raise DataUnavailable(f"{path}: cut off (the gzip stream ends early)") from None
                except (OSError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
                    what = "not a valid gzip file" if name.endswith(".gz") else "cannot be read"
                    raise DataUnavailable(f"{path}: {what} ({exc})") from None
                if len(found[stem]) > most:
                    raise DataUnavailable(
                        f"{path}: more than {most:,} bytes{' once decompressed' if name.endswith('.gz') else ''}; "
                        f"MNIST's {stem} is {most:,} bytes, and no bigger file is read"
                    )
                break
    return found


def idx_digest(raw: dict[str, bytes]) -> str:
    """sha256 over the decompressed IDX files: the same digits give the same identity, gzipped or not."""
    lines = "".join(f"{hashlib.sha256(raw[stem]).hexdigest()}  {stem}\n" for stem in sorted(raw))
    return hashlib.sha256(lines.encode()).hexdigest()


def parse_idx(raw: bytes, what: str) -> np.ndarray:
    magic = int.from_bytes(raw[:4], "big")
    ndim = magic & 0xFF
    if magic >> 8 != 0x08 or len(raw) < 4 + 4 * ndim:  # 0x08: unsigned bytes
        raise DataUnavailable(f"{what}: not an IDX file of unsigned bytes (magic {magic:#x})")
    if not 1 <= ndim <= 3:  # MNIST's images have 3 (count, rows, columns), its labels 1; numpy takes 64 at most
        raise DataUnavailable(f"{what}: an IDX file of {ndim} dimensions; MNIST's have 1 (labels) or 3 (images)")
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    body = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != math.prod(dims):  # Python's integers: numpy's product of 65536**4 wraps to 0
        raise DataUnavailable(f"{what}: header says {dims}, the file holds {body.size} values")
    return body.reshape(dims)


def load(data_cfg: dict[str, Any], seed: int) -> Dataset:
    ds = _resolved(data_cfg, seed)
    ds = _subset(ds, data_cfg)
    if data_cfg.get("shuffle_labels"):
        # A control: labels permuted, so no real signal is left to learn.
        ds.y_train = np.random.default_rng(seed).permutation(ds.y_train)
        ds.detail += "; training labels shuffled (control)"
    return ds


def _resolved(data_cfg: dict[str, Any], seed: int) -> Dataset:
    told = data_cfg.get("identity")
    if not isinstance(told, dict) or "source" not in told:
        raise DataUnavailable(
            "the spec names no resolved data (config.data.identity); the host resolves it when it plans "
            "(python -m suite run / check), the worker does not look for data itself"
        )
    source = told["source"]
    if data_cfg.get("data_dir") and source not in ("idx", "missing"):
        raise DataUnavailable(
            f"data.data_dir {data_cfg['data_dir']} is set, but the host resolved {source} data for this run: "
            "the spec was changed after planning (plan.with_data resolves it again)"
        )
    if source == "synthetic":
        # Only as many samples as the run uses: generating all 70,000 takes seconds.
        n_train = min(data_cfg.get("train_samples") or TRAIN_SIZE, TRAIN_SIZE)
        n_test = min(data_cfg.get("test_samples") or TEST_SIZE, TEST_SIZE)
        return _synthetic(seed, str(told.get("note") or "no MNIST on the host"), n_train, n_test)
    if source == "missing":
        raise DataUnavailable(str(told.get("note") or "the host found no data for this run"))
    if source not in (*NPZ_SOURCES, "idx"):
        raise DataUnavailable(
            f"config.data.identity.source {source!r}: expected {', '.join(NPZ_SOURCES)}, idx, synthetic or missing"
        )
    path = _told_path(data_cfg, source)
    expected = str(told.get("sha256") or "")
    if source in NPZ_SOURCES:
        if not path.is_file():
            raise DataUnavailable(f"{path}: no such file (the host resolved {source} sha256 {expected})")
        digest = sha256_of(path)
        _check_digest(path, digest, expected)
        return _from_npz(path, source, f"{path} (sha256 {digest} verified)")
    if not path.is_dir():
        raise DataUnavailable(
            f"data.data_dir {path} is not a folder" if data_cfg.get("data_dir") else f"{path}: no such folder"
        )
    raw = read_idx_files(path)
    _check_digest(path, idx_digest(raw), expected)
    return _from_idx(path, raw, data_cfg)


def _told_path(data_cfg: dict[str, Any], source: str) -> Path:
    if os.environ.get(PATH_ENV):
        return Path(os.environ[PATH_ENV])
    if data_cfg.get("data_dir"):
        return Path(data_cfg["data_dir"])
    return keras_home() / "datasets" / ("mnist.npz" if source in NPZ_SOURCES else IDX_FOLDER)


def _check_digest(path: Path, digest: str, expected: str) -> None:
    if digest != expected:
        raise DataUnavailable(
            f"{path} has sha256 {digest}, but the host resolved {expected or 'no hash'} for this run: "
            "the data changed after planning; run again so the host resolves it anew"
        )


def _from_npz(path: Path, source: str, detail: str) -> Dataset:
    with np.load(path) as f:
        return Dataset(_scale(f["x_train"]), f["y_train"], _scale(f["x_test"]), f["y_test"], source, detail)


def _scale(images: np.ndarray) -> np.ndarray:
    return images.reshape(len(images), PIXELS).astype("float32") / 255.0


def _from_idx(folder: Path, raw: dict[str, bytes], data_cfg: dict[str, Any]) -> Dataset:
    arrays = {stem: parse_idx(blob, f"{folder}/{stem}") for stem, blob in raw.items()}
    test_x, test_y = (arrays.get(s) for s in IDX_TEST)
    train_x, train_y = (arrays.get(s) for s in IDX_TRAIN)
    if test_x is None or test_y is None:
        raise DataUnavailable(f"data.data_dir {folder} holds neither train-* nor t10k-* IDX files (optionally .gz)")
    if train_x is not None and train_y is not None:
        return Dataset(_scale(train_x), train_y, _scale(test_x), test_y, "idx", str(folder))
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
