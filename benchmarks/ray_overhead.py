"""What does Ray cost? The same tiny run through a Ray cluster and through the Docker backend directly,
and one plan's wall time on one node against two.

Both parts run real Ray clusters on 127.0.0.1 (``tests/ray_local.py``: one ``ray start`` per node,
each ``suite_slot: 1``) whose nodes run every point in a container on this machine's Docker engine,
the engine the direct side uses too. Every container runs one image, passed through
SUITE_DOCKER_IMAGE (``--image``, else that variable, else the newest ``suite-bench:*`` on the
engine), so no image build is ever timed.

1. Submit to worker start (rounds alternate which side goes first, so drift favours neither):

   - ``ray``: ``RayPool.submit`` on a one-node cluster the pool is already connected to, to the
     moment the worker process in the container starts (``timing.worker_start_unix``, which the
     worker itself records as its first statement); this counts Ray's scheduling, the task's start
     on the node (``ray: task start``, the task's own mark on the pool's board), the node's Docker
     backend and the container's create, payload copy and start.
   - ``docker``: ``DockerBackend.run`` (through the peak cache, as a plan runs it) to the
     same worker timestamp: the backend and the container only.
   - ``launch->ready``: the worker's own ``launch_to_ready_s`` (container create to framework
     imported and devices set up), the same path on both sides; ``run wall``: hand-over to the
     result back in the caller's hands.

   The first run of each side is reported apart and left out of the medians: on the fresh cluster
   it pays for joining it (``ray.init`` shipping the checkout as the job's working_dir, timed on
   its own as ``connect``), the node's first Ray worker process and its Docker backend's first contact with
   the engine (GPU probe); on the direct side that first contact. Both sides' first runs also
   measure the device peak (the peak cache, empty then). ``ray - docker`` is the median of
   the per-round differences; the ratio ray/docker is the ratio of geometric means with
   suite.report.stats' 95% Welch interval (3 rounds or more).

2. Plan wall time: ``runner.run_plan`` with the same plan (``--points`` points of one
   repetition, fresh results folder) on a fresh cluster with one slot node and on one with two
   (the head holds no slot: it runs no point), alternating which goes first per round. It counts
   the whole plan as ``suite run --backend ray`` runs it: joining the cluster, the first worker
   process of each node, every run, closing. Starting the cluster is not counted (shown apart).
   On a machine with two shared cores, two nodes compete for the same cores: the ratio says what
   a second node buys here, not on two machines.

    python benchmarks/ray_overhead.py [--repeats N] [--quick] [--json PATH] [--image REF]
        [--points 4] [--plan-rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from suite.backends import peak_cache  # noqa: E402
from suite.backends.docker import IMAGE_ENV, DockerBackend  # noqa: E402
from suite.backends.ray_cluster import SLOT, RayPool  # noqa: E402
from suite.record.results import RunResult  # noqa: E402
from suite.report import stats  # noqa: E402
from suite.run import runner  # noqa: E402
from suite.spec import plan, scenario  # noqa: E402
from suite.spec.plan import RunSpec  # noqa: E402

SCENARIO = """\
name: bench_ray_overhead
question: What does running a point through Ray cost?
model: {{kind: mlp, hidden: [32]}}
training: {{epochs: 1, batch_size: 64}}
data: {{allow_synthetic: true, train_samples: 256, test_samples: 128}}
device: cpu
repeats: 1
timeout_s: 300
measure: {{step_overhead: false}}
matrix:
  model.hidden.0: {widths}
