"""A fleet: the same plan on several Docker engines at once, one results folder per host.

``python -m suite run --hosts hosts.yaml`` reads a hosts file::

    hosts:
      a100: {docker: "ssh://bench@a100-box"}
      h100: {docker: "ssh://bench@h100-box", gpus: [0, 1]}   # optional: which GPUs the suite may use
      here: {docker: "unix:///var/run/docker.sock"}

and runs one ordinary ``suite run --backend docker --docker-host ADDRESS --machine NAME`` per host,
each a child process with its own signal handling, lock, resume and cleanup: a host that fails
cannot take the others down, and a rerun resumes each host where it stopped. Ctrl-C or SIGTERM is
passed to every child, which removes its containers. A host whose engine does not answer at the
start gets each of its runs recorded as ``error`` with the cause; one that drops mid-plan has its
remaining runs recorded by its own orchestrator.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from suite.backends.gpu_pool import GPU_IDS_ALLOWED, is_gpu_id
from suite.record import code_identity, results, saving
from suite.run.results_folder import previous_runs
from suite.safe.console import MAX_WIDTH, WIDTH_ENV
from suite.spec import names
from suite.spec.scenario import ScenarioError
from suite.spec.settings import Checker, brief, plain_text
from suite.spec.yaml_file import read_yaml

SCHEMES = ("unix://", "ssh://", "tcp://", "npipe://")
HOST_KEYS = ("docker", "gpus")


@dataclass(frozen=True)
class Host:
    name: str  # names the results folder: reports/results/<name>/
    docker: str  # the engine's address
    gpus: tuple[str, ...] | None = None  # host GPU indices or UUIDs the suite may use; None: all


def load_hosts(path: str | Path) -> list[Host]:
    """Read and check a hosts file; every problem is reported with the file, the key and the line."""
    source = str(path)
    data, lines = read_yaml(Path(path))
    ck = Checker(source, lines)
    if not isinstance(data, dict):
        raise ScenarioError([f"{source}: the file must hold a mapping with the key 'hosts'"])
    ck.closed(data, ("hosts",), "")
    raw = data.get("hosts")
    if not isinstance(raw, dict) or not raw:
        ck.fail("hosts", "required; a mapping of host name -> {docker: ADDRESS, gpus: [...]}")
        raise ScenarioError(ck.problems)
    hosts: list[Host] = []
    addresses: dict[str, str] = {}
    for name, entry in raw.items():
        key = f"hosts.{name}"
        if not names.is_safe(name):
            ck.fail(key, f"got {brief(name)}; allowed: {names.ALLOWED}")
            continue
        if not ck.closed(entry, HOST_KEYS, key):
            continue
        address = entry.get("docker")
        if not isinstance(address, str) or not _engine_address(address) or not plain_text(address):
            ck.fail(
                f"{key}.docker",
                f"required; a Docker engine address: {', '.join(SCHEMES)} and then a host or a socket's path,"
                " no control character",
            )
            continue
        if address in addresses:
            ck.fail(f"{key}.docker", f"the same engine as host {addresses[address]!r}: its runs would collide")
        addresses[address] = name
        gpus = entry.get("gpus")
        if gpus is not None and not (
            isinstance(gpus, list) and gpus and all(map(is_gpu_id, gpus)) and len(set(map(str, gpus))) == len(gpus)
        ):
            ck.fail(f"{key}.gpus", f"got {brief(gpus)}; allowed: a non-empty list of {GPU_IDS_ALLOWED}")
            continue
        hosts.append(Host(name, address, tuple(str(g) for g in gpus) if gpus else None))
    if ck.problems:
        raise ScenarioError(ck.problems)
    return hosts


def _each_at_once(ask: Callable[[str], str | None], addresses: list[str]) -> list[str | None]:
    """``ask(address)`` of every engine at once, in their order: an engine that does not answer
    takes its whole timeout (10 s), which one host after another would add up."""
    if len(addresses) < 2:
        return [ask(a) for a in addresses]
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(len(addresses), 32)) as pool:
        return list(pool.map(ask, addresses))


def _engine_address(address: str) -> bool:
    """Whether ``address`` names an engine: a scheme of SCHEMES and then a host (ssh, tcp) or a
    socket's path (unix, npipe); ``ssh://`` alone would reach whatever host ssh picks by default."""
    scheme, _, rest = address.partition("://")
    if f"{scheme}://" not in SCHEMES:
        return False
    if scheme in ("unix", "npipe"):
        return rest.startswith("/") and len(rest) > 1
    try:
        parts = urllib.parse.urlsplit(address)
        return bool(parts.hostname) and parts.port != 0  # .port is checked as it is read
    except ValueError:  # a port that is no number or out of range, a bracket left open
        return False


def shared_engines(hosts: list[Host], identify: Callable[[str], str | None]) -> list[str]:
    """A warning for each host that reaches the Docker engine of an earlier host by another address
    (``/run`` and ``/var/run``, two ssh names of one server), told by the engine's own ID
    (``identify``; None for an engine that does not answer): their plans run at once on one machine,
    each measured beside the other's."""
    seen: dict[str, Host] = {}
    out: list[str] = []
    for host, engine in zip(hosts, _each_at_once(identify, [h.docker for h in hosts]), strict=True):
        if engine is None:
            continue
        if engine in seen:
            first = seen[engine]
            out.append(
                f"warning: hosts {first.name!r} ({first.docker}) and {host.name!r} ({host.docker}) are one Docker "
                f"engine (ID {engine}): their runs share one machine at once and slow each other"
            )
        else:
            seen[engine] = host
    return out


