"""polygym: train and evaluate LLM policies on many reinforcement-learning environments at once.

The names exported here are the authoring surface, all an environment is written with (and the
bases of agents and model servers)::

    from polygym import ResourcesServer, Session, VerifyRequest, VerifyResponse, tool, check_env

They are imported on first use (PEP 562 ``__getattr__``): ``import polygym`` is paid by every
``gym`` command and every worker process, and importing the servers eagerly would add Starlette,
aiohttp and pydantic (most of a second) to each. Type checkers read the imports below instead.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from polygym.authoring.check import check_env, check_env_async
    from polygym.net.client import ServerCallError
    from polygym.protocol import (
        SeedSessionRequest,
        VerifyRequest,
        VerifyResponse,
        function_call_item,
        function_call_output_item,
        item_text,
        message_item,
        new_response,
    )
    from polygym.servers.agent import Agent, AgentConfig
    from polygym.servers.base import HTTPError, ServerConfig
    from polygym.servers.cpu_pool import CpuPool, CpuTimeout
    from polygym.servers.episodic import EpisodicConfig, EpisodicServer, StepResult
    from polygym.servers.model import ModelServer, UpstreamConfig
    from polygym.servers.resources import ResourcesServer, ResourcesServerConfig, tool
    from polygym.servers.sessions import Session

_HOMES: dict[str, tuple[str, ...]] = {
    "polygym.authoring.check": ("check_env", "check_env_async"),
    "polygym.net.client": ("ServerCallError",),
    "polygym.protocol": (
        "SeedSessionRequest",
        "VerifyRequest",
        "VerifyResponse",
        "function_call_item",
        "function_call_output_item",
        "item_text",
        "message_item",
        "new_response",
    ),
    "polygym.servers.agent": ("Agent", "AgentConfig"),
    "polygym.servers.base": ("HTTPError", "ServerConfig"),
    "polygym.servers.cpu_pool": ("CpuPool", "CpuTimeout"),
    "polygym.servers.episodic": ("EpisodicConfig", "EpisodicServer", "StepResult"),
    "polygym.servers.model": ("ModelServer", "UpstreamConfig"),
    "polygym.servers.resources": ("ResourcesServer", "ResourcesServerConfig", "tool"),
    "polygym.servers.sessions": ("Session",),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}

__all__ = [
    "Agent",
    "AgentConfig",
    "CpuPool",
    "CpuTimeout",
    "EpisodicConfig",
    "EpisodicServer",
    "HTTPError",
    "ModelServer",
    "ResourcesServer",
    "ResourcesServerConfig",
    "SeedSessionRequest",
    "ServerCallError",
    "ServerConfig",
    "Session",
    "StepResult",
    "UpstreamConfig",
    "VerifyRequest",
    "VerifyResponse",
    "check_env",
    "check_env_async",
    "function_call_item",
    "function_call_output_item",
    "item_text",
    "message_item",
    "new_response",
    "tool",
]


def __getattr__(name: str) -> Any:
    """Import an exported name from its home module on first use, then keep it here."""
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'polygym' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