"""
HEAD_ONLY = {"gpu_model:A": 1}  # the head of the plan-time clusters: no suite_slot, so it runs no point


@dataclass
class Sample:
    """One run of part 1, all times in seconds, measured from the hand-over."""

    side: str
    round: int
    to_worker_start: float
    launch_to_ready: float
    wall: float
    to_task_start: float | None = None  # ray only: the task's own start mark on the node
    facts: dict[str, Any] = field(default_factory=dict)


def specs_for(points: int) -> list[RunSpec]:
    """The plan: ``points`` widths of the tiny MLP, one repetition each."""
    widths = [16 * (i + 1) for i in range(points)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "bench_ray_overhead.yaml")
        path.write_text(SCENARIO.format(widths=widths), encoding="utf-8")
        return plan.expand(scenario.load(path))


def pick_image(asked: str | None) -> str:
    """--image, else $SUITE_DOCKER_IMAGE, else the newest suite-bench:* tag the engine holds."""
    if asked or os.environ.get(IMAGE_ENV):
        return str(asked or os.environ[IMAGE_ENV])
    from suite.environment import docker_engine

    client, _ = docker_engine.connect(timeout=30)
    try:
        found = [
            (img.attrs.get("Created", ""), tag)
            for img in client.images.list(name="suite-bench")
            for tag in img.tags
            if tag.startswith("suite-bench:")
        ]
    finally:
        client.close()
    if not found:
        raise SystemExit(
            "no suite-bench:* image on the Docker engine; build one (python -m suite backends --prepare docker, "
            "or python tests/docker_base.py) or pass --image"
        )
    return max(found)[1]


def checked(result: RunResult, side: str) -> RunResult:
    if not result.ok:
        raise SystemExit(f"{side} run failed: {result.status}: {result.message}\n{result.log_tail}")
    if result.run.get("backend") != "docker":
        raise SystemExit(f"{side} run ran with the {result.run.get('backend')} backend, not in a container")
    return result


def ray_once(pool: RayPool, spec: RunSpec, rnd: int) -> Sample:
    """One run through the pool; the caller's clock and the worker's are this machine's."""
    before = pool._counter  # the key the pool gives this attempt: f"{session}-{counter}"
    t0 = time.time()
    pool.submit(spec)
    result: RunResult | None = None
    while result is None:
        for done in pool.collect(timeout=0.2):
            result = done.result
            pool.saved(done)  # the pool holds what it handed out until told
    back = time.time()
    checked(result, "ray")
    # The board hands out ages by its own clock (Board.snapshot): the start, on this machine's clock.
    mark = pool._marks().get(f"{pool.session}-{before + 1}", {})
    started_for = mark.get("started_for_s")
    started = time.time() - float(started_for) if started_for is not None else None
    return Sample(
        "ray",
        rnd,
        to_worker_start=float(result.timing["worker_start_unix"]) - t0,
        launch_to_ready=float(result.timing["launch_to_ready_s"]),
        wall=back - t0,
        to_task_start=(float(started) - t0) if started is not None else None,
        facts={"machine": result.run["ray"]["machine"], "image": result.run.get("image")},
    )


def docker_once(backend: DockerBackend, spec: RunSpec, peaks: dict, rnd: int) -> Sample:
    t0 = time.time()
    result = peak_cache.run_with_peak(spec, backend, peaks)
    back = time.time()
    checked(result, "docker")
    return Sample(
        "docker",
        rnd,
        to_worker_start=float(result.timing["worker_start_unix"]) - t0,
        launch_to_ready=float(result.timing["launch_to_ready_s"]),
        wall=back - t0,
        facts={"image": result.run.get("image")},
    )


def line(s: Sample, label: str) -> str:
    task = f", ray: task start {s.to_task_start:.3f} s" if s.to_task_start is not None else ""
    return (
        f"{label} {s.side:6s}: submit->worker start {s.to_worker_start:6.2f} s{task}, "
        f"launch->ready {s.launch_to_ready:5.2f} s, run wall {s.wall:6.2f} s"
    )


def part_one(spec: RunSpec, image: str, repeats: int) -> dict[str, Any]:
    from ray_local import RayLocalCluster

    print(f"== 1. submit -> worker start: ray (one-node cluster) vs docker, {repeats} round(s), image {image}")
    t = time.perf_counter()
    direct = DockerBackend(machine="bench-direct", image=image)
    samples: list[Sample] = []
    first: dict[str, Any] = {}
    try:
        with RayLocalCluster(workers={}, head_resources={SLOT: 1}, env={IMAGE_ENV: image}) as cluster:
            cluster_start = time.perf_counter() - t
            os.environ.update(cluster.client_env())
            pool = RayPool("bench-orchestrator", address=cluster.address)
            try:  # closed before the cluster stops: its tasks remove their containers
                t = time.perf_counter()
                pool.connect()
                first["connect_s"] = time.perf_counter() - t
                print(
                    f"cluster start {cluster_start:.2f} s (not counted); "
                    f"connect (ray.init + shipping the checkout) {first['connect_s']:.2f} s"
                )
                peaks: dict[tuple, dict] = {}
                # The first run of each side: a fresh worker process and backend; reported apart.
                first["ray"] = ray_once(pool, spec, -1)
                print(line(first["ray"], "first  "), flush=True)
                first["docker"] = docker_once(direct, spec, peaks, -1)
                print(line(first["docker"], "first  "), flush=True)
                for rnd in range(repeats):
                    order = ("ray", "docker") if rnd % 2 == 0 else ("docker", "ray")
                    for side in order:
                        s = ray_once(pool, spec, rnd) if side == "ray" else docker_once(direct, spec, peaks, rnd)
                        samples.append(s)
                        print(line(s, f"round {rnd}"), flush=True)
            finally:
                pool.close()
    finally:
        direct.close()
    return {"cluster_start_s": cluster_start, "first": first, "samples": samples}


