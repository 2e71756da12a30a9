"""Every flag of every command has help text; ``--version`` says the version and the git revision."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tomllib

import pytest
from conftest import REPO, suite_cli

from suite import cli


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = cli._parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {"": parser, **sub.choices}


def _undocumented(parser: argparse.ArgumentParser) -> list[str]:
    return [
        "/".join(a.option_strings) or a.dest
        for a in parser._actions
        if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
        and (not a.help or a.help == argparse.SUPPRESS or not a.help.strip())
    ]


def test_every_flag_of_every_command_has_help() -> None:
    missing = {name or "(top)": found for name, p in _commands().items() if (found := _undocumented(p))}
    assert not missing, f"arguments without help text: {missing}"


def test_every_command_has_help() -> None:
    parser = cli._parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    listed = {a.dest: a.help for a in sub._choices_actions}
    assert set(listed) == set(sub.choices)
    assert all(listed.values()), listed


@pytest.mark.parametrize("command", sorted(set(_commands()) - {""}))
def test_help_lists_each_flag(command: str) -> None:
    proc = suite_cli(command, "--help")
    assert proc.returncode == 0, proc.stderr
    for action in _commands()[command]._actions:
        for flag in action.option_strings:
            assert flag in proc.stdout, f"{command} --help lacks {flag}"


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)


def _code_status() -> str:
    """``git status`` of the code: reports/ is output (a published page is not a code change)."""
    from suite.record.code_identity import CODE_PATHSPEC, PATHSPEC_ENV

    args = ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no", "--", *CODE_PATHSPEC]
    return subprocess.run(args, capture_output=True, text=True, env={**os.environ, **PATHSPEC_ENV}).stdout


def test_version_names_the_release_and_the_revision() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    before = _code_status()
    proc = suite_cli("--version")
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip()
    head = _git("rev-parse", "--short=12", "HEAD")
    if head.returncode != 0:
        assert line == f"keras-speed-suite {version} (no git revision: not a git checkout, or git is missing)"
        return
    if _code_status() != before:
        pytest.skip("the checkout changed while --version ran")
    match = re.fullmatch(
        rf"keras-speed-suite {re.escape(version)} \(git ([0-9a-f]{{12}})"
        r"( \+ uncommitted changes \((\d+) files?, diff sha256 [0-9a-f]{12}\))?\)",
        line,
    )
    assert match, line
    assert match.group(1) == head.stdout.strip()
    changed = [entry for entry in before.splitlines() if entry.strip()]
    if changed:  # as git itself counts them (a rename counts its two paths)
        paths = sum(2 if entry[:2].strip().startswith(("R", "C")) else 1 for entry in changed)
        assert match.group(3) == str(paths), (line, before)
    else:
        assert match.group(2) is None, line


def test_version_without_git(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PATH", "")  # no git to be found
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert "(no git revision: not a git checkout, or git is missing)" in capsys.readouterr().out


def test_reproduce_help_states_the_rule_the_verdict_applies() -> None:
    """--tolerance is met by the 90% interval (two one-sided tests at 5%); "differs" needs the 95% one."""
    from suite import reproduce

    text = " ".join(_commands()["reproduce"].format_help().split())
    assert f"{reproduce.equivalence.EQUIVALENCE_LEVEL:.0%} interval lies within it" in text
    assert "95% interval lies wholly outside" in text
    assert "whole 95% interval lies within" not in text
