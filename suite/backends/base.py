"""What every backend shares: the protocol, the run skeleton, the skipped record, how a run ended, the merge.

A backend turns one RunSpec into one RunResult. It never raises for a failed run: a timeout, a
crash, a missing image, a lost engine are statuses. ``run`` is called only for specs that
``skip_reason`` did not rule out.

``RunSkeleton.run`` is the one flow: write the spec, launch, arm the deadline, stream the log
(calling ``on_event`` for each progress line the worker prints), wait, classify the exit by
``classify_exit``, fetch the result file and merge it with what the host saw. A backend only
provides ``launch``, which returns an ``Execution``: kill, log lines, wait, fetch the result.
Every result leaves the skeleton through ``RunSkeleton.stamp``, which adds its ``provenance``: ok,
failed, lost, unavailable and skipped alike.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, Protocol, TypedDict

from suite import telemetry
from suite.backends.worker_output import Deadline, EventSink, LogPump, tail
from suite.record import code_identity, provenance
from suite.record.results import RunResult
from suite.spec.plan import RunSpec
from suite.worker import identity

# The worker ends itself this long after the run's own limit, so the host's deadline fires first
# while the host lives, and the worker's only when nobody is left to enforce it.
WORKER_DEADLINE_GRACE_S = 5.0
LOG_DRAIN_S = 10.0  # how long the log may keep flowing after the exit (a child holding the pipe)

# A backend's tags (``RunSkeleton.tags``) as its workers carry them: container labels, or variables
# in a local worker's environment. A caller whose process may die before its workers (a Ray task
# killed by force) finds them again by these, from another process (``ray_cluster.leftovers.sweep``).
TAG_LABEL_PREFIX = "suite.tag."
TAG_ENV_PREFIX = "SUITE_TAG_"


def tag_labels(tags: Mapping[str, str]) -> dict[str, str]:
    return {TAG_LABEL_PREFIX + key: value for key, value in tags.items()}


def tag_env(tags: Mapping[str, str]) -> dict[str, str]:
    return {TAG_ENV_PREFIX + key.upper(): value for key, value in tags.items()}


class Inventory(TypedDict, total=False):
    """What a backend can give a run (``Backend.inventory``), as ``gpu_pool`` and the backends make it."""

    gpus: list[dict[str, Any]]  # the GPUs it may hand out, in order: index, uuid, name, pci_bus_id, ...
    gpu_note: str | None  # why there are fewer GPUs than the machine has, or none
    cpus: int | None
    cpus_usable: int  # a Docker engine's probe: the CPUs its container may run on
    pool: dict[str, Any]  # which GPUs may be used and what said so (CUDA_VISIBLE_DEVICES, --gpus)
    outside_pool: list[dict[str, Any]]  # the host's GPUs left out by the inherited CUDA_VISIBLE_DEVICES
    source: str  # a Docker engine's: "engine info" or "probe container"
    runtimes: list[str]  # a Docker engine's runtimes
    nodes: int  # a pool of nodes: how many are alive
    gpu_total: float  # a pool of nodes: their GPUs together
    where: str  # a pool of nodes: which cluster


class Backend(Protocol):
    name: str
    machine: str

    def inventory(self) -> Inventory:
        """What this backend can give a run (``Inventory``)."""
        ...

    def skip_reason(self, spec: RunSpec) -> str | None:
        """Why this spec cannot run here (recorded as ``skipped``), or None."""
        ...

    def skipped(self, spec: RunSpec, reason: str) -> RunResult:
        """The ``skipped`` record for a spec, with this backend's run facts."""
        ...

    def run(self, spec: RunSpec, on_event: EventSink | None = None) -> RunResult: ...

    def close(self) -> None:
        """Release what the backend holds (containers, clients); also called on Ctrl-C."""
        ...


def is_pool(backend: Any) -> bool:
    """Whether a backend takes a whole plan at once and places each run on a node of its own
    (``submit``, ``collect``: Ray's pool), rather than running one spec at a time here."""
    return callable(getattr(backend, "submit", None)) and callable(getattr(backend, "collect", None))


@dataclass
class Exit:
    """How the launched worker ended, as the backend saw it.

    oom_killed: whether the kernel's OOM killer acted, by the backend's evidence (the engine's
        ``State.OOMKilled``, the kernel's OOM-kill counters: ``oom.OomWitness``); None where the
        backend has none. ``oom_evidence`` says what it is, in words, for the result's message.
    """

    code: int | None
    signum: int | None = None
    oom_killed: bool | None = None
    oom_evidence: str = ""


class BackendUnavailable(Exception):
    """The chosen backend cannot work at all here; the message says why and what to do instead.

    Defined here, beside the pool rules that raise it, and re-exported by ``suite.backends``.
    """