def plan_once(specs: list[RunSpec], nodes: int, image: str) -> dict[str, Any]:
    """The plan on a fresh cluster of ``nodes`` slot nodes; wall time of run_plan alone."""
    from ray_local import RayLocalCluster

    workers = {f"node-{i + 1}": {SLOT: 1} for i in range(nodes)}
    t = time.perf_counter()
    with RayLocalCluster(workers=workers, head_resources=HEAD_ONLY, env={IMAGE_ENV: image}) as cluster:
        started = time.perf_counter() - t
        os.environ.update(cluster.client_env())
        pool = RayPool("bench-orchestrator", address=cluster.address)
        with tempfile.TemporaryDirectory() as out:
            t = time.perf_counter()
            summary = runner.run_plan(specs, pool, Path(out), pool.machine, fresh=True, say=lambda _line: None)
            wall = time.perf_counter() - t
            by_machine = Counter(p.parts[-3] for p in Path(out).glob("*/*/*.json"))
    if summary.failed or summary.counts.get("ok", 0) != len(specs):
        raise SystemExit(f"plan on {nodes} node(s) did not run every point ok: {summary.lines()}")
    return {"nodes": nodes, "wall_s": wall, "cluster_start_s": started, "runs_per_machine": dict(by_machine)}


def part_two(points: int, rounds: int, image: str) -> list[dict[str, Any]]:
    specs = specs_for(points)
    print(f"\n== 2. plan wall time, {len(specs)} point(s) x 1 repetition: one node vs two, {rounds} round(s)")
    out = []
    for rnd in range(rounds):
        for nodes in (1, 2) if rnd % 2 == 0 else (2, 1):
            row = plan_once(specs, nodes, image)
            row["round"] = rnd
            out.append(row)
            spread = ", ".join(f"{m}: {n}" for m, n in sorted(row["runs_per_machine"].items()))
            print(
                f"round {rnd} {nodes} node(s): plan wall {row['wall_s']:6.2f} s "
                f"(cluster start {row['cluster_start_s']:.1f} s, not counted; runs {spread})",
                flush=True,
            )
    return out


