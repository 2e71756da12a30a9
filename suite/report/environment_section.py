"""The Environment section of a machine's part of a scenario page: the host, its GPUs, the versions,
the data, what changed from the scenario file, and where the code, its packages and image came from."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar

import orjson

from suite.record import provenance
from suite.record.results import (
    DATA_DETAIL,
    DATA_SOURCE,
    ENV_GPUS,
    ENV_HOST,
    ENV_VERSIONS,
    FLOPS_COUNTED,
    RUN_BACKEND,
    RUN_IMAGE,
)
from suite.report import provenance_text
from suite.report.points import ScenarioView
from suite.report.reasons import merged_reasons
from suite.report.up_to_date import ScenarioFiles
from suite.safe.markdown import cell, code
from suite.spec.plan import override_flag
from suite.spec.setting_paths import value_at

T = TypeVar("T")


def environment_lines(view: ScenarioView, files: ScenarioFiles | None = None) -> list[str]:
    """The Environment section's lines; ``files``: the scenario files as this report reads them
    (report/up_to_date; default: read for this page), where a smoke run's settings are named."""
    r = view.newest
    env, run = r.environment, r.run
    host, versions = env.get(ENV_HOST.key, {}), env.get(ENV_VERSIONS.key, {})
    lines = [
        f"- Machine: {code(view.machine)}, backend "
        + (code(run[RUN_BACKEND.key]) if run.get(RUN_BACKEND.key) else "not recorded")
        + (f", image {code(run[RUN_IMAGE.key])}" if run.get(RUN_IMAGE.key) else "")
    ]
    if env:
        lines += [
            f"- CPU: {cell(host.get('cpu_model', '?'))}, {cell(host.get('cpu_count', '?'))} logical cores",
            f"- GPUs: {cell(_gpu_text(view))}",
            f"- Python {cell(host.get('python', '?'))}, TensorFlow {cell(versions.get('tensorflow', '-'))}, "
            f"Keras {cell(versions.get('keras', '?'))} (backend {cell(versions.get('keras_backend', '?'))}), "
            + _cuda_text(versions),
        ]
    else:
        reasons = merged_reasons([x.message for p in view.points for x in p.runs if x.message])
        lines.append(
            "- CPU, GPUs and versions: not recorded, as no run reached the worker here"
            + (f" ({cell('; '.join(reasons))})" if reasons else "")
        )
    lines += _provenance_lines(view)
    lines.append(f"- Data: {_data_text(view)}")
    if view.smoke:
        lines.append(_smoke_line(view, files or ScenarioFiles()))
    counted = sorted(
        {str(x.work[FLOPS_COUNTED.key]) for p in view.points for x in p.ok_runs if FLOPS_COUNTED.key in x.work}
    )
    if counted:
        lines.append(f"- FLOPs per example counted as: {cell('; '.join(counted))}")
    if view.overrides:
        lines.append(f"- Changed from the scenario file (every point): {set_flags(view.overrides)}")
    lines += [f"- Also on file: {cell(o)}" for o in view.other_sizes]
    return lines


def _cuda_text(versions: dict[str, Any]) -> str:
    """The CUDA and cuDNN versions TensorFlow was built for, or that it was built without CUDA."""
    if not versions.get("tf_cuda_build") and versions.get("tf_built_with_cuda") is False:
        return "TensorFlow built without CUDA"
    cuda, cudnn = versions.get("tf_cuda_build") or "not recorded", versions.get("tf_cudnn_build") or "not recorded"
    return f"CUDA/cuDNN built for: {cell(cuda)}/{cell(cudnn)}"


# What the worker records of synthetic data (worker/data): the words the line below says already.
SYNTHETIC_DETAIL = re.compile(r"synthetic, same shapes as MNIST \((?P<why>.*)\)", re.S)


def _data_text(view: ScenarioView) -> str:
    """Where the data came from, each source once; synthetic data in bold, with why the real data
    was not used (the detail of the first point that had it)."""
    sources = sorted({p.ok_runs[0].quality.get(DATA_SOURCE.key, "?") for p in view.points if p.ok_runs})
    if not sources:
        return "no run completed"
    words = [cell(s) for s in sources if s != "synthetic"]
    if "synthetic" in sources:
        detail = next(
            str(p.ok_runs[0].quality.get(DATA_DETAIL.key) or "")
            for p in view.points
            if p.ok_runs and p.ok_runs[0].quality.get(DATA_SOURCE.key) == "synthetic"
        )
        why = found.group("why") if (found := SYNTHETIC_DETAIL.fullmatch(detail)) else detail
        words.append("**synthetic** (MNIST's shapes, not its digits" + (f"; {cell(why)})" if why else ")"))
    return ", ".join(words)


