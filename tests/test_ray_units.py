"""The Ray backend without a cluster: what a run asks for, where it can go, and how the orchestrator
handles what comes back (results, deadlines, lost nodes, a lost head, a cancel), with a stand-in
``ray`` module whose nodes, task outcomes and board marks each test scripts. Also the command-line
refusals, the environment ``run_all.sh`` picks for ``--backend ray``, and the ``gpu_model`` key."""

from __future__ import annotations

import _thread
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import REPO, check_rows, check_skipped, said, suite_cli, write_scenario

from suite import cli, paths
from suite.backends import base, peak_cache
from suite.backends.ray_cluster import Finished, RayPool, demand, placement_problem
from suite.backends.ray_cluster import board as ray_board
from suite.backends.ray_cluster import head as ray_head
from suite.backends.ray_cluster import pool as ray_pool
from suite.backends.ray_cluster import stopping as ray_stopping
from suite.backends.ray_cluster import task as ray_task
from suite.backends.ray_cluster import threads as ray_threads
from suite.record import provenance, results, saving
from suite.record.results import RunResult
from suite.run import results_folder, runner
from suite.spec import plan, scenario

# --- the stand-in ray module -------------------------------------------------------------------------


class RayError(Exception):
    pass


class RayTaskError(RayError):
    pass


class TaskCancelledError(RayError):
    pass


class NodeDiedError(RayError):
    pass


class WorkerCrashedError(RayError):
    pass


class RayActorError(RayError):
    pass


class ActorDiedError(RayActorError):
    pass


class ActorUnavailableError(RayActorError):
    pass


class GetTimeoutError(RayError):
    pass


class OutOfMemoryError(RayError):
    pass


@dataclass
class NodeAffinitySchedulingStrategy:
    node_id: str
    soft: bool


