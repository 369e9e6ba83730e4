"""The head server: the stack's registry of server names and addresses, and its public config.

Servers register the address they actually bound (DESIGN §4: ports are bound, never probed), and
every client resolves names here, so nothing in the stack hard-codes a port.

Who may do what. The head listens on loopback, where every local process — other users' included —
can reach it, so:

* **Reads are open**: ``GET /``, ``GET /servers`` and ``GET /config``. A collector joining the
  stack (``gym eval run --head-url``) and NeMo Gym's own servers only read, and nothing read here
  is secret: addresses are not, and the config is served with secrets masked.
* **NeMo Gym's head routes are reads too**: ``GET /global_config_dict_yaml`` and
  ``GET /server_instances``. NeMo Gym's ``ServerClient`` fetches the first with a bare GET (no
  header, no secret: it has none to send) to resolve a server name to ``host``/``port``, and
  ``gym env status`` reads the second. NeMo Gym 0.7's collector (``gym eval run --no-serve``)
  reaches an agent only through an environment server that names it, so the first also lists,
  for every agent, the ``legacy_agent`` relay that NeMo Gym itself generates for an agent without
  one (``nemo_relays``). They carry what ``/config`` and ``/servers`` already serve
  openly — the config, masked again with ``polygym.redact`` here so a secret that reached the
  head unmasked still never leaves it, plus each registered server's address and pid — so serving
  them without the secret discloses nothing new, and requiring it would break every NeMo Gym
  server pointed at this stack.
* **Writes need the stack secret**: ``POST /register`` must carry the secret the launcher created
  for this stack (``STACK_SECRET_HEADER``), compared in constant time. Without it the answer is
  401, with a wrong one 403, so a process that is not part of the stack cannot take over a name
  (``policy_model``, an agent) and receive the rollouts meant for it.
* **A name is never silently replaced**: registering a name that is already held answers 409,
  unless it is the same server repeating its own registration (same url and pid: a retry whose
  first reply was lost). Replacing a server is the launcher's decision (``Registry.remove``, as
  when it restarts a dead one), taken in its own process.

Servers the launcher placed without handing them the secret — the inline backend's, or a NeMo Gym
server run unchanged, which knows nothing of it — are registered by the launcher itself, in
process (``Registry.register``): it knows their address because it started them. Every entry
records how it got in (``registered_by``), so ``gym env status`` shows what the registry holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import os
import time
from collections.abc import Container, Mapping
from typing import Any
from urllib.parse import urlsplit

import yaml
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from polygym import redact
from polygym.kinds import AGENT_KIND, ENVIRONMENT_KIND, LEGACY_RELAY
from polygym.net.replicas import slot_of
from polygym.servers.base import HTTPError, JsonEndpoint, error_response, json_response
from polygym.servers.inbound import InboundGuard

REQUIRED_FIELDS = ("name", "kind", "implementation", "url")
STACK_SECRET_HEADER = "x-polygym-stack-secret"
BY_LAUNCHER = "launcher"
"""``registered_by`` of a server the launcher registered in its own process."""
BY_SECRET = "stack secret"
"""``registered_by`` of a server that registered over HTTP with the stack secret."""
MAX_REGISTRATION_BYTES = 64 * 1024
"""A registration is a few hundred bytes; anything past this is refused (413) before it is kept."""
SAME_SERVER_FIELDS = ("url", "pid")
"""A repeated registration carrying the same values is the same server retrying, not a takeover."""


class Registry:
    """Running server replicas by slot (``slot_of``); waiters are woken whenever it changes."""

    def __init__(self) -> None:
        self.entries: dict[str, dict[str, Any]] = {}
        self._changed = asyncio.Event()

    def register(self, entry: dict[str, Any], registered_by: str = BY_LAUNCHER) -> None:
        """Add ``entry``; a name already held by another server is refused (409), never replaced."""
        missing = [f for f in REQUIRED_FIELDS if not entry.get(f)]
        if missing:
            raise HTTPError(422, f"registration is missing: {', '.join(missing)}", "validation_error")
        name = slot_of(entry)
        held = self.entries.get(name)
        if held is not None:
            if all(held.get(f) == entry.get(f) for f in SAME_SERVER_FIELDS):
                return
            raise HTTPError(
                409,
                f"server '{name}' is already registered (url {held['url']}, pid {held.get('pid')}); "
                "a registered name is only replaced by the stack's launcher",
                "name_taken",
            )
        self.entries[name] = {**entry, "registered_by": registered_by, "registered_at": time.time()}
        self._notify()

    def remove(self, name: str) -> None:
        """Forget slot ``name`` (the launcher, before it restarts that server or replica)."""
        if self.entries.pop(name, None) is not None:
            self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_changed(self, timeout_s: float) -> None:
        """Return when the registry changes, or after ``timeout_s``."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout_s)


