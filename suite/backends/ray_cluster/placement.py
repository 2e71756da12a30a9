"""What a run asks of a Ray cluster (Ray's resource names) and why no alive node could ever take it."""

from __future__ import annotations

from typing import Any

from suite.environment.host_facts import machine_name
from suite.safe.markdown import one_line
from suite.spec.plan import RunSpec, parse_device
from suite.spec.settings import AUTO

SLOT = "suite_slot"  # custom resource: how many benchmark runs a node takes at once
MODEL_PREFIX = "gpu_model:"  # custom resource per GPU model, e.g. gpu_model:H100
MACHINE_LABEL = "suite-machine"  # node label: the results folder of the node's runs (default: hostname)
MODEL_SHARE = 0.001  # what a run asks of gpu_model:NAME: it selects nodes, it counts nothing


def gpu_model_of(spec: RunSpec, default: str | None = None) -> str | None:
    """The GPU model a run must land on: the scenario's ``gpu_model``, else ``--gpu-model``, else any."""
    return spec.config.get("gpu_model") or default


def demand(spec: RunSpec, gpu_model: str | None = None) -> dict[str, float]:
    """The resources a run's task asks for, in Ray's names (CPU, GPU, custom resources)."""
    kind, count = parse_device(spec.device)
    need: dict[str, float] = {"CPU": 1.0, SLOT: 1.0}
    if kind == "gpu":
        need["GPU"] = float(count)
    model = gpu_model_of(spec, gpu_model)
    if model:
        need[MODEL_PREFIX + model] = MODEL_SHARE
    return need


def takes(node: dict[str, Any], need: dict[str, float]) -> bool:
    """Whether an alive node's total resources cover ``need`` (busy or not: it takes the run later)."""
    return bool(node.get("Alive")) and all(float(node.get("Resources", {}).get(k, 0)) >= v for k, v in need.items())


def node_folder(node: dict[str, Any]) -> str:
    """The results folder of a node's runs, by the rule its task applies: its ``suite-machine``
    label, else its hostname made safe for a path."""
    return str((node.get("Labels") or {}).get(MACHINE_LABEL) or machine_name(str(node.get("NodeManagerHostname", ""))))


def split_auto_points(specs: list[RunSpec], nodes: list[dict[str, Any]], gpu_model: str | None = None) -> list[str]:
    """A line per set of results folders that a ``repeats: auto`` point's runs may land in, where
    there is more than one: its count comes from its runs on every node that can take it, and each
    folder's report reads only the share saved there."""
    split: dict[tuple[str, ...], set[str]] = {}
    for spec in specs:
        if (spec.report.get("repeats") or {}).get(AUTO):
            need = demand(spec, gpu_model)
            folders = tuple(sorted({node_folder(n) for n in nodes if takes(n, need)}))
            if len(folders) > 1:
                split.setdefault(folders, set()).add(spec.scenario)
    return [
        f"repeats: auto counts each point's runs over all the nodes that take it, and the nodes that take "
        f"{_some(sorted(names))} save to {len(folders)} folders ({_some(list(folders))}): each folder's report "
        "reads only its share of a point's runs; give those nodes one suite-machine label (docs/cluster.md)"
        for folders, names in split.items()
    ]


def _some(names: list[str], most: int = 4) -> str:
    """The first ``most`` names, each on one line, and how many more."""
    shown = ", ".join(one_line(n) for n in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def placement_problem(need: dict[str, float], nodes: list[dict[str, Any]], where: str) -> str | None:
    """Why no alive node could ever take a task with ``need`` (its total resources, not what is
    free now: a busy node takes it later), or None."""
    alive = [n for n in nodes if n.get("Alive")]
    if not alive:
        return f"no node of {where} is alive"
    if any(takes(n, need) for n in alive):
        return None
    offered = sorted({k for n in alive for k in n.get("Resources", {}) if k.startswith(MODEL_PREFIX)})
    models = ", ".join(offered) or "no gpu_model:NAME resource"
    for key, amount in need.items():
        if not any(float(n.get("Resources", {}).get(key, 0)) >= amount for n in alive):
            if key.startswith(MODEL_PREFIX):
                return f"no node of {where} offers {key} (offered: {models})"
            if key == SLOT:
                return (
                    f"no node of {where} offers the resource {SLOT}; start each node with "
                    f"--resources '{{\"{SLOT}\": 1}}' (docs/cluster.md)"
                )
            if key == "GPU":
                most = max((float(n.get("Resources", {}).get("GPU", 0)) for n in alive), default=0)
                return f"needs {amount:g} GPU(s) on one node; the largest node of {where} has {most:g}"
            return f"no node of {where} has {amount:g} {key}"
    return f"no single node of {where} offers all of {_need_text(need)} (nodes offer: {models})"


def _need_text(need: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in need.items())