class Ref:
    """An object reference: hashable by identity, as Ray's are used as dict keys."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"Ref({self.name})"


@dataclass
class Submission:
    ref: Ref
    options: dict[str, Any]
    spec: dict[str, Any]
    job: dict[str, Any]


@dataclass
class StandInRay:
    """What RayPool uses of the ``ray`` module, scripted: ``node_list`` (mutable), ``marks`` (the
    board's snapshot by attempt key), and each ref's outcome (``finish``/``fail``; none: still running)."""

    gcs_address: str | None = None
    node_list: list[dict[str, Any]] = field(default_factory=list)
    marks: dict[str, dict[str, Any]] = field(default_factory=dict)
    submissions: list[Submission] = field(default_factory=list)
    cancels: list[tuple[Ref, bool]] = field(default_factory=list)
    stops: list[list[str] | None] = field(default_factory=list)  # what the board was asked to stop
    budgets: list[float] = field(default_factory=list)  # the seconds the board was given (--budget)
    board_answers: bool = True  # False: the board's calls time out
    snapshot_answers: bool = True  # False: the board's snapshot times out
    board_calls: list[str] = field(default_factory=list)  # "stop" and "snapshot", in the order asked
    stop_raises: BaseException | None = None  # raised when the board's stop is called
    board_options: dict[str, Any] = field(default_factory=dict)  # how the board actor was placed
    waits: list[dict[str, Any]] = field(default_factory=list)
    inits: list[dict[str, Any]] = field(default_factory=list)
    shutdowns: int = 0
    snapshots: int = 0  # board snapshots read (each a call that needs the head)
    outcomes: dict[Ref, tuple[str, Any]] = field(default_factory=dict)
    sweeps: list[tuple[str, tuple]] = field(default_factory=list)  # (node id, sweep's arguments)
    sweep_finds: dict[str, Any] = field(default_factory=lambda: {"containers": [], "processes": []})
    sweeps_answer: bool = True  # False: a sweep never ends
    util: Any = field(
        default_factory=lambda: SimpleNamespace(
            scheduling_strategies=SimpleNamespace(NodeAffinitySchedulingStrategy=NodeAffinitySchedulingStrategy)
        )
    )
    exceptions: Any = field(
        default_factory=lambda: SimpleNamespace(
            RayError=RayError,
            RayTaskError=RayTaskError,
            TaskCancelledError=TaskCancelledError,
            NodeDiedError=NodeDiedError,
            WorkerCrashedError=WorkerCrashedError,
            RayActorError=RayActorError,
            ActorDiedError=ActorDiedError,
            GetTimeoutError=GetTimeoutError,
            OutOfMemoryError=OutOfMemoryError,
        )
    )

    def __post_init__(self) -> None:
        self._snapshot = Ref("board-snapshot")
        self._stop = Ref("board-stop")

    # -- the module's functions --
    def init(self, address: str | None = None, **kwargs: Any) -> Any:
        self.inits.append({"address": address, **kwargs})
        return SimpleNamespace(address_info={"gcs_address": self.gcs_address})

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        if args and not kwargs:  # ray.remote(function)
            return _RemoteFunction(self)
        return lambda cls: _RemoteClass(self)  # ray.remote(num_cpus=0, ...)(Board)

    def nodes(self) -> list[dict[str, Any]]:
        return [dict(n) for n in self.node_list]

    # Keyword-only where Ray's are (ray.wait, ray.get, ray.cancel in 2.60): a positional call fails here too.
    def wait(self, refs: list[Ref], *, num_returns: int = 1, timeout: float | None = None) -> tuple[list, list]:
        self.waits.append({"refs": list(refs), "num_returns": num_returns, "timeout": timeout})
        done = [r for r in refs if r in self.outcomes]
        return done, [r for r in refs if r not in self.outcomes]

    def get(self, ref: Ref, *, timeout: float | None = None) -> Any:
        if ref is self._snapshot:
            self.snapshots += 1
            self.board_calls.append("snapshot")
            if not self.snapshot_answers:
                raise GetTimeoutError("the board's snapshot did not come")
            return {k: dict(v) for k, v in self.marks.items()}
        if ref is self._stop:
            self.board_calls.append("stop")
            if not self.board_answers:
                raise GetTimeoutError("the board did not answer")
            return True
        kind, what = self.outcomes[ref]
        if kind == "error":
            raise what
        return what

    def cancel(self, ref: Ref, *, force: bool = False, recursive: bool = True) -> None:
        self.cancels.append((ref, force))

    def shutdown(self) -> None:
        self.shutdowns += 1

    def get_runtime_context(self) -> Any:
        return SimpleNamespace(get_node_id=lambda: "n-head")

    # -- scripting --
    def finish(self, ref: Ref, value: dict[str, Any]) -> None:
        self.outcomes[ref] = ("value", value)

    def fail(self, ref: Ref, exc: BaseException) -> None:
        self.outcomes[ref] = ("error", exc)

    def key(self, n: int) -> str:
        return self.submissions[n].job["key"]


class _RemoteFunction:
    def __init__(self, ray: StandInRay, options: dict[str, Any] | None = None):
        self.ray, self.opts = ray, options or {}

    def options(self, **kwargs: Any) -> _RemoteFunction:
        return _RemoteFunction(self.ray, kwargs)

    def remote(self, *args: Any) -> Ref:
        strategy = self.opts.get("scheduling_strategy")
        if strategy is not None:  # a sweep, pinned to its node
            assert strategy.soft is False and self.opts.get("num_cpus") == 0, self.opts
            ref = Ref(f"sweep-{len(self.ray.sweeps) + 1}")
            self.ray.sweeps.append((strategy.node_id, args))
            if self.ray.sweeps_answer:
                self.ray.finish(ref, dict(self.ray.sweep_finds))
            return ref
        spec, job, _board = args
        ref = Ref(f"task-{len(self.ray.submissions) + 1}")
        self.ray.submissions.append(Submission(ref, self.opts, spec, job))
        return ref


class _RemoteClass:
    def __init__(self, ray: StandInRay):
        self.ray = ray

    def options(self, **kwargs: Any) -> _RemoteClass:
        self.ray.board_options = kwargs
        return self

    def remote(self) -> Any:
        snapshot = SimpleNamespace(remote=lambda: self.ray._snapshot)
        budget = SimpleNamespace(remote=self._close_starts_in)
        return SimpleNamespace(snapshot=snapshot, stop=SimpleNamespace(remote=self._stop), close_starts_in=budget)

    def _close_starts_in(self, seconds: float) -> Ref:
        self.ray.budgets.append(seconds)
        return self.ray._stop  # answered as a stop is: True, or a timeout when the board does not answer

    def _stop(self, keys: list[str] | None) -> Ref:
        self.ray.stops.append(keys)
        if self.ray.stop_raises is not None:
            raise self.ray.stop_raises
        return self.ray._stop


class Clock:
    """The pool's clock (its node-list cache and lost-node wait): a millisecond per reading, as time
    passes between two calls, and moved by hand for longer spans."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        self.t += 0.001
        return self.t


def node(node_id: str, machine: str, alive: bool = True, **resources: float) -> dict[str, Any]:
    return {
        "NodeID": node_id,
        "Alive": alive,
        "Resources": {"CPU": 1.0, **resources},
        "Labels": {"suite-machine": machine},
        "NodeManagerHostname": f"host-{node_id}",
    }


def cluster() -> list[dict[str, Any]]:
    """A head of model A (no GPU: a CPU test node) and two nodes of model B with 2 GPUs each."""
    return [
        node("n1", "node-a", suite_slot=1, **{"gpu_model:A": 1}),
        node("n2", "node-b1", suite_slot=1, GPU=2, **{"gpu_model:B": 2}),
        node("n3", "node-b2", suite_slot=1, GPU=2, **{"gpu_model:B": 2}),
    ]


# --- specs -----------------------------------------------------------------------------------------

SCENARIO = """\
name: {name}
question: Where does it run?
repeats: 1
matrix:
  device: [cpu, 'gpu:2']
"""


def specs_of(tmp_path: Path, name: str = "where", extra: str = "") -> list[plan.RunSpec]:
    """(the cpu point, the gpu:2 point) of a scenario, with fixed synthetic data (no MNIST read)."""
    path = write_scenario(tmp_path, name, SCENARIO.format(name=name) + extra)
    return plan.expand(scenario.load(path), data=lambda _data: {"source": "synthetic", "note": "test"})


def ok_result(spec: plan.RunSpec, machine: str, attempt: int = 1) -> RunResult:
    now = base.now_iso()
    run = {"backend": "docker", "machine": machine, "started_at": now, "finished_at": now, "ray": {"attempt": attempt}}
    return RunResult(status="ok", spec=spec.to_dict(), run=run)


# --- demand ----------------------------------------------------------------------------------------


def test_demand_of_a_cpu_point_and_a_gpu_point(tmp_path: Path) -> None:
    cpu, gpu = specs_of(tmp_path)
    assert demand(cpu) == {"CPU": 1.0, "suite_slot": 1.0}
    assert demand(gpu) == {"CPU": 1.0, "suite_slot": 1.0, "GPU": 2.0}


def test_demand_takes_the_gpu_model_of_the_scenario_else_the_command_line(tmp_path: Path) -> None:
    cpu, _ = specs_of(tmp_path)
    assert demand(cpu, "H100") == {"CPU": 1.0, "suite_slot": 1.0, "gpu_model:H100": 0.001}
    own, own_gpu = specs_of(tmp_path, "own", "gpu_model: A100\n")
    assert demand(own)["gpu_model:A100"] == pytest.approx(0.001)
    wins = demand(own_gpu, "H100")
    assert "gpu_model:H100" not in wins and wins["gpu_model:A100"] == pytest.approx(0.001), "the scenario wins"
    assert wins["GPU"] == 2.0


# --- repeats: auto's folders ------------------------------------------------------------------------


def test_auto_points_whose_nodes_keep_separate_folders_are_named_once_per_set_of_folders(tmp_path: Path) -> None:
    from suite.backends.ray_cluster.placement import node_folder, split_auto_points
    from suite.environment import host_facts

    fixed = specs_of(tmp_path, "fixed")
    path = write_scenario(tmp_path, "adaptive", SCENARIO.format(name="adaptive").replace("repeats: 1", "repeats: auto"))
    adaptive = plan.expand(scenario.load(path), data=lambda _data: {"source": "synthetic", "note": "test"})
    assert split_auto_points(fixed, cluster()) == [], "a fixed count is not counted over nodes"
    # The cpu point may land on all three nodes, the gpu:2 point on the two B nodes: two sets.
    lines = split_auto_points(adaptive, cluster())
    assert len(lines) == 2 and all("the nodes that take adaptive save to" in line for line in lines), lines
    assert "3 folders (node-a, node-b1, node-b2)" in lines[0] and "2 folders (node-b1, node-b2)" in lines[1]
    shared = [dict(n, Labels={"suite-machine": "b"}) for n in cluster()]
    assert split_auto_points(adaptive, shared) == []
    # A node without the label saves under its hostname, made safe for a path, as its task does; a
    # label is shown on one line, its control characters escaped.
    bare = [dict(n, Labels={}, NodeManagerHostname=f"gpu {i}/x") for i, n in enumerate(cluster())]
    assert [node_folder(n) for n in bare] == ["gpu-0-x", "gpu-1-x", "gpu-2-x"]
    assert node_folder({"NodeManagerHostname": socket.gethostname()}) == host_facts.machine_name()
    odd = [dict(n, Labels={"suite-machine": f"b\x1b[2J{i}"}) for i, n in enumerate(cluster())]
    assert (
        "\x1b" not in "".join(split_auto_points(adaptive, odd)) and "b\\x1b[2J1" in split_auto_points(adaptive, odd)[1]
    )


# --- placement_problem -----------------------------------------------------------------------------

WHERE = "the Ray cluster at 10.0.0.1:6379"


def test_a_node_that_offers_everything_places_the_run() -> None:
    need = {"CPU": 1.0, "suite_slot": 1.0, "gpu_model:B": 0.001}
    assert placement_problem(need, cluster(), WHERE) is None


def test_nothing_alive_is_a_problem() -> None:
    dead = [{**n, "Alive": False} for n in cluster()]
    for nodes in (dead, []):
        problem = placement_problem({"CPU": 1.0, "suite_slot": 1.0}, nodes, WHERE)
        assert problem is not None and WHERE in problem, problem


def test_a_model_nobody_offers_is_named_with_what_is_offered() -> None:
    problem = placement_problem({"CPU": 1.0, "suite_slot": 1.0, "gpu_model:C": 0.001}, cluster(), WHERE)
    assert problem == f"no node of {WHERE} offers gpu_model:C (offered: gpu_model:A, gpu_model:B)"


def test_no_suite_slot_anywhere_says_how_to_start_the_nodes() -> None:
    bare = [node("n1", "a", **{"gpu_model:A": 1}), node("n2", "b")]
    problem = placement_problem({"CPU": 1.0, "suite_slot": 1.0}, bare, WHERE)
    assert problem is not None
    assert WHERE in problem and "suite_slot" in problem and """--resources '{"suite_slot": 1}'""" in problem


def test_too_few_gpus_names_the_largest_node() -> None:
    nodes = [node("n1", "a", suite_slot=1, GPU=2), node("n2", "b", suite_slot=1, GPU=1)]
    problem = placement_problem({"CPU": 1.0, "suite_slot": 1.0, "GPU": 4.0}, nodes, WHERE)
    assert problem == f"needs 4 GPU(s) on one node; the largest node of {WHERE} has 2"


def test_what_only_separate_nodes_offer_together_is_a_problem() -> None:
    nodes = [node("n1", "a", suite_slot=1, GPU=2, **{"gpu_model:A": 2}), node("n2", "b", suite_slot=1, GPU=1)]
    need = {"CPU": 1.0, "suite_slot": 1.0, "GPU": 1.0, "gpu_model:B": 0.001}
    nodes[1]["Resources"]["gpu_model:B"] = 1
    assert placement_problem(need, nodes, WHERE) is None
    need["GPU"] = 2.0
    problem = placement_problem(need, nodes, WHERE)
    assert problem is not None and problem.startswith(f"no single node of {WHERE} offers all of"), problem


def test_dead_nodes_are_ignored() -> None:
    nodes = cluster()
    need = {"CPU": 1.0, "suite_slot": 1.0, "gpu_model:A": 0.001}
    assert placement_problem(need, nodes, WHERE) is None
    nodes[0]["Alive"] = False  # the only node of model A
    problem = placement_problem(need, nodes, WHERE)
    assert problem == f"no node of {WHERE} offers gpu_model:A (offered: gpu_model:B)", problem


# --- RayPool with the stand-in --------------------------------------------------------------------


@pytest.fixture
def head() -> Iterator[socket.socket]:
    """Something that accepts connections where the cluster's GCS would be (the head answers)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    yield listener
    listener.close()


@pytest.fixture
def no_real_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    # connect() sets this for the process; monkeypatch puts the environment back afterwards.
    monkeypatch.setenv("RAY_gcs_rpc_server_reconnect_timeout_s", "600")
    # The head's refusals are counted within one check, HEAD_RETRY_S apart: no waiting here.
    monkeypatch.setattr(ray_head, "HEAD_RETRY_S", 0.0)


def make_pool(head: socket.socket, gpu_model: str | None = None) -> tuple[RayPool, StandInRay, Clock]:
    address = f"127.0.0.1:{head.getsockname()[1]}"
    fake = StandInRay(gcs_address=address, node_list=cluster())
    clock = Clock()
    pool = RayPool("orchestrator", address=address, gpu_model=gpu_model, ray_module=fake, clock=clock)
    return pool, fake, clock


def take(pool: RayPool) -> list[Finished]:
    """One poll of the pool, as run_plan makes it for a pool: what it hands out, each then saved."""
    done = pool.collect(timeout=0)
    for d in done:
        pool.saved(d)
    return done


def started(
    fake: StandInRay, n: int, node_id: str, machine: str, ready: float | None = None, started_for: float = 0.0
) -> None:
    """The board's snapshot of attempt ``n``: started ``started_for`` seconds ago; image ready at
    ``ready`` (a time.time() value), as ages, the way ``Board.snapshot`` hands them out."""
    mark: dict[str, Any] = {"started_for_s": started_for, "node_id": node_id, "machine": machine}
    if ready is not None:
        mark["ready_for_s"] = time.time() - ready
    fake.marks[fake.key(n)] = mark


def test_the_board_hands_out_ages_by_its_own_clock() -> None:
    board = ray_board.Board()
    board.mark("k", "started", 0.0, {"node_id": "n1", "machine": "m"})  # a node clock far off: ignored
    time.sleep(0.05)
    board.mark("k", "ready", 1e12, {})
    snap = board.snapshot()["k"]
    assert snap["node_id"] == "n1" and snap["machine"] == "m"
    assert snap["started_for_s"] >= 0.05 > snap["ready_for_s"] >= 0
    assert "started" not in snap and "ready" not in snap


def test_the_board_keeps_each_nodes_peak_calibrations_apart() -> None:
    board = ray_board.Board()
    assert board.peaks_of("n1") == [], "no calibration yet"
    cpu_peak = [["docker", "default", "tensorflow", "cpu", "float32", None, None], {"flops_per_s": 1.0}]
    gpu_peak = [["docker", "default", "tensorflow", "gpu", "float32", None, None], {"flops_per_s": 9.0}]
    other = [["local", "default", "tensorflow", "cpu", "float32", None, None], {"flops_per_s": 2.0}]
    board.add_peaks("n1", [cpu_peak])
    board.add_peaks("n2", [other])
    board.add_peaks("n1", [gpu_peak])
    assert board.peaks_of("n1") == [cpu_peak, gpu_peak], "what was added for n1, in order"
    assert board.peaks_of("n2") == [other]
    assert board.peaks_of("n3") == []
    board.peaks_of("n1").clear()  # a caller's copy: the board keeps its own
    assert board.peaks_of("n1") == [cpu_peak, gpu_peak]


def test_a_task_stuck_before_its_image_is_ready_is_cancelled(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    pool, fake, _ = make_pool(head)
    cpu, _ = specs_of(tmp_path)
    pool.submit(cpu)
    ref = fake.submissions[0].ref
    limit = ray_pool.READY_LIMIT_S + cpu.timeout_s + 5 + ray_pool.DEADLINE_MARGIN_S
    started(fake, 0, "n2", "node-b1", started_for=limit - 5)
    assert take(pool) == [] and fake.stops == [], "an image build may take a while"
    started(fake, 0, "n2", "node-b1", started_for=limit + 1)
    take(pool)
    assert fake.stops == [[fake.key(0)]] and fake.cancels == [], "asked through the board, not ray.cancel"
    fake.finish(ref, {"machine": "node-b1", "node_id": "n2", "stopped": True})
    [done] = take(pool)
    assert done.result.status == "timeout" and "getting its image ready" in done.result.message


def test_submit_asks_for_the_points_resources_without_rays_retries(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    pool, fake, _ = make_pool(head, gpu_model="B")
    cpu, gpu = specs_of(tmp_path)
    pool.submit(cpu)
    pool.submit(gpu)
    assert len(fake.inits) == 1 and fake.inits[0]["address"] == pool.address
    shipped = fake.inits[0]["runtime_env"]
    assert shipped["working_dir"] == str(paths.CHECKOUT), "the checkout: suite/, docker/, locks"
    assert ".git" in shipped["excludes"] and "/reports/" in shipped["excludes"]
    assert fake.board_options == {"resources": {"node:__internal_head__": 0.001}}, "the board lives on the head"
    first, second = fake.submissions
    assert first.options["num_cpus"] == 1.0 and first.options["num_gpus"] == 0
    assert first.options["resources"] == {"suite_slot": 1.0, "gpu_model:B": 0.001}
    assert second.options["num_gpus"] == 2.0
    assert first.options["max_retries"] == 0 and first.options["retry_exceptions"] is False
    assert first.job["attempt"] == 1 and first.job["retry_of"] is None and first.job["key"] != second.job["key"]
    assert first.spec == cpu.to_dict()
    assert pool.pending == 2


def test_the_head_resource_is_the_one_ray_gives_its_head_node() -> None:
    constants = pytest.importorskip("ray._common.constants", reason="ray is not installed here")
    assert ray_head.HEAD_RESOURCE == constants.HEAD_NODE_RESOURCE_NAME


def test_only_a_ray_result_on_the_model_asked_counts_as_done(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    pool, _, _ = make_pool(head, gpu_model="B")
    cpu, _ = specs_of(tmp_path)
    on_b = ok_result(cpu, "node-b1")
    on_b.run["ray"]["gpu_model"] = "B"
    on_a = ok_result(cpu, "node-a")
    on_a.run["ray"]["gpu_model"] = "A"
    plain = RunResult(status="ok", spec=cpu.to_dict(), run={"backend": "docker", "machine": "box"})
    assert pool.counts_as_done(on_b)
    assert not pool.counts_as_done(on_a), "--gpu-model B: a run on A measured another GPU"
    assert not pool.counts_as_done(plain), "a docker run of some machine is not this pool's"
    spec_a = {**cpu.to_dict(), "config": {**cpu.config, "gpu_model": "A"}}
    assert pool.counts_as_done(RunResult(status="ok", spec=spec_a, run=on_a.run)), "the scenario's own model wins"


def test_a_skip_records_the_gpu_model_asked_so_the_pool_finds_it_again(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    pool, _, _ = make_pool(head, gpu_model="B")
    cpu, _ = specs_of(tmp_path)
    own = replace(cpu, config={**cpu.config, "gpu_model": "A"})
    skip = pool.skipped(cpu, "no node offers it")
    assert skip.status == "skipped" and skip.run["ray"]["gpu_model"] == "B", "--gpu-model"
    assert skip.run["ray"]["session"] == pool.session and skip.run["ray"]["address"] == pool.address
    assert pool.counts_as_done(skip)
    own_skip = pool.skipped(own, "no node offers it")
    assert own_skip.run["ray"]["gpu_model"] == "A", "the scenario's own model wins"
    assert pool.counts_as_done(own_skip)


def test_a_rerun_says_a_skip_was_recorded_before_instead_of_writing_it_again(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    """Through run_plan with a real RayPool: --gpu-model C, which no node offers."""
    cpu, _ = specs_of(tmp_path)
    res = tmp_path / "res"
    first, _, _ = make_pool(head, gpu_model="C")
    runner.run_plan([cpu], first, res, first.machine, say=lambda _line: None)
    [skip] = _on_disk(res, "orchestrator", cpu)
    assert skip.status == "skipped" and "gpu_model:C" in skip.message
    again, fake, _ = make_pool(head, gpu_model="C")
    lines: list[str] = []
    summary = runner.run_plan([cpu], again, res, again.machine, say=lines.append)
    assert any("skipped, as recorded before" in line for line in lines), lines
    assert len(_on_disk(res, "orchestrator", cpu)) == 1, "no second skip record"
    assert summary.counts["skipped"] == 1 and not fake.submissions


def test_a_head_gone_after_the_first_stage_of_repeats_auto_ends_the_plan_without_a_second(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    """Through run_plan with a real RayPool: every first-stage run comes back ok, then the head goes.
    The plan ends with what was saved; nothing is submitted to the cluster that went away."""
    text = SCENARIO.format(name="gone").replace("repeats: 1", "repeats: auto\nprecision: 0.001\nmax_repeats: 5")
    text = text.replace("  device: [cpu, 'gpu:2']", "  device: [cpu]")
    specs = plan.expand(
        scenario.load(write_scenario(tmp_path, "gone", text)), data=lambda _data: {"source": "synthetic", "note": "t"}
    )
    pool, fake, _ = make_pool(head)
    real_collect, calls = pool.collect, []

    def collect(timeout: float = 0) -> list[Finished]:
        calls.append(timeout)
        assert len(calls) < 100, f"the plan waits on a gone cluster: {pool.pending} pending, {pool.gone=}"
        if len(calls) == 1:
            for i, sub in enumerate(fake.submissions):  # each a different time: a spread no precision meets
                spec = next(s for s in specs if s.repetition == sub.spec["repetition"])
                r = replace(ok_result(spec, "node-a"), timing={"fit_s": 1.0 + 0.3 * i})
                fake.finish(sub.ref, {"machine": "node-a", "node_id": "n1", "result": r.to_dict()})
            head.close()
        return real_collect(timeout=0)

    pool.collect = collect  # type: ignore[method-assign]
    summary = runner.run_plan(specs, pool, tmp_path / "res", "orchestrator", auto=True, say=lambda _line: None)
    assert summary.stopped and "stopped answering" in summary.stopped, summary.stopped
    assert len(fake.submissions) == 4 and summary.counts["ok"] == 4 and not summary.added
    assert sorted(r.spec["repetition"] for _, r in results.load_folder(tmp_path / "res" / "node-a")) == [0, 1, 2, 3]


def test_a_budget_on_a_pool_leaves_the_runs_a_node_takes_after_it_unrecorded_for_the_next_run(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    """Through run_plan with a real RayPool: every run is submitted at once, the board is given the
    budget, and the tasks that start after it come back with nothing run (ray_board.NOT_STARTED)."""
    path = write_scenario(tmp_path, "budget", SCENARIO.format(name="budget").replace("repeats: 1", "repeats: 3"))
    specs = [s for s in plan.expand(scenario.load(path), data=lambda _d: {"source": "synthetic", "note": "t"})]
    specs = [s for s in specs if s.device == "cpu"]
    pool, fake, _ = make_pool(head)
    real_collect = pool.collect

    def collect(timeout: float = 0) -> list[Finished]:
        first, *later = fake.submissions
        fake.finish(
            first.ref, {"machine": "node-a", "node_id": "n1", "result": ok_result(specs[0], "node-a").to_dict()}
        )
        for sub in later:
            fake.finish(sub.ref, {"machine": "node-a", "node_id": "n1", "stopped": ray_board.NOT_STARTED})
        return real_collect(timeout=0)

    pool.collect = collect  # type: ignore[method-assign]
    lines: list[str] = []
    res = tmp_path / "res"
    summary = runner.run_plan(specs, pool, res, "orchestrator", say=lines.append, budget=("1h", 3600.0))
    assert len(fake.budgets) == 1 and 3590 < fake.budgets[0] <= 3600, fake.budgets
    assert len(fake.submissions) == 3 and summary.counts["ok"] == 1 and summary.unstarted == 2
    assert not summary.failed and "--budget 1h spent: 2 runs not started; run the same command again to go on" in (
        summary.lines()
    )
    assert [r.spec["repetition"] for _, r in results.load_folder(res)] == [0], "nothing recorded for the others"


def test_a_pool_whose_board_does_not_take_the_budget_runs_nothing(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    cpu, _ = specs_of(tmp_path)
    pool, fake, _ = make_pool(head)
    fake.board_answers = False
    with pytest.raises(base.BackendUnavailable, match="--budget: the plan's board on .* did not take it: GetTimeout"):
        runner.run_plan([cpu], pool, tmp_path / "res", "orchestrator", say=lambda _l: None, budget=("1h", 3600.0))
    assert not fake.submissions and not (tmp_path / "res").exists()


def test_an_ok_result_comes_back_under_the_nodes_machine(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    pool, fake, _ = make_pool(head)
    cpu, gpu = specs_of(tmp_path)
    pool.submit(cpu)
    assert take(pool) == [], "nothing arrived yet"
    peak = [["docker", "default", "tensorflow", "cpu", "float32", None, None], {"tflops": 1.5}]
    fake.finish(
        fake.submissions[0].ref,
        {"machine": "node-b1", "node_id": "n2", "result": ok_result(cpu, "node-b1").to_dict(), "peaks": [peak]},
    )
    [done] = take(pool)
    assert isinstance(done, Finished)
    assert done.machine == "node-b1" and done.result.status == "ok" and done.spec == cpu
    assert pool.pending == 0
    pool.submit(gpu)
    assert fake.submissions[1].job["peaks"] == {"n2": [peak]}, "the node's peak calibration travels to later runs"


def test_a_task_cancelled_at_its_deadline_is_a_timeout(tmp_path: Path, head: socket.socket, no_real_ray: None) -> None:
    pool, fake, _ = make_pool(head)
    cpu, _ = specs_of(tmp_path)
    pool.submit(cpu)
    ref = fake.submissions[0].ref
    started(fake, 0, "n2", "node-b1", ready=time.time() - 10)
    assert take(pool) == [] and fake.stops == [], "well within its deadline"
    limit = cpu.timeout_s + 5 + ray_pool.DEADLINE_MARGIN_S
    started(fake, 0, "n2", "node-b1", ready=time.time() - limit - 1)
    assert take(pool) == []
    assert fake.stops == [[fake.key(0)]], "asked to stop: the task removes its container"
    assert fake.cancels == [], "no ray.cancel while the task may be replying (it can crash the driver)"
    fake.finish(ref, {"machine": "node-b1", "node_id": "n2", "stopped": True})
    [done] = take(pool)
    assert done.result.status == "timeout" and done.machine == "node-b1"
    assert "cancelled by the orchestrator" in done.result.message
    assert done.result.run["ray"]["node_id"] == "n2" and pool.pending == 0


def test_a_task_that_outlives_its_polite_cancel_is_forced(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    pool, fake, _ = make_pool(head)
    cpu, _ = specs_of(tmp_path)
    pool.submit(cpu)
    ref = fake.submissions[0].ref
    started(fake, 0, "n2", "node-b1", ready=time.time() - cpu.timeout_s - 5 - ray_pool.DEADLINE_MARGIN_S - 1)
    take(pool)
    take(pool)
    assert fake.stops == [[fake.key(0)]] and fake.cancels == [], "within the grace: asked once, no cancel"
    [attempt] = pool._pending.values()
    assert attempt.cancelled_at is not None
    attempt.cancelled_at -= ray_stopping.CANCEL_GRACE_S + 1  # the grace is over
    take(pool)
    assert fake.cancels == [(ref, True)], "it did not stop when asked: forced"
    fake.fail(ref, TaskCancelledError("cancelled"))
    [done] = take(pool)
    assert done.result.status == "timeout"


def test_a_task_cancelled_otherwise_is_an_error(tmp_path: Path, head: socket.socket, no_real_ray: None) -> None:
    pool, fake, _ = make_pool(head)
    cpu, _ = specs_of(tmp_path)
    pool.submit(cpu)
    fake.fail(fake.submissions[0].ref, TaskCancelledError("cancelled"))
    [done] = take(pool)
    assert done.result.status == "error" and done.machine == "orchestrator", "never started: this folder"


def test_a_lost_node_is_recorded_and_the_run_retried_once(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    pool, fake, _ = make_pool(head)
    _, gpu = specs_of(tmp_path)
    spec = replace(gpu, config={**gpu.config, "device": "cpu", "gpu_model": "B"})
    pool.submit(spec)
    first = fake.key(0)
    started(fake, 0, "n2", "node-b1")
    fake.node_list[1]["Alive"] = False
    fake.fail(fake.submissions[0].ref, NodeDiedError("the node died"))
    [lost] = take(pool)
    assert lost.result.status == "error" and "node lost" in lost.result.message, lost.result.message
    assert lost.machine == "node-b1" and "node-b1" in lost.result.message
    assert len(fake.submissions) == 2 and pool.pending == 1
    retry = fake.submissions[1]
    assert retry.job["attempt"] == 2 and retry.job["retry_of"] == first
    assert retry.options["resources"] == {"suite_slot": 1.0, "gpu_model:B": 0.001}

    # The retry is lost too: recorded, not retried again, though another B node has joined.
    fake.node_list.append(node("n4", "node-b3", suite_slot=1, GPU=2, **{"gpu_model:B": 2}))
    started(fake, 1, "n3", "node-b2")
    fake.node_list[2]["Alive"] = False
    fake.fail(retry.ref, NodeDiedError("that one died too"))
    [again] = take(pool)
    assert again.result.status == "error" and "node lost" in again.result.message
    assert again.result.run["ray"]["attempt"] == 2 and again.result.run["ray"]["retry_of"] == first
    assert again.machine == "node-b2"
    assert len(fake.submissions) == 2 and pool.pending == 0


def test_a_lost_node_without_another_of_its_model_is_not_retried(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    pool, fake, _ = make_pool(head)
    cpu, _ = specs_of(tmp_path)
    spec = replace(cpu, config={**cpu.config, "gpu_model": "A"})
    pool.submit(spec)
    started(fake, 0, "n1", "node-a")
    fake.node_list[0]["Alive"] = False
    fake.fail(fake.submissions[0].ref, NodeDiedError("the node died"))
    [lost] = take(pool)
    assert "node lost" in lost.result.message and "not retried" in lost.result.message
    assert "gpu_model:A" in lost.result.message
    assert len(fake.submissions) == 1 and pool.pending == 0


def test_a_worker_crash_on_a_live_node_is_an_error_not_retried(
    tmp_path: Path, head: socket.socket, no_real_ray: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ray_pool, "LOST_NODE_WAIT_S", 0.0)
    pool, fake, _ = make_pool(head)
    cpu, _ = specs_of(tmp_path)
    pool.submit(cpu)
    started(fake, 0, "n2", "node-b1")
    fake.fail(fake.submissions[0].ref, WorkerCrashedError("the worker died\nSIGSEGV"))
    [crashed] = take(pool)
    assert crashed.result.status == "error" and "node lost" not in crashed.result.message
    assert "crashed" in crashed.result.message and "SIGSEGV" in crashed.result.message
    assert fake.sweeps == [("n2", (pool.session, fake.key(0)))], "what its run started outlives the worker"
    assert len(fake.submissions) == 1 and pool.pending == 0


def test_a_failing_task_and_a_ray_error_are_errors(tmp_path: Path, head: socket.socket, no_real_ray: None) -> None:
    pool, fake, _ = make_pool(head)
    cpu, gpu = specs_of(tmp_path)
    pool.submit(cpu)
    pool.submit(gpu)
    fake.fail(fake.submissions[0].ref, RayTaskError("Traceback...\nValueError: bad spec"))
    fake.fail(fake.submissions[1].ref, RayError("object lost"))
    done = take(pool)
    assert [d.result.status for d in done] == ["error", "error"]
    assert "ValueError: bad spec" in done[0].result.message
    assert "RayError: object lost" in done[1].result.message


def test_a_queued_run_no_alive_node_can_take_is_an_error_after_a_grace(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    pool, fake, clock = make_pool(head)
    cpu, _ = specs_of(tmp_path)
    spec = replace(cpu, config={**cpu.config, "gpu_model": "B"})
    pool.submit(spec)
    assert take(pool) == [] and fake.cancels == [], "queued: a B node takes it later"
    fake.node_list[1]["Alive"] = False
    fake.node_list[2]["Alive"] = False
    clock.t += 10  # past the node list's cache
    assert take(pool) == [], "a node of B may be rejoining (a pod replaced)"
    clock.t += ray_pool.LOST_NODE_WAIT_S - 1
    assert take(pool) == [] and fake.cancels == [], "still within the grace"
    assert pool.pending == 1
    clock.t += 2  # the grace is over, counted from when no node could first take it
    [gone] = take(pool)
    assert gone.result.status == "error" and "no alive node" in gone.result.message
    assert "gpu_model:B" in gone.result.message and gone.machine == "orchestrator"
    assert fake.cancels == [(fake.submissions[0].ref, True)] and pool.pending == 0


def test_a_node_back_within_the_grace_starts_it_over(tmp_path: Path, head: socket.socket, no_real_ray: None) -> None:
    pool, fake, clock = make_pool(head)
    cpu, _ = specs_of(tmp_path)
    pool.submit(replace(cpu, config={**cpu.config, "gpu_model": "A"}))
    fake.node_list[0]["Alive"] = False  # the only node of model A
    assert take(pool) == []
    clock.t += ray_pool.LOST_NODE_WAIT_S - 5
    fake.node_list[0]["Alive"] = True  # back (a replaced pod)
    assert take(pool) == []
    clock.t += 3
    fake.node_list[0]["Alive"] = False  # and gone again
    assert take(pool) == []
    clock.t += 10  # LOST_NODE_WAIT_S + 8 since it first went: a grace that was not started over would be over
    assert take(pool) == [] and fake.cancels == [] and pool.pending == 1
    clock.t += ray_pool.LOST_NODE_WAIT_S
    [gone] = take(pool)
    assert "no alive node" in gone.result.message and pool.pending == 0


def test_the_head_refusing_connections_ends_the_plan_without_another_ray_call(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    pool, fake, _ = make_pool(head)
    cpu, gpu = specs_of(tmp_path)
    pool.submit(cpu)
    pool.submit(gpu)
    started(fake, 0, "n2", "node-b1")
    assert take(pool) == [], "the head answers: the board's marks are read"
    waits, snapshots = len(fake.waits), fake.snapshots
    started(fake, 1, "n3", "node-b2")  # on a board the orchestrator can no longer read
    head.close()  # nothing listens there any more: refused, HEAD_CHECKS times in one check
    [lost] = take(pool)
    assert pool.gone is not None and pool.address in pool.gone and "stopped answering" in pool.gone, pool.gone
    assert lost.spec == cpu and lost.machine == "node-b1", "the started run, where it ran (the last marks seen)"
    assert lost.result.status == "error" and "stopped answering" in lost.result.message
    assert pool.pending == 0, "the queued run never ran (as far as the orchestrator saw): left for the next run"
    assert fake.snapshots == snapshots, "the board is not asked once the head is gone"
    # One look at what already reached this driver, without waiting (bounded: the call may block).
    assert [w["timeout"] for w in fake.waits[waits:]] == [0], fake.waits[waits:]
    pool.close()
    assert fake.cancels == [] and fake.shutdowns == 0, "cancel and shutdown would block without a head"


def test_a_result_that_reached_the_driver_before_the_head_went_is_kept(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    pool, fake, _ = make_pool(head)
    cpu, gpu = specs_of(tmp_path)
    pool.submit(cpu)
    pool.submit(gpu)
    started(fake, 0, "n2", "node-b1")
    started(fake, 1, "n3", "node-b2")
    assert take(pool) == []
    # The gpu run's reply arrives; the head is gone before the next poll looks at it.
    fake.finish(
        fake.submissions[1].ref, {"machine": "node-b2", "node_id": "n3", "result": ok_result(gpu, "node-b2").to_dict()}
    )
    head.close()
    done = {d.spec.device: d for d in take(pool)}
    assert sorted(done) == ["cpu", "gpu:2"] and pool.gone is not None
    assert done["gpu:2"].result.status == "ok" and done["gpu:2"].machine == "node-b2", "its result, not 'unknown'"
    assert done["cpu"].result.status == "error" and "stopped answering" in done["cpu"].result.message


def test_a_blocked_look_after_the_head_went_is_given_up(
    tmp_path: Path, head: socket.socket, no_real_ray: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ray_head, "GCS_CALL_S", 0.2)
    pool, fake, _ = make_pool(head)
    cpu, _ = specs_of(tmp_path)
    pool.submit(cpu)
    started(fake, 0, "n2", "node-b1")
    assert take(pool) == []
    gate = threading.Event()
    fake.wait = lambda *a, **k: gate.wait(30) or ([], [])  # type: ignore[method-assign]  # Ray blocking for good
    head.close()
    t = time.monotonic()
    [lost] = take(pool)
    gate.set()
    assert time.monotonic() - t < 5 and "stopped answering" in lost.result.message


def test_a_refusal_then_an_answer_within_one_check_is_not_a_lost_head(
    tmp_path: Path, head: socket.socket, no_real_ray: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool, fake, _ = make_pool(head)
    cpu, _ = specs_of(tmp_path)
    pool.submit(cpu)
    real = socket.create_connection
    refusals = {"left": 0}

    def flaky(address: Any, *args: Any, **kwargs: Any) -> socket.socket:
        if address[1] == head.getsockname()[1] and refusals["left"] > 0:
            refusals["left"] -= 1
            raise ConnectionRefusedError("refused")
        return real(address, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", flaky)
    refusals["left"] = 1
    assert take(pool) == [] and pool.gone is None, "one refusal, then the head answers"
    assert refusals["left"] == 0 and len(fake.waits) == 1, "the poll went on after the check"
    for _ in range(3):  # no count across checks: each may have all but one of its tries refused
        refusals["left"] = ray_head.HEAD_CHECKS - 1
        assert take(pool) == [] and pool.gone is None and pool.pending == 1
    refusals["left"] = ray_head.HEAD_CHECKS
    take(pool)
    assert pool.gone is not None and pool.pending == 0, "every try of one check refused: gone"


def _head_replies(monkeypatch: pytest.MonkeyPatch, head: socket.socket) -> dict[str, str]:
    """The head's replies to the pool's checks, by hand: ``reply["now"]`` is "answer" (a connection
    is made), "silent" (the connection times out) or "refuse"; returns that dict to set."""
    reply = {"now": "answer"}
    real = socket.create_connection

    def scripted(address: Any, *args: Any, **kwargs: Any) -> socket.socket:
        if address[1] == head.getsockname()[1]:
            if reply["now"] == "silent":
                raise TimeoutError("timed out")  # socket.timeout is TimeoutError
            if reply["now"] == "refuse":
                raise ConnectionRefusedError("refused")
        return real(address, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", scripted)
    return reply


def test_a_silent_head_is_gone_only_after_head_silent_s_by_the_pools_clock(
    tmp_path: Path, head: socket.socket, no_real_ray: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool, fake, clock = make_pool(head)
    cpu, _ = specs_of(tmp_path)
    pool.submit(cpu)
    started(fake, 0, "n2", "node-b1")
    reply = _head_replies(monkeypatch, head)
    reply["now"] = "silent"
    assert pool._head_answers(), "a pause: not gone yet"
    clock.t += ray_head.HEAD_SILENT_S - 1
    assert pool._head_answers(), "silent for less than HEAD_SILENT_S"
    assert take(pool) == [] and pool.gone is None and pool.pending == 1
    clock.t += 2
    assert not pool._head_answers(), "silent for HEAD_SILENT_S: gone"
    [lost] = take(pool)
    assert pool.gone is not None and f"{ray_head.HEAD_SILENT_S:g} s" in pool.gone, pool.gone
    assert lost.machine == "node-b1" and lost.result.status == "error"
    assert lost.result.message.startswith("outcome unknown:"), lost.result.message


def test_an_answer_starts_the_heads_silence_over(
    tmp_path: Path, head: socket.socket, no_real_ray: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool, _, clock = make_pool(head)
    pool.connect()
    reply = _head_replies(monkeypatch, head)
    reply["now"] = "silent"
    assert pool._head_answers()
    clock.t += ray_head.HEAD_SILENT_S - 1
    reply["now"] = "answer"
    assert pool._head_answers()
    reply["now"] = "silent"
    assert pool._head_answers()
    clock.t += 2  # HEAD_SILENT_S + 1 since the first silence, 2 s since the answer
    assert pool._head_answers(), "the answer started the silence over"
    clock.t += ray_head.HEAD_SILENT_S
    assert not pool._head_answers()


def test_a_refusal_after_a_silence_is_gone_at_once(
    tmp_path: Path, head: socket.socket, no_real_ray: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool, _, clock = make_pool(head)
    pool.connect()
    reply = _head_replies(monkeypatch, head)
    reply["now"] = "silent"
    assert pool._head_answers()
    clock.t += 1  # far within HEAD_SILENT_S
    reply["now"] = "refuse"
    assert not pool._head_answers(), "the head's machine answers and nothing listens: gone"


def test_a_plan_whose_head_goes_away_keeps_what_arrived(tmp_path: Path, head: socket.socket, no_real_ray: None) -> None:
    """Through run_plan: the run started on node-b1 is recorded there, the result that arrived
    in the last poll before the head went is saved, and the summary says why the plan stopped."""
    pool, fake, _ = make_pool(head)
    cpu, gpu = specs_of(tmp_path)
    res = tmp_path / "res"
    polls = {"n": 0}
    wait = fake.wait

    def scripted_wait(refs: list[Ref], *, num_returns: int = 1, timeout: float | None = None) -> tuple[list, list]:
        if timeout == 0 and head.fileno() == -1:  # the look at what reached the driver before the head went
            return wait(refs, num_returns=num_returns, timeout=timeout)
        polls["n"] += 1
        started(fake, 0, "n2", "node-b1")
        if polls["n"] == 3:
            value = {"machine": "node-b2", "node_id": "n3", "result": ok_result(gpu, "node-b2").to_dict()}
            fake.finish(fake.submissions[1].ref, value)
            head.close()  # the next check of the head is refused
        return wait(refs, num_returns=num_returns, timeout=timeout)

    fake.wait = scripted_wait  # type: ignore[method-assign]
    summary = runner.run_plan([cpu, gpu], pool, res, pool.machine, say=lambda _line: None)
    assert polls["n"] == 3, "no poll of Ray after the head was found gone"
    [lost] = _on_disk(res, "node-b1", cpu)
    assert lost.status == "error" and "stopped answering" in lost.message
    assert [r.status for r in _on_disk(res, "node-b2", gpu)] == ["ok"]
    assert summary.failed and summary.stopped and pool.address in summary.stopped
    assert any(pool.address in line for line in summary.lines()), summary.lines()
    assert fake.shutdowns == 0 and fake.cancels == [], "nothing is asked of a cluster that is gone"


def test_without_an_address_the_pool_starts_and_stops_a_local_instance(no_real_ray: None) -> None:
    fake = StandInRay(gcs_address=None, node_list=cluster())
    pool = RayPool("orchestrator", ray_module=fake, clock=Clock())
    pool.connect()
    [init] = fake.inits
    assert init["address"] == "local" and init["resources"] == {"suite_slot": 1}
    assert init["labels"] == {"suite-machine": "orchestrator"}
    assert pool.where == ray_head.LOCAL and pool.run_info()["ray"]["address"] == "local"
    pool.close()
    assert fake.shutdowns == 1


def two_started(tmp_path: Path, head: socket.socket) -> tuple[RayPool, StandInRay, Ref, Ref]:
    """A pool with its cpu and gpu runs started on node-b1 and node-b2; their refs."""
    pool, fake, _ = make_pool(head)
    for spec in specs_of(tmp_path):
        pool.submit(spec)
    started(fake, 0, "n2", "node-b1")
    started(fake, 1, "n3", "node-b2")
    a, b = (s.ref for s in fake.submissions)
    return pool, fake, a, b


def test_cancel_all_asks_the_board_to_stop_and_waits_for_the_started_tasks(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    pool, fake, _ = make_pool(head)
    cpu, gpu = specs_of(tmp_path)
    pool.submit(cpu)
    pool.submit(gpu)
    started(fake, 0, "n2", "node-b1")  # the gpu run is still queued
    a, b = (s.ref for s in fake.submissions)
    fake.finish(a, {"machine": "node-b1", "node_id": "n2", "stopped": True})
    said: list[str] = []
    assert pool.cancel_all(say=said.append) == [], "a stopped run has no result to keep"
    assert fake.stops == [None], "one stop for every attempt, queued ones too"
    assert fake.board_calls[-2:] == ["stop", "snapshot"], "which started is read after the stop, not before"
    assert fake.waits[-1]["timeout"] == ray_stopping.CANCEL_GRACE_S and fake.waits[-1]["refs"] == [a]
    assert fake.cancels == [], "every started task stopped: no ray.cancel at all"
    assert said == [
        "stopping 2 Ray task(s): a started one removes its container, a queued one does not start "
        "(Ctrl-C again: force at once)"
    ]
    assert pool.pending == 0
    pool.close()
    assert fake.shutdowns == 1 and fake.cancels == [], "nothing left to cancel; the queued run ends with the job"


def test_cancel_all_with_every_run_queued_waits_for_nothing(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    pool, fake, _ = make_pool(head)
    for spec in specs_of(tmp_path):
        pool.submit(spec)
    assert pool.cancel_all(say=lambda _line: None) == []
    assert fake.stops == [None] and fake.waits == [] and fake.cancels == [] and pool.pending == 0


def test_cancel_all_without_a_board_cancels_the_started_tasks_through_ray(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    pool, fake, a, b = two_started(tmp_path, head)
    fake.board_answers = False
    fake.fail(a, TaskCancelledError("cancelled"))
    pool.cancel_all(say=lambda _line: None)
    assert fake.cancels == [(a, False), (b, False), (b, True)], "polite for both, forced for the one that did not end"
    assert pool.pending == 0


def test_cancel_all_returns_the_runs_that_ended_with_a_result_meanwhile(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    pool, fake, _ = make_pool(head)
    cpu, gpu = specs_of(tmp_path)
    still, _ = specs_of(tmp_path, "other")
    for spec in (cpu, gpu, still):
        pool.submit(spec)
    for n in range(3):
        started(fake, n, "n2", "node-b1")
    stopped, ended, running = (s.ref for s in fake.submissions)  # of cpu, gpu, still
    # During the wait: one run ends with its result, one stops, one does not end at all.
    fake.finish(ended, {"machine": "node-b2", "node_id": "n3", "result": ok_result(gpu, "node-b2").to_dict()})
    fake.finish(stopped, {"machine": "node-b1", "node_id": "n2", "stopped": ray_board.NOT_STARTED})
    [kept] = pool.cancel_all(say=lambda _line: None)
    assert pool.unstarted == 1, "it started past the plan's budget and ran nothing: for the next run"
    assert isinstance(kept, Finished) and kept.spec == gpu and kept.machine == "node-b2"
    assert kept.result.status == "ok" and kept.result.run["machine"] == "node-b2"
    assert fake.cancels == [(running, True)], "only the one that did not end is forced"
    assert pool.pending == 1, "held until saved"
    assert pool.cancel_all(say=lambda _line: None) == [kept], "still held: a second stop hands it out again"
    pool.saved(kept)
    assert pool.pending == 0 and pool.cancel_all(say=lambda _line: None) == [], "nothing left"


def test_a_second_interrupt_during_the_wait_forces_every_started_task(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    pool, fake, a, b = two_started(tmp_path, head)

    def interrupted(refs: list[Ref], *, num_returns: int = 1, timeout: float | None = None) -> tuple[list, list]:
        raise KeyboardInterrupt  # Ctrl-C again while the tasks remove their containers

    fake.wait = interrupted  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        pool.cancel_all(say=lambda _line: None)
    assert fake.cancels == [(a, True), (b, True)]
    assert pool.pending == 0


def test_a_second_interrupt_before_the_board_answers_forces_every_task(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    pool, fake, _ = make_pool(head)
    for spec in specs_of(tmp_path):
        pool.submit(spec)
    fake.stop_raises = KeyboardInterrupt()  # Ctrl-C again while the stop is on its way to the board
    with pytest.raises(KeyboardInterrupt):
        pool.cancel_all(say=lambda _line: None)
    a, b = (s.ref for s in fake.submissions)
    assert fake.cancels == [(a, True), (b, True)], "which started is not known yet: all are forced"
    assert pool.pending == 0


def test_without_a_snapshot_after_the_stop_every_task_is_waited_for(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    pool, fake, _ = make_pool(head)
    for spec in specs_of(tmp_path):
        pool.submit(spec)
    a, b = (s.ref for s in fake.submissions)
    take(pool)  # an earlier snapshot: nothing started then
    started(fake, 1, "n3", "node-b2")  # b started since; the snapshot after the stop does not come
    fake.snapshot_answers = False
    fake.finish(a, {"machine": "node-b1", "node_id": "n2", "stopped": "asked"})
    assert pool.cancel_all(say=lambda _line: None) == []
    [grace] = [w for w in fake.waits if w["timeout"] == ray_stopping.CANCEL_GRACE_S]
    assert fake.stops == [None] and set(grace["refs"]) == {a, b}, "not the stale snapshot's none"
    assert fake.cancels == [(b, True)], "asked through the board: no polite ray.cancel; the one not ended forced"
    assert sorted(n for n, _ in fake.sweeps) == ["n1", "n2", "n3"], "every alive node swept after the force"


def test_a_task_that_found_the_board_gone_while_the_head_answers_is_an_error_saying_so(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    pool, fake, _ = make_pool(head)
    cpu, _ = specs_of(tmp_path)
    pool.submit(cpu)
    started(fake, 0, "n2", "node-b1")
    fake.finish(fake.submissions[0].ref, {"machine": "node-b1", "node_id": "n2", "stopped": ray_board.BOARD_GONE})
    [done] = take(pool)
    assert done.result.status == "error" and "board" in done.result.message and "gone" in done.result.message
    assert done.machine == "node-b1"


def test_tasks_that_found_the_board_gone_with_the_head_end_the_plan_as_the_heads_loss(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    """The head dies between the poll's look at it and Ray's wait: the tasks' replies that the board
    is gone arrive first. They are the head's loss, not runs that failed on their own."""
    pool, fake, _ = make_pool(head)
    cpu, gpu = specs_of(tmp_path)
    pool.submit(cpu)
    pool.submit(gpu)
    started(fake, 0, "n2", "node-b1")
    assert take(pool) == []
    a, b = (s.ref for s in fake.submissions)
    fake.finish(a, {"machine": "node-b1", "node_id": "n2", "stopped": ray_board.BOARD_GONE})  # stopped mid-run
    fake.finish(b, {"machine": "node-b2", "node_id": "n3", "stopped": ray_board.BOARD_GONE})  # found it as it began
    wait = fake.wait

    def head_goes_during_the_wait(*args: Any, **kwargs: Any) -> Any:
        head.close()
        return wait(*args, **kwargs)

    fake.wait = head_goes_during_the_wait  # type: ignore[method-assign]
    [lost] = take(pool)
    assert pool.gone is not None and "stopped answering" in pool.gone, pool.gone
    assert lost.spec == cpu and lost.machine == "node-b1" and lost.result.status == "error"
    assert "stopped answering" in lost.result.message, lost.result.message
    assert pool.pending == 0 and take(pool) == [], "the run that never started is left for the next run"


def test_the_orchestrators_records_take_the_backend_the_node_said(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    pool, fake, _ = make_pool(head)
    cpu, gpu = specs_of(tmp_path)
    pool.submit(cpu)
    pool.submit(gpu)
    started(fake, 0, "n2", "node-b1")
    fake.marks[fake.key(0)]["backend"] = "local"  # the node's "ready" mark: it runs points without Docker
    for sub in fake.submissions:
        fake.fail(sub.ref, RayTaskError("Traceback...\nRuntimeError: boom"))
    said, unsaid = take(pool)
    assert said.spec == cpu and said.result.run["backend"] == "local"
    assert unsaid.spec == gpu and unsaid.result.run["backend"] == "ray", "no mark: the pool's own name"


def test_a_ray_client_address_is_refused(no_real_ray: None) -> None:
    with pytest.raises(base.BackendUnavailable) as info:
        RayPool("m", address="ray://h:10001", ray_module=StandInRay())
    assert "ray://" in str(info.value) and "HOST:PORT" in str(info.value)
    blank = RayPool("m", address="  ", ray_module=StandInRay())
    assert blank.address is None, "blank: a local instance (the command line refuses it before: see the CLI tests)"


# --- a run on its node, interruptible ---------------------------------------------------------------


def test_interruptible_returns_the_works_value_from_a_thread_of_its_own() -> None:
    stops: list[str] = []
    where = ray_task._interruptible(lambda: threading.current_thread(), lambda: stops.append("stop"))
    assert where is not threading.current_thread() and where.name == "suite-ray-run"
    assert ray_task._interruptible(lambda: 42, lambda: stops.append("stop")) == 42
    assert stops == [], "nothing to stop when the work ends on its own"


def test_interruptible_raises_the_works_exception_in_the_caller() -> None:
    def work() -> None:
        raise ValueError("the run failed")

    with pytest.raises(ValueError, match="the run failed"):
        ray_task._interruptible(work, lambda: None)


@dataclass
class BlockedWork:
    """A run blocked in one call (its container's wait) until ``stop`` (the backend's close) ends it."""

    unblocked: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)
    stops: int = 0
    cleanup_s: float = 0.0

    def work(self) -> str:
        try:
            return "stopped" if self.unblocked.wait(30) else "never stopped"
        finally:
            time.sleep(self.cleanup_s)  # removing what the run left
            self.ended.set()

    def stop(self) -> None:
        self.stops += 1
        self.unblocked.set()


def _interrupted_while_waiting(blocked: BlockedWork) -> None:
    """``_interruptible`` with a KeyboardInterrupt raised in this (the waiting) thread, as Ray's
    cancel raises it, 0.2 s in; it must go on out of ``_interruptible``."""
    timer = threading.Timer(0.2, _thread.interrupt_main)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            ray_task._interruptible(blocked.work, blocked.stop)
    finally:
        timer.cancel()


def test_an_interrupt_while_waiting_stops_the_work_and_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray_task, "STEP_S", 0.01)
    blocked = BlockedWork()
    _interrupted_while_waiting(blocked)
    assert blocked.stops == 1, "stop() ends the blocked wait"
    assert blocked.ended.wait(5), "the work's thread ended once stopped"


