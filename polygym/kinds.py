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

UPSTREAM_PROBE_TIMEOUT_S = 3.0
"""Seconds a start-up or ``GET /`` probe of a model server waits for its upstream: enough for a
distant API's models route, short enough that ``gym env status`` answers at once."""
UPSTREAM_PROBE = "upstream_probe"
"""Key of a model server's ``GET /`` answer listing what each upstream probe found (absent:
nothing to probe)."""
