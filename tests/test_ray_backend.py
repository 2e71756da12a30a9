"""``--backend ray`` end to end on a real Ray cluster of three nodes on 127.0.0.1 (tests/ray_local.py).

The head offers ``gpu_model:A``, two workers ``gpu_model:B``; each node takes one run at a time
(``suite_slot: 1``) and names its results folder by its ``suite-machine`` label. The suite runs as a
user runs it, a subprocess given ``--ray-address``. Where this machine's Docker engine answers, the
nodes run each point in a container of the registry-free test image (tests/docker_base.py), else
with the local backend; under SUITE_REQUIRE_DOCKER=1 a missing engine or Ray fails instead.

One cluster serves the tests that leave it whole; the tests that kill a node or the head each start
their own. Every scenario a test runs is a copy of a fixture under a name of its own (``ray_a_<8 hex>``):
the containers the cleanup removes are those labelled with one of these names, never another's.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import check_rows, check_skipped
from ray_local import HEAD, REQUIRED, RayLocalCluster, require_ray

from suite.backends.base import WORKER_DEADLINE_GRACE_S
from suite.record import results
from suite.worker.__main__ import HARD_STOP_S

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "scenarios"
ORCHESTRATOR = "orchestrator"  # --machine: the folder of what no node could take
B_NODES = ("ray-b1", "ray-b2")
# Titles of a node's Ray processes that are not a task's worker.
NOT_A_TASK = ("ray::IDLE", "ray::DashboardAgent", "ray::RuntimeEnvAgent")
IMAGE_ENV = "SUITE_DOCKER_IMAGE"
OURS: set[str] = set()  # every scenario name these tests made: the only containers their cleanup touches


@dataclass
class Nodes:
    """How the nodes run their points here: the backend their results must name, their environment."""

    backend: str  # "docker" or "local"
    env: dict[str, str]
    client: Any = None  # the Docker engine's client, when the nodes use it


def _unavailable(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"SUITE_REQUIRE_DOCKER=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def nodes() -> Iterator[Nodes]:
    """Docker with the test image where an engine answers (the nodes' auto choice), else local."""
    require_ray()
    try:
        from suite.environment import docker_engine

        client, _ = docker_engine.connect(timeout=30)
        client.ping()
    except Exception as exc:  # noqa: BLE001 - no engine: the nodes run the local backend
        if REQUIRED:
            pytest.fail(f"SUITE_REQUIRE_DOCKER=1 but no Docker engine answers ({type(exc).__name__}: {exc})")
        yield Nodes("local", {"SUITE_RAY_NODE_BACKEND": "local"})
        return
    sys.path.insert(0, str(REPO / "tests"))
    import docker_base

    try:
        image = docker_base.ensure_test_image(client, progress=lambda line: None)
    except docker_base.BaseImageError as exc:
        client.close()
        _unavailable(f"cannot build the registry-free test image: {exc}")
    yield Nodes("docker", {IMAGE_ENV: image}, client)
    _remove_test_containers(client)
    client.close()


def _remove_test_containers(client: Any) -> None:
    """Containers of these tests' own scenarios that a killed node left behind (a crash cleans nothing
    up), found by their ``suite.spec.scenario`` label: only names in OURS, made by ``unique_name``."""
    for name in sorted(OURS):
        for container in client.containers.list(
            ignore_removed=True, all=True, filters={"label": f"suite.scenario={name}"}
        ):
            container.remove(force=True)


@pytest.fixture(scope="module")
def cluster(nodes: Nodes) -> Iterator[RayLocalCluster]:
    with RayLocalCluster(env=nodes.env) as c:
        yield c


@pytest.fixture
def fresh_cluster(nodes: Nodes) -> Iterator[RayLocalCluster]:
    """A cluster of its own for a test that kills one of its nodes."""
    with RayLocalCluster(env=nodes.env) as c:
        yield c
    if nodes.client is not None:
        _remove_test_containers(nodes.client)


# -- helpers -------------------------------------------------------------------------------------


def unique_name(prefix: str) -> str:
    """``prefix_<8 hex>``, recorded in OURS (what the cleanup may remove)."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    OURS.add(name)
    return name


def scenario(folder: Path, base: str, prefix: str, changes: dict[str, Any] | None = None) -> Path:
    """A copy of fixture ``base`` under a unique name (the file's stem) with dotted ``changes`` (a
    None value removes the key)."""
    data = yaml.safe_load((FIXTURES / f"{base}.yaml").read_text(encoding="utf-8"))
    name = unique_name(prefix)
    data["name"] = name
    for dotted, value in (changes or {}).items():
        *parents, last = dotted.split(".")
        here = data
        for key in parents:
            here = here.setdefault(key, {})
        if value is None:
            here.pop(last, None)
        else:
            here[last] = value
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def suite_cmd(c: RayLocalCluster, res: Path, *args: Any, command: str = "run") -> list[str]:
    cmd = [sys.executable, "-m", "suite", command, "--backend", "ray", "--ray-address", c.address, "--smoke"]
    if command == "run":
        cmd += ["--results", str(res), "--machine", ORCHESTRATOR]
    return cmd + [str(a) for a in args]


def suite_env(c: RayLocalCluster) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), **c.client_env()}


def run_suite(c: RayLocalCluster, res: Path, *args: Any, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run(
        suite_cmd(c, res, *args), cwd=REPO, env=suite_env(c), capture_output=True, text=True, timeout=timeout
    )


def start_suite(c: RayLocalCluster, res: Path, *args: Any, log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(
            suite_cmd(c, res, *args), cwd=REPO, env=suite_env(c), stdout=out, stderr=subprocess.STDOUT
        )


def by_machine(res: Path) -> dict[str, list[results.RunResult]]:
    out: dict[str, list[results.RunResult]] = {}
    for path, r in results.load_folder(res) if res.is_dir() else []:
        out.setdefault(path.relative_to(res).parts[0], []).append(r)
    return out


def busy(c: RayLocalCluster, name: str) -> dict[int, str]:
    """Node ``name``'s Ray workers that run a task or an actor of a job now."""
    return {
        pid: cmd
        for pid, cmd in c.node_processes(name).items()
        if cmd.startswith("ray::") and not cmd.startswith(NOT_A_TASK)
    }


def benchmark_processes(c: RayLocalCluster) -> dict[int, str]:
    """Benchmark workers the nodes started as subprocesses (the local backend)."""
    return {pid: cmd for name in c.nodes for pid, cmd in c.node_processes(name).items() if "suite.worker" in cmd}


def benchmark_nodes(c: RayLocalCluster, nodes: Nodes, scenario_name: str) -> list[str]:
    """The nodes running a benchmark now: the owner of a running container of ``scenario_name`` (its
    ``suite.orchestrator`` label is ``host:pid:start`` of the node's Ray worker that made it), or the
    node of a benchmark subprocess."""
    owners: set[int] = set()
    if nodes.client is not None:
        for container in running_containers(nodes, scenario_name):
            parts = container.labels.get("suite.orchestrator", "").split(":")
            if len(parts) >= 3 and parts[-2].isdigit():
                owners.add(int(parts[-2]))
    else:
        owners = set(benchmark_processes(c))
    return sorted(name for name in c.nodes if owners & set(c.node_pids(name)))


def wait_for(what: str, check: Any, seconds: float, proc: subprocess.Popen | None = None, log: Path | None = None):
    """Poll ``check()`` until it returns something true; fails with ``what`` (and the log) otherwise."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.3)
    text = log.read_text(errors="replace")[-4000:] if log is not None and log.exists() else ""
    pytest.fail(f"{what} (not within {seconds:.0f} s)\n{text}")


def running_containers(nodes: Nodes, scenario_name: str) -> list[Any]:
    filters = {"label": f"suite.scenario={scenario_name}", "status": "running"}
    return nodes.client.containers.list(ignore_removed=True, filters=filters)


def session_containers(nodes: Nodes, sessions: set[str]) -> list[Any]:
    found = []
    for session in sessions:
        found += nodes.client.containers.list(
            ignore_removed=True, all=True, filters={"label": f"suite.session={session}"}
        )
    return found


def assert_ray_facts(r: results.RunResult, machine: str, model: str | None, c: RayLocalCluster, nodes: Nodes) -> None:
    facts = r.run.get("ray") or {}
    keys = ("node_id", "node_ip", "machine", "address", "task_id", "gpu_ids", "gpu_model", "attempt")
    assert all(k in facts for k in keys), facts
    assert facts["machine"] == machine and facts["gpu_model"] == model, facts
    assert facts["address"] == c.address, facts
    assert r.run.get("backend") == nodes.backend, r.run


# -- the harness itself ----------------------------------------------------------------------------


def test_local_cluster_has_three_labelled_nodes_and_loses_a_killed_one(monkeypatch: pytest.MonkeyPatch) -> None:
    ray = require_ray()
    with RayLocalCluster() as c:
        for key, value in c.client_env().items():
            monkeypatch.setenv(key, value)
        ray.init(address=c.address, logging_level="ERROR", log_to_driver=False)
        try:
            alive = [n for n in ray.nodes() if n["Alive"]]
            assert sorted(n["Labels"]["suite-machine"] for n in alive) == ["ray-b1", "ray-b2", "ray-head"]
            for n in alive:
                res, name = n["Resources"], n["Labels"]["suite-machine"]
                assert res["CPU"] == 1 and res["suite_slot"] == 1, (name, res)
                model = "gpu_model:A" if name == HEAD else "gpu_model:B"
                assert res[model] == 1 and [k for k in res if k.startswith("gpu_model:")] == [model], res

            @ray.remote(num_cpus=0, resources={"gpu_model:B": 0.001})
            def where() -> str:
                value = ray.get_runtime_context().get_node_labels()["suite-machine"]
                return value[0] if isinstance(value, list) else value

            assert set(ray.get([where.remote() for _ in range(4)], timeout=60)) <= set(B_NODES)

            pids = c.node_pids("ray-b1")
            assert pids and not set(pids) & set(c.node_pids("ray-b2"))
            c.kill_node("ray-b1")
            assert c.node_pids("ray-b1") == []
            left = c.wait_until_nodes(2, timeout=60)
            assert sorted(n["labels"]["suite-machine"] for n in left) == ["ray-b2", "ray-head"]
            dead = [n for n in ray.nodes() if not n["Alive"]]
            assert [n["Labels"].get("suite-machine") for n in dead] == ["ray-b1"]
        finally:
            ray.shutdown()
        every = c.all_pids()
        assert every, "the other nodes still run"
    assert all(_zombie(pid) for pid in every), "a Ray process outlived the cluster"
    assert c.all_pids() == []


def _zombie(pid: int) -> bool:
    """Gone, or a zombie: it runs no more (an orphan is reaped by init, when init gets to it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


# -- end to end through the command line -------------------------------------------------------------


@dataclass
class Plan:
    res: Path
    proc: subprocess.CompletedProcess
    a: Path  # the gpu_model:A scenario (one point)
    b: Path  # the gpu_model:B scenario (two points)


@pytest.fixture(scope="module")
def first_plan(cluster: RayLocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Plan:
    """The two-model plan, run once for the tests that read its results."""
    folder = tmp_path_factory.mktemp("ray-plan")
    a, b = scenario(folder, "ray_model_a", "ray_a"), scenario(folder, "ray_model_b", "ray_b")
    res = folder / "results"
    return Plan(res, run_suite(cluster, res, a, b), a, b)


def test_two_model_plan_runs_on_the_nodes_of_each_model_to_a_report(
    first_plan: Plan, cluster: RayLocalCluster, nodes: Nodes, tmp_path: Path
) -> None:
    res, proc, a, b = first_plan.res, first_plan.proc, first_plan.a.stem, first_plan.b.stem
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    assert "on backend ray" in log, log
    found = by_machine(res)
    assert set(found) <= {HEAD, *B_NODES} and HEAD in found and set(found) & set(B_NODES), (sorted(found), log)
    assert [(r.spec["scenario"], r.status) for r in found[HEAD]] == [(a, "ok")], log
    assert_ray_facts(found[HEAD][0], HEAD, "A", cluster, nodes)
    b_runs = [(m, r) for m in B_NODES for r in found.get(m, [])]
    assert sorted(r.spec["point_label"] for _, r in b_runs) == ["width=16", "width=32"], log
    node_ids = {n["labels"]["suite-machine"]: n["node_id"] for n in cluster.alive_nodes()}
    for machine, r in [(HEAD, found[HEAD][0]), *b_runs]:
        assert r.status == "ok" and r.spec["scenario"] in (a, b), r.message
        if r.spec["scenario"] == b:
            assert_ray_facts(r, machine, "B", cluster, nodes)
        assert r.run["ray"]["node_id"] == node_ids[machine]  # the node that ran it, by Ray's own id

    out = tmp_path / "rep"
    report = subprocess.run(
        [sys.executable, "-m", "suite", "report", "--results", str(res), "--out", str(out)],
        cwd=REPO, env=suite_env(cluster), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert report.returncode == 0, report.stdout + report.stderr
    hardware = (out / "hardware.md").read_text()
    assert all(f"`{m}`" in hardware for m in found), hardware
    assert (out / f"{a}.md").is_file() and (out / f"{b}.md").is_file()
    assert f"`{HEAD}`" in (out / f"{a}.md").read_text()


def test_the_same_plan_again_runs_nothing(first_plan: Plan, cluster: RayLocalCluster) -> None:
    res, first = first_plan.res, first_plan.proc
    assert first.returncode == 0, first.stdout + first.stderr
    before = sorted(p for p in res.rglob("*.json"))
    proc = run_suite(cluster, res, first_plan.a, first_plan.b, timeout=120)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    assert "3 runs already done (ok result on file; --fresh reruns)" in log, log
    assert "runs: 3 already done" in log, log
    assert sorted(p for p in res.rglob("*.json")) == before


def test_a_model_no_node_offers_is_skipped_naming_it(cluster: RayLocalCluster, tmp_path: Path) -> None:
    a_file = scenario(tmp_path, "ray_model_a", "ray_a")
    c_file = scenario(tmp_path, "ray_model_a", "ray_c", {"gpu_model": "C"})
    check = subprocess.run(
        suite_cmd(cluster, tmp_path, a_file, c_file, command="check"),
        cwd=REPO, env=suite_env(cluster), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    shown = check.stdout + check.stderr
    assert check.returncode == 0, shown
    rows, skipped = check_rows(check.stdout), check_skipped(check.stdout)
    assert rows["default"]["scenario"].startswith("ray_a") and rows["default"]["plan here"] == "will run", shown
    assert list(skipped) == ["default"] and skipped["default"].endswith("offers gpu_model:C"), shown

    res = tmp_path / "results"
    proc = run_suite(cluster, res, c_file, timeout=120)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log  # a skip is not a failure
    found = by_machine(res)
    assert list(found) == [ORCHESTRATOR], log
    (skipped,) = found[ORCHESTRATOR]
    assert skipped.status == "skipped" and "gpu_model:C" in skipped.message, skipped.message


def test_repeats_auto_runs_its_first_stage_on_the_pool_then_what_its_spread_asks(
    cluster: RayLocalCluster, tmp_path: Path
) -> None:
    # A precision no spread meets: the point takes its first 4 runs, then one more, to its cap of 5.
    changes = {"repeats": "auto", "precision": 0.001, "max_repeats": 5, "matrix": None}
    path = scenario(tmp_path, "ray_model_b", "ray_auto", changes)
    res = tmp_path / "results"
    proc = run_suite(cluster, res, path, "--repeats", "auto")
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    assert "repeats: auto: the first stage's spreads ask for 1 run more" in proc.stdout, log
    # The two B nodes keep a folder each: the count is the pool's, each folder's report sees a share.
    assert f"the nodes that take {path.stem} save to 2 folders ({', '.join(B_NODES)})" in proc.stderr, log
    runs = [r for m in B_NODES for r in by_machine(res).get(m, [])]
    assert sorted(r.spec["repetition"] for r in runs) == [0, 1, 2, 3, 4], log
    assert all(r.ok and r.spec["report"]["repeats"]["auto"]["max_repeats"] == 5 for r in runs), log

    before = sorted(res.rglob("*.json"))
    again = run_suite(cluster, res, path, "--repeats", "auto", timeout=120)
    assert again.returncode == 0 and "runs: 5 already done" in again.stdout, again.stdout + again.stderr
    assert sorted(res.rglob("*.json")) == before
    check = subprocess.run(
        suite_cmd(cluster, res, path, "--repeats", "auto", "--results", res, command="check"),
        cwd=REPO, env=suite_env(cluster), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    row = check_rows(check.stdout)["default"]
    assert row["reps"] == "5 (auto)" and row["plan here"] == "done (ok on file)", check.stdout
    assert "warning: repeats: auto counts each point's runs over all the nodes that take it" in check.stdout
    out = tmp_path / "rep"
    report = subprocess.run(
        [sys.executable, "-m", "suite", "report", "--results", str(res), "--out", str(out)],
        cwd=REPO, env=suite_env(cluster), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    page = (out / f"{path.stem}.md").read_text() if report.returncode == 0 else report.stderr
    # Smoke size without smoke settings: not "one run of each point", in either folder's section.
    assert page.count("**Smoke size**: the runs `--repeats auto` asked for;") == 2, page


def test_a_budget_spent_leaves_the_queued_runs_unstarted_and_unrecorded_for_the_next_run(
    cluster: RayLocalCluster, tmp_path: Path
) -> None:
    # 4 runs, 2 nodes of model B taking one at a time: all are submitted within the budget (about a
    # second after the plan starts), the last two wait in Ray's queue until a run of 7-10 s ends.
    path = scenario(tmp_path, "ray_model_b", "ray_budget", {"repeats": 4, "matrix": None})
    res = tmp_path / "results"
    proc = run_suite(cluster, res, path, "--repeats", "4", "--budget", "6s")
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "4 run(s) submitted" in proc.stdout, log
    said = re.search(r"--budget 6s spent: (\d) runs? not started; run the same command again to go on", proc.stdout)
    assert said and 1 <= int(said.group(1)) <= 4, log
    runs = [r for rs in by_machine(res).values() for r in rs]
    assert all(r.ok for r in runs) and len(runs) == 4 - int(said.group(1)), [(r.status, r.message) for r in runs]
    again = run_suite(cluster, res, path, "--repeats", "4")
    counted = f"runs: {4 - len(runs)} ok" + (f", {len(runs)} already done" if runs else "")
    assert again.returncode == 0 and counted in again.stdout, again.stdout + again.stderr
    runs = [r for rs in by_machine(res).values() for r in rs]
    assert sorted(r.spec["repetition"] for r in runs) == [0, 1, 2, 3] and all(r.ok for r in runs)
    check = subprocess.run(
        suite_cmd(cluster, res, path, "--repeats", "4", "--budget", "1s", command="check"),
        cwd=REPO, env=suite_env(cluster), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert check.returncode == 0 and "--budget 1s: no run starts on a node once it has passed" in check.stdout, (
        check.stdout + check.stderr
    )


def test_a_run_past_its_timeout_is_recorded_as_timeout(cluster: RayLocalCluster, tmp_path: Path) -> None:
    changes = {"gpu_model": None, "timeout_s": 3, "training.epochs": 500, "data.train_samples": 4096}
    path = scenario(tmp_path, "ray_model_a", "ray_timeout", changes)
    res = tmp_path / "results"
    proc = run_suite(cluster, res, path, timeout=300)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 1, log  # a failed run, recorded
    runs = [r for rs in by_machine(res).values() for r in rs]
    assert [r.status for r in runs] == ["timeout"], [(r.status, r.message) for r in runs]
    assert runs[0].run["ray"]["machine"] in (HEAD, *B_NODES)


def test_ctrl_c_cancels_every_task_and_leaves_no_container(
    cluster: RayLocalCluster, nodes: Nodes, tmp_path: Path
) -> None:
    changes = {"training.epochs": 3000, "data.train_samples": 4096, "timeout_s": 600}
    path = scenario(tmp_path, "ray_model_b", "ray_slow", changes)
    name = path.stem
    log = tmp_path / "run.log"
    proc = start_suite(cluster, tmp_path / "results", path, log=log)
    try:
        both = list(B_NODES)
        wait_for(
            "both B nodes run a benchmark",
            lambda: benchmark_nodes(cluster, nodes, name) == both,
            240, proc, log,
        )  # fmt: skip
        sessions = {c.labels["suite.session"] for c in running_containers(nodes, name)} if nodes.client else set()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text(errors="replace")
    assert proc.returncode == 130, text
    left = session_containers(nodes, sessions)
    if left:  # how long they outlive the plan tells a late cleanup from none at all
        at_exit = {c.name: c.status for c in left}
        gone_after = None
        for second in range(30):
            if not session_containers(nodes, sessions):
                gone_after = second
                break
            time.sleep(1)
        fate = f"gone {gone_after} s later" if gone_after is not None else "still there 30 s later"
        pytest.fail(f"containers of the plan left when it exited: {at_exit}, {fate}\n{text}")
    # The job's workers go once its driver is gone: no task of the plan runs on any node.
    wait_for(
        "no Ray task of the interrupted plan runs",
        lambda: not any(busy(cluster, n) for n in cluster.nodes) and not benchmark_processes(cluster),
        30,
    )


def test_a_node_lost_mid_run_is_recorded_and_retried_on_another_node(
    fresh_cluster: RayLocalCluster, nodes: Nodes, tmp_path: Path
) -> None:
    c = fresh_cluster
    changes = {"matrix": None, "training.epochs": 200, "data.train_samples": 1024}
    path = scenario(tmp_path, "ray_model_b", "ray_lost", changes)
    res, log = tmp_path / "results", tmp_path / "run.log"
    proc = start_suite(c, res, path, log=log)
    try:
        # Mid-run: the benchmark itself runs (in its container, or its subprocess) on one B node.
        (victim,) = wait_for(
            "a B node runs the benchmark", lambda: benchmark_nodes(c, nodes, path.stem), 180, proc, log
        )
        assert victim in B_NODES
        c.kill_node(victim)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text(errors="replace")
    assert proc.returncode == 0, text  # the plan finished: a lost run whose retry is ok fails nothing
    runs = [r for rs in by_machine(res).values() for r in rs]
    lost = [r for r in runs if r.status == "error"]
    assert len(lost) == 1 and "node lost" in lost[0].message, [(r.status, r.message) for r in runs]
    assert lost[0].run["ray"]["machine"] == victim and lost[0].run["ray"]["attempt"] == 1, lost[0].run
    retried = [r for r in runs if r.status == "ok"]
    (other,) = (n for n in B_NODES if n != victim)
    assert len(retried) == 1, text
    facts = retried[0].run["ray"]
    assert facts.get("retry_of") and facts["attempt"] == 2 and facts["machine"] == other, facts
    assert facts["retry_of"] == lost[0].run["ray"]["attempt_id"], "the retry names the lost attempt"
    assert retried[0].run["backend"] == nodes.backend
    assert (res / other / path.stem).is_dir() and (res / victim / path.stem).is_dir()


# The slow B runs' timeout_s: long enough to be killed mid-run (they start beside the A run, which took
# 72 s on a loaded 2-core machine), short enough to wait out.
SLOW_LIMIT_S = 120
EXIT_WITHIN_S = 30.0  # after the head's death, how long the orchestrator may take to say so and end


def test_the_head_going_away_ends_the_plan_and_keeps_what_was_saved(
    fresh_cluster: RayLocalCluster, nodes: Nodes, tmp_path: Path
) -> None:
    c = fresh_cluster
    a = scenario(tmp_path, "ray_model_a", "ray_a")
    # Three slow B points for two B nodes: two run, the third waits in Ray's queue behind them.
    slow_changes = {
        "matrix": {"model.hidden.0": [16, 32, 48]},
        "training.epochs": 3000,
        "data.train_samples": 4096,
        "timeout_s": SLOW_LIMIT_S,
    }
    slow = scenario(tmp_path, "ray_model_b", "ray_slow_b", slow_changes)
    res, log = tmp_path / "results", tmp_path / "run.log"
    proc = start_suite(c, res, a, slow, log=log)
    try:
        saved = wait_for(
            "the A run is saved while the B runs go on",
            lambda: list((res / HEAD).rglob("*.json")) if (res / HEAD).is_dir() else None,
            240, proc, log,
        )  # fmt: skip
        both = list(B_NODES)
        wait_for("both B nodes run a slow point", lambda: benchmark_nodes(c, nodes, slow.stem) == both, 120, proc, log)
        started = running_containers(nodes, slow.stem) if nodes.client is not None else []
        assert proc.poll() is None, log.read_text(errors="replace")
        assert not [p for p in res.rglob("*.json") if slow.stem in p.parts], "a slow point ended before the head died"
        c.kill_head()
        killed_at = time.monotonic()
        try:
            proc.wait(timeout=EXIT_WITHIN_S + 60)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"the orchestrator still runs {EXIT_WITHIN_S + 60:.0f} s after the head died\n{log.read_text()}"
            )
        took = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text(errors="replace")
    kept = results.load(saved[0])  # what was saved before the head died is still there, as it was
    assert kept.status == "ok" and kept.spec["scenario"] == a.stem
    assert json.loads(saved[0].read_text())["run"]["ray"]["machine"] == HEAD
    # Every other check is gathered, so one run tells all that went wrong.
    problems = []
    if took > EXIT_WITHIN_S:
        problems.append(f"the orchestrator took {took:.1f} s to end after the head died (at most {EXIT_WITHIN_S:g} s)")
    if proc.returncode != 1:
        problems.append(f"exit code {proc.returncode}, not 1")
    if not ("the plan stopped early:" in text and "stopped answering" in text and c.address in text):
        problems.append(f"no 'the plan stopped early: ... stopped answering' naming {c.address} in the output")
    # The two started points are recorded as ended by the head's death, on the nodes that ran them;
    # the queued one never ran: no result, so the next run of the plan takes it.
    slow_runs = [(m, r) for m, rs in by_machine(res).items() for r in rs if r.spec["scenario"] == slow.stem]
    if sorted(m for m, _ in slow_runs) != both or not all(
        r.status == "error" and "stopped answering" in r.message for _, r in slow_runs
    ):
        problems.append(f"slow points on file: {[(m, r.status, r.message) for m, r in slow_runs]}")
    if nodes.client is not None:
        late = _running_past_their_deadline(nodes, slow.stem, started)
        if late:
            problems.append(f"containers of the plan still run past their worker's own deadline: {late}")
    assert not problems, "\n".join(problems) + f"\n--- the orchestrator's output:\n{text[-4000:]}"


def _running_past_their_deadline(nodes: Nodes, name: str, started: list[Any]) -> dict[str, str]:
    """Containers of scenario ``name`` that still run once the last one's worker deadline is past
    (watched until then: once none runs, none can start again, as nothing is left to start one).

    What the code guarantees for a container whose node lost the head: its worker ends itself at
    timeout_s + WORKER_DEADLINE_GRACE_S after it started (SIGALRM HARD_STOP_S later as a backstop),
    whoever is left to watch it. Its removal is not guaranteed then (the task that would remove it may
    be gone with its node): a later session on the engine reaps it past its ``suite.deadline_unix``."""
    seen = {c.id: c for c in started}
    seen.update(
        {
            c.id: c
            for c in nodes.client.containers.list(
                ignore_removed=True, all=True, filters={"label": f"suite.scenario={name}"}
            )
        }
    )
    starts = [t for t in (_started_unix(c) for c in seen.values()) if t is not None]
    limit = max(starts) + SLOW_LIMIT_S + WORKER_DEADLINE_GRACE_S + HARD_STOP_S + 5 if starts else time.time()
    while (running := running_containers(nodes, name)) and time.time() < limit:
        time.sleep(1.0)
    return {c.name: c.labels.get("suite.session", "") for c in running}


def _started_unix(container: Any) -> float | None:
    """When the engine started ``container`` (State.StartedAt, UTC with nanoseconds) as a Unix time;
    None once it is removed."""
    import docker

    try:
        container.reload()
    except docker.errors.NotFound:
        return None
    whole, _, fraction = container.attrs["State"]["StartedAt"].rstrip("Z").partition(".")
    return datetime.fromisoformat(whole).replace(tzinfo=UTC).timestamp() + float(f"0.{fraction or 0}")


def test_a_node_given_no_image_uses_the_catalog_image_of_the_shipped_checkout(nodes: Nodes, tmp_path: Path) -> None:
    """Without SUITE_DOCKER_IMAGE a node reads docker/images.yaml from the checkout the job shipped
    and finds (or builds, by the recipe-hash rule) the catalog's default CPU image itself."""
    if nodes.client is None:
        pytest.skip("no Docker engine answers: the nodes run the local backend, which uses no image")
    from suite.environment import images

    name = images.load_catalog().defaults["cpu"]
    (before,) = [row for row in images.list_images(client=nodes.client) if row["name"] == name]
    env = {k: v for k, v in nodes.env.items() if k != IMAGE_ENV}
    with RayLocalCluster(env=env, unset=(IMAGE_ENV,)) as c:
        for node in c.nodes:
            assert IMAGE_ENV not in c.node_environ(node), node
        path = scenario(tmp_path, "ray_model_a", "ray_catalog")
        res = tmp_path / "results"
        # A build, when the engine holds no image of the current recipe, goes by the Debian base the
        # module's fixture made (the registry route fails first where the engine cannot pull).
        proc = subprocess.run(
            suite_cmd(c, res, path), cwd=REPO, env={k: v for k, v in suite_env(c).items() if k != IMAGE_ENV},
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    (r,) = by_machine(res)[HEAD]
    assert r.status == "ok" and r.run["backend"] == "docker", (r.status, r.message)
    (after,) = [row for row in images.list_images(client=nodes.client) if row["name"] == name]
    assert after["state"] == "built", (before, after)  # by a recipe of the catalog as it stands
    assert r.run["image"] == after["tag"] and r.run["image_id"] == after["image_id"], (r.run["image"], after)
    if before["state"] == "built":
        assert before["image_id"] == after["image_id"], (before, after)  # found, not rebuilt


def test_a_sweep_reaches_every_node_and_removes_the_plans_containers(
    cluster: RayLocalCluster, nodes: Nodes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the orchestrator sends after a task was killed by force: a sweep pinned to each node (Ray's
    node affinity), run from the shipped checkout, removing the plan's containers on the node's engine."""
    if nodes.client is None:
        pytest.skip("no Docker engine answers: the nodes run the local backend, which makes no container")
    from suite.backends.base import tag_labels
    from suite.backends.ray_cluster import leftovers
    from suite.backends.ray_cluster import pool as ray_pool

    for key, value in cluster.client_env().items():
        monkeypatch.setenv(key, value)
    pool = ray_pool.RayPool(ORCHESTRATOR, address=cluster.address)
    pool.connect()
    image = nodes.env[IMAGE_ENV]
    left = nodes.client.containers.run(
        image, ["300"], entrypoint=["sleep"], detach=True, network_mode="none",
        labels=tag_labels({leftovers.TAG_PLAN: pool.session, leftovers.TAG_ATTEMPT: f"{pool.session}-1"}),
    )  # fmt: skip
    try:
        alive = [n["NodeID"] for n in pool.nodes(max_age_s=0) if n["Alive"]]
        assert len(alive) == 3
        said: list[str] = []
        refs = pool._sweep(alive)
        pool._wait_for_sweeps(refs, say=said.append)
        found = [pool.ray.get(r) for r in refs]
        # The three nodes share this machine's engine: the first sweep to look removes it.
        assert sorted(c for f in found for c in f["containers"]) == [left.short_id], found
        assert said == [f"removed after the forced stop: {left.short_id}"], said
        assert left.id not in {c.id for c in nodes.client.containers.list(ignore_removed=True, all=True)}
    finally:
        pool.close()
        try:
            left.remove(force=True)
        except Exception:  # noqa: BLE001 - removed by the sweep
            pass
