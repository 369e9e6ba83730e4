"""Click options generated from a settings dataclass (``polygym.settings``: each field declares its
own flag, help and bounds), and the dataclass built back from what click parsed.

The type of each option follows the field's annotation: ``bool`` is a flag, ``tuple[X, ...]`` is
repeatable, a ``Literal`` is a choice, ``int``/``float`` with ``min``/``max`` a range, ``Path`` a
path, and a field with its own ``parse`` is parsed by it; a default other than None/False/()/"" is
shown in ``--help`` (as ``str`` gives it).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from polygym.settings import CLI_KEY, CliSpec

F = TypeVar("F", bound=Callable[..., Any])
S = TypeVar("S")


def settings_options(
    cls: type, names: Iterable[str] | None = None, changes: Mapping[str, Mapping[str, Any]] | None = None
) -> Callable[[F], F]:
    """A decorator adding ``cls``'s options (those of ``names``, else every field with a ``cli``
    spec) in field order; ``changes`` gives one command its own ``default``/``help`` of a field."""
    wanted = None if names is None else set(names)
    hints = typing.get_type_hints(cls)
    params = [
        _param(f, hints[f.name], (changes or {}).get(f.name, {}))
        for f in dataclasses.fields(cls)
        if CLI_KEY in f.metadata and (wanted is None or f.name in wanted)
    ]
    missing = (wanted or set()) - {f.name for f in dataclasses.fields(cls) if CLI_KEY in f.metadata}
    if missing:
        raise TypeError(f"{cls.__name__} has no command-line field {', '.join(sorted(missing))}")

    def decorate(command: F) -> F:
        for param in reversed(params):
            command = param(command)
        return command

    return decorate


def settings_from(cls: type[S], values: Mapping[str, Any], **converted: Any) -> S:
    """``cls`` from click's parsed ``values`` (keys that are not fields are left out), with
    ``converted`` replacing the values a command parses further (e.g. ``ENV=DELTA`` to a dict)."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{**{k: v for k, v in values.items() if k in names}, **converted})


def given(name: str) -> bool:
    """Whether the current command's option ``name`` was given (command line or environment), not
    left at its default: an option that needs another can then exit 2 naming both."""
    source = click.get_current_context().get_parameter_source(name)
    return source not in (None, ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP)


def _param(f: dataclasses.Field[Any], hint: Any, change: Mapping[str, Any]) -> Callable[[F], F]:
    spec: CliSpec = f.metadata[CLI_KEY]
    base, repeated = _unwrap(hint)
    kind = _click_type(base, spec)
    if spec.argument:
        return click.argument(f.name, metavar=spec.metavar, type=kind, nargs=-1 if repeated else 1)
    flags = spec.flags or ("--" + f.name.replace("_", "-"),)
    extra: dict[str, Any] = {}
    default = change.get("default", f.default)
    if default is not dataclasses.MISSING and not repeated:
        extra["default"] = default
        extra["show_default"] = default is not None and default is not False and default != ""
    if base is bool:
        extra["is_flag"] = True
    return click.option(
        *flags,
        f.name,
        type=None if base is bool else kind,
        multiple=repeated or spec.multiple,
        metavar=spec.metavar,
        required=spec.required,
        help=change.get("help", spec.help),
        **extra,
    )


def _unwrap(hint: Any) -> tuple[Any, bool]:
    """The element type of a field's annotation (``X | None`` -> X) and whether it repeats."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next(arg for arg in typing.get_args(hint) if arg is not type(None))
    if typing.get_origin(hint) is tuple:
        return typing.get_args(hint)[0], True
    return hint, False


def _click_type(base: Any, spec: CliSpec) -> Any:
    if spec.parse is not None:
        return _Parsed(base, spec.parse)
    if spec.choices or typing.get_origin(base) is typing.Literal:
        return click.Choice(spec.choices or typing.get_args(base))
    bounded = spec.min is not None or spec.max is not None
    if base is int:
        low, high = (None if b is None else int(b) for b in (spec.min, spec.max))
        return click.IntRange(min=low, max=high) if bounded else int
    if base is float:
        return click.FloatRange(min=spec.min, max=spec.max, min_open=spec.min_open) if bounded else float
    if base is Path:
        return click.Path(path_type=Path)
    return None


class _Parsed(click.ParamType):
    """A field's own ``parse``: a ``ValueError`` exits 2 naming the option; a value that is already
    the field's type (its default) is kept."""

    def __init__(self, kind: Any, parse: Callable[[str], object]) -> None:
        self.kind = kind
        self.parse = parse
        self.name = getattr(kind, "__name__", "value")

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(self.kind, type) and isinstance(value, self.kind):
            return value
        try:
            return self.parse(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
