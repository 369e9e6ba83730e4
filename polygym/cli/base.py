"""Pieces every command group shares: did-you-mean groups, selector flags, config loading, the loop.

Selectors (``--resources-server``, ``--model-type``, ``--config``) are repeatable and every file
they name is merged, in that order, then ``key=value`` overrides from the command line.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click
import yaml
from click.core import ParameterSource
from rich.console import Console

from polygym.cli.nemo_gym_commands import SELECTOR_FLAGS_NOT_PROVIDED, not_provided
from polygym.errors import EXIT_USAGE as EXIT_USAGE  # the commands share the errors module's code
from polygym.errors import ConfigError
from polygym.kinds import MODEL_KIND
from polygym.stack.catalog import NEMO_GYM_ROOT_ENV_VAR, SHADOWS, folder_origin, selector_paths
from polygym.stack.env_build import PYTHON_KEY
from polygym.stack.external import NO_FOLDER
from polygym.suggest import unknown_name_message

if TYPE_CHECKING:
    from polygym.stack.config import StackConfig

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130
"""128 + SIGINT, what shells report for a command stopped by Ctrl-C."""


class SuggestingGroup(click.Group):
    """A click group whose unknown-command error names the closest command, or, for one of NeMo
    Gym's commands that polygym lacks, says so and what to use instead."""

    def resolve_command(self, ctx: click.Context, args: list[str]) -> Any:
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            words = [c.info_name or "" for c in reversed(list(_lineage(ctx)))][1:]
            message = not_provided([*words, name, *args[1:2]]) or not_provided([*words, name])
            raise click.UsageError(
                message or unknown_name_message("command", name, self.list_commands(ctx)), ctx
            )
        return super().resolve_command(ctx, args)


def _lineage(ctx: click.Context | None) -> Iterator[click.Context]:
    """``ctx`` and its parents, innermost first (the root's name is the program's, not a command)."""
    while ctx is not None:
        yield ctx
        ctx = ctx.parent


MODEL_FLAGS = {
    "model": ("policy_model_name", "Model name (sets ${policy_model_name}, as NeMo Gym's --model does)."),
    "model_url": ("policy_base_url", "Model server base URL (sets ${policy_base_url})."),
    "model_api_key": ("policy_api_key", "Model server API key (sets ${policy_api_key})."),
}
"""NeMo Gym's model flags: each sets the global its model configs interpolate. A stack whose
configs do not use it refuses the flag (exit 2) instead of ignoring it (``load_config``)."""


def _with_model_flags(func: F) -> F:
    """Fold ``--model``/``--model-url``/``--model-api-key`` into the overrides, first, so that an
    explicit ``++policy_model_name=...`` on the same command line still wins, as in NeMo Gym."""

    @functools.wraps(func)
    def command(*args: Any, **kwargs: Any) -> Any:
        given = [(key, kwargs.pop(name)) for name, (key, _) in MODEL_FLAGS.items()]
        flags = tuple(f"++{key}={value}" for key, value in given if value is not None)
        kwargs["overrides"] = (*flags, *kwargs["overrides"])
        return func(*args, **kwargs)

    for name, (_, text) in reversed(MODEL_FLAGS.items()):
        short = ("-m",) if name == "model" else ()
        command = click.option(f"--{name.replace('_', '-')}", *short, name, default=None, help=text)(command)
    return command  # type: ignore[return-value]


