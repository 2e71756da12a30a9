"""Where a result came from: the suite's code, the packages that ran it, the image it ran in.

Every result record carries a ``provenance`` section (``suite.record.results`` documents it)::

    {"suite": {"version", "git_revision", "git_dirty", "dirty_paths", "diff_sha256"},
     "environment": {"kind": "venv" | "image", "lock_file", "lock_sha256", "matches_lock", "lock_differences"},
     "image": None | {"name", "id", "digest", "recipe_hash", "context_hash",
               "base_source", "base_name", "base_digest", "base_id"}}

``suite_identity`` asks git about this checkout; ``venv_environment`` reads the lock marker
``requirements/ensure_venv.sh`` leaves in a venv and checks the interpreter's installed
distributions against that lock; ``image_provenance`` reads what a Docker run recorded of its
image; ``describe_differences`` says in words how two provenance sections differ. Nothing here
raises for a missing git, a folder that is not a checkout, or a venv made without a lock: those
are nulls and sentences, never a failed run.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from suite import paths
from suite.environment import locks
from suite.safe.markdown import code as markdown_code

LOCK_MARKER = locks.LOCK_RECORD  # written into a venv by requirements/ensure_venv.sh after a locked install
NO_LOCK = "not installed from a lock"
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
# A section's key for the suite block at the end of a local run whose checkout changed while it ran
# (``RunSkeleton.stamp``); the "suite" block is the checkout at its launch.
CHANGED_DURING_RUN = "suite_changed_during_run"
SHORT = 12  # hex digits shown of a revision or a hash
GIT_TIMEOUT_S = 30
ASK_TIMEOUT_S = 120  # another interpreter listing its distributions

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


# -- the environment of a local run ---------------------------------------------------------------


def venv_environment(python: str, *, in_subprocess: bool = False) -> dict[str, Any]:
    """The "environment" block for the interpreter that runs a local worker.

    The lock is the one the venv of ``python`` was installed from (its LOCK_MARKER); ``matches_lock``
    says whether that interpreter's installed distributions equal the lock's pins. For this
    process's own interpreter that is read here; for another one (``LocalBackend(python=...)``) the
    same function runs in it once, through ``python -c`` (the worker imports the suite from this
    checkout the same way), so the answer is always that interpreter's own and never this one's.
    ``in_subprocess``: ask that way even for this interpreter, whose own ``sys.path`` may hold what
    a worker's does not (a Ray task's process has Ray's vendored packages on it).
    """
    if _same_interpreter(python) and not in_subprocess:
        return environment_here()
    code = "import json; from suite.record import provenance; print(json.dumps(provenance.environment_here()))"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(paths.IMPORT_ROOT), os.environ.get("PYTHONPATH")])),
    }
    try:
        # In a folder of its own, removed after: whatever the interpreter writes where it stands (a
        # wrapper script may write files) stays out of the checkout.
        with tempfile.TemporaryDirectory(prefix="suite-ask-") as cwd:
            proc = subprocess.run(
                [python, "-c", code],
                capture_output=True,
                text=True,
                timeout=ASK_TIMEOUT_S,
                check=False,
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
            )
        if proc.returncode != 0:
            raise RuntimeError((proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1])
        block = json.loads(proc.stdout.strip().splitlines()[-1])
        if not isinstance(block, dict):
            raise ValueError("not a JSON object")
        return block
    except (OSError, subprocess.SubprocessError, RuntimeError, ValueError, IndexError) as exc:
        return _environment("venv", None, None, None, [f"could not ask {python} for its packages: {exc}"])


def _same_interpreter(python: str) -> bool:
    """``python`` is this process's interpreter, by path (not resolving links: every venv's python
    links to one base interpreter, yet each venv has its own packages)."""
    found = shutil.which(python) or python
    return os.path.abspath(found) == os.path.abspath(sys.executable)


def environment_here() -> dict[str, Any]:
    """The "environment" block of the running interpreter: the lock of its venv (``sys.prefix``)."""
    prefix = sys.prefix
    try:
        marker = locks.venv_lock(prefix)
    except ValueError as exc:  # names the file
        return _environment("venv", None, None, None, [str(exc)])
    except OSError as exc:
        return _environment("venv", None, None, None, [f"{Path(prefix) / LOCK_MARKER}: unreadable ({exc})"])
    if marker is None:
        return _environment("venv", None, None, None, [f"{NO_LOCK} (no {LOCK_MARKER} in {prefix})"])
    lock_file, lock_sha = marker.get("lock_file"), marker.get("lock_sha256")
    if lock_file is None and lock_sha is None:  # what ensure_venv records under SUITE_UNLOCKED=1
        why = f"{NO_LOCK} (installed unlocked, SUITE_UNLOCKED=1: {Path(prefix) / LOCK_MARKER} names no lock)"
        return _environment("venv", None, None, None, [why])
    if not isinstance(lock_file, str) or not isinstance(lock_sha, str):
        why = f"{Path(prefix) / LOCK_MARKER}: keys lock_file and lock_sha256 must be strings"
        return _environment("venv", None, None, None, [why])
    path = Path(lock_file) if Path(lock_file).is_absolute() else paths.DATA_DIR / lock_file
    if not path.is_file() and not Path(lock_file).is_absolute():
        # The lock path is relative to the checkout the venv was made in, which holds the venv; this
        # code may be a copy elsewhere (a Ray node runs the job's shipped copy of the suite).
        path = Path(prefix).parent / lock_file
    try:
        now = locks.lock_sha256(path)
    except OSError as exc:
        return _environment("venv", lock_file, lock_sha, None, [f"{lock_file} cannot be read to compare ({exc})"])
    if now != lock_sha:
        why = (
            f"{lock_file} changed since this venv was installed from it (sha256 {lock_sha[:SHORT]} then, "
            f"{now[:SHORT]} now): the installed packages cannot be checked against the lock they came from"
        )
        return _environment("venv", lock_file, lock_sha, None, [why])
    try:
        pins = locks.read_pins(path)
    except (OSError, ValueError) as exc:
        return _environment("venv", lock_file, lock_sha, None, [f"{lock_file} cannot be read as a lock ({exc})"])
    differences = locks.installed_differences(pins)
    return _environment("venv", lock_file, lock_sha, not differences, differences)


def _environment(
    kind: str, lock_file: str | None, lock_sha256: str | None, matches: bool | None, differences: list[str]
) -> dict[str, Any]:
    return {
        "kind": kind,
        "lock_file": lock_file,
        "lock_sha256": lock_sha256,
        "matches_lock": matches,
        "lock_differences": list(differences),
    }


def no_lock_reason(differences: list[str]) -> str:
    """Why an environment has no lock, without the words "not installed from a lock" a report's
    "not from a lock" already says: "no .suite-lock.json in /x/.venv"."""
    reasons = []
    for line in differences:
        rest = line.removeprefix(NO_LOCK).strip()
        reasons.append(rest[1:-1] if rest.startswith("(") and rest.endswith(")") else rest or line)
    return "; ".join(reasons)


# -- the image of a Docker run --------------------------------------------------------------------


def image_provenance(run: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(environment, image) blocks from what a Docker run recorded of its image (``images.image_record``).

    The image's lock is given by its ``suite.lock.file`` label (relative to docker/; the block
    names it from the repository root, as a venv's lock is named) and ``suite.lock.sha256``.
    ``matches_lock`` is null: nothing is listed at run time. The image's packages were installed
    from its lock with ``--require-hashes`` when it was built, and the build checked every pin is
    installed at its version (docker/Dockerfile); the image ID names those bytes, which cannot
    change after. A run that never got an image (no engine, no such image, a skip) has image null.
    Images built before these labels existed have nulls where the labels are missing.
    """
    labels = run.get("image_labels") or {}

    def fact(key: str, label: str) -> str | None:
        value = run.get(key) or labels.get(label)
        return str(value) if value else None

    image_id = run.get("image_id")
    lock_label = fact("lock_file", "suite.lock.file")
    lock_file = f"docker/{lock_label}" if lock_label and not lock_label.startswith("docker/") else lock_label
    lock_sha = fact("lock_sha256", "suite.lock.sha256")
    if not image_id:
        return _environment("image", None, None, None, []), None
    differences = [] if lock_sha else ["image built without a lock: it has no suite.lock.sha256 label"]
    digests = [str(d) for d in run.get("repo_digests") or []]
    image = {
        "name": labels.get("suite.image") or run.get("image"),
        "id": str(image_id),
        "digest": digests[0] if digests else None,
        "recipe_hash": fact("recipe_hash", "suite.recipe_hash"),
        "context_hash": fact("context_hash", "suite.context_hash"),
        **base_of(run),
    }
    return _environment("image", lock_file, lock_sha, None, differences), image


