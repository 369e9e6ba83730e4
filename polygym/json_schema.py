"""JSON Schema for tool parameters: is a schema usable, does a value fit it, and values made from it.

Two parts, on purpose:

* **Checking** schemas and values is done by the ``jsonschema`` library, the reference
  implementation of every draft: it knows the meta-schemas and the keywords a hand-written subset
  leaves out (``uniqueItems``, ``patternProperties``, ``if``/``then``, ``dependentRequired``, ...).
  A schema's draft comes from its ``$schema``; without one it is read as 2020-12, which is what
  pydantic writes for tool parameters. On top of the meta-schema, ``schema_problems`` adds the two
  mistakes it cannot see and that break a tool in practice: a ``$ref`` that points nowhere and a
  ``required`` name that is not a property.
* **Making values** has no library that fits: ``example_arguments`` synthesizes arguments a tool
  should accept (``gym env check`` calls every tool with them, and the scripted model's fallback
  policy plays them), and ``wrong_type_cases`` the arguments a tool must reject. Both follow local
  ``$ref``s (``#`` + a JSON Pointer), the only kind tool schemas use.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import orjson

if TYPE_CHECKING:
    from jsonschema.protocols import Validator

MAX_DEPTH = 8
"""How deep synthesis and ``$ref`` chains go: a recursive schema still yields a finite value."""
MAX_WRONG_TYPE_CASES = 6
_DATA_KEYWORDS = frozenset({"enum", "const", "examples", "default"})
"""Keywords whose values are data, not schemas: ``schema_problems`` does not look inside them."""


def _validator_class(schema: Any) -> type[Validator]:
    """The ``jsonschema`` validator for the schema's ``$schema`` draft (2020-12 when unsaid).

    ``jsonschema`` is imported here, when a schema is first checked: a collection whose tool calls
    all plainly fit their schemas (``plainly_fits``) never needs it, and importing it costs a
    noticeable part of ``gym eval run``'s start."""
    import jsonschema
    from jsonschema import validators

    return validators.validator_for(schema, default=jsonschema.Draft202012Validator)


# ------------------------------------------------------------------------------------ references


def lookup_ref(ref: Any, root: Any) -> Any:
    """The subschema a local ``$ref`` (``#`` + a JSON Pointer, e.g. ``#/$defs/X``) names, or None."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        return None
    pointer = unquote(ref[1:])
    if pointer and not pointer.startswith("/"):
        return None  # a named anchor: not used by tool schemas
    node = root
    for part in pointer.split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node if isinstance(node, dict | bool) else None


def resolve(schema: Any, root: Any) -> Any:
    """``schema`` with its local ``$ref`` chain followed (siblings of ``$ref`` win); {} if unresolvable."""
    for _ in range(MAX_DEPTH):
        if not (isinstance(schema, dict) and isinstance(schema.get("$ref"), str)):
            break
        target = lookup_ref(schema["$ref"], root)
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        schema = {**target, **rest} if isinstance(target, dict) else {}
    return schema


# -------------------------------------------------------------------------------------- checking


def _path(where: str, error: Any) -> str:
    """``error``'s location, with the leading ``$`` of its JSON path replaced by ``where``."""
    return where + error.json_path.removeprefix("$")


def schema_problems(schema: Any, where: str = "parameters") -> list[str]:
    """Why ``schema`` is not a usable JSON Schema (empty when it is), each prefixed by its location.

    The meta-schema check includes ``pattern`` being a valid regular expression.
    """
    from jsonschema.exceptions import best_match

    cls = _validator_class(schema)
    meta = cls(cls.META_SCHEMA, format_checker=cls.FORMAT_CHECKER)
    problems: list[str] = []
    for error in meta.iter_errors(schema):
        # An anyOf in the meta-schema (e.g. for ``type``) says more through its best sub-error.
        message = best_match(error.context).message if error.context else error.message
        cause = f" ({error.cause})" if error.cause else ""  # e.g. why a pattern is not a regex
        problems.append(f"{_path(where, error)}: {message}{cause}")
    problems += _reference_problems(schema, schema, where)
    return list(dict.fromkeys(problems))  # the meta-schema can report one mistake several times


def _reference_problems(node: Any, root: Any, where: str) -> list[str]:
    """Unresolvable ``$ref``s and ``required`` names missing from ``properties``, anywhere."""
    problems: list[str] = []
    if isinstance(node, list):
        for index, item in enumerate(node):
            problems += _reference_problems(item, root, f"{where}[{index}]")
        return problems
    if not isinstance(node, dict):
        return problems
    if "$ref" in node and lookup_ref(node["$ref"], root) is None:
        problems.append(f"{where}.$ref: cannot resolve {node['$ref']!r}")
    required, props = node.get("required"), node.get("properties")
    if isinstance(required, list) and isinstance(props, dict):
        missing = [r for r in required if isinstance(r, str) and r not in props]
        problems += [f"{where}.required: '{name}' is not in properties" for name in missing]
    for key, value in node.items():
        if key not in _DATA_KEYWORDS:
            problems += _reference_problems(value, root, f"{where}.{key}")
    return problems


