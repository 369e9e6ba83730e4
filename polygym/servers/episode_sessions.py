"""NeMo Gym 0.7's typed resources seed: an environment server names the session it opens.

An environment server (NeMo Gym's ``single_agent_turn``) seeds a resources server with
``{resources_session_id, episode_id, task_id, task_data}`` and expects
``{resources_session_id, resources_tools?}`` back with a session cookie, then closes it with
``POST /close_session {resources_session_id, episode_id}``. The rules, from NeMo Gym 0.7.0's
``nemo_gym/base_resources_server.py`` (``ResourcesSeedSessionRequest``,
``ResourcesSeedSessionResponse``, ``close_resources_session``): repeating a seed with the same
id, episode and task returns the session it opened; the same id with another episode or task is
refused; an id that was closed (even one never seeded) cannot be seeded afterwards.

polygym's sessions are keyed by their cookie, so this module keeps which session each named one
is, and which names were closed. Both are bounded (``MAX_NAMED``, oldest dropped first): NeMo Gym
lets a server keep them until it stops, and a long run opens one per episode.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

TYPED_SEED_KEYS = frozenset({"resources_session_id", "episode_id", "task_id", "task_data"})
MAX_NAMED = 65_536
"""Named sessions (and closed names) remembered; a retry comes within seconds, not 65,536 episodes later."""


@dataclass(frozen=True)
class TypedSeed:
    """A typed seed request: the session's name, who asks for it, and the task's row."""

    resources_session_id: str
    identity: tuple[str, str]
    """The episode and the task, as canonical JSON (a repeated seed must match both)."""
    task_data: dict[str, Any]


def typed_seed(body: Any) -> TypedSeed | None:
    """The typed seed in ``body``, or None for a row (an agent's seed); NeMo Gym's model forbids
    other keys, so exactly its four keys make a typed seed. Raises ``ValueError`` when they are
    malformed."""
    if not isinstance(body, Mapping) or set(body) != TYPED_SEED_KEYS:
        return None
    name, episode, task, data = (
        body[key] for key in ("resources_session_id", "episode_id", "task_id", "task_data")
    )
    if not isinstance(name, str) or not name:
        raise ValueError("resources_session_id: must be a non-empty string")
    if not isinstance(episode, Mapping) or not isinstance(task, Mapping) or not isinstance(data, Mapping):
        raise ValueError("episode_id, task_id and task_data: must be objects")
    return TypedSeed(name, (_canonical(episode), _canonical(task)), dict(data))


def _canonical(value: Mapping[str, Any]) -> str:
    return repr(sorted(value.items()))


class EpisodeSessions:
    """Named sessions -> (session id, identity), and the names already closed."""

    def __init__(self, limit: int = MAX_NAMED) -> None:
        self.limit = limit
        self._named: OrderedDict[str, tuple[str, tuple[str, str]]] = OrderedDict()
        self._closed: OrderedDict[str, None] = OrderedDict()

    def existing(self, seed: TypedSeed) -> str | None:
        """The session a repeated seed opened (None for a new name); raises ``ValueError`` when
        the name was closed or belongs to another episode or task."""
        if seed.resources_session_id in self._closed:
            raise ValueError(f"resources session {seed.resources_session_id!r} is already closed")
        found = self._named.get(seed.resources_session_id)
        if found is None:
            return None
        session_id, identity = found
        if identity != seed.identity:
            raise ValueError("resources_session_id is already bound to another episode or task")
        return session_id

    def bind(self, seed: TypedSeed, session_id: str) -> None:
        self._remember(self._named, seed.resources_session_id, (session_id, seed.identity))

    def close(self, name: str) -> str | None:
        """Forget ``name`` (never to be seeded again); the session id it had, if any."""
        found = self._named.pop(name, None)
        self._remember(self._closed, name, None)
        return found[0] if found is not None else None

    def _remember(self, table: OrderedDict[str, Any], key: str, value: Any) -> None:
        table[key] = value
        table.move_to_end(key)
        while len(table) > self.limit:
            table.popitem(last=False)
