"""polygym: train and evaluate LLM policies on many reinforcement-learning environments at once.

The names exported here are the authoring surface: all an environment or an agent is written with
(and the bases of model servers)::

    from polygym import ResourcesServer, Session, VerifyRequest, VerifyResponse, tool, check_env

That is the servers' bases and their settings, the Responses items and request/response models,
the episodic (reset/step) game helpers, the judge a verifier asks, the retry policy an agent's
calls take, ``require_extra`` for optional dependencies, the data generator's command line
(``generator_main``...) and ``check_env``. Tests import their helpers from ``polygym.testing``;
model servers, which convert dialects and relay upstream, also import from ``polygym.models``.

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
    from polygym.authoring.datagen import generator_main, generator_parser, per_split, write_splits
    from polygym.items import item_text
    from polygym.net.client import ServerCallError
    from polygym.net.retry import NO_RETRY, RetryPolicy
    from polygym.protocol import (
        STEP_LIMIT,
        SeedSessionRequest,
        VerifyRequest,
        VerifyResponse,
        ended_early,
        function_call_item,
        function_call_output_item,
        input_items,
        message_item,
        new_response,
        sum_usage,
    )
    from polygym.servers.agent import Agent, AgentConfig
    from polygym.servers.base import HTTPError, ServerConfig
    from polygym.servers.cpu_pool import CpuPool, CpuTimeout
    from polygym.servers.episodic import (
        ACTION_TOOL,
        MAX_ACTION_CHARS,
        EpisodicConfig,
        EpisodicServer,
        StepResult,
        action_tool_schema,
        split_turns,
        turn_action,
    )
    from polygym.servers.extras import require_extra
    from polygym.servers.judge import (
        JUDGE_FAILED,
        JUDGE_FAILED_STATUS,
        Judge,
        JudgeSettings,
        UnreadableVerdict,
    )
    from polygym.servers.model import ModelServer, UpstreamConfig
    from polygym.servers.resources import ResourcesServer, ResourcesServerConfig, tool
    from polygym.servers.sessions import Session
    from polygym.token_fields import TRAINING_TOKEN_FIELDS

_HOMES: dict[str, tuple[str, ...]] = {
    "polygym.authoring.check": ("check_env", "check_env_async"),
    "polygym.authoring.datagen": ("generator_main", "generator_parser", "per_split", "write_splits"),
    "polygym.net.client": ("ServerCallError",),
    "polygym.net.retry": ("NO_RETRY", "RetryPolicy"),
    "polygym.items": ("item_text",),
    "polygym.protocol": (
        "STEP_LIMIT",
        "SeedSessionRequest",
        "VerifyRequest",
        "VerifyResponse",
        "ended_early",
        "function_call_item",
        "function_call_output_item",
        "input_items",
        "message_item",
        "new_response",
        "sum_usage",
    ),
    "polygym.servers.agent": ("Agent", "AgentConfig"),
    "polygym.servers.base": ("HTTPError", "ServerConfig"),
    "polygym.servers.cpu_pool": ("CpuPool", "CpuTimeout"),
    "polygym.servers.episodic": (
        "ACTION_TOOL",
        "MAX_ACTION_CHARS",
        "EpisodicConfig",
        "EpisodicServer",
        "StepResult",
        "action_tool_schema",
        "split_turns",
        "turn_action",
    ),
    "polygym.servers.extras": ("require_extra",),
    "polygym.servers.judge": (
        "JUDGE_FAILED",
        "JUDGE_FAILED_STATUS",
        "Judge",
        "JudgeSettings",
        "UnreadableVerdict",
    ),
    "polygym.servers.model": ("ModelServer", "UpstreamConfig"),
    "polygym.servers.resources": ("ResourcesServer", "ResourcesServerConfig", "tool"),
    "polygym.servers.sessions": ("Session",),
    "polygym.token_fields": ("TRAINING_TOKEN_FIELDS",),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}

__all__ = [
    "ACTION_TOOL",
    "JUDGE_FAILED",
    "JUDGE_FAILED_STATUS",
    "MAX_ACTION_CHARS",
    "NO_RETRY",
    "STEP_LIMIT",
    "TRAINING_TOKEN_FIELDS",
    "Agent",
    "AgentConfig",
    "CpuPool",
    "CpuTimeout",
    "EpisodicConfig",
    "EpisodicServer",
    "HTTPError",
    "Judge",
    "JudgeSettings",
    "ModelServer",
    "ResourcesServer",
    "ResourcesServerConfig",
    "RetryPolicy",
    "SeedSessionRequest",
    "ServerCallError",
    "ServerConfig",
    "Session",
    "StepResult",
    "UnreadableVerdict",
    "UpstreamConfig",
    "VerifyRequest",
    "VerifyResponse",
    "action_tool_schema",
    "check_env",
    "check_env_async",
    "ended_early",
    "function_call_item",
    "function_call_output_item",
    "generator_main",
    "generator_parser",
    "input_items",
    "item_text",
    "message_item",
    "new_response",
    "per_split",
    "require_extra",
    "split_turns",
    "sum_usage",
    "tool",
    "turn_action",
    "write_splits",
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
