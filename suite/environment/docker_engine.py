"""The Docker engine the suite talks to: which daemon, how it is reached, and what it reports.

The daemon address is always explicit: an argument (``--docker-host``), else ``DOCKER_HOST``, else
the default socket. It may be a local socket, ``ssh://user@host`` or ``tcp://host:port`` with TLS.
The docker CLI's contexts are never consulted (docker-py 7.2's ``from_env`` started to follow them,
which can silently switch daemons); when the CLI's current context points elsewhere,
``engine_facts`` says so. The address and how it was chosen go into every result.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_SOCKET = "unix:///var/run/docker.sock"
HTTP_TIMEOUT_S = 120  # for single API calls; waiting for a run uses no HTTP timeout at all


@dataclass(frozen=True)
class Daemon:
    address: str
    source: str  # "argument" | "DOCKER_HOST" | "default socket"


def daemon(docker_host: str | None = None) -> Daemon:
    if docker_host:
        return Daemon(docker_host, "argument")
    if os.environ.get("DOCKER_HOST"):
        return Daemon(os.environ["DOCKER_HOST"], "DOCKER_HOST")
    return Daemon(DEFAULT_SOCKET, "default socket")


TLS_SCHEMES = ("tcp://", "https://")
MIN_API_VERSION = "1.41"  # device requests need 1.40; only a placeholder until the engine is asked


def client_kwargs(address: str) -> dict[str, Any]:
    """docker-py arguments for an address: ``unix://``, ``ssh://user@host[:port]`` (paramiko, reading
    ~/.ssh/config and known_hosts), or ``tcp://`` with TLS from DOCKER_TLS_VERIFY / DOCKER_CERT_PATH
    as the docker CLI reads them (any non-empty DOCKER_TLS_VERIFY: check the server against
    ca.pem; DOCKER_CERT_PATH alone: client certificate, server unchecked)."""
    import docker

    tls_env = {k: os.environ[k] for k in ("DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH") if k in os.environ}
    kwargs = docker.utils.kwargs_from_env(environment=tls_env)
    kwargs["base_url"] = _ssh_port_from_config(address) if address.startswith("ssh://") else address
    if not address.startswith(TLS_SCHEMES):
        kwargs.pop("tls", None)  # TLS belongs to tcp only; ssh has its own transport security
    return kwargs


def _ssh_port_from_config(address: str) -> str:
    """``ssh://[user@]host`` with the ``Port`` ~/.ssh/config gives that host, where the address names
    none: docker-py writes port 22 into such an address before its transport reads the config, so
    the config's port would never be used."""
    import urllib.parse

    try:
        import paramiko

        parsed = urllib.parse.urlparse(address)
        if parsed.port is not None or not parsed.hostname:
            return address
        config = paramiko.SSHConfig.from_path(os.path.expanduser("~/.ssh/config"))
        port = config.lookup(parsed.hostname).get("port")
    except Exception:  # noqa: BLE001 - no paramiko, no config, none readable: docker-py goes on as it would have
        return address
    if not port or not str(port).isdigit():
        return address
    return urllib.parse.urlunparse(parsed._replace(netloc=f"{parsed.netloc}:{int(port)}"))


def tls_mode(address: str) -> str:
    """How the link to the engine is secured, for the record."""
    if address.startswith("ssh://"):
        return "ssh"
    if not address.startswith(TLS_SCHEMES):
        return "local socket" if address.startswith(("unix://", "npipe://")) else "none"
    verify = os.environ.get("DOCKER_TLS_VERIFY", "")
    if verify:
        return "tls, server verified"
    return "tls, server NOT verified" if os.environ.get("DOCKER_CERT_PATH") else "none (plain tcp)"


def connect(docker_host: str | None = None, timeout: float | None = HTTP_TIMEOUT_S) -> tuple[Any, Daemon]:
    """A docker-py client for the explicit daemon; raises an exception if none answers.

    timeout: per HTTP call; None for a client that follows a stream for as long as it lasts.
    """
    import docker

    where = daemon(docker_host)
    kwargs = client_kwargs(where.address)
    if "tls" not in kwargs:
        # "auto" asks the engine its API version (an ssh engine is connected to right here).
        return docker.DockerClient(version="auto", timeout=timeout, **kwargs), where
    # requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE replace the CA it is given, so the engine's
    # ca.pem would silently be ignored where those are set; the docker CLI always uses ca.pem.
    # The version is asked only once the environment is out of the way (docker-py 7.1 pinned).
    client = docker.DockerClient(version=MIN_API_VERSION, timeout=timeout, **kwargs)
    client.api.trust_env = False
    client.api._version = client.api._retrieve_server_version()
    return client, where


