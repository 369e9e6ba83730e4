"""YAML that cannot grow past a bound: aliases are counted as what they expand to.

``yaml.safe_load`` builds an alias as a reference to the anchored value, so a few hundred bytes
of nested aliases (``b: [*a, *a, ...]``, ``c: [*b, *b, ...]``) load quickly; everything after
loading that copies or walks the data (merging, OmegaConf, checks) then meets every expansion:
such a file took ``gym env resolve`` to 622 MiB. Here the document's node graph is measured
before any Python object is built, each alias counting as the whole value it stands for, and a
document over ``MAX_NODES`` (or one whose alias contains itself, or nested past ``MAX_DEPTH``,
aliases expanded, which the recursive walks after loading could not follow) is a ``YAMLTooLarge``
error, a ``yaml.YAMLError`` like any other invalid YAML.
"""

from __future__ import annotations

from typing import Any

import yaml

MAX_NODES = 100_000
"""Keys, values and items after alias expansion: a large stack config has a few thousand."""
MAX_DEPTH = 100
"""Levels of nesting after alias expansion: a stack config has about six; the walks over the loaded
data (merging, OmegaConf, checks) recurse once or more per level and stop near a few hundred."""
LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's parser where PyYAML was built with it (the wheels are): the same nodes and errors as
the pure-Python one, parsed several times faster; every stack start and config check parses YAML."""


class YAMLTooLarge(yaml.MarkedYAMLError):
    """The document expands past the bound, refers to itself, or nests too deeply."""


def safe_load(text: str, max_nodes: int = MAX_NODES) -> Any:
    """``yaml.safe_load(text)``, refusing a document that expands past ``max_nodes`` nodes."""
    loader = LOADER(text)
    try:
        try:
            root = loader.get_single_node()
        except RecursionError:  # the pure-Python parser recurses per level; libyaml stops at 1000
            raise _too_deep() from None
        if root is None:
            return None
        _check_size(root, max_nodes)
        return loader.construct_document(root)
    finally:
        loader.dispose()


def _too_deep() -> YAMLTooLarge:
    return YAMLTooLarge(problem="nested too deeply to parse")


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _check_size(root: yaml.Node, limit: int) -> None:
    """Size and nest every node once (an alias shares its anchor's node), depth-first without
    recursion."""
    sizes: dict[int, int] = {}
    depths: dict[int, int] = {}
    entered: set[int] = set()
    pending: list[tuple[yaml.Node, bool]] = [(root, False)]
    while pending:
        node, children_done = pending.pop()
        key = id(node)
        if children_done:
            entered.discard(key)
            sizes[key] = 1 + sum(sizes[id(child)] for child in _children(node))
            depths[key] = 1 + max((depths[id(child)] for child in _children(node)), default=0)
            if depths[key] > MAX_DEPTH:
                raise _too_deep()
            if sizes[key] > limit:
                raise YAMLTooLarge(
                    problem=f"expands to more than {limit:,} values (anchors and aliases included)",
                    problem_mark=node.start_mark,
                )
            continue
        if key in sizes:
            continue
        if key in entered:
            raise YAMLTooLarge(problem="an alias that contains itself", problem_mark=node.start_mark)
        entered.add(key)
        pending.append((node, True))
        pending.extend((child, False) for child in _children(node) if id(child) not in sizes)
