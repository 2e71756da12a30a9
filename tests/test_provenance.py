"""Provenance: the code, lock and image behind every result, checked against git, pip and real runs.

References this project did not write: git itself (HEAD, the diff whose hash is recorded), pip
(the version it reports of itself in a fresh venv), and a real worker run on the local backend.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, SCENARIOS, suite_cli
from docker_fixtures import backend_factory, engine_client, image_fixture, small_specs  # noqa: F401 - fixtures

from suite.backends.base import Exit, RunSkeleton
from suite.backends.docker import DockerBackend
from suite.backends.local import LocalBackend
from suite.record import code_identity, provenance
from suite.report import provenance_text, show
from suite.spec import plan, scenario

FIXTURES = Path(__file__).parent / "fixtures" / "results"
GIT = shutil.which("git")
needs_git = pytest.mark.skipif(GIT is None, reason="git is not installed")


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@x"
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=env).stdout.decode()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    root.mkdir()
    git(root, "init", "-q")
    (root / "pyproject.toml").write_text('[project]\nname = "x"\nversion = "9.8.7"\n')
    (root / "a.py").write_text("one = 1\n")
    (root / "b.py").write_text("two = 2\n")
    git(root, "add", "pyproject.toml", "a.py", "b.py")
    git(root, "commit", "-q", "-m", "first")
    code_identity.clear_cache()
    yield root
    code_identity.clear_cache()


def plain_diff_sha(root: Path) -> str:
    """sha256 of what a bare `git diff --full-index HEAD` prints (no configuration in the temp repository)."""
    out = subprocess.run(
        ["git", "-C", str(root), "diff", "--full-index", "HEAD"], check=True, capture_output=True
    ).stdout
    return hashlib.sha256(out).hexdigest()


@needs_git
def test_a_clean_checkout_is_its_head(repo: Path) -> None:
    block = code_identity.suite_identity(repo)
    assert block == {
        "version": "9.8.7",
        "git_revision": git(repo, "rev-parse", "HEAD").strip(),
        "git_dirty": False,
        "dirty_paths": [],
        "diff_sha256": None,
        "code_tree": block["code_tree"],
    }
    listing = subprocess.run(["git", "-C", str(repo), "ls-tree", "-z", "HEAD"], capture_output=True, check=True)
    assert block["code_tree"] == hashlib.sha256(listing.stdout.rstrip(b"\0")).hexdigest()


@needs_git
def test_modified_files_are_named_and_the_diff_hash_follows_the_content(repo: Path) -> None:
    (repo / "a.py").write_text("one = 1.5\n")
    first = code_identity.suite_identity(repo)
    assert first["git_dirty"] is True and first["dirty_paths"] == ["a.py"]
    assert first["diff_sha256"] == plain_diff_sha(repo), "the hash of git's own diff"
    (repo / "a.py").write_text("one = 'other'\n")
    second = code_identity.suite_identity(repo)
    assert second["dirty_paths"] == ["a.py"] and second["diff_sha256"] != first["diff_sha256"]
    (repo / "a.py").write_text("one = 1.5\n")
    assert code_identity.suite_identity(repo)["diff_sha256"] == first["diff_sha256"], "same tree, same hash"
    git(repo, "add", "a.py")  # staged changes differ from HEAD as well
    assert code_identity.suite_identity(repo)["diff_sha256"] == first["diff_sha256"]
    (repo / "untracked.py").write_text("x = 1\n")
    assert code_identity.suite_identity(repo)["dirty_paths"] == ["a.py"], "untracked files are not the suite's code"
    git(repo, "mv", "b.py", "c.py")
    assert code_identity.suite_identity(repo)["dirty_paths"] == ["a.py", "b.py", "c.py"]


def config_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **settings: str) -> None:
    """Git configuration for every git this process starts, as a user's would be: ``settings``
    through GIT_CONFIG_KEY_n/VALUE_n, and an empty global file of its own."""
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "empty-gitconfig"))
    monkeypatch.setenv("GIT_CONFIG_COUNT", str(len(settings)))
    for n, (key, value) in enumerate(settings.items()):
        monkeypatch.setenv(f"GIT_CONFIG_KEY_{n}", key.replace("__", "."))
        monkeypatch.setenv(f"GIT_CONFIG_VALUE_{n}", value)


@needs_git
def test_the_diff_hash_does_not_depend_on_the_users_git_configuration(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two hunks 4 lines apart (one hunk under a larger diff.interHunkContext), a rename, a binary file.
    (repo / "a.py").write_text("".join(f"line{i} = {i}\n" for i in range(30)))
    git(repo, "add", "a.py")
    git(repo, "commit", "-q", "-m", "long")
    lines = [f"line{i} = {i}\n" for i in range(30)]
    lines[5], lines[14] = "line5 = 'five'\n", "\n"
    (repo / "a.py").write_text("".join(lines))
    git(repo, "mv", "b.py", "b2.py")
    (repo / "blob.bin").write_bytes(bytes(range(256)))
    git(repo, "add", "blob.bin")
    (repo / "suite").mkdir()
    (repo / "suite" / "new_mod.py").write_text("Y = 1\n")
    config_env(monkeypatch, tmp_path)
    reference = code_identity.suite_identity(repo)["diff_sha256"]
    assert reference is not None
    # Under git's defaults the hash is git's own full-index diff (the new module marked --intent-to-add;
    # renames as a deletion and an addition, the binary file's content in full).
    assert reference == intent_to_add_diff_sha(repo, "suite/new_mod.py", options=("--no-renames", "--binary"))
    attributes = tmp_path / "attributes"
    attributes.write_text("*.py diff=python\n*.bin -binary diff\n")
    personal = {
        "core__abbrev": "12",
        "diff__noprefix": "true",
        "diff__mnemonicPrefix": "true",
        "diff__renames": "copies",
        "diff__algorithm": "histogram",
        "diff__indentHeuristic": "false",
        "diff__context": "8",
        "diff__interHunkContext": "10",
        "diff__suppressBlankEmpty": "true",
        "diff__submodule": "log",
        "diff__relative": "true",
        "color__diff": "always",
        "color__ui": "always",
        "core__quotePath": "false",
        "core__attributesFile": str(attributes),
    }
    for key, value in personal.items():
        config_env(monkeypatch, tmp_path, **{key: value})
        assert code_identity.suite_identity(repo)["diff_sha256"] == reference, f"{key.replace('__', '.')}={value}"
    config_env(monkeypatch, tmp_path, **personal)
    assert code_identity.suite_identity(repo)["diff_sha256"] == reference, "all at once"


@needs_git
def test_a_personal_ignore_file_does_not_hide_an_untracked_module(
    code_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = code_repo
    (repo / "suite" / "extra_mod.py").write_text("X = 1\n")
    expected = code_identity.suite_identity(repo)
    assert expected["dirty_paths"] == ["suite/extra_mod.py (untracked)"]
    personal = tmp_path / "global-ignore"
    personal.write_text("extra_mod.py\n")
    global_config = tmp_path / "gitconfig"
    global_config.write_text(f"[core]\n\texcludesFile = {personal}\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(global_config))
    assert git(repo, "status", "--porcelain") == "", "git itself now hides the module"
    assert code_identity.suite_identity(repo) == expected
    monkeypatch.delenv("GIT_CONFIG_GLOBAL")
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "exclude").write_text("suite/extra_mod.py\n")
    assert git(repo, "status", "--porcelain") == ""
    assert code_identity.suite_identity(repo) == expected
    (repo / "suite" / "run.log").write_text("ignored by the tracked .gitignore")
    assert code_identity.suite_identity(repo) == expected


@needs_git
def test_a_file_git_is_told_not_to_look_at_is_still_compared(repo: Path) -> None:
    (repo / "a.py").write_text("one = 'edited'\n")
    expected = code_identity.suite_identity(repo)
    (repo / "b.py").write_text("two = 'edited'\n")
    both = code_identity.suite_identity(repo)
    git(repo, "update-index", "--assume-unchanged", "a.py")
    git(repo, "update-index", "--skip-worktree", "b.py")
    assert git(repo, "status", "--porcelain") == "" and git(repo, "diff", "HEAD") == "", "git no longer sees them"
    assert code_identity.suite_identity(repo) == both and both["dirty_paths"] == ["a.py", "b.py"]
    assert git(repo, "ls-files", "-v") == "h a.py\nS b.py\nH pyproject.toml\n", "the checkout's index keeps its marks"
    (repo / "b.py").write_text("two = 2\n")
    assert code_identity.suite_identity(repo) == expected


def intent_to_add_diff_sha(root: Path, *untracked: str, options: tuple[str, ...] = ()) -> str:
    """sha256 of what git prints for `git diff HEAD` once `untracked` are marked `git add -N`, in a
    copy of the index (the checkout's own stays as it is)."""
    index = root.parent / "reference-index"
    shutil.copyfile(root / ".git" / "index", index)
    env = {**os.environ, "GIT_INDEX_FILE": str(index)}
    subprocess.run(["git", "-C", str(root), "add", "-N", "--", *untracked], check=True, env=env)
    cmd = ["git", "-C", str(root), "diff", "--full-index", *options, "HEAD"]
    out = subprocess.run(cmd, check=True, capture_output=True, env=env).stdout
    index.unlink()
    return hashlib.sha256(out).hexdigest()


@pytest.fixture
def code_repo(repo: Path) -> Path:
    """The temp checkout with a tracked suite/ package whose main module imports an untracked one."""
    (repo / "suite").mkdir()
    (repo / "suite" / "__init__.py").write_text("")
    (repo / "suite" / "main.py").write_text("from suite.extra_mod import X\n")
    (repo / ".gitignore").write_text("*.log\n")
    git(repo, "add", "suite", ".gitignore")
    git(repo, "commit", "-q", "-m", "code")
    return repo


@needs_git
def test_an_untracked_module_under_suite_is_code_the_run_can_import(code_repo: Path) -> None:
    repo = code_repo
    assert code_identity.suite_identity(repo)["git_dirty"] is False
    (repo / "suite" / "extra_mod.py").write_text("X = 1\n")
    first = code_identity.suite_identity(repo)
    assert first["git_dirty"] is True and first["dirty_paths"] == ["suite/extra_mod.py (untracked)"]
    assert first["diff_sha256"] == intent_to_add_diff_sha(repo, "suite/extra_mod.py"), "git's own diff of the new file"
    (repo / "suite" / "extra_mod.py").write_text("X = 2\n")
    second = code_identity.suite_identity(repo)
    assert second["dirty_paths"] == first["dirty_paths"] and second["diff_sha256"] != first["diff_sha256"]
    assert second["diff_sha256"] == intent_to_add_diff_sha(repo, "suite/extra_mod.py")
    assert git(repo, "status", "--porcelain") == "?? suite/extra_mod.py\n", "the checkout's index is not touched"

    (repo / "a.py").write_text("one = 'tracked edit'\n")  # a tracked change anywhere, beside the new module
    both = code_identity.suite_identity(repo)
    assert both["dirty_paths"] == ["a.py", "suite/extra_mod.py (untracked)"]
    assert both["diff_sha256"] == intent_to_add_diff_sha(repo, "suite/extra_mod.py")
    (repo / "a.py").write_text("one = 1\n")

    # Results, scratch files and ignored files are not code a run imports: the tree stays as it was.
    (repo / "reports" / "results").mkdir(parents=True)
    (repo / "reports" / "results" / "r0.json").write_text("{}")
    (repo / "notes.txt").write_text("scratch")
    (repo / "suite" / "run.log").write_text("ignored")
    assert code_identity.suite_identity(repo) == second
    (repo / "suite" / "extra_mod.py").unlink()
    assert code_identity.suite_identity(repo)["git_dirty"] is False


@needs_git
def test_the_cached_identity_sees_an_untracked_module_appear_and_change(code_repo: Path) -> None:
    repo = code_repo
    clean = code_identity.current_suite_identity(repo)
    assert clean["git_dirty"] is False
    (repo / "suite" / "sub").mkdir()
    (repo / "suite" / "sub" / "extra_mod.py").write_text("X = 1\n")
    added = code_identity.current_suite_identity(repo)
    assert added["dirty_paths"] == ["suite/sub/extra_mod.py (untracked)"]
    time.sleep(0.05)  # past the file system's timestamp granularity: the edit below keeps the size
    (repo / "suite" / "sub" / "extra_mod.py").write_text("X = 2\n")
    edited = code_identity.current_suite_identity(repo)
    assert edited["diff_sha256"] != added["diff_sha256"]
    assert edited == code_identity.suite_identity(repo), "the cache answers what git answers"


@needs_git
def test_dirty_paths_stop_at_fifty(repo: Path) -> None:
    names = [f"m{i:03d}.py" for i in range(60)]
    for name in names:
        (repo / name).write_text("v = 0\n")
    git(repo, "add", *names)
    git(repo, "commit", "-q", "-m", "many")
    for name in names:
        (repo / name).write_text("v = 1\n")
    block = code_identity.suite_identity(repo)
    assert block["git_dirty"] is True and block["dirty_paths"] == names[: code_identity.MAX_DIRTY_PATHS]
    assert "50+ files" in provenance_text.suite_text(block)


def test_no_checkout_gives_nulls(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\nversion = "1.0"\n')
    block = code_identity.suite_identity(tmp_path)
    assert block == {
        "version": "1.0",
        "git_revision": None,
        "git_dirty": None,
        "dirty_paths": [],
        "diff_sha256": None,
        "code_tree": None,
    }


@needs_git
def test_a_folder_inside_another_checkout_is_not_that_checkout(repo: Path) -> None:
    inner = repo / "vendored"
    inner.mkdir()
    (inner / "code.py").write_text("x = 1\n")
    assert code_identity.suite_identity(inner)["git_revision"] is None


def test_no_git_gives_nulls(repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "no-git-here"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    block = code_identity.suite_identity(repo)
    assert block["git_revision"] is None and block["git_dirty"] is None and block["version"] == "9.8.7"
    assert code_identity.current_suite_identity(repo)["git_revision"] is None


@needs_git
def test_the_cached_identity_asks_git_again_only_when_the_checkout_changed(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every git process the suite starts, counted by a git of our own on PATH that logs and runs the real one.
    log, bin_dir = tmp_path / "git-calls.log", tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "git"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> "{log}"\nexec "{GIT}" "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    def calls() -> int:
        return len(log.read_text().splitlines()) if log.exists() else 0

    first = code_identity.current_suite_identity(repo)
    asked = calls()
    for _ in range(100):
        assert code_identity.current_suite_identity(repo) == first
    assert 0 < calls() == asked <= 6, "a plan over an unchanged tree asks git once"
    (repo / "b.py").write_text("two = 'edited mid-plan'\n")
    edited = code_identity.current_suite_identity(repo)
    assert edited["dirty_paths"] == ["b.py"] and edited["diff_sha256"] == plain_diff_sha(repo)
    git(repo, "commit", "-q", "-am", "second")
    committed = code_identity.current_suite_identity(repo)
    assert committed["git_revision"] == git(repo, "rev-parse", "HEAD").strip() != first["git_revision"]
    assert committed["git_dirty"] is False


# -- the environment of a local run -------------------------------------------------------------


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with pip (ensurepip's bundled wheel: no index needed)."""
    prefix = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", str(prefix)], check=True, capture_output=True)
    return prefix


def pip_list(prefix: Path) -> dict[str, str]:
    """What pip itself says is installed in the venv: name -> version."""
    out = subprocess.run(
        [str(prefix / "bin" / "python"), "-m", "pip", "list", "--format=json"], check=True, capture_output=True
    )
    return {d["name"].lower(): d["version"] for d in json.loads(out.stdout)}


def write_lock(prefix: Path, lock: Path, text: str, sha: str | None = None) -> None:
    lock.write_text(text)
    marker = {
        "environment": "test",
        "lock_file": str(lock),
        "lock_sha256": sha or hashlib.sha256(lock.read_bytes()).hexdigest(),
        "python": "3.11",
    }
    (prefix / provenance.LOCK_MARKER).write_text(json.dumps(marker))


def test_a_venv_without_a_lock_marker_says_so(venv: Path) -> None:
    (venv / provenance.LOCK_MARKER).unlink(missing_ok=True)
    block = provenance.venv_environment(str(venv / "bin" / "python"))
    assert block == {
        "kind": "venv",
        "lock_file": None,
        "lock_sha256": None,
        "matches_lock": None,
        "lock_differences": [f"not installed from a lock (no .suite-lock.json in {venv})"],
    }


def test_another_interpreter_is_checked_against_its_own_lock(venv: Path, tmp_path: Path) -> None:
    python = str(venv / "bin" / "python")
    # pip is the venv's installer, which a lock does not pin; what pip lists beside it is what it installed.
    listed = {n: v for n, v in pip_list(venv).items() if n != "pip"}
    assert listed, "a Python 3.11 venv holds setuptools beside pip"
    lock = tmp_path / "lock.txt"
    text = "".join(f"{n}=={v} \\\n    --hash=sha256:{'0' * 64}\n    # via -r x.in\n" for n, v in sorted(listed.items()))
    write_lock(venv, lock, text)
    block = provenance.venv_environment(python)
    assert block["matches_lock"] is True and block["lock_differences"] == [], block
    assert block["lock_file"] == str(lock) and block["lock_sha256"] == hashlib.sha256(lock.read_bytes()).hexdigest()

    name, version = sorted(listed.items())[0]
    changed = {**listed, name: "0.0.1", "not-installed-anywhere": "1.0"}
    write_lock(venv, lock, "".join(f"{n}=={v}\n" for n, v in sorted(changed.items())))
    block = provenance.venv_environment(python)
    assert block["matches_lock"] is False
    assert block["lock_differences"] == sorted(
        ["not-installed-anywhere 1.0 in the lock, not installed", f"{name} 0.0.1 in the lock, {version} installed"]
    )

    write_lock(venv, lock, text, sha="f" * 64)  # the lock changed after the install
    block = provenance.venv_environment(python)
    assert block["matches_lock"] is None and "changed since this venv was installed" in block["lock_differences"][0]

    write_lock(venv, lock, "numpy>=2\n")  # not a lock: named, not a crash
    block = provenance.venv_environment(python)
    assert block["matches_lock"] is None and "cannot be read as a lock" in block["lock_differences"][0]


def test_a_broken_marker_is_named_not_a_crash(venv: Path) -> None:
    (venv / provenance.LOCK_MARKER).write_text("{not json")
    block = provenance.venv_environment(str(venv / "bin" / "python"))
    assert block["matches_lock"] is None and str(venv / provenance.LOCK_MARKER) in block["lock_differences"][0]
    (venv / provenance.LOCK_MARKER).unlink()


def test_an_unlocked_venv_says_it_was_installed_unlocked(venv: Path) -> None:
    # What requirements/ensure_venv.sh records under SUITE_UNLOCKED=1: a record that names no lock.
    marker = {"environment": "run", "lock_file": None, "lock_sha256": None, "python": "3.13"}
    (venv / provenance.LOCK_MARKER).write_text(json.dumps(marker))
    block = provenance.venv_environment(str(venv / "bin" / "python"))
    (venv / provenance.LOCK_MARKER).unlink()
    assert block["lock_file"] is None and block["matches_lock"] is None
    assert block["lock_differences"] == [
        "not installed from a lock "
        f"(installed unlocked, SUITE_UNLOCKED=1: {venv / provenance.LOCK_MARKER} names no lock)"
    ]


def test_an_interpreter_that_cannot_be_asked_gives_the_reason(tmp_path: Path) -> None:
    block = provenance.venv_environment(str(tmp_path / "no-such-python"))
    assert block["matches_lock"] is None and "could not ask" in block["lock_differences"][0]


def test_asking_an_interpreter_leaves_nothing_in_the_checkout(tmp_path: Path) -> None:
    # A stand-in Python (as tests use) that writes a file named by its last argument where it stands.
    stub = tmp_path / "python-stub"
    stub.write_text(f"#!{sys.executable}\nimport sys\nopen(sys.argv[-1][:40], 'w').write('x')\n")
    stub.chmod(0o755)
    before = set(REPO.iterdir())
    block = provenance.venv_environment(str(stub))
    assert block["matches_lock"] is None and "could not ask" in block["lock_differences"][0]
    assert not [p for p in set(REPO.iterdir()) - before if p.name.startswith("import json")]


def test_a_wrapper_of_this_interpreter_answers_as_this_interpreter(tmp_path: Path) -> None:
    wrapper = tmp_path / "python-wrapper"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    assert provenance.venv_environment(str(wrapper)) == provenance.environment_here()


# -- the image of a Docker run -----------------------------------------------------------------


LABELS = {
    "suite.image": "tf2.21-cpu",
    "suite.context_hash": "c" * 64,
    "suite.recipe_hash": "r" * 64,
    "suite.lock.file": "locks/tf2.21-cpu.txt",
    "suite.lock.sha256": "l" * 64,
    "suite.base.source": "registry",
    "suite.base.ref": "python:3.11-slim-bookworm",
    "suite.base.digest": "sha256:" + "b" * 64,
    "suite.base.id": "sha256:" + "e" * 64,
}
OCI = {"org.opencontainers.image.base.name": "docker.io/library/python:3.11-slim-bookworm"}


def test_image_provenance_reads_the_recorded_labels() -> None:
    run = {"image": "suite-bench:tf2.21-cpu", "image_id": "sha256:" + "i" * 64, "image_labels": LABELS}
    run["oci_labels"] = OCI
    environment, image = provenance.image_provenance({**run, "repo_digests": ["suite-bench@sha256:" + "d" * 64]})
    assert environment == {
        "kind": "image",
        "lock_file": "docker/locks/tf2.21-cpu.txt",
        "lock_sha256": "l" * 64,
        "matches_lock": None,
        "lock_differences": [],
    }
    assert image == {
        "name": "tf2.21-cpu",
        "id": "sha256:" + "i" * 64,
        "digest": "suite-bench@sha256:" + "d" * 64,
        "recipe_hash": "r" * 64,
        "context_hash": "c" * 64,
        "base_source": "registry",
        "base_name": "docker.io/library/python:3.11-slim-bookworm",
        "base_digest": "sha256:" + "b" * 64,
        "base_id": "sha256:" + "e" * 64,
    }
    assert provenance_text.base_text(image) == (
        f"registry docker.io/library/python:3.11-slim-bookworm@sha256:{'b' * 64} (ID eeeeeeeeeeee)"
    )


def test_a_debian_made_base_has_an_id_and_no_registry_digest() -> None:
    labels = {**LABELS, "suite.base.source": "debian", "suite.base.ref": "suite-base:21ab", "suite.base.digest": ""}
    run = {"image_id": "sha256:" + "i" * 64, "image_labels": labels, "oci_labels": {OCI_NAME: "suite-base:21ab"}}
    _, image = provenance.image_provenance(run)
    assert image is not None
    assert {k: image[k] for k in provenance.BASE_KEYS} == {
        "base_source": "debian",
        "base_name": "suite-base:21ab",
        "base_digest": None,
        "base_id": "sha256:" + "e" * 64,
    }
    said = provenance_text.base_text(image)
    assert said == "Debian packages, made on the build machine: suite-base:21ab (ID eeeeeeeeeeee)"


OCI_NAME = "org.opencontainers.image.base.name"


def test_a_record_whose_image_block_predates_the_base_reads_it_from_the_labels() -> None:
    block = {"name": "tf2.21-cpu", "id": "sha256:" + "i" * 64, "digest": None, "recipe_hash": None}
    section = {"suite": {}, "environment": {}, "image": block}
    run = {"image_id": block["id"], "image_labels": LABELS, "oci_labels": OCI}
    image = provenance.of_result(section, run)["image"]
    assert image["base_source"] == "registry" and image["base_id"] == "sha256:" + "e" * 64
    assert section["image"] is block and "base_id" not in block, "the record itself is not changed"


def test_an_image_built_before_the_lock_labels_has_nulls() -> None:
    old = {"suite.image": "tf2.21-cpu", "suite.context_hash": "c" * 64}
    environment, image = provenance.image_provenance({"image_id": "sha256:abc", "image_labels": old})
    assert environment["lock_file"] is environment["lock_sha256"] is environment["matches_lock"] is None
    assert environment["lock_differences"] == ["image built without a lock: it has no suite.lock.sha256 label"]
    assert image is not None and image["recipe_hash"] is None and image["digest"] is None
    assert image["context_hash"] == "c" * 64


def test_a_run_that_got_no_image_has_none() -> None:
    environment, image = provenance.image_provenance({"backend": "docker"})
    assert image is None and environment["kind"] == "image" and environment["lock_file"] is None


# -- in words ----------------------------------------------------------------------------------


def section(**changes: Any) -> dict[str, Any]:
    suite = {"version": "0.1.0", "git_revision": "1a2b3c4d5e6f" + "0" * 28, "git_dirty": False}
    suite.update(dirty_paths=[], diff_sha256=None)
    environment = {"kind": "venv", "lock_file": "requirements/locks/run-py3.11.txt", "lock_sha256": "ab12" + "0" * 60}
    environment.update(matches_lock=True, lock_differences=[])
    out: dict[str, Any] = {"suite": suite, "environment": environment, "image": None}
    for key, value in changes.items():
        block, field = key.split("__")
        if block == "image":
            out["image"] = value
        else:
            out[block] = {**out[block], field: value}
    return out


def test_the_same_provenance_has_no_differences() -> None:
    assert provenance_text.describe_differences(section(), section()) == []


def test_differences_are_said_precisely() -> None:
    here = section(suite__git_revision="9f8e7d6c5b4a" + "1" * 28, environment__lock_sha256="cd34" + "1" * 60)
    assert provenance_text.describe_differences(section(), here) == [
        "suite revision: result 1a2b3c4d5e6f, here 9f8e7d6c5b4a",
        "environment lock: result requirements/locks/run-py3.11.txt ab1200000000, "
        "here requirements/locks/run-py3.11.txt cd3411111111",
    ]
    dirty = section(suite__git_dirty=True, suite__dirty_paths=["suite/x.py"], suite__diff_sha256="ab12" + "e" * 60)
    assert provenance_text.describe_differences(dirty, section()) == [
        "suite tree: the result's had uncommitted changes (suite/x.py; diff sha256 ab12eeeeeeee), here clean"
    ]
    other = section(suite__git_dirty=True, suite__dirty_paths=["suite/y.py"], suite__diff_sha256="9" * 64)
    assert provenance_text.describe_differences(dirty, other) == [
        "suite tree: the result's had uncommitted changes (suite/x.py; diff sha256 ab12eeeeeeee), "
        "here other uncommitted changes (suite/y.py; diff sha256 999999999999)"
    ]
    drifted = section(
        environment__matches_lock=False, environment__lock_differences=["numpy 2.4.6 in the lock, 2.3.0 installed"]
    )
    assert provenance_text.describe_differences(section(), drifted) == [
        "installed packages here differ from the lock: numpy 2.4.6 in the lock, 2.3.0 installed"
    ]
    assert provenance_text.describe_differences(drifted, section()) == [
        "installed packages of the result differed from its lock: numpy 2.4.6 in the lock, 2.3.0 installed"
    ]
    # The same drift on both sides is the same environment: nothing to say.
    assert provenance_text.describe_differences(drifted, drifted) == []
    other_drift = section(
        environment__matches_lock=False, environment__lock_differences=["numpy 2.4.6 in the lock, 2.2.0 installed"]
    )
    assert len(provenance_text.describe_differences(drifted, other_drift)) == 2


def test_image_differences_name_the_recipe_and_the_id() -> None:
    a = {"name": "tf2.21-cpu", "id": "sha256:" + "1" * 64, "digest": None, "recipe_hash": "ab12" + "0" * 60}
    b = {**a, "id": "sha256:" + "2" * 64, "recipe_hash": "cd34" + "0" * 60}
    assert provenance_text.describe_differences(section(image__=a), section(image__=b)) == [
        "image recipe: result ab1200000000, here cd3400000000",
        "image ID: result 111111111111, here 222222222222",
    ]
    rebuilt = {**a, "id": "sha256:" + "3" * 64}
    assert provenance_text.describe_differences(section(image__=a), section(image__=rebuilt)) == [
        "image ID: result 111111111111, here 333333333333 (the same recipe: built again)"
    ]
    assert provenance_text.describe_differences(section(image__=a), section()) == [
        "image: result tf2.21-cpu (ID 111111111111), here none"
    ]
    missing = {**a, "id": None}  # the image is not on the engine here
    assert provenance_text.describe_differences(section(image__=a), section(image__=missing)) == [
        "image ID: result 111111111111, here none"
    ]


def test_images_of_one_recipe_on_two_bases_differ_in_their_base() -> None:
    recipe = "ab12" + "0" * 60
    pulled = {"name": "tf2.21-cpu", "id": "sha256:" + "1" * 64, "digest": None, "recipe_hash": recipe}
    pulled.update(base_source="registry", base_name="docker.io/library/python:3.11-slim-bookworm")
    pulled.update(base_digest="sha256:" + "b" * 64, base_id="sha256:" + "e" * 64)
    made = {**pulled, "id": "sha256:" + "2" * 64, "base_source": "debian", "base_name": "suite-base:21ab"}
    made.update(base_digest=None, base_id="sha256:" + "f" * 64)
    lines = provenance_text.describe_differences(section(image__=pulled), section(image__=made))
    assert lines == [
        "image ID: result 111111111111, here 222222222222 (the same recipe: built again)",
        f"image base: result registry docker.io/library/python:3.11-slim-bookworm@sha256:{'b' * 64} "
        "(ID eeeeeeeeeeee), here Debian packages, made on the build machine: suite-base:21ab (ID ffffffffffff)",
    ]
    assert lines[1].startswith(provenance_text.BASE_DIFFERS)
    # Another Debian-made base of the same tag is another build: its ID tells them apart.
    again = {**made, "id": "sha256:" + "3" * 64, "base_id": "sha256:" + "9" * 64}
    differences = provenance_text.describe_differences(section(image__=made), section(image__=again))
    assert differences[1].startswith("image base: ")
    # The same base under two builds of the recipe: only the image ID differs.
    rebuilt = {**pulled, "id": "sha256:" + "4" * 64}
    assert len(provenance_text.describe_differences(section(image__=pulled), section(image__=rebuilt))) == 1
    # A side that did not record its base is not said to differ in it (the image ID line says enough).
    unknown = {**made, "base_source": None, "base_name": None, "base_id": None}
    assert len(provenance_text.describe_differences(section(image__=pulled), section(image__=unknown))) == 1


def test_a_record_without_provenance_is_said_once() -> None:
    assert provenance_text.describe_differences({}, section()) == [
        "suite revision: result not recorded, here 1a2b3c4d5e6f",
        "environment lock: result not recorded, here requirements/locks/run-py3.11.txt ab1200000000",
    ]


# -- every result of a backend carries it --------------------------------------------------------


def smoke_specs() -> list[plan.RunSpec]:
    return plan.expand(scenario.load(SCENARIOS / "mnist_mlp_width.yaml"), smoke=True)


def head() -> str:
    return git(REPO, "rev-parse", "HEAD").strip()


def assert_names_this_checkout(suite: dict[str, Any], before: str) -> None:
    """HEAD of this checkout, taken before and after (commits may land while a test runs)."""
    assert suite["git_revision"] in {before, head()}, (suite["git_revision"], before)
    assert isinstance(suite["git_dirty"], bool)
    if suite["git_dirty"]:
        assert suite["dirty_paths"] and len(suite["diff_sha256"]) == 64
    else:
        assert suite["dirty_paths"] == [] and suite["diff_sha256"] is None


@needs_git
def test_a_skipped_result_carries_provenance() -> None:
    spec = next(s for s in smoke_specs() if s.device.startswith("gpu"))
    before = head()
    result = LocalBackend(machine="test").skipped(spec, "needs 1 GPU(s); this machine has no GPU")
    assert result.status == "skipped"
    assert_names_this_checkout(result.provenance["suite"], before)
    assert result.provenance["environment"] == provenance.environment_here()
    assert result.provenance["image"] is None


@needs_git
@pytest.mark.slow
def test_a_real_local_run_carries_the_checkout_it_ran() -> None:
    spec = next(s for s in smoke_specs() if s.device == "cpu")
    before = head()
    result = LocalBackend(machine="test").run(spec)
    assert result.status == "ok", (result.message, result.log_tail)
    assert_names_this_checkout(result.provenance["suite"], before)
    assert result.provenance["environment"] == provenance.environment_here()
    assert result.provenance["image"] is None


class EndedExecution:
    """A worker that has already ended, with no output and no result file."""

    facts: dict[str, Any] = {}

    def lines(self):
        return iter(())

    def wait(self) -> Exit:
        return Exit(code=0)

    def kill(self) -> bool:
        return False

    def result(self) -> bytes | None:
        return None

    def cleanup(self) -> None:
        pass


class EditingBackend(RunSkeleton):
    """A backend over a temp checkout whose launch edits a module there: an edit made while a run runs."""

    name = "editing"

    def __init__(self, root: Path, edit: bool = True):
        self.root, self.edit = root, edit

    def run_info(self) -> dict[str, Any]:
        return {"backend": self.name}

    def suite_provenance(self) -> dict[str, Any]:
        return code_identity.current_suite_identity(self.root)

    def environment_provenance(self, run: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
        return {}, None

    def launch(self, spec: plan.RunSpec, spec_json: bytes, env: dict[str, str]) -> EndedExecution:
        if self.edit:
            (self.root / "suite" / "main.py").write_text("X = 'edited while the run ran'\n")
        return EndedExecution()


@needs_git
def test_a_run_records_the_code_at_its_launch_and_an_edit_made_while_it_ran(code_repo: Path) -> None:
    spec = smoke_specs()[0]
    clean = code_identity.suite_identity(code_repo)
    result = EditingBackend(code_repo).run(spec)
    assert result.provenance["suite"] == clean, "the code the worker started with"
    at_end = result.provenance[provenance.CHANGED_DURING_RUN]
    assert at_end == code_identity.suite_identity(code_repo) and at_end["dirty_paths"] == ["suite/main.py"]
    assert "error" not in result.provenance

    again = EditingBackend(code_repo, edit=False).run(spec)  # nothing changes during this one
    assert again.provenance["suite"] == at_end and provenance.CHANGED_DURING_RUN not in again.provenance


@needs_git
def test_a_backend_that_copies_the_code_at_launch_records_the_copy(code_repo: Path) -> None:
    class Copying(EditingBackend):
        code_copied_at_launch = True  # as a container's payload: the edit cannot reach the run

        def launch(self, spec: plan.RunSpec, spec_json: bytes, env: dict[str, str]) -> EndedExecution:
            execution = super().launch(spec, spec_json, env)
            self.copied = code_identity.current_suite_identity(self.root)  # the code read into the payload
            return execution

    backend = Copying(code_repo)
    result = backend.run(smoke_specs()[0])
    assert result.provenance["suite"] == backend.copied and result.provenance["suite"]["dirty_paths"]
    assert provenance.CHANGED_DURING_RUN not in result.provenance
    # Containers get the code in their payload; a local worker imports it from the checkout.
    assert DockerBackend(machine="test").code_copied_at_launch is True
    assert LocalBackend(machine="test").code_copied_at_launch is False


def test_show_reads_an_old_docker_record_as_the_reports_do() -> None:
    path = FIXTURES / "fixture-docker" / "fx_width" / "8795d9598222-r0.json"  # an ok run, in an image
    result = show.load(path)
    assert not result.provenance, "a record made before results carried provenance"
    text = show.render(path, result)
    assert all(len(line) <= 120 for line in text.splitlines()[1:]), text  # after the file's path
    lines = text.split("provenance:\n", 1)[1]
    section = " ".join(lines.split())  # the facts read across the lines they wrap onto
    assert "not recorded (a result made before" not in section
    image_id = result.run["image_id"]
    assert f"id {image_id}" in section and "name " in section, section
    assert "\n  environment:  not from a lock\n" in lines, lines
    assert "\n  suite:        not recorded\n" in lines
    assert result.run["repo_digests"] == [], "the engine knew no registry digest of the image"
    assert f"id {image_id}, digest none (built locally, not pushed)" in section, section
    base_id = result.run["image_labels"]["suite.base.id"]
    assert (
        f"\n    base: suite-test-base:21ab4e5b4a0121ad (ID {base_id.removeprefix('sha256:')[:12]}; "
        "how it was obtained is not recorded)\n"
    ) in lines, lines
    assert f"base_id {base_id}" in section, "the base's ID in full"


def test_show_says_when_the_code_changed_while_it_ran() -> None:
    path = sorted((FIXTURES / "fixture-local" / "fx_knobs").glob("*.json"))[0]
    result = show.load(path)
    at_end = section(suite__git_dirty=True, suite__dirty_paths=["suite/x.py"], suite__diff_sha256="ab" * 32)
    changed = {**section(), provenance.CHANGED_DURING_RUN: at_end["suite"]}
    text = show.render(path, dataclasses.replace(result, provenance=changed))
    assert "\n  changed while it ran: the suite above is the code at launch;" in text, text
    assert (
        "changed while it ran: the suite above is the code at launch; at the end: 1a2b3c4d5e6f + uncommitted "
        "changes (1 file: suite/x.py; diff sha256 abababababab)"
    ) in " ".join(text.split())


# -- a real Docker run --------------------------------------------------------------------------


@needs_git
@pytest.mark.docker
@pytest.mark.slow
def test_a_container_run_names_its_image_its_recipe_and_the_checkout(backend, client, tmp_path: Path) -> None:
    spec = small_specs(tmp_path)[0]
    before = head()
    docker_backend = backend()
    result = docker_backend.run(spec)
    assert result.status == "ok", (result.message, result.log_tail)
    assert_names_this_checkout(result.provenance["suite"], before)
    labels = client.images.get(result.run["image_id"]).labels  # the engine's own word on the image
    image = result.provenance["image"]
    assert image["id"] == result.run["image_id"] and image["name"] == labels["suite.image"]
    assert image["recipe_hash"] == labels.get("suite.recipe_hash")
    assert image["context_hash"] == labels["suite.context_hash"]
    assert image["base_id"] == labels.get("suite.base.id") and image["base_source"] == labels.get("suite.base.source")
    environment = result.provenance["environment"]
    assert environment["kind"] == "image" and environment["matches_lock"] is None
    if "suite.lock.sha256" in labels:
        assert environment["lock_file"] == "docker/" + labels["suite.lock.file"]
        assert environment["lock_sha256"] == labels["suite.lock.sha256"]
        assert (REPO / environment["lock_file"]).is_file(), "the lock is named from the repository root"
    skipped = docker_backend.skipped(spec, "a reason")
    assert skipped.provenance["suite"] == result.provenance["suite"], "the session's code, read once"
    assert skipped.provenance["image"] is None


@needs_git
def test_the_output_folders_are_not_code(repo: Path) -> None:
    """A page the suite rewrote under reports/ is output: the tree stays clean, and a commit that
    only publishes pages has the same code_tree as its parent (but another revision)."""
    (repo / "reports").mkdir()
    (repo / "reports" / "README.md").write_text("# Reports\n")
    git(repo, "add", "reports")
    git(repo, "commit", "-q", "-m", "pages")
    before = code_identity.suite_identity(repo)
    (repo / "reports" / "README.md").write_text("# Reports\n\nnew page\n")
    (repo / "reports" / "new.md").write_text("x\n")
    rewritten = code_identity.suite_identity(repo)
    assert rewritten["git_dirty"] is False and rewritten["dirty_paths"] == [] and rewritten["diff_sha256"] is None
    git(repo, "add", "reports")
    git(repo, "commit", "-q", "-m", "publish")
    published = code_identity.suite_identity(repo)
    assert published["git_revision"] != before["git_revision"]
    assert published["code_tree"] == before["code_tree"] and len(published["code_tree"]) == 64
    recorded = {"suite": before, "environment": {}, "image": None}
    assert provenance_text.describe_differences(recorded, {**recorded, "suite": published}) == []
    (repo / "a.py").write_text("one = 'edited'\n")
    (repo / "reports" / "README.md").write_text("# again\n")
    edited = code_identity.suite_identity(repo)
    assert edited["dirty_paths"] == ["a.py"], "the code still counts, the page does not"
    git(repo, "commit", "-q", "-am", "code")
    moved = code_identity.suite_identity(repo)
    assert moved["code_tree"] != before["code_tree"]
    assert provenance_text.describe_differences(recorded, {**recorded, "suite": moved})[0].startswith("suite revision")


def test_runs_that_got_no_image_have_their_lock_not_recorded_not_missing(tmp_path: Path) -> None:
    """GPU points in containers on a machine without a GPU are skipped before any image is
    started: their environment is an image's whose lock nobody looked at. Their page, ``show`` and
    the hardware comparison say it is not recorded; "not from a lock" would say the image had none."""
    res, out = tmp_path / "results", tmp_path / "out"
    ran = suite_cli("run", SCENARIOS / "mlp4096_gpus.yaml", "--backend", "docker", "--smoke", "--results", res)
    files = sorted(res.rglob("*.json"))
    records = [json.loads(f.read_text()) for f in files]
    assert ran.returncode in (0, 1) and records, ran.stdout + ran.stderr
    for record in records:
        assert record["status"] != "ok" and record["provenance"]["image"] is None, record["message"]
        assert "['" not in record["message"], "the engine's runtimes named in words, not as a Python list"
        assert provenance.got_no_image(record["provenance"]["environment"], None), record["provenance"]
    assert suite_cli("report", "--results", res, "--out", out).returncode == 0
    page = (out / "mlp4096_gpus.md").read_text()
    assert "- Environment lock: not recorded (no image was started)\n" in page and "from a lock" not in page
    hardware = (out / "hardware.md").read_text()
    assert "| environment lock | not recorded" in hardware and "| image recipe     | not recorded" in hardware
    assert "| image ID         | not recorded" in hardware and "none (local)" not in hardware, hardware
    said = suite_cli("show", files[0]).stdout
    assert "  environment:  not recorded (no image was started)\n" in said and "from a lock" not in said, said
    # One more run of the same machine that got an image from a lock and then failed: the machine's
    # lock and recipe are that run's, not joined with the others' "not recorded".
    failed = records[0]
    failed["status"], failed["spec"]["repetition"] = "error", 7
    failed["provenance"]["environment"].update(lock_file="docker/locks/x.txt", lock_sha256="ab" * 32)
    failed["provenance"]["image"] = {"name": "suite-bench:x", "id": "sha256:" + "c" * 64, "recipe_hash": "d" * 64}
    (files[0].parent / "failed-r7.json").write_text(json.dumps(failed))
    assert suite_cli("report", "--results", res, "--out", out).returncode == 0
    hardware = (out / "hardware.md").read_text()
    assert "| environment lock | docker/locks/x.txt abababababab " in hardware, hardware
    assert "| image recipe     | dddddddddddd " in hardware, hardware
    # The page counts one lock: the runs that got no image are listed beside it, not counted as a lock.
    [lock_line] = [line for line in (out / "mlp4096_gpus.md").read_text().splitlines() if "Environment lock" in line]
    assert lock_line.startswith("- Environment lock: `docker/locks/x.txt` (sha256 `abababababab`) (1 run); "), lock_line
    assert lock_line.endswith("; not recorded (no image was started) (6 runs)") and "came from" not in lock_line


def test_an_image_or_a_venv_without_a_lock_is_not_taken_for_a_run_that_got_no_image() -> None:
    image_env, image = provenance.image_provenance({"image_id": "sha256:" + "a" * 64})  # no lock labels
    assert image is not None and not provenance.got_no_image(image_env, image)
    assert provenance_text.lock_text(image_env, image) == "not from a lock"
    venv = {"kind": "venv", "lock_file": None, "lock_sha256": None, "matches_lock": None, "lock_differences": []}
    assert not provenance.got_no_image(venv, None) and provenance_text.lock_text(venv, None) == "not from a lock"
    skipped, none = provenance.image_provenance({})
    assert none is None and provenance.got_no_image(skipped, none)
    assert provenance_text.lock_text(skipped, none) == provenance_text.NO_IMAGE
    # A record from elsewhere whose image block names an image, with no lock and no reason given.
    assert provenance_text.lock_text(skipped, image) == "not from a lock"