class RunLost(Exception):
    """The backend lost sight of a launched run (the engine went away): recorded as ``error``."""


class Unavailable(Exception):
    """The run cannot be launched at all (no engine, no image); ``status`` is what gets recorded."""

    def __init__(self, status: str, message: str, facts: dict[str, Any] | None = None):
        super().__init__(message)
        self.status, self.facts = status, facts or {}


class Execution(Protocol):
    """One launched worker. ``facts`` collects what the result's ``run`` section records.

    Optional: ``telemetry_sources() -> list[suite.telemetry.Sampler]``, called once after launch by
    ``RunSkeleton.run`` (found with ``getattr``): what samples the run while it lasts.
    """

    facts: dict[str, Any]

    def lines(self) -> Iterator[str]:
        """The worker's output, line by line as it comes; ends when the output ends."""
        ...

    def wait(self) -> Exit:
        """Block until the worker ends; raises RunLost when that can no longer be known."""
        ...

    def kill(self) -> bool:
        """Kill the worker now; False when it had already ended by itself (no kill was needed)."""
        ...

    def result(self) -> bytes | None:
        """The worker's result file after it ended, or None if it wrote none."""
        ...

    def cleanup(self) -> None:
        """Remove what the launch made (process group, container, folders); never raises; idempotent."""
        ...


