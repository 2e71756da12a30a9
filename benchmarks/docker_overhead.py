"""What does a container cost? The same spec on the docker backend and the local backend, alternating.

Round by round (the order rotated every round, so drift on the machine favours no side), one run
in a container on each engine and one local subprocess of the same RunSpec. Prints per run the
fixed cost from launch to worker ready (``launch_to_ready_s``: container create, or process spawn,
through importing TensorFlow and setting up devices, measured against SUITE_LAUNCH_UNIX), the
whole run's wall time, and the ratio of steady-state epoch times docker/local (goal: within 2%).
Several engines (the local socket, ``ssh://user@host``) are measured side by side with repeated
``--docker-host``.

The image must hold the same TensorFlow as the local Python, or the ratio compares versions.

    python benchmarks/docker_overhead.py [--image REF] [--docker-host ADDR ...] [--pairs 5] [--width 750]
        [--samples 20000] [--epochs 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from suite.backends.docker import IMAGE_ENV, DockerBackend  # noqa: E402
from suite.backends.local import LocalBackend  # noqa: E402
from suite.record.results import RunResult  # noqa: E402
from suite.spec import plan, scenario  # noqa: E402

SCENARIO = """\
name: docker_overhead
question: What does running in a container cost?
model: {{hidden: {hidden}, dropout: 0.2}}
training: {{optimizer: nadam, batch_size: 128, epochs: {epochs}}}
data: {{allow_synthetic: true, train_samples: {samples}, test_samples: 1000}}
threads: {{intra_op: {threads}, inter_op: {threads}}}
repeats: 1
"""


def one_run(backend: DockerBackend | LocalBackend, spec: plan.RunSpec) -> tuple[RunResult, float]:
    t = time.perf_counter()
    result = backend.run(spec)
    wall = time.perf_counter() - t
    if not result.ok:
        raise SystemExit(f"{backend.name} run failed: {result.status}: {result.message}\n{result.log_tail}")
    return result, wall


def steady(result: RunResult) -> float:
    return float(result.timing["steady_epoch_s"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--image",
        default=os.environ.get(IMAGE_ENV) or None,
        help=f"image reference for the docker runs (default: ${IMAGE_ENV}, else images.yaml's CPU default)",
    )
    ap.add_argument(
        "--docker-host",
        action="append",
        help="an engine to measure (repeat to compare, e.g. the local socket and ssh://user@host); "
        "default: DOCKER_HOST or the local socket",
    )
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--width", type=int, default=750)
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--threads", type=int, default=0, help="TensorFlow intra/inter-op threads (0: its choice)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "docker_overhead.yaml")
        hidden = [args.width, 150, 50, 50]
        text = SCENARIO.format(hidden=hidden, epochs=args.epochs, samples=args.samples, threads=args.threads)
        path.write_text(text, encoding="utf-8")
        spec = plan.expand(scenario.load(path))[0]
    engines = [DockerBackend(docker_host=host, image=args.image) for host in args.docker_host or [None]]
    backends: list[tuple[str, DockerBackend | LocalBackend]] = [(d.daemon.address, d) for d in engines]
    backends.append(("local", LocalBackend()))
    rows: list[tuple[int, str, RunResult, float]] = []
    try:
        for pair in range(args.pairs):
            # Rotated every round, so drift on the machine favours no side.
            shift = pair % len(backends)
            for name, backend in backends[shift:] + backends[:shift]:
                result, wall = one_run(backend, spec)
                rows.append((pair, name, result, wall))
                print(
                    f"round {pair} {name}: launch->ready {result.timing['launch_to_ready_s']:.2f} s, "
                    f"steady epoch {steady(result):.3f} s, run wall {wall:.2f} s",
                    flush=True,
                )
    finally:
        for d in engines:
            d.close()
    report(rows, [name for name, _ in backends], args)
    return 0


def report(rows: list[tuple[int, str, RunResult, float]], names: list[str], args: argparse.Namespace) -> None:
    def of(name: str, key: str) -> list[float]:
        return [float(r.timing[key]) for _, n, r, _ in rows if n == name]

    def wall(name: str) -> list[float]:
        return [w for _, n, _, w in rows if n == name]

    rounds = sorted({p for p, *_ in rows})

    def one(p: int, name: str) -> RunResult:
        return next(r for p2, n, r, _ in rows if p2 == p and n == name)

    med = statistics.median
    threads = args.threads or "TensorFlow's choice of"
    print()
    print(
        f"spec: MLP 784-{args.width}-150-50-50-10, {args.samples} samples, batch 128, {args.epochs} epochs, "
        f"CPU, {threads} threads"
    )
    for name in names[:-1]:
        run = one(rounds[0], name).run
        print(f"{name}: image {run['image']} ({run['image_id'][:19]}), engine {run.get('engine_version')}")
    print(f"{'(medians)':32s}" + "".join(f"{n[:28]:>30s}" for n in names))
    for label, key in (("launch -> worker ready (s)", "launch_to_ready_s"), ("steady epoch (s)", "steady_epoch_s")):
        print(f"{label:32s}" + "".join(f"{med(of(n, key)):30.3f}" for n in names))
    print(f"{'whole run, wall (s)':32s}" + "".join(f"{med(wall(n)):30.3f}" for n in names))
    for name in names[:-1]:
        ratios = [steady(one(p, name)) / steady(one(p, "local")) for p in rounds]
        best = min(of(name, "steady_epoch_s")) / min(of("local", "steady_epoch_s"))
        verdict = "within" if abs(med(ratios) - 1) <= 0.02 else "OUTSIDE"
        print(
            f"{name} / local steady epoch: median {med(ratios):.3f} (rounds: {', '.join(f'{x:.3f}' for x in ratios)}); "
            f"fastest epochs {best:.3f} -> {verdict} the 2% goal"
        )


if __name__ == "__main__":
    sys.exit(main())
