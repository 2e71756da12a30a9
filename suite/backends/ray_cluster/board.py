"""The plan's board (a Ray actor on the head) and how a node's task talks to it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

GCS_CALL_S = 5.0  # the longest a call that needs the head may take before the last answer serves
ALL = "*"  # the board's stop for every attempt of the plan
ASKED = "asked"  # why a task stopped its run: the board asked it to
BOARD_GONE = "board gone"  # why a task did not run: the plan's board actor died
NOT_STARTED = "budget spent"  # why a task did not start its run: the plan's --budget had passed


class Board:
    """A Ray actor the tasks tell when they start and when their image is ready: the orchestrator's
    clock for the deadline, and where a lost run was running; and each node's peak calibrations, so
    a node's later runs reuse its first measurement as ``run_plan`` does on one machine. Holds no
    result.

    Times are the board's own, taken as a mark arrives, and handed out as ages (``started_for_s``,
    ``ready_for_s``): the nodes', the board's and the orchestrator's clocks never meet.
    """

    def __init__(self) -> None:
        self.marks: dict[str, dict[str, Any]] = {}
        self.peaks: dict[str, list] = {}  # node id -> [[peak key, peak]]: the node's calibrations so far
        self.stops: set[str] = set()  # attempt keys asked to stop; ALL: every one
        self.starts_until: float | None = None  # by the board's clock: no run starts after it (--budget)

    def peaks_of(self, node_id: str) -> list:
        return list(self.peaks.get(node_id, []))

    def add_peaks(self, node_id: str, measured: list) -> None:
        self.peaks.setdefault(node_id, []).extend(measured)

    def mark(self, key: str, what: str, at: float, facts: dict[str, Any]) -> str:
        """Record the mark; why the attempt is not to go on (the answer a starting task needs): ASKED
        (a stop), NOT_STARTED (it starts once the plan's budget has passed), or "" (go on)."""
        del at  # the node's clock: kept out
        now = time.monotonic()
        entry = self.marks.setdefault(key, {})
        entry[what] = now
        entry.update(facts)
        if self.stop_asked(key):
            return ASKED
        if what == "started" and self.starts_until is not None and now >= self.starts_until:
            return NOT_STARTED
        return ""

    def close_starts_in(self, seconds: float) -> bool:
        """No run starts once ``seconds`` have passed (``run --budget``): a task that starts later
        runs nothing and says so; the runs that started go on."""
        self.starts_until = time.monotonic() + seconds
        return True

    def stop(self, keys: list[str] | None) -> bool:
        """Ask the attempts ``keys`` (None: every one, also those not started yet) to stop."""
        self.stops.update([ALL] if keys is None else keys)
        return True

    def stop_asked(self, key: str) -> bool:
        return ALL in self.stops or key in self.stops

    def snapshot(self) -> dict[str, dict[str, Any]]:
        now = time.monotonic()
        out = {}
        for key, entry in self.marks.items():
            ages = {f"{w}_for_s": now - entry[w] for w in ("started", "ready") if w in entry}
            out[key] = {k: v for k, v in entry.items() if k not in ("started", "ready")} | ages
        return out


def peaks_of(board: Any, node_id: str) -> list:
    import ray

    try:
        return list(ray.get(board.peaks_of.remote(node_id), timeout=30))
    except Exception:  # noqa: BLE001 - without it the run measures its own peak, as a first run does
        return []


def peak_key(value: Any) -> tuple:
    return tuple(value)


def mark_started(ray: Any, board: Any, key: str, **facts: Any) -> str | None:
    """Tell the board this task started; why it is not to start its run (None: it is to)."""
    if board is None:
        return None
    return _board_says_stop(ray, lambda: board.mark.remote(key, "started", time.time(), facts))


def stop_asked(ray: Any, board: Any, key: str) -> str | None:
    if board is None:
        return None
    return _board_says_stop(ray, lambda: board.stop_asked.remote(key))


def _board_says_stop(ray: Any, call: Callable[[], Any]) -> str | None:
    """ASKED when the board says stop; NOT_STARTED when a task starts after the plan's budget;
    BOARD_GONE when the board is dead (it lives with the orchestrator's job: without it no result
    could go back); None otherwise. A board that is slow, or unavailable for a while
    (ActorUnavailableError, say while the head recovers), stops nothing."""
    try:
        answer = ray.get(call(), timeout=GCS_CALL_S)  # mark: a reason or ""; stop_asked: whether
    except Exception as exc:  # noqa: BLE001
        died = getattr(getattr(ray, "exceptions", None), "ActorDiedError", None)
        return BOARD_GONE if died is not None and isinstance(exc, died) else None
    if isinstance(answer, str):
        return answer or None
    return ASKED if answer else None


def mark(board: Any, key: str, what: str, **facts: Any) -> None:
    if board is None:
        return
    try:
        board.mark.remote(key, what, time.time(), facts)
    except Exception:  # noqa: BLE001 - the plan's bookkeeping must never fail a run
        pass
