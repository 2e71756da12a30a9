"""The orchestrator's records: an attempt at a run, a crashed worker's run still to be decided, and
the result handed to the runner."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from suite.backends.ray_cluster.task import Reply
from suite.record.results import RunResult
from suite.spec.plan import RunSpec


@dataclass
class Attempt:
    spec: RunSpec
    key: str
    attempt: int = 1
    retry_of: str | None = None
    submitted: float = field(default_factory=time.time)
    cancelled_for: str | None = None  # "timeout" once the orchestrator stopped it at its deadline
    cancelled_at: float | None = None
    pin: list[str] = field(default_factory=list)  # custom resources it must also find (a retry's GPU model)


@dataclass
class Suspect:
    """A task whose worker crashed, on a node Ray had not declared dead yet."""

    attempt: Attempt
    exc: BaseException
    node_id: str
    until: float  # the pool's clock: a node still alive then was not lost


@dataclass
class Finished:
    """A result the pool hands the runner to save, with the machine folder it belongs to."""

    spec: RunSpec
    machine: str
    result: RunResult
    retried: bool = False  # a lost run another attempt was submitted for: not the run's last word
    key: str | None = None  # the attempt it records (None: a record not made from an attempt)


def result_of(attempt: Attempt, value: Reply) -> Finished:
    """The result a task sent back, to be saved under the machine it ran on."""
    return Finished(attempt.spec, value["machine"], RunResult.from_dict(value["result"]), key=attempt.key)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[-1][:300] if text else type(exc).__name__


def iso_time(unix: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(unix, UTC).isoformat(timespec="microseconds")
