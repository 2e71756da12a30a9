"""A Docker engine over ssh://: this machine's engine, reached through an sshd the test starts itself.

The sshd has its own configuration, host key and authorized key in a temporary folder, listens on
127.0.0.1 only, and is stopped by the test; the machine's own ssh setup is never read or changed.
docker-py's paramiko transport reads ~/.ssh (config, known_hosts, the key), so HOME points at a
temporary home holding them. On the engine's side, ``docker system dial-stdio`` needs the docker CLI.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, suite_cli
from docker_fixtures import (  # noqa: F401 - fixtures
    REQUIRED,
    SMALL_SCENARIO,
    backend_factory,
    engine_client,
    image_fixture,
    session_containers,
    sigkill_once_running,
    small_specs,
    with_config,
)
from ray_local import _live_pids, _with_descendants, free_ports

from suite.record import results

pytestmark = pytest.mark.docker

SSHD = "/usr/sbin/sshd"


class Sshd:
    """One sshd on 127.0.0.1:port with a configuration of its own; ``stop`` ends its sessions too."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.port = free_ports(1)[0]
        self.proc: subprocess.Popen | None = None
        self.log = folder / "sshd.log"
        (folder / "remote-home").mkdir()
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / "host_key")])
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / "client_key")])
        shutil.copy(folder / "client_key.pub", folder / "authorized_keys")
        (folder / "sshd_config").write_text(
            "\n".join(
                [
                    f"Port {self.port}",
                    "ListenAddress 127.0.0.1",
                    f"HostKey {folder / 'host_key'}",
                    f"AuthorizedKeysFile {folder / 'authorized_keys'}",
                    f"PidFile {folder / 'sshd.pid'}",
                    "PermitRootLogin prohibit-password",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",  # the pytest temp folders are not root's 0700 home
                    "MaxSessions 20",
                    # A home of its own for the remote side: the shell that runs `docker system
                    # dial-stdio` then reads none of the machine's own startup files (bash sources
                    # ~/.bashrc for ssh commands), which may be slow or lock shared state.
                    f"SetEnv HOME={folder / 'remote-home'}",
                    "",
                ]
            )
        )

    def start(self) -> None:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation folder
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(self.folder / "sshd_config")],
                stdout=log,
                stderr=log,
                start_new_session=True,  # its own group: stop() ends the listener and every session
            )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.1)
        raise RuntimeError(f"sshd did not start: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        """Kill the listener and every connection it forked (they start sessions of their own).

        Each is stopped first, until a listing finds no new one: a stopped process forks no more, so
        no connection escapes by forking between the listing and the kill (on a loaded machine one
        did, and the engine stayed in reach)."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            stopped: list[int] = []
            found = [proc.pid]
            while found:
                for pid in found:
                    _signal(pid, signal.SIGSTOP)
                stopped += found
                found = [pid for pid in _with_descendants({proc.pid}, _live_pids()) if pid not in stopped]
            for pid in stopped:
                _signal(pid, signal.SIGKILL)
            proc.wait()

    def client_home(self, home: Path) -> None:
        """A home whose .ssh lets paramiko reach this sshd: the key, the config, the host key."""
        ssh = home / ".ssh"
        ssh.mkdir(parents=True, mode=0o700)
        shutil.copy(self.folder / "client_key", ssh / "id_ed25519")
        (ssh / "id_ed25519").chmod(0o600)
        host_key = (self.folder / "host_key.pub").read_text().split()[:2]
        (ssh / "known_hosts").write_text(f"[127.0.0.1]:{self.port} {' '.join(host_key)}\n")
        (ssh / "config").write_text(f"Host 127.0.0.1\n  IdentityFile {ssh / 'id_ed25519'}\n")


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def run(cmd: list[str]) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


@pytest.fixture
def sshd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Sshd]:
    missing = [tool for tool in (SSHD, "ssh-keygen", "docker") if shutil.which(tool) is None]
    if missing:
        why = f"ssh test needs {', '.join(missing)} (apt-get install openssh-server; the docker CLI)"
        if REQUIRED:
            pytest.fail(f"SUITE_REQUIRE_DOCKER=1 but {why}")
        pytest.skip(why)
    pytest.importorskip("paramiko")
    folder = tmp_path / "sshd"
    folder.mkdir()
    server = Sshd(folder)
    server.start()
    server.client_home(tmp_path / "home")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)  # the key in the temporary home, not an agent's
    try:
        yield server
    finally:
        server.stop()


