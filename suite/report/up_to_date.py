"""Whether a report folder already holds what ``suite report`` would write into it, so that a report
over results that have not changed since the last one writes nothing and ends as soon as it has
read them.

What a report writes is made from its inputs alone: the result files' paths and bytes, the
command's options and folders, the suite's code and the versions of the packages that shape its
bytes. The sha256 of all of them (``inputs_digest``) is kept with the sha256 of the bytes written
into each file (not of what lies there as the report ends, which a report into the same folder at
the same time may have replaced), in this user's cache folder (``paths.cache_dir``, as
record/checked_files keeps its list), one entry per report folder. A later report whose inputs
have the same digest, into a folder whose files all still hold the bytes written, would write
those bytes again: it writes nothing. Any other file changed, missing or added among the results,
any option, an update of the code or of a package, or a page edited or deleted makes the report
write everything anew. Where no digest of the code can be taken or the cache folder cannot be read
or written, every report writes everything.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import sys
from pathlib import Path
from typing import Any

from suite import paths
from suite.record.results import ReadFile
from suite.report.figures import Wrote
from suite.safe import bounded

MAX_ENTRY_BYTES = bounded.MiB  # the files of one report folder: a few per scenario
MAX_WRITTEN_BYTES = 256 * bounded.MiB  # a report.json of many thousands of runs is tens of MB
# Whose versions change what a report writes: numbers and tables, exports, plots and their PNG.
PACKAGES = ("numpy", "tabulate", "orjson", "pyyaml", "matplotlib", "pillow")


def inputs_digest(read: list[ReadFile], results_dir: Path, out_dir: Path, options: dict[str, Any]) -> str | None:
    """The sha256 of what a report into ``out_dir`` is made from; None where the code has none."""
    code = paths.code_digest()
    if code is None:
        return None
    made_by = {
        "code": code,
        "checkout": str(paths.CHECKOUT),  # where the pages' links into docs/ point from
        "python": sys.version,
        "packages": _versions(),
        "options": options,
        "results": [os.fsdecode(results_dir), os.path.realpath(results_dir)],
        "out": [os.fsdecode(out_dir), os.path.realpath(out_dir)],
    }
    digest = hashlib.sha256(json.dumps(made_by, sort_keys=True, ensure_ascii=True).encode())
    for f in read:  # each path lies under results_dir, as given above
        digest.update(b"\0" + os.fsencode(f.path) + b"\0" + f.sha256.encode())
    return digest.hexdigest()


class Written:
    """What ``suite report`` last wrote into ``out_dir``, and from inputs of which digest."""

    def __init__(self, out_dir: Path, results_dir: Path) -> None:
        self.out_dir = out_dir
        cache, here = paths.cache_dir(), os.path.realpath(out_dir)
        name = hashlib.sha256(os.fsencode(here)).hexdigest()[:32]
        self.path = cache / "written-reports" / f"{name}.json" if cache is not None else None
        if self.path is not None and any(
            Path(os.path.realpath(self.path)).is_relative_to(os.path.realpath(d)) for d in (results_dir, out_dir)
        ):
            self.path = None  # a cache inside the results folder would be read as a result; in the report, shown

    def unchanged(self, inputs: str | None) -> list[Path] | None:
        """The files of ``out_dir`` as the last report wrote them from inputs of digest ``inputs``, in
        the order it wrote them; None where that report had other inputs or any of them has changed."""
        if self.path is None or inputs is None:
            return None
        try:
            entry = json.loads(bounded.read_bytes(self.path, MAX_ENTRY_BYTES))
        except (OSError, ValueError, RecursionError):
            return None
        files = entry.get("files") if isinstance(entry, dict) and entry.get("inputs") == inputs else None
        if not isinstance(files, list) or not files:
            return None
        kept = []
        for item in files:
            if not (isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item)):
                return None
            name, sha = item
            if name in ("", ".", "..") or "/" in name or "\0" in name:  # a file of out_dir itself, by its name
                return None
            if _sha256(self.out_dir / name) != sha:
                return None
            kept.append(self.out_dir / name)
        return kept

    def save(self, inputs: str | None, written: list[Wrote]) -> None:
        """Keep ``written`` (files of ``out_dir``, with the sha256 of the bytes this report wrote
        there), made from inputs of digest ``inputs``, as the folder's entry."""
        if self.path is None:
            return
        with contextlib.suppress(OSError):
            self.path.unlink(missing_ok=True)  # the last report's entry goes whatever happens next
            if inputs is not None and all(w.path.parent == self.out_dir for w in written):
                entry = {"inputs": inputs, "files": [[w.path.name, w.sha256] for w in written]}
                paths.keep(self.path, json.dumps(entry, separators=(",", ":")).encode())


def _versions() -> dict[str, str]:
    versions = {}
    for package in PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[package] = importlib.metadata.version(package)
    return versions


def _sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(bounded.read_bytes(path, MAX_WRITTEN_BYTES)).hexdigest()
    except OSError:
        return None