def test_an_interrupt_gives_the_work_time_to_clean_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray_task, "STEP_S", 0.01)
    monkeypatch.setattr(ray_task, "STOP_WAIT_S", 5.0)
    blocked = BlockedWork(cleanup_s=0.3)
    _interrupted_while_waiting(blocked)
    assert blocked.ended.is_set(), "the interrupt went on before the work's thread had cleaned up"


# --- a run on its node, its peak calibration through the board --------------------------------------


class Handle:
    """A stand-in object reference that carries its value (``NodeRay.get`` hands it out)."""

    def __init__(self, value: Any):
        self.value = value


class BoardActor:
    """A real ``Board`` as a task sees its actor handle: each method's ``.remote`` calls the board
    (``peaks_of`` returns a Handle, as a remote call returns a reference); ``added`` lists what was sent."""

    def __init__(self) -> None:
        self.board = ray_board.Board()
        self.added: list[tuple[str, list]] = []
        self.peaks_of = SimpleNamespace(remote=lambda node_id: Handle(self.board.peaks_of(node_id)))
        self.add_peaks = SimpleNamespace(remote=self._add_peaks)
        self.mark = SimpleNamespace(remote=lambda *args: Handle(self.board.mark(*args)))
        self.stop_asked = SimpleNamespace(remote=lambda key: Handle(self.board.stop_asked(key)))

    def _add_peaks(self, node_id: str, measured: list) -> None:
        self.added.append((node_id, measured))
        self.board.add_peaks(node_id, measured)


