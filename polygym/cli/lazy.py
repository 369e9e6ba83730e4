"""A command group whose commands are imported when first looked up.

``gym eval run`` used to import every group's and every sibling command's dependencies (blending,
training, the viewer, reverify and compare: about a second of a 2,000-row run's time outside its
window) before doing anything. A group built with ``commands=LazyCommands({...})`` imports a
command's module only when that command is asked for; ``gym --help`` still lists them all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping

import click


class LazyCommands(MutableMapping[str, click.Command]):
    """A group's ``commands``: name -> command, each built by its loader when first looked up;
    names and membership are known without loading anything (``gym --help`` loads them all)."""

    def __init__(self, loaders: dict[str, Callable[[], click.Command]]) -> None:
        self._loaders = dict(loaders)
        self._loaded: dict[str, click.Command] = {}

    def __getitem__(self, name: str) -> click.Command:
        if name not in self._loaded:
            self._loaded[name] = self._loaders[name]()
        return self._loaded[name]

    def __setitem__(self, name: str, command: click.Command) -> None:
        self._loaded[name] = command
        self._loaders.pop(name, None)

    def __delitem__(self, name: str) -> None:
        if name not in self:
            raise KeyError(name)
        self._loaded.pop(name, None)
        self._loaders.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self._loaded or name in self._loaders

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys([*self._loaders, *self._loaded]))

    def __len__(self) -> int:
        return len(set(self._loaders) | set(self._loaded))
