"""What does a container cost? The same spec on the docker backend and the local backend, alternating.

Pair by pair (order flipped every pair, so drift on the machine favours neither side), one run in
a container and one local subprocess of the same RunSpec. Prints per run the fixed cost from
launch to worker ready (``launch_to_ready_s``: container create, or process spawn, through
importing TensorFlow and setting up devices, measured against SUITE_LAUNCH_UNIX), the whole run's
wall time, and the ratio of steady-state epoch times docker/local (goal: within 3%).

The image must hold the same TensorFlow as the local Python, or the ratio compares versions.

    python benchmarks/docker_overhead.py [--image REF] [--pairs 5] [--width 750] [--samples 20000] [--epochs 4]
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

from suite import plan, scenario  # noqa: E402
from suite.backends.docker import IMAGE_ENV, DockerBackend  # noqa: E402
from suite.backends.local import LocalBackend  # noqa: E402
from suite.results import RunResult  # noqa: E402

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
    ap.add_argument("--docker-host", help="daemon address (default: DOCKER_HOST or the local socket)")
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
    docker_backend = DockerBackend(docker_host=args.docker_host, image=args.image)
    local = LocalBackend()
    rows: list[tuple[int, str, RunResult, float]] = []
    try:
        for pair in range(args.pairs):
            order = [("docker", docker_backend), ("local", local)]
            for name, backend in order if pair % 2 == 0 else order[::-1]:
                result, wall = one_run(backend, spec)
                rows.append((pair, name, result, wall))
                print(
                    f"pair {pair} {name:6s}: launch->ready {result.timing['launch_to_ready_s']:.2f} s, "
                    f"steady epoch {steady(result):.3f} s, run wall {wall:.2f} s",
                    flush=True,
                )
    finally:
        docker_backend.close()
    report(rows, args)
    return 0


def report(rows: list[tuple[int, str, RunResult, float]], args: argparse.Namespace) -> None:
    def of(name: str, key: str) -> list[float]:
        return [float(r.timing[key]) for _, n, r, _ in rows if n == name]

    ready_d, ready_l = of("docker", "launch_to_ready_s"), of("local", "launch_to_ready_s")
    wall_d = [w for _, n, _, w in rows if n == "docker"]
    wall_l = [w for _, n, _, w in rows if n == "local"]
    pairs = sorted({p for p, *_ in rows})
    ratios = [
        steady(next(r for p2, n, r, _ in rows if p2 == p and n == "docker"))
        / steady(next(r for p2, n, r, _ in rows if p2 == p and n == "local"))
        for p in pairs
    ]
    image = next(r for _, n, r, _ in rows if n == "docker").run
    print()
    threads = args.threads or "TensorFlow's choice of"
    print(
        f"spec: MLP 784-{args.width}-150-50-50-10, {args.samples} samples, batch 128, {args.epochs} epochs, "
        f"CPU, {threads} threads"
    )
    print(f"image: {image['image']} ({image['image_id'][:19]}), engine {image.get('engine_version')}")
    med = statistics.median
    print(f"{'(medians)':32s}{'docker':>10s}{'local':>10s}{'docker - local':>16s}")
    for label, d, loc in (
        ("launch -> worker ready (s)", ready_d, ready_l),
        ("whole run, wall (s)", wall_d, wall_l),
        ("steady epoch (s)", of("docker", "steady_epoch_s"), of("local", "steady_epoch_s")),
    ):
        print(f"{label:32s}{med(d):10.3f}{med(loc):10.3f}{med(d) - med(loc):16.3f}")
    print(f"steady epoch ratio docker/local: median {med(ratios):.3f} (pairs: {', '.join(f'{x:.3f}' for x in ratios)})")
    best = min(of("docker", "steady_epoch_s")) / min(of("local", "steady_epoch_s"))
    print(f"ratio of the fastest steady epochs (least disturbed by other load): {best:.3f}")
    verdict = "within" if abs(med(ratios) - 1) <= 0.03 else "OUTSIDE"
    print(f"-> {verdict} the 3% goal; medians over {len(pairs)} alternating pairs")


if __name__ == "__main__":
    sys.exit(main())
