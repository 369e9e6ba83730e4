"""Which stack a run collected from, so that ``--resume`` cannot silently switch policy or environments.

A resumed run appends to the same files: resumed against another policy (a new checkpoint, another
endpoint) or another set of environments, one output would hold two experiments and its metrics
would average them. So the run record keeps the stack's identity, read from the head server's
``GET /config`` (served without secrets): per model server its implementation, model name and
base URL (secrets masked again here, in case the served text carries one) and a fingerprint of
each of its other resolved settings (a local checkpoint, a scripted model's rules, extra sampling
parameters: a policy is more than its name); and the names of the environments (resources
servers) and agents. Timeouts, pool sizes, retries and the like are not part of it: changing them
between attempts is what resuming is for. A record written before settings were fingerprinted is
compared by what it has.

``--resume`` compares and refuses a change, naming it, unless ``allow_change`` (``--allow-stack-change``),
in which case the change is appended to the record's ``stack_changes``, so the files still say
that they mix two stacks.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from typing import Any

import orjson

from polygym.collect.head_config import head_config
from polygym.collect.run_files import RunFileError, RunFiles, read_record, write_record
from polygym.kinds import AGENT_KIND, MODEL_KIND, RESOURCES_KIND
from polygym.net.client import ServerClient
from polygym.redact import is_secret_key, mask_secrets, redact_text

STACK_KEY = "stack"
CHANGES_KEY = "stack_changes"


class StackChangedError(RunFileError):
    """``--resume`` against a stack whose policy or environments differ from the recorded one."""


OPERATIONAL = frozenset(
    {
        "entrypoint",
        "description",
        "timeout_s",
        "pool_size",
        "max_response_bytes",
        "max_attempts",
        "retry_base_delay_s",
        "retry_max_delay_s",
        "down_cooldown_s",
        "host",
        "port",
        "num_replicas",
        "replicas",
        "num_gpus",
        "num_cpus",
        "latency_ms",
    }
)
"""Model-server settings that say how a policy is served, not which policy it is: changing them
between attempts (a longer timeout, more retries, more replicas) is what resuming is for."""
SETTINGS = "settings"
"""Key of a policy's identity holding a fingerprint of each of its other settings."""


def _fingerprint(value: Any) -> str:
    """A short digest of a setting (secrets masked first): enough to tell that it changed, without
    copying a long value (a scripted model's rules) or a secret into the run record."""
    encoded = orjson.dumps(mask_secrets(value), option=orjson.OPT_SORT_KEYS, default=str)
    return hashlib.sha256(encoded).hexdigest()[:16]


def _identifies_policy(key: str) -> bool:
    """Config keys that name the policy: ``model``, ``openai_model``, ``base_url``, ``openai_base_url``."""
    return key == "model" or key.endswith("_model") or key.endswith("url")


def identity_of(config: Mapping[str, Any]) -> dict[str, Any]:
    """The identity of a stack from its public config (``{instance: {kind: {implementation: {...}}}}``)."""
    policy: dict[str, dict[str, Any]] = {}
    names: dict[str, list[str]] = {RESOURCES_KIND: [], AGENT_KIND: []}
    for name, value in config.items():
        if not isinstance(value, Mapping) or len(value) != 1:
            continue  # a global value (policy_base_url ...), reflected in the servers that use it
        kind, implementations = next(iter(value.items()))
        if kind in names:
            names[kind].append(str(name))
        if kind != MODEL_KIND or not isinstance(implementations, Mapping) or len(implementations) != 1:
            continue
        implementation, settings = next(iter(implementations.items()))
        described: dict[str, Any] = {"implementation": implementation}
        fingerprints: dict[str, str] = {}
        if isinstance(settings, Mapping):
            for key, setting in settings.items():
                if isinstance(key, str) and _identifies_policy(key) and isinstance(setting, str):
                    described[key] = redact_text(setting)
                elif str(key) not in OPERATIONAL and not is_secret_key(key):
                    fingerprints[str(key)] = _fingerprint(setting)
        described[SETTINGS] = dict(sorted(fingerprints.items()))
        policy[str(name)] = described
    return {
        "policy": policy,
        "environments": sorted(names[RESOURCES_KIND]),
        "agents": sorted(names[AGENT_KIND]),
    }


async def read_identity(client: ServerClient) -> dict[str, Any] | None:
    """The identity of the stack ``client`` reaches; None when there is no head server to ask or
    it serves no config."""
    try:
        config = await head_config(client)
    except ValueError:  # a head whose config does not parse: nothing to compare
        return None
    return identity_of(config) if config is not None else None


def differences(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """What changed between two identities, one readable line per change."""
    lines = []
    for part in ("environments", "agents"):
        gone = sorted(set(before.get(part, [])) - set(after.get(part, [])))
        added = sorted(set(after.get(part, [])) - set(before.get(part, [])))
        if gone:
            lines.append(f"{part} no longer served: {', '.join(gone)}")
        if added:
            lines.append(f"{part} added: {', '.join(added)}")
    old_policy, new_policy = before.get("policy", {}), after.get("policy", {})
    for server in sorted(set(old_policy) | set(new_policy)):
        old, new = old_policy.get(server, {}), new_policy.get(server, {})
        for key in sorted((set(old) | set(new)) - {SETTINGS}):
            if old.get(key) != new.get(key):
                lines.append(f"policy {server}.{key}: {old.get(key)!r} -> {new.get(key)!r}")
        if SETTINGS in old and SETTINGS in new:  # a record from before fingerprints has none
            lines.extend(_settings_changes(server, old[SETTINGS], new[SETTINGS]))
    return lines


def _settings_changes(server: str, old: Mapping[str, str], new: Mapping[str, str]) -> list[str]:
    """One line per setting of a policy that was added, removed or changed (its value not shown:
    only its fingerprint was recorded)."""
    lines = []
    for key in sorted(set(old) | set(new)):
        if key not in new:
            lines.append(f"policy {server}.{key}: no longer set")
        elif key not in old:
            lines.append(f"policy {server}.{key}: newly set")
        elif old[key] != new[key]:
            lines.append(f"policy {server}.{key}: changed (fingerprint {old[key]} -> {new[key]})")
    return lines


def check_stack(files: RunFiles, identity: Mapping[str, Any] | None, allow_change: bool) -> None:
    """Record the stack a run collects from; on resume refuse a different one unless ``allow_change``.

    Files must have been prepared (``run_files.prepare``), so the record exists; a record without a
    stack (a fresh run, or one whose stack could not be asked) just gets this one.
    """
    record = read_record(files) or {}
    recorded = record.get(STACK_KEY)
    if identity is None:
        return
    if isinstance(recorded, Mapping) and (changes := differences(recorded, identity)):
        if not allow_change:
            raise StackChangedError(
                f"cannot resume {files.output}: the stack differs from the one the run started with:\n  "
                + "\n  ".join(changes)
                + "\nresume against the same stack, or pass --allow-stack-change to mix them "
                "(the change is recorded in " + str(files.record) + ")"
            )
        record.setdefault(CHANGES_KEY, []).append({"time": time.time(), "changes": changes, "from": recorded})
    record[STACK_KEY] = dict(identity)
    write_record(files, record)
