"""A point below the accuracy gate takes no part in a verdict, also where no GPU point ran: the
CPU fit-time span the verdict then gives must not start or end at a gated point."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from conftest import suite_cli

FIXTURE = Path(__file__).parent / "fixtures" / "results" / "fixture-local" / "fx_width"


def _verdict(page: str) -> str:
    return next(line for line in page.splitlines() if line.startswith("- **On `fixture-local`:**"))


def test_no_gpu_verdict_leaves_out_a_cpu_point_below_the_gate(tmp_path: Path) -> None:
    folder = tmp_path / "results" / "fixture-local" / "fx_width"
    shutil.copytree(FIXTURE, folder)
    for path in folder.glob("*.json"):  # width=100 on the CPU: fast, but below the gate
        record = json.loads(path.read_text())
        if record["spec"]["point_label"] == "width=100, device=cpu":
            record["quality"]["test_accuracy"] = 0.5
            path.write_text(json.dumps(record))

    done = suite_cli("report", "--results", tmp_path / "results", "--out", tmp_path / "out")

    assert done.returncode == 0, done.stderr
    page = (tmp_path / "out" / "fx_width.md").read_text()
    assert "width 100: CPU: below the accuracy gate" in page  # the page says it is left out ...
    verdict = _verdict(page)
    assert "CPU fit time: 1.56 s at width 750." in verdict, verdict  # ... and so does the verdict
    assert "width 100" not in verdict, verdict


def test_a_cpu_only_plan_of_a_gpu_scenario_says_no_gpu_point_ran_not_that_no_pair_did(tmp_path: Path) -> None:
    """`run -k "device == cpu"` (or `--set device=cpu`) leaves no GPU point on file: the verdict
    says that, not that some CPU and GPU pair failed."""
    folder = tmp_path / "results" / "fixture-local" / "fx_width"
    shutil.copytree(FIXTURE, folder)
    for path in folder.glob("*.json"):
        if json.loads(path.read_text())["spec"]["config"]["device"] != "cpu":
            path.unlink()

    done = suite_cli("report", "--results", tmp_path / "results", "--out", tmp_path / "out")

    assert done.returncode == 0, done.stderr
    verdict = _verdict((tmp_path / "out" / "fx_width.md").read_text())
    assert "No CPU-GPU comparison on this machine: no GPU point among these runs." in verdict, verdict
    assert "pair" not in verdict and "CPU fit time: 1.38 s at width 100, 1.56 s at width 750." in verdict, verdict


def test_a_sweep_of_one_s_own_whose_points_were_all_skipped_says_why_not_how_many_passed_the_gate(
    tmp_path: Path,
) -> None:
    """A scenario of the user's own (verdict none) on a machine without a GPU: no point ran, so the
    verdict says why, as the other verdicts do, not "0 of 2 points ran ok above the accuracy gate"."""
    folder = tmp_path / "results" / "fixture-local" / "fx_width"
    shutil.copytree(FIXTURE, folder)
    for path in folder.glob("*.json"):
        record = json.loads(path.read_text())
        if record["spec"]["config"]["device"] == "cpu":
            path.unlink()
        else:
            record["spec"]["report"]["verdict"] = "none"
            path.write_text(json.dumps(record))

    done = suite_cli("report", "--results", tmp_path / "results", "--out", tmp_path / "out")

    assert done.returncode == 0, done.stderr
    page = (tmp_path / "out" / "fx_width.md").read_text()
    verdict = _verdict(page)
    assert verdict.endswith(
        "No comparison on this machine: needs 1 GPU(s); this machine has no GPU (2 points skipped)."
    ), verdict
    assert "accuracy gate" not in verdict, verdict
    # Each point is under Skips and failures with its reason; no Not compared section repeats them.
    assert "- `skipped`, 6 runs of 2 points (width=100, device=gpu; width=750, device=gpu): needs 1 GPU(s)" in page
    assert "### Not compared" not in page