BASE_KEYS = ("base_source", "base_name", "base_digest", "base_id")


def base_of(run: dict[str, Any]) -> dict[str, str | None]:
    """The image's base as its labels recorded it (``images.image_record``; ``image_catalog`` sets them).

    ``base_source``: "registry" (pulled by digest) or "debian" (made on the build machine from
    Debian packages, ``suite.environment.debian_base``); null for a base given as a build override or an image
    built before the label existed. ``base_name``: the OCI ``base.name`` label (the registry
    reference or the local tag), else ``suite.base.ref``. ``base_digest``: the registry digest, null
    for a base only the build machine had. ``base_id``: the base's image ID on the build machine.
    The same recipe (``recipe_hash``) built on two bases is two images: another base is other
    OS libraries and another Python build.
    """
    labels = run.get("image_labels") or {}
    oci = run.get("oci_labels") or {}

    def value(*candidates: Any) -> str | None:
        return next((str(c) for c in candidates if c), None)

    return {
        "base_source": value(labels.get("suite.base.source")),
        "base_name": value(
            oci.get("org.opencontainers.image.base.name"), run.get("base_ref"), labels.get("suite.base.ref")
        ),
        "base_digest": value(
            run.get("base_digest"), labels.get("suite.base.digest"), oci.get("org.opencontainers.image.base.digest")
        ),
        "base_id": value(run.get("base_id"), labels.get("suite.base.id")),
    }


