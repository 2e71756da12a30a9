"""The pool's link to the cluster: joining it with the code shipped, the node list, the board's
snapshot and stops, and whether the head still answers."""

from __future__ import annotations

import functools
import os
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from suite import paths
from suite.backends.base import BackendUnavailable
from suite.backends.ray_cluster.attempts import result_of
from suite.backends.ray_cluster.board import GCS_CALL_S, Board
from suite.backends.ray_cluster.leftovers import sweep_task
from suite.backends.ray_cluster.placement import MACHINE_LABEL, MODEL_PREFIX, SLOT
from suite.backends.ray_cluster.task import Reply, ray_task
from suite.backends.ray_cluster.threads import within
from suite.record import code_identity

if TYPE_CHECKING:
    from suite.backends.ray_cluster.pool import RayPool

LOCAL = "a local Ray instance started by the suite"
# What the job ships (Ray's working_dir, which also leaves out what .gitignore names): the checkout
# without its history and without results, so a node reads the same catalog, Dockerfile and locks.
SHIP_EXCLUDES = [".git", "/reports/", "/reproduce/", "/benchmarks/wheels/"]
HEAD_RESOURCE = "node:__internal_head__"  # what Ray gives the head node only (ray._common.constants)
HEAD_CHECKS = 5  # GCS connection refusals in a row, HEAD_RETRY_S apart, before the cluster is called gone
HEAD_RETRY_S = 0.5
HEAD_SILENT_S = 120.0  # a head that neither answers nor refuses for this long is gone too


def shipped_code(results_dir: Path | None) -> dict[str, Any]:
    """The Ray runtime environment that carries this suite's code to every node.

    From a checkout: the checkout itself (suite/, docker/, the locks), less git, the reports and the
    results folder. Installed: the package, which holds its recipes and locks in ``suite/_data``.
    """
    checkout = paths.CHECKOUT
    if checkout is None:
        return {"py_modules": [str(paths.PACKAGE_DIR)]}
    excludes = list(SHIP_EXCLUDES)
    if results_dir is not None:
        try:
            excludes.append(f"/{results_dir.resolve().relative_to(checkout)}/")
        except ValueError:
            pass  # outside the checkout: not shipped anyway
    return {"working_dir": str(checkout), "excludes": excludes}


def import_ray() -> Any:
    """The ``ray`` module, or BackendUnavailable (exit 2) with the command that installs it."""
    try:
        import ray
    except ImportError as exc:
        xy = f"{sys.version_info.major}.{sys.version_info.minor}"
        lock = paths.REQUIREMENTS_DIR / "locks" / f"cluster-py{xy}.txt"
        if lock.is_file():
            how = (
                f"install the locked cluster environment: `{sys.executable} -m pip install --require-hashes "
                f"--only-binary :all: -r {lock}`, or let ./run_all.sh --backend ray set the venv up"
            )
        else:
            have = sorted(p.stem.removeprefix("cluster-py") for p in lock.parent.glob("cluster-py*.txt"))
            how = (
                f"no cluster lock exists for Python {xy} ({lock}); the locks are for Python "
                f"{', '.join(have) or 'none'}: run with one of those "
                "(./run_all.sh --backend ray with PYTHON=/path/to/python<X.Y>)"
            )
        raise BackendUnavailable(f"--backend ray: Ray is not installed in {sys.executable} ({exc}); {how}") from None
    return ray


def _gcs_address(info: Any, address: str | None) -> str | None:
    try:
        found = info.address_info.get("gcs_address") if hasattr(info, "address_info") else info["gcs_address"]
    except Exception:  # noqa: BLE001
        found = None
    return str(found or address or "") or None


def connect(pool: RayPool) -> None:
    """Join the cluster (or start a local instance), shipping the checkout as the job's working_dir."""
    if pool._connected:
        return
    ray = pool.ray
    before = code_identity.current_suite_identity()
    # The GCS going away is detected by this pool (``_head_answers``) within seconds; Ray's own
    # reconnect limit ends the whole process without a word, so it is set well beyond.
    os.environ.setdefault("RAY_gcs_rpc_server_reconnect_timeout_s", "600")
    runtime_env = shipped_code(pool.results_dir)
    kwargs: dict[str, Any] = {"runtime_env": runtime_env, "logging_level": "ERROR", "log_to_driver": False}
    try:
        if pool.address:
            info = ray.init(address=pool.address, **kwargs)
        else:
            # "local": always a new instance, never a cluster found through RAY_ADDRESS or /tmp/ray.
            info = ray.init(
                address="local",
                include_dashboard=False,
                resources={SLOT: 1},
                labels={MACHINE_LABEL: pool.machine},
                **kwargs,
            )
            pool._started_local = True
    except Exception as exc:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, ValueError...
        raise BackendUnavailable(f"--backend ray: cannot join {pool.where}: {type(exc).__name__}: {exc}") from None
    after = code_identity.current_suite_identity()
    pool.identity = after if after == before else {**after, "changed_while_shipping": True}
    pool.gcs_address = _gcs_address(info, pool.address)
    pool._connected = True
    # The board lives on the head (the resource Ray gives the head node alone, as Ray Serve and
    # Train place their state actors): not on the node the driver attached to, which may be any
    # node, and one lost with it would leave the plan without its board.
    board = ray.remote(num_cpus=0, max_restarts=0)(Board)
    pool._board = board.options(resources={HEAD_RESOURCE: 0.001}).remote()
    pool._remote = ray.remote(ray_task)
    pool._sweeper = ray.remote(sweep_task)


