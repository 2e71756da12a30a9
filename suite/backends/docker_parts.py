"""What the Docker backend does on an engine besides running a container: payloads, data, reaping, probing.

Nothing is bind-mounted from the orchestrator's disk, so the engine may be anywhere (a local
socket, ``ssh://``, ``tcp://`` with TLS): the suite's code and the spec go into each container as
a tar through the Engine API before it starts, the result comes out the same way after it exits,
and MNIST is placed once per engine in a named volume whose content is checked by sha256.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import socket
import tarfile
import time
from pathlib import Path
from typing import Any, cast

from suite.backends.base import Inventory

SUITE_PACKAGE = Path(__file__).resolve().parents[1]  # suite/: the only code a container gets
RUN_UID = RUN_GID = 65534  # "nobody": a user that exists in every image, given by number
DATA_LABEL = "suite.data_sha256"
DATA_MARKER = ".suite-sha256"  # written last: a volume without it was placed halfway
LABEL_SESSION, LABEL_ORCHESTRATOR, LABEL_DEADLINE = "suite.session", "suite.orchestrator", "suite.deadline_unix"


# -- tar payloads ---------------------------------------------------------------------------------


def _add(tar: tarfile.TarFile, name: str, data: bytes | None, *, mode: int, uid: int = 0) -> None:
    info = tarfile.TarInfo(name)
    info.mtime, info.uid, info.gid = 0, uid, uid  # a fixed mtime: the same code gives the same bytes
    if data is None:
        info.type, info.mode = tarfile.DIRTYPE, mode
        tar.addfile(info)
    else:
        info.size, info.mode = len(data), mode
        tar.addfile(info, io.BytesIO(data))


def code_files() -> dict[str, bytes]:
    """The suite package's source files by path relative to its parent (``suite/...``)."""
    files = {}
    for path in sorted(SUITE_PACKAGE.rglob("*.py")):
        if "__pycache__" not in path.parts:
            files[str(path.relative_to(SUITE_PACKAGE.parent))] = path.read_bytes()
    return files


