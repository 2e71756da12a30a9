"""The suite's images on an engine: built from docker/Dockerfile with docker-py, listed, locked.

The catalog (docker/images.yaml), the lock and each build's recipe are ``suite.environment.image_catalog``;
this module is what talks to an engine, and re-exports the catalog's names for its callers.

Each image is the one Dockerfile with other build args; it installs the image's hash-locked
requirements (docker/locks/NAME.txt) with ``pip install --require-hashes``. It is tagged
``REPOSITORY:NAME`` and labelled with a hash of exactly what the build sees (the Dockerfile, the
lock file, the build args), so ``build`` skips an image whose label still matches, and with the
recipe hash, the lock file and its sha256, and the OCI annotations (build time, git revision,
version, title, description, source, base name and digest), so a result can name what it ran in.
Base images are pinned by tag in images.yaml; ``lock`` records their registry digests in
docker/images.lock, and builds then use ``base@digest`` so a moved tag changes nothing.

Where the engine answers the pull of a base with an error (no registry), the image is built on a
base made from Debian packages instead (``suite.environment.debian_base``), with the same lock installed by
this machine's pip; the build says so, and the image's labels record how its base was made.
``lock`` records those bases too (Debian suite, mirror, every package's version), so a later base
made from a mirror that moved on says which packages changed.

Builds stream through the low-level API (``APIClient.build(decode=True)``): the high-level
``images.build`` only returns the log once the build is over. docker-py speaks the classic builder
API (no BuildKit), which the Dockerfile is written for.
"""

from __future__ import annotations

import io
import re
import subprocess
import tarfile
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from suite import paths
from suite.environment import debian_base
from suite.environment.image_catalog import (
    CATALOG,
    DOCKER_DIR,
    LABEL_PREFIX,
    LOCK,
    OCI_PREFIX,
    BuildPlan,
    Catalog,
    ImageDef,
    ImageError,
    UnknownImage,
    label_instruction,
    load_catalog,
    load_lock,
    pinned_base,
    plan_build,
    read_lock,
    recipe_hash,
    repository_of,
)

__all__ = [
    "CATALOG",
    "DOCKER_DIR",
    "LOCK",
    "BuildPlan",
    "Catalog",
    "ImageDef",
    "ImageError",
    "UnknownImage",
    "build_images",
    "image_record",
    "list_images",
    "load_catalog",
    "load_lock",
    "needed_images",
    "pinned_base",
    "plan_build",
    "read_lock",
    "recipe_hash",
]


def needed_images(has_gpus: bool | None = None) -> list[str]:
    """The images an engine's runs use by default: the CPU one, and the GPU one where GPUs are.

    has_gpus: whether the engine's host has GPUs (a remote engine's own inventory); None: this machine's.
    """
    from suite.environment import host_facts

    defaults = load_catalog().defaults
    if has_gpus is None:
        has_gpus = bool(host_facts.gpu_inventory()[0])
    return [defaults["cpu"]] + ([defaults["gpu"]] if has_gpus else [])


def list_images(client: Any = None, docker_host: str | None = None) -> list[dict[str, Any]]:
    """One row per catalog image, with its state on the engine (``built``, ``stale``, ``missing``).

    ``built`` means built by one of its recipes as they stand: on the catalog's base, or on the
    Debian base made where that cannot be pulled (the row's ``built_on`` says which).
    """
    catalog, lock = load_catalog(), load_lock()
    client, problem = _client_or_problem(client, docker_host)
    rows = []
    for name, d in catalog.images.items():
        plans = _routes(catalog, d, lock, None, None)
        row = {
            "name": name,
            "tag": plans[0].tag,
            "tensorflow": d.tensorflow,
            "gpu": d.gpu,
            "cuda": d.cuda or "-",
            "base": d.base,
            "base_digest": (lock.get(d.base) or {}).get("digest", "not locked"),
            "default_for": ",".join(k for k, v in catalog.defaults.items() if v == name) or "-",
        }
        if client:
            row.update(_engine_state(client, plans))
        else:
            row.update({"state": f"unknown ({problem})", "image_id": "-", "built_on": "-"})
        rows.append(row)
    return rows


