"""The three kinds of server, by the config keys NeMo Gym names them with, and the names a kind's
``GET /`` answer adds (a model server's upstream probe).

A module of its own that imports nothing: the collector, the config loader and the command line
name kinds on paths that never touch the wire models, and reaching these names through
``polygym.protocol`` made every ``gym eval run`` import pydantic and build those models (~0.2 s of
its start) before its first rollout.
"""

RESOURCES_KIND = "resources_servers"
AGENT_KIND = "responses_api_agents"
MODEL_KIND = "responses_api_models"
SERVER_KINDS: tuple[str, ...] = (RESOURCES_KIND, AGENT_KIND, MODEL_KIND)
ENVIRONMENT_KIND = "environment_servers"
"""NeMo Gym 0.7's fourth kind: a server that runs one episode per ``/run`` (its ``single_agent_turn``
drives an agent against a resources server). polygym ships none; it runs NeMo Gym's folders."""
ENVIRONMENT_ROUTES = "environment_server_routes"
"""NeMo Gym 0.7's top-level config map: materialized taskset -> the environment server running its rows."""
LEGACY_RELAY = "legacy_agent"
"""NeMo Gym 0.7's environment server that relays each rollout to one agent unchanged."""
FOLDER_KINDS: tuple[str, ...] = (*SERVER_KINDS, ENVIRONMENT_KIND)
"""Every kind that names a tree of server folders (``<root>/<kind>/<name>/``)."""

UPSTREAM_PROBE_TIMEOUT_S = 3.0
"""Seconds a start-up or ``GET /`` probe of a model server waits for its upstream: enough for a
distant API's models route, short enough that ``gym env status`` answers at once."""
UPSTREAM_PROBE = "upstream_probe"
"""Key of a model server's ``GET /`` answer listing what each upstream probe found (absent:
nothing to probe)."""