def _with_nemo_gym_flags(func: F) -> F:
    """``--nemo-gym-root DIR`` adds a NeMo Gym checkout's server folders to the search (before the
    selectors are looked up, and for every process of the stack); ``--nemo-gym-python`` chooses
    the interpreter of their environments (``++nemo_gym_python=...``)."""

    @functools.wraps(func)
    def command(*args: Any, **kwargs: Any) -> Any:
        roots, python = kwargs.pop("nemo_gym_roots"), kwargs.pop("nemo_gym_python")
        for root in reversed(roots):
            if not Path(root).expanduser().is_dir():
                raise click.BadParameter(f"{root}: not a directory", param_hint="--nemo-gym-root")
            known = os.environ.get(NEMO_GYM_ROOT_ENV_VAR)
            os.environ[NEMO_GYM_ROOT_ENV_VAR] = os.pathsep.join(
                [str(Path(root).resolve()), *([known] if known else [])]
            )
        if python is not None:
            kwargs["overrides"] = (f"++{PYTHON_KEY}={python}", *kwargs["overrides"])
        return func(*args, **kwargs)

    command = click.option(
        "--nemo-gym-python",
        "nemo_gym_python",
        default=None,
        metavar="PYTHON",
        help="Interpreter for NeMo Gym servers' environments: a path, a command or a version such as 3.13.",
    )(command)
    command = click.option(
        "--nemo-gym-root",
        "--search-dir",
        "nemo_gym_roots",
        multiple=True,
        metavar="DIR",
        help="A NeMo Gym checkout (or unpacked wheel) whose server folders may be run (repeatable; "
        "--search-dir is NeMo Gym's name for it).",
    )(command)
    return command  # type: ignore[return-value]


ALLOW_UNSUPPORTED_PAIRING_ENV_VAR = "NEMO_GYM_ALLOW_UNSUPPORTED_PAIRING"


def _with_nemo_gym_selectors(func: F) -> F:
    """NeMo Gym's selection flags without a polygym counterpart: ``--benchmark``, ``--environment``
    and ``--agent-type`` exit 2 naming the flag and why (never silently dropped).
    ``--allow-unsupported-pairing``: polygym never refuses an agent or model that an environment
    does not declare, but NeMo Gym's own servers check their config at start, so the flag reaches
    them as NeMo Gym's ``NEMO_GYM_ALLOW_UNSUPPORTED_PAIRING=1`` (every child inherits it)."""

    @functools.wraps(func)
    def command(*args: Any, **kwargs: Any) -> Any:
        if kwargs.pop("allow_unsupported_pairing"):
            os.environ[ALLOW_UNSUPPORTED_PAIRING_ENV_VAR] = "1"
        given = [name for name in SELECTOR_FLAGS_NOT_PROVIDED if kwargs.pop(name)]
        if given:
            problems = [f"--{name.replace('_', '-')} {SELECTOR_FLAGS_NOT_PROVIDED[name]}" for name in given]
            raise click.UsageError("\n".join(problems))
        return func(*args, **kwargs)

    for name in SELECTOR_FLAGS_NOT_PROVIDED:
        flag = f"--{name.replace('_', '-')}"
        command = click.option(
            flag, name, multiple=True, metavar="NAME", help=f"NeMo Gym's {flag}: refused."
        )(command)
    command = click.option(
        "--allow-unsupported-pairing",
        is_flag=True,
        help="NeMo Gym's: passed to NeMo Gym's servers (polygym never refuses an agent or model "
        "an environment does not declare).",
    )(command)
    return command  # type: ignore[return-value]


def selector_options(func: F) -> F:
    """Add the repeatable selector flags, NeMo Gym's model flags and trailing ``key=value``
    overrides (Hydra's ``key=``, ``+key=``, ``++key=``) to a command."""
    func = _with_model_flags(func)
    func = _with_nemo_gym_flags(func)
    func = _with_nemo_gym_selectors(func)
    func = click.argument("overrides", nargs=-1, metavar="[KEY=VALUE]...")(func)
    func = click.option(
        "--config", "configs", multiple=True, metavar="PATH", help="A config file to merge (repeatable)."
    )(func)
    func = click.option(
        "--model-type",
        "model_types",
        multiple=True,
        metavar="TYPE",
        help="Merge responses_api_models/TYPE/configs/TYPE.yaml (repeatable).",
    )(func)
    func = click.option(
        "--resources-server",
        "resources_servers",
        multiple=True,
        metavar="NAME",
        help="Merge resources_servers/NAME/configs/NAME.yaml (repeatable).",
    )(func)
    return func


