"""``external`` servers: a server of the stack that someone else runs, at a URL.

A vLLM fleet, a Kubernetes service in front of an environment, a model gateway: the stack does not
start them, but its agents must reach them by name like any other server. The config says where:

```yaml
policy_model:
  responses_api_models:
    external:
      url: http://vllm.models.svc.cluster.local:8000   # or a list: one replica per URL
      health_path: /health                               # what gym env status pings [default: /]
```

The launcher registers each URL with the head server (``registered_by: launcher``, replica ``i``
for the i-th URL of a list, so ``net.replicas`` routes between them), ``gym env status`` lists and
pings them, and references (``{type: responses_api_models, name: policy_model}``) resolve to them.
Nothing is started, stopped or restarted: a server that is down shows as down, and calls to it fail
as calls to any unreachable server do (recorded, resumable).

What is refused, each with the server and the source of its config, because it would be unsafe
or mean two things: a URL that is not ``http``/``https`` or has no host; credentials in the URL
(``gym env status`` and the head's registry would show them: put a key in the server's headers
config of the agent or model instead); a query, fragment or path (polygym appends the routes,
``/v1/responses``, ``/verify``, to the server's root); the same URL twice; placement keys
(``replicas``, ``num_cpus`` ...: whoever runs it places it); and any other key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from polygym.errors import ConfigError
from polygym.stack.placement import PLACEMENT_KEYS

EXTERNAL = "external"
"""The implementation name that marks a server as run by someone else."""
NO_FOLDER = Path()
"""An external server has no implementation folder; ``ServerSpec.directory`` holds this."""
KEYS = ("url", "health_path")
DEFAULT_HEALTH_PATH = "/"


def _url_problem(url: Any) -> str | None:
    """Why ``url`` cannot name an external server, or None when it can."""
    if not isinstance(url, str) or not url:
        return f"url must be a non-empty string, got {url!r}"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (a bad port raises here)
    except ValueError as exc:
        return f"url {url!r} is not a valid URL ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"url {url!r} must be http:// or https:// with a host"
    if parts.username is not None or parts.password is not None:
        return "url must not carry credentials (they would be shown by gym env status and the registry)"
    if parts.query or parts.fragment or parts.path not in ("", "/"):
        return f"url {url!r} must be the server's root: polygym appends the routes (/v1/responses, /verify)"
    return None


def external_entries(name: str, kind: str, config: dict[str, Any], source: str) -> list[dict[str, Any]]:
    """The registry entries of external server ``name`` (its config block read from ``source``),
    one per URL; a ConfigError naming the server and its source lists every problem at once."""
    where = f"{name}.{kind}.{EXTERNAL} (from {source})"
    problems = [
        f"{where}: {key} does not apply to an external server: whoever runs it places it"
        for key in config
        if key in PLACEMENT_KEYS
    ]
    problems += [
        f"{where}: unknown key '{key}'; an external server takes {', '.join(KEYS)}"
        for key in config
        if key not in KEYS and key not in PLACEMENT_KEYS
    ]
    given = config.get("url")
    urls = given if isinstance(given, list) else [given]
    if not urls:
        problems.append(f"{where}: url must name at least one URL")
    problems += [f"{where}: {problem}" for url in urls if (problem := _url_problem(url)) is not None]
    roots = [str(url).rstrip("/") for url in urls]
    problems += [
        f"{where}: url {url!r} is listed twice" for url in sorted(set(roots)) if roots.count(url) > 1
    ]
    health_path = config.get("health_path", DEFAULT_HEALTH_PATH)
    if not isinstance(health_path, str) or not health_path.startswith("/") or "?" in health_path:
        problems.append(f"{where}: health_path must be a path starting with '/', got {health_path!r}")
    if problems:
        raise ConfigError(problems)
    return [
        {
            "name": name,
            "kind": kind,
            "implementation": EXTERNAL,
            "url": root,
            "pid": None,
            "health_path": health_path,
            **({"replica": index} if len(roots) > 1 else {}),
        }
        for index, root in enumerate(roots)
    ]
