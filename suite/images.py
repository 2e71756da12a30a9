"""The suite's images on an engine: built from docker/Dockerfile with docker-py, listed, locked.

The catalog (docker/images.yaml), the lock and each build's recipe are ``suite.image_catalog``;
this module is what talks to an engine, and re-exports the catalog's names for its callers.

Each image is the one Dockerfile with other build args. It is tagged ``REPOSITORY:NAME`` and
labelled with a hash of exactly what the build sees (the Dockerfile, the constraints file, the
build args), so ``build`` skips an image whose label still matches and a result can name the
recipe it ran in. Base images are pinned by tag in images.yaml; ``lock`` records their registry
digests in docker/images.lock, and builds then use ``base@digest`` so a moved tag changes nothing.

Where the engine answers the pull of a base with an error (no registry), the image is built on a
base made from Debian packages instead (``suite.debian_base``), with its requirements installed by
this machine's pip; the build says so, and the image's labels record how its base was made.

Builds stream through the low-level API (``APIClient.build(decode=True)``): the high-level
``images.build`` only returns the log once the build is over. docker-py speaks the classic builder
API (no BuildKit), which the Dockerfile is written for.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from suite import debian_base
from suite.image_catalog import (
    CATALOG,
    DOCKER_DIR,
    LABEL_PREFIX,
    LOCK,
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
    repository_of,
    write_lock,
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
    "lock_images",
    "needed_images",
    "pinned_base",
    "plan_build",
]


def needed_images(has_gpus: bool | None = None) -> list[str]:
    """The images an engine's runs use by default: the CPU one, and the GPU one where GPUs are.

    has_gpus: whether the engine's host has GPUs (a remote engine's own inventory); None: this machine's.
    """
    from suite import hostinfo

    defaults = load_catalog().defaults
    if has_gpus is None:
        has_gpus = bool(hostinfo.gpu_inventory()[0])
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
    (``suite.debian_base``); True: on the Debian base without asking a registry; False: never on it.
    An image built either way is up to date under None; under True or False only one built that way.

    Returns one row per image: name, tag, image_id, context_hash, base (registry | debian | override),
    action (built | up to date). Raises ImageError with the build's last lines when a build fails.
    """
    catalog, lock = load_catalog(), load_lock()
    # Every name is checked before connecting: a typo is reported as such, engine or not.
    defs = [catalog.get(name) for name in names or list(catalog.images)]
    routes = [_routes(catalog, d, lock, base_override, from_debian) for d in defs]
    client = client or _connect(docker_host)
    rows = []
    for d, plans in zip(defs, routes, strict=True):
        found = None if force else _matching(client, plans)
        if found is None:
            plan, image_id = _build_one(client, d, plans, progress)
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
        plans.append(plan_build(catalog, d.name, lock, debian_base=debian_base.recipe_for(d).tag()))
    return plans


def _source(plan: BuildPlan) -> str:
    return plan.labels.get("suite.base.source", "override")


def _build_one(
    client: Any, d: ImageDef, plans: list[BuildPlan], progress: Callable[[str], None]
) -> tuple[BuildPlan, str]:
    """Build by the first recipe whose base can be had; a registry base that cannot be pulled passes to the next."""
    for i, plan in enumerate(plans):
        last = i == len(plans) - 1
        if _source(plan) == "debian":
            progress(f"building {plan.tag} on a base made from Debian packages, not pulled from a registry")
            debian_base.ensure(client, debian_base.recipe_for(d), progress)
        try:
            labels = _base_labels(client, plan, progress)
        except BasePullFailed as exc:
            if last:
                raise
            progress(f"{exc}; building the base from Debian packages instead")
            continue
        progress(f"building {plan.tag} (FROM {plan.buildargs['BASE_IMAGE']}, {plan.buildargs['TF_REQUIREMENT']})")
        return plan, _build(client, plan, {**plan.labels, **labels}, progress)
    raise AssertionError("an image has at least one recipe")


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
    image_id, log = None, []
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
        text = event.get("stream") or event.get("status") or ""
        if text:
            log.append(text if text.endswith("\n") else text + "\n")
            if text.strip():
                progress(text.rstrip("\n"))
        image_id = (event.get("aux") or {}).get("ID", image_id)
    if image_id is None:  # older engines announce the ID only in the stream text
        image_id = client.images.get(plan.tag).id
    return image_id


def lock_images(
    names: list[str] | None = None,
    progress: Callable[[str], None] = print,
    *,
    client: Any = None,
    docker_host: str | None = None,
    path: Path = LOCK,
) -> dict[str, dict[str, str]]:
    """Ask the registry for each base tag's digest and write docker/images.lock.

    Needs a daemon that reaches the registry. Bases that fail keep their previous entry, and the
    error lists them; the others are written first so a partial lock is not lost.
    """
    catalog = load_catalog()
    # Names are checked before connecting, so a typo is reported as such, engine or not.
    bases = sorted({catalog.get(n).base for n in (names or list(catalog.images))})
    client = client or _connect(docker_host)
    lock, failures = load_lock(path), []
    for base in bases:
        try:
            digest = client.images.get_registry_data(base).id
        except Exception as exc:  # noqa: BLE001 - listed below with the engine's words
            failures.append(f"{base}: {exc}")
            progress(f"{base}: no digest ({exc})")
            continue
        lock[base] = {"digest": digest, "locked_at": datetime.now(UTC).isoformat(timespec="seconds")}
        progress(f"{base}: {digest}")
    write_lock(path, lock)
    if failures:
        listed = "\n  ".join(failures)
        raise ImageError(f"could not lock every base image (does the daemon reach the registry?):\n  {listed}")
    return lock


def image_record(image: Any) -> dict[str, Any]:
    """What a result records about the image it ran in: ID, digests, and the recipe labels."""
    labels = image.labels or {}
    return {
        "image_id": image.id,
        "image_tags": list(image.tags),
        "repo_digests": list(image.attrs.get("RepoDigests") or []),
        "image_created": image.attrs.get("Created"),
        "image_labels": {k: v for k, v in sorted(labels.items()) if k.startswith(LABEL_PREFIX)},
        "base_ref": labels.get("suite.base.ref", ""),
        "base_digest": labels.get("suite.base.digest", ""),
        "base_id": labels.get("suite.base.id", ""),
        "context_hash": labels.get("suite.context_hash", ""),
    }


def _connect(docker_host: str | None) -> Any:
    from suite import engine

    try:
        client, _ = engine.connect(docker_host)
    except Exception as exc:  # noqa: BLE001 - turned into a message that says where and what to do
        raise ImageError(f"no Docker engine answers at {engine.daemon(docker_host).address}: {exc}") from None
    return client


def _client_or_problem(client: Any, docker_host: str | None) -> tuple[Any, str]:
    if client is not None:
        return client, ""
    try:
        return _connect(docker_host), ""
    except ImageError as exc:
        return None, str(exc)
