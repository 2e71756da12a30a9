"""Stopping the plan's tasks: through the board first, by force after a grace, then sweeping what a
forced task's run left on its node."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from suite.backends.ray_cluster.attempts import Attempt, Finished, result_of
from suite.backends.ray_cluster.board import GCS_CALL_S, NOT_STARTED
from suite.backends.ray_cluster.task import Reply

if TYPE_CHECKING:
    from suite.backends.ray_cluster.pool import RayPool

CANCEL_GRACE_S = 20.0  # after a stop is asked (the task removes its container), before a forced cancel
SWEEP_WAIT_S = 30.0  # how long the orchestrator waits for the nodes' sweeps after a Ctrl-C


def cancel_all(pool: RayPool, say: Callable[[str], None] = print) -> list[Finished]:
    """Stop every task: the started ones through the board (each kills and removes its container),
    forced when one has not ended within CANCEL_GRACE_S or at a second Ctrl-C, and then what a
    forced task's run left on its node is swept; the queued ones are left alone (a queued task
    that starts now sees the stop and runs nothing, and those still queued end with the job when
    the pool leaves the cluster).
    Returns the results to be saved, all held until ``saved`` (a second Ctrl-C loses none): those
    taken from Ray before, the runs that ended meanwhile (a stopped one has none), and crashed
    workers' runs."""
    pool._hold_suspects("the run's Ray worker crashed; the plan stopped before Ray said whether its node died")
    held = pool._held_keys()  # attempts already recorded (an interrupt came as one was let go)
    for ref in [r for r, a in pool._pending.items() if a.key in held]:
        del pool._pending[ref]
    if not pool._pending or not pool._connected or pool.gone is not None:
        pool._pending.clear()
        return list(pool._unsaved)
    ray = pool.ray
    # Until the board says which tasks started, any may have: a second Ctrl-C forces them all.
    running: list[Any] = list(pool._pending)
    say(
        f"stopping {len(pool._pending)} Ray task(s): a started one removes its container, a queued one "
        "does not start (Ctrl-C again: force at once)"
    )
    try:
        # The snapshot after the stop: a task marked started before it is waited for, any other
        # sees the stop when it marks.
        asked = pool._ask_stop(None)
        marks = pool._snapshot() if asked else None
        if marks is not None:
            running = [r for r, a in pool._pending.items() if marks.get(a.key, {}).get("started_for_s") is not None]
        # Without a snapshot every task may be running: all are waited for (and forced after).
        if not asked:  # the board answered nothing in time: Ray's polite cancel instead
            for ref in running:
                try:
                    ray.cancel(ref, force=False)
                except Exception:  # noqa: BLE001
                    pass
        try:
            done = ray.wait(running, num_returns=len(running), timeout=CANCEL_GRACE_S)[0] if running else []
        except Exception:  # noqa: BLE001
            done = []
        pool._take_ended(done, running)
    finally:
        # Also after a second Ctrl-C: what ended by now is taken, what has not is forced, and what
        # a forced task's run started on the node (a container, a worker's process group)
        # outlives it and is swept on every node.
        try:
            pool._take_ended(ray.wait(running, num_returns=len(running), timeout=0)[0] if running else [], running)
        except BaseException:  # noqa: BLE001 - Ray refuses, or Ctrl-C once more: the rest is forced all the same
            pass
        forced = 0
        for ref in running:
            try:
                ray.cancel(ref, force=True)
                forced += 1
            except Exception:  # noqa: BLE001 - done already, or the cluster is gone
                pass
        pool._pending.clear()
        if forced:
            pool._sweep_everywhere(forced, say)
    return list(pool._unsaved)


def take_ended(pool: RayPool, done: list[Any], running: list[Any]) -> None:
    """Hold the result of each task in ``done`` that ended with one (a run stopped by the board has
    none); a task Ray's memory monitor killed, or whose worker crashed, has its attempt swept."""
    ray = pool.ray
    for ref in done:  # each leaves ``running`` (the tasks to force) once it is dealt with
        attempt = pool._pending[ref]
        try:
            value = ray.get(ref, timeout=GCS_CALL_S)
        except Exception as exc:  # noqa: BLE001 - cancelled, or failed: no result to keep
            killed = [getattr(ray.exceptions, n, None) for n in ("OutOfMemoryError", "WorkerCrashedError")]
            if any(c is not None and isinstance(exc, c) for c in killed):
                pool._sweep_attempt(attempt)
            running.remove(ref)
            continue
        if isinstance(value, dict) and "result" in value:
            pool._hold([result_of(attempt, cast(Reply, value))])
            del pool._pending[ref]
        elif isinstance(value, dict) and value.get("stopped") == NOT_STARTED:  # --budget: for the next run
            pool.unstarted += 1
            del pool._pending[ref]
        running.remove(ref)


def sweep_everywhere(pool: RayPool, forced: int, say: Callable[[str], None]) -> None:
    """Sweep every alive node for the plan's containers and workers, waiting up to SWEEP_WAIT_S."""
    try:
        alive = [str(n["NodeID"]) for n in pool.nodes(max_age_s=0) if n.get("Alive") and n.get("NodeID")]
    except Exception:  # noqa: BLE001 - the workers' own deadlines end their runs then
        return
    say(f"{forced} task(s) forced: removing what their runs left on {len(alive)} node(s)")
    pool._wait_for_sweeps(pool._sweep(alive), say)


def wait_for_sweeps(pool: RayPool, refs: list[Any], say: Callable[[str], None]) -> None:
    refs = [r for r in refs if r is not None]
    if not refs:
        return
    try:
        done, left = pool.ray.wait(refs, num_returns=len(refs), timeout=SWEEP_WAIT_S)
    except Exception:  # noqa: BLE001
        return
    pool._sweeps = [r for r in pool._sweeps if r not in done]
    removed = []
    for ref in done:
        try:
            found = pool.ray.get(ref, timeout=GCS_CALL_S)
        except Exception:  # noqa: BLE001
            continue
        removed += list(found.get("containers", [])) + [f"pid {p}" for p in found.get("processes", [])]
    if removed:
        say(f"removed after the forced stop: {', '.join(removed)}")
    if left:
        say(f"{len(left)} node(s) did not sweep within {SWEEP_WAIT_S:g} s: their runs end at their own deadline")


def sweep_nodes(pool: RayPool, node_ids: list[str], attempt: str | None = None) -> list[Any]:
    """Submit ``sweep`` to each node (pinned to it, asking for no resource); the refs."""
    refs = []
    for node_id in node_ids:
        try:
            strategies = pool.ray.util.scheduling_strategies
            strategy = strategies.NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
            refs.append(
                pool._sweeper.options(
                    num_cpus=0, max_retries=0, scheduling_strategy=strategy, name="suite sweep"
                ).remote(pool.session, attempt)
            )
        except Exception:  # noqa: BLE001 - the worker's own deadline ends its run then
            pass
    pool._sweeps += refs
    return refs


def sweep_attempt(pool: RayPool, attempt: Attempt) -> None:
    """Sweep, on the node it ran on, what attempt left (fire and forget; ``close`` waits for it)."""
    node_id = pool._marks().get(attempt.key, {}).get("node_id")
    if node_id:
        pool._sweep([str(node_id)], attempt.key)
