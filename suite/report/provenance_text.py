"""A result's provenance in words: the code's revision, the lock and the image base as pages and
terminals show them, and how two provenance sections differ."""

from __future__ import annotations

from typing import Any

from suite.record import provenance
from suite.record.code_identity import MAX_DIRTY_PATHS, UNTRACKED
from suite.record.provenance import CHANGED_DURING_RUN, SHORT
from suite.safe.markdown import code as markdown_code


def short(value: Any) -> str:
    """A revision, hash or image ID as shown: its first SHORT hex digits (an ID without ``sha256:``)."""
    if not value:
        return "none"
    return str(value).removeprefix("sha256:")[:SHORT]


def suite_text(suite: dict[str, Any] | None, *, markdown: bool = False, paths: int = 0) -> str:
    """ "1a2b3c4d5e6f", with "+ uncommitted changes (N files, diff sha256 ...)" for a dirty tree.

    ``paths``: how many of the dirty paths to name after the count ("2 files: suite/x.py, README.md"),
    so a reader can tell a README edit from a code change; an untracked file reads "suite/x.py
    (untracked)". ``markdown``: revision, hash and paths as code spans (``suite.safe.markdown.code``:
    a path is user text) for a report; plain text otherwise (a terminal, a table cell).
    """
    if not suite:
        return "not recorded"
    revision = suite.get("git_revision")
    if not revision:
        return "unknown (not a git checkout, or git missing)"
    as_code = markdown_code if markdown else str
    text = as_code(short(revision))
    if suite.get("git_dirty"):
        listed = list(suite.get("dirty_paths") or [])
        n = len(listed)
        more = "+" if n >= MAX_DIRTY_PATHS else ""
        files = f"{n}{more} file{'s' if n != 1 else ''}"
        if paths > 0 and listed:
            named = ", ".join(_path_text(p, as_code) for p in listed[:paths])
            files += f": {named}" + (f" and {n - paths}{more} more" if n > paths else "")
        diff = suite.get("diff_sha256")
        sep = "; " if paths > 0 and listed else ", "
        text += f" + uncommitted changes ({files}" + (f"{sep}diff sha256 {as_code(short(diff))})" if diff else ")")
    elif suite.get("git_dirty") is None:
        text += " (whether the tree had uncommitted changes is unknown)"
    return text


def _path_text(path: str, as_code: Any) -> str:
    if path.endswith(UNTRACKED):
        return f"{as_code(path.removesuffix(UNTRACKED))}{UNTRACKED}"
    return str(as_code(path))


def changed_during_run_text(section: dict[str, Any], *, markdown: bool = False) -> str | None:
    """The checkout at the end of a local run whose checkout changed while it ran (CHANGED_DURING_RUN),
    as ``suite_text`` says it with up to 5 paths; None when it did not change (or was not checked)."""
    at_end = section.get(CHANGED_DURING_RUN)
    return suite_text(at_end, markdown=markdown, paths=5) if at_end else None


NOT_RECORDED = "not recorded"  # a fact a run did not record, however it says why
NO_IMAGE = f"{NOT_RECORDED} (no image was started)"  # the lock of a run that got no image


def lock_text(environment: dict[str, Any] | None, image: dict[str, Any] | None) -> str:
    """ "requirements/locks/run-py3.11.txt ab12cd34ef56", or why there is no lock (``image``: the
    image block of the same section, to tell a run that got no image)."""
    if not environment:
        return "not recorded"
    if environment.get("lock_file") and environment.get("lock_sha256"):
        return f"{environment['lock_file']} {short(environment['lock_sha256'])}"
    return NO_IMAGE if provenance.got_no_image(environment, image) else "not from a lock"


def _tree_text(suite: dict[str, Any]) -> str:
    if suite.get("git_dirty") is None:
        return "unknown"
    if not suite.get("git_dirty"):
        return "clean"
    paths = list(suite.get("dirty_paths") or [])
    shown = ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
    diff = suite.get("diff_sha256")
    return f"uncommitted changes ({shown}" + (f"; diff sha256 {short(diff)})" if diff else ")")


def describe_differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """What differs between a result's provenance and another (here: what would run now), in words.

    Empty when code, lock and image are the same: two revisions whose committed code outside the
    output folders is the same (``code_tree``) count as one. A block one side lacks (a record made before
    provenance was recorded) is said once, not compared field by field.
    """
    lines: list[str] = []
    rs, cs = recorded.get("suite") or {}, current.get("suite") or {}
    if not rs or not cs:
        if rs != cs:
            lines.append(f"suite revision: result {suite_text(rs)}, here {suite_text(cs)}")
    else:
        rr, cr = rs.get("git_revision"), cs.get("git_revision")
        same_code = rs.get("code_tree") is not None and rs.get("code_tree") == cs.get("code_tree")
        if rr != cr and not same_code:  # a commit that only published outputs is the same code
            lines.append(
                f"suite revision: result {short(rr) if rr else 'unknown'}, here {short(cr) if cr else 'unknown'}"
            )
        same_tree = rs.get("git_dirty") == cs.get("git_dirty") and rs.get("diff_sha256") == cs.get("diff_sha256")
        if not same_tree:
            rt, ct = _tree_text(rs), _tree_text(cs)
            if rs.get("git_dirty") and cs.get("git_dirty"):
                ct = "other " + ct
            verb = {True: "had ", False: "was ", None: "was "}[rs.get("git_dirty")]
            lines.append(f"suite tree: the result's {verb}{rt}, here {ct}")
    lines += _environment_differences(
        (recorded.get("environment") or {}, recorded.get("image")),
        (current.get("environment") or {}, current.get("image")),
    )
    lines += _image_differences(recorded.get("image"), current.get("image"))
    return lines


