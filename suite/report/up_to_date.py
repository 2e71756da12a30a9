"""Whether a report folder already holds what ``suite report`` would write into it, so that a report
over results that have not changed since the last one writes nothing and ends as soon as it has
read them.

What a report writes is made from its inputs alone: the result files' paths and bytes, the command's
options and folders, where the project lies, the suite's code, the versions of Python and of the
packages that shape its bytes, and the scenario files the results name (a page says whether its
points are all of its file's, by their labels, report/rerun, and names a smoke run's settings from
its ``smoke`` block, report/environment_section; no data is looked for). The sha256 of
all but the last (``inputs_digest``) is kept with the sha256 of each scenario file as read and of
the bytes written into each file (not of what lies there as the report ends, which a report into the
same folder at the same time may have replaced), in this user's cache folder (``paths.cache_dir``,
as record/checked_files keeps its list), one entry per report folder. A later report whose inputs
have the same digest, where the scenario files and every file written still hold those bytes, would
write the same bytes again: it writes nothing. Any other file changed, missing or added among the
results, any option, an update of the code or of a package, a scenario file edited, or a page edited
or deleted makes the report write everything anew. Where no digest of the code can be taken or the
cache folder cannot be read, every report writes everything; where it cannot be written, no entry is
kept (an entry of an earlier report still vouches only for the bytes it names).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from suite import paths
from suite.record.results import ReadFile
from suite.report.writing import Wrote
from suite.safe import bounded, whole_file
from suite.spec.yaml_file import MAX_YAML_BYTES

if TYPE_CHECKING:
    from suite.spec.settings import Scenario

KEPT_REPORTS = 1000  # entries kept, one per report folder; the least recently used go first
MAX_ENTRY_BYTES = 16 * bounded.MiB  # a report folder holds a few files per scenario
MAX_FILE_BYTES = 256 * bounded.MiB  # a report.json of many thousands of runs is tens of MB
# Whose versions change what a report writes: the intervals' quantiles, numbers and tables, exports,
# plots and their PNG.
# (wcwidth, where installed, sets how wide tabulate takes a cell of wide or combining characters.)
PACKAGES = ("numpy", "scipy", "tabulate", "wcwidth", "orjson", "pyyaml", "matplotlib", "pillow")


def inputs_digest(read: list[ReadFile], results_dir: Path, out_dir: Path, options: dict[str, Any]) -> str | None:
    """The sha256 of what a report into ``out_dir`` is made from, the scenario files aside; None
    where the code has none."""
    code = paths.code_digest()
    if code is None:
        return None
    versions = {}
    for package in PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[package] = importlib.metadata.version(package)
    made_by = {
        "code": code,
        "project": [str(paths.CHECKOUT), os.fsdecode(paths.project_root())],  # what paths on a page are relative to
        "python": sys.version,
        "packages": versions,
        "options": options,
        "results": [os.fsdecode(results_dir), os.path.realpath(results_dir)],
        "out": [os.fsdecode(out_dir), os.path.realpath(out_dir)],
    }
    digest = hashlib.sha256(json.dumps(made_by, sort_keys=True, ensure_ascii=True).encode())
    for f in read:  # each path lies under results_dir, as given above
        digest.update(b"\0" + os.fsencode(f.path) + b"\0" + f.sha256.encode())
    return digest.hexdigest()


class LastReport:
    """What ``suite report`` last wrote into ``out_dir``, and from what."""

    def __init__(self, out_dir: Path, results_dir: Path) -> None:
        self.out_dir = out_dir
        cache, here = paths.cache_dir(), os.path.realpath(out_dir)
        name = hashlib.sha256(os.fsencode(here)).hexdigest()[:32]
        self.path = cache / "written-reports" / f"{name}.json" if cache is not None else None
        if self.path is not None and any(
            Path(os.path.realpath(self.path)).is_relative_to(os.path.realpath(d)) for d in (results_dir, out_dir)
        ):
            self.path = None  # a cache inside the results folder would be read as a result; in the report, shown

    def unchanged_files(self, inputs: str | None) -> list[Path] | None:
        """The files of ``out_dir`` as the last report wrote them from inputs of digest ``inputs``, in
        the order it wrote them; None where that report had other inputs, a scenario file it read has
        changed, or a file it wrote has."""
        if self.path is None or inputs is None:
            return None
        try:
            entry = json.loads(whole_file.read_kept(self.path, MAX_ENTRY_BYTES))
        except (OSError, ValueError, RecursionError):
            return None
        if not (isinstance(entry, dict) and entry.get("inputs") == inputs):
            return None
        written, scenarios = _pairs(entry.get("files")), _pairs(entry.get("scenarios"))
        if not written or any(sha is None for _, sha in written) or scenarios is None:
            return None
        if len(dict(written)) != len(written) or len(dict(scenarios)) != len(scenarios):
            return None  # a name listed twice: not a report's entry, which names each file once
        if any(_sha256(Path(path), MAX_YAML_BYTES) != sha for path, sha in scenarios):
            return None
        if any(name in ("", ".", "..") or "/" in name or "\0" in name for name, _ in written):
            return None  # not a file of out_dir itself, by its name
        if any(_sha256(self.out_dir / name, MAX_FILE_BYTES) != sha for name, sha in written):
            return None
        with contextlib.suppress(OSError):
            os.utime(self.path)  # used now: the entries pruned first are those least recently used
        return [self.out_dir / name for name, _ in written]

    def save(self, inputs: str | None, scenarios: dict[str, str | None], written: list[Wrote]) -> None:
        """Keep ``written`` (files of ``out_dir``, with the sha256 of the bytes this report wrote
        there), made from inputs of digest ``inputs`` and the ``scenarios`` files as the pages read
        them (``ScenarioFiles.digests``), as the folder's entry."""
        if self.path is None:
            return
        with contextlib.suppress(OSError):
            self.path.unlink(missing_ok=True)  # the last report's entry goes whatever happens next
            if inputs is not None and all(w.path.parent == self.out_dir for w in written):
                entry = {
                    "inputs": inputs,
                    "scenarios": sorted([path, sha] for path, sha in scenarios.items()),
                    "files": [[w.path.name, w.sha256] for w in written],
                }
                text = json.dumps(entry, separators=(",", ":"), ensure_ascii=True)  # a path may not be UTF-8
                whole_file.keep(self.path, text.encode(), most=KEPT_REPORTS)