class NodeRay:
    """What ``run_point`` uses of the ``ray`` module inside a task on node ``node_id``; also what
    ``_peaks_of`` finds as ``import ray`` (the tests put it in sys.modules)."""

    def __init__(self, node_id: str, machine: str, fail_get: bool = False):
        self.node_id, self.machine, self.fail_get = node_id, machine, fail_get
        self.util = SimpleNamespace(get_node_ip_address=lambda: "10.0.0.2")
        self.get_timeouts: list[float | None] = []
        self.exceptions = SimpleNamespace(RayActorError=RayActorError, ActorDiedError=ActorDiedError)

    def get_runtime_context(self) -> Any:
        return SimpleNamespace(
            get_node_id=lambda: self.node_id,
            get_node_labels=lambda: {"suite-machine": self.machine},
            get_task_id=lambda: "task-1",
        )

    def get_gpu_ids(self) -> list[int]:
        return []

    def get(self, ref: Handle, *, timeout: float | None = None) -> Any:
        self.get_timeouts.append(timeout)
        if self.fail_get:
            raise RuntimeError("the board is gone")
        if isinstance(ref.value, BaseException):
            raise ref.value
        return ref.value


@dataclass
class PeakBackend:
    """A node's backend whose runs all end ok; a run asked to calibrate measures ``flops_per_s``."""

    flops_per_s: float = 5e9
    name: str = "local"
    image_override: Any = None
    calibrate_asked: list[bool] = field(default_factory=list)
    closes: int = 0

    def skip_reason(self, spec: plan.RunSpec) -> str | None:
        return None

    def skipped(self, spec: plan.RunSpec, reason: str) -> RunResult:
        raise AssertionError("no run is skipped here")

    def run(self, spec: plan.RunSpec) -> RunResult:
        self.calibrate_asked.append(spec.calibrate_peak)
        now = base.now_iso()
        run = {"backend": self.name, "machine": "node", "started_at": now, "finished_at": now}
        work = {"peak": {"flops_per_s": self.flops_per_s}} if spec.calibrate_peak else {}
        return RunResult(status="ok", spec=spec.to_dict(), run=run, work=work)

    def close(self) -> None:
        self.closes += 1


