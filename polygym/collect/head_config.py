"""The running stack's config as a collector reads it from the stack's head server.

A polygym head serves it at ``GET /config`` (JSON, secrets masked); NeMo Gym's head serves the
same dict as YAML text in a JSON string at ``GET /global_config_dict_yaml``. Routing rows
(``collect.task_source``), the run's stack identity (``collect.run_stack``) and reverify's agent
map (``collect.reverify``) all read it here, so they see one config by one rule against either
project's head.
"""

from __future__ import annotations

from typing import Any

from polygym.net.client import ServerClient

HEAD_CONFIG_TIMEOUT_S = 30.0


async def head_config(client: ServerClient) -> dict[str, Any] | None:
    """The config of the stack ``client`` joined; None when it has no head server or its head serves
    none. Raises ``ServerCallError`` when the head cannot be reached and ``ValueError`` when what
    it serves does not parse."""
    if client.head_url is None:
        return None
    reply = await client.request_url("GET", f"{client.head_url}/config", timeout_s=HEAD_CONFIG_TIMEOUT_S)
    if reply.status == 200:
        config = reply.json()
        return config if isinstance(config, dict) else None
    url = f"{client.head_url}/global_config_dict_yaml"
    reply = await client.request_url("GET", url, timeout_s=HEAD_CONFIG_TIMEOUT_S)
    text = reply.json() if reply.status == 200 else None
    return _nemo_gym_yaml(text) if isinstance(text, str) else None


def _nemo_gym_yaml(text: str) -> dict[str, Any] | None:
    import yaml  # only against NeMo Gym's head: polygym's own runs never pay for the import

    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"its /global_config_dict_yaml does not parse: {exc}") from None
    return config if isinstance(config, dict) else None