def child_commands(host: Host, run_args: list[str], results_dir: Path) -> list[list[str]]:
    """What one host of the fleet runs, in order: get its images ready, then the ordinary ``suite run``."""
    suite = [sys.executable, "-m", "suite"]
    prepare = [*suite, "backends", "--prepare", "docker", "--docker-host", host.docker]
    run = [*suite, "run", *run_args, "--backend", "docker", "--docker-host", host.docker]
    run += ["--machine", host.name, "--results", str(results_dir)]
    if host.gpus:
        run += ["--gpus", ",".join(host.gpus)]
    return [prepare, run]


def record_unreachable(specs: list[Any], host: Host, results_dir: Path, cause: str) -> int:
    """Each run of a host whose engine does not answer, recorded as ``error`` with the cause."""
    from suite.backends.base import now_iso
    from suite.record import provenance

    previous = {key for key, r in previous_runs(results_dir / host.name).items() if r.ok}
    written = 0
    for spec in specs:
        if (spec.fingerprint, spec.repetition) in previous:
            continue  # already measured there: nothing to record again
        now = now_iso()
        run = {"backend": "docker", "machine": host.name, "daemon": host.docker, "started_at": now, "finished_at": now}
        message = f"host {host.name}: no Docker engine answers at {host.docker}: {cause}"
        # No engine, so no image: the code that planned it is what can be said of its provenance.
        origin = provenance.provenance_of(code_identity.current_suite_identity(), *provenance.image_provenance(run))
        result = results.RunResult(status="error", spec=spec.to_dict(), message=message, run=run, provenance=origin)
        saving.save(result, results_dir / host.name / spec.scenario, spec.run_id)
        written += 1
    return written


def _exit_code(code: int) -> int:
    """A child killed by signal N (Popen says -N) as a shell would report it: 128 + N, never below 0."""
    return 128 - code if code < 0 else code


def _end_with_parent() -> None:
    """In the child, before exec: SIGTERM when the fleet dies, even by SIGKILL, so no host runs on alone.

    Linux's PR_SET_PDEATHSIG; elsewhere the child is left as it is.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class _HostRun(threading.Thread):
    """One host's commands, one after the other; a signal goes to whichever is running."""

    def __init__(self, host: Host, commands: list[list[str]], say: Callable[[str], None]):
        super().__init__(daemon=True, name=f"fleet-{host.name}")
        self.host, self.commands, self.say = host, commands, say
        self.prefix = f"[{host.name}] "
        self.code = 0
        self.stopped = threading.Event()
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def run(self) -> None:
        for cmd in self.commands:
            with self._lock:
                if self.stopped.is_set():
                    self.code = self.code or 130
                    return
                # Its own session: the fleet decides who gets which signal, once.
                self._proc = subprocess.Popen(
                    cmd,
                    env={**os.environ, WIDTH_ENV: str(MAX_WIDTH - len(self.prefix))},
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    bufsize=1,
                    start_new_session=True,
                    preexec_fn=_end_with_parent,
                )
            assert self._proc.stdout is not None
            for line in self._proc.stdout:
                self.say(f"{self.prefix}{line.rstrip()}")
            code = _exit_code(self._proc.wait())
            if cmd is self.commands[-1] or code == 2 or self.stopped.is_set():
                self.code = code
                return
            if code != 0:  # images could not be made ready: the run itself then says what is missing
                self.say(f"[{self.host.name}] preparing the images failed (exit {code}); running anyway")

    def signal(self, signum: int) -> None:
        with self._lock:
            self.stopped.set()
            if self._proc is not None and self._proc.poll() is None:
                self._proc.send_signal(signum)


def run_fleet(
    hosts: list[Host],
    run_args: list[str],
    results_dir: Path,
    specs: list[Any],
    *,
    probe: Callable[[str], str | None],
    say: Callable[[str], None] = print,
) -> int:
    """Run every host at once; returns the worst exit code (2 bad input, 1 some run failed, 0 ok).

    ``probe(address)`` returns why an engine cannot be used, or None when it answers.
    """
    codes: dict[str, int] = {}
    runs: list[_HostRun] = []
    for host, why in zip(hosts, _each_at_once(probe, [h.docker for h in hosts]), strict=True):
        if why is not None:
            n = record_unreachable(specs, host, results_dir, why)
            say(f"[{host.name}] not run: no Docker engine answers at {host.docker} ({why}); {n} runs recorded as error")
            codes[host.name] = 1
            continue
        say(f"[{host.name}] {host.docker}")
        runs.append(_HostRun(host, child_commands(host, run_args, results_dir), say))

    def forward(signum: int, frame: object) -> None:
        if signum == signal.SIGHUP:  # a closed terminal: its last words must not fail the stop
            from suite.run.runner import leave_a_hung_up_terminal

            leave_a_hung_up_terminal()
        for r in runs:
            r.signal(signum)

    # SIGHUP (a closed terminal, a dropped ssh link) stops the hosts as SIGTERM does: by its default
    # action the fleet would end at once with 129, its hosts stopped only by their parent-death signal.
    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        for r in runs:
            r.start()
        for r in runs:
            while r.is_alive():
                r.join(timeout=0.5)  # short joins: the main thread must stay free to take signals
            codes[r.host.name] = r.code
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    for name in sorted(codes):
        say(f"[{name}] finished with exit code {codes[name]}")
    interrupted = any(r.stopped.is_set() for r in runs)
    worst = max(codes.values(), default=0)
    return 130 if interrupted and worst != 2 else worst
