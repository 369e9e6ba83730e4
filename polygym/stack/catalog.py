"""Where server implementations and their config files live on disk.

Users keep NeMo Gym's layout: ``resources_servers/<name>/``, ``responses_api_agents/<name>/`` and
``responses_api_models/<name>/``, each with ``configs/<name>.yaml``. They may run ``gym`` from their own
checkout (with environments of their own) or rely on the ones shipped with polygym, so two roots are
searched: the working directory first (a user's folder shadows a shipped one of the same name), then
the project root that holds the installed server packages.

NeMo Gym's own folders are searched after those (``stack.nemo_gym_server`` runs them): a NeMo Gym
checkout or unpacked wheel named by ``--nemo-gym-root`` / ``POLYGYM_NEMO_GYM_ROOT`` (several joined
with ``os.pathsep``) or by a config's ``nemo_gym_root``, then an installed ``nemo-gym`` package.

One rule for names, so that no swap is silent: a name resolves to the first root that has it, and
polygym ships a folder under a NeMo Gym name only when it behaves as NeMo Gym's does on NeMo Gym's
rows, tools and stored responses (``simple_agent``, ``reasoning_gym``, the ``example_*`` servers,
``mcqa``, the ``openai``/``vllm`` models; the environments are tested on NeMo Gym's example rows
in ``tests/e2e/test_nemo_gym_rows_e2e.py``). Where polygym's
behaviour differs it has its own name (polygym's reset/step agent is ``episodic_agent``, since
NeMo Gym's ``gymnasium_agent`` speaks another protocol), so NeMo Gym's name reaches NeMo Gym's
folder. A server block with ``nemo_gym: true`` takes its implementation from the NeMo Gym roots
only (NeMo Gym's ``simple_agent`` rather than polygym's, say). ``folder_origin`` says where each
folder comes from when it is not the shipped one, and when a shipped one stands for a NeMo Gym
namesake; a working directory's folder that shadows a shipped one is named as such.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from pathlib import Path

from polygym.errors import ConfigError
from polygym.kinds import FOLDER_KINDS
from polygym.suggest import closest

NEMO_GYM_ROOT_ENV_VAR = "POLYGYM_NEMO_GYM_ROOT"
NEMO_GYM_ROOT_KEY = "nemo_gym_root"
"""Config key naming a NeMo Gym checkout (or unpacked wheel) whose server folders a stack may run."""
NEMO_GYM_FORK_KEY = "nemo_gym_fork"
"""Config key: ``false`` starts every NeMo Gym server as a fresh interpreter instead of forking it
from one that imported nemo_gym's dependencies once (``stack.nemo_gym_forkserver``)."""
RAY_HEAD_NODE_KEY = "ray_head_node_address"
"""NeMo Gym's top-level key: the Ray cluster its servers that use Ray join (``stack.nemo_gym_ray``)."""
NEMO_GYM_KEY = "nemo_gym"
"""A server block's ``nemo_gym: true``: its implementation comes from NeMo Gym's folders only."""
SHADOWS = "shadows polygym's shipped"
_config_roots: ContextVar[tuple[Path, ...]] = ContextVar("nemo_gym_config_roots", default=())


def project_root() -> Path:
    """The folder that holds the shipped server folders (``resources_servers/`` and friends).

    ``polygym`` and the three server packages are installed side by side (an editable install
    points at the checkout, a wheel at site-packages), so polygym's own location finds them even
    when the working directory has a ``resources_servers/`` folder of the user's own that would
    shadow the installed package on import.
    """
    return Path(__file__).resolve().parents[2]


def installed_nemo_gym_root() -> Path | None:
    """Where an installed ``nemo-gym`` keeps its server folders (its site-packages), if installed.

    ``importlib.metadata`` is imported here: it brings ``email`` and ``zipfile`` (~50 ms), and
    every ``gym`` command imports this module while few look for NeMo Gym's folders."""
    from importlib import metadata

    try:
        dist = metadata.distribution("nemo-gym")
    except metadata.PackageNotFoundError:
        return None
    return Path(str(dist.locate_file("")))


def nemo_gym_roots() -> list[Path]:
    """NeMo Gym roots in priority order: the environment variable, a config's key, the installed package."""
    named = [Path(p).expanduser() for p in os.environ.get(NEMO_GYM_ROOT_ENV_VAR, "").split(os.pathsep) if p]
    installed = installed_nemo_gym_root()
    return [*named, *_config_roots.get(), *([installed] if installed is not None else [])]


@contextlib.contextmanager
def config_nemo_gym_root(root: str | None) -> Iterator[None]:
    """Search ``root`` (a config's ``nemo_gym_root``) too while that config is being loaded."""
    token = _config_roots.set((*_config_roots.get(), Path(root).expanduser())) if root else None
    try:
        yield
    finally:
        if token is not None:
            _config_roots.reset(token)


def _unique(roots: Iterable[Path]) -> list[Path]:
    kept: list[Path] = []
    for root in roots:
        if all(root.resolve() != seen.resolve() for seen in kept):
            kept.append(root)
    return kept


