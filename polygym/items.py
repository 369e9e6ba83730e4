"""Reading Responses items, which polygym keeps as plain dicts, without the wire models.

Apart from ``polygym.protocol`` so that whoever only reads a rollout (the collector's health
monitor, over every result) does not import pydantic and build the wire models to do it.
"""

from __future__ import annotations

from typing import Any


def item_text(item: dict[str, Any]) -> str:
    """Plain text of an input or output message item, whatever content shape it uses.

    Verifiers receive whatever a policy produced; a ``null`` text or a number where a list of
    parts belongs reads as no text rather than raising (which would turn into a 500).
    """
    content = item.get("content", "")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