def of_result(section: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """A result's provenance as reports read it: its own section; for a record made before results
    carried one, what its recorded image facts still say (a Docker run's image and lock labels),
    with the suite block and a venv's lock empty: not recorded."""
    if section:
        image = section.get("image")
        if image and not any(k in image for k in BASE_KEYS):  # recorded before the block named its base
            return {**section, "image": {**image, **base_of(run)}}
        return section
    if run.get("image_id"):
        environment, image = image_provenance(run)
        return provenance_of({}, environment, image)
    return provenance_of({}, {}, None)


# -- in words -------------------------------------------------------------------------------------


def short(value: Any) -> str:
    """A revision, hash or image ID as shown: its first SHORT hex digits (an ID without ``sha256:``)."""
    if not value:
        return "none"
    return str(value).removeprefix("sha256:")[:SHORT]


def suite_text(suite: dict[str, Any] | None, *, markdown: bool = False, paths: int = 0) -> str:
    """ "1a2b3c4d5e6f", with "+ uncommitted changes (N files, diff sha256 ...)" for a dirty tree.

    ``paths``: how many of the dirty paths to name after the count ("2 files: suite/x.py, README.md"),
    so a reader can tell a README edit from a code change; an untracked file reads "suite/x.py
    (untracked)". ``markdown``: revision, hash and paths as code spans (``suite.safe.markdown.code``:
    a path is user text) for a report; plain text otherwise (a terminal, a table cell).
    """
    if not suite:
        return "not recorded"
    revision = suite.get("git_revision")
    if not revision:
        return "unknown (not a git checkout, or git missing)"
    as_code = markdown_code if markdown else str
    text = as_code(short(revision))
    if suite.get("git_dirty"):
        listed = list(suite.get("dirty_paths") or [])
        n = len(listed)
        more = "+" if n >= MAX_DIRTY_PATHS else ""
        files = f"{n}{more} file{'s' if n != 1 else ''}"
        if paths > 0 and listed:
            named = ", ".join(_path_text(p, as_code) for p in listed[:paths])
            files += f": {named}" + (f" and {n - paths}{more} more" if n > paths else "")
        diff = suite.get("diff_sha256")
        sep = "; " if paths > 0 and listed else ", "
        text += f" + uncommitted changes ({files}" + (f"{sep}diff sha256 {as_code(short(diff))})" if diff else ")")
    elif suite.get("git_dirty") is None:
        text += " (whether the tree had uncommitted changes is unknown)"
    return text


def _path_text(path: str, as_code: Any) -> str:
    if path.endswith(UNTRACKED):
        return f"{as_code(path.removesuffix(UNTRACKED))}{UNTRACKED}"
    return str(as_code(path))


def changed_during_run_text(section: dict[str, Any], *, markdown: bool = False) -> str | None:
    """The checkout at the end of a local run whose checkout changed while it ran (CHANGED_DURING_RUN),
    as ``suite_text`` says it with up to 5 paths; None when it did not change (or was not checked)."""
    at_end = section.get(CHANGED_DURING_RUN)
    return suite_text(at_end, markdown=markdown, paths=5) if at_end else None


def lock_text(environment: dict[str, Any] | None) -> str:
    """ "requirements/locks/run-py3.11.txt ab12cd34ef56", or why there is no lock."""
    if not environment:
        return "not recorded"
    if environment.get("lock_file") and environment.get("lock_sha256"):
        return f"{environment['lock_file']} {short(environment['lock_sha256'])}"
    return "not from a lock"


def _tree_text(suite: dict[str, Any]) -> str:
    if suite.get("git_dirty") is None:
        return "unknown"
    if not suite.get("git_dirty"):
        return "clean"
    paths = list(suite.get("dirty_paths") or [])
    shown = ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
    diff = suite.get("diff_sha256")
    return f"uncommitted changes ({shown}" + (f"; diff sha256 {short(diff)})" if diff else ")")


def describe_differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """What differs between a result's provenance and another (here: what would run now), in words.

    Empty when code, lock and image are the same: two revisions whose committed code outside the
    output folders is the same (``code_tree``) count as one. A block one side lacks (a record made before
    provenance was recorded) is said once, not compared field by field.
    """
    lines: list[str] = []
    rs, cs = recorded.get("suite") or {}, current.get("suite") or {}
    if not rs or not cs:
        if rs != cs:
            lines.append(f"suite revision: result {suite_text(rs)}, here {suite_text(cs)}")
    else:
        rr, cr = rs.get("git_revision"), cs.get("git_revision")
        same_code = rs.get("code_tree") is not None and rs.get("code_tree") == cs.get("code_tree")
        if rr != cr and not same_code:  # a commit that only published outputs is the same code
            lines.append(
                f"suite revision: result {short(rr) if rr else 'unknown'}, here {short(cr) if cr else 'unknown'}"
            )
        same_tree = rs.get("git_dirty") == cs.get("git_dirty") and rs.get("diff_sha256") == cs.get("diff_sha256")
        if not same_tree:
            rt, ct = _tree_text(rs), _tree_text(cs)
            if rs.get("git_dirty") and cs.get("git_dirty"):
                ct = "other " + ct
            verb = {True: "had ", False: "was ", None: "was "}[rs.get("git_dirty")]
            lines.append(f"suite tree: the result's {verb}{rt}, here {ct}")
    lines += _environment_differences(recorded.get("environment") or {}, current.get("environment") or {})
    lines += _image_differences(recorded.get("image"), current.get("image"))
    return lines


def _environment_differences(re_: dict[str, Any], ce: dict[str, Any]) -> list[str]:
    if not re_ or not ce:
        return [] if re_ == ce else [f"environment lock: result {lock_text(re_)}, here {lock_text(ce)}"]
    lines = []
    if re_.get("kind") != ce.get("kind"):
        lines.append(f"environment: result {re_.get('kind')}, here {ce.get('kind')}")
    if (re_.get("lock_file"), re_.get("lock_sha256")) != (ce.get("lock_file"), ce.get("lock_sha256")):
        lines.append(f"environment lock: result {lock_text(re_)}, here {lock_text(ce)}")
    said = {
        "result": "installed packages of the result differed from its lock",
        "here": "installed packages here differ from the lock",
    }
    same_drift = (
        re_.get("matches_lock") is False
        and ce.get("matches_lock") is False
        and re_.get("lock_differences") == ce.get("lock_differences")
    )
    for who, env in (("result", re_), ("here", ce)):
        if env.get("matches_lock") is False and not same_drift:
            lines.append(f"{said[who]}: {'; '.join(env.get('lock_differences') or [])}")
    return lines


def _image_differences(ri: dict[str, Any] | None, ci: dict[str, Any] | None) -> list[str]:
    if not ri and not ci:
        return []
    if not ri or not ci:
        return [f"image: result {_image_text(ri)}, here {_image_text(ci)}"]
    lines = []
    rr, cr = ri.get("recipe_hash"), ci.get("recipe_hash")
    if rr != cr:
        lines.append(f"image recipe: result {short(rr) if rr else 'not recorded'}, here {short(cr) if cr else 'none'}")
    if ri.get("id") != ci.get("id"):
        same = " (the same recipe: built again)" if rr and rr == cr and ri.get("id") and ci.get("id") else ""
        lines.append(f"image ID: result {short(ri.get('id'))}, here {short(ci.get('id'))}{same}")
    if _base_known(ri) and _base_known(ci) and _base_key(ri) != _base_key(ci):
        lines.append(f"{BASE_DIFFERS}result {base_text(ri)}, here {base_text(ci)}")
    return lines


BASE_DIFFERS = "image base: "  # the line ``describe_differences`` gives when two images' bases differ


def _base_known(image: dict[str, Any]) -> bool:
    return bool(image.get("base_id") or image.get("base_digest"))


def _base_key(image: dict[str, Any]) -> tuple[Any, ...]:
    """What makes two bases the same: the registry digest when both have one, the image ID on the
    build machine otherwise (a pulled base has the same ID everywhere; a Debian-made base is its
    own build, whose ID differs from any other's)."""
    return (image.get("base_source"), image.get("base_digest") or None, image.get("base_id") or None)


def base_text(image: dict[str, Any] | None, *, markdown: bool = False) -> str:
    """An image's base in words: "registry docker.io/library/python:3.11-slim@sha256:... (ID ...)",
    "Debian packages, made on the build machine: suite-base:... (ID ...)", or "not recorded"."""
    if not image or not (_base_known(image) or image.get("base_name")):
        return "not recorded"
    as_code = markdown_code if markdown else str
    name, digest, base_id = image.get("base_name"), image.get("base_digest"), image.get("base_id")
    ref = str(name or "?")
    if digest and "@" not in ref:
        ref += f"@{digest}"
    source = image.get("base_source")
    lead = {"registry": "registry ", "debian": "Debian packages, made on the build machine: "}.get(str(source), "")
    notes = [f"ID {as_code(short(base_id))}"] if base_id else []
    if not source:
        notes.append("how it was obtained is not recorded")
    return lead + as_code(ref) + (f" ({'; '.join(notes)})" if notes else "")


def digest_text(image: dict[str, Any], run: dict[str, Any]) -> str:
    """The image's registry digest, "none (built locally, not pushed)" when the engine knew none
    (RepoDigests empty), "not recorded" for a record made before runs recorded the digests."""
    if image.get("digest"):
        return str(image["digest"])
    return "none (built locally, not pushed)" if "repo_digests" in run else "not recorded"


def _image_text(image: dict[str, Any] | None) -> str:
    if not image:
        return "none"
    return f"{image.get('name') or '?'} (ID {short(image.get('id'))})"


def provenance_of(suite: dict[str, Any], environment: dict[str, Any], image: dict[str, Any] | None) -> dict[str, Any]:
    """The section a result record carries."""
    return {"suite": suite, "environment": environment, "image": image}
