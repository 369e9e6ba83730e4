"""How many of NeMo Gym's own config files polygym loads (issue #12, "Configs").

Loads every config file of an unpacked NeMo Gym wheel from the wheel's root (so its server folders
are the implementations), as NeMo Gym's quickstart runs one: after the ``openai_model`` config that
defines ``policy_model`` when the file does not define it itself, with an env.yaml holding the
three values the quickstart asks every user to set. Each file ends up accepted, refused with a
ConfigError (a clear message), or crashed (any other exception: a polygym bug). Refusals are
counted by their first problem's reason so the remaining gaps are visible.

    pip download nemo-gym==0.7.0 --no-deps -d /tmp/ng && (cd /tmp/ng && unzip -q nemo_gym-*.whl)
    .venv/bin/python -m benchmarks.nemo_gym_configs /tmp/ng
    .venv/bin/python -m benchmarks.nemo_gym_configs /tmp/ng --elsewhere

``--elsewhere`` loads them from another working directory with the wheel named as the NeMo Gym
root (``--nemo-gym-root``), as a user who does not ``cd`` into it does: includes
(``config_paths``) must then be found under that root.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

from polygym.errors import ConfigError
from polygym.stack.catalog import NEMO_GYM_ROOT_ENV_VAR
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


def load_one(path: Path, env: Path, policy: Path) -> None:
    """Load one file; when it only lacks the policy model, again after the openai_model config."""
    try:
        load_config([path], env_files=[env])
    except ConfigError as exc:
        if not any("server 'policy_model'" in problem for problem in exc.problems):
            raise
        load_config([policy, path], env_files=[env])


@contextlib.contextmanager
def _named_root(root: Path) -> Iterator[None]:
    before = os.environ.get(NEMO_GYM_ROOT_ENV_VAR)
    os.environ[NEMO_GYM_ROOT_ENV_VAR] = str(root)
    try:
        yield
    finally:
        if before is None:
            del os.environ[NEMO_GYM_ROOT_ENV_VAR]
        else:
            os.environ[NEMO_GYM_ROOT_ENV_VAR] = before


def reason(problem: str) -> str:
    """A problem's kind, without the names in it, so refusals group."""
    text = re.sub(r"'[^']*'", "'…'", problem.split(": ", 1)[-1])
    return re.sub(r"\(from [^)]*\)|\(searched [^)]*\)|Known: .*|Did you mean .*", "", text).strip()[:90]


def measure(
    root: Path, elsewhere: bool = False, every: int = 1
) -> tuple[collections.Counter[str], collections.Counter[str]]:
    """Outcome counts (accepted / refused / crashed) and refusal reasons for an unpacked wheel.

    Changes the working directory to ``root`` (configs name paths relative to it) and back; with
    ``elsewhere``, to an empty folder instead, with ``root`` named as the NeMo Gym root. ``every``
    takes every n-th file only (the test suite's sample)."""
    counts: collections.Counter[str] = collections.Counter()
    reasons: collections.Counter[str] = collections.Counter()
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        stack.enter_context(contextlib.chdir(tmp if elsewhere else root))
        if elsewhere:
            stack.enter_context(_named_root(root))
        env = Path(tmp) / "env.yaml"
        env.write_text(ENV_YAML)
        for path in list(config_files(root))[::every]:
            try:
                load_one(
                    path if elsewhere else path.relative_to(root), env, root / POLICY if elsewhere else POLICY
                )
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
    parser.add_argument("--elsewhere", action="store_true", help="Load from another working directory.")
    args = parser.parse_args()
    counts, reasons = measure(args.wheel_root.resolve(), args.elsewhere)
    total = sum(counts.values())
    print(f"{total} files: " + ", ".join(f"{k} {counts[k]}" for k in ("accepted", "refused", "crashed")))
    for text, count in reasons.most_common(25):
        print(f"{count:5d}  {text}")


if __name__ == "__main__":
    main()
