"""A real one-node Slurm on 127.0.0.1 for the tests: munged, slurmctld and slurmd of Debian's packages,
each with a configuration of its own in a temp folder (never the machine's ``/etc/slurm`` or
``/etc/munge``), on free ports; a context manager that stops the daemons it started by their PIDs.

``gpus``: that many GPUs in the node's generic resources (``--gres=gpu:N``), backed by character
devices made in the temp folder (copies of ``/dev/null``): Slurm hands them out, sets
``CUDA_VISIBLE_DEVICES`` and ``SLURM_GPUS_ON_NODE`` as on a GPU node, and no real GPU is behind them.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path

from ray_local import _cmdline, _live_pids, _proc_environ, _with_descendants, free_ports, processes_under

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("munge", "sbatch", "srun", "scancel", "scontrol", "squeue", "sinfo")
INSTALL = "apt-get install slurmctld slurmd slurm-client munge (.ci/run does)"
SBIN = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])


def missing_tools() -> list[str]:
    return [tool for tool in (*DAEMONS, *CLIENTS) if shutil.which(tool, path=SBIN) is None]


class SlurmCluster:
    def __init__(self, gpus: int = 0, start_timeout: float = 60) -> None:
        # munge's socket path must stay under 108 bytes: a short folder of its own under /tmp.
        self.root = Path(tempfile.mkdtemp(prefix="sl", dir="/tmp"))
        self.gpus = gpus
        self.start_timeout = start_timeout
        self.node = socket.gethostname().split(".")[0]
        self.conf = self.root / "slurm.conf"
        self.partition = "cpu" if gpus == 0 else "gpu"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf), "PATH": SBIN}
        self.pids: dict[str, int] = {}

    def __enter__(self) -> SlurmCluster:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _start(self) -> None:
        munge = self.root / "munge"
        munge.mkdir(mode=0o700)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self.socket = munge / "munge.socket"
        self._daemon(
            "munged",
            munge / "munged.pid",
            "--force",
            f"--key-file={key}",
            f"--socket={self.socket}",
            f"--pid-file={munge / 'munged.pid'}",
            f"--log-file={munge / 'munged.log'}",
            f"--seed-file={munge / 'seed'}",
        )
        for name in ("state", "spool", "log"):
            (self.root / name).mkdir()
        ctld_port, d_port = free_ports(2)
        # The CPU count slurmd itself finds (a cpuset may hold fewer than os.cpu_count()): a node
        # configured with more than it finds is refused.
        found = self.tool("slurmd", "-C").stdout
        cpus = re.search(r"\bCPUs=(\d+)", found)
        node = f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={cpus.group(1) if cpus else 1} RealMemory=1000"
        lines = [
            "ClusterName=suitetest",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={d_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.socket}",
            f"StateSaveLocation={self.root / 'state'}",
            f"SlurmdSpoolDir={self.root / 'spool'}",
            f"SlurmctldPidFile={self.root / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.root / 'slurmd.pid'}",
            f"SlurmctldLogFile={self.root / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={self.root / 'log' / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SchedulerType=sched/backfill",
            "MpiDefault=none",
            "ReturnToService=2",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "MinJobAge=600",  # finished jobs stay in `scontrol show job` for the test to read
        ]
        if self.gpus:
            devices = self.root / "dev"
            devices.mkdir()
            for i in range(self.gpus):
                os.mknod(devices / f"gpu{i}", 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a /dev/null twin
            (self.root / "gres.conf").write_text(
                f"NodeName={self.node} Name=gpu File={devices}/gpu[0-{self.gpus - 1}]\n"
            )
            lines.append("GresTypes=gpu")
            node += f" Gres=gpu:{self.gpus}"
        lines += [node, f"PartitionName={self.partition} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP"]
        self.conf.write_text("\n".join(lines) + "\n")
        self._daemon("slurmctld", self.root / "slurmctld.pid", "-i")
        self._daemon("slurmd", self.root / "slurmd.pid")
        deadline = time.monotonic() + self.start_timeout
        while (state := self.tool("sinfo", "-h", "-o", "%t").stdout.strip()) != "idle":
            if time.monotonic() > deadline:
                raise TimeoutError(f"the Slurm node is '{state}', not idle:\n{self.log_tail()}")
            time.sleep(0.5)

    def _daemon(self, name: str, pid_file: Path, *args: str) -> None:
        """Start a daemon that forks into the background; its PID is what it writes to ``pid_file``."""
        path = shutil.which(name, path=SBIN)
        assert path, name
        proc = subprocess.run([path, *args], env=self.env, capture_output=True, text=True, timeout=30, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"{name} did not start ({proc.returncode}): {proc.stderr.strip()}")
        deadline = time.monotonic() + 10
        while not pid_file.is_file() or not pid_file.read_text().strip():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} wrote no {pid_file}:\n{self.log_tail()}")
            time.sleep(0.1)
        self.pids[name] = int(pid_file.read_text().split()[0])

    def tool(self, name: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        path = shutil.which(name, path=SBIN) or name
        return subprocess.run([path, *args], env=self.env, capture_output=True, text=True, timeout=timeout, check=False)

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields (JobState, ExitCode, ...)."""
        out = self.tool("scontrol", "-o", "show", "job", job_id).stdout
        return dict(field.split("=", 1) for field in out.split() if "=" in field)

    def wait(self, job_id: str, timeout: float) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while (fields := self.job(job_id)).get("JobState") in (None, "PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            if time.monotonic() > deadline:
                self.tool("scancel", job_id)
                raise TimeoutError(f"job {job_id} still {fields.get('JobState')} after {timeout:.0f} s")
            time.sleep(1)
        return fields

    def log_tail(self, chars: int = 3000) -> str:
        texts = []
        for log in (self.root / "log" / "slurmctld.log", self.root / "log" / "slurmd.log"):
            with contextlib.suppress(OSError):
                texts.append(f"--- {log.name}\n{log.read_text(errors='replace')[-chars:]}")
        return "\n".join(texts)

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM to each daemon it started, every job step of its jobs, and their children
        (slurmctld's slurmscriptd), SIGKILL to what is left at the deadline; raises if one survives."""
        live = _live_pids()
        # slurmd starts each job step's slurmstepd through a child that calls setsid and exits, so a
        # step is no descendant of slurmd: it is found by the configuration it inherited instead.
        conf = f"SLURM_CONF={self.conf}".encode()
        steps = {pid for pid in live if conf in _proc_environ(pid).split(b"\0")} - {os.getpid()}
        started = {pid for pid in self.pids.values() if pid in live} | steps | set(processes_under(self.root, live))
        ours = _with_descendants(started, live)
        for pid in ours:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while (left := ours & set(_live_pids())) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        left = {pid: _cmdline(pid) for pid in ours & set(_live_pids())}
        if left:
            raise RuntimeError(f"Slurm processes left after stop: {left}")
        shutil.rmtree(self.root, ignore_errors=True)