class ScenarioFiles:
    """The scenario files a report's pages read (report/rerun), each read once, with the sha256 of
    the bytes read: the entry keeps the digest of the very bytes the pages were made from, so a file
    edited while the report runs, even put back before the next one, leaves no page made from it."""

    def __init__(self) -> None:
        self._read: dict[str, tuple[str | None, str | None]] = {}
        self._loaded: dict[str, Scenario | None] = {}

    def text(self, path: Path) -> str | None:
        """The file's text; None where it cannot be read whole within a scenario file's bound (a
        page then names its points), cannot be named to the system, or is not UTF-8."""
        key = os.fsdecode(path)
        if key not in self._read:
            raw, text = _bytes(path, MAX_YAML_BYTES), None
            if raw is not None:
                with contextlib.suppress(UnicodeDecodeError):
                    text = raw.decode("utf-8")
            self._read[key] = (text, None if raw is None else hashlib.sha256(raw).hexdigest())
        return self._read[key][0]

    def scenario(self, spec: dict[str, Any]) -> Scenario | None:
        """The scenario file a result's ``spec`` names (``scenario_path``), read as above and
        checked without looking for its data; None where there is none, or it cannot be read or is
        not a valid scenario (a page then says only what the results record)."""
        from suite.spec import scenario

        path = scenario_path(spec)
        if path is None:
            return None
        key = os.fsdecode(path)
        if key not in self._loaded:
            text, found = self.text(path), None
            if text is not None:
                # A result names the file: a huge matrix is refused as a scenario's. Any invalid file
                # is one the page cannot use.
                with contextlib.suppress(Exception):
                    found = scenario.load(path, repeats=1, resolve_data=not_looked_for, text=text)
            self._loaded[key] = found
        return self._loaded[key]

    def digests(self) -> dict[str, str | None]:
        """Each file read, by its path: the sha256 of the bytes read, None where none could be."""
        return {key: sha for key, (_, sha) in self._read.items()}


def not_looked_for(_: Any) -> dict[str, str]:
    """The data a page's scenario file names, as the page takes it: not looked for (what this
    machine holds would change the page)."""
    return {"source": "not looked for"}


def scenario_path(spec: dict[str, Any]) -> Path | None:
    """The scenario file a result names, where a page looks for it: besides the results, the one
    file a report reads (its bytes' sha256 is kept with the report's entry)."""
    name = spec.get("scenario_file")
    return paths.project_root() / name if isinstance(name, str) and name else None


def _pairs(value: object) -> list[tuple[str, str | None]] | None:
    """An entry's list of [name, sha256 or null]; None where it is anything else."""
    if not isinstance(value, list):
        return None
    pairs = []
    for item in value:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
            return None
        if not (item[1] is None or isinstance(item[1], str)):
            return None
        pairs.append((item[0], item[1]))
    return pairs


def _bytes(path: Path, limit: int) -> bytes | None:
    """The regular file's bytes; None where it cannot be read whole within ``limit`` bytes, or
    cannot be named to the system (a NUL or a lone surrogate in a path a result gives)."""
    try:
        return bounded.read_bytes(path, limit)
    except (OSError, ValueError):
        return None


def _sha256(path: Path, limit: int) -> str | None:
    """Of ``_bytes``; None where there are none."""
    raw = _bytes(path, limit)
    return None if raw is None else hashlib.sha256(raw).hexdigest()
