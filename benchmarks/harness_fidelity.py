"""Does the harness change what it measures? The same training through the suite and as a bare script.

Alternates, pair by pair: one run through the suite's local backend (spec.json -> worker
subprocess -> result record) and one plain Keras script in a fresh process that builds the same
model and calls ``fit`` with nothing but an epoch timer. Both train on the same real digits: the
MNIST IDX files in --data-dir (by default the test set in ../shared/data/mnist, split 8000/2000).
Prints the suite/bare ratio of steady-state epoch times with a 95% interval from the pairs (a
paired t-interval on log ratios: each pair ran back to back, so slow drift of the machine cancels
within it), the same for each run's fastest steady epoch (less sensitive to load spikes), and the
suite's fixed cost per run (process start to result, beyond the bare script's own start-up).
Goal: the interval within 0.98-1.02 on a quiet machine.

``--pairs auto`` takes as many pairs as that goal needs, by the rule ``repeats: auto`` uses: 4
pairs (``--first``), then the spread of their log ratios sets the count (the fewest whose interval,
at that spread, is within ``--precision``; at most ``--max-pairs``), and the interval takes its
spread from those first pairs and its mean from every pair (Stein's two-stage interval: the count
tells it nothing). Where the noise needs a hundred pairs, a first stage of 10 costs little and its
smaller t quantile halves the count (raise ``--max-pairs`` to let it). ``--budget-s`` stops starting
pairs, beyond the first stage, once that much time is spent; the interval is then the same, over the
pairs that ran. Stein's interval holds its level for normal noise; where single pairs jump 2x the
first pairs' spread can fall short of the whole run's, so the plain t interval over every pair is
printed beside it.

``--without-samplers`` adds a third run to each pair: the suite with no telemetry sampler thread in
the host (the samplers read ``/proc`` five times a second while the worker trains, in this process),
so that their share of any difference shows apart from the worker's.

Both sides differ only in the harness: same digits, model, optimizer, seed, batch, shuffling and
thread settings (the defaults); each times epoch begin to epoch end. The suite's timer also counts
batches (a Python call per step) to time the first step: part of what is checked here.

    python benchmarks/harness_fidelity.py [--pairs 10|auto] [--precision 0.02] [--first 4] [--max-pairs 60]
        [--budget-s 1800] [--without-samplers] [--width 750] [--epochs 6] [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
from scipy.stats import t as t_dist  # noqa: E402

from suite.backends import local  # noqa: E402
from suite.backends.local import LocalBackend  # noqa: E402
from suite.spec import plan, scenario  # noqa: E402

# A Keras script as a user would write it: no suite code, same model, optimizer and batch.
BARE = r"""
import gzip, json, sys, time
t_launch = float(sys.argv[2])
import numpy as np
import keras
cfg = json.loads(sys.argv[1])
keras.utils.set_random_seed(1234)
with gzip.open(cfg["dir"] + "/t10k-images-idx3-ubyte.gz") as f:
    images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784)
with gzip.open(cfg["dir"] + "/t10k-labels-idx1-ubyte.gz") as f:
    labels = np.frombuffer(f.read(), np.uint8, offset=8)
x = images[: cfg["samples"]].astype("float32") / 255.0
y = keras.utils.to_categorical(labels[: cfg["samples"]], 10).astype("float32")
layers = [keras.Input(shape=(784,))]
for w in cfg["hidden"]:
    layers += [keras.layers.Dense(w, activation="relu"), keras.layers.Dropout(0.2)]
layers.append(keras.layers.Dense(10, activation="softmax", dtype="float32"))
model = keras.Sequential(layers)
model.compile(optimizer=keras.optimizers.Nadam(), loss="categorical_crossentropy", metrics=["accuracy"],
              jit_compile=False, steps_per_execution=1)

class Epochs(keras.callbacks.Callback):
    times = []
    def on_epoch_begin(self, epoch, logs=None):
        self.t = time.perf_counter()
    def on_epoch_end(self, epoch, logs=None):
        self.times.append(time.perf_counter() - self.t)