def _engine_state(client: Any, plans: list[BuildPlan]) -> dict[str, Any]:
    import docker

    try:
        image = client.images.get(plans[0].tag)
    except docker.errors.ImageNotFound:
        return {"state": "missing", "image_id": "-", "built_on": "-"}
    found = _matching(client, plans)
    if found is None:
        return {"state": "stale (recipe changed; rebuild)", "image_id": image.id, "built_on": "-"}
    return {"state": "built", "image_id": image.id, "built_on": f"{_source(found[0])} base"}


def build_images(
    names: list[str] | None = None,
    base_override: Mapping[str, str] | None = None,
    progress: Callable[[str], None] = print,
    *,
    client: Any = None,
    docker_host: str | None = None,
    force: bool = False,
    from_debian: bool | None = None,
) -> list[dict[str, Any]]:
    """Build the named images (all when None), skipping those whose recipe label still matches.

    from_debian: None (the default) builds on the catalog's base, pulled when the engine lacks it,
    and where the engine says the pull failed, on a base made from Debian packages instead
    (``suite.environment.debian_base``); True: on the Debian base without asking a registry; False: never on it.
    An image built either way is up to date under None; under True or False only one built that way.

    Returns one row per image: name, tag, image_id, context_hash, recipe_hash, base (registry | debian |
    override), action (built | up to date). Raises ImageError with the build's last lines when a build fails.
    """
    catalog, locked = load_catalog(), read_lock()
    lock = locked["bases"]
    # Every name is checked before connecting: a typo is reported as such, engine or not.
    defs = [catalog.get(name) for name in names or list(catalog.images)]
    routes = [_routes(catalog, d, lock, base_override, from_debian) for d in defs]
    client = client or _connect(docker_host)
    rows = []
    for d, plans in zip(defs, routes, strict=True):
        found = None if force else _matching(client, plans)
        if found is None:
            recorded = (locked["debian_bases"].get(d.name) or {}).get("packages")
            plan, image_id = _build_one(client, catalog, d, plans, progress, recorded)
            action = "built"
        else:
            plan, image_id = found
            action = "up to date"
        progress(f"{plan.tag}: {action} on a {_source(plan)} base ({image_id[:19]})")
        rows.append(
            {
                "name": d.name,
                "tag": plan.tag,
                "image_id": image_id,
                "context_hash": plan.context_hash,
                "recipe_hash": plan.recipe_hash,
                "base": _source(plan),
                "action": action,
            }
        )
    return rows


def _routes(
    catalog: Catalog,
    d: ImageDef,
    lock: Mapping[str, Mapping[str, str]],
    base_override: Mapping[str, str] | None,
    from_debian: bool | None,
) -> list[BuildPlan]:
    """The recipes an image may be built by, in the order they are tried."""
    if base_override:
        return [plan_build(catalog, d.name, lock, base_override)]
    plans = []
    if from_debian is not True:
        plans.append(plan_build(catalog, d.name, lock))
    if from_debian is not False:
        plans.append(plan_build(catalog, d.name, lock, debian_base=debian_base.recipe_for(d, catalog.root).tag()))
    return plans


def _source(plan: BuildPlan) -> str:
    return plan.labels.get("suite.base.source", "override")


def _build_one(
    client: Any,
    catalog: Catalog,
    d: ImageDef,
    plans: list[BuildPlan],
    progress: Callable[[str], None],
    recorded_packages: Mapping[str, str] | None = None,
) -> tuple[BuildPlan, str]:
    """Build by the first recipe whose base can be had; a registry base that cannot be pulled passes to the next.

    recorded_packages: the Debian packages docker/images.lock recorded for this image's base; a new
    Debian base says which of them moved.
    """
    for i, plan in enumerate(plans):
        last = i == len(plans) - 1
        if _source(plan) == "debian":
            progress(f"building {plan.tag} on a base made from Debian packages, not pulled from a registry")
            debian_base.ensure(client, debian_base.recipe_for(d, catalog.root), progress, recorded_packages)
        try:
            labels = _base_labels(client, plan, progress)
        except BasePullFailed as exc:
            if last:
                raise
            progress(f"{exc}; building the base from Debian packages instead")
            continue
        progress(f"building {plan.tag} (FROM {plan.buildargs['BASE_IMAGE']}, --require-hashes -r {d.lock})")
        return plan, _build(client, plan, {**plan.labels, **labels, **build_labels()}, progress)
    raise AssertionError("an image has at least one recipe")