def _roots() -> list[Path]:
    """Search roots in priority order, without duplicates (cwd is often the project root)."""
    return _unique([Path.cwd(), project_root(), *nemo_gym_roots()])


def _is_folder_name(name: str) -> bool:
    """Folder names that can hold an implementation: not private, hidden, caches, or path tricks."""
    return bool(name) and not name.startswith(("_", ".")) and "\\" not in name and name != "__pycache__"


def _is_implementation_name(name: str) -> bool:
    """A folder name, or NeMo Gym's nested ``folder/variant`` (``conversational_tool_use/simulation``
    is ``responses_api_agents/conversational_tool_use/simulation/``, which NeMo Gym's launcher runs
    from its own folder and environment); each part a folder name, so no ``..`` or absolute path."""
    return all(_is_folder_name(part) for part in name.split("/"))


def tree_root(path: Path) -> Path | None:
    """The root of the server tree that holds ``path`` (``<root>/<kind>/<name>[/<variant>]/...``)."""
    for parent in path.resolve().parents:
        if parent.name in FOLDER_KINDS:
            return parent.parent
    return None


def _check_kind(kind: str) -> None:
    if kind not in FOLDER_KINDS:
        raise ConfigError([describe_unknown("server kind", kind, FOLDER_KINDS)])


def describe_unknown(what: str, name: str, known: Iterable[str], origin: str | None = None) -> str:
    """``unknown <what> 'name' (from origin). Did you mean 'x'? Known: ...`` for every name error."""
    known_list = sorted(set(known))
    text = f"unknown {what} '{name}'"
    if origin:
        text += f" (from {origin})"
    text += "."
    match = closest(name, known_list)
    if match:
        text += f" Did you mean '{match[0]}'?"
    return text + f" Known: {', '.join(known_list) if known_list else '(none)'}"


def list_implementations(kind: str) -> list[str]:
    """Every implementation of ``kind`` found under any root, sorted, each name once."""
    _check_kind(kind)
    names: set[str] = set()
    for root in _roots():
        folder = root / kind
        if folder.is_dir():
            names.update(p.name for p in folder.iterdir() if p.is_dir() and _is_folder_name(p.name))
    return sorted(names)


def describe_missing_implementation(kind: str, implementation: str, origin: str | None = None) -> str:
    """Explain a missing implementation: did-you-mean, what exists, and which folders were searched."""
    searched = ", ".join(str(root / kind) for root in _roots())
    message = describe_unknown(f"{kind} implementation", implementation, list_implementations(kind), origin)
    return f"{message} (searched {searched})"


def _find(kind: str, implementation: str, nemo_gym_only: bool = False) -> Path | None:
    if not _is_implementation_name(implementation):
        return None
    for root in _unique(nemo_gym_roots()) if nemo_gym_only else _roots():
        candidate = root / kind / implementation
        if candidate.is_dir():
            return candidate
    return None


def find_implementation_dir(kind: str, implementation: str, nemo_gym_only: bool = False) -> Path:
    """The folder of ``kind/implementation`` in the first root that has it (``nemo_gym_only``: the
    first NeMo Gym root, for a block marked ``nemo_gym: true``)."""
    _check_kind(kind)
    found = _find(kind, implementation, nemo_gym_only)
    if found is None:
        if nemo_gym_only:
            searched = ", ".join(str(root / kind) for root in nemo_gym_roots()) or "no NeMo Gym root"
            raise ConfigError(
                [
                    f"{kind}/{implementation} with {NEMO_GYM_KEY}: true: not found in NeMo Gym's folders "
                    f"(searched {searched}; name one with --nemo-gym-root or {NEMO_GYM_ROOT_KEY})"
                ]
            )
        raise ConfigError([describe_missing_implementation(kind, implementation)])
    return found