def why_not_answering(docker_host: str | None = None) -> str | None:
    """None when a Docker engine answers at the explicit address; else what went wrong, in a line."""
    try:
        client, _ = connect(docker_host, timeout=10)
    except Exception as exc:  # noqa: BLE001 - no SDK, no socket, refused, ssh or TLS: each is the cause to say
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
    try:
        client.ping()
        return None
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"[:300]
    finally:
        client.close()


def engine_id(docker_host: str) -> str | None:
    """The engine's own ID (``docker info``), the same whatever address reaches it; None where it
    cannot be had."""
    try:
        client, _ = connect(docker_host, timeout=10)
    except Exception:  # noqa: BLE001 - why_not_answering says why
        return None
    try:
        found = client.info().get("ID")
        return found if isinstance(found, str) and found else None
    except Exception:  # noqa: BLE001
        return None
    finally:
        client.close()


def engine_answers(docker_host: str | None = None) -> bool:
    """True when a Docker engine answers at the explicit address (used by ``--backend auto``)."""
    return why_not_answering(docker_host) is None


def engine_facts(docker_host: str | None = None) -> dict[str, Any]:
    """What ``suite env`` prints and every docker result records; ``error`` when no engine answers."""
    where = daemon(docker_host)
    facts: dict[str, Any] = {"address": where.address, "address_source": where.source, "link": tls_mode(where.address)}
    note = _context_note(where)
    if note:
        facts["context_note"] = note
    try:
        client, _ = connect(docker_host, timeout=15)
    except ImportError:
        return {**facts, "error": "the Docker SDK for Python is not installed (pip install -r requirements/host.txt)"}
    except Exception as exc:  # noqa: BLE001 - reported, not raised: `env` must still print the rest
        return {**facts, "error": f"no Docker engine answers at {where.address}: {exc}"}
    try:
        return {**facts, **_describe(client)}
    except Exception as exc:  # noqa: BLE001
        return {**facts, "error": f"the Docker engine at {where.address} did not describe itself: {exc}"}
    finally:
        client.close()


def _describe(client: Any) -> dict[str, Any]:
    version, info = client.version(), client.info()
    runtimes = sorted(info.get("Runtimes") or {})
    return {
        "version": version.get("Version"),
        "api_version": version.get("ApiVersion"),
        "client_api_version": client.api.api_version,
        "os": info.get("OperatingSystem"),
        "kernel": info.get("KernelVersion"),
        "cpus": info.get("NCPU"),
        "memory_bytes": info.get("MemTotal"),
        "storage_driver": info.get("Driver"),
        "cgroup_version": info.get("CgroupVersion"),
        "runtimes": runtimes,
        "default_runtime": info.get("DefaultRuntime"),
        "nvidia_runtime": "nvidia" in runtimes,
        "cdi_spec_dirs": info.get("CDISpecDirs"),
        "gpu_note": _gpu_note(runtimes, info),
    }


def _gpu_note(runtimes: list[str], info: dict[str, Any]) -> str:
    if "nvidia" in runtimes:
        return "the NVIDIA runtime is registered: GPU points get their GPUs through device requests"
    if info.get("CDISpecDirs"):
        return (
            "no 'nvidia' runtime registered, but CDI is configured; GPU device requests work only if the "
            "NVIDIA Container Toolkit hook is installed on the daemon's host"
        )
    return (
        "no 'nvidia' runtime registered: GPU device requests will fail at container start unless the "
        "NVIDIA Container Toolkit hook is on dockerd's PATH (install nvidia-container-toolkit, run "
        "`nvidia-ctk runtime configure --runtime=docker`, restart dockerd)"
    )


def _context_note(where: Daemon) -> str:
    """A warning when the docker CLI would talk to another daemon than the suite does."""
    if where.source != "default socket":
        return ""
    name = os.environ.get("DOCKER_CONTEXT") or _cli_current_context()
    if name and name != "default":
        return (
            f"the docker CLI's current context is {name!r}, but the suite uses {where.address}; "
            "set DOCKER_HOST (or --docker-host) to that context's address to use it"
        )
    return ""


def _cli_current_context() -> str:
    config = Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "config.json"
    try:
        return str(json.loads(config.read_text(encoding="utf-8")).get("currentContext") or "")
    except (OSError, ValueError):
        return ""
