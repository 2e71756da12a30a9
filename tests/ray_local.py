"""A real Ray cluster on 127.0.0.1 for the tests: a head and worker nodes, one ``ray start --block`` each.

Every node is started by the ray CLI in a process session of its own, on free ports, with its own
temp dir, ``num_cpus=1``, its custom resources and its ``suite-machine`` label, so a process outside
the test (``python -m suite run --backend ray --ray-address ...``) connects to it by address as to any
cluster. The address is 127.0.0.1:PORT; Ray itself lists each node under the host's own IP.

A node's processes (``ray start``, raylet, GCS, dashboard agent, Ray workers, a benchmark's
subprocess) are found in ``/proc`` by the node's process session, by one environment variable they
all inherit, ``RAY_LOCAL_NODE=<cluster id>/<node name>``, by a command line or working directory
under the node's temp dir, and as descendants of those, so the harness can kill a node as a crash
would (SIGKILL to every one of them, also those whose parent already died). ``stop`` also takes
every process whose working directory or command line lies under the cluster's own folder (every
node process starts there; Ray's agents rename themselves ``ray::DashboardAgent``, overwriting their
environment, yet keep it as their working directory), and checks, on exit, that none is left.

Ray missing: the tests skip with the reason, or fail under ``SUITE_REQUIRE_DOCKER=1`` (the CI setting
where the dev lock, and with it Ray, is installed), as the Docker tests do without an engine.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REQUIRED = os.environ.get("SUITE_REQUIRE_DOCKER") == "1"
TAG_ENV = "RAY_LOCAL_NODE"
HEAD = "ray-head"
DEFAULT_WORKERS = {"ray-b1": {"suite_slot": 1, "gpu_model:B": 1}, "ray-b2": {"suite_slot": 1, "gpu_model:B": 1}}
HEAD_RESOURCES = {"suite_slot": 1, "gpu_model:A": 1}
# Ray's defaults wait up to a minute before a killed node is declared dead; a test waits seconds.
FAST_FAILURE_DETECTION = {
    "RAY_health_check_initial_delay_ms": "1000",
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
}
# Ray 2.60 turns token authentication on for a new head wherever ~/.ray/auth_token exists (any local
# ``ray.init()`` writes one), and then refuses worker nodes and drivers that connect by address
# without the token. The test cluster says its mode outright; ``client_env`` gives drivers the same.
AUTH = {"RAY_AUTH_MODE": "disabled"}


def require_ray() -> Any:
    """The ray module; skips the test without it (fails under SUITE_REQUIRE_DOCKER=1)."""
    try:
        import ray
    except ImportError as exc:
        reason = f"ray is not installed ({exc}); the dev lock installs it"
        if REQUIRED:
            pytest.fail(f"SUITE_REQUIRE_DOCKER=1 but {reason}")
        pytest.skip(reason)
    ray_cli = _ray_cli()
    if ray_cli is None:
        reason = "the ray command is not next to this Python"
        if REQUIRED:
            pytest.fail(f"SUITE_REQUIRE_DOCKER=1 but {reason}")
        pytest.skip(reason)
    return ray


def _ray_cli() -> str | None:
    beside = Path(sys.executable).parent / "ray"
    return str(beside) if beside.is_file() else shutil.which("ray")


# Ports the tests' daemons listen on are drawn from LISTEN_PORTS, below the kernel's ephemeral range
# (where the kernel picks the port of every outgoing connection and of every bind to port 0, by Ray's
# own processes too) and above Ray's worker ports (10002-19999): a port found free there is not taken
# by another process in the seconds before the daemon binds it. Each pytest-xdist worker draws from
# a slice of its own, so two workers starting daemons at once never pick the same port.
LISTEN_PORTS = (20000, 32768)


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports nothing listens on now (held open together, so no two are the same)."""
    low, high = _port_slice()
    held: list[socket.socket] = []
    try:
        for port in random.sample(range(low, high), high - low):
            if len(held) == n:
                break
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # in use, or closing (TIME_WAIT)
                s.close()
                continue
            held.append(s)
        if len(held) < n:
            raise RuntimeError(f"fewer than {n} free ports in {low}-{high - 1}")
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


def _port_slice() -> tuple[int, int]:
    """This pytest-xdist worker's share of LISTEN_PORTS (all of it outside xdist); where the
    ephemeral range starts lower than LISTEN_PORTS ends, the ports below it."""
    low, high = LISTEN_PORTS
    with contextlib.suppress(OSError, ValueError, IndexError):
        high = min(high, int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0]))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")
    if worker.isdigit() and count.isdigit() and int(worker) < int(count):
        size = (high - low) // int(count)
        low += int(worker) * size
        high = low + size
    return low, high


