"""A fleet end to end on real engines: this machine's engine through the local socket and through an
sshd the test starts on 127.0.0.1, plus a host whose engine does not answer, to one report."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from docker_fixtures import REPO, engine_client, image_fixture  # noqa: F401 - fixtures
from test_docker_ssh import Sshd
from test_docker_ssh import sshd as sshd_fixture  # noqa: F401 - the sshd fixture, under this name here

from suite.record import results

pytestmark = pytest.mark.docker

SCENARIO = """\
name: fleet_small
question: Does one command run the plan on every host?
model: {hidden: [32]}
training: {epochs: 2}
data: {allow_synthetic: true, train_samples: 512, test_samples: 256}
repeats: 1
matrix:
  model.hidden.0: [16, 32]
"""


def test_two_hosts_and_a_dead_one_in_one_command(
    sshd_fixture: Sshd,  # noqa: F811 - the imported fixture, requested by name
    test_image: str,
    client: Any,
    tmp_path: Path,
) -> None:
    (tmp_path / "fleet_small.yaml").write_text(SCENARIO, encoding="utf-8")
    (tmp_path / "hosts.yaml").write_text(
        "hosts:\n"
        "  here: {docker: 'unix:///var/run/docker.sock'}\n"
        f"  viassh: {{docker: 'ssh://root@127.0.0.1:{sshd_fixture.port}'}}\n"
        "  gone: {docker: 'tcp://127.0.0.1:9'}\n",
        encoding="utf-8",
    )
    res, out = tmp_path / "results", tmp_path / "reports"
    env = {**os.environ, "PYTHONPATH": str(REPO), "SUITE_DOCKER_IMAGE": test_image}
    cmd = [
        sys.executable,
        "-m",
        "suite",
        "run",
        str(tmp_path / "fleet_small.yaml"),
        "--allow-synthetic",
        "--hosts",
        str(tmp_path / "hosts.yaml"),
    ]
    proc = subprocess.run([*cmd, "--results", str(res)], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 1, log  # the dead host's runs failed; the others ran
    by_host: dict[str, list[results.RunResult]] = {}
    for path, r in results.load_folder(res):
        by_host.setdefault(path.relative_to(res).parts[0], []).append(r)
    assert sorted(by_host) == ["gone", "here", "viassh"], log
    assert [r.status for r in by_host["here"]] == ["ok", "ok"], log
    assert [r.status for r in by_host["viassh"]] == ["ok", "ok"], log
    assert all(r.run["daemon"].startswith("ssh://") for r in by_host["viassh"])
    assert all(r.status == "error" and "tcp://127.0.0.1:9" in r.message for r in by_host["gone"])
    assert "[here]" in log and "[viassh]" in log
    # Each host fits its lines to 120 columns less its '[host] ' prefix; an engine's error is left whole.
    wide = [line for line in proc.stdout.splitlines() if len(line) > 120 and str(tmp_path) not in line]
    assert all(line.startswith("[gone] ") for line in wide), wide
    assert client.containers.list(ignore_removed=True, all=True, filters={"label": "suite.scenario=fleet_small"}) == []

    # A rerun resumes each host: nothing left to do on the two that ran, the dead one tried again.
    again = subprocess.run(
        [*cmd, "--results", str(res)], cwd=REPO, env=env, capture_output=True, text=True, timeout=900
    )
    assert again.stdout.count("] 2 runs already done (") == 2, again.stdout + again.stderr

    report = subprocess.run(
        [sys.executable, "-m", "suite", "report", "--results", str(res), "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert report.returncode == 0, report.stdout + report.stderr
    hardware = (out / "hardware.md").read_text()
    assert "`gone`" in hardware and "`here`" in hardware and "`viassh`" in hardware
    page = (out / "fleet_small.md").read_text()
    assert "## On `gone`" in page and "tcp://127.0.0.1:9" in page


def test_sigterm_stops_every_host_and_leaves_no_container(
    sshd_fixture: Sshd,  # noqa: F811 - the imported fixture, requested by name
    test_image: str,
    client: Any,
    tmp_path: Path,
) -> None:
    slow = SCENARIO.replace("fleet_small", "fleet_slow").replace("epochs: 2", "epochs: 400")
    (tmp_path / "fleet_slow.yaml").write_text(slow, encoding="utf-8")
    (tmp_path / "hosts.yaml").write_text(
        "hosts:\n"
        "  here: {docker: 'unix:///var/run/docker.sock'}\n"
        f"  viassh: {{docker: 'ssh://root@127.0.0.1:{sshd_fixture.port}'}}\n",
        encoding="utf-8",
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "SUITE_DOCKER_IMAGE": test_image}
    cmd = [
        sys.executable,
        "-m",
        "suite",
        "run",
        str(tmp_path / "fleet_slow.yaml"),
        "--allow-synthetic",
        "--hosts",
        str(tmp_path / "hosts.yaml"),
    ]
    proc = subprocess.Popen(
        [*cmd, "--results", str(tmp_path / "res")], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    label = {"label": "suite.scenario=fleet_slow", "status": "running"}
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len(client.containers.list(ignore_removed=True, filters=label)) < 2:
        time.sleep(0.5)
    assert len(client.containers.list(ignore_removed=True, filters=label)) == 2, "a container on each host"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0, out
    assert (
        client.containers.list(ignore_removed=True, all=True, filters={"label": "suite.scenario=fleet_slow"}) == []
    ), out.decode()


def test_sighup_stops_every_host_with_exit_code_130(test_image: str, client: Any, tmp_path: Path) -> None:
    """commands.md: 130 when stopped by Ctrl-C, SIGTERM or SIGHUP (a closed terminal, a dropped ssh
    link): `run --hosts` too, its hosts stopped as on SIGTERM."""
    slow = SCENARIO.replace("fleet_small", "fleet_hup").replace("epochs: 2", "epochs: 400")
    (tmp_path / "fleet_hup.yaml").write_text(slow, encoding="utf-8")
    (tmp_path / "hosts.yaml").write_text("hosts:\n  here: {docker: 'unix:///var/run/docker.sock'}\n", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO), "SUITE_DOCKER_IMAGE": test_image}
    proc = subprocess.Popen(
        [sys.executable, "-m", "suite", "run", str(tmp_path / "fleet_hup.yaml"), "--allow-synthetic", "--hosts",
         str(tmp_path / "hosts.yaml"), "--results", str(tmp_path / "res")],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    label = {"label": "suite.scenario=fleet_hup", "status": "running"}
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not client.containers.list(ignore_removed=True, filters=label):
        time.sleep(0.5)
    assert client.containers.list(ignore_removed=True, filters=label), "the host's container runs"
    proc.send_signal(signal.SIGHUP)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out.decode()
    assert b"[here] finished with exit code 130" in out, out.decode()
    assert client.containers.list(ignore_removed=True, all=True, filters={"label": "suite.scenario=fleet_hup"}) == []


def test_two_addresses_of_one_engine_are_said_to_share_it(test_image: str, tmp_path: Path) -> None:
    """Two hosts that are one engine (/var/run is a link to /run on Debian; two ssh names of one
    server) run their plans side by side on one machine, each measured beside the other's: said on
    stderr, naming both hosts and the engine, before the runs."""
    socket_path = Path("/var/run/docker.sock")
    if not socket_path.exists() or socket_path.resolve() == socket_path:
        pytest.skip("needs /var/run/docker.sock reached through a link (/var/run -> /run)")
    (tmp_path / "fleet_small.yaml").write_text(SCENARIO, encoding="utf-8")
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(
        f"hosts:\n  one: {{docker: 'unix:///var/run/docker.sock'}}\n  two: {{docker: 'unix://{socket_path.resolve()}'}}\n",
        encoding="utf-8",
    )
    proc = subprocess.run(
        [sys.executable, "-m", "suite", "run", str(tmp_path / "fleet_small.yaml"), "--allow-synthetic", "--smoke",
         "--hosts", str(hosts), "--results", str(tmp_path / "res"), "-k", "model.hidden.0=16"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), "SUITE_DOCKER_IMAGE": test_image},
    )  # fmt: skip
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    said = [line for line in proc.stderr.splitlines() if "are one Docker engine" in line]
    assert len(said) == 1 and "'one'" in said[0] and "'two'" in said[0], proc.stderr
