"""NeMo Gym's config directives: ``_inherit_from``, ``_copy`` and ``_delete_key``.

NeMo Gym configs reuse blocks instead of repeating them, and polygym must read those files as
NeMo Gym does, after every file and override is merged:

* ``key: ${inherit_from:a.b}`` or ``key: {_inherit_from: a.b, ...}`` *moves* the block at ``a.b``
  to ``key`` (the source is removed), the mapping form merging its own keys over the moved block;
* ``${copy:a.b}`` / ``_copy: a.b`` do the same but keep the source;
* ``_delete_key: "x, y"`` removes those keys from the mapping, after the inherit or copy when the
  keys only arrive with it.

Sources are read from the config as it was before any directive ran, so the order in which the
directives appear does not change the result. Works on plain data so interpolations stay as text.
A directive whose sources lead back to itself (``a`` inherits ``b``, which inherits ``a``; a block
inheriting itself or a block that contains it) is a problem, not a block with a stray directive.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

MISSING = "???"
INHERIT_KEY = "_inherit_from"
COPY_KEY = "_copy"
DELETE_KEY = "_delete_key"
_INHERIT_TEXT = "${inherit_from:"
_COPY_TEXT = "${copy:"
_NOT_FOUND = object()


def merge_plain(base: Any, over: Any) -> Any:
    """Deep-merge ``over`` onto ``base`` as OmegaConf would: mappings key by key, a ``???`` in
    ``over`` keeps what ``base`` had, anything else replaces."""
    if isinstance(base, Mapping) and isinstance(over, Mapping):
        merged = dict(base)
        for key, value in over.items():
            merged[key] = merge_plain(base[key], value) if key in base else value
        return merged
    return base if over == MISSING and base is not None else over


def apply_directives(data: dict[str, Any]) -> list[str]:
    """Apply every directive in ``data`` in place; return the problems (a source that does not exist,
    a key to delete that is not there), each naming the dotted key that holds the directive."""
    problems: list[str] = []
    _visit(data, data, copy.deepcopy(data), "", problems)
    return problems


def _directive(value: Any) -> tuple[str, str] | None:
    """``(source path, "inherit" | "copy")`` when ``value`` is a directive; pops the mapping form's key."""
    if isinstance(value, str):
        for prefix, how in ((_INHERIT_TEXT, "inherit"), (_COPY_TEXT, "copy")):
            if value.startswith(prefix) and value.endswith("}"):
                return value[len(prefix) : -1].strip(), how
        return None
    if isinstance(value, dict):
        for key, how in ((INHERIT_KEY, "inherit"), (COPY_KEY, "copy")):
            if key in value:
                return str(value.pop(key)), how
    return None


def _lookup(data: Any, path: list[str]) -> Any:
    node = data
    for part in path:
        if node == MISSING:
            return MISSING
        if not isinstance(node, Mapping) or part not in node:
            return _NOT_FOUND
        node = node[part]
    return node


def _visit(
    node: dict[Any, Any], root: dict[str, Any], frozen: dict[str, Any], prefix: str, problems: list[str]
) -> None:
    for key in list(node):
        if key not in node:  # an earlier _inherit_from moved it away
            continue
        value = node[key]
        where = f"{prefix}.{key}" if prefix else str(key)
        pending = _take_deletes(value)
        if isinstance(value, dict):
            _visit(value, root, frozen, where, problems)
        elif isinstance(value, list):
            for index, item in enumerate(value):
                if isinstance(item, dict):
                    _visit(item, root, frozen, f"{where}.{index}", problems)
        found = _directive(value)
        if found is not None:
            value = _resolve(found, value, where, root, frozen, problems)
            node[key] = value
        for name in pending:
            if isinstance(value, dict) and name in value:
                del value[name]
            elif value != MISSING:
                problems.append(f"{where}: {DELETE_KEY} names '{name}', which {where} does not have")


def _take_deletes(value: Any) -> list[str]:
    """Pop ``_delete_key`` and delete the keys already present; return those that are not (yet)."""
    if not isinstance(value, dict) or DELETE_KEY not in value:
        return []
    names = [name.strip() for name in str(value.pop(DELETE_KEY)).split(",") if name.strip()]
    pending = [name for name in names if name not in value]
    for name in names:
        value.pop(name, None)
    return pending


def _resolve(
    found: tuple[str, str],
    value: Any,
    where: str,
    root: dict[str, Any],
    frozen: dict[str, Any],
    problems: list[str],
) -> Any:
    source, how = found
    word = INHERIT_KEY if how == "inherit" else COPY_KEY
    loop = _cycle(where, source, frozen)
    if loop is not None:
        problems.append(f"{where}: {word} '{source}' leads back to itself ({' -> '.join(loop)})")
        return value
    path = source.split(".")
    inherited = _lookup(frozen, path)
    if inherited is _NOT_FOUND:
        problems.append(f"{where}: {word} '{source}': no such key in the merged config")
        return value
    if how == "inherit":
        parent = _lookup(root, path[:-1])
        if isinstance(parent, dict):
            parent.pop(path[-1], None)
    if inherited == MISSING:
        return MISSING
    inherited = copy.deepcopy(inherited)
    return merge_plain(inherited, value) if isinstance(value, dict) else inherited


def _cycle(where: str, source: str, frozen: dict[str, Any]) -> list[str] | None:
    """The chain ``where -> source -> ...`` when it returns to a block already on it (or to a block
    containing one); None when it ends. Each step adds a new block, so it ends within as many
    steps as the config has directives."""
    chain = [where]
    current: str | None = source
    while current is not None:
        if any(seen == current or seen.startswith(current + ".") for seen in chain):
            return [*chain, current]
        chain.append(current)
        current = _source_of(_lookup(frozen, current.split(".")))
    return None


def _source_of(value: Any) -> str | None:
    """The source a directive names, without consuming it; None when ``value`` is no directive."""
    if isinstance(value, dict):
        return next((str(value[key]) for key in (INHERIT_KEY, COPY_KEY) if key in value), None)
    found = _directive(value) if isinstance(value, str) else None
    return found[0] if found is not None else None