def run_payload(code: dict[str, bytes], spec_json: bytes, out_dir: str) -> bytes:
    """One tar for the container's work folder: the code (read-only to the worker), the spec, and
    an empty output folder the run user owns (the engine keeps the owner a tar entry names)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        dirs = sorted({str(Path(name).parent) for name in code})
        for d in dirs:
            _add(tar, d, None, mode=0o755)
        for name, data in code.items():
            _add(tar, name, data, mode=0o444)
        _add(tar, "spec.json", spec_json, mode=0o444)
        _add(tar, out_dir, None, mode=0o700, uid=RUN_UID)
    return buf.getvalue()


def file_from_archive(chunks: Any) -> bytes:
    """The one regular file in a ``get_archive`` stream."""
    tar = tarfile.open(fileobj=io.BytesIO(b"".join(chunks)), mode="r")
    for member in tar.getmembers():
        if member.isfile():
            extracted = tar.extractfile(member)
            if extracted is not None:
                return extracted.read()
    raise ValueError("the archive holds no file")


# -- data volumes ---------------------------------------------------------------------------------


def data_files(folder: Path, only: tuple[str, ...] = ()) -> dict[str, Path]:
    """The regular files a data source consists of (``only``: these relative paths, if present)."""
    if only:
        return {rel: folder / rel for rel in only if (folder / rel).is_file()}
    return {p.name: p for p in sorted(folder.iterdir()) if p.is_file()}


def data_digest(files: dict[str, Path]) -> tuple[str, str]:
    """(sha256 of the whole set, the marker text: one ``sha256  name`` line per file)."""
    lines = []
    for name in sorted(files):
        h = hashlib.sha256()
        with files[name].open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        lines.append(f"{h.hexdigest()}  {name}")
    marker = "\n".join(lines) + "\n"
    return hashlib.sha256(marker.encode()).hexdigest(), marker


DATA_PLACE_WAIT_S = 60.0  # how long a volume without its marker may be another session's placement


def ensure_data_volume(client: Any, image_id: str, files: dict[str, Path], labels: dict[str, str]) -> dict[str, Any]:
    """A named volume holding ``files``, placed once per engine and reused while its sha256 matches.

    The name is the content's hash; the marker file, written last, proves the placement finished.
    A volume whose marker is missing or differs is removed and placed again.
    """
    import docker

    digest, marker = data_digest(files)
    name = f"suite-data-{digest[:24]}"
    facts = {"volume": name, "sha256": digest, "files": sorted(files)}
    try:
        volume = client.volumes.get(name)
        labelled = (volume.attrs.get("Labels") or {}).get(DATA_LABEL) == digest
        # No marker yet may mean another session is placing it right now (its marker comes last):
        # wait for that before taking the volume for a broken one.
        waited_until = time.monotonic() + DATA_PLACE_WAIT_S
        while labelled:
            found = _read_marker(client, image_id, name, labels)
            if found == marker:
                return {**facts, "placed": False}
            if found or time.monotonic() > waited_until:  # a wrong marker is broken: no one is placing it
                break
            time.sleep(2)
        try:
            volume.remove(force=True)
        except docker.errors.APIError as exc:
            raise OSError(f"data volume {name} is incomplete and still in use by another run: {exc}") from None
    except docker.errors.NotFound:
        pass
    t = time.perf_counter()
    client.volumes.create(name=name, labels={DATA_LABEL: digest})
    helper = _volume_helper(client, image_id, name, labels, read_only=False)
    try:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for d in sorted({str(Path(rel).parent) for rel in files} - {"."}):
                _add(tar, d, None, mode=0o755)
            for rel in sorted(files):
                _add(tar, rel, files[rel].read_bytes(), mode=0o444)
        helper.put_archive("/data", buf.getvalue())
        mark = io.BytesIO()
        with tarfile.open(fileobj=mark, mode="w") as tar:
            _add(tar, DATA_MARKER, marker.encode(), mode=0o444)
        helper.put_archive("/data", mark.getvalue())
    finally:
        helper.remove(force=True)
    if _read_marker(client, image_id, name, labels) != marker:
        raise OSError(f"data volume {name}: its marker (the files' sha256 list) did not read back as written")
    return {**facts, "placed": True, "place_s": round(time.perf_counter() - t, 3)}


def _volume_helper(client: Any, image_id: str, volume: str, labels: dict[str, str], *, read_only: bool) -> Any:
    """A created, never started container: the archive endpoints only need it to exist."""
    from docker.types import Mount

    return client.containers.create(
        image_id,
        command=["true"],
        mounts=[Mount("/data", volume, type="volume", read_only=read_only)],
        network_mode="none",
        labels={**labels, "suite.helper": "data"},  # the session's labels: a killed session's helper is reaped
    )


def _read_marker(client: Any, image_id: str, volume: str, labels: dict[str, str]) -> str | None:
    import docker

    helper = _volume_helper(client, image_id, volume, labels, read_only=True)
    try:
        chunks, _ = helper.get_archive(f"/data/{DATA_MARKER}")
        return file_from_archive(chunks).decode()
    except docker.errors.NotFound:
        return None
    finally:
        helper.remove(force=True)


# -- sessions and reaping -------------------------------------------------------------------------


def _start_ticks(pid: int) -> str:
    """The process's start time in clock ticks since boot (Linux), so a reused pid is told apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def host_identity() -> str:
    """This host and pid namespace: ``hostname~boot id~pid namespace``.

    A hostname alone is not enough to judge a pid: two machines may share a name, and an
    orchestrator in a container with the host's network has the host's name but its own pids.
    """
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:12]
        namespace = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        boot = namespace = "?"
    return f"{socket.gethostname()}~{boot}~{namespace}"