def check_secret(request: Request, secret: str | None) -> None:
    """Raise 401/403 unless ``request`` carries the stack secret (compared in constant time).

    With no secret (a head whose launcher hands none out) every HTTP write is refused.
    """
    given = request.headers.get(STACK_SECRET_HEADER)
    if given is None:
        raise HTTPError(
            401,
            f"registering needs the stack secret in the {STACK_SECRET_HEADER} header: "
            "only servers started by this stack may register",
            "unauthenticated",
        )
    if secret is None or not hmac.compare_digest(given.encode("latin-1"), secret.encode("latin-1")):
        raise HTTPError(
            403, "wrong stack secret: this head server only admits its own stack's servers", "forbidden"
        )


HEAD_SERVER_KEY = "head_server"
"""NeMo Gym's top-level config key for the head's own address."""
RELAY_SUFFIX = "_environment_server"
"""What NeMo Gym 0.7 appends to the name of the relay it generates for an agent."""


def relay_name(agent: str, implementation: str, taken: Container[str]) -> str:
    """The name NeMo Gym 0.7 gives the ``legacy_agent`` relay it generates for ``agent``.

    Its rule, matched so that a command line written for NeMo Gym's own stack
    (``environment_server_name=...``) names the same relay here: the agent's implementation, else
    a trailing ``_agent``, is cut from the agent's name (``x_simple_agent`` -> ``x_environment_server``);
    a name already in the config falls back to the agent's full name, suffixed until it is free.
    """
    stem = agent.removesuffix(f"_{implementation}").removesuffix(implementation).rstrip("_")
    if stem == agent:
        stem = agent.removesuffix("_agent").rstrip("_")
    name = f"{stem or implementation}{RELAY_SUFFIX}"
    if name in taken:
        name = f"{agent}{RELAY_SUFFIX}"
    while name in taken:
        name = f"{name}{RELAY_SUFFIX}"
    return name


def fronted_agents(config: Mapping[str, Any]) -> set[str]:
    """The agents an environment server of ``config`` references, by NeMo Gym 0.7's rule
    (``environment_server_agent_refs``): any field ``{type: responses_api_agents, name}``, and an
    ``agent_server`` that leaves its type out."""
    names: set[str] = set()
    for block in config.values():
        impls = block.get(ENVIRONMENT_KIND) if isinstance(block, Mapping) else None
        for inner in impls.values() if isinstance(impls, Mapping) else ():
            for field, ref in inner.items() if isinstance(inner, Mapping) else ():
                if _names_an_agent(field, ref):
                    names.add(ref["name"])
    return names


def _names_an_agent(field: str, ref: Any) -> bool:
    if not isinstance(ref, Mapping) or not isinstance(ref.get("name"), str):
        return False
    kind = ref.get("type")
    return kind == AGENT_KIND or (field == "agent_server" and kind is None)


def nemo_relays(
    config: dict[str, Any], entries: Mapping[str, dict[str, Any]], declared: Mapping[str, str]
) -> dict[str, dict[str, Any]]:
    """A ``legacy_agent`` environment server per running agent, at the agent's own address.

    NeMo Gym 0.7's collector sends a row's ``/run`` and the final ``/aggregate_metrics`` to the
    environment server that names the row's agent, never to the agent. Its ``legacy_agent`` relay
    forwards both unchanged, and a polygym agent answers both itself, so the relay's address is the
    agent's: no process is added and a rollout takes no extra hop. Relays the config declared
    (``declared``: relay -> agent, see ``StackConfig.relays``) keep their names; every other agent
    gets the name NeMo Gym would generate (``relay_name``), but one that an environment server of
    the config already fronts (``fronted_agents``), which NeMo Gym gives no relay either.
    """
    relays: dict[str, dict[str, Any]] = {}
    named = {agent: relay for relay, agent in declared.items()}
    fronted = fronted_agents(config)
    for entry in entries.values():
        if entry["kind"] != AGENT_KIND or slot_of(entry) != entry["name"] or entry["name"] in fronted:
            continue
        agent = entry["name"]
        name = named.get(agent) or relay_name(agent, entry["implementation"], {*config, *relays})
        address = urlsplit(str(entry["url"]))
        relay = {"agent_server": {"type": AGENT_KIND, "name": agent}}
        relays[name] = {
            ENVIRONMENT_KIND: {LEGACY_RELAY: {**relay, "host": address.hostname, "port": address.port}}
        }
    return relays


