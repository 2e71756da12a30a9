"""``python -m suite show RESULT.json``: one result file, readable, or its record after migration.

Everything here reads the record through ``results.load``, so an old record is shown as the
current schema describes it, and a file that is not a result is refused with its name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from suite.record import provenance, results, under_load
from suite.record.results import ENV_GPUS, ENV_HOST, ENV_VERSIONS, RunResult
from suite.report import provenance_text
from suite.report.figures import RUN_TIMINGS, peak_of
from suite.safe.console import fitted

LOG_LINES = 20  # of a failed run's log tail
VALUE_COLUMN = len("fingerprint:  ")  # where a fact's value starts, and its wrapped lines
RUN_KEYS = ("backend", "machine", "image", "image_id", "started_at", "finished_at")


def load(path: Path) -> RunResult:
    """The result in ``path``; ResultError naming the file when it is missing or not a result."""
    if not path.exists():
        raise results.ResultError(f"{path}: no such file")
    if not path.is_file():
        raise results.ResultError(f"{path}: not a file; show takes one result file (.json)")
    return results.load(path)


def raw(result: RunResult) -> str:
    """The record as JSON, after schema migration (what a tool of the user's should read)."""
    return json.dumps(result.to_dict(), indent=1, sort_keys=True, allow_nan=False) + "\n"


def render(path: Path, result: RunResult) -> str:
    return "\n".join(render_lines(path, result)) + "\n"


def render_lines(path: Path, result: RunResult) -> list[str]:
    """The lines ``render`` writes, each one line of output within 120 columns (a long fact goes on
    under its value, ``console.fitted``): a value from the record that holds a line break stays
    inside its line (the command writes control characters as escapes), so no record can add lines
    of its own (a forged ``status:``)."""
    spec, run = result.spec, result.run
    lines = [
        f"{path}",
        f"status:       {result.status}" + (f": {result.message.splitlines()[0]}" if result.message else ""),
        f"scenario:     {spec.get('scenario')}, point {spec.get('point_label')}, "
        f"repetition {spec.get('repetition', 0)}{' (smoke size)' if spec.get('smoke') else ''}",
        f"fingerprint:  {result.fingerprint}",
        f"schema:       version {result.schema_version}",
        "run:          " + _pairs({k: run.get(k) for k in RUN_KEYS}),
        "spec:",
        *[f"  {k}: {_value(v)}" for k, v in _flatten(spec.get("config") or {})],
        "timing (s):",
        *[f"  {k}: {_value(result.timing[k])}" for k in RUN_TIMINGS if result.timing.get(k) is not None],
        "quality:      "
        + _pairs({k: result.quality.get(k) for k in ("test_accuracy", "test_loss", "final_loss", "data_source")}),
        "work:         " + _pairs(_work(result)),
        "telemetry:",
        *_telemetry(result.telemetry),
        "load:",
        *_load(result),
        "environment:  " + _pairs(_environment(result)),
        "provenance:",
        *_provenance(result),
    ]
    if not result.ok and result.log_tail:
        lines += ["log tail:", *[f"  {line}" for line in result.log_tail.splitlines()[-LOG_LINES:]]]
    return [part for line in lines for part in fitted(line, VALUE_COLUMN)]


def _work(r: RunResult) -> dict[str, Any]:
    return {
        "flops_per_example_train": r.work.get("flops_per_example_train"),
        "achieved_flops_per_s": r.work.get("achieved_flops_per_s"),
        "peak_flops_per_s": peak_of(r),
        "parameters": r.work.get("parameters"),
    }


def _environment(r: RunResult) -> dict[str, Any]:
    host, versions = r.environment.get(ENV_HOST.key, {}), r.environment.get(ENV_VERSIONS.key, {})
    gpus = [provenance_text.gpu_text(g, "uuid") for g in ENV_GPUS.of(r) or []]
    return {
        "python": host.get("python"),
        "tensorflow": versions.get("tensorflow"),
        "keras": versions.get("keras"),
        "keras_backend": versions.get("keras_backend"),
        "cuda_build": versions.get("tf_cuda_build"),
        "cudnn_build": versions.get("tf_cudnn_build"),
        "cpu": host.get("cpu_model"),
        "cpu_count": host.get("cpu_count"),
        "gpus": "; ".join(gpus) or None,
        "devices_used": ", ".join(r.environment.get("devices_used") or []) or None,
    }


def _provenance(result: RunResult) -> list[str]:
    """The code, lock and image the result came from, every hash in full (what a rerun checks against).

    A record made before results carried the section is read as reports read it
    (``provenance.of_result``): a Docker run's recorded image facts still name its image and lock."""
    section = provenance.of_result(result.provenance, result.run)
    suite, environment, image = section.get("suite") or {}, section.get("environment") or {}, section.get("image")
    if not (suite or environment or image):
        return ["  not recorded (a result made before the suite recorded it)"]
    old = "  (a record made before results carried provenance: read from its recorded image facts)"
    lines = [] if result.provenance else [old]
    lines.append("  suite:        " + (provenance_text.suite_text(suite) if suite else "not recorded"))
    if suite:
        suite_keys = ("version", "git_revision", "git_dirty", "diff_sha256", "code_tree")
        lines.append("    " + _pairs({k: suite.get(k) for k in suite_keys}))
        if suite.get("dirty_paths"):
            lines.append("    dirty paths: " + ", ".join(suite["dirty_paths"]))
    changed = provenance_text.changed_during_run_text(section)
    if changed:
        lines.append(f"  changed while it ran: the suite above is the code at launch; at the end: {changed}")
    lines.append(
        "  environment:  " + (provenance_text.lock_text(environment, image) if environment else "not recorded")
    )
    if environment:
        keys = ("kind", "lock_file", "lock_sha256", "matches_lock")
        lines.append("    " + _pairs({k: environment.get(k) for k in keys}))
        lines += [f"    {line}" for line in environment.get("lock_differences") or []]
    if image:
        named = _pairs({k: image.get(k) for k in ("name", "id")})
        lines.append(
            f"  image:        {named}, digest {provenance_text.digest_text(image, 'repo_digests' in result.run)}"
        )
        lines.append("    " + _pairs({k: image.get(k) for k in ("recipe_hash", "context_hash")}))
        lines.append("    base: " + provenance_text.base_text(image))
        if provenance_text.base_text(image) != "not recorded":
            lines.append("    " + _pairs({k: image.get(k) for k in provenance.BASE_KEYS}))
    else:
        lines.append("  image:        none")
    if section.get("error"):
        lines.append(f"  error: {section['error']}")
    return lines


def _telemetry(section: dict[str, Any]) -> list[str]:
    """Per metric: the steady, fit and whole-run summaries; per source: what it achieved."""
    if not section:
        return ["  not recorded"]
    lines = []
    for m in section.get("metrics") or []:
        summary = m.get("summary") or {}
        parts = []
        in_gib = m.get("unit") == "bytes"  # memory reads better in GiB, as the report shows it
        for window in ("steady", "fit", "run"):
            s = summary.get(window)
            if not s:
                continue
            stat = [
                f"{k} {s[k] / 2**30:.2f}" if in_gib and k != "n" else f"{k} {_value(s[k])}"
                for k in ("mean", "p95", "max", "n")
                if s.get(k) is not None
            ]
            stat += [f"{reason} {share:.0%}" for reason, share in (s.get("reasons") or {}).items()]
            parts.append(f"{window}: {', '.join(stat)}")
        device = f" [{m['device']}]" if m.get("device") else ""
        unit = "GiB" if in_gib else m.get("unit", "?")
        lines.append(f"  {m.get('name')}{device} ({unit}): " + ("; ".join(parts) or "no summary"))
    for src in section.get("sources") or []:
        lines.append("  source " + _pairs({k: src.get(k) for k in ("name", "method", "samples", "rate_hz", "error")}))
    return lines or ["  no samples"]


def _load(result: RunResult) -> list[str]:
    """The machine's load around the run (``under_load.load_of``), and the warning when it was busy."""
    block, load = results.LOAD.of(result), under_load.load_of(result)
    if load is None or not isinstance(block, dict):
        return ["  not recorded (a remote engine's run, or a result made before the suite recorded it)"]
    window = "over the timed fit" if load.window == "fit" else "over the whole run"

    def avg(values: list[float] | None) -> str:
        return "?" if not values else f"{values[0]:.2f}"

    lines = [
        "  other processes: "
        + ("not measured" if load.other_cores is None else f"{under_load.cores_text(load.other_cores)} {window}")
        + (
            f" ({under_load.cores_text(block['other_cores'])} over the whole run)"
            if load.window == "fit" and block.get("other_cores") is not None
            else ""
        )
        + "; steal: "
        + ("?" if load.steal_share is None else f"{load.steal_share:.1%}"),
        f"  load average (1 min): {avg(load.loadavg_start)} at the start, {avg(load.loadavg_end)} at the end, "
        f"on {load.cores or '?'} cores; everything that ran (the run included): "
        + ("?" if block.get("machine_busy_cores") is None else under_load.cores_text(block["machine_busy_cores"])),
    ]
    top = block.get("top_others") or []
    if top:
        named = [f"{p.get('name')} (pid {p.get('pid')}) {under_load.cores_text(p['cores'])}" for p in top]
        lines.append("  most: " + "; ".join(named))
    if load.gpu_checked:
        gpus = [
            f"{p.get('name') or '?'} (pid {p.get('pid')})"
            + (f" {p['used_memory_bytes'] / 2**30:.2f} GiB" if p.get("used_memory_bytes") else "")
            for p in load.gpu_others
        ]
        lines.append("  other processes on its GPUs: " + ("; ".join(gpus) or "none"))
    lines.append(f"  own: {block.get('own')}, {block.get('scans')} scans over {_value(block.get('window_s'))} s")
    if block.get("error"):
        lines.append(f"  error: {block['error']}")
    note = under_load.load_note(result)
    lines.append(f"  {note}" if note else "  quiet: no other load above the thresholds")
    return lines


def _flatten(d: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """Dotted key -> value, in the record's order; walked with a stack of its own (a record may
    nest deeper than Python's recursion limit)."""
    out: list[tuple[str, Any]] = []
    stack: list[tuple[str, Any]] = [(f"{prefix}{k}", v) for k, v in reversed(d.items())]
    while stack:
        key, v = stack.pop()
        if isinstance(v, dict) and v:
            stack += [(f"{key}.{k}", x) for k, x in reversed(v.items())]
        else:
            out.append((key, v))
    return out


def _pairs(d: dict[str, Any]) -> str:
    shown = [f"{k} {_value(v)}" for k, v in d.items() if v is not None]
    return ", ".join(shown) or "not recorded"


def _value(v: Any) -> str:
    """Numbers to 4 significant digits, thousands grouped (the record keeps every digit; --json
    shows them); null, true and false spelled as in the record."""
    if isinstance(v, bool) or v is None:
        return json.dumps(v)
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1e4 else f"{v:.4g}"
    if isinstance(v, list):  # nested lists and mappings as JSON, whose encoder goes as deep as its decoder
        return "[" + ", ".join(json.dumps(x) if isinstance(x, (list, dict)) else _value(x) for x in v) + "]"
    return str(v)