DEFAULT_MODEL_TYPE = "local_model"


def defines_model_server(paths: list[Path]) -> bool:
    """Whether any selected file declares a model server (so no default is needed)."""
    for path in paths:
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError):
            return True  # let the loader report the problem with its file and line
        blocks = data.values() if isinstance(data, dict) else []
        if any(isinstance(block, dict) and MODEL_KIND in block for block in blocks):
            return True
    return False


def load_stack_config(
    resources_servers: tuple[str, ...],
    model_types: tuple[str, ...],
    configs: tuple[str, ...],
    overrides: tuple[str, ...],
) -> StackConfig:
    """Resolve selectors and load the merged config, exiting with every problem listed.

    Without ``--model-type``, and when no selected file declares a model server, the embedded
    ``local_model`` is the policy: the stack then runs with nothing but installed packages. A
    NeMo Gym ``+config_paths=[...]`` override selects files too (and names its own model).
    """
    from polygym.stack.config import CONFIG_PATHS, load_config  # OmegaConf: only a run that loads configs

    try:
        paths = selector_paths(list(resources_servers), list(model_types), list(configs))
        includes = any(text.lstrip("+").startswith(f"{CONFIG_PATHS}=") for text in overrides)
        if paths and not includes and not model_types and not defines_model_server(paths):
            paths = selector_paths([], [DEFAULT_MODEL_TYPE], []) + paths
        if not paths and not includes:
            raise ConfigError(
                ["nothing selected: pass --resources-server NAME, --model-type TYPE or --config PATH"]
            )
        config = load_config(paths, list(overrides))
    except ConfigError as exc:
        fail(str(exc), exc.exit_code)
    for warning in config.warnings:
        click.secho(f"warning: {warning}", fg="yellow", err=True)
    say_folders(config)
    return config


def say_folders(config: StackConfig) -> None:
    """Name every server's folder that is not polygym's shipped one, so no swap is silent: a
    NeMo Gym root's, a config's own, or the working directory's (a warning when it shadows a
    shipped one). Servers run from the same folder are named together, once."""
    by_origin: dict[str, list[str]] = {}
    for spec in config.servers.values():
        if spec.directory != NO_FOLDER:
            origin = folder_origin(spec.kind, spec.implementation, spec.directory)
            if origin is not None:
                by_origin.setdefault(origin, []).append(spec.name)
    for origin, names in by_origin.items():
        shadows = SHADOWS in origin
        label = "warning" if shadows else "note"
        runs = "runs" if len(names) == 1 else "run"
        click.secho(
            f"{label}: {', '.join(names)} {runs} {origin}", fg="yellow" if shadows else None, err=True
        )


GIVEN = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT, ParameterSource.PROMPT)


def refuse_given(ctx: click.Context, reasons: Mapping[str, str]) -> None:
    """Exit 2 naming every option of ``reasons`` (parameter name -> why it does not apply) that the
    user gave, instead of silently ignoring it.

    "Given" is click's parameter source, not a comparison with the default, so an option passed
    with its default value (``--start-step 0``) is refused too: the user meant something by it.
    """
    flags = {param.name: param.opts[0] for param in ctx.command.params}
    problems = [
        f"{flags[name]} {why}" for name, why in reasons.items() if ctx.get_parameter_source(name) in GIVEN
    ]
    if problems:
        raise click.UsageError("\n".join(problems), ctx)


def console(stderr: bool = False) -> Console:
    """A rich console that does not squeeze tables to 80 columns when output goes to a file."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(width=None if stream.isatty() else 200, highlight=False, stderr=stderr)


def fail(message: str, code: int = EXIT_FAILURE) -> NoReturn:
    click.secho(f"error: {message}", fg="red", err=True)
    sys.exit(code)
