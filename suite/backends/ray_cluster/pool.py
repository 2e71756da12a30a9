"""The plan's side of the Ray backend (``RayPool``): submit every run, collect each result as it comes,
decide what a lost node or a crashed worker means, and hold every result until it is saved."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from suite.backends.base import BackendUnavailable, Inventory, now_iso
from suite.backends.ray_cluster import head, stopping
from suite.backends.ray_cluster.attempts import Attempt, Finished, Suspect, first_line, iso_time, result_of
from suite.backends.ray_cluster.board import BOARD_GONE, NOT_STARTED
from suite.backends.ray_cluster.head import HEAD_SILENT_S, LOCAL
from suite.backends.ray_cluster.placement import MODEL_SHARE, demand, gpu_model_of, placement_problem
from suite.backends.ray_cluster.stopping import CANCEL_GRACE_S
from suite.backends.ray_cluster.task import Job
from suite.backends.ray_cluster.threads import within
from suite.record import code_identity, provenance
from suite.record.results import RunResult
from suite.spec.plan import RunSpec

POLL_S = 1.0
DEADLINE_MARGIN_S = 60.0  # beyond timeout_s and the worker's grace before the orchestrator cancels
READY_LIMIT_S = 3600.0  # what a node may spend making the run's image before the run's limit starts
BOARD_START_S = 60.0  # the plan's first call to its board (--budget): the actor may be starting on the head
LOST_NODE_WAIT_S = 45.0  # how long a crashed task's node may take to be declared dead (Ray's health check)


class RayPool:
    """The plan's side of the Ray backend: connect, submit, collect, cancel."""

    name = "ray"

    def __init__(
        self,
        machine: str,
        address: str | None = None,
        gpu_model: str | None = None,
        *,
        ray_module: Any = None,
        clock: Callable[[], float] = time.time,
        results_dir: Path | None = None,
    ):
        """machine: the orchestrator's results folder (runs no node could take are recorded there).
        address: HOST:PORT of the cluster's head (GCS), or None for a local instance the pool starts."""
        self.machine = machine
        self.results_dir = results_dir
        if address is not None and not address.strip():
            address = None
        if address is not None and "://" in address:
            raise BackendUnavailable(
                f"--ray-address {address}: give the head's HOST:PORT (its GCS address, as `ray start --head` "
                "prints it); the suite runs as a Ray driver on a node of the cluster, not through Ray Client (ray://)"
            )
        self.address = address
        self.gpu_model = gpu_model
        self.clock = clock
        self._ray = ray_module
        self._started_local = False
        self._connected = False
        self.where = f"the Ray cluster at {address}" if address else LOCAL
        self.gcs_address: str | None = None
        self.session = os.urandom(8).hex()
        self.identity: dict[str, Any] = {}
        self._remote: Any = None
        self._board: Any = None
        self._pending: dict[Any, Attempt] = {}
        self._peaks: dict[str, list] = {}
        self._refusals = 0
        self._counter = 0
        self._nodes_cache: tuple[float, list[dict[str, Any]]] | None = None
        self.gone: str | None = None  # set when the cluster stopped answering: why the plan ended
        self.unstarted = 0  # tasks that started once the plan's budget had passed, and ran nothing
        self._last_marks: dict[str, dict[str, Any]] = {}
        self._silent_since: float | None = None
        self._unplaceable_since: dict[str, float] = {}
        # Results taken from Ray and not yet on file (``saved`` takes them off): an interrupt before
        # then finds them in what ``cancel_all`` hands back, so no result that came back is lost.
        self._unsaved: list[Finished] = []
        # Tasks whose worker crashed on a node not (yet) declared dead: decided on later polls, so
        # Ray's health check is waited out without holding up the rest of the plan.
        self._suspects: dict[str, Suspect] = {}
        self._node_models: dict[str, list[str]] = {}  # node id -> its gpu_model:NAME resources, as last seen alive
        self._sweeper: Any = None
        self._sweeps: list[Any] = []  # sweep tasks still to be waited for before the pool leaves

    @property
    def ray(self) -> Any:
        if self._ray is None:
            self._ray = head.import_ray()  # looked up at call time: a test gives a stand-in
        return self._ray

    def counts_as_done(self, result: RunResult) -> bool:
        """Whether an ``ok`` result on file makes its run done for this plan: one a Ray node made, on
        the GPU model this plan asks for that run (another model, or a result of the docker or local
        backend in some machine's folder, measured something else)."""
        facts = result.run.get("ray")
        if not isinstance(facts, dict):
            return False
        asked = (result.spec.get("config") or {}).get("gpu_model") or self.gpu_model
        return facts.get("gpu_model") == asked

    # -- the link to the cluster (head.py) and stopping (stopping.py): functions of the pool, bound here
    # as its methods ------------------------------------------------------------------------------
    connect = head.connect
    nodes = head.nodes
    _note_new_nodes = head.note_new_nodes
    _salvage = head.salvage
    _ask_stop = head.ask_stop
    _marks = head.marks
    _snapshot = head.snapshot
    _head_answers = head.head_answers
    _sweep_attempt = stopping.sweep_attempt
    _sweep = stopping.sweep_nodes
    cancel_all = stopping.cancel_all
    _take_ended = stopping.take_ended
    _sweep_everywhere = stopping.sweep_everywhere
    _wait_for_sweeps = stopping.wait_for_sweeps

    # -- the Backend protocol, as far as a pool has it -------------------------------------------

    def inventory(self) -> Inventory:
        nodes = [n for n in self.nodes() if n.get("Alive")]
        gpus = sum(float(n.get("Resources", {}).get("GPU", 0)) for n in nodes)
        return {"nodes": len(nodes), "gpus": [], "gpu_total": gpus, "cpus": None, "where": self.where}

    def skip_reason(self, spec: RunSpec) -> str | None:
        return placement_problem(demand(spec, self.gpu_model), self.nodes(), self.where)

    def close_starts_in(self, seconds: float) -> None:
        """``run --budget``: no run starts once ``seconds`` have passed, by the board's clock (from
        when the board takes it: later than the plan's own by this call's latency); a task Ray
        starts later runs nothing and is counted in ``unstarted``. Raises BackendUnavailable when the
        board does not take it: runs submitted without it would all start."""
        self.connect()
        board, ray = self._board, self.ray

        def call() -> Any:  # the plan's first call to its board: the actor may still be starting on the head
            return ray.get(board.close_starts_in.remote(seconds), timeout=BOARD_START_S)

        try:
            taken = within(BOARD_START_S, call)
        except Exception as exc:  # noqa: BLE001 - named in the error, whatever Ray raised
            raise BackendUnavailable(
                f"--budget: the plan's board on {self.where} did not take it: {type(exc).__name__}: {first_line(exc)}"
            ) from None
        if taken is not True:
            raise BackendUnavailable(
                f"--budget: the plan's board on {self.where} did not take it within {BOARD_START_S:g} s"
            )

    def run_info(self) -> dict[str, Any]:
        ray = {"address": self.address or "local", "session": self.session}
        return {"backend": self.name, "machine": self.machine, "ray": ray}

    def skipped(self, spec: RunSpec, reason: str) -> RunResult:
        now = now_iso()
        run = {**self.run_info(), "started_at": now, "finished_at": now}
        # The model asked for, as a node's record names it: a rerun then finds this skip (counts_as_done).
        run["ray"] = {**run["ray"], "gpu_model": gpu_model_of(spec, self.gpu_model)}
        return RunResult(status="skipped", spec=spec.to_dict(), message=reason, run=run, provenance=self._stamp())

    def _stamp(self) -> dict[str, Any]:
        identity = self.identity or code_identity.current_suite_identity()
        return provenance.provenance_of(identity, provenance.environment_here(), None)

    # -- submitting and collecting ----------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Runs whose result is not on file yet: in Ray, being decided (a crashed worker), or held."""
        return len(self._pending) + len(self._suspects) + len(self._unsaved)

    def submit(
        self, spec: RunSpec, *, attempt: int = 1, retry_of: str | None = None, pin: list[str] | None = None
    ) -> None:
        """pin: custom resources the task must also find on its node (a retry's: the lost node's GPU model)."""
        self.connect()
        self._counter += 1
        key = f"{self.session}-{self._counter}"
        need = demand(spec, self.gpu_model)
        custom = {k: v for k, v in need.items() if k not in ("CPU", "GPU")}
        custom.update({k: MODEL_SHARE for k in pin or []})
        job: Job = {
            "suite": self.identity,
            "session": self.session,
            "address": self.address or "local",
            "key": key,
            "attempt": attempt,
            "retry_of": retry_of,
            "gpu_model": self.gpu_model,
            "peaks": self._peaks,
            "pin": list(pin or []),
        }
        ref = self._remote.options(
            num_cpus=need["CPU"],
            num_gpus=need.get("GPU", 0),
            resources=custom,
            max_retries=0,
            retry_exceptions=False,
            name=f"suite {spec.scenario} [{spec.point_label}] rep {spec.repetition}",
        ).remote(spec.to_dict(), job, self._board)
        self._pending[ref] = Attempt(spec, key, attempt, retry_of, submitted=self.clock(), pin=list(pin or []))

    def collect(self, timeout: float = POLL_S) -> list[Finished]:
        """Results to save now: those that arrived within ``timeout``, after the plan's checks
        (deadlines, crashed workers whose node died, runs no alive node can take any more, the head
        still answering), and those handed out before but not yet ``saved``."""
        if (self._pending or self._suspects) and self.gone is None:
            self._poll(timeout)
        return list(self._unsaved)

    def saved(self, done: Finished) -> None:
        """``done`` is on file: the pool lets go of it."""
        self._unsaved = [d for d in self._unsaved if d is not done]

    def held(self) -> list[Finished]:
        """The results taken from Ray and not yet saved (what ``cancel_all`` returns, also when a
        second Ctrl-C ended it early)."""
        return list(self._unsaved)

    def _poll(self, timeout: float) -> None:
        """Take what Ray has for the plan into ``_unsaved``, each result as soon as it is made."""
        # First, and before any call that needs the head: once the head is gone, Ray's calls block,
        # and Ray ends this process on its own within a minute (its raylet or GCS client gives up).
        if not self._head_answers():
            self._end_without_head()
            return
        ray = self.ray
        if self._pending:
            done, _ = ray.wait(list(self._pending), num_returns=len(self._pending), timeout=timeout)
        else:  # only crashed workers to decide
            time.sleep(timeout)
            done = []
        # Each record is held before its attempt is let go: an interrupt in between finds it twice at
        # most (cancel_all skips an attempt already held), never nowhere.
        for ref in done:
            records = self._finished(ref, self._pending[ref])
            if records is None:  # a task found the board gone, and the head went with it
                self._end_without_head()
                return
            self._hold(records)
            del self._pending[ref]
        self._decide_suspects()
        self._check_deadlines_and_placement()
        self._note_new_nodes()

    def _end_without_head(self) -> None:
        """The head stopped answering: the plan ends with what reached this driver, the started runs
        recorded as lost with it, the queued ones left for the next run."""
        self.gone = (
            f"{self.where} stopped answering (its head at {self.gcs_address} refuses connections, or has "
            f"not answered for {HEAD_SILENT_S:g} s); "
            "the plan ends here. Results already saved are kept; rerun the same command to resume."
        )
        self._salvage()
        self._abandon_all(
            f"outcome unknown: {self.where} stopped answering (its head at {self.gcs_address} is gone) "
            "while this run was in progress on its node, and its result, if any, could not come back"
        )

    def _hold(self, records: list[Finished]) -> None:
        self._unsaved += records

    def _held_keys(self) -> set[str]:
        return {d.key for d in self._unsaved if d.key}

    def _finished(self, ref: Any, attempt: Attempt) -> list[Finished] | None:
        """The records of a task that ended; None when it found the board gone because the head is
        (the board lives there: the plan ends as for the head's loss, see _end_without_head)."""
        ray = self.ray
        try:
            value = ray.get(ref)
        except (ray.exceptions.TaskCancelledError, ray.exceptions.WorkerCrashedError) as exc:
            if attempt.cancelled_for == "timeout":  # a forced cancel ends the worker: a crash to Ray
                return [self._recorded(attempt, "timeout", self._timeout_text(attempt))]
            if isinstance(exc, ray.exceptions.WorkerCrashedError):
                return self._lost(attempt, exc)
            return [self._recorded(attempt, "error", "the run's Ray task was cancelled")]
        except ray.exceptions.NodeDiedError as exc:
            return self._lost(attempt, exc)
        except getattr(ray.exceptions, "OutOfMemoryError", ()) as exc:
            # Ray's memory monitor killed the task's worker for its node's memory use: the run's
            # container or subprocess lives on without it, so it is swept.
            self._sweep_attempt(attempt)
            why = f"out of host memory: Ray's memory monitor killed the run's task on its node: {first_line(exc)}"
            return [self._recorded(attempt, "host_oom", why)]
        except ray.exceptions.RayTaskError as exc:
            return [self._recorded(attempt, "error", f"the run's Ray task failed on its node: {first_line(exc)}")]
        except ray.exceptions.RayError as exc:
            return [self._recorded(attempt, "error", f"Ray could not run the task: {type(exc).__name__}: {exc}")]
        if value.get("stopped"):  # it stopped its run when the board asked, or found it gone
            if value["stopped"] == NOT_STARTED:  # --budget: not recorded, so the next run takes it
                self.unstarted += 1
                return []
            if attempt.cancelled_for == "timeout":
                return [self._recorded(attempt, "timeout", self._timeout_text(attempt))]
            if value["stopped"] == BOARD_GONE:
                if not self._head_answers():
                    return None
                why = (
                    "the plan's board (a Ray actor on the cluster's head) is gone while the head still answers, "
                    "so its node stopped this run, or did not start it"
                )
                return [self._recorded(attempt, "error", why)]
            return [self._recorded(attempt, "error", "the run was stopped before it ended (the plan was stopping)")]
        for key, peak in value.get("peaks") or []:
            self._peaks.setdefault(value["node_id"], []).append([key, peak])
        return [result_of(attempt, value)]

    def _lost(self, attempt: Attempt, exc: BaseException) -> list[Finished]:
        """A task whose worker or node died: "node lost" when its node is dead (Ray said so, or lists
        it dead), then one retry on a node of the same GPU model; a worker crash on a node that stays
        alive LOST_NODE_WAIT_S (Ray's health check takes a while) is an error, not retried. Until
        that is known the run waits among the suspects, decided on later polls."""
        mark = self._marks().get(attempt.key, {})
        node_id = mark.get("node_id")
        if isinstance(exc, self.ray.exceptions.NodeDiedError):
            return self._node_lost(attempt, str(node_id) if node_id else None)
        if not node_id:
            return [self._crashed(attempt, exc)]
        self._suspects[attempt.key] = Suspect(attempt, exc, str(node_id), self.clock() + LOST_NODE_WAIT_S)
        self._decide_suspects(max_age_s=0)
        return []

    def _decide_suspects(self, max_age_s: float = 1.0) -> None:
        """Hold the record of every suspect whose node Ray now lists dead, or that outlived the wait."""
        if not self._suspects:
            return
        nodes = {n.get("NodeID"): n for n in self.nodes(max_age_s=max_age_s)}
        for key, suspect in list(self._suspects.items()):
            node = nodes.get(suspect.node_id)
            if node is None or not node.get("Alive"):
                self._hold(self._node_lost(suspect.attempt, suspect.node_id))
            elif self.clock() >= suspect.until:
                self._hold([self._crashed(suspect.attempt, suspect.exc)])
            else:
                continue
            del self._suspects[key]

    def _crashed(self, attempt: Attempt, exc: BaseException) -> Finished:
        self._sweep_attempt(attempt)  # its run's container or subprocess outlives the worker
        where = f"node {self._marks().get(attempt.key, {}).get('machine') or '?'}"
        return self._recorded(attempt, "error", f"the run's Ray worker on {where} crashed: {first_line(exc)}")

    def _node_lost(self, attempt: Attempt, node_id: str | None) -> list[Finished]:
        mark = self._marks().get(attempt.key, {})
        where = f"node {mark.get('machine') or node_id or '?'}"
        out = [self._recorded(attempt, "error", f"node lost: {where} of {self.where} died during the run")]
        if attempt.attempt >= 2:
            return out
        # The same GPU model as the lost node: the run's own, else the lost node's gpu_model resources.
        problem = None
        pin: list[str] = []
        if not gpu_model_of(attempt.spec, self.gpu_model):
            if node_id is None or node_id not in self._node_models:
                problem = "the lost node's GPU model is not known (the node list never showed it alive)"
            else:
                pin = self._node_models[node_id]
        need = demand(attempt.spec, self.gpu_model) | {k: MODEL_SHARE for k in pin}
        problem = problem or placement_problem(need, self.nodes(max_age_s=0), self.where)
        if problem:
            lost = out[0].result
            out[0] = replace(out[0], result=replace(lost, message=f"{lost.message}; not retried: {problem}"))
            return out
        self.submit(attempt.spec, attempt=2, retry_of=attempt.key, pin=pin)
        out[0] = replace(out[0], retried=True)
        return out

    def _timeout_text(self, attempt: Attempt) -> str:
        limit = attempt.spec.timeout_s
        if self._marks().get(attempt.key, {}).get("ready_for_s") is None:
            return (
                f"the run's task was still getting its image ready {READY_LIMIT_S:g} s + {limit:g} s (timeout_s) "
                f"+ {DEADLINE_MARGIN_S + 5:g} s after it started; cancelled by the orchestrator"
            )
        return (
            f"the run's task was still running {limit:g} s (timeout_s) + {DEADLINE_MARGIN_S + 5:g} s after its "
            "image was ready; cancelled by the orchestrator (the node's own deadline did not end it)"
        )

    def _check_deadlines_and_placement(self) -> None:
        if not self._pending:
            return
        marks = self._marks()
        now = self.clock()
        nodes = None
        for ref, attempt in list(self._pending.items()):
            mark = marks.get(attempt.key, {})
            ready_for = mark.get("ready_for_s")
            started_for = mark.get("started_for_s")
            limit = attempt.spec.timeout_s + 5.0 + DEADLINE_MARGIN_S
            if attempt.cancelled_for == "timeout" and now - (attempt.cancelled_at or now) > CANCEL_GRACE_S:
                self.ray.cancel(ref, force=True)  # it did not stop when asked: its process goes
                attempt.cancelled_at = now
                self._sweep_attempt(attempt)  # and what its run started, after it
            elif attempt.cancelled_for is None and (
                (ready_for is not None and ready_for > limit)
                or (ready_for is None and started_for is not None and started_for > READY_LIMIT_S + limit)
            ):
                attempt.cancelled_for, attempt.cancelled_at = "timeout", now
                self._ask_stop([attempt.key])  # the task stops its run and removes its container
            elif started_for is None and attempt.cancelled_for is None:
                # Queued: can any alive node still take it? (Its nodes may all have died.)
                nodes = nodes if nodes is not None else self.nodes()
                need = demand(attempt.spec, self.gpu_model) | {k: MODEL_SHARE for k in attempt.pin}
                problem = placement_problem(need, nodes, self.where)
                since = self._unplaceable_since.setdefault(attempt.key, now) if problem else None
                if problem is None:
                    self._unplaceable_since.pop(attempt.key, None)
                elif since is not None and now - since >= LOST_NODE_WAIT_S:  # a node may be rejoining (a pod replaced)
                    attempt.cancelled_for = "unplaceable"
                    self.ray.cancel(ref, force=True)
                    text = f"no alive node can take this run any more: {problem}"
                    self._hold([self._recorded(attempt, "error", text)])
                    self._pending.pop(ref)

    def _recorded(self, attempt: Attempt, status: str, message: str) -> Finished:
        """A result the orchestrator writes itself (the task returned none): under the machine the
        task ran on, when known, else this one's."""
        mark = self._marks().get(attempt.key, {})
        machine = str(mark.get("machine") or self.machine)
        now = now_iso()
        started_for = mark.get("started_for_s")
        facts: dict[str, Any] = {
            "node_id": mark.get("node_id"),
            "machine": machine,
            "address": self.address or "local",
            "attempt": attempt.attempt,
            "attempt_id": attempt.key,
            "session": self.session,
            "gpu_model": gpu_model_of(attempt.spec, self.gpu_model),
        }
        if attempt.retry_of:
            facts["retry_of"] = attempt.retry_of
        if attempt.pin:
            facts["pinned_to"] = list(attempt.pin)
        run = {
            # The node's backend when its task said (it returned no result); else this pool's name.
            "backend": mark.get("backend") or self.name,
            "machine": machine,
            "started_at": iso_time(time.time() - started_for) if started_for is not None else now,
            "finished_at": now,
            "ray": facts,
        }
        spec = attempt.spec.to_dict()
        result = RunResult(status=status, spec=spec, message=message, run=run, provenance=self._stamp())
        return Finished(attempt.spec, machine, result, key=attempt.key)

    def _abandon_all(self, why: str) -> None:
        """The runs in flight when the cluster went away: the started ones and the crashed workers'
        recorded (held), the queued ones left for the next run (they never ran)."""
        marks = self._marks()
        started = [a for a in self._pending.values() if marks.get(a.key, {}).get("started_for_s") is not None]
        self._hold([self._recorded(a, "error", why) for a in started])
        self._pending.clear()
        self._hold_suspects(why)

    def _hold_suspects(self, why: str) -> None:
        """Record every undecided crashed worker's run with ``why`` (its node is swept, as for a crash)."""
        for key, suspect in list(self._suspects.items()):
            if self.gone is None:
                self._sweep_attempt(suspect.attempt)
            self._hold([self._recorded(suspect.attempt, "error", why)])
            del self._suspects[key]

    def close(self) -> None:
        """Cancel what is left and leave the cluster (stopping the local instance the pool started)."""
        if not self._connected:
            return
        if self.gone is not None:
            self._connected = False  # nothing to cancel or leave: every call would block (see collect)
            return
        try:
            self.cancel_all(say=lambda _line: None)
            # The sweeps submitted during the plan end with its job: they are waited for first.
            self._wait_for_sweeps(list(self._sweeps), say=lambda _line: None)
        finally:
            self._connected = False
            try:
                self.ray.shutdown()
            except Exception:  # noqa: BLE001
                pass