def _environment_differences(
    recorded: tuple[dict[str, Any], dict[str, Any] | None], current: tuple[dict[str, Any], dict[str, Any] | None]
) -> list[str]:
    """What differs between two (environment, image) blocks' environments."""
    (re_, _), (ce, _) = recorded, current
    locks = f"environment lock: result {lock_text(*recorded)}, here {lock_text(*current)}"
    if not re_ or not ce:
        return [] if re_ == ce else [locks]
    lines = []
    if re_.get("kind") != ce.get("kind"):
        lines.append(f"environment: result {re_.get('kind')}, here {ce.get('kind')}")
    if (re_.get("lock_file"), re_.get("lock_sha256")) != (ce.get("lock_file"), ce.get("lock_sha256")):
        lines.append(locks)
    said = {
        "result": "installed packages of the result differed from its lock",
        "here": "installed packages here differ from the lock",
    }
    same_drift = (
        re_.get("matches_lock") is False
        and ce.get("matches_lock") is False
        and re_.get("lock_differences") == ce.get("lock_differences")
    )
    for who, env in (("result", re_), ("here", ce)):
        if env.get("matches_lock") is False and not same_drift:
            lines.append(f"{said[who]}: {'; '.join(env.get('lock_differences') or [])}")
    return lines


def _image_differences(ri: dict[str, Any] | None, ci: dict[str, Any] | None) -> list[str]:
    if not ri and not ci:
        return []
    if not ri or not ci:
        return [f"image: result {_image_text(ri)}, here {_image_text(ci)}"]
    lines = []
    rr, cr = ri.get("recipe_hash"), ci.get("recipe_hash")
    if rr != cr:
        lines.append(f"image recipe: result {short(rr) if rr else 'not recorded'}, here {short(cr) if cr else 'none'}")
    if ri.get("id") != ci.get("id"):
        same = " (the same recipe: built again)" if rr and rr == cr and ri.get("id") and ci.get("id") else ""
        lines.append(f"image ID: result {short(ri.get('id'))}, here {short(ci.get('id'))}{same}")
    if _base_known(ri) and _base_known(ci) and _base_key(ri) != _base_key(ci):
        lines.append(f"{BASE_DIFFERS}result {base_text(ri)}, here {base_text(ci)}")
    return lines


BASE_DIFFERS = "image base: "  # the line ``describe_differences`` gives when two images' bases differ


def _base_known(image: dict[str, Any]) -> bool:
    return bool(image.get("base_id") or image.get("base_digest"))


def _base_key(image: dict[str, Any]) -> tuple[Any, ...]:
    """What makes two bases the same: the registry digest when both have one, the image ID on the
    build machine otherwise (a pulled base has the same ID everywhere; a Debian-made base is its
    own build, whose ID differs from any other's)."""
    return (image.get("base_source"), image.get("base_digest") or None, image.get("base_id") or None)


def base_text(image: dict[str, Any] | None, *, markdown: bool = False) -> str:
    """An image's base in words: "registry docker.io/library/python:3.11-slim@sha256:... (ID ...)",
    "Debian packages, made on the build machine: suite-base:... (ID ...)", or "not recorded"."""
    if not image or not (_base_known(image) or image.get("base_name")):
        return "not recorded"
    as_code = markdown_code if markdown else str
    name, digest, base_id = image.get("base_name"), image.get("base_digest"), image.get("base_id")
    ref = str(name or "?")
    if digest and "@" not in ref:
        ref += f"@{digest}"
    source = image.get("base_source")
    lead = {"registry": "registry ", "debian": "Debian packages, made on the build machine: "}.get(str(source), "")
    notes = [f"ID {as_code(short(base_id))}"] if base_id else []
    if not source:
        notes.append("how it was obtained is not recorded")
    return lead + as_code(ref) + (f" ({'; '.join(notes)})" if notes else "")


def digest_text(image: dict[str, Any], digests_recorded: bool) -> str:
    """The image's registry digest, "none (built locally, not pushed)" when the engine knew none
    (RepoDigests empty), "not recorded" for a record made before runs recorded the digests (its
    ``run`` section has no ``repo_digests``: ``digests_recorded`` False)."""
    if image.get("digest"):
        return str(image["digest"])
    return "none (built locally, not pushed)" if digests_recorded else "not recorded"


def _image_text(image: dict[str, Any] | None) -> str:
    if not image:
        return "none"
    return f"{image.get('name') or '?'} (ID {short(image.get('id'))})"


def gpu_text(gpu: dict[str, Any], detail: str) -> str:
    """ "NVIDIA H100 (81559 MiB, driver 550.54)", ``detail`` its memory (``memory_mib``) or its
    ``uuid``: a fact recorded as null (nvidia-smi's "[N/A]") or not at all says so, never "None"."""
    name, driver, value = gpu.get("name"), gpu.get("driver"), gpu.get(detail)
    what = "memory" if detail == "memory_mib" else "UUID"
    shown = f"{what} {NOT_RECORDED}" if value is None else f"{value} MiB" if detail == "memory_mib" else str(value)
    return f"{NOT_RECORDED if name is None else name} ({shown}, driver {NOT_RECORDED if driver is None else driver})"