class RunSkeleton:
    """The run flow every backend shares; subclasses implement ``launch``, ``run_info`` and
    ``environment_provenance``."""

    name = "backend"
    what = "worker"  # for messages: "worker" or "container"
    memory_limit: str | None = None
    # Set by ``close`` (a subclass's close sets it first): a worker whose launch ends after it, in
    # another thread, is stopped at once (``_attempt``), as the close could not find it.
    closed = False
    # Names (lower case, digits, _) -> values every worker of this backend carries (see tag_labels).
    tags: Mapping[str, str] = MappingProxyType({})

    @property
    def code_copied_at_launch(self) -> bool:
        """True when ``launch`` hands the run a copy of the suite's code: the run then ran the code
        ``suite_provenance`` names after the launch, and later edits cannot reach it. A container
        gets its code in its payload (nothing is mounted from this disk, ``docker_parts``), so a
        backend whose workers are containers copies; a local worker imports the suite from this
        checkout as it goes. A subclass may set it as a class attribute."""
        return self.what == "container"

    def run_info(self) -> dict[str, Any]:
        raise NotImplementedError

    def launch(self, spec: RunSpec, spec_json: bytes, env: dict[str, str]) -> Execution:
        """Start the worker on this spec; raises Unavailable when it cannot start at all."""
        raise NotImplementedError

    def environment_provenance(self, run: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The provenance's (environment, image) blocks for a result whose ``run`` section is ``run``."""
        raise NotImplementedError

    def suite_provenance(self) -> dict[str, Any]:
        """The provenance's suite block: the checkout's identity as it stands (git asked again only
        when the tree changed: ``code_identity.current_suite_identity``)."""
        return code_identity.current_suite_identity()

    def stamp(self, result: RunResult, at_launch: dict[str, Any] | None = None) -> RunResult:
        """The result with its ``provenance`` section: the one place every result of a backend gets it.

        ``at_launch``: the suite block taken just before the worker was launched (``run``). A local
        worker imports the suite from the checkout while it runs, so the code a run ran is the
        checkout at its launch: that block is recorded, and when the checkout's identity at the end
        differs, the block at the end is recorded too, as ``suite_changed_during_run`` (the run may
        have imported some of either). A backend that copies the code at launch
        (``code_copied_at_launch``) records the copy's identity, taken after the launch.
        Taking it never fails a run: an error on the way is recorded in the section instead.
        """
        suite: dict[str, Any] = {}
        try:
            at_end = self.suite_provenance()
            suite = at_end if at_launch is None or self.code_copied_at_launch else at_launch
            environment, image = self.environment_provenance(result.run)
            section = provenance.provenance_of(suite, environment, image)
            if suite is at_launch and at_end != at_launch:
                section[provenance.CHANGED_DURING_RUN] = at_end
        except Exception as exc:  # noqa: BLE001 - a run's figures must not be lost to its provenance
            section = provenance.provenance_of(suite, {}, None)
            section["error"] = f"provenance not taken: {type(exc).__name__}: {exc}"
        return replace(result, provenance=section)

    def skipped(self, spec: RunSpec, reason: str) -> RunResult:
        return self.stamp(skipped_result(spec, reason, self.run_info()))

    def run(self, spec: RunSpec, on_event: EventSink | None = None) -> RunResult:
        try:
            at_launch: dict[str, Any] | None = self.suite_provenance()
        except Exception:  # noqa: BLE001 - stamp takes it again after the run and records what fails
            at_launch = None
        return self.stamp(self._attempt(spec, on_event), at_launch)

    def _stopped_at_start(self, spec: RunSpec, execution: Execution, info: dict[str, Any]) -> RunResult:
        """Closed by another thread while this worker was starting (a Ray task asked to stop): the
        close found no worker to stop, so it is stopped here, before it runs."""
        try:
            execution.kill()
        except Exception:  # noqa: BLE001 - the cleanup removes it anyway
            pass
        execution.cleanup()
        facts = getattr(execution, "facts", {})
        run = {**info, **self.run_info(), **facts, "finished_at": now_iso()}
        why = f"stopped as its {self.what} started: the backend was closed (the plan was stopping)"
        return RunResult(status="error", spec=spec.to_dict(), message=why, run=run)

    def _attempt(self, spec: RunSpec, on_event: EventSink | None) -> RunResult:
        started = time.monotonic()  # telemetry's time zero
        info = {**self.run_info(), "started_at": now_iso()}
        env = worker_env(spec)
        try:
            execution = self.launch(spec, spec_json(spec), env)
        except Unavailable as exc:
            run = {**info, **self.run_info(), **exc.facts, "finished_at": now_iso()}
            return RunResult(status=exc.status, spec=spec.to_dict(), message=str(exc), run=run)
        # From here on the worker exists: whatever ends this attempt (a stop signal arriving while
        # the telemetry starts included) ends it through the cleanup below, never leaving its folder.
        recorder: telemetry.Recorder | None = None
        deadline: Deadline | None = None
        try:
            if self.closed:
                return self._stopped_at_start(spec, execution, info)
            info.update(self.run_info())  # what launching learnt (the engine's version)
            deadline = Deadline(spec.timeout_s)
            recorder = start_telemetry(execution, started)
            pump = LogPump(execution.lines(), recorder.sink(on_event))
            deadline.arm(execution.kill)
            pump.start()
            try:
                ended = execution.wait()
                recorder.halt()  # before cleanup: a removed container has no stats
                timed_out = deadline.disarm()  # waits out a kill in flight, so its verdict is final
                pump.join(LOG_DRAIN_S)
                sampled = recorder.section()  # after the log drained: its last progress lines end the fit window
                record = execution.result()
            except RunLost as exc:
                recorder.halt()
                deadline.disarm()
                pump.join(1.0)
                sampled = recorder.section()
                execution.cleanup()
                info.update(execution.facts, finished_at=now_iso())
                lost = merge_result(spec, None, pump.text(), info, "error", str(exc))
                return replace(lost, telemetry=sampled)
            execution.cleanup()  # before the facts are taken: its cost is one of them
            info.update(execution.facts, exit_code=ended.code, finished_at=now_iso())
            status, message = classify_exit(
                deadline_fired=timed_out,
                oom_killed=ended.oom_killed,
                oom_evidence=ended.oom_evidence,
                exit_code=ended.code,
                signum=ended.signum,
                wrote_result=record is not None,
                timeout_s=spec.timeout_s,
                memory_limit=self.memory_limit,
                what=self.what,
            )
            merged = merge_result(spec, record, pump.text(), info, status, message)
            return replace(merged, telemetry=sampled)
        except BaseException:
            # Ctrl-C or SIGTERM of the orchestrator: the worker must not outlive it.
            try:
                execution.kill()
            except Exception:  # noqa: BLE001 - the cleanup below removes it anyway
                pass
            raise
        finally:
            if recorder is not None:
                recorder.halt()
            if deadline is not None:
                deadline.disarm()
            execution.cleanup()


def worker_env(spec: RunSpec) -> dict[str, str]:
    """What every worker gets in its environment, wherever it runs."""
    return {
        "KERAS_BACKEND": spec.config["backend"],
        "PYTHONUNBUFFERED": "1",  # progress lines arrive as they happen, and the log tail is whole
        "SUITE_DEADLINE_S": f"{spec.timeout_s + WORKER_DEADLINE_GRACE_S:g}",
        # CUDA numbers GPUs fastest first by default; nvidia-smi, NVML and Docker in PCI bus order.
        "CUDA_DEVICE_ORDER": identity.DEVICE_ORDER,
    }


def spec_json(spec: RunSpec) -> bytes:
    return json.dumps(spec.to_dict(), indent=1, sort_keys=True).encode("utf-8")


def skipped_result(spec: RunSpec, reason: str, run_info: dict[str, Any]) -> RunResult:
    now = now_iso()
    return RunResult(
        status="skipped", spec=spec.to_dict(), message=reason, run={**run_info, "started_at": now, "finished_at": now}
    )


def classify_exit(
    *,
    deadline_fired: bool,
    oom_killed: bool | None,
    exit_code: int | None,
    signum: int | None,
    wrote_result: bool,
    timeout_s: float,
    memory_limit: str | None = None,
    what: str = "worker",
    oom_evidence: str = "",
) -> tuple[str, str]:
    """(status, message) for how a run ended, by the same rule on every backend; "" takes the worker's own.

    deadline_fired: the suite's deadline marked the run as over before sending its kill, so the
        kill's own exit code can never make a timeout look like anything else.
    oom_killed: whether the kernel's OOM killer acted, by the backend's evidence (Docker's
        ``State.OOMKilled``, the kernel's OOM-kill counters for a local worker); None: not known.
        ``oom_evidence``: that evidence in words, put in the message.
    exit_code, signum: as the backend saw them (-9 from a subprocess, 137 from a container) and the
        signal that ended the process, if one did.
    what: "worker" or "container", for the message.

    The suite sends SIGKILL only at its deadline (handled first): any other SIGKILL came from the
    kernel's OOM killer, or from a person or another program. It is ``host_oom`` only where the
    evidence says the OOM killer acted; otherwise ``error``, saying which.
    """
    code = "no exit code" if exit_code is None else f"exit code {exit_code}"
    if deadline_fired:
        return "timeout", f"{what} killed after the run's limit of {timeout_s:g} s (timeout_s)"
    killed = signum == signal.SIGKILL
    if oom_killed:
        if killed and oom_evidence:
            how = f"the {what} was killed by SIGKILL ({code}), which the suite did not send, and {oom_evidence}"
        elif oom_evidence:
            how = f"{oom_evidence} ({code})"
        else:
            how = f"the engine reports that the kernel's OOM killer ended the {what} ({code})"
        limit = f" (memory limit {memory_limit})" if memory_limit else ""
        why = f"the kernel's OOM killer sends SIGKILL when memory runs out{limit}"
        return "host_oom", f"out of host memory: {how}; {why}"
    if killed and not wrote_result:
        if oom_killed is None:
            evidence = oom_evidence or "this backend has no evidence either way"
            return "error", (
                f"{what} killed by SIGKILL ({code}), which the suite did not send; whether the kernel's "
                f"OOM killer sent it is not known ({evidence})"
            )
        evidence = f" ({oom_evidence})" if oom_evidence else ""
        return "error", (
            f"{what} killed by SIGKILL ({code}), not by the kernel's OOM killer{evidence}: the suite did not "
            "send it either; another process or a person did"
        )
    if not wrote_result:
        if signum is not None:
            return "error", f"{what} killed by {_signal_name(signum)} ({code}) without writing a result"
        if exit_code is None:
            return "error", f"{what} ended with no exit code and without writing a result"
        return "error", f"{what} exited with code {exit_code} without writing a result"
    return "", ""


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def merge_result(
    spec: RunSpec,
    record_bytes: bytes | None,
    log: str,
    run_info: dict[str, Any],
    fallback_status: str,
    fallback_message: str,
) -> RunResult:
    """Merge the worker's record with what the host saw; the host's word wins when it killed the run."""
    record: dict[str, Any] = {}
    if record_bytes is not None:
        try:
            loaded = json.loads(record_bytes.decode("utf-8"))
            record = loaded if isinstance(loaded, dict) else {}
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            fallback_message = f"worker result unreadable ({exc}); {fallback_message}"
    status = record.get("status") if record and fallback_status in ("", "ok") else fallback_status
    message = record.get("message", "") if status == record.get("status") else fallback_message
    if not status:
        status, message = "error", fallback_message or "worker wrote no result"
    run = {**run_info, **{k: v for k, v in record.items() if k == "settings"}}
    if record.get("traceback"):
        run["traceback"] = record["traceback"]
    return RunResult(
        status=status,
        spec=spec.to_dict(),
        message=message,
        log_tail="" if status == "ok" else tail(log),
        run=run,
        timing=record.get("timing", {}),
        quality=record.get("quality", {}),
        work=record.get("work", {}),
        environment=record.get("environment", {}),
    )


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def start_telemetry(execution: Execution, t0: float) -> telemetry.Recorder:
    """Start the samplers an execution offers (its optional ``telemetry_sources()``: a list of
    ``suite.telemetry.Sampler``); none when it offers none. A sampler that cannot be made is recorded
    in the section as an error; it never stops the run."""
    sources = getattr(execution, "telemetry_sources", None)
    samplers: list[telemetry.Sampler] = []
    if sources is not None:
        try:
            samplers = list(sources())
        except Exception as exc:  # noqa: BLE001 - telemetry never fails a run
            broken = telemetry.Sampler()
            broken.error = f"no telemetry: {type(exc).__name__}: {exc}"
            samplers = [broken]
    return telemetry.Recorder(samplers, t0).start()