def _proc_environ(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # gone, or not ours
        return b""


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _stat(pid: int) -> tuple[str, int, int]:
    """(state letter, parent pid, session id) from /proc/PID/stat; ("", 0, 0) when the process is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return "", 0, 0
    return fields[0], int(fields[1]), int(fields[3])


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _cwd(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd").removesuffix(" (deleted)")
    except OSError:  # gone, or not ours
        return ""


def _live_pids() -> dict[int, int]:
    """pid -> parent pid of every process that still runs (zombies left out), this one excluded."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            state, ppid, _ = _stat(int(entry))
            if state not in ("", "Z", "X"):
                out[int(entry)] = ppid
    return out


def processes_under(folder: Path, live: dict[int, int] | None = None) -> list[int]:
    """Live processes whose working directory or command line lies under ``folder``.

    Not open files: a driver connected to the cluster (``suite run --ray-address``) writes its logs
    into the head's session folder, and it is no process of the cluster's (the tests watch it outlive
    the head)."""
    root = str(folder)
    return sorted(
        pid for pid in (_live_pids() if live is None else live) if root in _cmdline(pid) or _under(_cwd(pid), root)
    )


def _with_descendants(found: set[int], live: dict[int, int]) -> set[int]:
    grown = set(found)
    while True:
        more = {pid for pid, ppid in live.items() if ppid in grown and pid not in grown}
        if not more:
            return grown
        grown |= more


def node_processes_by(tag: str, session: int | None, folder: Path | None = None) -> list[int]:
    """Live processes of one node: those whose environment holds ``RAY_LOCAL_NODE=<tag>``, those of the
    node's process session (``session``: its ``ray start``'s pid), those with a command line or working
    directory under the node's temp dir ``folder``, and the descendants of all of them. Each rule alone
    misses some: Ray's agents and workers rewrite their process title over their environment (no
    tag left to read), and a benchmark subprocess may start a session of its own."""
    marker = f"{TAG_ENV}={tag}".encode()
    live = _live_pids()
    found = set()
    for pid in live:
        _, _, sid = _stat(pid)
        if (session is not None and sid == session) or marker in _proc_environ(pid).split(b"\0"):
            found.add(pid)
    if folder is not None:
        found |= set(processes_under(folder, {pid: live[pid] for pid in live if pid not in found}))
    return sorted(_with_descendants(found, live))


@dataclass
class Node:
    name: str
    resources: dict[str, float]
    head: bool
    log: Path
    proc: subprocess.Popen | None = None
    killed: bool = False
    ports: dict[str, int] = field(default_factory=dict)
    log_start: int = 0  # where the latest attempt's output begins in ``log``


# What ``ray start`` says when its raylet did not register with the GCS within Ray's fixed wait.
RAY_STARTUP_TIMED_OUT = "The current node timed out during startup"


class RayLocalCluster:
    """A head and ``workers`` on 127.0.0.1; a context manager that leaves no process behind.

    ``workers``: node name -> custom resources (default: two ``gpu_model:B`` nodes, ray-b1 and ray-b2).
    ``env``: added to ``os.environ`` for every node (the nodes inherit the test's environment).
    ``unset``: variables of the test's environment the nodes do not get.
    """

    def __init__(
        self,
        workers: dict[str, dict[str, float]] | None = None,
        head_resources: dict[str, float] | None = None,
        env: dict[str, str] | None = None,
        unset: tuple[str, ...] = (),
        root: Path | None = None,
        start_timeout: float = 90,
    ) -> None:
        require_ray()
        self.id = uuid.uuid4().hex[:8]
        # Ray's Unix sockets live under the temp dir and their paths must stay under 107 bytes:
        # a short folder of its own under /tmp (a pytest tmp_path is often too long).
        self.root = Path(tempfile.mkdtemp(prefix=f"rl{self.id}-", dir=root or "/tmp"))
        self.env = {**os.environ, **FAST_FAILURE_DETECTION, **AUTH, **(env or {})}
        for name in ("RAY_ADDRESS", *unset):
            self.env.pop(name, None)
        self.start_timeout = start_timeout
        self.nodes: dict[str, Node] = {HEAD: self._node(HEAD, head_resources or HEAD_RESOURCES, head=True)}
        for name, res in (DEFAULT_WORKERS if workers is None else workers).items():
            self.nodes[name] = self._node(name, res, head=False)
        self.port = free_ports(1)[0]
        self.address = f"127.0.0.1:{self.port}"

    def _node(self, name: str, resources: dict[str, float], head: bool) -> Node:
        return Node(name=name, resources=dict(resources), head=head, log=self.root / f"{name}.log")

    def client_env(self) -> dict[str, str]:
        """What a driver (``suite run --ray-address``) needs in its environment to connect."""
        return dict(AUTH)

    def tag(self, name: str) -> str:
        return f"{self.id}/{name}"

    # -- start -------------------------------------------------------------------------------

    def __enter__(self) -> RayLocalCluster:
        try:
            self._start_head()
            for node in self.nodes.values():
                if not node.head:
                    self._start(node)
            self.wait_until_nodes(len(self.nodes), timeout=self.start_timeout, restarts=2)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _command(self, node: Node) -> list[str]:
        ports = dict(
            zip(
                (
                    "node_manager",
                    "object_manager",
                    "agent_listen",
                    "agent_grpc",
                    "metrics",
                    "runtime_env",
                    "client",
                    "dashboard",
                ),
                free_ports(8),
                strict=True,
            )
        )
        node.ports = ports
        cmd = [
            _ray_cli() or "ray",
            "start",
            "--block",
            "--disable-usage-stats",
            "--node-ip-address=127.0.0.1",
            "--num-cpus=1",
            "--num-gpus=0",
            f"--resources={json.dumps(node.resources)}",
            f"--labels=suite-machine={node.name}",
            f"--temp-dir={self.root / node.name}",
            f"--node-manager-port={ports['node_manager']}",
            f"--object-manager-port={ports['object_manager']}",
            f"--dashboard-agent-listen-port={ports['agent_listen']}",
            f"--dashboard-agent-grpc-port={ports['agent_grpc']}",
            f"--metrics-export-port={ports['metrics']}",
            f"--runtime-env-agent-port={ports['runtime_env']}",
            "--object-store-memory=100000000",
            "--include-log-monitor=false",
        ]
        if node.head:
            cmd += [
                "--head",
                f"--port={self.port}",
                "--include-dashboard=false",
                f"--dashboard-port={ports['dashboard']}",  # a minimal dashboard process starts even so
                f"--ray-client-server-port={ports['client']}",
            ]
        else:
            cmd.append(f"--address={self.address}")
        return cmd

    def _attempt_log(self, node: Node) -> str:
        """What node ``node``'s latest ``ray start`` wrote (its log holds every attempt's)."""
        try:
            with open(node.log, "rb") as log:
                log.seek(node.log_start)
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def _start(self, node: Node) -> None:
        node.log_start = node.log.stat().st_size if node.log.exists() else 0
        with open(node.log, "ab") as log:
            node.proc = subprocess.Popen(
                self._command(node),
                cwd=self.root,
                env={**self.env, TAG_ENV: self.tag(node.name)},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _start_head(self, tries: int = 3) -> None:
        """Start the head and wait for its GCS; on a port another process took between the check and
        the bind, again on other ports."""
        for attempt in range(tries):
            head = self.nodes[HEAD]
            self._start(head)
            try:
                self._wait_for_gcs()
                return
            except RuntimeError:
                log = self._attempt_log(head)
                taken = "Address already in use" in log or "Failed to start the grpc server" in log
                if attempt == tries - 1 or not taken:
                    raise
            self.kill_node(HEAD)
            head.killed = False
            self.port = free_ports(1)[0]
            self.address = f"127.0.0.1:{self.port}"

    def _wait_for_gcs(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            head = self.nodes[HEAD]
            if head.proc is not None and head.proc.poll() is not None:
                raise RuntimeError(f"the Ray head exited with {head.proc.returncode}:\n{self.log_tail(HEAD)}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return
            time.sleep(0.2)
        raise TimeoutError(f"the Ray head did not listen on {self.address}:\n{self.log_tail(HEAD)}")

    def log_tail(self, name: str, chars: int = 3000) -> str:
        try:
            return self.nodes[name].log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    # -- state ---------------------------------------------------------------------------------

    def _gcs(self) -> Any:
        from ray._raylet import GcsClient

        return GcsClient(address=self.address)

    def alive_nodes(self, timeout: float = 5) -> list[dict[str, Any]]:
        """The nodes the GCS holds alive: node_id, ip, labels, resources (raises when it does not answer)."""
        infos = self._gcs().get_all_node_info(timeout=timeout)
        out = []
        for info in infos.values():
            if info.state != 0:  # GcsNodeInfo.ALIVE
                continue
            out.append(
                {
                    "node_id": info.node_id.hex(),
                    "ip": info.node_manager_address,
                    "labels": dict(info.labels),
                    "resources": dict(info.resources_total),
                    "is_head": bool(info.is_head_node),
                }
            )
        return out

    def wait_until_nodes(self, n: int, timeout: float = 60, restarts: int = 0) -> list[dict[str, Any]]:
        """Wait until exactly ``n`` nodes are alive; returns them (raises TimeoutError with the logs).

        ``restarts``: how many times a worker node that gave up in Ray's own startup wait is started
        again (``ray start`` waits a fixed 30 s for its raylet to register, which a loaded 2-core
        machine can exceed); an earlier attempt that registered late is not counted while the GCS
        still holds it alive."""
        deadline = time.monotonic() + timeout
        alive: list[dict[str, Any]] = []
        stale: set[str] = set()  # node IDs of attempts given up: not counted, even while the GCS holds them alive
        last = ""
        while time.monotonic() < deadline:
            for node in self.nodes.values():
                if not node.killed and node.proc is not None and node.proc.poll() is not None:
                    if restarts > 0 and not node.head and RAY_STARTUP_TIMED_OUT in self._attempt_log(node):
                        restarts -= 1
                        self.kill_node(node.name)  # whatever of the attempt still runs
                        with contextlib.suppress(Exception):  # a GCS not answering has no stale node to name
                            stale |= {
                                a["node_id"]
                                for a in self.alive_nodes()
                                if a["labels"].get("suite-machine") == node.name
                            }
                        node.killed = False
                        self._start(node)
                        deadline = time.monotonic() + timeout
                        continue
                    raise RuntimeError(
                        f"Ray node {node.name} exited with {node.proc.returncode}:\n{self.log_tail(node.name)}"
                    )
            try:
                alive = self.alive_nodes()
            except Exception as exc:  # noqa: BLE001 - the GCS not answering yet is an answer to wait on
                last = f"{type(exc).__name__}: {exc}"
                alive = []
            if len(alive) == n and not stale & {a["node_id"] for a in alive}:
                return alive
            time.sleep(0.5)
        names = sorted(a["labels"].get("suite-machine", "?") for a in alive)
        logs = "".join(f"\n--- {name}:\n{self.log_tail(name, 1500)}" for name in self.nodes if name not in names)
        raise TimeoutError(f"{len(alive)} Ray nodes alive after {timeout:.0f} s, not {n}: {names} {last}{logs}")

    def node_pids(self, name: str) -> list[int]:
        """Every live process of node ``name`` (its ray start, raylet, agents, workers, their children)."""
        node = self.nodes[name]
        return node_processes_by(self.tag(name), node.proc.pid if node.proc is not None else None, self.root / name)

    def node_environ(self, name: str) -> dict[str, str]:
        """The environment node ``name``'s ``ray start`` runs with ({} once it is gone)."""
        node = self.nodes[name]
        raw = _proc_environ(node.proc.pid) if node.proc is not None else b""
        pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
        return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}

    def node_processes(self, name: str) -> dict[int, str]:
        """pid -> command line (a Ray worker's reads ``ray::<task name>`` while it runs a task, ``ray::IDLE`` after)."""
        return {pid: _cmdline(pid) for pid in self.node_pids(name)}

    # -- faults ------------------------------------------------------------------------------

    def kill_node(self, name: str, timeout: float = 10) -> None:
        """SIGKILL every process of the node at once, as a crash of the machine would."""
        node = self.nodes[name]
        node.killed = True
        deadline = time.monotonic() + timeout
        while pids := self.node_pids(name):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {name}: processes survive SIGKILL: {pids}")
            time.sleep(0.1)
        if node.proc is not None:
            node.proc.wait(timeout=timeout)

    def kill_head(self) -> None:
        self.kill_node(HEAD)

    # -- stop ----------------------------------------------------------------------------------

    def all_pids(self) -> list[int]:
        """Every live process of the cluster: each node's, and any other whose working directory lies
        under the cluster's folder (every node process starts there; a driver such as ``suite run``
        started by a test does not)."""
        every = {pid for name in self.nodes for pid in self.node_pids(name)}
        return sorted(every | set(processes_under(self.root)))

    def stop(self, timeout: float = 10) -> None:
        """SIGKILL every process of every node, and every process tied to the cluster's folder; raises
        if one survives (also one that appears within a short settle time, as an agent a dying raylet
        was starting).

        Not SIGTERM: ``ray start --block`` and the GCS take many seconds to wind down on it, and a
        test cluster keeps nothing that a graceful stop would save.
        """
        deadline = time.monotonic() + timeout
        quiet_since: float | None = None
        while time.monotonic() < deadline:
            left = self.all_pids()
            if not left:
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since >= 0.5:
                    break
            else:
                quiet_since = None
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        for node in self.nodes.values():
            if node.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    node.proc.wait(timeout=5)
        left = {pid: _cmdline(pid) for pid in self.all_pids()}
        if left:
            raise RuntimeError(f"Ray processes left after stop: {left}")
        shutil.rmtree(self.root, ignore_errors=True)