def validation_errors(value: Any, schema: Any) -> list[str]:
    """Where ``value`` breaks ``schema``: one ``"$.path: message"`` per error (empty when it fits).

    An unusable schema (see ``schema_problems``) is reported as an error instead of raising.
    """
    validator, problem = _checked_validator(schema)
    if validator is None:
        return [f"$: the schema is not usable: {problem}"]
    if plainly_fits(value, schema):
        return []
    return _errors(validator, value)


_PLAIN_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
    "object": (dict,),
    "array": (list,),
}
"""Python types (compared exactly: ``bool`` is no ``int`` here) that each JSON type surely holds."""
_PLAIN_KEYWORDS = frozenset(
    {"type", "properties", "required", "additionalProperties", "items", "enum", "$schema"}
) | frozenset({"title", "description", "default", "examples", "$comment"})


def plainly_fits(value: Any, schema: Any, depth: int = 0) -> bool:
    """True when ``value`` surely fits a *usable* schema written with the plain keywords alone
    (types, properties, required, additionalProperties, items, enums of scalars); False when it
    does not, or when the schema says more (then ask the validator).

    Tool schemas are almost always this plain, and the collector checks every tool call of every
    rollout against its tool's schema (``polygym.collect.health``): this check costs a few
    microseconds where jsonschema's ``iter_errors`` costs ~150. It is strict where drafts differ
    (``1.0`` is no integer here, ``true`` no number), so it never says True where any draft says no.
    """
    if schema is True or schema == {}:
        return True
    if not isinstance(schema, dict) or depth > MAX_DEPTH or not _PLAIN_KEYWORDS.issuperset(schema):
        return False
    if "draft-03" in str(schema.get("$schema", "")) or not isinstance(schema.get("required", []), list):
        return False  # draft 3 marks required properties inside them, where a missing one is not seen
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else types
        kind = type(value)
        if not isinstance(names, list) or not any(
            isinstance(name, str) and kind in _PLAIN_TYPES.get(name, ()) for name in names
        ):
            return False
    if "enum" in schema and not _in_enum(value, schema["enum"]):
        return False
    if type(value) is dict:
        return _object_fits(value, schema, depth)
    if type(value) is list and "items" in schema:
        return all(plainly_fits(item, schema["items"], depth + 1) for item in value)
    return True


def _in_enum(value: Any, options: Any) -> bool:
    scalar = value is None or type(value) in (str, int, float, bool)
    return (
        scalar and isinstance(options, list) and any(type(o) is type(value) and o == value for o in options)
    )


def _object_fits(value: dict[str, Any], schema: dict[str, Any], depth: int) -> bool:
    props, extra = schema.get("properties", {}), schema.get("additionalProperties", True)
    if not isinstance(props, dict) or not all(name in value for name in schema.get("required", [])):
        return False
    for key, item in value.items():
        sub = props.get(key, extra)
        if not plainly_fits(item, sub, depth + 1):
            return False
    return True


def _checked_validator(schema: Any) -> tuple[Validator | None, str]:
    """A validator for ``schema``, or None and its first problem (validating with it would raise).

    Checking a schema against its meta-schema costs ~100x validating a small value with it, and a
    run validates every tool call of every rollout against the few schemas its rows offer
    (``polygym.collect.health``): so the checked validator is kept per schema, keyed by its
    canonical JSON, in a bounded cache.
    """
    try:
        text = orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # not JSON (a Python object): checked every time, as it cannot be a key
        return _check_schema(schema)
    return _cached_validator(text)


@lru_cache(maxsize=256)
def _cached_validator(text: bytes) -> tuple[Validator | None, str]:
    return _check_schema(orjson.loads(text))


def _check_schema(schema: Any) -> tuple[Validator | None, str]:
    problems = schema_problems(schema, where="schema")
    return (None, problems[0]) if problems else (_validator_class(schema)(schema), "")


def _errors(validator: Validator, value: Any) -> list[str]:
    return [f"{error.json_path}: {error.message}" for error in validator.iter_errors(value)]


# ----------------------------------------------------------------------------------- synthesizing

_PATTERN_CANDIDATES = ("example", "a", "A", "abc", "ABC", "x1", "1", "0", "2024-01-01", "user@example.com")
_FORMATS = {
    "date": "2024-01-01",
    "date-time": "2024-01-01T00:00:00Z",
    "time": "12:00:00",
    "email": "user@example.com",
    "uri": "https://example.com",
    "uuid": "123e4567-e89b-12d3-a456-426614174000",
}


