"""The commands the docs show: the command reference names exactly the parser's flags, and the
README's quick start and the worked scenario of docs/scenarios.md run as shown (smoke size, local
backend).

The quick start's second command, ``./run_tests.sh``, is what CI runs; it is not run from inside
itself here.
"""

from __future__ import annotations

import argparse
import re
import shutil
from pathlib import Path

import pytest
from conftest import REPO, QuickStart, closed_url, suite_cli

from suite import cli

COMMANDS_PAGE = REPO / "docs" / "commands.md"
README = REPO / "README.md"
SCENARIOS_PAGE = REPO / "docs" / "scenarios.md"
FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")


def parser_flags() -> dict[str, list[set[str]]]:
    """Per command (``run``, ``data``, ``--version`` for the top level), each option's spellings."""
    out: dict[str, list[set[str]]] = {}

    def walk(parser: argparse.ArgumentParser, name: str) -> None:
        out[name] = [
            set(a.option_strings) - {"-h", "--help"}
            for a in parser._actions
            if a.option_strings and set(a.option_strings) - {"-h", "--help"}
        ]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, subparser in action.choices.items():
                    walk(subparser, sub)

    walk(cli._parser(), "--version")
    return out


def documented_flags() -> dict[str, set[str]]:
    """Per command, the flags the first column of docs/commands.md's table shows for it."""
    out: dict[str, set[str]] = {}
    for line in COMMANDS_PAGE.read_text(encoding="utf-8").splitlines():
        if not line.startswith("| `"):
            continue
        first = line.split(" | ")[0].removeprefix("| ")
        syntax = " ".join(re.findall(r"`([^`]*)`", first))
        command = syntax.split()[0]
        out.setdefault(command, set()).update(FLAG.findall(syntax.replace("\\|", " ")))
    return out


def test_the_command_reference_names_every_flag_of_the_parser_and_no_other() -> None:
    documented, parsed = documented_flags(), parser_flags()
    assert set(documented) == set(parsed), "docs/commands.md's table and the parser name other commands"
    problems = []
    for command, options in parsed.items():
        shown = documented[command]
        known = set().union(*options) if options else set()
        problems += [f"{command} {flag}: in docs/commands.md, not in the parser" for flag in sorted(shown - known)]
        problems += [
            f"{command} {'/'.join(sorted(o))}: in the parser, not in docs/commands.md" for o in options if not o & shown
        ]
    assert not problems, "\n".join(problems)


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end != -1 else None]


@pytest.mark.slow
def test_the_readmes_worked_scenario_checks_and_runs(tmp_path: Path) -> None:
    """The YAML of "Adding a scenario" (docs/scenarios.md), saved as the page says, passes the
    `check` it shows and runs at smoke size on the local backend (its CPU points: this machine may
    have no GPU)."""
    section = _section(SCENARIOS_PAGE.read_text(encoding="utf-8"), "## Adding a scenario")
    yaml_text = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    shown = re.search(r"`(python -m suite check scenarios/your_file\.yaml)`", section)
    assert shown, "the section shows the check command"
    scenario = tmp_path / "scenarios" / "your_file.yaml"
    scenario.parent.mkdir()
    scenario.write_text(yaml_text, encoding="utf-8")

    check = suite_cli(*shown.group(1).split()[3:], "--backend", "local", cwd=tmp_path)  # as shown, from its folder
    assert check.returncode == 0, check.stdout + check.stderr
    assert "mnist_mlp_depth" in check.stdout

    results = tmp_path / "reports" / "results"
    env = {"SUITE_MNIST_URL": closed_url()}
    args = (
        "run",
        scenario,
        "--smoke",
        "--backend",
        "local",
        "--results",
        results,
        "--repeats",
        "1",
        "-k",
        "device=cpu",
    )
    run = suite_cli(*args, cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    assert len(list(results.rglob("*.json"))) == 3, run.stdout  # 3 depths, 1 repetition each
    page = suite_cli("report", "--results", results, "--out", tmp_path / "reports", cwd=tmp_path)
    assert page.returncode == 0, page.stdout + page.stderr
    text = (tmp_path / "reports" / "mnist_mlp_depth.md").read_text(encoding="utf-8")
    assert "Does a deeper MLP move the point where the GPU wins?" in text


@pytest.mark.slow
def test_the_quick_start_runs_and_prints_what_the_readme_shows(quick_start: QuickStart) -> None:
    """`./run_all.sh --smoke`, in a copy of this tree on the local backend (the venv already made),
    ends with exit 0, writes reports/README.md, and prints lines of the shapes the README quotes."""
    if shutil.which("nvidia-smi"):
        pytest.skip("the README quotes a smoke run on a machine without a GPU; this one has a GPU driver")
    section = _section(README.read_text(encoding="utf-8"), "## Quick start")
    assert "./run_all.sh --smoke" in section
    quoted = re.search(r"```text\n(.*?)```", section, re.S)
    assert quoted, "the quick start shows what a smoke run prints"
    tree, out = quick_start.tree, quick_start.output
    assert quick_start.returncode == 0, out
    assert (tree / "reports" / "README.md").is_file()
    # What the README quotes: console lines, and table rows of a page (spaced as a page pads them).
    seen = " ".join((out + (tree / "reports" / "mnist_mlp_width.md").read_text(encoding="utf-8")).split())
    for line in quoted.group(1).splitlines():
        # The README's figures are one real run's; here only each line's words must recur.
        pattern = re.sub(r"\d+(?:\\\.\d+)?", "[0-9.]+", re.escape(" ".join(line.split())))
        assert re.search(pattern, seen), f"the README shows {line!r}; the run printed:\n{out}"
