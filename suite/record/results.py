"""The result record: one JSON file per run, versioned, written atomically and never overwritten
(``suite.record.saving``), read back and checked here.

Schema history (bump SCHEMA_VERSION and add a migration in ``_MIGRATIONS`` when a field changes
meaning or moves; adding an optional field does not need a bump):

- 1: first version. Sections: spec, run, timing, quality, work, environment; status + message +
  log_tail for every outcome.
- 2: ``work.flops_per_example_train`` counts the train step's matmuls exactly (the first layer has
  no input gradient; version 1 counted 3 x forward, 9-48% too many) and ``work.flops_counted`` says
  so; ``work.peak`` comes from an orthogonal matmul chain in the run's compute dtype (version 1's
  chain decayed to zeros); ``timing.overhead_share`` is no longer clamped at 1. The migration
  recounts the FLOPs from the spec and moves a version-1 peak to ``work.peak_schema1``, which no
  report divides by.

Optional sections added without a bump (older records simply lack them):

- ``telemetry``: what the machine did during the run, sampled on the machine the worker ran on
  (``suite.telemetry``, whose docstring defines the layout): CPU (% of one core) and memory of the
  worker's process tree (5 Hz) or container (the engine's stats, about 1 Hz), and at 5 Hz per GPU
  its utilization, memory used, SM clock, power, temperature and clock event reasons. Each metric
  has a summary (mean, p95, max, n) over the whole run, the timed ``fit`` and its ``steady`` part
  after the first epoch, and its series (seconds from the run's start, at most 600 points: longer
  series are averaged in equal-count buckets). Each source says the rate it achieved, its sample
  count, and its error if it had one. Reports read it through ``telemetry_figures.figures_of``.
  Its ``load`` block (local runs and runs on a Docker engine on this machine; records made before
  it lack it) is the machine's load around the run (``suite.telemetry.load``): cores used by
  processes not the run's own, CPU steal, the load average at the start and the end, other compute
  processes on the run's GPUs; read through ``load_of``, and ``load_note`` says when a result was
  measured under load.
- ``provenance``: what produced the result, so a figure can be traced and rerun (``suite.record.provenance``
  builds it, its ``suite`` block from ``suite.record.code_identity``; ``suite.report.provenance_text``
  compares two): ``suite`` (``version``, ``git_revision``, ``git_dirty``, ``dirty_paths``:
  tracked files outside ``reports/`` (the suite's output, not code; records made before that
  counted pages there too) differing from HEAD and untracked, not ignored files under ``suite/`` (code a run
  can import), the latter as ``"suite/x.py (untracked)"``, at most 50, ``diff_sha256``: sha256 of
  ``git diff --full-index HEAD`` with those untracked files shown as new files and every diff option
  git configuration could change fixed, ``code_identity.suite_identity`` says exactly; records made before that
  hashed a diff whose ``index`` lines carried abbreviated object IDs, as long as the recording
  clone's ``core.abbrev`` and object count made them, and ignored files a personal ignore file or
  ``.git/info/exclude`` matched, so their ``diff_sha256`` may not match a hash taken now of the
  same tree), ``code_tree``: sha256 of HEAD's top-level tree listing less ``reports/``, equal for
  two revisions that differ only in published pages and results (absent in older records)),
  ``environment`` (``kind`` venv or image, ``lock_file`` and ``lock_sha256`` of the lock it was
  installed from, ``matches_lock`` whether the installed distributions equal the lock's pins, null
  when not checked, ``lock_differences`` in words) and ``image`` (null for a local run or a run
  that got no image; else ``name``, ``id``, ``digest``, ``recipe_hash``, ``context_hash``, and its
  base: ``base_source`` registry or debian, ``base_name``, ``base_digest`` the registry digest or
  null, ``base_id`` the base's ID on the build machine; records made before these four keys read
  them from the run's recorded labels, ``provenance.of_result``). Every
  result a backend makes carries it, whatever its status; nulls where a fact is not known.
  ``suite`` is the checkout when the worker was launched (for a Docker run: the code copied into
  its container). A local worker imports the suite from the checkout while it runs, so when the
  checkout's identity at the run's end differs from that, the section also holds
  ``suite_changed_during_run``: the ``suite`` block at the end (the run may have imported some of
  either). Reports, ``show`` and the exports say so; records made before this was checked lack the
  key, and their ``suite`` is the checkout at their end.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from suite.record import shape, strict_json
from suite.record.checked_files import CheckedFiles, SlimRecords, without_series
from suite.safe import bounded

SCHEMA_VERSION = 2

STATUS_OK = "ok"
STATUS_SKIPPED = "skipped"  # the backend cannot run this point here (no GPU, framework missing): not a failure
# Every way a run can fail; each is recorded, counted, shown, and makes `suite run` exit 1.
FAILED = ("error", "timeout", "host_oom", "gpu_oom", "nan_loss", "device_mismatch", "image_unavailable")
STATUSES = (STATUS_OK, *FAILED, STATUS_SKIPPED)


def _v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    from suite.worker.model import FLOPS_COUNTED, flops_per_example

    work, timing = dict(data.get("work") or {}), data.get("timing") or {}
    model_cfg = ((data.get("spec") or {}).get("config") or {}).get("model") or {}
    if "flops_per_example_train" in work and model_cfg.get("hidden"):
        eps = timing.get("steady_examples_per_s")
        try:
            train = flops_per_example(model_cfg)["train"]
            achieved = float(train * eps) if eps else None
        except (KeyError, TypeError, ValueError, AttributeError, ArithmeticError, RecursionError) as exc:
            # The record's shape was checked, not whether its model is one this code can count.
            raise ValueError(
                f"field spec.config.model: a version-1 record's model whose FLOPs cannot be recounted "
                f"({type(exc).__name__}: {str(exc)[:200]}); allowed: a model this suite builds"
            ) from None
        work.update(
            flops_per_example_train=train,
            flops_counted=FLOPS_COUNTED + " (recounted from a version-1 record, which counted 3 x forward)",
            achieved_flops_per_s=achieved,
        )
    if "peak" in work:
        work["peak_schema1"] = work.pop("peak")
    # Version 1's step-cost probe was one hidden unit without dropout, and its share was clamped at
    # 1: not the figure the report now describes, so set aside rather than shown under that name.
    timing = dict(timing)
    for key in ("step_floor_s", "overhead_share"):
        if key in timing:
            timing[f"{key}_schema1"] = timing.pop(key)
    return {**data, "work": work, "timing": timing, "schema_version": 2}


# version -> function turning a record of that version into one of version + 1.
_MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _v1_to_v2}


class ResultError(Exception):
    """A result file that cannot be read; the message says which file and what to do."""


@dataclass(frozen=True)
class RunResult:
    status: str
    spec: dict[str, Any]  # RunSpec.to_dict(): what was asked
    message: str = ""
    log_tail: str = ""
    run: dict[str, Any] = field(default_factory=dict)  # backend, machine, times, command
    timing: dict[str, Any] = field(default_factory=dict)
    quality: dict[str, Any] = field(default_factory=dict)
    work: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    telemetry: dict[str, Any] = field(default_factory=dict)  # suite.telemetry: what the machine did during the run
    provenance: dict[str, Any] = field(default_factory=dict)  # record.provenance: the code, lock and image behind it
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}; allowed: {', '.join(STATUSES)}")

    @property
    def fingerprint(self) -> str:
        return str(self.spec.get("fingerprint", ""))

    @property
    def ok(self) -> bool:
        return self.status == STATUS_OK

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "status": self.status,
            "message": self.message,
            "log_tail": self.log_tail,
            "spec": self.spec,
            "run": self.run,
            "timing": self.timing,
            "quality": self.quality,
            "work": self.work,
            "environment": self.environment,
            "telemetry": self.telemetry,
            "provenance": self.provenance,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunResult:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


class Field(NamedTuple):
    """Where one figure or fact lives in a record: its section and key. Readers name fields by these
    constants, so a key is spelled once."""

    section: str  # timing, quality, work, run, environment or telemetry
    key: str

    def of(self, result: RunResult) -> Any:
        return getattr(result, self.section).get(self.key)


# timing: seconds unless named otherwise
FIT_S = Field("timing", "fit_s")  # the whole model.fit, what the original questions timed
STEADY_EPOCH_S = Field("timing", "steady_epoch_s")  # median epoch after the first
STEADY_EXAMPLES_PER_S = Field("timing", "steady_examples_per_s")
FIRST_EPOCH_OVERHEAD_S = Field("timing", "first_epoch_overhead_s")  # first epoch beyond a steady one
STEADY_INCLUDES_FIRST_EPOCH = Field("timing", "steady_includes_first_epoch")  # one epoch only
STEP_S = Field("timing", "step_s")
STEP_FLOOR_S = Field("timing", "step_floor_s")  # the same model with every hidden width 1
# quality
TEST_ACCURACY = Field("quality", "test_accuracy")
DATA_SOURCE = Field("quality", "data_source")  # synthetic, mnist.npz, download, ...
DATA_DETAIL = Field("quality", "data_detail")
# work
ACHIEVED_FLOPS_PER_S = Field("work", "achieved_flops_per_s")
PEAK = Field("work", "peak")  # {"flops_per_s": ..., "source": "cached" when reused}
FLOPS_COUNTED = Field("work", "flops_counted")  # what the FLOP count includes, in words
# run: what the host saw
RUN_BACKEND = Field("run", "backend")
RUN_MACHINE = Field("run", "machine")
RUN_IMAGE = Field("run", "image")
RUN_IMAGE_ID = Field("run", "image_id")
RUN_ENGINE_VERSION = Field("run", "engine_version")
FINISHED_AT = Field("run", "finished_at")  # ISO time; the newest attempt of a run wins
# environment: what the worker saw
ENV_HOST = Field("environment", "host")
ENV_VERSIONS = Field("environment", "versions")
ENV_GPUS = Field("environment", "gpus_driver")
# telemetry
LOAD = Field("telemetry", "load")  # suite.telemetry.load: the machine's load around the run


def finished_at(result: RunResult) -> str:
    """Sort key for attempts: the newest last (records without the time sort first)."""
    value = result.run.get(FINISHED_AT.key)
    return value if isinstance(value, str) else ""


def load(path: Path, in_folder: bool = False) -> RunResult:
    """The result in ``path``; ResultError naming the file when it cannot be read (not UTF-8, not
    JSON) or is not a result. ``in_folder``: it was found in a results folder, which it blocks."""
    return _load(path, in_folder)


def _load(
    path: Path,
    in_folder: bool = False,
    known: CheckedFiles | None = None,
    taken: tuple[bytes, str] | None = None,
    slim: SlimRecords | None = None,
) -> RunResult:
    """``load``. With ``known``: bytes found to be a result before (record/checked_files, by their
    sha256) are decoded by orjson without the checks (``strict_json.decoded``'s and the record's shape). For
    such bytes it reads the same objects: they passed those checks, and what orjson refuses that
    json took (an escaped lone surrogate) is checked as any other file. ``taken``: the file's bytes
    and their sha256, as ``read_folder`` took them (the bytes decoded are the bytes hashed).
    ``slim``: the record less its telemetry series (``without_series``), kept there for the next."""
    advice = IN_FOLDER if in_folder else ""
    try:
        if taken is None:
            raw = _read(path, advice)
            digest = hashlib.sha256(raw).hexdigest() if known is not None else ""
        else:
            raw, digest = taken
        if known is not None and known.checked(digest):
            with contextlib.suppress(Exception):  # refused by orjson alone: checked as any other file
                return _slimmed(_known(orjson.loads(raw)), digest, slim)
        data = strict_json.decoded(raw)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, NaN; nesting
        why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise ResultError(f"{path}: not a readable result file ({why}){advice}") from None
    version = data.get("schema_version") if isinstance(data, dict) else None
    if not isinstance(version, int):
        raise ResultError(f"{path}: no schema_version; this is not a result file of this suite")
    if version > SCHEMA_VERSION:
        raise ResultError(
            f"{path}: schema_version {version} is newer than this suite understands ({SCHEMA_VERSION}); "
            "update the suite (git pull) to read it"
        )
    while version < SCHEMA_VERSION:
        if version not in _MIGRATIONS:
            raise ResultError(
                f"{path}: schema_version {version} has no migration to {SCHEMA_VERSION}; "
                "rerun the scenario with --fresh to record it again"
            )
        if not shape.valid(data) and (found := shape.problem(data)) is not None:  # before a migration
            raise ResultError(f"{path}: {found}{advice}")
        try:
            data = _MIGRATIONS[version](data)
        except ValueError as exc:
            raise ResultError(f"{path}: {exc}{advice}") from None
        version = data["schema_version"]
    if not shape.valid(data) and (found := shape.problem(data)) is not None:
        raise ResultError(f"{path}: {found}{advice}")
    try:
        result = _slimmed(data, digest, slim)
    except (TypeError, ValueError) as exc:
        raise ResultError(f"{path}: malformed result ({exc})") from None
    if known is not None:
        known.add(digest)
    return result


def _read(path: Path, advice: str) -> bytes:
    try:
        return bounded.read_bytes(path, MAX_RESULT_BYTES)
    except OSError as exc:
        raise ResultError(f"{path}: not a readable result file ({exc.strerror or exc}){advice}") from None


def _known(data: dict[str, Any]) -> dict[str, Any]:
    """A record found to be a result before: migrated as ``load`` does, without the checks."""
    while data["schema_version"] < SCHEMA_VERSION:
        data = _MIGRATIONS[data["schema_version"]](data)
    return data


def _slimmed(data: dict[str, Any], digest: str, slim: SlimRecords | None) -> RunResult:
    """The result of a record's ``data`` (checked and migrated); with ``slim``, less its telemetry
    series, and kept there as the record of the bytes with sha256 ``digest``."""
    if slim is None:
        return RunResult.from_dict(data)
    whole, data = data, without_series(data)
    result = RunResult.from_dict(data)
    if data is not whole:  # a record without series is decoded from its file as fast
        slim.put(digest, data)
    return result


IN_FOLDER = "; move it out of the results folder"  # what an error about a file found in one advises

# A result is 3-20 KB (telemetry series are capped at 600 points per metric; eight GPUs' metrics
# make about 1.5 MB); a file far larger is not one, and reading it whole could exhaust memory (a
# link to /dev/zero never ends; a megabyte of "[]" is a hundred megabytes of lists).
MAX_RESULT_BYTES = 4 * bounded.MiB


class ReadFile(NamedTuple):
    """A result file as read: its path, its bytes (None where they were not kept) and their sha256."""

    path: Path
    raw: bytes | None
    sha256: str


# The bytes ``read_folder`` keeps for ``load_folder`` to decode; beyond them a file is read again.
# Held beside the records as they are decoded, they add to the peak memory of a report (decoded, a
# record takes two to three times its bytes): 10,000 files of 15 KB are 150 MB.
KEPT_BYTES = 256 * bounded.MiB


def result_paths(folder: Path) -> list[Path]:
    """The result files under ``folder`` (recursively), sorted by path so output is deterministic.
    Names starting with '.' (temp files) or '_' (a version-1 peak calibration cache) are not results,
    nor is anything in a folder so named. A folder named ``*.json`` (a machine or scenario may be
    named so) is a folder; every other entry so named is listed, whatever it is (a link or a FIFO is
    then refused as a result, not passed over). Links to folders are not followed (a link to a
    parent would never end); a folder that cannot be listed for its permissions is passed over, and
    any other error listing one is raised (OSError).

    One ``os.scandir`` per folder: ``Path.rglob`` lists each folder twice and builds a path for
    every entry, ten times slower over thousands of files, and what it passes over differs between
    Python versions."""
    found: list[tuple[str, ...]] = []
    stack: list[tuple[str, ...]] = [()] if folder.is_dir() else []  # none in a folder that is not there
    while stack:
        parts = stack.pop()
        try:
            with os.scandir(os.path.join(folder, *parts)) as listing:
                entries = list(listing)
        except PermissionError:
            continue
        for entry in entries:
            if entry.name[0] in "._":
                continue
            if _is_folder(entry):
                stack.append((*parts, entry.name))
            elif entry.name.endswith(".json"):
                found.append((*parts, entry.name))
    found.sort()  # as Path's order of paths under one folder
    return [folder.joinpath(*parts) for parts in found]


def _is_folder(entry: os.DirEntry[str]) -> bool:
    """Whether ``entry`` is a folder and not a link to one; False where it is gone already."""
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def read_folder(folder: Path) -> list[ReadFile]:
    """Every result file under ``folder`` read, hashed, and not yet decoded: what a report's pages are
    drawn from (report/up_to_date); ``load_folder(read=...)`` decodes them. The bytes of the files
    read first are kept, up to KEPT_BYTES in all."""
    out, kept = [], 0
    for path in result_paths(folder):
        raw = _read(path, IN_FOLDER)
        kept += len(raw)
        out.append(ReadFile(path, raw if kept <= KEPT_BYTES else None, hashlib.sha256(raw).hexdigest()))
    return out


def _each_read(folder: Path) -> Iterator[ReadFile]:
    """``read_folder``, one file at a time: its bytes are gone once the next is read."""
    for path in result_paths(folder):
        raw = _read(path, IN_FOLDER)
        yield ReadFile(path, raw, hashlib.sha256(raw).hexdigest())


def load_folder(
    folder: Path, frozen: bool = False, read: list[ReadFile] | None = None, slim: bool = False
) -> list[tuple[Path, RunResult]]:
    """Every result under ``folder`` (``result_paths``), decoded; where ``read`` is given, the files
    ``read_folder`` read, each left in ``read`` without its bytes and with the sha256 of those decoded.

    ``frozen``: for a command that holds the records until it ends (report, compare). Decoded JSON
    forms no reference cycles, yet the cycle collector would rescan every one of its objects at each
    full collection, while loading and after (10,000 files of 15 KB: a third of a report's time);
    frozen (``gc.freeze``), they are left out. Refcounts still free them, but garbage cycles of the
    moment are frozen too and never freed: not for a long-lived process (a plan's loop). The last
    frozen load is also held here until the process ends (``held_frozen``): the command line then
    exits without freeing its objects one by one (``cli.console``).

    ``slim``: for a command that draws pages (report, compare): the records less their telemetry
    series (checked_files.without_series), which no page reads; those of files checked before are
    taken from the folder's SlimRecords, a fraction of the bytes to decode.
    """
    known = CheckedFiles(folder)
    store = SlimRecords(folder) if slim else None
    collecting = gc.isenabled()
    if frozen:
        gc.disable()
    try:
        if read is None and store is None:
            out = [(p, _load(p, True, known)) for p in result_paths(folder)]
        else:
            out = []
            for i, (path, raw, digest) in enumerate(read if read is not None else _each_read(folder)):
                if store is not None and known.checked(digest) and (data := store.get(digest)) is not None:
                    with contextlib.suppress(Exception):  # as _load takes a record checked before
                        out.append((path, RunResult.from_dict(data)))
                        if read is not None:
                            read[i] = ReadFile(path, None, digest)
                        continue
                if raw is None:  # not kept: read again, and what is decoded is what is hashed
                    raw = _read(path, IN_FOLDER)
                    digest = hashlib.sha256(raw).hexdigest()
                out.append((path, _load(path, True, known, taken=(raw, digest), slim=store)))
                if read is not None:
                    read[i] = ReadFile(path, None, digest)  # decoded: its bytes go
    finally:
        if frozen:
            gc.freeze()
            if collecting:
                gc.enable()
    known.save()
    if store is not None:
        store.save()
    if frozen:
        _HELD[:] = [out]  # the last load only: a process that calls the CLI again holds no more
    return out


_HELD: list[list[tuple[Path, RunResult]]] = []  # load_folder(frozen=True)'s records, to the process's end


def held_frozen() -> bool:
    """Whether this process loaded a folder frozen: it holds those records until it ends."""
    return bool(_HELD)


def latest_by_run(results: list[RunResult]) -> dict[tuple[str, int], RunResult]:
    """(fingerprint, repetition) -> the newest attempt, so a rerun after a failure wins."""
    out: dict[tuple[str, int], RunResult] = {}
    for r in sorted(results, key=finished_at):
        out[(r.fingerprint, int(r.spec.get("repetition", 0)))] = r
    return out