def _under(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


def folder_origin(kind: str, implementation: str, directory: Path) -> str | None:
    """Where a server's folder comes from, said when it is not polygym's shipped one, or when a
    NeMo Gym root has a folder of the same name (None otherwise).

    A folder in the working directory that has a shipped namesake shadows it: that is said too,
    since the user may not know the working directory holds one (a stale copy, another project).
    """
    shipped = project_root() / kind / implementation
    if _under(directory, project_root() / kind):
        namesake = next(
            (root for root in _unique(nemo_gym_roots()) if (root / kind / implementation).is_dir()), None
        )
        if namesake is None:
            return None
        return (
            f"polygym's shipped {kind}/{implementation}, which behaves as the same-named folder of NeMo Gym "
            f"root {namesake} (to run NeMo Gym's, mark the block {NEMO_GYM_KEY}: true)"
        )
    for root in _unique(nemo_gym_roots()):
        if _under(directory, root):
            return f"NeMo Gym's folder {directory} (NeMo Gym root {root})"
    if in_nemo_gym_tree(directory):  # a config file of NeMo Gym's tree named by its path
        return f"NeMo Gym's folder {directory} (NeMo Gym root {tree_root(directory)})"
    where = "the working directory's folder" if _under(directory, Path.cwd()) else "the folder"
    text = f"{where} {directory}"
    if shipped.is_dir() and shipped.resolve() != directory.resolve():
        text += f", which {SHADOWS} {kind}/{implementation} ({shipped})"
    return text


_IMPORTS_NEMO_GYM = re.compile(r"^\s*(?:from|import)\s+nemo_gym\b", re.MULTILINE)


def is_nemo_gym_folder(directory: Path, entrypoint: str = "app.py") -> bool:
    """Whether a server folder is NeMo Gym's, to run as NeMo Gym runs it: any folder of NeMo Gym's
    own tree (``in_nemo_gym_tree``: a library folder such as ``sec_local_index``, whose
    entrypoint imports no ``nemo_gym``, included), or one elsewhere whose entrypoint imports it."""
    return in_nemo_gym_tree(directory) or imports_nemo_gym(directory, entrypoint)


def in_nemo_gym_tree(directory: Path) -> bool:
    """Whether the tree holding ``directory`` (``tree_root``) holds the ``nemo_gym`` package too:
    a NeMo Gym checkout, unpacked wheel or site-packages, however it was named (``--nemo-gym-root``,
    a config's ``nemo_gym_root``, the installed package)."""
    root = tree_root(directory)
    return root is not None and (root / "nemo_gym" / "__init__.py").is_file()


def imports_nemo_gym(directory: Path, entrypoint: str = "app.py") -> bool:
    """Whether a server folder is NeMo Gym's (its entrypoint imports ``nemo_gym``), not polygym's.
    An entrypoint other than the folder's ``app.py`` may reach NeMo Gym through it: the agent of
    ``legal_agent_bench.yaml`` is the ``harbor_agent`` folder run from
    ``../../resources_servers/legal_agent_bench/harbor_bridge.py``, a subclass of that folder's
    server that imports no ``nemo_gym`` itself. The folder's own ``app.py`` decides then too."""
    return any(_imports_nemo_gym(directory / name) for name in dict.fromkeys([entrypoint, "app.py"]))


def _imports_nemo_gym(path: Path) -> bool:
    try:
        return bool(_IMPORTS_NEMO_GYM.search(path.read_text(errors="replace")))
    except OSError:
        return False


def folder_of_config(kind: str, config_file: Path) -> Path | None:
    """The server folder ``<kind>/<folder>/`` whose ``configs/`` holds ``config_file``, if any.

    NeMo Gym configs may name an implementation that is not a folder name: a folder ships several
    variants (``resources_servers/ns_tools/configs/ns_tools_arxiv.yaml`` declares ``ns_tools_arxiv``),
    all run by that folder's code. The folder that holds the config file is then the implementation.
    """
    parent = config_file.resolve().parent
    if parent.name != "configs" or parent.parent.parent.name != kind:
        return None
    folder = parent.parent
    return folder if (folder / "app.py").is_file() or any(folder.glob("*.py")) else None


def _selector_path(kind: str, name: str, flag: str, problems: list[str]) -> Path | None:
    """``<kind>/<name>/configs/<name>.yaml``, or None after recording why it is not there."""
    folder = _find(kind, name)
    if folder is None:
        known = list_implementations(kind)
        problems.append(f"{flag} {name}: " + describe_unknown(f"{kind} implementation", name, known))
        return None
    config = folder / "configs" / f"{name}.yaml"
    if not config.is_file():
        problems.append(f"{flag} {name}: {folder} has no config file configs/{name}.yaml")
        return None
    return config


def selector_paths(resources_servers: list[str], model_types: list[str], configs: list[str]) -> list[Path]:
    """Turn ``--model-type``/``--resources-server``/``--config`` selectors into files to merge.

    Model types come first so that an environment's own file can refine model settings, and explicit
    ``--config`` files come last because they are the user's most specific intent. Every selector is
    kept and merged in order, as NeMo Gym 0.7 does (0.4 kept only the last repeated one). All bad
    selectors are reported together so one run shows every typo.
    """
    problems: list[str] = []
    paths: list[Path] = []
    for flag, kind, names in (
        ("--model-type", "responses_api_models", model_types),
        ("--resources-server", "resources_servers", resources_servers),
    ):
        for name in names:
            path = _selector_path(kind, name, flag, problems)
            if path is not None:
                paths.append(path)
    for text in configs:
        path = Path(text).expanduser()
        if not path.is_file():
            reason = "is not a file" if path.exists() else "not found"
            problems.append(f"--config {text}: config file {reason} (relative to {Path.cwd()})")
            continue
        paths.append(path)
    if problems:
        raise ConfigError(problems)
    return paths


def env_yaml_paths() -> list[Path]:
    """Existing ``env.yaml`` files: project root first, then the working directory (which wins)."""
    found: list[Path] = []
    for root in (project_root(), Path.cwd()):
        candidate = root / "env.yaml"
        if candidate.is_file() and all(candidate.resolve() != p.resolve() for p in found):
            found.append(candidate)
    return found