def example_arguments(schema: Any, root: Any = None, required_only: bool = False, depth: int = 0) -> Any:
    """A value meant to satisfy ``schema``: bounds, enums, patterns and formats honoured.

    In order: ``const``; the first ``enum`` value; the first of ``examples``; ``allOf`` merged;
    the first non-null ``anyOf``/``oneOf`` option; else by type: string ``"example"`` (or a
    candidate that fits format, pattern and length), number 1 (or the nearest bound), boolean
    true, an array of ``minItems`` (at least one) items, an object of its properties. Optional
    properties are filled too unless ``required_only``, so that more of a tool runs. Synthesis
    does not check its result: call ``validation_errors`` for that.
    """
    root = schema if root is None else root
    schema = resolve(schema, root)
    if not isinstance(schema, dict) or depth > MAX_DEPTH:
        return "example" if schema is True or schema == {} else None
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    if isinstance(schema.get("examples"), list) and schema["examples"]:
        return schema["examples"][0]
    if schema.get("allOf"):
        merged: dict[str, Any] = {}
        for sub in schema["allOf"]:
            merged.update(resolve(sub, root) if isinstance(sub, dict) else {})
        merged.update({k: v for k, v in schema.items() if k != "allOf"})
        return example_arguments(merged, root, required_only, depth + 1)
    for key in ("anyOf", "oneOf"):
        options = [o for o in schema.get(key) or [] if resolve(o, root) not in ({"type": "null"}, False)]
        if options:
            return example_arguments(options[0], root, required_only, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    kind = kind or ("object" if "properties" in schema else "array" if "items" in schema else None)
    if kind == "string":
        return _example_string(schema)
    if kind in ("integer", "number"):
        return _example_number(schema, kind == "integer")
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    if kind == "array":
        prefix = [
            example_arguments(s, root, required_only, depth + 1) for s in schema.get("prefixItems") or []
        ]
        count = max(int(schema.get("minItems", 1)), len(prefix), 1)
        count = min(count, int(schema.get("maxItems", count)))
        item = schema.get("items", {"type": "string"})
        rest = [example_arguments(item, root, required_only, depth + 1) for _ in range(count - len(prefix))]
        return (prefix + rest)[:count]
    if kind == "object":
        props = schema.get("properties") or {}
        required = [r for r in schema.get("required") or [] if isinstance(r, str)]
        names = [n for n in props if n in required or not required_only] + [
            r for r in required if r not in props
        ]
        return {n: example_arguments(props.get(n, {}), root, required_only, depth + 1) for n in names}
    return "example"


def _example_string(schema: dict[str, Any]) -> str:
    low, high = int(schema.get("minLength", 0)), int(schema.get("maxLength", 1 << 30))
    candidates = [_FORMATS.get(str(schema.get("format")), "example"), *_PATTERN_CANDIDATES]
    for text in candidates:
        text = (text + "x" * max(0, low - len(text)))[:high]
        if "pattern" not in schema or re.search(str(schema["pattern"]), text):
            return text
    return candidates[0]


def _example_number(schema: dict[str, Any], integer: bool) -> int | float:
    low = schema.get("minimum", -math.inf)
    high = schema.get("maximum", math.inf)
    if "exclusiveMinimum" in schema:
        low = max(low, schema["exclusiveMinimum"] + (1 if integer else 1e-6))
    if "exclusiveMaximum" in schema:
        high = min(high, schema["exclusiveMaximum"] - (1 if integer else 1e-6))
    value: float = (
        1 if low <= 1 <= high else low if math.isfinite(low) else high if math.isfinite(high) else 1
    )
    step = schema.get("multipleOf")
    if step:
        value = math.ceil(value / step) * step
    return math.ceil(value) if integer else float(value)


_WRONG_VALUES = {
    "string": {"polygym_envcheck": "an object where a string belongs"},
    "integer": "not a number",
    "number": "not a number",
    "boolean": "not a boolean",
    "array": "not an array",
    "object": "not an object",
}


def wrong_type_cases(schema: dict[str, Any], valid: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(label, body)`` pairs: valid arguments with one property given a value of the wrong type.

    Only bodies the schema itself rejects are kept, so a tool that accepts one has a bug (none for
    an unusable schema); at most ``MAX_WRONG_TYPE_CASES``, to keep ``gym env check`` quick.
    """
    validator, _ = _checked_validator(schema)
    if validator is None:
        return []
    cases: list[tuple[str, dict[str, Any]]] = []
    for name, sub in (schema.get("properties") or {}).items():
        sub = resolve(sub, schema)
        kind = sub.get("type") if isinstance(sub, dict) else None
        if isinstance(kind, str) and kind in _WRONG_VALUES and len(cases) < MAX_WRONG_TYPE_CASES:
            body = {**valid, name: _WRONG_VALUES[kind]}
            if _errors(validator, body):
                cases.append((f"wrong type for '{name}'", body))
    return cases
