"""YAML files read with bounds (size, nesting, aliases expanded) and the line of every key: the
scenario and hosts files' reader, whose errors name the file and the line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from suite.safe import bounded
from suite.spec.settings import ScenarioError


class _Loader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # ``<<: *defaults``: the keys it brings, which the mapping's own override (flatten_mapping)
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first on line {seen[key] + 1})", key_node.start_mark
            )
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _lines(node: yaml.Node, prefix: str = "", out: dict[str, int] | None = None) -> dict[str, int]:
    """Dotted path -> 1-based line, for every key and list item in the document."""
    out = {} if out is None else out
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            path = f"{prefix}.{key_node.value}" if prefix else str(key_node.value)
            out[path] = key_node.start_mark.line + 1
            _lines(value_node, path, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            path = f"{prefix}.{i}"
            out[path] = item.start_mark.line + 1
            _lines(item, path, out)
    return out


# Bounds on a YAML document, checked before anything expands it. A scenario or hosts file is a few
# KiB, nested four or five levels, and has no reason for more than a handful of aliases; an alias
# repeated inside an alias (the "billion laughs") describes 10^9 nodes in a few hundred bytes and
# would exhaust memory once walked, and PyYAML's composer recurses once per level of nesting.
MAX_YAML_BYTES = 256 * 1024
MAX_YAML_DEPTH = 50
MAX_YAML_NODES = 100_000  # with every alias expanded where it is used


class YamlRefused(yaml.YAMLError):
    """A document over the bounds, or with a key that is not plain text; says where, as PyYAML's errors do."""

    def __init__(self, problem: str, mark: Any = None):  # a yaml Mark, or None
        super().__init__(problem)
        self.problem, self.problem_mark = problem, mark


def safe_yaml(text: str) -> tuple[Any, yaml.Node | None]:
    """``text`` read with the files' loader after the bounds are checked: the value and its node tree.

    The events are scanned first (PyYAML's parser is iterative) for nesting depth; then the nodes,
    each counted once however many aliases use it, for the size with aliases expanded and for keys
    that are not plain scalars (``? [a, b]``), which no setting has."""
    depth = 0
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                raise YamlRefused(f"nested more than {MAX_YAML_DEPTH} levels deep", event.start_mark)
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
    node = yaml.compose(text, Loader=_Loader)
    if node is not None:
        size = _expanded_size(node, {}, set())
        if size > MAX_YAML_NODES:
            raise YamlRefused(
                f"{size:,} values, each alias (*name) counted where it is used; at most {MAX_YAML_NODES:,} are allowed"
            )
    try:
        return yaml.load(text, Loader=_Loader), node
    except (ValueError, OverflowError) as exc:  # a number past Python's limits (4,300 digits; a float's range)
        raise YamlRefused(f"a number too large to read ({str(exc).split(';')[0]})") from None


def _expanded_size(node: yaml.Node, memo: dict[int, int], open_: set[int]) -> int:
    """Nodes in ``node``'s tree with every alias expanded, each distinct node walked once (memo by
    id); ``open_``: the nodes being walked, so an alias inside its own anchor (``&a [*a]``) is found."""
    if id(node) in memo:
        return memo[id(node)]
    if id(node) in open_:
        raise YamlRefused("an alias (*name) refers to the value that holds it", node.start_mark)
    open_.add(id(node))
    size = 1
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if not isinstance(key, yaml.ScalarNode):
                raise YamlRefused("a key must be plain text, not a list or mapping", key.start_mark)
            size += 1 + _expanded_size(value, memo, open_)
    elif isinstance(node, yaml.SequenceNode):
        size += sum(_expanded_size(item, memo, open_) for item in node.value)
    open_.discard(id(node))
    memo[id(node)] = size
    return size


def read_yaml(path: Path, text: str | None = None) -> tuple[Any, dict[str, int]]:
    """The file's data and each key's line; ``text``: its content as already read, else it is read."""
    try:
        if text is None:
            text = bounded.read_text(path, MAX_YAML_BYTES)
    except OSError as exc:
        raise ScenarioError([f"{path}: cannot read: {exc.strerror}"]) from None
    except UnicodeDecodeError as exc:
        # YAML is read as UTF-8; the offset lets the user find the stray byte (a Latin-1 accent,
        # a file saved as UTF-16) without a traceback.
        raise ScenarioError(
            [f"{path}: not UTF-8 text: byte {exc.object[exc.start]:#04x} at byte offset {exc.start} ({exc.reason})"]
        ) from None
    try:
        data, node = safe_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ScenarioError([f"{path}{where}: malformed YAML: {problem}"]) from None
    return data, (_lines(node) if node is not None else {})