def test_smoke_run_over_ssh(sshd: Sshd, backend, client: Any, tmp_path: Path) -> None:
    address = f"ssh://root@127.0.0.1:{sshd.port}"
    docker_backend = backend(docker_host=address)
    inventory = docker_backend.inventory()
    assert inventory["source"] == "probe container" and inventory["cpus"] == os.cpu_count()
    events: list[dict[str, Any]] = []
    result = docker_backend.run(small_specs(tmp_path)[0], on_event=events.append)
    assert result.status == "ok", (result.message, result.log_tail)
    assert result.run["daemon"] == address and result.run["daemon_link"] == "ssh"
    assert result.run["isolation"]["bind_mounts"] == []
    assert [e["epoch"] for e in events if e["event"] == "epoch" and e["phase"] == "fit"] == [1, 2]
    docker_backend.close()
    assert session_containers(client, docker_backend.session) == []


def test_sshd_stopped_mid_run_is_a_failure_with_its_cause_and_leaves_no_container(
    sshd: Sshd, backend, client: Any, tmp_path: Path
) -> None:
    address = f"ssh://root@127.0.0.1:{sshd.port}"
    docker_backend = backend(docker_host=address)
    spec = small_specs(tmp_path)[0]
    spec = with_config(spec, training={**spec.config["training"], "epochs": 400})
    label = f"suite.run_id={spec.run_id}"  # the run's container, not a data or probe helper of the session
    stopped = threading.Event()

    def stop_once_running() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if client.containers.list(ignore_removed=True, filters={"label": label, "status": "running"}):
                time.sleep(1)
                stopped.set()  # first: the run may end the moment sshd is gone
                sshd.stop()
                return
            time.sleep(0.2)

    stopper = threading.Thread(target=stop_once_running, daemon=True)
    stopper.start()
    started = time.monotonic()
    result = docker_backend.run(spec)
    stopper.join(30)  # its stop() must be over before the restart below
    assert stopped.is_set(), ("the run ended before sshd was stopped", result.message, sshd.log.read_text()[-3000:])
    assert time.monotonic() - started < 120
    assert result.status == "error", (result.status, result.message)
    assert f"lost the Docker engine at {address}" in result.message
    # The engine is out of reach: the container still runs there until the link is back.
    assert session_containers(client, docker_backend.session) != []
    sshd.start()
    docker_backend.close()  # what the runner does at the end of a plan, also on Ctrl-C
    assert session_containers(client, docker_backend.session) == []


def test_sshd_stopped_as_the_container_is_created_is_a_failure_with_its_cause(
    sshd: Sshd, backend, client: Any, tmp_path: Path
) -> None:
    """The link breaks as the run's container comes to be, mostly while the code is put into it and
    it is started (on a quick engine, just after). Over ssh, docker-py's transport may then fail
    with an AttributeError (urllib3 finds no socket), which is still a lost engine, not a crash."""
    address = f"ssh://root@127.0.0.1:{sshd.port}"
    docker_backend = backend(docker_host=address)
    spec = small_specs(tmp_path)[0]
    spec = with_config(spec, training={**spec.config["training"], "epochs": 400})
    created = {"label": f"suite.run_id={spec.run_id}"}
    stopped = threading.Event()

    def stop_once_created() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if client.api.containers(all=True, filters=created):  # no inspect: a helper may go meanwhile
                stopped.set()
                sshd.stop()
                return
            time.sleep(0.05)

    stopper = threading.Thread(target=stop_once_created, daemon=True)
    stopper.start()
    result = docker_backend.run(spec)  # a traceback here is the failure this test is about
    stopper.join(30)
    assert stopped.is_set(), ("the run ended before its container was seen", result.status, result.message)
    assert result.status == "error", (result.status, result.message)
    assert f"lost the Docker engine at {address}" in result.message
    sshd.start()
    docker_backend.close()
    assert session_containers(client, docker_backend.session) == []