def build_labels(repo: Path | None = paths.CHECKOUT) -> dict[str, str]:
    """The labels that change from build to build, so they enter no hash: time, git revision, source.

    ``org.opencontainers.image.revision`` is the plain commit; ``suite.source.dirty`` says whether
    tracked files differed from it. Both are left out outside a git checkout, and ``source`` (the
    ``origin`` remote's URL, any user and password removed) where there is no such remote.
    """
    labels = {OCI_PREFIX + "created": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
    if repo is None:  # an installed package: no checkout to name
        return labels
    revision = _git(repo, "rev-parse", "--verify", "HEAD")
    if revision:
        labels[OCI_PREFIX + "revision"] = revision
        dirty = _git(repo, "status", "--porcelain", "--untracked-files=no")
        if dirty is not None:
            labels["suite.source.dirty"] = "true" if dirty else "false"
    remote = _git(repo, "remote", "get-url", "origin")
    if remote:
        labels[OCI_PREFIX + "source"] = without_credentials(remote)
    return labels


def without_credentials(url: str) -> str:
    """A remote's URL without user or password: ``https://user:token@host/x`` -> ``https://host/x``.

    An scp-like address (``git@host:owner/repo``) is no URL and carries no password; it stays as it is.
    """
    parts = urlsplit(url)
    if not parts.scheme or "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def _git(repo: Path, *args: str) -> str | None:
    """git's output for this checkout; None outside a git checkout, without git, or when the command fails."""
    try:
        proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def _matching(client: Any, plans: list[BuildPlan]) -> tuple[BuildPlan, str] | None:
    """The recipe an image on the engine was built by, with its ID, when it is one of ``plans``."""
    import docker

    try:
        image = client.images.get(plans[0].tag)
    except docker.errors.ImageNotFound:
        return None
    built = (image.labels or {}).get("suite.context_hash")
    return next(((plan, image.id) for plan in plans if plan.context_hash == built), None)


def _base_labels(client: Any, plan: BuildPlan, progress: Callable[[str], None]) -> dict[str, str]:
    """The base's image ID, and its registry digest when the lock gave none: pulled here if missing.

    Pulling before the build (rather than letting the builder do it) is what lets the image say
    which base bytes it was built on, even when nothing is locked yet.
    """
    import docker

    ref = plan.buildargs["BASE_IMAGE"]
    try:
        base = client.images.get(ref)
    except docker.errors.ImageNotFound:
        base = _pull(client, ref, progress)
    labels = {"suite.base.id": str(base.id)}
    if not plan.labels["suite.base.digest"]:
        repo = repository_of(ref)
        digests = [d.split("@", 1)[1] for d in base.attrs.get("RepoDigests") or [] if repository_of(d) == repo]
        labels["suite.base.digest"] = digests[0] if digests else ""
    # OCI's base.digest is the registry digest: a base made from Debian packages, or any base only
    # this engine has, has none, and the label is left out (suite.base.id names it locally).
    registry_digest = labels.get("suite.base.digest") or plan.labels["suite.base.digest"]
    if registry_digest:
        labels[OCI_PREFIX + "base.digest"] = registry_digest
    return labels


class BasePullFailed(ImageError):
    """The engine answered a pull of a base image with an error: no registry, or it refused."""


def _pull(client: Any, ref: str, progress: Callable[[str], None]) -> Any:
    import docker

    progress(f"pulling base image {ref}")
    try:
        for event in client.api.pull(ref, stream=True, decode=True):
            if "error" in event:
                raise BasePullFailed(f"the engine cannot pull base image {ref}: {event['error']}")
        return client.images.get(ref)
    except docker.errors.APIError as exc:
        raise BasePullFailed(
            f"the engine cannot pull base image {ref}: {exc.explanation or exc}; build where the registry "
            "answers, load the base with `docker load` first, or build on a Debian base"
        ) from None


ENGINE_COLOUR = re.compile(r"\x1b\[[0-9;]*m")  # an SGR sequence of the build stream


def _build(client: Any, plan: BuildPlan, labels: dict[str, str], progress: Callable[[str], None]) -> str:
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        # The labels go in as one instruction at the end of the Dockerfile: the API's ``labels``
        # makes a build step (a container and a commit) per label.
        files = {**plan.files, "Dockerfile": plan.files["Dockerfile"] + f"\n{label_instruction(labels)}\n".encode()}
        for arcname, data in sorted(files.items()):
            info = tarfile.TarInfo(arcname)
            info.size, info.mode, info.mtime = len(data), 0o644, 0  # fixed metadata: same bytes, same cache
            tar.addfile(info, io.BytesIO(data))
    context.seek(0)
    image_id: str | None = None
    log: list[str] = []
    stream = client.api.build(
        fileobj=context,
        custom_context=True,
        tag=plan.tag,
        buildargs=plan.buildargs,
        rm=True,
        forcerm=True,
        pull=False,
        decode=True,
    )
    for event in stream:
        if "error" in event:
            tail = "".join(log[-30:])
            raise ImageError(f"building {plan.tag} failed: {event['error'].strip()}\n{tail}")
        # The engine colours a step's stderr ("\x1b[91m...\x1b[0m"): the text is kept, not the colour.
        text = ENGINE_COLOUR.sub("", event.get("stream") or event.get("status") or "")
        if text:
            log.append(text if text.endswith("\n") else text + "\n")
            if text.strip():
                progress(text.rstrip("\n"))
        image_id = (event.get("aux") or {}).get("ID", image_id)
    if image_id is None:  # older engines announce the ID only in the stream text
        image_id = client.images.get(plan.tag).id
    return image_id


def debian_record(client: Any, recipe: debian_base.DebianRecipe) -> dict[str, Any] | None:
    """The images.lock entry for the recipe's Debian-made base on the engine, from its labels; None without one."""
    import docker

    try:
        base = client.images.get(recipe.tag())
    except docker.errors.ImageNotFound:
        return None
    labels = base.labels or {}
    return {
        "base": recipe.tag(),
        "image_id": base.id,  # the engine's local ID: another engine importing the same recipe gets another
        "made_at": str((base.attrs or {}).get("Created", "")),  # the day debootstrap took the mirror's versions
        "recipe": labels.get("suite.debian.recipe", ""),
        "suite": labels.get("suite.debian.suite", ""),
        "mirror": labels.get("suite.debian.mirror", ""),
        "packages": debian_base.parse_packages(labels.get("suite.debian.packages", "")),
        "pip_lock": {"file": labels.get("suite.pip.lock.file", ""), "sha256": labels.get("suite.pip.lock.sha256", "")},
    }


def image_record(image: Any) -> dict[str, Any]:
    """What a result records about the image it ran in: ID, digests, the recipe and OCI labels.

    ``recipe_hash``, ``lock_file`` and ``lock_sha256`` are empty for an image built before images
    carried them; ``oci_labels`` holds every ``org.opencontainers.image.*`` label.
    """
    labels = image.labels or {}
    return {
        "image_id": image.id,
        "image_tags": list(image.tags),
        "repo_digests": list(image.attrs.get("RepoDigests") or []),
        "image_created": image.attrs.get("Created"),
        "image_labels": {k: v for k, v in sorted(labels.items()) if k.startswith(LABEL_PREFIX)},
        "oci_labels": {k: v for k, v in sorted(labels.items()) if k.startswith(OCI_PREFIX)},
        "base_ref": labels.get("suite.base.ref", ""),
        "base_digest": labels.get("suite.base.digest", ""),
        "base_id": labels.get("suite.base.id", ""),
        "context_hash": labels.get("suite.context_hash", ""),
        "recipe_hash": labels.get("suite.recipe_hash", ""),
        "lock_file": labels.get("suite.lock.file", ""),
        "lock_sha256": labels.get("suite.lock.sha256", ""),
    }


def _connect(docker_host: str | None) -> Any:
    from suite.environment import docker_engine

    try:
        client, _ = docker_engine.connect(docker_host)
    except Exception as exc:  # noqa: BLE001 - turned into a message that says where and what to do
        raise ImageError(f"no Docker engine answers at {docker_engine.daemon(docker_host).address}: {exc}") from None
    return client


def _client_or_problem(client: Any, docker_host: str | None) -> tuple[Any, str]:
    if client is not None:
        return client, ""
    try:
        return _connect(docker_host), ""
    except ImageError as exc:
        return None, str(exc)
