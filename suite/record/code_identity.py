"""Which code ran: this checkout's git revision, whether it was modified, and a hash of the
modification, asked of git once per state of the checkout.

``suite_identity`` asks git about a checkout; ``current_suite_identity`` answers from a cache until
a tracked file, a file under CODE_DIRS, HEAD, a ref or the index changes. Nothing here raises for a
missing git or a folder that is not a checkout: those are nulls, never a failed run.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

from suite import paths

MAX_DIRTY_PATHS = 50
# The folders, relative to the checkout's top, whose untracked files are code a run can import.
CODE_DIRS = ("suite",)
# The folders, relative to the checkout's top, that hold what the suite writes: `report` rewrites
# the tracked pages there, `run` adds results, and publishing is committing them. Their content
# cannot change a measurement, so it is output, not code: a changed page neither makes the tree
# "modified" nor a commit that only publishes pages another code (``code_tree``). Counting them
# would make every result taken after the first report look like it ran uncommitted code, and
# ``reproduce`` refuse a user's own results.
OUTPUT_DIRS = ("reports",)
# The pathspec of everything but OUTPUT_DIRS, for git status and git diff, with the variables that
# keep its magic working whatever the caller's environment (GIT_LITERAL_PATHSPECS would read
# ":(top,exclude)reports" as a file name; the index copy sets it for the paths it names itself).
CODE_PATHSPEC = (":(top)", *(f":(top,exclude){d}" for d in OUTPUT_DIRS))
PATHSPEC_ENV = {"GIT_LITERAL_PATHSPECS": "0", "GIT_ICASE_PATHSPECS": "0"}
UNTRACKED = " (untracked)"  # after an untracked file's path in ``dirty_paths``
GIT_TIMEOUT_S = 30

# ``git diff HEAD`` with every diff option that user or system configuration could change stated,
# so the hash depends on HEAD and the tree's content, not on who runs git: the same changes to the
# same commit give the same hash, and two different modified trees give different ones (--binary:
# binary files too). --full-index: the "index" lines name whole object IDs; abbreviated ones are as
# long as core.abbrev and the repository's object count make them, so they differ between clones.
# The prefixes stated override diff.noprefix, diff.mnemonicPrefix and diff.srcPrefix/dstPrefix;
# --unified and --inter-hunk-context override diff.context and diff.interHunkContext; --submodule
# and --ignore-submodules override diff.submodule and diff.ignoreSubmodules. The personal attributes
# file (core.attributesFile) and the system one (GIT_ATTR_NOSYSTEM in ``_git``) are not read: an
# attribute there could name a diff driver whose hunk headers or binary handling differ; the tracked
# .gitattributes files still apply, as they are part of the code. Clean/smudge filters still apply,
# as they do to what git stores. Not neutralised: .git/info/attributes (git has no switch for it)
# and core.fileMode / core.autocrlf, which say how this clone's file system stores files.
DIFF_ARGS = (
    "-c",
    "diff.suppressBlankEmpty=false",
    "-c",
    "core.quotePath=true",
    "-c",
    "core.attributesFile=/dev/null",
    "diff",
    "--no-color",
    "--no-ext-diff",
    "--no-textconv",
    "--binary",
    "--full-index",
    "--no-renames",
    "--no-relative",
    "--diff-algorithm=myers",
    "--indent-heuristic",
    "--unified=3",
    "--inter-hunk-context=0",
    "--submodule=short",
    "--ignore-submodules=none",
    "--src-prefix=a/",
    "--dst-prefix=b/",
    "-O/dev/null",  # no diff.orderFile
    "HEAD",
    "--",
    *CODE_PATHSPEC,
)
# Untracked files under CODE_DIRS that the tracked .gitignore files do not ignore. Only the
# per-directory .gitignore files count: --exclude-standard would also honour .git/info/exclude and
# the user's core.excludesFile, so a personal ignore pattern could hide an untracked module a run
# imports. (An untracked .gitignore in the tree is read too: git cannot tell it from a tracked one
# here; under suite/ it is itself listed as untracked unless it ignores itself.)
UNTRACKED_ARGS = (
    "-c",
    "core.excludesFile=/dev/null",
    "ls-files",
    "-z",
    "--others",
    "--exclude-per-directory=.gitignore",
)


# -- the suite's code -----------------------------------------------------------------------------


def suite_identity(root: Path = paths.IMPORT_ROOT) -> dict[str, Any]:
    """The "suite" block for the checkout at ``root`` now: version, HEAD, and the files that differ.

    ``git_revision`` is null when git is missing, ``root`` is not the top of a git checkout (a copy
    unpacked inside some other repository would otherwise report that repository's HEAD), or the
    checkout has no commit; ``git_dirty`` then is null too.

    ``dirty_paths``, sorted, at most MAX_DIRTY_PATHS: every tracked file that differs from HEAD,
    staged or not, anywhere in the checkout but the output folders (OUTPUT_DIRS: ``reports/``; a
    README edit is named too, so a reader can tell it from a code change), and every untracked, not
    ignored file under CODE_DIRS (``suite/``), named ``"suite/x.py (untracked)"``. Untracked files
    under ``suite/`` are code a run can import: a local worker imports the package from this
    checkout, and the Docker backend ships every ``suite/**/*.py`` into its containers, tracked or
    not. Untracked files elsewhere (results under ``reports/``, scratch files) cannot change what a
    run does and do not make the tree dirty.
    ``git_dirty`` is true when that list is not empty. Which untracked files are ignored is
    decided by the tracked ``.gitignore`` files alone (UNTRACKED_ARGS), never by a personal
    ignore file. A tracked file marked assume-unchanged or skip-worktree is compared by content
    like any other (``_hidden_from_git``): git itself would not look at it.

    ``diff_sha256`` (null when clean): sha256 of what ``git diff --full-index HEAD`` (DIFF_ARGS, the
    same bytes whatever the user's or system's git configuration) prints when every
    untracked file of ``dirty_paths`` has been marked with ``git add --intent-to-add`` (in a copy of
    the index: the checkout's own index is not touched): the diff of the tracked changes, with each
    such file as a "new file" diff of its full content. It thus covers the content of every
    modified tracked file, and the path and content of every untracked file under ``suite/``; with
    no untracked file there it is exactly the hash of ``git diff --full-index HEAD -- . ':!reports'``.

    ``code_tree`` (null without a commit): sha256 of HEAD's top-level tree listing (``git ls-tree
    -z HEAD``) less the entries of OUTPUT_DIRS. The listing names each folder's tree object, so it
    covers the content of every committed file outside the outputs: two revisions with the same
    ``code_tree`` ran the same committed code, as when one commit only published pages and results.
    """
    return _identity(root, _git_dirs(root))


def _identity(root: Path, dirs: _GitDirs | None) -> dict[str, Any]:
    block: dict[str, Any] = {
        "version": _version(root),
        "git_revision": None,
        "git_dirty": None,
        "dirty_paths": [],
        "diff_sha256": None,
        "code_tree": None,
    }
    if dirs is None:
        return block
    block["git_revision"] = dirs.revision
    block["code_tree"] = _code_tree(root, dirs.revision)
    untracked = _git(root, *UNTRACKED_ARGS, "--", *CODE_DIRS)
    tagged = _git(root, "ls-files", "-z", "-v")
    if untracked is None or tagged is None:
        return block
    new_files = sorted(p for p in untracked.decode("utf-8", errors="replace").split("\0") if p)
    hidden = _hidden_from_git(root, tagged)
    with tempfile.TemporaryDirectory(prefix="suite-index-") as tmp:
        env: dict[str, str] | None = None
        if hidden or new_files:
            env = _index_copy(root, dirs, Path(tmp) / "index", hidden)
            if env is None:
                return block
        code_env = {**(env or {}), **PATHSPEC_ENV}
        status = _git(root, "status", "--porcelain", "-z", "--untracked-files=no", "--", *CODE_PATHSPEC, env=code_env)
        if status is None:
            return block
        paths = sorted([*_porcelain_paths(status), *(f"{p}{UNTRACKED}" for p in new_files)])
        block["git_dirty"] = bool(paths)
        block["dirty_paths"] = paths[:MAX_DIRTY_PATHS]
        if paths:
            # --force: a personal ignore file that matches one of them must not make git refuse it.
            if new_files and _git(root, "add", "--force", "--intent-to-add", "--", *new_files, env=env) is None:
                return block
            diff = _git(root, *DIFF_ARGS, env=code_env)
            block["diff_sha256"] = hashlib.sha256(diff).hexdigest() if diff is not None else None
    return block


def _code_tree(root: Path, revision: str) -> str | None:
    """``code_tree`` of ``suite_identity``: the hash of the revision's top-level entries but the outputs."""
    listing = _git(root, "ls-tree", "-z", "--full-tree", revision)
    if listing is None:
        return None
    entries = [
        e for e in listing.split(b"\0") if e and e.split(b"\t", 1)[-1].decode("utf-8", "replace") not in OUTPUT_DIRS
    ]
    return hashlib.sha256(b"\0".join(entries)).hexdigest()


def _hidden_from_git(root: Path, tagged: bytes) -> list[str]:
    """Tracked files marked assume-unchanged (``git ls-files -v`` tag in lower case) or skip-worktree
    (tag "S") that are in the working tree: ``git status`` and ``git diff`` take the index's word for
    them and never look at the file, yet a run imports what is on disk. A skip-worktree file absent
    from the tree (a sparse checkout) is not code a run can import and stays as git shows it."""
    hidden = []
    for entry in tagged.decode("utf-8", errors="replace").split("\0"):
        if len(entry) < 3:
            continue
        tag, path = entry[0], entry[2:]
        if (tag.islower() or tag == "S") and (root / path).is_file():
            hidden.append(path)
    return hidden


def _index_copy(root: Path, dirs: _GitDirs, index: Path, hidden: list[str]) -> dict[str, str] | None:
    """The environment that points git at a copy of the checkout's index (written to ``index``) with
    the assume-unchanged and skip-worktree marks of ``hidden`` cleared, so status and diff compare
    those files' content too; the checkout's own index is read, never written. None when git fails."""
    try:
        shutil.copyfile(dirs.git_dir / "index", index)
    except FileNotFoundError:
        pass  # no index yet: git starts an empty one
    except OSError:
        return None
    env = {"GIT_INDEX_FILE": str(index), "GIT_LITERAL_PATHSPECS": "1"}
    for unmark in ("--no-assume-unchanged", "--no-skip-worktree") if hidden else ():
        # One mark per call: given both, update-index applies only the first to each path.
        if _git(root, "update-index", unmark, "--", *hidden, env=env) is None:
            return None
    return env


def _version(root: Path) -> str | None:
    import tomllib

    if paths.CHECKOUT is None and root == paths.IMPORT_ROOT:
        return paths.version()  # an installed package: its distribution's version
    try:
        return str(tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"])
    except (OSError, KeyError, TypeError, tomllib.TOMLDecodeError):
        return None


def _git(root: Path, *args: str, env: dict[str, str] | None = None) -> bytes | None:
    """git's stdout, or None when git is missing, fails or hangs. GIT_OPTIONAL_LOCKS=0: a status
    taken while a plan runs never rewrites the index under another git command. ``env``: variables
    added for this call."""
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "GIT_ATTR_NOSYSTEM": "1", "LC_ALL": "C", **(env or {})}
    try:
        proc = subprocess.run(
            ["git", "-C", str(root), *args],
            capture_output=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _porcelain_paths(status: bytes) -> list[str]:
    """The paths of ``git status --porcelain -z``: "XY path\\0", and for a rename "XY new\\0old\\0"."""
    entries = status.decode("utf-8", errors="replace").split("\0")
    paths, i = set(), 0
    while i < len(entries):
        entry = entries[i]
        i += 1
        if len(entry) < 4:
            continue
        paths.add(entry[3:])
        if entry[0] in "RC" or entry[1] in "RC":
            if i < len(entries) and entries[i]:
                paths.add(entries[i])  # the rename's source differs from HEAD too (it is gone)
            i += 1
    return sorted(paths)


class _GitDirs:
    """HEAD's revision and where the git files that say "HEAD or the index moved" live."""

    def __init__(self, revision: str, git_dir: Path, common_dir: Path):
        self.revision, self.git_dir, self.common_dir = revision, git_dir, common_dir


def _git_dirs(root: Path) -> _GitDirs | None:
    out = _git(root, "rev-parse", "--show-toplevel", "--absolute-git-dir", "--git-common-dir", "HEAD")
    if out is None:
        return None
    lines = out.decode("utf-8", errors="replace").splitlines()
    if len(lines) != 4 or not re.fullmatch(r"[0-9a-f]{40}([0-9a-f]{24})?", lines[3]):
        return None
    top, git_dir, common, revision = lines
    try:
        if Path(top).resolve() != root.resolve():
            return None  # root lies inside another repository: its HEAD is not this code's
    except OSError:
        return None
    return _GitDirs(revision, Path(git_dir), (root / common).resolve())


# One identity per checkout for the runs of a plan. A long plan can outlive an edit, a commit or a
# checkout: the local backend's workers import the suite from this checkout at each launch, so a
# run after an edit runs the edited code. Running git three times per run would catch that but
# costs a plan of 100 runs 300 git calls; instead the identity is kept with a signature of what git
# would look at (every tracked file's stat, every file and folder under CODE_DIRS, so an untracked
# module added or edited there is seen, HEAD, the ref it names, packed-refs, the index and
# info/exclude), taken before git was asked, and git runs again only when that signature changes. A
# plan over an unchanged tree runs git four to six times in all; an edit between two runs is caught
# before the next record.
_cache: dict[Path, tuple[Any, dict[str, Any]]] = {}
_NO_CHECKOUT = ("no git checkout",)
_cache_lock = threading.Lock()


def current_suite_identity(root: Path = paths.IMPORT_ROOT) -> dict[str, Any]:
    """``suite_identity(root)``, asking git again only when the checkout changed since the last answer."""
    with _cache_lock:
        cached = _cache.get(root)
        if cached is not None and (cached[0] == _NO_CHECKOUT or _signature(root, cached[0][0]) == cached[0]):
            return json.loads(json.dumps(cached[1]))  # a copy: records must not share mutable lists
        dirs = _git_dirs(root)
        tracked = _git(root, "ls-files", "-z") if dirs is not None else None
        signature: Any = _NO_CHECKOUT  # no git or no checkout: it does not become one during a plan
        if dirs is not None:
            files = tuple(sorted(p for p in (tracked or b"").decode("utf-8", errors="replace").split("\0") if p))
            signature = _signature(root, (files, dirs.git_dir, dirs.common_dir))
        identity = _identity(root, dirs)
        _cache[root] = (signature, identity)
        return json.loads(json.dumps(identity))


def _signature(root: Path, key: tuple[tuple[str, ...], Path, Path]) -> tuple[Any, ...]:
    """What changes when a tracked file, a file or folder under CODE_DIRS, HEAD, a ref or the index
    does (stat, not content: cheap). ``__pycache__`` folders are left out: every import writes there."""
    files, git_dir, common = key

    def stat(path: Path) -> tuple[int, int, int, int] | None:
        try:
            s = path.stat()
        except OSError:
            return None
        return (s.st_mtime_ns, s.st_ctime_ns, s.st_size, s.st_ino)

    try:
        head = (git_dir / "HEAD").read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        head = ""
    refs = [git_dir / "index", common / "packed-refs", common / "info" / "exclude"]
    if head.startswith("ref: "):
        refs.append(common / head[5:])
    code = []
    for folder in CODE_DIRS:
        for where, dirs, names in os.walk(root / folder):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            code += [(p, stat(Path(p))) for p in [where, *(os.path.join(where, n) for n in sorted(names))]]
    return (key, head, tuple(stat(p) for p in refs), tuple(stat(root / f) for f in files), tuple(code))


def clear_cache() -> None:
    """Forget cached identities (tests that change a checkout between two asks)."""
    with _cache_lock:
        _cache.clear()
