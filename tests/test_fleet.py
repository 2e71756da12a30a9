"""The hosts file of a fleet: validated like a scenario (file, key, line), and what each host runs."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from suite.run import fleet
from suite.spec.scenario import ScenarioError


def _hosts(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hosts.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_valid_hosts(tmp_path: Path) -> None:
    path = _hosts(
        tmp_path,
        """\
hosts:
  a100: {docker: "ssh://bench@a100-box"}
  h100: {docker: "ssh://bench@h100-box", gpus: [0, 1]}
  here: {docker: "unix:///var/run/docker.sock", gpus: ["GPU-5c1f"]}
""",
    )
    hosts = fleet.load_hosts(path)
    assert [(h.name, h.docker, h.gpus) for h in hosts] == [
        ("a100", "ssh://bench@a100-box", None),
        ("h100", "ssh://bench@h100-box", ("0", "1")),
        ("here", "unix:///var/run/docker.sock", ("GPU-5c1f",)),
    ]
    prepare, run = fleet.child_commands(hosts[1], ["scenarios/x.yaml", "--smoke"], tmp_path)
    assert prepare[1:] == ["-m", "suite", "backends", "--prepare", "docker", "--docker-host", "ssh://bench@h100-box"]
    assert run[1:] == [
        "-m", "suite", "run", "scenarios/x.yaml", "--smoke", "--backend", "docker",
        "--docker-host", "ssh://bench@h100-box", "--machine", "h100", "--results", str(tmp_path), "--gpus", "0,1",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("hosts:\n  a: {docker: 'http://x'}\n", "line 2 key 'hosts.a.docker': required; a Docker engine address"),
        (
            "hosts:\n  a: {docker: 'ssh://x', gpu: [0]}\n",
            "line 2 key 'hosts.a.gpu': unknown key; did you mean gpus?; allowed: docker, gpus",
        ),
        (
            "hosts:\n  a: {docker: 'ssh://x', gpus: [0, 0]}\n",
            "line 2 key 'hosts.a.gpus': got [0, 0]; allowed: a non-empty list of distinct",
        ),
        # A comma would split one GPU in two on the host's own command line (--gpus A,B).
        ("hosts:\n  a: {docker: 'ssh://x', gpus: ['GPU-a,b']}\n", "key 'hosts.a.gpus': got ['GPU-a,b']"),
        ("hosts:\n  a: {docker: 'ssh://x', gpus: ['0\\n']}\n", "key 'hosts.a.gpus'"),
        # No host after the scheme: ssh would pick one of its own (its config's default, localhost).
        ("hosts:\n  a: {docker: 'ssh://'}\n", "key 'hosts.a.docker': required; a Docker engine address"),
        ("hosts:\n  a: {docker: 'tcp://:2375'}\n", "key 'hosts.a.docker'"),
        ("hosts:\n  a: {docker: 'unix://'}\n", "key 'hosts.a.docker'"),
        ("hosts:\n  a: {docker: 'ssh://x:port'}\n", "key 'hosts.a.docker'"),
        ("hosts:\n  a: {docker: 'ssh://x', gpus: [-1]}\n", "key 'hosts.a.gpus'"),
        ("hosts:\n  'a b': {docker: 'ssh://x'}\n", "key 'hosts.a b': got 'a b'; allowed: 1 to 100 letters"),
        ("hosts:\n  a: {docker: 'ssh://x'}\n  b: {docker: 'ssh://x'}\n", "line 3 key 'hosts.b.docker': the same"),
        ("hosts: []\n", "key 'hosts': required"),
        ("host:\n  a: {docker: 'ssh://x'}\n", "key 'host': unknown key; did you mean hosts?; allowed: hosts"),
        ("- a\n", "must hold a mapping"),
        ("hosts:\n  a: {docker: 'ssh://x'}\n  a: {docker: 'ssh://y'}\n", "duplicate key 'a'"),
    ],
)
def test_bad_hosts_file_names_file_key_and_line(tmp_path: Path, text: str, expected: str) -> None:
    path = _hosts(tmp_path, text)
    with pytest.raises(ScenarioError) as err:
        fleet.load_hosts(path)
    assert str(path) in str(err.value) and expected in str(err.value), str(err.value)


def test_a_child_killed_by_a_signal_is_a_failure() -> None:
    assert fleet._exit_code(-9) == 137 and fleet._exit_code(0) == 0 and fleet._exit_code(2) == 2


def test_children_end_when_the_fleet_dies(tmp_path: Path) -> None:
    # A stand-in fleet process starts one child the way the fleet does, then dies by SIGKILL.
    import subprocess
    import sys
    import time

    script = (
        "import subprocess, sys, time\n"
        "from suite.run import fleet\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True,"
        " preexec_fn=fleet._end_with_parent)\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    import os

    from conftest import REPO

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=REPO, env=env)
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and Path(f"/proc/{child}").exists():
        state = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "Z":
            break
        time.sleep(0.1)
    alive = (
        Path(f"/proc/{child}").exists() and Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    )
    assert not alive, "the host's child outlived the fleet"


def test_every_engine_is_asked_at_once(tmp_path: Path) -> None:
    # An engine that does not answer takes its whole timeout: asked one after another, three such
    # hosts kept the plan from starting for 3 x 2 x 10 s. Each call here waits until all three are in.
    hosts = [fleet.Host(name, f"ssh://{name}", None) for name in ("a", "b", "c")]
    together = threading.Barrier(3, timeout=30)

    def identify(address: str) -> str | None:
        together.wait()
        return {"ssh://a": "ENGINE-1", "ssh://c": "ENGINE-1"}.get(address)

    (warning,) = fleet.shared_engines(hosts, identify)
    assert "hosts 'a' (ssh://a) and 'c' (ssh://c) are one Docker engine (ID ENGINE-1)" in warning

    said: list[str] = []

    def probe(address: str) -> str | None:
        together.wait()
        return f"{address} is down"

    assert fleet.run_fleet(hosts, [], tmp_path, [], probe=probe, say=said.append) == 1
    assert said[:3] == [
        f"[{h}] not run: no Docker engine answers at ssh://{h} (ssh://{h} is down); 0 runs recorded as error"
        for h in "abc"
    ], said