def _job(key: str, peaks: dict[str, list] | None = None) -> dict[str, Any]:
    """A job as ``RayPool.submit`` sends it; ``peaks``: the orchestrator's copy, by node id."""
    job = {"suite": {}, "session": "s1", "address": "local", "key": key, "attempt": 1, "gpu_model": None}
    return {**job, "peaks": peaks or {}}


def _on_node(
    monkeypatch: pytest.MonkeyPatch, spec: plan.RunSpec, node_id: str, backend: PeakBackend, board: Any, job: dict
) -> dict[str, Any]:
    """``run_point`` of ``spec`` on node ``node_id`` (machine ``m-<node_id>``)."""
    ray = NodeRay(node_id, f"m-{node_id}")
    monkeypatch.setitem(sys.modules, "ray", ray)  # _peaks_of imports it
    monkeypatch.setattr(ray_task, "_node_backend", lambda _machine, _job: backend)
    return ray_task.run_point(spec.to_dict(), job, ray, board)


def test_a_nodes_later_runs_reuse_its_peak_calibration_from_the_board(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu, _ = specs_of(tmp_path)
    later, _ = specs_of(tmp_path, "later")  # another scenario's cpu point: the same peak key
    backend = PeakBackend()
    key = peak_cache.peak_key(cpu, backend)
    assert peak_cache.peak_key(later, backend) == key
    actor = BoardActor()
    elsewhere = {"flops_per_s": 1.0, "measured_in": "x-r1"}
    actor.board.add_peaks("n3", [[list(key), elsewhere]])  # another node's calibration: not this node's

    first = _on_node(monkeypatch, cpu, "n2", backend, actor, _job("k1"))
    assert backend.calibrate_asked == [True], "no calibration of n2 yet: the run measures the peak"
    measured = [[list(key), {"flops_per_s": 5e9, "measured_in": cpu.run_id}]]
    assert actor.added == [("n2", measured)] and first["peaks"] == measured, "what it measured goes to the board"
    assert RunResult.from_dict(first["result"]).work["peak"] == {"flops_per_s": 5e9}

    second = _on_node(monkeypatch, later, "n2", backend, actor, _job("k2"))
    assert backend.calibrate_asked == [True, False], "n2's first calibration serves"
    peak = RunResult.from_dict(second["result"]).work["peak"]
    assert peak == {"flops_per_s": 5e9, "measured_in": cpu.run_id, "source": "cached"}
    assert len(actor.added) == 1 and second["peaks"] == [], "nothing new measured: nothing sent"

    third = _on_node(monkeypatch, later, "n3", backend, actor, _job("k3"))
    assert backend.calibrate_asked == [True, False, False]
    assert RunResult.from_dict(third["result"]).work["peak"] == {**elsewhere, "source": "cached"}, "n3's own"
    assert actor.board.snapshot()["k2"]["backend"] == "local", "the task's marks reach the board too"


def test_the_board_wins_over_the_jobs_copy_and_the_jobs_copy_serves_without_a_board(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu, _ = specs_of(tmp_path)
    backend = PeakBackend()
    key = list(peak_cache.peak_key(cpu, backend))
    stale = {"n2": [[key, {"flops_per_s": 3.0, "measured_in": "old-r1"}]]}
    actor = BoardActor()
    actor.board.add_peaks("n2", [[key, {"flops_per_s": 7.0, "measured_in": "new-r1"}]])
    with_board = _on_node(monkeypatch, cpu, "n2", backend, actor, _job("k1", stale))
    assert RunResult.from_dict(with_board["result"]).work["peak"]["flops_per_s"] == 7.0
    without = _on_node(monkeypatch, cpu, "n2", backend, None, _job("k2", stale))
    assert RunResult.from_dict(without["result"]).work["peak"]["flops_per_s"] == 3.0
    assert backend.calibrate_asked == [False, False]


def test_peaks_of_asks_the_board_with_a_time_limit_and_without_it_measures(monkeypatch: pytest.MonkeyPatch) -> None:
    actor = BoardActor()
    actor.board.add_peaks("n2", [[["k"], {"flops_per_s": 1.0}]])
    ray = NodeRay("n2", "m")
    monkeypatch.setitem(sys.modules, "ray", ray)
    assert ray_board.peaks_of(actor, "n2") == [[["k"], {"flops_per_s": 1.0}]]
    assert ray.get_timeouts and ray.get_timeouts[0] is not None, "a board that never answers must not hang a run"
    monkeypatch.setitem(sys.modules, "ray", NodeRay("n2", "m", fail_get=True))
    assert ray_board.peaks_of(actor, "n2") == [], "no board: the run measures its own peak"


def test_the_board_answers_a_starting_task_whether_the_plan_is_stopping() -> None:
    board = ray_board.Board()
    assert board.mark("k1", "started", 0.0, {}) == ""
    board.stop(["k1"])
    assert board.stop_asked("k1") and not board.stop_asked("k2"), "a deadline stops one attempt"
    assert board.mark("k2", "started", 0.0, {}) == ""
    board.stop(None)
    assert board.mark("k3", "started", 0.0, {}) == ray_board.ASKED, "after a stop of every attempt, a new one stops"
    assert "started_for_s" in board.snapshot()["k3"], "and it is marked started: the orchestrator waits for it"


def test_the_board_tells_a_task_that_starts_after_the_budget_not_to_start_its_run() -> None:
    board = ray_board.Board()
    board.close_starts_in(3600)
    assert board.mark("k1", "started", 0.0, {}) == "", "within the budget"
    board.close_starts_in(0)
    assert board.mark("k2", "started", 0.0, {}) == ray_board.NOT_STARTED
    assert board.mark("k1", "ready", 0.0, {}) == "" and not board.stop_asked("k1"), "a started run goes on"
    board.stop(None)
    assert board.mark("k3", "started", 0.0, {}) == ray_board.ASKED, "a stop says so first"


def test_a_task_that_starts_after_the_stop_runs_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cpu, _ = specs_of(tmp_path)
    backend = PeakBackend()
    actor = BoardActor()
    actor.board.stop(None)
    out = _on_node(monkeypatch, cpu, "n2", backend, actor, _job("k1"))
    assert out == {"machine": "m-n2", "node_id": "n2", "stopped": "asked"}
    assert backend.calibrate_asked == [], "no run started"


def test_a_stop_asked_while_the_image_is_made_starts_no_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray_task, "STEP_S", 0.01)
    monkeypatch.setattr(ray_task, "ASK_EVERY_S", 0.05)
    monkeypatch.setattr(ray_task, "_ensure_image", lambda _backend, _spec: time.sleep(0.5))  # a build
    cpu, _ = specs_of(tmp_path)
    backend = PeakBackend()
    actor = BoardActor()
    timer = threading.Timer(0.1, actor.board.stop, args=[None])  # Ctrl-C on the orchestrator, mid-build
    timer.start()
    try:
        out = _on_node(monkeypatch, cpu, "n2", backend, actor, _job("k1"))
    finally:
        timer.cancel()
    assert out == {"machine": "m-n2", "node_id": "n2", "stopped": "asked"}
    assert backend.calibrate_asked == [], "the build ended after the stop: no run started after it"
    assert "ready_for_s" not in actor.board.snapshot()["k1"], "never ready: its deadline never started"


@dataclass
class BlockingBackend(PeakBackend):
    """A node's backend whose run waits for its container until ``close`` kills it."""

    killed: threading.Event = field(default_factory=threading.Event)

    def run(self, spec: plan.RunSpec) -> RunResult:
        self.killed.wait(30)
        return super().run(spec)  # what a killed run would report: dropped for "stopped"

    def close(self) -> None:
        super().close()
        self.killed.set()


def test_a_stop_asked_mid_run_kills_the_run_and_the_task_says_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ray_task, "STEP_S", 0.01)
    monkeypatch.setattr(ray_task, "ASK_EVERY_S", 0.05)
    cpu, _ = specs_of(tmp_path)
    backend = BlockingBackend()
    actor = BoardActor()
    timer = threading.Timer(0.3, actor.board.stop, args=[["k1"]])  # the orchestrator, 0.3 s in
    timer.start()
    try:
        began = time.monotonic()
        out = _on_node(monkeypatch, cpu, "n2", backend, actor, _job("k1"))
    finally:
        timer.cancel()
    assert out == {"machine": "m-n2", "node_id": "n2", "stopped": "asked"}
    assert backend.closes == 1 and backend.killed.is_set(), "the backend's close killed the run"
    assert time.monotonic() - began < 5, "stopped within a few asks, not at the run's end"