# What a smoke block sets at the least, where the scenario file cannot say which settings it has.
SIZE_SETTINGS = ("data.train_samples", "data.test_samples", "training.epochs")


def caveat(view: ScenarioView) -> str:
    """A sentence that belongs above a view's numbers, or "": smoke size and synthetic data, which
    the Environment lines detail, said where a reader starts."""
    smoke = view.smoke
    synthetic = any(r.quality.get(DATA_SOURCE.key) == "synthetic" for p in view.points for r in p.ok_runs)
    if smoke and synthetic:
        return (
            "**Smoke size, on synthetic digits**: a check that the scenario runs, not a measurement; the test "
            "accuracy says nothing of MNIST (see Environment)."
        )
    if smoke:
        return "**Smoke size**: a check that the scenario runs, not a measurement (see Environment)."
    if synthetic:
        return (
            "**Trained on synthetic digits** (MNIST's shapes, not its digits): the times are of the same "
            "shapes and work; the test accuracy says nothing of MNIST (see Environment)."
        )
    return ""


def _smoke_line(view: ScenarioView, files: ScenarioFiles) -> str:
    """What a smoke run changed: each setting of the scenario file's ``smoke`` block (as the file is
    now), with the value the runs record; a setting ``--set`` changed is on its own line. Where the
    file cannot be read, or is another scenario's, the sizes the runs record."""
    found = files.scenario(view.spec)
    configs = [p.runs[0].spec.get("config") for p in view.points if p.runs]
    described = view.spec.get("report", {}).get("description")
    full = ", not at the full size the description above gives" if described else ""
    end = "; a check that it runs, not a measurement"
    if found is None or found.name != view.scenario:
        settings = ", ".join(_setting_text(configs, key) for key in SIZE_SETTINGS)
        return (
            f"- **Smoke size**: the runs used {settings}{full} (the scenario file they name, which lists every "
            f"`smoke` setting, cannot be read or is another scenario's){end}"
        )
    if not found.smoke:
        # Smoke runs each point once unless --repeats asked for more: say what the runs on file did.
        # (Under repeats: auto on a pool, a folder may hold one run of a point whose others are elsewhere.)
        counts = {len({r.spec.get("repetition") for r in p.runs}) for p in view.points if p.runs}
        if any(p.auto for p in view.points):
            runs = "the runs `--repeats auto` asked for"
        else:
            runs = "one run of each point" if counts == {1} else "the runs `--repeats` asked for"
        return f"- **Smoke size**: {runs}; the scenario has no `smoke` settings{end}"
    keys = [key for key in found.smoke if key not in view.overrides]
    if not keys:
        return f"- **Smoke size**: every `smoke` setting of the scenario was changed with `--set` (below){end}"
    settings = ", ".join(_setting_text(configs, key, found.smoke[key]) for key in keys)
    return f"- **Smoke size**: the scenario's `smoke` settings ({settings}){full}{end}"


_MISSING = object()  # a setting a config does not hold (null is a value)


def _setting_text(configs: list[Any], path: str, expected: Any = _MISSING) -> str:
    """The value the runs' configs hold at ``path`` (``model.dense``, ``model.hidden.0``), as
    ``--set`` takes it; or that they differ, or that none holds it. ``expected``: the value the
    scenario file sets there now, said beside where the runs used another."""
    texts: list[str] = []
    for config in configs:
        value = value_at(config, path, _MISSING)
        if value is not _MISSING and (text := override_flag(path, value)) not in texts:
            texts.append(text)
    if len(texts) != 1:
        return f"{code(path)} {'varies by point' if texts else 'not recorded'}"
    if expected is not _MISSING and (now := override_flag(path, expected)) != texts[0]:
        return f"{code(texts[0])} (the file, edited since, now says {code(now)})"
    return code(texts[0])


def _provenance_lines(view: ScenarioView) -> list[str]:
    """The suite revision, environment lock and image the page's runs came from: one value each, or
    every value with its number of runs when the runs do not all share it (never the newest alone)."""
    runs = view.provenance_runs
    # What an image's text reads of its run: whether the run recorded the registry digests.
    each = _each(
        [(provenance.of_result(r.provenance, r.run), "repo_digests" in r.run) for r in runs],
        lambda pair: _provenance_texts(*pair),
    )
    lines = [
        _provenance_line("Suite revision", "suite revisions", [t[0] for t in each]),
        _provenance_line("Environment lock", "environment locks", [t[1] for t in each]),
    ]
    changed = [t[2] for t in each if t[2]]
    if changed:
        lines.append(_changed_line(changed, len(runs)))
    images = [t[3] for t in each if t[3] is not None]
    if images:
        lines.append(_provenance_line("Image", "images", images))
    return lines