def report(one: dict[str, Any], two: list[dict[str, Any]], args: argparse.Namespace, total_s: float) -> dict:
    med = statistics.median
    samples: list[Sample] = one["samples"]

    def of(side: str, key: str) -> list[float]:
        return [getattr(s, key) for s in samples if s.side == side]

    print("\n== summary (medians over the rounds; first runs apart)")
    print(f"{'':34s}{'ray':>10s}{'docker':>10s}{'ray - docker':>14s}   ranges: ray | docker")
    rows = {}
    for label, key in (
        ("submit -> worker start (s)", "to_worker_start"),
        ("launch -> ready, worker's (s)", "launch_to_ready"),
        ("run wall (s)", "wall"),
    ):
        r, d = of("ray", key), of("docker", key)
        diffs = [getattr(a, key) - getattr(b, key) for a, b in _pairs(samples)]
        rows[key] = {"ray": r, "docker": d, "ray_median": med(r), "docker_median": med(d)}
        ranges = f"{min(r):.2f}-{max(r):.2f} | {min(d):.2f}-{max(d):.2f}"
        print(f"{label:34s}{med(r):10.3f}{med(d):10.3f}{med(diffs):+14.3f}   {ranges}")
    tasks = [s.to_task_start for s in samples if s.side == "ray" and s.to_task_start is not None]
    if tasks:
        print(f"{'ray: submit -> task start (s)':34s}{med(tasks):10.3f}{'':24s}   {min(tasks):.3f}-{max(tasks):.3f}")
    ratio = stats.ratio(of("ray", "to_worker_start"), of("docker", "to_worker_start"))
    print(f"submit -> worker start: {ratio.inverse().text('ray', 'direct docker')}")
    wall_ratio = stats.ratio(of("ray", "wall"), of("docker", "wall"))
    print(f"run wall: {wall_ratio.inverse().text('ray', 'direct docker')}")
    first = one["first"]
    print(
        f"fresh cluster, first run: connect {first['connect_s']:.2f} s, then submit->worker start "
        f"{first['ray'].to_worker_start:.2f} s (task start {first['ray'].to_task_start or float('nan'):.3f} s), "
        f"run wall {first['ray'].wall:.2f} s; direct docker first run: submit->worker start "
        f"{first['docker'].to_worker_start:.2f} s, run wall {first['docker'].wall:.2f} s"
    )
    walls = {n: [r["wall_s"] for r in two if r["nodes"] == n] for n in (1, 2)}
    speed = stats.ratio(walls[1], walls[2])
    print(
        f"plan wall ({args.points} points): one node {med(walls[1]):.2f} s, two nodes {med(walls[2]):.2f} s; "
        f"{speed.text('the plan on two nodes', 'on one')}"
    )
    print(f"benchmark wall time: {total_s:.1f} s")
    return {
        "image": args.image,
        "repeats": args.repeats,
        "part1": {
            "cluster_start_s": one["cluster_start_s"],
            "first": {
                "connect_s": first["connect_s"],
                "ray": vars(first["ray"]),
                "docker": vars(first["docker"]),
            },
            "samples": [vars(s) for s in samples],
            "medians": {k: {"ray": v["ray_median"], "docker": v["docker_median"]} for k, v in rows.items()},
            "ratio_worker_start": _ratio_dict(ratio, "ray", "direct docker"),
            "ratio_wall": _ratio_dict(wall_ratio, "ray", "direct docker"),
        },
        "part2": {
            "points": args.points,
            "runs": two,
            "ratio_one_over_two": _ratio_dict(speed, "one node", "two nodes"),
        },
        "benchmark_wall_s": total_s,
        "stats_method": stats.METHOD,
    }


def _pairs(samples: list[Sample]) -> list[tuple[Sample, Sample]]:
    by_round: dict[int, dict[str, Sample]] = {}
    for s in samples:
        by_round.setdefault(s.round, {})[s.side] = s
    return [(r["ray"], r["docker"]) for r in by_round.values() if "ray" in r and "docker" in r]


def _ratio_dict(r: stats.Ratio, numerator: str, denominator: str) -> dict[str, Any]:
    """``value``: the numerator's geometric mean time over the denominator's; ``text`` says it of the numerator."""
    return {
        "value": r.value,
        "low": r.low,
        "high": r.high,
        "runs": list(r.runs),
        "direction": f"{numerator} time over {denominator} time: above 1, {numerator} is slower",
        "text": r.inverse().text(numerator, denominator),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5, help="rounds of part 1 (one run each side per round)")
    ap.add_argument("--points", type=int, default=4, help="points of part 2's plan")
    ap.add_argument("--plan-rounds", type=int, default=3, help="rounds of part 2 (one plan on each cluster per round)")
    ap.add_argument("--quick", action="store_true", help="a check that it works: 2 rounds, 2 points, 1 plan round")
    ap.add_argument(
        "--image",
        default=None,
        help=f"image reference for every container (default ${IMAGE_ENV}, else the newest suite-bench:* on the engine)",
    )
    ap.add_argument("--json", type=Path, default=None, help="also write every figure to this file")
    args = ap.parse_args()
    if args.quick:
        args.repeats, args.points, args.plan_rounds = 2, 2, 1
    if args.repeats < 1 or args.points < 1 or args.plan_rounds < 1:
        ap.error("--repeats, --points and --plan-rounds must be at least 1")
    args.image = pick_image(args.image)
    os.environ[IMAGE_ENV] = args.image
    start = time.perf_counter()
    one = part_one(specs_for(1)[0], args.image, args.repeats)
    two = part_two(args.points, args.plan_rounds, args.image)
    data = report(one, two, args, time.perf_counter() - start)
    if args.json:
        args.json.write_text(json.dumps(data, indent=1, default=str) + "\n", encoding="utf-8")
        print(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
