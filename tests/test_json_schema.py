"""polygym.json_schema: schema checks and validation (by jsonschema), and value synthesis."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from polygym.json_schema import (
    MAX_WRONG_TYPE_CASES,
    example_arguments,
    lookup_ref,
    plainly_fits,
    resolve,
    schema_problems,
    validation_errors,
    wrong_type_cases,
)

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 3, "maxLength": 5},
        "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "count": {"type": "integer", "minimum": 5, "maximum": 9},
        "ratio": {"type": "number", "exclusiveMaximum": 0},
        "mode": {"enum": ["fast", "slow"]},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
        "when": {"type": "string", "format": "date"},
        "inner": {"$ref": "#/$defs/Inner"},
        "maybe": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None},
    },
    "required": ["name", "code", "count", "inner"],
    "$defs": {"Inner": {"type": "object", "properties": {"flag": {"type": "boolean"}}, "required": ["flag"]}},
}


# ------------------------------------------------------------------------------------ synthesis


def test_synthesized_arguments_satisfy_bounds_patterns_refs_and_formats() -> None:
    arguments = example_arguments(SCHEMA)
    assert validation_errors(arguments, SCHEMA) == []
    assert arguments["code"] == "ABC" and arguments["count"] == 5 and arguments["ratio"] < 0
    assert arguments["mode"] == "fast" and len(arguments["tags"]) == 2 and arguments["when"] == "2024-01-01"
    assert arguments["inner"] == {"flag": True} and arguments["maybe"] == 1
    assert arguments["name"] == "examp"  # "example" cut to maxLength


def test_required_only_fills_just_the_required_properties() -> None:
    arguments = example_arguments(SCHEMA, required_only=True)
    assert set(arguments) == {"name", "code", "count", "inner"}
    assert validation_errors(arguments, SCHEMA) == []


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"type": ["null", "integer"]}, 1),
        ({"anyOf": [{"type": "null"}, {"type": "boolean"}]}, True),
        ({"const": "x"}, "x"),
        ({"type": "string", "examples": ["Oslo"]}, "Oslo"),
        ({"properties": {"a": {"type": "string"}}, "required": ["a"]}, {"a": "example"}),
        ({"type": "array", "items": {"type": "object", "required": []}}, [{}]),
        ({"type": "integer", "exclusiveMinimum": 1, "multipleOf": 5}, 5),
        ({"type": "number", "maximum": -3}, -3.0),
        ({"type": "string", "minLength": 9}, "examplexx"),
        ({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "boolean"}]}, [1, True]),
        (
            {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}}], "required": ["a"]},
            {"a": 1},
        ),
        ({}, "example"),
    ],
)
def test_synthesized_values_by_shape(schema: dict[str, Any], expected: Any) -> None:
    value = example_arguments(schema, required_only=True)
    assert value == expected and type(value) is type(expected)
    assert validation_errors(value, schema) == []


def test_a_recursive_schema_gives_a_finite_value() -> None:
    schema = {
        "$ref": "#/$defs/Node",
        "$defs": {
            "Node": {
                "type": "object",
                "properties": {"child": {"$ref": "#/$defs/Node"}},
                "required": ["child"],
            }
        },
    }
    value = example_arguments(schema)
    depth = 0
    while isinstance(value, dict):
        value, depth = value["child"], depth + 1
    assert 0 < depth < 20


def test_synthesis_does_not_change_the_schema() -> None:
    schema = copy.deepcopy(SCHEMA)
    example_arguments(schema)
    wrong_type_cases(schema, example_arguments(schema))
    assert schema == SCHEMA


# ------------------------------------------------------------------------------- references


def test_lookup_ref_follows_local_json_pointers_only() -> None:
    root = {"$defs": {"A/B": {"type": "integer"}, "T~": {"type": "string"}}, "items": [{"type": "null"}]}
    assert lookup_ref("#/$defs/A~1B", root) == {"type": "integer"}
    assert lookup_ref("#/$defs/T~0", root) == {"type": "string"}
    assert lookup_ref("#/items/0", root) == {"type": "null"}
    assert lookup_ref("#", root) is root
    for missing in ("#/$defs/C", "#/items/3", "other.json#/x", "#anchor", 7):
        assert lookup_ref(missing, root) is None


def test_resolve_merges_siblings_over_the_target() -> None:
    root = {"$defs": {"N": {"type": "integer", "minimum": 0}}}
    assert resolve({"$ref": "#/$defs/N", "minimum": 3}, root) == {"type": "integer", "minimum": 3}
    assert resolve({"$ref": "#/$defs/Missing"}, root) == {}


# ------------------------------------------------------------------------------- validation


def test_validation_errors_name_the_place_and_the_problem() -> None:
    errors = validation_errors({"name": "ab", "code": "abc", "count": 10, "inner": {}}, SCHEMA)
    assert "$.name: 'ab' is too short" in errors
    assert "$.code: 'abc' does not match '^[A-Z]{3}$'" in errors
    assert "$.count: 10 is greater than the maximum of 9" in errors
    assert "$.inner: 'flag' is a required property" in errors
    assert len(errors) == 4


def test_validation_follows_json_schema_semantics() -> None:
    assert validation_errors(3.0, {"type": "integer"}) == []  # an integral float is an integer
    assert validation_errors(True, {"type": "integer"}) != []  # a boolean is not
    assert validation_errors(0.75, {"type": "number", "multipleOf": 0.25}) == []
    one_of = {"oneOf": [{"type": "integer"}, {"type": "number"}]}
    assert validation_errors(1, one_of) != [] and validation_errors(1.5, one_of) == []
    assert validation_errors({"extra": 1}, {"type": "object", "additionalProperties": False}) != []


def test_an_unusable_schema_is_an_error_not_an_exception() -> None:
    (error,) = validation_errors({"a": 1}, {"type": "object", "properties": {"a": {"$ref": "#/$defs/X"}}})
    assert error.startswith("$: the schema is not usable: schema.properties.a.$ref: cannot resolve")
    assert validation_errors("x", {"type": "text"})[0].startswith("$: the schema is not usable")


# ------------------------------------------------------------------------------ schema checks


def test_schema_problems() -> None:
    assert schema_problems(SCHEMA) == []
    assert schema_problems(True) == [] and schema_problems({}) == []
    bad = {
        "type": "object",
        "properties": {"a": {"type": "str"}, "b": {"$ref": "#/$defs/Missing"}, "c": {"pattern": "("}},
        "required": ["a", "z"],
    }
    problems = schema_problems(bad)
    assert any(p.startswith("parameters.properties.a.type: 'str' is not one of [") for p in problems)
    assert "parameters.properties.b.$ref: cannot resolve '#/$defs/Missing'" in problems
    assert "parameters.required: 'z' is not in properties" in problems
    (pattern,) = [p for p in problems if p.startswith("parameters.properties.c.pattern:")]
    assert "missing )" in pattern  # the regular expression's own error
    assert len(problems) == 4


def test_schema_problems_read_the_declared_draft() -> None:
    draft4 = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "number", "minimum": 0}
    assert schema_problems({**draft4, "exclusiveMinimum": True}) == []  # a boolean in draft 4
    assert schema_problems({"type": "number", "minimum": 0, "exclusiveMinimum": True}) != []  # 2020-12


def test_schema_problems_ignore_data_that_looks_like_schema() -> None:
    schema = {"type": "object", "enum": [{"$ref": "#/nowhere"}], "default": {"required": ["x"]}}
    assert schema_problems(schema) == []
    assert schema_problems([1], where="tool") == ["tool: [1] is not of type 'object', 'boolean'"]


# ----------------------------------------------------------------------------- wrong values


def test_wrong_type_cases_only_use_values_the_schema_rules_out() -> None:
    valid = example_arguments(SCHEMA)
    cases = dict(wrong_type_cases(SCHEMA, valid))
    assert set(cases) == {
        "wrong type for 'name'",
        "wrong type for 'code'",
        "wrong type for 'count'",
        "wrong type for 'ratio'",
        "wrong type for 'tags'",
        "wrong type for 'when'",
    }
    assert all(validation_errors(body, SCHEMA) for body in cases.values())


def test_wrong_type_cases_are_bounded_and_need_a_usable_schema() -> None:
    wide = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(20)}}
    assert len(wrong_type_cases(wide, example_arguments(wide))) == MAX_WRONG_TYPE_CASES
    broken = {"type": "object", "properties": {"a": {"type": "integer", "minimum": "0"}}}
    assert wrong_type_cases(broken, {"a": 1}) == []


PLAIN = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "where"},
        "days": {"type": "integer"},
        "unit": {"enum": ["c", "f"]},
        "tags": {"type": "array", "items": {"type": ["string", "null"]}},
    },
    "required": ["city"],
    "additionalProperties": False,
}
DRAFT_7_INTEGER = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "integer"}
DRAFT_4_INTEGER = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer"}
DRAFT_3_REQUIRED = {
    "$schema": "http://json-schema.org/draft-03/schema#",
    "type": "object",
    "properties": {"a": {"type": "string", "required": True}},
}


@pytest.mark.parametrize(
    ("value", "schema"),
    [
        ({"city": "Oslo", "days": 3, "unit": "c", "tags": ["x", None]}, PLAIN),
        ({"city": "Oslo"}, PLAIN),
        ({}, PLAIN),
        ({"city": 1}, PLAIN),
        ({"city": "Oslo", "days": 1.5}, PLAIN),
        ({"city": "Oslo", "days": True}, PLAIN),
        ({"city": "Oslo", "unit": "k"}, PLAIN),
        ({"city": "Oslo", "tags": [1]}, PLAIN),
        ({"city": "Oslo", "extra": 1}, PLAIN),
        (1.0, DRAFT_7_INTEGER),
        (1.0, DRAFT_4_INTEGER),
        ({}, DRAFT_3_REQUIRED),
        ({"a": 1}, {"type": "object", "patternProperties": {"^a": {"type": "string"}}}),
        ("x", {"type": "string", "minLength": 2}),
        (True, {"enum": [1]}),
    ],
)
def test_the_plain_fast_path_never_disagrees_with_the_validator(value: Any, schema: dict[str, Any]) -> None:
    """``plainly_fits`` may only say True where jsonschema finds no error; every case above that
    the validator rejects must get its errors, whichever path found them."""
    from jsonschema import validators

    expected = list(validators.validator_for(schema)(schema).iter_errors(value))
    assert plainly_fits(value, schema) is False or not expected
    assert bool(validation_errors(value, schema)) == bool(expected)
