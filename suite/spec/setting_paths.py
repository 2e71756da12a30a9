"""Dotted paths into a scenario's settings (``training.batch_size``, ``model.hidden.0``): whether one
names a single setting (with the closest real ones when not), and a copy of the settings with
overrides applied and checked, as matrix values, variants, smoke sizes and ``--set`` give them."""

from __future__ import annotations

import copy
import difflib
from typing import Any

from suite.spec.settings import KINDS, Checker, ScenarioError, check_config


def _get(tree: Any, path: str) -> Any:
    node = tree
    for part in path.split("."):
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def _index(part: str) -> int | None:
    """A list index as a path writes it: ASCII digits without a leading zero (``0``, ``12``; not
    ``00`` or ``01``, which would name the same item as another text and slip past the checks that
    compare paths as text); None otherwise."""
    if part.isascii() and part.isdigit() and len(part) <= 9 and part == str(int(part)):
        return int(part)
    return None


def _non_canonical(path: str) -> str | None:
    """``path`` with its list indices written plainly, when one has a leading zero; else None."""
    parts = path.split(".")
    fixed = [p.lstrip("0") or "0" if p.isascii() and p.isdigit() else p for p in parts]
    return ".".join(fixed) if fixed != parts else None


def value_at(tree: Any, path: str, absent: Any = None) -> Any:
    """The value ``path`` names in ``tree``, of any shape (a recorded config too); ``absent`` where
    it names none (null is a value)."""
    node = tree
    for part in path.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and (index := _index(part)) is not None and index < len(node):
            node = node[index]
        else:
            return absent
    return node


_ABSENT = object()


def path_exists(tree: Any, path: str) -> bool:
    return value_at(tree, path, _ABSENT) is not _ABSENT


def _set(tree: Any, path: str, value: Any) -> None:
    *parents, last = path.split(".")
    node = tree
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


def apply_overrides(config: dict[str, Any], overrides: dict[str, Any], source: str, section: str) -> dict[str, Any]:
    """A copy of ``config`` with dotted-path overrides applied, each path and value checked."""
    ck = Checker(source, {})
    out = copy.deepcopy(config)
    for path, value in overrides.items():
        problem = path_problem(out, path)
        if problem:
            ck.fail(_key(section, path), problem)
            continue
        if path == "model.kind" and value in KINDS and value != out["model"].get("kind"):
            by = "--set" if section == "set" else f"the scenario's {section}"
            ck.fail(
                _key(section, path),
                f"model.kind cannot be changed by {by} (the scenario's model is {out['model'].get('kind')!r}, and each "
                f"kind has its own keys): write one scenario file per kind",
            )
            continue
        _set(out, path, copy.deepcopy(value))
        check_config(ck, {path.split(".")[0]: _get(out, path.split(".")[0])})
    _check_model_keys(ck, out, section)
    if ck.problems:
        raise ScenarioError(ck.problems)
    return out


def _key(section: str, path: str) -> str:
    """The key a problem names: the path itself for --set (its flag is the source), else under its section."""
    return path if section == "set" else f"{section}.{path}"


def _check_model_keys(ck: Checker, config: dict[str, Any], section: str) -> None:
    """The model section holds exactly its kind's keys; a kind changed by an override would keep another's
    (and the worker would build from keys its kind does not have)."""
    model = config.get("model")
    kind = model.get("kind") if isinstance(model, dict) else None
    if isinstance(model, dict) and kind in KINDS and set(model) != set(KINDS[kind].keys):
        odd = ", ".join(sorted(set(model) ^ set(KINDS[kind].keys)))
        ck.fail(
            _key(section, "model.kind"),
            f"the model section does not hold the keys of kind {kind!r} (differs in: {odd}); a matrix, variant or "
            "--set cannot change model.kind: ask one scenario file per kind",
        )


def path_problem(config: dict[str, Any], path: Any) -> str | None:
    """Why ``path`` does not name one setting of ``config`` (with the closest real ones), or None."""
    if isinstance(path, str) and path_exists(config, path):
        if isinstance(_get(config, path), dict):
            return "names a whole section; give a path to one setting, e.g. data.train_samples"
        return None
    if isinstance(path, str) and (plain := _non_canonical(path)) is not None and path_exists(config, plain):
        return f"a list index is written without leading zeros: write {plain}"
    leaves = [p for p in _leaf_paths(config) if "." in p or not isinstance(config.get(p), dict)]
    close = difflib.get_close_matches(str(path), leaves, n=3, cutoff=0.6)
    sections = ", ".join(sorted(config))
    hint = f"did you mean {' or '.join(close)}?" if close else f"settings are {sections} and their keys"
    return f"no such setting in the scenario; {hint}"


def _leaf_paths(tree: Any, prefix: str = "") -> list[str]:
    """Every path into the settings: sections, leaves, and list items (model.hidden.0)."""
    if isinstance(tree, dict):
        children = [p for k, v in tree.items() for p in _leaf_paths(v, f"{prefix}.{k}" if prefix else k)]
    elif isinstance(tree, list):
        children = [f"{prefix}.{i}" for i in range(len(tree))]
    else:
        children = []
    return children + ([prefix] if prefix else [])