def _provenance_texts(section: dict[str, Any], digests_recorded: bool) -> tuple[str, str, str | None, str | None]:
    """A run's suite revision, environment lock, change during the run and image, as the page writes them."""
    image = section.get("image")
    return (
        provenance_text.suite_text(section.get("suite"), markdown=True, paths=5),
        _lock_md(section.get("environment"), image),
        provenance_text.changed_during_run_text(section, markdown=True),
        _image_md(image, digests_recorded) if image else None,
    )


def _each(values: list[Any], text: Callable[[Any], T]) -> list[T]:
    """``text`` of each value, worked out once for each distinct one: the thousands of runs of a
    page share a few revisions and locks."""
    done: dict[bytes, T] = {}
    out: list[T] = []
    for value in values:
        try:
            key = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        except TypeError:  # not JSON (never from a record): worked out on its own
            out.append(text(value))
            continue
        if key not in done:
            done[key] = text(value)
        out.append(done[key])
    return out


def _changed_line(at_end: list[str], total: int) -> str:
    """Local runs whose checkout changed between their launch and their end: the suite revision
    line gives their code at launch; they may have imported some of the code at their end."""
    n = f"{len(at_end)} of {total} run{'s' if total != 1 else ''}"
    ends = "; ".join(dict.fromkeys(at_end))
    return f"- **The suite's code changed while {n} ran** (above: the code at launch); at the end: {ends}"


def _provenance_line(label: str, plural: str, values: list[str]) -> str:
    """One value, or each value with its number of runs: the known ones first, by their count, then
    those not recorded, which are listed but not counted as one more revision or lock."""
    counts: dict[str, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    if len(counts) == 1:
        return f"- {label}: {values[0]}"
    known = sum(not v.startswith(provenance_text.NOT_RECORDED) for v in counts)
    order = sorted(counts.items(), key=lambda c: (c[0].startswith(provenance_text.NOT_RECORDED), -c[1]))
    listed = "; ".join(f"{v} ({n} run{'s' if n != 1 else ''})" for v, n in order)
    return f"- {label}: " + (f"runs on this page came from {known} {plural}: {listed}" if known > 1 else listed)


def _lock_md(environment: dict[str, Any] | None, image: dict[str, Any] | None) -> str:
    """The lock of a section's ``environment`` in words (``image``: the same section's)."""
    if not environment:
        return "not recorded"
    differences = environment.get("lock_differences") or []
    lock_file, sha = environment.get("lock_file"), environment.get("lock_sha256")
    if not (lock_file and sha):
        if provenance.got_no_image(environment, image):
            return provenance_text.NO_IMAGE
        why = provenance.no_lock_reason(differences)
        return "not from a lock" + (f" ({cell(why)})" if why else "")
    text = f"{code(lock_file)} (sha256 {code(provenance_text.short(sha))})"
    if environment.get("matches_lock") is False:
        text += f"; installed packages differ from the lock: {cell('; '.join(differences))}"
    elif environment.get("matches_lock") is None and differences:
        text += f"; not checked against it: {cell('; '.join(differences))}"
    return text


def _image_md(image: dict[str, Any], digests_recorded: bool) -> str:
    """ID, digest, recipe hash and base. An image the engine knows no registry digest of (RepoDigests
    empty: built on the engine, never pushed or pulled) says so; a record made before runs recorded
    the digests (``digests_recorded`` False) says that instead. The base: one recipe built on another
    base is another image (other OS libraries, another Python build)."""
    recipe, digest = image.get("recipe_hash"), image.get("digest")
    digest_text = code(digest) if digest else provenance_text.digest_text(image, digests_recorded)
    return (
        f"ID {code(provenance_text.short(image.get('id')))}, digest {digest_text}, recipe "
        + (code(provenance_text.short(recipe)) if recipe else "not recorded (built before images carried one)")
        + f", base: {provenance_text.base_text(image, markdown=True)}"
    )


def set_flags(overrides: dict[str, Any], in_table: bool = False) -> str:
    """The ``--set`` flags of ``overrides``, each a code span (``in_table``: inside a table cell)."""
    return " ".join(code(f"--set {override_flag(k, v)}", in_table) for k, v in overrides.items())


def _gpu_text(view: ScenarioView) -> str:
    """The GPUs the GPU points ran on, from those runs' own records; never a CPU run's view."""
    seen: dict[str, None] = {}
    for r in view.gpu_runs:
        for g in ENV_GPUS.of(r) or []:
            seen[provenance_text.gpu_text(g, "memory_mib")] = None
    if seen:
        return ", ".join(seen)
    if any(p.device.startswith("gpu") for p in view.points):
        return "none: no GPU point ran"
    return "none used (no GPU point among these runs)"