def nodes(pool: RayPool, max_age_s: float = 2.0) -> list[dict[str, Any]]:
    """The cluster's nodes as Ray lists them (alive and dead), cached for ``max_age_s``."""
    now = pool.clock()
    if pool._nodes_cache is None or now - pool._nodes_cache[0] >= max_age_s:
        pool.connect()
        # Bounded: a head that dies during the call leaves Ray's client waiting until Ray ends the
        # process; the list seen last serves until the next poll's head check decides.
        listed = within(GCS_CALL_S, pool.ray.nodes)
        if listed is None:
            if pool._nodes_cache is None:
                raise BackendUnavailable(f"--backend ray: {pool.where} did not list its nodes in {GCS_CALL_S:g} s")
            return pool._nodes_cache[1]
        pool._nodes_cache = (now, list(listed))
        for n in pool._nodes_cache[1]:
            if n.get("Alive") and n.get("NodeID"):
                models = [k for k in n.get("Resources", {}) if k.startswith(MODEL_PREFIX)]
                pool._node_models[str(n["NodeID"])] = sorted(models)
    return pool._nodes_cache[1]


def note_new_nodes(pool: RayPool) -> None:
    """List the nodes again when a task started on a node the pool has not seen alive: a retry of
    a run lost there goes to that node's GPU model, which only the node list tells."""
    if any(m.get("node_id") and m["node_id"] not in pool._node_models for m in pool._last_marks.values()):
        try:
            pool.nodes(max_age_s=0)
        except BackendUnavailable:
            pass


def salvage(pool: RayPool) -> None:
    """Results that reached this driver before its head went away (Ray keeps a task's reply with
    the caller that owns it): taken, each within a short limit, as a call may block for good."""
    ray = pool.ray
    try:
        refs = list(pool._pending)
        found = within(GCS_CALL_S, lambda: ray.wait(refs, num_returns=len(refs), timeout=0))
    except Exception:  # noqa: BLE001 - nothing can be asked any more
        return
    for ref in (found or ([], []))[0]:
        try:
            value = within(GCS_CALL_S, functools.partial(ray.get, ref, timeout=GCS_CALL_S))
        except Exception:  # noqa: BLE001 - a failed task: its cause is gone with the head
            continue
        if isinstance(value, dict) and "result" in value:
            attempt = pool._pending[ref]
            pool._hold([result_of(attempt, cast(Reply, value))])
            del pool._pending[ref]


def ask_stop(pool: RayPool, keys: list[str] | None) -> bool:
    """Ask the board to stop ``keys`` (None: every attempt); whether it said so in time."""
    board, ray = pool._board, pool.ray
    try:
        return bool(within(GCS_CALL_S, lambda: ray.get(board.stop.remote(keys), timeout=GCS_CALL_S)))
    except Exception:  # noqa: BLE001 - the forced cancel after the grace still ends the task
        return False


def marks(pool: RayPool) -> dict[str, dict[str, Any]]:
    """The board's snapshot (the last one seen once the cluster is gone: the board went with it)."""
    if pool.gone is None:
        pool._snapshot()  # without the board the tasks' own deadlines still hold
    return pool._last_marks


def snapshot(pool: RayPool) -> dict[str, dict[str, Any]] | None:
    """The board's snapshot now, or None when it did not come within GCS_CALL_S."""
    try:
        pool._last_marks = dict(pool.ray.get(pool._board.snapshot.remote(), timeout=GCS_CALL_S))
    except Exception:  # noqa: BLE001
        return None
    return pool._last_marks


def head_answers(pool: RayPool) -> bool:
    """Whether the cluster's GCS still accepts connections (HEAD_CHECKS refusals in a row: gone)."""
    if not pool.gcs_address:
        return True
    host, _, port = pool.gcs_address.rpartition(":")
    for attempt in range(HEAD_CHECKS):
        try:
            with socket.create_connection((host or "127.0.0.1", int(port)), timeout=2):
                pool._silent_since = None
                return True
        except (ConnectionRefusedError, ConnectionResetError):
            pass  # the head's machine answers: nothing listens there any more
        except OSError:
            # No answer at all (a network pause, a busy host): gone only when it lasts; Ray's own
            # clients wait far longer (RAY_gcs_rpc_server_reconnect_timeout_s, set above).
            now = pool.clock()
            pool._silent_since = pool._silent_since if pool._silent_since is not None else now
            return now - pool._silent_since < HEAD_SILENT_S
        if attempt < HEAD_CHECKS - 1:
            time.sleep(HEAD_RETRY_S)
    return False
