"""NeMo Gym 0.7's commands and flags that polygym does not provide, each with what to use instead.

A NeMo Gym user who types ``gym eval profile`` or runs ``ng_reward_profile`` in a script would
otherwise get click's bare "No such command", which reads like a typo. Each command here exits 2
saying that polygym does not provide it and where the same result comes from: a polygym command
when one does that job, or NeMo Gym's own tool, which reads polygym's files because they are
written in NeMo Gym's formats. The names are NeMo Gym's (its ``gym`` subcommands and the legacy
``ng_*`` scripts that stand for them); the advice is polygym's.
"""

from __future__ import annotations

from collections.abc import Sequence

USE_NEMO_GYM = "run NeMo Gym's own tool on polygym's files: they read them"

NOT_PROVIDED: dict[str, str] = {
    "list benchmarks": "polygym has no benchmark catalog; `gym list environments` lists the environments "
    "(NeMo Gym's too, with POLYGYM_NEMO_GYM_ROOT or in a NeMo Gym checkout)",
    "list agents": "`gym env resolve ...` prints a stack's agents; polygym's are the folders of "
    "responses_api_agents/",
    "list models": "`gym env resolve ...` prints a stack's model servers; polygym's are the folders of "
    "responses_api_models/",
    "list resources-servers": "use `gym list environments`",
    "search": "use `gym list environments --json` and filter it",
    "dataset upload": f"polygym does not move datasets to or from registries; {USE_NEMO_GYM}",
    "dataset download": f"polygym does not move datasets to or from registries; {USE_NEMO_GYM}",
    "dataset rm": f"polygym does not move datasets to or from registries; {USE_NEMO_GYM}",
    "dataset migrate": f"polygym does not move datasets to or from registries; {USE_NEMO_GYM}",
    "dataset render": "`gym eval run` writes the prompts it sends to X_materialized_inputs.jsonl",
    "dataset collate": "use `gym data blend` (one JSONL for several environments, agent_ref on every row) "
    "and `gym data validate`",
    "env schema": "use `gym data validate --env NAME FILE` (rows checked against the verifier's own model)",
    "env validate": "use `gym env resolve ...` (config) and `gym data validate` (rows)",
    "env packages": "a polygym environment's packages are the [envs] extra; a NeMo Gym server's are its "
    "requirements.txt, installed by polygym in its own cached environment",
    "env test": "use `gym env check NAME` (the environment against the resources-server contract) and "
    "pytest on its folder's tests/",
    "env publish": f"polygym has no catalog to publish to; {USE_NEMO_GYM}",
    "env prefetch": "polygym builds a NeMo Gym server's environment when a stack first starts it, and "
    "caches it; `gym env start` once does the same",
    "eval prepare": f"polygym does not prepare benchmark data; {USE_NEMO_GYM}",
    "eval aggregate": "`gym eval run` writes X_aggregate_metrics.json itself; to merge shards, "
    f"{USE_NEMO_GYM}",
    "eval profile": "`gym eval run` writes the reward profile as X_aggregate_metrics.json and "
    f"`gym eval compare` compares runs; otherwise {USE_NEMO_GYM}",
    "eval export": USE_NEMO_GYM,
    "eval submit": f"polygym submits no jobs; {USE_NEMO_GYM}",
    "dev test": "use pytest",
}
"""NeMo Gym 0.7 command (its ``gym`` words) -> what a polygym user does instead."""

GROUPS_NOT_PROVIDED = {
    "dataset": "polygym's dataset commands are `gym data blend` and `gym data validate`",
    "dev": "use pytest",
}
"""NeMo Gym command groups polygym has no counterpart of, for a bare ``gym dataset``."""

LEGACY_NOT_PROVIDED: dict[str, str] = {
    "ng_test": "env test",
    "ng_test_all": "env test",
    "ng_dev_test": "dev test",
    "ng_list_benchmarks": "list benchmarks",
    "ng_prepare_benchmark": "eval prepare",
    "ng_aggregate_rollouts": "eval aggregate",
    "ng_materialize_prompts": "dataset render",
    "ng_reward_profile": "eval profile",
    "ng_upload_dataset_to_gitlab": "dataset upload",
    "ng_download_dataset_from_gitlab": "dataset download",
    "ng_prepare_data": "dataset collate",
    "ng_upload_dataset_to_hf": "dataset upload",
    "ng_download_dataset_from_hf": "dataset download",
    "ng_gitlab_to_hf_dataset": "dataset migrate",
    "ng_delete_dataset_from_gitlab": "dataset rm",
    "ng_validate": "env validate",
    "ng_pip_list": "env packages",
}
"""NeMo Gym's ``ng_*`` scripts for commands polygym does not provide -> the command they stand for."""

REINSTALL = (
    "polygym rebuilds a NeMo Gym server's environment when its inputs change (nemo-gym, requirements.txt, "
    "the Python); delete it from the cache (POLYGYM_ENV_CACHE) to force a rebuild"
)
"""``ng_reinstall`` has no ``gym`` command in NeMo Gym either."""


def not_provided(words: Sequence[str]) -> str | None:
    """The exit message for NeMo Gym's command ``words`` (``("eval", "profile")``), or None when it is
    not one of NeMo Gym's commands that polygym lacks."""
    command = " ".join(words)
    advice = NOT_PROVIDED.get(command) or GROUPS_NOT_PROVIDED.get(command)
    if advice is None:
        return None
    return f"'gym {command}' is NeMo Gym's; polygym does not provide it: {advice}"


def legacy_not_provided(alias: str) -> str | None:
    """The exit message for an ``ng_*`` script polygym does not provide, or None."""
    if alias == "ng_reinstall":
        return f"'{alias}' is NeMo Gym's; polygym does not provide it: {REINSTALL}"
    command = LEGACY_NOT_PROVIDED.get(alias)
    if command is None:
        return None
    return f"'{alias}' is NeMo Gym's 'gym {command}'; polygym does not provide it: {NOT_PROVIDED[command]}"


SELECTOR_FLAGS_NOT_PROVIDED: dict[str, str] = {
    "benchmark": "cannot be honoured: polygym does not read NeMo Gym's benchmarks (benchmarks/NAME/); "
    "select the benchmark's resources server with --resources-server NAME or its config with --config PATH",
    "environment": "cannot be honoured: polygym does not read NeMo Gym 0.7's environment manifests "
    "(environments/NAME/); select the resources server with --resources-server NAME or its config with "
    "--config PATH",
    "agent_type": "cannot be honoured: polygym takes each environment's agent from its config; choose "
    "another with --config PATH or an override (++AGENT.responses_api_agents...)",
}
"""NeMo Gym's stack-selection flags that polygym accepts only to refuse by name (exit 2), and why."""
