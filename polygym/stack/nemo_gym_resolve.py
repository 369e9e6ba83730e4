"""Run inside a NeMo Gym environment: complete a global config with NeMo Gym's own defaults.

A NeMo Gym server reads its whole configuration from ``NEMO_GYM_CONFIG_DICT`` and trusts it to be
what ``ng_run`` resolved: every default filled in (``dry_run``, ``head_server``, port ranges, pool
settings, ...), which keys exist depends on the NeMo Gym version. Rather than restate those
defaults (and fall behind the next release), polygym asks the installed nemo-gym: this script is
run with the environment's interpreter, reads the stack's config as JSON on stdin, passes it
through NeMo Gym's ``GlobalConfigDictParser`` (no command line, no env.yaml: polygym already
merged those) and prints the resolved YAML on stdout.

It imports nothing from polygym, which is not installed in that environment.
"""

from __future__ import annotations

import importlib
import json
import sys

REFUSAL_MARK = "polygym: NeMo Gym refused the config: "
"""Kept equal to ``stack.nemo_gym_server.REFUSAL_MARK`` (this script cannot import polygym)."""


def main() -> None:
    omegaconf = importlib.import_module("omegaconf")
    global_config = importlib.import_module("nemo_gym.global_config")
    given = omegaconf.OmegaConf.create(json.load(sys.stdin))
    parse_config = global_config.GlobalConfigDictParserConfig(
        initial_global_config_dict=given, skip_load_from_cli=True, skip_load_from_dotenv=True
    )
    try:
        resolved = global_config.GlobalConfigDictParser().parse(parse_config)
    except Exception as exc:  # NeMo Gym's refusal: its reason, marked for the parent to show
        sys.stderr.write(f"{REFUSAL_MARK}{type(exc).__name__}: {exc}\n")
        sys.exit(1)
    sys.stdout.write(omegaconf.OmegaConf.to_yaml(resolved))


if __name__ == "__main__":
    main()