def test_a_board_that_died_stops_a_run_and_a_slow_or_unavailable_one_does_not() -> None:
    ray = NodeRay("n2", "m")

    def says(value: Any) -> str | None:
        return ray_board._board_says_stop(ray, lambda: Handle(value))

    assert says(True) == ray_board.ASKED and says(False) is None
    assert says(ActorDiedError("the orchestrator's job ended")) == ray_board.BOARD_GONE
    assert says(ActorUnavailableError("the head is recovering")) is None, "for a while: the run goes on"
    assert says(GetTimeoutError("slow")) is None
    assert set(ray.get_timeouts) == {ray_head.GCS_CALL_S}, "asked with a time limit"
    assert ray_board.stop_asked(ray, None, "k") is None, "no board: nothing stops the run"


# --- run_plan with a stand-in pool ------------------------------------------------------------


@dataclass
class StandInPool:
    """The pool protocol run_plan uses: collect hands out ``batches`` in turn (an exception in
    a batch is raised instead)."""

    machine: str = "orchestrator"
    where: str = "the test pool"
    skip: dict[str, str] = field(default_factory=dict)  # device -> reason
    batches: list[Any] = field(default_factory=list)
    submitted: list[plan.RunSpec] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    outstanding: int = 0
    ended_while_cancelling: list[Finished] = field(default_factory=list)  # what cancel_all hands back
    holding: list[Finished] = field(default_factory=list)  # handed out by collect, not yet saved
    cancel_raises: BaseException | None = None  # raised by cancel_all after it took what ended (a second Ctrl-C)
    unstarted: int = 0  # none: these tests give no budget

    def counts_as_done(self, result: RunResult) -> bool:
        return "ray" in result.run

    def skip_reason(self, spec: plan.RunSpec) -> str | None:
        return self.skip.get(spec.device)

    def skipped(self, spec: plan.RunSpec, reason: str) -> RunResult:
        now = base.now_iso()
        run = {"backend": "ray", "machine": self.machine, "started_at": now, "finished_at": now}
        return RunResult(status="skipped", spec=spec.to_dict(), message=reason, run=run)

    def submit(self, spec: plan.RunSpec) -> None:
        self.submitted.append(spec)
        self.outstanding += 1

    @property
    def pending(self) -> int:
        return self.outstanding

    def collect(self, timeout: float = 1.0) -> list[Finished]:
        batch = self.batches.pop(0)
        if isinstance(batch, BaseException):
            raise batch
        self.holding += batch
        return list(self.holding)

    def saved(self, done: Finished) -> None:
        self.holding.remove(done)
        self.outstanding -= 1

    def cancel_all(self, say: Any = print) -> list[Finished]:
        self.calls.append("cancel_all")
        self.holding += self.ended_while_cancelling
        self.outstanding += len(self.ended_while_cancelling)
        self.ended_while_cancelling = []
        if self.cancel_raises is not None:
            raise self.cancel_raises
        return list(self.holding)

    def held(self) -> list[Finished]:
        return list(self.holding)

    def close(self) -> None:
        self.calls.append("close")


def _on_disk(res: Path, machine: str, spec: plan.RunSpec) -> list[RunResult]:
    folder = res / machine / spec.scenario
    return [results.load(p) for p in sorted(folder.glob(f"{spec.run_id}*.json"))]


def test_results_are_saved_under_the_machine_each_came_from(tmp_path: Path) -> None:
    cpu, gpu = specs_of(tmp_path)
    pool = StandInPool()
    pool.batches = [
        [],
        [Finished(gpu, "node-b", ok_result(gpu, "node-b"))],
        [Finished(cpu, "node-a", ok_result(cpu, "node-a"))],
    ]
    res = tmp_path / "res"
    summary = runner.run_plan([cpu, gpu], pool, res, pool.machine, say=lambda _line: None)
    assert pool.submitted == [cpu, gpu]
    assert [r.status for r in _on_disk(res, "node-a", cpu)] == ["ok"]
    assert [r.status for r in _on_disk(res, "node-b", gpu)] == ["ok"]
    assert not (res / "orchestrator").exists()
    assert summary.counts["ok"] == 2 and not summary.failed
    assert pool.calls == ["close"]


def test_a_result_of_a_node_whose_label_is_no_folder_name_is_read_back_by_report(tmp_path: Path) -> None:
    """A node's result whose ``suite-machine`` label breaks the name rule goes to unsafe-label-<hash>/,
    and names that folder as its machine: a report reads it back, and the label is kept beside it."""
    cpu, gpu = specs_of(tmp_path)
    label = "_node/a\x1b[2J"
    pool = StandInPool()
    pool.batches = [[Finished(cpu, label, ok_result(cpu, label)), Finished(gpu, "node-b", ok_result(gpu, "node-b"))]]
    res = tmp_path / "res"
    lines: list[str] = []
    summary = runner.run_plan([cpu, gpu], pool, res, pool.machine, say=lines.append)
    assert summary.counts["ok"] == 2 and not summary.failed, lines
    [folder] = [p for p in res.iterdir() if p.name.startswith("unsafe-label-")]
    [saved] = _on_disk(res, folder.name, cpu)
    assert saved.run["machine"] == folder.name and saved.run["machine_label"] == label
    proc = suite_cli(
        "report", "--results", res, "--out", tmp_path / "out", env={"SUITE_CACHE_DIR": str(tmp_path / "c")}
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert folder.name in (tmp_path / "out" / "hardware.md").read_text()


def test_a_run_ok_in_another_folder_of_the_pool_is_already_done(tmp_path: Path) -> None:
    cpu, gpu = specs_of(tmp_path)
    res = tmp_path / "res"
    saving.save(ok_result(cpu, "node-b"), res / "node-b" / cpu.scenario, cpu.run_id)
    not_ray = RunResult(status="ok", spec=gpu.to_dict(), run={"backend": "docker", "machine": "elsewhere"})
    saving.save(not_ray, res / "elsewhere" / gpu.scenario, gpu.run_id)  # no Ray node made it
    pool = StandInPool()
    pool.batches = [[Finished(gpu, "node-a", ok_result(gpu, "node-a"))]]
    lines: list[str] = []
    summary = runner.run_plan([cpu, gpu], pool, res, pool.machine, say=lines.append)
    assert pool.submitted == [gpu], "the cpu run is ok in node-b's folder"
    assert summary.counts["already done"] == 1 and summary.counts["ok"] == 1
    assert any("already done" in line for line in lines), lines


def test_skips_are_saved_in_the_orchestrators_folder(tmp_path: Path) -> None:
    cpu, gpu = specs_of(tmp_path)
    reason = "needs 2 GPU(s) on one node; the largest node of the test pool has 0"
    pool = StandInPool(skip={"gpu:2": reason})
    pool.batches = [[Finished(cpu, "node-a", ok_result(cpu, "node-a"))]]
    res = tmp_path / "res"
    summary = runner.run_plan([cpu, gpu], pool, res, pool.machine, say=lambda _line: None)
    assert pool.submitted == [cpu]
    [skip] = _on_disk(res, "orchestrator", gpu)
    assert skip.status == "skipped" and skip.message == reason
    assert summary.counts["skipped"] == 1 and summary.counts["ok"] == 1


def test_an_interrupt_cancels_closes_and_keeps_what_arrived(tmp_path: Path) -> None:
    cpu, gpu = specs_of(tmp_path)
    pool = StandInPool()
    pool.batches = [[Finished(cpu, "node-a", ok_result(cpu, "node-a"))], KeyboardInterrupt()]
    res = tmp_path / "res"
    with pytest.raises(KeyboardInterrupt):
        runner.run_plan([cpu, gpu], pool, res, pool.machine, say=lambda _line: None)
    assert pool.calls == ["cancel_all", "close"]
    assert [r.status for r in _on_disk(res, "node-a", cpu)] == ["ok"]
    assert not _on_disk(res, "node-b", gpu) and not _on_disk(res, "node-a", gpu)


def test_an_interrupt_saves_the_runs_that_ended_while_the_others_were_cancelled(tmp_path: Path) -> None:
    cpu, gpu = specs_of(tmp_path)
    pool = StandInPool()
    pool.batches = [KeyboardInterrupt()]
    pool.ended_while_cancelling = [Finished(gpu, "node-b", ok_result(gpu, "node-b"))]
    res = tmp_path / "res"
    lines: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        runner.run_plan([cpu, gpu], pool, res, pool.machine, say=lines.append)
    assert pool.calls == ["cancel_all", "close"]
    assert [r.status for r in _on_disk(res, "node-b", gpu)] == ["ok"], "on disk after the interrupt"
    assert not _on_disk(res, "node-a", cpu) and not _on_disk(res, "orchestrator", cpu)
    assert any("on node-b: ok" in line and "[2/2]" in line for line in lines), lines


# --- the command line ------------------------------------------------------------------------------

# Every point needs 64 GPUs: no run starts, and nothing needs TensorFlow.
REFUSED = """\
name: rayrefusals
question: Is a bad Ray command refused?
device: gpu:64
repeats: 1
"""


def _refused(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    for word in words:
        assert word in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--ray-address", "127.0.0.1:6379"), ("--ray-address is for --backend ray",)),
        (("--backend", "local", "--gpu-model", "H100"), ("--gpu-model is for --backend ray", "--backend local")),
        (("--backend", "ray", "--docker-host", "tcp://127.0.0.1:9"), ("--backend ray", "drop --docker-host")),
        (("--backend", "ray", "--gpus", "0"), ("--backend ray", "drop --gpus")),
        (("--backend", "ray", "--gpu-model", "a b"), ("--gpu-model 'a b'", "a resource name")),
        # An unset variable ("--ray-address $HEAD") must not run the plan on a local instance here.
        (("--backend", "ray", "--ray-address", ""), ("--ray-address is empty", "HOST:PORT")),
        (("--backend", "ray", "--ray-address", "  "), ("--ray-address is empty",)),
    ],
    ids=["address-without-ray", "model-without-ray", "docker-host", "gpus", "bad-model", "empty-address", "blank"],
)
def test_cli_refuses_ray_flags_that_do_not_fit(tmp_path: Path, args: tuple[str, ...], words: tuple[str, ...]) -> None:
    res = tmp_path / "res"
    proc = suite_cli("run", write_scenario(tmp_path, "rayrefusals", REFUSED), *args, "--results", res, timeout=120)
    _refused(proc, *words)
    assert not res.exists() or not list(res.rglob("*.json"))


def test_check_refuses_the_ray_flags_without_the_ray_backend(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, "rayrefusals", REFUSED)
    proc = suite_cli("check", path, "--backend", "local", "--ray-address", "127.0.0.1:6379", timeout=120)
    _refused(proc, "--ray-address is for --backend ray")


def test_cli_without_ray_names_the_locked_install(tmp_path: Path) -> None:
    fake = tmp_path / "noray" / "ray"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('no ray here')\n", encoding="utf-8")
    env = {"PYTHONPATH": f"{fake.parent}{os.pathsep}{REPO}"}
    scenario_file = write_scenario(tmp_path, "rayrefusals", REFUSED)
    proc = suite_cli("run", scenario_file, "--backend", "ray", "--results", tmp_path / "res", env=env, timeout=120)
    lock = f"requirements/locks/cluster-py{sys.version_info.major}.{sys.version_info.minor}.txt"
    _refused(proc, "--backend ray: Ray is not installed", lock, "--require-hashes")


def test_backends_import_with_the_standard_library_only() -> None:
    code = "import sys; from suite.backends import environment_of; print(environment_of(sys.argv[1]))"
    for name, env in (("ray", "cluster"), ("auto", "run"), ("local", "run"), ("nonesuch", "run")):
        proc = subprocess.run(
            [sys.executable, "-S", "-c", code, name], cwd=REPO, capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == env, (name, proc.stdout)


def _fake_python(path: Path) -> None:
    # Passes the 3.11 floor and says it is 3.13, for which no lock exists: ensure_venv stops there,
    # naming the environment it was asked for, before anything is installed.
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        '#!/bin/sh\ncase "$2" in\n  *version_info*) exit 0 ;;\n  *python_version*) echo 3.13.0 ;;\nesac\n',
        encoding="utf-8",
    )
    path.chmod(0o755)