t_ready = time.time()
model.fit(x, y, batch_size=128, epochs=cfg["epochs"], verbose=0, callbacks=[Epochs()])
print(json.dumps({"epoch_s": Epochs.times, "launch_to_ready_s": t_ready - t_launch}))
"""

SCENARIO = """\
name: harness_fidelity
question: Does the harness change what it measures?
model: {{hidden: {hidden}, dropout: 0.2}}
training: {{optimizer: nadam, batch_size: 128, epochs: {epochs}}}
data: {{data_dir: "{data_dir}", test_samples: 2000}}
repeats: 1
"""
TRAIN_SAMPLES = 8000  # the t10k split: the first 8000 digits train, the last 2000 test


def suite_run(spec: plan.RunSpec, backend: LocalBackend, samplers: bool = True) -> tuple[list[float], float]:
    """One run through the suite; ``samplers=False``: the same run with no telemetry thread in this
    (the host's) process, to tell what the samplers cost from what the worker itself adds."""
    quiet = contextlib.nullcontext() if samplers else _no_samplers()
    t = time.time()
    with quiet:
        result = backend.run(spec)
    wall = time.time() - t
    if not result.ok:
        raise SystemExit(f"suite run failed: {result.status}: {result.message}\n{result.log_tail}")
    return result.timing["epoch_s"], wall


@contextlib.contextmanager
def _no_samplers():  # type: ignore[no-untyped-def]
    offered = local._Process.telemetry_sources
    local._Process.telemetry_sources = lambda self: []  # type: ignore[method-assign]
    try:
        yield
    finally:
        local._Process.telemetry_sources = offered  # type: ignore[method-assign]


def bare_run(hidden: list[int], data_dir: Path, epochs: int) -> tuple[list[float], float]:
    cfg = json.dumps({"hidden": hidden, "samples": TRAIN_SAMPLES, "epochs": epochs, "dir": str(data_dir)})
    t = time.time()
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "KERAS_BACKEND": "tensorflow"}
    # A session of its own, as the local backend gives its worker: with the kernel's autogroup
    # scheduling each session is one group, so a script left in this one would share its CPU
    # with whatever else this shell runs while the suite's worker had a group to itself.
    out = subprocess.run(
        [sys.executable, "-c", BARE, cfg, repr(t)], capture_output=True, text=True, env=env, start_new_session=True
    )
    wall = time.time() - t
    if out.returncode:
        raise SystemExit(f"bare script failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["epoch_s"], wall


FIRST = 4  # pairs before the spread sets the count, under --pairs auto (as repeats: auto's first stage)


def pairs_needed(first_logs: list[float], precision: float, cap: int) -> int:
    """The two-stage count: the fewest pairs n whose 95% half-width t(k-1) * s / sqrt(n), at the
    spread s of the first k pairs' log ratios, is within ``precision``; k at least, ``cap`` at most."""
    k = len(first_logs)
    s2 = float(np.var(first_logs, ddof=1))
    need = int(np.ceil(t_dist.ppf(0.975, k - 1) ** 2 * s2 / precision**2 - 1e-9))
    return min(max(need, k), cap)


def paired_ratio(suite: list[float], bare: list[float], first: int | None = None) -> str:
    """Geometric mean of the per-pair ratios with a 95% paired t-interval, and their range.
    ``first``: the spread from the first that many pairs alone (the two-stage interval)."""
    logs = np.log(np.asarray(suite) / np.asarray(bare))
    n = len(logs)
    centre = float(np.exp(logs.mean()))
    if n < 2:
        return f"{centre:.3f} (one pair: no interval)"
    k = n if first is None else min(first, n)
    half = float(t_dist.ppf(0.975, k - 1) * logs[:k].std(ddof=1) / np.sqrt(n))
    low, high = np.exp(logs.mean() - half), np.exp(logs.mean() + half)
    return f"{centre:.3f} (95% CI {low:.3f}-{high:.3f}; per pair {np.exp(logs.min()):.3f}-{np.exp(logs.max()):.3f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", default="10", help="a number, or auto: as many as --precision needs")
    ap.add_argument("--precision", type=float, default=0.02, help="--pairs auto: target half-width, log scale")
    ap.add_argument("--max-pairs", type=int, default=60)
    ap.add_argument(
        "--first",
        type=int,
        help=f"--pairs auto: pairs whose spread sets the count (default {FIRST}; run whatever the budget); "
        "more cost pairs up front and narrow the interval's t quantile (t(3) = 3.18, t(9) = 2.26), "
        "which halves the count where --max-pairs allows a hundred or more",
    )
    ap.add_argument(
        "--budget-s",
        type=float,
        default=1800,
        help="--pairs auto: once this many seconds are spent, start no more pairs (the --first pairs always run)",
    )
    ap.add_argument(
        "--without-samplers",
        action="store_true",
        help="a third run in each pair: the suite with no telemetry sampler running in the host; "
        "prints its ratio to the bare script and the full suite's ratio to it",
    )
    ap.add_argument("--width", type=int, default=750)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--data-dir", type=Path, default=REPO.parent / "shared" / "data" / "mnist")
    args = ap.parse_args()
    auto = args.pairs == "auto"
    if not auto and not args.pairs.isdigit():
        raise SystemExit(f"--pairs {args.pairs!r}: a number, or auto")
    if not (args.data_dir / "t10k-images-idx3-ubyte.gz").is_file():
        raise SystemExit(f"no MNIST IDX files (t10k-*-ubyte.gz) in {args.data_dir}; pass --data-dir")
    hidden = [args.width, 150, 50, 50]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "harness_fidelity.yaml")
        path.write_text(SCENARIO.format(hidden=hidden, epochs=args.epochs, data_dir=args.data_dir.resolve()))
        spec = plan.expand(scenario.load(path))[0]
    backend = LocalBackend()
    suite_steady, bare_steady, suite_wall, bare_wall = [], [], [], []
    suite_fastest, bare_fastest = [], []  # the least disturbed epoch of each run: robust to spikes
    quiet_steady, quiet_fastest = [], []  # --without-samplers: the suite with no sampler thread
    if not auto and args.first is not None:
        raise SystemExit(f"error: --first {args.first}: only with --pairs auto (a fixed count has no first stage)")
    if auto:
        args.first = FIRST if args.first is None else args.first
        if not 2 <= args.first <= args.max_pairs:
            raise SystemExit(
                f"error: --first {args.first} with --max-pairs {args.max_pairs}: allowed: 2 <= --first <= --max-pairs"
            )
    planned = args.first if auto else int(args.pairs)
    started, why = time.monotonic(), "the fixed count"
    i = 0
    while i < planned:
        if auto and i >= args.first and time.monotonic() - started > args.budget_s:
            why = f"the budget ({args.budget_s:g} s) was spent after {i} of {planned} pairs"
            break
        # Alternate which goes first, so neither always runs on a warmer machine (with a third
        # arm, each takes each place in turn).
        arms = ["suite", "bare"] + (["quiet"] if args.without_samplers else [])
        order = arms[i % len(arms) :] + arms[: i % len(arms)]
        for who in order:
            if who == "quiet":
                epochs, _ = suite_run(spec, backend, samplers=False)
                quiet_steady.append(statistics.median(epochs[1:]))
                quiet_fastest.append(min(epochs[1:]))
            elif who == "suite":
                epochs, wall = suite_run(spec, backend)
                suite_steady.append(statistics.median(epochs[1:]))
                suite_fastest.append(min(epochs[1:]))
                suite_wall.append(wall)
            else:
                epochs, wall = bare_run(hidden, args.data_dir.resolve(), args.epochs)
                bare_steady.append(statistics.median(epochs[1:]))
                bare_fastest.append(min(epochs[1:]))
                bare_wall.append(wall)
        quiet = f", suite without samplers {quiet_steady[-1]:.3f} s" if quiet_steady else ""
        print(f"pair {i + 1}: steady epoch suite {suite_steady[-1]:.3f} s, bare {bare_steady[-1]:.3f} s{quiet}")
        i += 1
        if auto and i == args.first:
            first_logs = list(np.log(np.asarray(suite_steady) / np.asarray(bare_steady)))
            planned = pairs_needed(first_logs, args.precision, args.max_pairs)
            why = (
                f"the first {args.first} pairs' spread sets {planned} "
                f"(precision {args.precision:g}, cap {args.max_pairs})"
            )
            print(f"--pairs auto: {why}")
    shape = "-".join(map(str, hidden))
    first = args.first if auto else None
    config = f"MLP 784-{shape}-10, {TRAIN_SAMPLES} MNIST digits, {args.epochs} epochs, {i} pairs ({why})"
    print(f"\nconfiguration: {config}")
    steady = paired_ratio(suite_steady, bare_steady, first)
    print(f"steady-state epoch, suite/bare: {steady}; goal: interval within 0.98-1.02")
    if first is not None:
        print(f"  plain t interval over every pair: {paired_ratio(suite_steady, bare_steady)}")
    print(f"fastest steady epoch, suite/bare: {paired_ratio(suite_fastest, bare_fastest, first)}")
    if quiet_steady:
        print(f"steady-state epoch, suite without samplers/bare: {paired_ratio(quiet_steady, bare_steady)}")
        print(f"steady-state epoch, suite/suite without samplers: {paired_ratio(suite_steady, quiet_steady)}")
        print(f"fastest steady epoch, suite without samplers/bare: {paired_ratio(quiet_fastest, bare_fastest)}")
        print(f"fastest steady epoch, suite/suite without samplers: {paired_ratio(suite_fastest, quiet_fastest)}")
    print(
        f"wall per run: suite {statistics.median(suite_wall):.2f} s, bare {statistics.median(bare_wall):.2f} s; "
        f"suite fixed overhead {statistics.median(suite_wall) - statistics.median(bare_wall):+.2f} s per run "
        "(evaluation, facts, result record)"
    )


if __name__ == "__main__":
    main()