def orchestrator_label(pid: int | None = None) -> str:
    """``host:pid:start``: which process, in which host and pid namespace, owns a container."""
    pid = os.getpid() if pid is None else pid
    return f"{host_identity()}:{pid}:{_start_ticks(pid)}"


def session_dead(labels: dict[str, str], now: float | None = None) -> tuple[bool, str]:
    """(whether the session that made a container is over, why). Unknown means alive: never removed."""
    owner = labels.get(LABEL_ORCHESTRATOR, "")
    host, _, rest = owner.partition(":")
    pid_text, _, ticks = rest.partition(":")
    if not owner or not pid_text.isdigit():
        return False, "no orchestrator label"
    if host == host_identity() and "?" not in host:
        pid = int(pid_text)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True, f"orchestrator pid {pid} on this host is gone"
        except PermissionError:
            pass  # exists, another user's
        if ticks and _start_ticks(pid) and _start_ticks(pid) != ticks:
            return True, f"pid {pid} on this host is another process now"
        return False, f"orchestrator pid {pid} on this host is alive"
    try:
        deadline = float(labels.get(LABEL_DEADLINE, ""))
    except ValueError:
        return False, f"orchestrator on {host}, no deadline recorded"
    now = time.time() if now is None else now
    if now > deadline:
        return True, f"orchestrator on {host}, past its recorded deadline"
    return False, f"orchestrator on {host}, within its recorded deadline"


def reap_dead_sessions(client: Any, own_session: str) -> list[dict[str, str]]:
    """Remove, running or exited, every suite container whose session is over; never a live one's."""
    removed = []
    for container in client.containers.list(all=True, filters={"label": LABEL_SESSION}, ignore_removed=True):
        labels = container.labels or {}
        if labels.get(LABEL_SESSION) == own_session:
            continue
        dead, why = session_dead(labels)
        if dead:
            try:
                container.remove(force=True, v=True)
            except Exception:  # noqa: BLE001 - another session reaped it first
                continue
            removed.append({"container": container.short_id, "session": labels.get(LABEL_SESSION, ""), "why": why})
    return removed


# -- what the engine's host has -------------------------------------------------------------------

# Run in a short container of the run image: the engine host's CPUs and GPUs, not the orchestrator's.
PROBE = r"""
import json, os, subprocess
out = {"cpus": os.cpu_count(), "cpus_usable": len(os.sched_getaffinity(0)), "gpus": [], "gpu_note": ""}
try:
    names = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")]
    out["cpu_model"] = names[0] if names else ""
except OSError:
    pass
q = "index,uuid,name,memory.total,driver_version,pci.bus_id"
try:
    p = subprocess.run(["nvidia-smi", "--query-gpu=" + q, "--format=csv,noheader,nounits"],
                       capture_output=True, text=True, timeout=60)
    if p.returncode == 0:
        for line in p.stdout.strip().splitlines():
            i, uuid, name, mem, driver, bus = [x.strip() for x in line.split(",")]
            out["gpus"].append({"index": int(i), "uuid": uuid, "name": name, "memory_mib": int(float(mem)),
                                "driver": driver, "pci_bus_id": bus})
        out["gpu_note"] = "nvidia-smi in a container on the engine"
    else:
        out["gpu_note"] = "nvidia-smi failed on the engine: " + (p.stderr or p.stdout).strip()[:300]
except (OSError, subprocess.SubprocessError) as exc:
    out["gpu_note"] = "no nvidia-smi in the container: " + str(exc)[:200]
print(json.dumps(out))
"""


def parse_probe(log: str) -> Inventory:
    """The inventory PROBE printed (its last line of JSON)."""
    for line in reversed(log.strip().splitlines()):
        try:
            found = json.loads(line)
        except ValueError:
            continue
        if isinstance(found, dict):
            return cast(Inventory, found)
    raise ValueError(f"the probe printed no inventory: {log[-500:]}")
