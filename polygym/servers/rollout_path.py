"""NeMo Gym 0.7's rollout prefix on a server path: ``/ng-rollout/<rollout id>[/training-token-capture]/...``.

NeMo Gym's agents and environment servers tag every call of one rollout with its id in the path
(``nemo_gym/server_utils.py``'s ``rollout_path_prefix``; ``config_types.py``'s ``ROLLOUT_PATH_PREFIX``
and ``TOKEN_CAPTURE_PATH_SEGMENT``): its ``single_agent_turn`` calls an agent's
``/ng-rollout/<key>/v1/responses``, and that agent calls its model server under the same prefix.
The prefix is how NeMo Gym's own model servers file captured calls by rollout; polygym's servers
capture nothing by rollout id, so they serve such a path as the route it ends with.
"""

from __future__ import annotations

import re

from polygym.net.asgi_transport import Scope

_PREFIX = re.compile(r"^/ng-rollout/[A-Za-z0-9][A-Za-z0-9._-]*(?:/training-token-capture)?(?=/)")


def without_rollout_prefix(scope: Scope) -> Scope:
    """``scope`` with the path the prefix decorates (the same scope when it has no prefix)."""
    path = scope["path"]
    found = _PREFIX.match(path)
    if found is None:
        return scope
    tail = path[found.end() :]
    return {**scope, "path": tail, "raw_path": tail.encode()}
