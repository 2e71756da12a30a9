"""The worker's data sources: IDX files, the Keras cache checked by SHA-256, synthetic as a marked fallback."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import pytest

from suite.worker import data

CFG = {"train_samples": None, "test_samples": None, "allow_synthetic": True, "data_dir": None, "shuffle_labels": False}


def test_cache_with_wrong_hash_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "datasets").mkdir()
    fake = tmp_path / "datasets" / "mnist.npz"
    zeros = np.zeros((4, 28, 28), np.uint8)
    np.savez(fake, x_train=zeros, y_train=np.zeros(4, np.uint8), x_test=zeros, y_test=np.zeros(4, np.uint8))
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    ds = data.load({**CFG, "train_samples": 64, "test_samples": 16}, seed=1)
    assert ds.source in ("synthetic", "download")
    if ds.synthetic:
        assert "expected 731c5ac60275" in ds.detail, ds.detail
        assert ds.x_train.shape == (64, 784) and ds.x_test.shape == (16, 784)


def test_no_data_and_no_synthetic_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    try:
        ds = data.load({**CFG, "allow_synthetic": False, "train_samples": 8, "test_samples": 8}, seed=1)
    except data.DataUnavailable as exc:
        assert "data.allow_synthetic: true" in str(exc) and "mnist.npz" in str(exc)
    else:
        assert ds.source == "download", "only a real download may stand in"


def test_download_uses_the_arrays_keras_returns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Keras may store its download anywhere (its cache_dir, a read-only fallback, a new layout),
    # so the loader must take what load_data() returns rather than look for a file.
    rng = np.random.default_rng(0)
    x_train, x_test = rng.integers(0, 256, (6, 28, 28), np.uint8), rng.integers(0, 256, (3, 28, 28), np.uint8)
    y_train, y_test = np.arange(6, dtype=np.uint8), np.arange(3, dtype=np.uint8)
    # A stand-in module: no network, and no TensorFlow import just for this.
    fake_keras = types.ModuleType("keras")
    fake_keras.datasets = types.SimpleNamespace(  # type: ignore[attr-defined]
        mnist=types.SimpleNamespace(load_data=lambda: ((x_train, y_train), (x_test, y_test)))
    )
    monkeypatch.setitem(sys.modules, "keras", fake_keras)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    ds = data.load({**CFG, "allow_synthetic": False}, seed=1)
    assert ds.source == "download", ds.detail
    np.testing.assert_array_equal(ds.x_train, x_train.reshape(6, 784).astype("float32") / 255.0)
    np.testing.assert_array_equal(ds.x_test, x_test.reshape(3, 784).astype("float32") / 255.0)
    np.testing.assert_array_equal(ds.y_train, y_train)
    np.testing.assert_array_equal(ds.y_test, y_test)
    assert ds.x_train.dtype == np.float32


def test_idx_split_trains_and_tests_on_disjoint_digits(mnist_dir: Path) -> None:
    ds = data.load({**CFG, "data_dir": str(mnist_dir), "test_samples": 2000}, seed=1)
    assert ds.source == "idx-t10k-split"
    assert ds.x_train.shape == (8000, 784) and ds.x_test.shape == (2000, 784)
    assert list(ds.y_train[:10]) == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9], "the published first labels"
    assert 0.0 <= ds.x_train.min() and ds.x_train.max() <= 1.0


def test_synthetic_looks_like_mnist_in_density() -> None:
    ds = data._synthetic(3, "test", 2000, 200)
    assert ds.synthetic and 0.08 < ds.x_train.mean() < 0.2, "ink density near MNIST's 0.13"
    assert set(np.unique(ds.y_train)) == set(range(10))


def test_shuffled_labels_control_permutes(mnist_dir: Path) -> None:
    cfg = {**CFG, "data_dir": str(mnist_dir), "test_samples": 2000}
    plain, shuffled = data.load(cfg, seed=1), data.load({**cfg, "shuffle_labels": True}, seed=1)
    assert sorted(plain.y_train) == sorted(shuffled.y_train)
    assert (plain.y_train != shuffled.y_train).mean() > 0.8
    assert "shuffled" in shuffled.detail
