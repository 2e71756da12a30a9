"""`suite show` prints a result's provenance with every hash in full, the code tree included: it is
what tells a publishing commit (same tree, other revision) from changed code, and what reproduce
checks."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import suite_cli

RESULT = Path(__file__).parent / "fixtures" / "rich" / "box" / "mnist_mlp_width" / "763c6bd727d3-r0.json"


def test_show_prints_the_code_tree_in_full() -> None:
    tree = json.loads(RESULT.read_text())["provenance"]["suite"]["code_tree"]

    shown = suite_cli("show", RESULT)

    assert shown.returncode == 0, shown.stderr
    assert f"code_tree {tree}" in shown.stdout, shown.stdout