def _run_all(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    venv = tmp_path / "venv"
    _fake_python(venv / "bin" / "python")
    base = {k: v for k, v in os.environ.items() if k not in ("SUITE_ENV", "SUITE_WORKER_REQUIREMENTS")}
    return subprocess.run(
        ["./run_all.sh", "--smoke", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**base, "SUITE_VENV": str(venv), **env},
    )


@pytest.mark.parametrize("args", [("--backend", "ray"), ("--backend=ray",)], ids=["two-words", "equals"])
def test_run_all_picks_the_cluster_environment_for_ray(tmp_path: Path, args: tuple[str, ...]) -> None:
    proc = _run_all(tmp_path, *args)
    assert proc.returncode == 1, proc.stderr
    assert "Locks of environment 'cluster' exist for Python" in proc.stderr, proc.stderr


def test_run_all_keeps_the_run_environment_for_other_backends(tmp_path: Path) -> None:
    proc = _run_all(tmp_path, "--backend", "local")
    assert "Locks of environment 'run' exist for Python" in proc.stderr, proc.stderr


def test_run_all_refuses_ray_in_the_run_environment(tmp_path: Path) -> None:
    proc = _run_all(tmp_path, "--backend", "ray", SUITE_ENV="run")
    assert proc.returncode == 2, proc.stderr
    assert "--backend ray needs the cluster environment" in proc.stderr, proc.stderr
    assert "SUITE_ENV=run is set" in proc.stderr, proc.stderr


# --- gpu_model in the plan -------------------------------------------------------------------------


def test_an_unset_gpu_model_leaves_the_fingerprint_as_it_was(tmp_path: Path) -> None:
    cpu, _ = specs_of(tmp_path)
    assert cpu.config["gpu_model"] is None
    without = {k: v for k, v in cpu.config.items() if k != "gpu_model"}
    assert plan.fingerprint_of(replace(cpu, config=without)) == plan.fingerprint_of(cpu)
    model = replace(cpu, config={**cpu.config, "gpu_model": "H100"})
    assert plan.fingerprint_of(model) != plan.fingerprint_of(cpu)
    other = replace(cpu, config={**cpu.config, "gpu_model": "A100"})
    assert plan.fingerprint_of(other) != plan.fingerprint_of(model)


def test_a_bad_gpu_model_in_a_scenario_names_the_file_and_key(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, "badmodel", SCENARIO.format(name="badmodel") + 'gpu_model: "a b"\n')
    with pytest.raises(scenario.ScenarioError) as info:
        scenario.load(path)
    joined = "\n".join(info.value.problems)
    assert str(path) in joined and "'gpu_model'" in joined and "'a b'" in joined and "line 6" in joined, joined


# --- the head going away, through the command line -------------------------------------------------


def test_cli_says_the_cluster_stopped_answering_and_ends_the_process_with_1(
    tmp_path: Path, no_real_ray: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The summary is printed and flushed, then os._exit(1): Ray's own shutdown would block."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    address = f"127.0.0.1:{probe.getsockname()[1]}"
    probe.close()  # nothing listens there: every check of the head is refused
    fake = StandInRay(gcs_address=address, node_list=cluster())
    monkeypatch.setattr(ray_head, "import_ray", lambda: fake)
    exits: list[int] = []

    def _exit(code: int) -> None:
        exits.append(code)
        raise SystemExit(code)  # the process would end here; this one (pytest's) goes on

    monkeypatch.setattr(cli.os, "_exit", _exit)
    cpu_only = "name: headgone\nquestion: Does the plan end?\nrepeats: 1\ndata: {allow_synthetic: true}\n"
    path = write_scenario(tmp_path, "headgone", cpu_only)
    args = ["run", str(path), "--backend", "ray", "--ray-address", address, "--smoke", "--machine", "orch"]
    with pytest.raises(SystemExit) as info:
        cli.main([*args, "--results", str(tmp_path / "res")])
    out = capsys.readouterr()
    said = out.out + out.err
    assert info.value.code == 1 and exits == [1], said
    assert re.search(rf"Ray cluster at {re.escape(address)} stopped answering", said), said
    assert "Traceback" not in said
    assert fake.submissions and fake.shutdowns == 0, "no shutdown once the head is gone"
    assert [w["timeout"] for w in fake.waits] == [0], "only a look, without waiting, at what reached the driver"


def test_check_shows_which_points_the_cluster_can_place(
    tmp_path: Path, no_real_ray: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A node whose label holds a terminal escape: check prints it escaped, not for the terminal to obey.
    hostile = node("n4", "node-c", suite_slot=1, **{"gpu_model:\x1b[2J": 1})
    fake = StandInRay(gcs_address=None, node_list=[*cluster(), hostile])
    monkeypatch.setattr(ray_head, "import_ray", lambda: fake)
    synthetic = "data: {allow_synthetic: true}\n"  # no MNIST here: with --allow-synthetic, run would take the plan
    nobody = write_scenario(tmp_path, "nobody", SCENARIO.format(name="nobody") + "gpu_model: C\n" + synthetic)
    anyone = write_scenario(tmp_path, "anyone", SCENARIO.format(name="anyone") + synthetic)
    res = tmp_path / "res"
    cpu, gpu = plan.expand(scenario.load(anyone))  # as check plans them
    # On file: the cpu run by a Ray node (whose folder no node of the cluster names any more), the
    # gpu run by a plain docker run of some machine: only the first is this pool's.
    saving.save(ok_result(cpu, "gone-node"), res / "gone-node" / cpu.scenario, cpu.run_id)
    not_ray = RunResult(status="ok", spec=gpu.to_dict(), run={"backend": "docker", "machine": "box"})
    saving.save(not_ray, res / "box" / gpu.scenario, gpu.run_id)
    args = [
        "check",
        str(nobody),
        str(anyone),
        "--backend",
        "ray",
        "--ray-address",
        "10.0.0.1:6379",
        "--allow-synthetic",
    ]
    rc = cli.main([*args, "--results", str(res), "--machine", "orch"])
    out = capsys.readouterr().out
    assert rc == 0, out
    rows, skipped = check_rows(out), check_skipped(out)
    where = "the Ray cluster at 10.0.0.1:6379"
    assert rows["device=cpu"]["scenario"] == rows["device=gpu:2"]["scenario"] == "anyone", out
    assert skipped["device=cpu"].endswith(f"skipped: no node of {where} offers gpu_model:C"), out
    # The line of skipped points keeps the short reason; the detail is said once, below.
    assert out.count("skipped, in full: ") == 1, out
    full = said(out, "skipped, in full: ")
    assert full.startswith(f"skipped, in full: no node of {where} offers gpu_model:C (offered: "), full
    assert "gpu_model:A" in full and "gpu_model:\\x1b[2J" in full and "\x1b" not in out, full
    assert rows["device=cpu"]["plan here"] == "done (ok on file)", out
    assert rows["device=gpu:2"]["plan here"] == "will run", out
    line = said(out, "backend: ")
    assert "backend: ray (--backend)" in line and "(none yet)" not in line, line
    assert str(Path("res") / "box") in line and str(Path("res") / "gone-node") in line, line
    assert fake.inits[0]["address"] == "10.0.0.1:6379" and fake.shutdowns == 1 and not fake.submissions


def test_a_lost_run_whose_retry_succeeds_does_not_fail_the_plan(tmp_path: Path) -> None:
    cpu, _ = specs_of(tmp_path)
    now = base.now_iso()
    lost = RunResult(
        status="error",
        spec=cpu.to_dict(),
        message="node lost: node node-b1 of the test pool died during the run",
        run={"backend": "ray", "machine": "node-b1", "started_at": now, "finished_at": now, "ray": {"attempt": 1}},
    )
    retry = ok_result(cpu, "node-b2", attempt=2)
    pool = StandInPool()
    pool.batches = [[Finished(cpu, "node-b1", lost, retried=True)], [Finished(cpu, "node-b2", retry)]]
    lines: list[str] = []

    def collect(timeout: float = 1.0) -> list[Finished]:
        batch = pool.batches.pop(0)
        if batch[0].retried:
            pool.outstanding += 1  # the pool submitted the retry
        pool.holding += batch
        return list(pool.holding)

    pool.collect = collect  # type: ignore[method-assign]
    res = tmp_path / "res"
    summary = runner.run_plan([cpu], pool, res, pool.machine, say=lines.append)
    assert summary.counts == {"error, retried": 1, "ok": 1} and not summary.failed, summary.counts
    assert [r.status for r in _on_disk(res, "node-b1", cpu)] == ["error"], "the lost attempt is kept"
    assert any("(retry) on node-b2: ok" in line for line in lines), lines


def test_a_node_list_that_does_not_come_serves_the_last_one(
    head: socket.socket, no_real_ray: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A head that dies during ray.nodes() leaves Ray's client waiting until Ray ends the process.
    monkeypatch.setattr(ray_head, "GCS_CALL_S", 0.2)
    pool, fake, clock = make_pool(head)
    first = pool.nodes()
    hang = threading.Event()
    monkeypatch.setattr(fake, "nodes", lambda: hang.wait(30) and [])
    started = time.monotonic()
    assert pool.nodes(max_age_s=0) == first, "the list seen last"
    assert time.monotonic() - started < 5
    hang.set()


def test_a_first_node_list_that_does_not_come_is_said(
    head: socket.socket, no_real_ray: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ray_head, "GCS_CALL_S", 0.2)
    pool, fake, _ = make_pool(head)
    hang = threading.Event()
    monkeypatch.setattr(fake, "nodes", lambda: hang.wait(30) and [])
    with pytest.raises(base.BackendUnavailable, match="did not list its nodes in 0.2 s"):
        pool.nodes()
    hang.set()


def test_within_returns_raises_or_gives_up() -> None:
    assert ray_threads.within(1, lambda: 7) == 7
    with pytest.raises(ValueError, match="bad"):
        ray_threads.within(1, lambda: (_ for _ in ()).throw(ValueError("bad")))
    gate = threading.Event()
    assert ray_threads.within(0.1, lambda: gate.wait(10)) is None
    gate.set()


def test_a_task_given_other_gpus_gets_a_backend_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    # A Ray worker process serves many tasks; a backend keeps the GPU pool it read from the
    # CUDA_VISIBLE_DEVICES Ray set for its first task, so one cached for GPU 0 must not run GPU 1's.
    from suite.environment import docker_engine

    monkeypatch.setattr(docker_engine, "engine_answers", lambda _host=None: False)
    monkeypatch.setattr(provenance, "venv_environment", lambda *_a, **_k: {"kind": "venv"})
    monkeypatch.setattr(ray_task, "_node_backends", {})
    job = {"session": "s1", "suite": {"git_revision": "abc"}}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    first = ray_task._node_backend("node-a", job)
    assert ray_task._node_backend("node-a", job) is first, "the same GPUs: the same backend"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    second = ray_task._node_backend("node-a", job)
    assert second is not first and second.name == "local"
    assert second.suite_provenance() == {"git_revision": "abc"}, "the shipped checkout's identity"


# --- nothing that came back is lost; nothing a task started outlives it ---------------------------


def test_a_result_handed_out_but_not_saved_comes_back_from_cancel_all(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    pool, fake, _ = make_pool(head)
    cpu, gpu = specs_of(tmp_path)
    pool.submit(cpu)
    pool.submit(gpu)
    fake.finish(
        fake.submissions[0].ref, {"machine": "node-b1", "node_id": "n2", "result": ok_result(cpu, "node-b1").to_dict()}
    )
    [handed] = pool.collect(timeout=0)  # an interrupt comes before the runner saved it
    assert pool.collect(timeout=0) == [handed], "held until saved"
    assert pool.pending == 2
    back = pool.cancel_all(say=lambda _line: None)
    assert back == [handed] and pool.pending == 1, "still held until it is saved"
    pool.saved(handed)
    assert pool.pending == 0


def test_an_interrupt_between_two_saves_keeps_the_second_result_and_saves_the_first_once(tmp_path: Path) -> None:
    cpu, gpu = specs_of(tmp_path)
    pool = StandInPool(outstanding=2)
    pool.batches = [
        [Finished(cpu, "node-a", ok_result(cpu, "node-a")), Finished(gpu, "node-b", ok_result(gpu, "node-b"))]
    ]
    res = tmp_path / "res"
    interrupted = []

    def say(line: str) -> None:
        if " on node-a: ok" in line and not interrupted:  # the line after the first save: Ctrl-C there
            interrupted.append(line)
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        runner.run_plan([cpu, gpu], pool, res, pool.machine, say=say)
    assert interrupted
    assert [r.status for r in _on_disk(res, "node-b", gpu)] == ["ok"], "the second result reached the disk"
    assert [r.status for r in _on_disk(res, "node-a", cpu)] == ["ok"], "the first once, not again"


def test_a_second_interrupt_during_the_cancel_still_saves_what_the_pool_holds(tmp_path: Path) -> None:
    cpu, gpu = specs_of(tmp_path)
    pool = StandInPool(outstanding=2)
    pool.batches = [KeyboardInterrupt()]
    pool.holding = [Finished(cpu, "node-a", ok_result(cpu, "node-a"))]  # taken from Ray, not saved yet
    pool.ended_while_cancelling = [Finished(gpu, "node-b", ok_result(gpu, "node-b"))]
    pool.cancel_raises = KeyboardInterrupt()  # Ctrl-C again during the cancel's wait
    res = tmp_path / "res"
    with pytest.raises(KeyboardInterrupt):
        runner.run_plan([cpu, gpu], pool, res, pool.machine, say=lambda _line: None)
    assert [r.status for r in _on_disk(res, "node-a", cpu)] == ["ok"]
    assert [r.status for r in _on_disk(res, "node-b", gpu)] == ["ok"]
    assert pool.calls == ["cancel_all", "close"]


def test_a_worker_crash_waits_for_rays_verdict_on_its_node_without_holding_the_plan(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    pool, fake, clock = make_pool(head)
    cpu, gpu = specs_of(tmp_path)
    pool.submit(replace(cpu, config={**cpu.config, "gpu_model": "B"}))
    pool.submit(gpu)
    started(fake, 0, "n2", "node-b1")
    started(fake, 1, "n3", "node-b2")
    fake.fail(fake.submissions[0].ref, WorkerCrashedError("the worker died"))
    t = time.monotonic()
    assert take(pool) == [] and time.monotonic() - t < 2, "no wait for the health check inside one poll"
    assert pool.pending == 2
    fake.finish(
        fake.submissions[1].ref, {"machine": "node-b2", "node_id": "n3", "result": ok_result(gpu, "node-b2").to_dict()}
    )
    [other] = take(pool)
    assert other.result.status == "ok", "the other run is saved meanwhile"
    fake.node_list[1]["Alive"] = False  # Ray declares node-b1 dead within the wait
    clock.t += 5
    [lost] = take(pool)
    assert "node lost" in lost.result.message and lost.retried and lost.machine == "node-b1"
    assert len(fake.submissions) == 3 and fake.submissions[2].job["retry_of"] == fake.key(0)


def test_a_retry_of_a_run_that_named_no_model_goes_to_the_lost_nodes_model(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    pool, fake, _ = make_pool(head)
    cpu, _ = specs_of(tmp_path)
    pool.submit(cpu)  # no gpu_model: Ray may put it anywhere
    take(pool)  # the node list as the pool saw it while node-b1 was alive
    started(fake, 0, "n2", "node-b1")
    fake.node_list[1]["Alive"] = False
    fake.fail(fake.submissions[0].ref, NodeDiedError("the node died"))
    [lost] = take(pool)
    assert lost.retried
    retry = fake.submissions[1]
    assert retry.options["resources"] == {"suite_slot": 1.0, "gpu_model:B": 0.001}, "pinned to node-b1's model"
    assert retry.job["pin"] == ["gpu_model:B"]


def test_a_lost_nodes_model_no_other_node_has_is_not_retried_elsewhere(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    pool, fake, _ = make_pool(head)
    cpu, _ = specs_of(tmp_path)
    pool.submit(cpu)
    take(pool)
    started(fake, 0, "n1", "node-a")
    fake.node_list[0]["Alive"] = False  # the only node of model A
    fake.fail(fake.submissions[0].ref, NodeDiedError("the node died"))
    [lost] = take(pool)
    assert not lost.retried and "not retried" in lost.result.message and "gpu_model:A" in lost.result.message
    assert len(fake.submissions) == 1


def test_rays_memory_monitor_killing_a_task_is_host_oom_and_its_node_is_swept(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    pool, fake, _ = make_pool(head)
    cpu, _ = specs_of(tmp_path)
    pool.submit(cpu)
    started(fake, 0, "n2", "node-b1")
    fake.fail(fake.submissions[0].ref, OutOfMemoryError("Task was killed due to the node running low on memory."))
    [oom] = take(pool)
    assert oom.result.status == "host_oom" and "memory monitor" in oom.result.message
    assert oom.machine == "node-b1"
    assert fake.sweeps == [("n2", (pool.session, fake.key(0)))], "the run's container outlives the killed task"
    pool.close()
    assert pool._sweeps == [], "waited for before the pool left"


def test_a_task_forced_at_its_deadline_is_swept_on_its_node(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    pool, fake, _ = make_pool(head)
    cpu, _ = specs_of(tmp_path)
    pool.submit(cpu)
    started(fake, 0, "n3", "node-b2", ready=time.time() - cpu.timeout_s - 5 - ray_pool.DEADLINE_MARGIN_S - 1)
    take(pool)
    [attempt] = pool._pending.values()
    attempt.cancelled_at -= ray_stopping.CANCEL_GRACE_S + 1
    take(pool)
    assert fake.cancels == [(fake.submissions[0].ref, True)]
    assert fake.sweeps == [("n3", (pool.session, fake.key(0)))]


def test_sweeps_that_do_not_end_are_said_and_not_waited_for_ever(
    tmp_path: Path, head: socket.socket, no_real_ray: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool, fake, a, b = two_started(tmp_path, head)
    fake.sweeps_answer = False
    said: list[str] = []
    pool.cancel_all(say=said.append)
    assert sorted(n for n, _ in fake.sweeps) == ["n1", "n2", "n3"]
    assert any("forced" in line for line in said) and any("did not sweep" in line for line in said), said


def test_a_crashed_run_still_undecided_at_a_cancel_is_recorded(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    pool, fake, _ = make_pool(head)
    cpu, _ = specs_of(tmp_path)
    pool.submit(cpu)
    started(fake, 0, "n2", "node-b1")
    fake.fail(fake.submissions[0].ref, WorkerCrashedError("the worker died"))
    assert take(pool) == [] and pool.pending == 1
    [crashed] = pool.cancel_all(say=lambda _line: None)
    assert crashed.result.status == "error" and "crashed" in crashed.result.message
    assert fake.sweeps == [("n2", (pool.session, fake.key(0)))], "its node is swept, as for a decided crash"
    pool.saved(crashed)
    assert pool.pending == 0


def test_a_run_tags_its_backend_with_the_plan_and_the_attempt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cpu, _ = specs_of(tmp_path)
    backend = PeakBackend()
    value = _on_node(monkeypatch, cpu, "n2", backend, None, _job("s1-7"))
    assert value["result"]["status"] == "ok"
    assert backend.tags == {"ray_plan": "s1", "ray_attempt": "s1-7"}


def test_a_gpu_run_through_an_engine_not_on_the_node_is_an_error_naming_it(tmp_path: Path) -> None:
    cpu, gpu = specs_of(tmp_path)
    remote = SimpleNamespace(name="docker", daemon=SimpleNamespace(address="tcp://10.0.0.5:2376"))
    local = SimpleNamespace(name="docker", daemon=SimpleNamespace(address="unix:///var/run/docker.sock"))
    problem = ray_task._gpu_mapping_problem(remote, gpu, "node-b1", ["5"])
    assert (
        problem and "tcp://10.0.0.5:2376" in problem and "(5)" in problem and "SUITE_RAY_NODE_BACKEND=local" in problem
    )
    assert ray_task._gpu_mapping_problem(local, gpu, "node-b1", ["5"]) is None
    assert ray_task._gpu_mapping_problem(remote, cpu, "node-b1", []) is None, "a CPU run needs no GPU mapping"
    assert ray_task._gpu_mapping_problem(SimpleNamespace(name="local"), gpu, "node-b1", ["5"]) is None


def test_an_ok_run_on_file_is_done_whatever_the_clocks_say_of_a_lost_attempt(tmp_path: Path) -> None:
    cpu, _ = specs_of(tmp_path)
    res = tmp_path / "res"
    ok = ok_result(cpu, "node-b2", attempt=2)
    ok = replace(ok, run={**ok.run, "finished_at": "2026-01-01T10:00:00+00:00"})  # node-b2's clock is behind
    lost = RunResult(
        status="error",
        spec=cpu.to_dict(),
        message="node lost",
        run={"backend": "ray", "machine": "node-b1", "finished_at": "2026-01-01T10:02:00+00:00", "ray": {"attempt": 1}},
    )
    saving.save(ok, res / "node-b2" / cpu.scenario, cpu.run_id)
    saving.save(lost, res / "node-b1" / cpu.scenario, cpu.run_id)
    previous = results_folder.pool_previous_runs(res, lambda r: "ray" in r.run)
    assert previous[(cpu.fingerprint, cpu.repetition)].ok


def test_without_ray_the_message_names_the_lock_by_its_full_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(base.BackendUnavailable) as info:
        ray_head.import_ray()
    lock = REPO / "requirements" / "locks" / f"cluster-py{sys.version_info.major}.{sys.version_info.minor}.txt"
    assert str(lock) in str(info.value) and "--require-hashes" in str(info.value)
    monkeypatch.setattr(paths, "REQUIREMENTS_DIR", REPO / "nowhere")
    with pytest.raises(base.BackendUnavailable) as info:
        ray_head.import_ray()
    assert "no cluster lock exists" in str(info.value), str(info.value)


def test_a_second_interrupt_in_the_grace_keeps_what_was_held_and_what_ended_by_then(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    pool, fake, a, b = two_started(tmp_path, head)
    cpu, gpu = specs_of(tmp_path)
    held = ok_result(cpu, "node-b1")
    fake.finish(a, {"machine": "node-b1", "node_id": "n2", "result": held.to_dict()})
    [taken] = pool.collect(timeout=0)  # handed out, not saved: the interrupt comes first
    wait = fake.wait

    def second_ctrl_c(refs: list[Ref], *, num_returns: int = 1, timeout: float | None = None) -> tuple[list, list]:
        if timeout == ray_stopping.CANCEL_GRACE_S:
            fake.finish(b, {"machine": "node-b2", "node_id": "n3", "result": ok_result(gpu, "node-b2").to_dict()})
            raise KeyboardInterrupt
        return wait(refs, num_returns=num_returns, timeout=timeout)

    fake.wait = second_ctrl_c  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        pool.cancel_all(say=lambda _line: None)
    kept = pool.held()
    assert kept[0] is taken and [d.machine for d in kept] == ["node-b1", "node-b2"], kept
    assert fake.cancels == [], "b had ended by the look after the interrupt: nothing to force"


def test_a_crashed_worker_undecided_when_the_head_goes_is_recorded_and_the_plan_ends(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    pool, fake, _ = make_pool(head)
    cpu, _ = specs_of(tmp_path)
    pool.submit(cpu)
    started(fake, 0, "n2", "node-b1")
    fake.fail(fake.submissions[0].ref, WorkerCrashedError("the worker died"))
    assert take(pool) == [] and pool.pending == 1
    head.close()
    [crashed] = take(pool)
    assert pool.gone and crashed.result.status == "error" and "stopped answering" in crashed.result.message
    assert pool.pending == 0, "the plan ends: nothing left to wait for"
    assert fake.sweeps == [], "no call to a cluster that is gone"


def test_a_pinned_retry_whose_model_is_gone_is_an_error_after_the_grace(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    pool, fake, clock = make_pool(head)
    cpu, _ = specs_of(tmp_path)
    pool.submit(cpu)
    take(pool)
    started(fake, 0, "n2", "node-b1")
    fake.node_list[1]["Alive"] = False
    fake.fail(fake.submissions[0].ref, NodeDiedError("the node died"))
    [lost] = take(pool)
    assert lost.retried and fake.submissions[1].job["pin"] == ["gpu_model:B"]
    fake.node_list[2]["Alive"] = False  # the last B node goes while the retry is queued; node-a stays
    clock.t += 10
    assert take(pool) == []
    clock.t += ray_pool.LOST_NODE_WAIT_S + 1
    [gone] = take(pool)
    assert gone.result.status == "error" and "gpu_model:B" in gone.result.message, gone.result.message
    assert gone.result.run["ray"]["pinned_to"] == ["gpu_model:B"] and pool.pending == 0


def test_a_lost_node_never_seen_alive_is_not_retried_on_a_guessed_model(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    pool, fake, _ = make_pool(head)
    cpu, _ = specs_of(tmp_path)
    pool.submit(cpu)
    started(fake, 0, "n9", "node-late")  # a node that joined after the last node list, and died
    fake.fail(fake.submissions[0].ref, NodeDiedError("the node died"))
    [lost] = take(pool)
    assert not lost.retried and "GPU model is not known" in lost.result.message
    assert len(fake.submissions) == 1


def test_a_task_on_a_node_first_seen_on_the_board_makes_the_pool_list_the_nodes(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    pool, fake, clock = make_pool(head)
    cpu, _ = specs_of(tmp_path)
    pool.submit(cpu)
    take(pool)
    fake.node_list.append(node("n9", "node-late", suite_slot=1, GPU=2, **{"gpu_model:C": 2}))
    fake.node_list.append(node("n10", "node-late2", suite_slot=1, GPU=2, **{"gpu_model:C": 2}))
    started(fake, 0, "n9", "node-late")
    take(pool)  # the board shows n9: the node list is asked again, with n9 alive in it
    fake.node_list[-2]["Alive"] = False
    fake.fail(fake.submissions[0].ref, NodeDiedError("the node died"))
    [lost] = take(pool)
    assert lost.retried and fake.submissions[1].options["resources"]["gpu_model:C"] == 0.001


def test_node_died_is_node_lost_even_when_the_last_node_list_shows_it_alive(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    pool, fake, _ = make_pool(head)
    cpu, _ = specs_of(tmp_path)
    pool.submit(cpu)
    take(pool)
    started(fake, 0, "n2", "node-b1")
    fake.fail(fake.submissions[0].ref, NodeDiedError("the node died"))  # Ray knows; its list is behind
    [lost] = take(pool)
    assert "node lost" in lost.result.message and lost.retried and pool._suspects == {}


def test_the_orchestrator_waits_for_the_sweeps_no_longer_than_sweep_wait_s(
    tmp_path: Path, head: socket.socket, no_real_ray: None
) -> None:
    pool, fake, a, b = two_started(tmp_path, head)
    fake.board_answers = False
    pool.cancel_all(say=lambda _line: None)
    sweeps = [w for w in fake.waits if str(w["refs"][0].name).startswith("sweep")]
    assert [w["timeout"] for w in sweeps] == [ray_stopping.SWEEP_WAIT_S], fake.waits


class RemoteEngineBackend(PeakBackend):
    """A node's Docker backend whose engine is reached over tcp://."""

    def __init__(self) -> None:
        super().__init__(name="docker")
        self.daemon = SimpleNamespace(address="tcp://10.0.0.5:2376")

    def skipped(self, spec: plan.RunSpec, reason: str) -> RunResult:
        now = base.now_iso()
        run = {"backend": "docker", "machine": "node", "started_at": now, "finished_at": now}
        return RunResult(status="skipped", spec=spec.to_dict(), message=reason, run=run)


def test_a_gpu_run_on_a_node_with_a_remote_engine_is_recorded_as_an_error_before_any_image(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, gpu = specs_of(tmp_path)
    monkeypatch.setattr(ray_task, "_ensure_image", lambda *_a: pytest.fail("no image for a run that cannot run"))
    value = _on_node(monkeypatch, gpu, "n2", RemoteEngineBackend(), None, _job("s1-1"))
    result = value["result"]
    assert result["status"] == "error" and "tcp://10.0.0.5:2376" in result["message"], result