def test_sigkilled_orchestrator_over_ssh_leaves_nothing_after_the_next_session(
    sshd: Sshd, client: Any, test_image: str, tmp_path: Path
) -> None:
    import sys

    from docker_fixtures import REPO
    from test_docker_isolation import LONG_SCENARIO

    from suite.backends.docker import DockerBackend

    address = f"ssh://root@127.0.0.1:{sshd.port}"
    name = f"orphan_ssh_{os.getpid()}"
    path = tmp_path / f"{name}.yaml"
    path.write_text(LONG_SCENARIO.format(name=name, timeout=600), encoding="utf-8")
    cmd = [sys.executable, "-m", "suite", "run", str(path), "--backend", "docker", "--docker-host", address]
    cmd += ["--allow-synthetic"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "SUITE_DOCKER_IMAGE": test_image}  # HOME: the fixture's
    proc = subprocess.Popen(
        [*cmd, "--results", str(tmp_path / "r")],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    label = f"suite.scenario={name}"
    try:
        dead_session = sigkill_once_running(client, label, proc)
        newcomer = DockerBackend(machine="test", docker_host=address, image=test_image)
        newcomer._connect()  # first contact with the engine: dead sessions' containers are removed
        newcomer.close()
        assert session_containers(client, dead_session) == []
    finally:
        if proc.poll() is None:
            proc.kill()
        for c in client.containers.list(ignore_removed=True, all=True, filters={"label": label}):
            c.remove(force=True)


def test_the_port_of_ssh_config_is_used_for_an_address_without_one(sshd: Sshd, tmp_path: Path) -> None:
    """docs/several-servers.md: ``~/.ssh/config`` may give Hostname, Port, User and IdentityFile.
    docker-py writes port 22 into ``ssh://host`` before it reads the config; the suite must not."""
    ssh = tmp_path / "home" / ".ssh"
    (ssh / "config").write_text(
        f"Host bench-box\n  Hostname 127.0.0.1\n  Port {sshd.port}\n  User root\n  IdentityFile {ssh / 'id_ed25519'}\n"
    )
    proc = suite_cli("env", "--json", "--docker-host", "ssh://bench-box")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    engine = json.loads(proc.stdout)["docker"]
    assert engine["address"] == "ssh://bench-box" and "error" not in engine, engine
    assert engine["version"], engine


def test_a_host_lost_mid_plan_has_its_remaining_runs_recorded_not_a_traceback(
    sshd: Sshd, client: Any, test_image: str, tmp_path: Path
) -> None:
    """several-servers.md: a host whose engine does not answer has its runs recorded as `error` with
    the cause. Here the link goes during the plan's first run: the next run's launch meets the dead
    link, and must be recorded as an error like the first, the plan ending with exit 1."""
    scenario = tmp_path / "ssh_lost.yaml"
    scenario.write_text(SMALL_SCENARIO.format(name="ssh_lost", widths="[8, 16]"), encoding="utf-8")
    res = tmp_path / "results"
    proc = subprocess.Popen(
        [sys.executable, "-m", "suite", "run", str(scenario), "--smoke", "--backend", "docker",
         "--docker-host", f"ssh://root@127.0.0.1:{sshd.port}", "--results", str(res), "--machine", "box",
         "--set", "training.epochs=400"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        # The test's own image: the catalog's tag is on this engine only where another test built it.
        env={**os.environ, "PYTHONPATH": str(REPO), "SUITE_DOCKER_IMAGE": test_image},
    )  # fmt: skip
    lost = False
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            running = {"label": "suite.scenario=ssh_lost", "status": "running"}
            if client.containers.list(ignore_removed=True, filters=running):
                time.sleep(1)
                sshd.stop()
                lost = True
                break
            time.sleep(0.2)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        sshd.start()
        for c in client.containers.list(all=True, ignore_removed=True, filters={"label": "suite.scenario=ssh_lost"}):
            c.remove(force=True)
    assert lost, f"no run's container ran before the plan ended: {out}"
    assert "Traceback" not in out, out
    assert proc.returncode == 1, out
    found = sorted((r.status, r.message) for _, r in results.load_folder(res / "box"))
    assert [s for s, _ in found] == ["error", "error"], found
    assert all("lost the Docker engine" in m for _, m in found), found
