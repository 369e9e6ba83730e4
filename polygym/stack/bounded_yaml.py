"""YAML that cannot grow past a bound: aliases are counted as what they expand to.

``yaml.safe_load`` builds an alias as a reference to the anchored value, so a few hundred bytes
of nested aliases (``b: [*a, *a, ...]``, ``c: [*b, *b, ...]``) load quickly; everything after
loading that copies or walks the data (merging, OmegaConf, checks) then meets every expansion:
such a file took ``gym env resolve`` to 622 MiB. Here the document's node graph is measured
before any Python object is built, each alias counting as the whole value it stands for, and a
document over ``MAX_NODES`` (or one whose alias contains itself, or nested past what the parser
can follow) is a ``YAMLTooLarge`` error, a ``yaml.YAMLError`` like any other invalid YAML.
"""

from __future__ import annotations

from typing import Any

import yaml

MAX_NODES = 100_000
"""Keys, values and items after alias expansion: a large stack config has a few thousand."""


class YAMLTooLarge(yaml.MarkedYAMLError):
    """The document expands past the bound, refers to itself, or nests too deeply."""


def safe_load(text: str, max_nodes: int = MAX_NODES) -> Any:
    """``yaml.safe_load(text)``, refusing a document that expands past ``max_nodes`` nodes."""
    loader = yaml.SafeLoader(text)
    try:
        try:
            root = loader.get_single_node()
        except RecursionError:
            raise YAMLTooLarge(problem="nested too deeply to parse") from None
        if root is None:
            return None
        _check_size(root, max_nodes)
        return loader.construct_document(root)
    finally:
        loader.dispose()


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _check_size(root: yaml.Node, limit: int) -> None:
    """Size every node once (an alias shares its anchor's node), depth-first without recursion."""
    sizes: dict[int, int] = {}
    entered: set[int] = set()
    pending: list[tuple[yaml.Node, bool]] = [(root, False)]
    while pending:
        node, children_done = pending.pop()
        key = id(node)
        if children_done:
            entered.discard(key)
            sizes[key] = 1 + sum(sizes[id(child)] for child in _children(node))
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