def nemo_config(
    public_config: dict[str, Any],
    entries: dict[str, dict[str, Any]],
    head_url: str,
    relays: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The stack's config as NeMo Gym's global config: ``name -> kind -> implementation -> {host, port}``.

    polygym binds ports at start (DESIGN §4), so the addresses come from the registry, written
    where NeMo Gym's ``get_first_server_config_dict`` looks for them; the agents' environment
    servers come from ``nemo_relays``.
    """
    config = redact.mask_secrets(public_config)
    for name, entry in entries.items():
        address = urlsplit(str(entry["url"]))
        server = (
            config.setdefault(name, {}).setdefault(entry["kind"], {}).setdefault(entry["implementation"], {})
        )
        server.update(host=address.hostname, port=address.port)
    config.update(nemo_relays(config, entries, relays or {}))
    head = urlsplit(head_url)
    config[HEAD_SERVER_KEY] = {"host": head.hostname, "port": head.port}
    return config


def server_instance(entry: dict[str, Any]) -> dict[str, Any]:
    """One registry entry as NeMo Gym's head lists a server instance (``gym env status`` reads it)."""
    address = urlsplit(str(entry["url"]))
    return {
        "process_name": entry["name"],
        "config_path": entry["name"],
        "server_type": entry["kind"],
        "name": entry["implementation"],
        "host": address.hostname,
        "port": address.port,
        "url": entry["url"],
        "pid": entry.get("pid"),
        "start_time": entry.get("registered_at"),
    }


def head_app(
    registry: Registry,
    public_config: dict[str, Any],
    stack_id: str,
    secret: str | None = None,
    relays: Mapping[str, str] | None = None,
) -> Starlette:
    """The head server's ASGI app; ``secret`` admits HTTP registrations (see the module docstring);
    ``relays`` are the config's ``legacy_agent`` environment servers (relay -> agent)."""

    async def liveness(request: Request) -> Response:
        return json_response(
            {
                "status": "ok",
                "kind": "head",
                "stack_id": stack_id,
                "pid": os.getpid(),
                "servers": len(registry.entries),
            }
        )

    async def servers(request: Request) -> Response:
        return json_response(list(registry.entries.values()))

    async def config(request: Request) -> Response:
        return json_response(public_config)

    async def global_config_dict_yaml(request: Request) -> Response:
        """YAML text sent as a JSON string, as NeMo Gym's head does and its client decodes."""
        config = nemo_config(public_config, registry.entries, str(request.base_url), relays)
        return json_response(yaml.safe_dump(config, sort_keys=False))

    async def server_instances(request: Request) -> Response:
        return json_response([server_instance(e) for e in registry.entries.values()])

    async def register_entry(body: Any, request: Request) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise HTTPError(400, "registration must be a JSON object", "invalid_request")
        registry.register(body, BY_SECRET)
        return {"registered": body["name"]}

    registration = JsonEndpoint(register_entry)

    async def register(request: Request) -> Response:
        """The secret is checked before the body is read: a stranger's body is never parsed."""
        try:
            check_secret(request, secret)
        except HTTPError as exc:
            return error_response(exc.status, exc.error_type, exc.message)
        return await registration.handle_request(request)

    return Starlette(
        routes=[
            Route("/", liveness, methods=["GET"]),
            Route("/servers", servers, methods=["GET"]),
            Route("/config", config, methods=["GET"]),
            Route("/global_config_dict_yaml", global_config_dict_yaml, methods=["GET"]),
            Route("/server_instances", server_instances, methods=["GET"]),
            Route("/register", register, methods=["POST"]),
        ],
        middleware=[Middleware(InboundGuard, max_body_bytes=MAX_REGISTRATION_BYTES)],
    )
