"""How many of NeMo Gym's own config files polygym loads (issue #12, "Configs").

Loads every config file of an unpacked NeMo Gym wheel from the wheel's root (so its server folders
are the implementations), as NeMo Gym's quickstart runs one: after the ``openai_model`` config that
defines ``policy_model`` when the file does not define it itself, with an env.yaml holding the
three values the quickstart asks every user to set. Each file ends up accepted, refused with a
ConfigError (a clear message), or crashed (any other exception: a polygym bug). Refusals are
counted by their first problem's reason so the remaining gaps are visible.

    pip download nemo-gym==0.7.0 --no-deps -d /tmp/ng && (cd /tmp/ng && unzip -q nemo_gym-*.whl)
    .venv/bin/python -m benchmarks.nemo_gym_configs /tmp/ng
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

from polygym.errors import ConfigError
from polygym.stack.config import load_config

SERVER_FOLDERS = ("resources_servers", "responses_api_agents", "responses_api_models", "environment_servers")
POLICY = Path("responses_api_models/openai_model/configs/openai_model.yaml")
ENV_YAML = "policy_base_url: http://127.0.0.1:1/v1\npolicy_api_key: key\npolicy_model_name: model\n"


def config_files(root: Path) -> Iterator[Path]:
    """The files NeMo Gym takes as ``config_paths``: each server folder's ``configs/``, and the
    ``config*.yaml`` of every benchmark and environment (prompts, manifests and data excluded)."""
    for kind in SERVER_FOLDERS:
        yield from sorted(root.glob(f"{kind}/*/configs/**/*.yaml"))
    for kind in ("benchmarks", "environments"):
        yield from sorted(root.glob(f"{kind}/*/config*.yaml"))


def load_one(relative: Path, env: Path) -> None:
    """Load one file; when it only lacks the policy model, again after the openai_model config."""
    try:
        load_config([relative], env_files=[env])
    except ConfigError as exc:
        if not any("server 'policy_model'" in problem for problem in exc.problems):
            raise
        load_config([POLICY, relative], env_files=[env])


def reason(problem: str) -> str:
    """A problem's kind, without the names in it, so refusals group."""
    text = re.sub(r"'[^']*'", "'…'", problem.split(": ", 1)[-1])
    return re.sub(r"\(from [^)]*\)|\(searched [^)]*\)|Known: .*|Did you mean .*", "", text).strip()[:90]


def measure(root: Path) -> tuple[collections.Counter[str], collections.Counter[str]]:
    """Outcome counts (accepted / refused / crashed) and refusal reasons for an unpacked wheel.

    Changes the working directory to ``root`` (configs name paths relative to it) and back."""
    counts: collections.Counter[str] = collections.Counter()
    reasons: collections.Counter[str] = collections.Counter()
    with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(root):
        env = Path(tmp) / "env.yaml"
        env.write_text(ENV_YAML)
        for path in config_files(root):
            try:
                load_one(path.relative_to(root), env)
                counts["accepted"] += 1
            except ConfigError as exc:
                counts["refused"] += 1
                reasons[reason(exc.problems[0])] += 1
            except Exception as exc:  # a crash is what this measures
                counts["crashed"] += 1
                reasons[f"CRASH {type(exc).__name__}: {str(exc)[:70]}"] += 1
    return counts, reasons


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("wheel_root", type=Path, help="An unpacked NeMo Gym wheel.")
    counts, reasons = measure(parser.parse_args().wheel_root.resolve())
    total = sum(counts.values())
    print(f"{total} files: " + ", ".join(f"{k} {counts[k]}" for k in ("accepted", "refused", "crashed")))
    for text, count in reasons.most_common(25):
        print(f"{count:5d}  {text}")


if __name__ == "__main__":
    main()
