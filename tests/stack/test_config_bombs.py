"""Config files that would make loading loop, lie or blow up: refused, each with its file and key."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from polygym.errors import ConfigError
from polygym.stack import bounded_yaml
from polygym.stack.config import load_config

REPO = Path(__file__).resolve().parents[2]
BOMB_MEMORY_BYTES = 1024 * 1024 * 1024
"""The address space the bomb's loader may use: far above a real config, far below what the bomb
asked of main (622 MiB resident at 9 levels; this one is 6 levels, 10 wide: a million values)."""
BOMB_TIMEOUT_S = 60


def alias_bomb(levels: int, width: int) -> str:
    """Each level a list of ``width`` aliases of the one before: ``width ** levels`` values."""
    lines = [f"l0: &l0 [{', '.join(['x'] * width)}]"]
    for level in range(1, levels):
        lines.append(f"l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_within_bounded_time_and_memory(tmp_path: Path) -> None:
    """Loaded in a child limited to 1 GiB of address space and 60 s, as ``gym env resolve`` loads."""
    config = tmp_path / "bomb.yaml"
    config.write_text(alias_bomb(levels=6, width=10))
    code = textwrap.dedent(
        f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, ({BOMB_MEMORY_BYTES}, {BOMB_MEMORY_BYTES}))
        from polygym.errors import ConfigError
        from polygym.stack.config import load_config
        try:
            load_config([sys.argv[1]], env_files=[])
        except ConfigError as exc:
            print(exc)
            sys.exit(2)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", code, str(config)],
        capture_output=True,
        text=True,
        timeout=BOMB_TIMEOUT_S,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "bomb.yaml:" in done.stdout and "expands to more than 100,000 values" in done.stdout


def test_an_alias_that_contains_itself_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "loop.yaml"
    config.write_text("a: &a\n  - 1\n  - *a\n")
    with pytest.raises(ConfigError, match=r"loop\.yaml:1:4: invalid YAML: an alias that contains itself"):
        load_config([config], env_files=[])


@pytest.mark.parametrize("levels", [bounded_yaml.MAX_DEPTH + 1, 700, 5000])
def test_deep_nesting_is_an_invalid_yaml_problem_not_a_crash(tmp_path: Path, levels: int) -> None:
    """Past the bound, below the parser's own limit (libyaml: 1000 levels) and past it."""
    config = tmp_path / "deep.yaml"
    config.write_text("a: " + "[" * levels + "]" * levels + "\n")
    with pytest.raises(ConfigError, match=r"deep\.yaml(:\d+:\d+)?: invalid YAML: "):
        load_config([config], env_files=[])
    if levels < 1000:
        with pytest.raises(ConfigError, match=r"deep\.yaml: invalid YAML: nested too deeply to parse"):
            load_config([config], env_files=[])


def test_nesting_by_aliases_counts_as_expanded() -> None:
    """Each anchored value nests 40 levels; three of them, one inside the next, nest 120."""
    text, inner = "", "1"
    for name in "abc":
        text += f"{name}: &{name} " + "[" * 39 + f"[{inner}]" + "]" * 39 + "\n"
        inner = f"*{name}"
    assert bounded_yaml.safe_load("\n".join(text.splitlines()[:2]))["b"]  # 81 levels
    with pytest.raises(bounded_yaml.YAMLTooLarge, match="nested too deeply to parse"):
        bounded_yaml.safe_load(text)


def test_ordinary_anchors_and_merge_keys_still_load() -> None:
    text = "base: &base {x: 1, y: [1, 2]}\nother:\n  <<: *base\n  y: [3]\nlist: [*base, *base]\n"
    assert bounded_yaml.safe_load(text) == {
        "base": {"x": 1, "y": [1, 2]},
        "other": {"x": 1, "y": [3]},
        "list": [{"x": 1, "y": [1, 2]}, {"x": 1, "y": [1, 2]}],
    }
    assert bounded_yaml.safe_load("") is None
    with pytest.raises(bounded_yaml.YAMLTooLarge):
        bounded_yaml.safe_load(alias_bomb(levels=3, width=10), max_nodes=1_000)


@pytest.mark.parametrize(
    ("text", "chain"),
    [
        ("a:\n  _inherit_from: b\n  x: 1\nb:\n  _inherit_from: a\n  y: 2\n", "a -> b -> a"),
        ("a: ${inherit_from:a}\n", "a -> a"),
        ("a:\n  b:\n    _copy: a\n", "a.b -> a"),
        ("a: ${copy:b}\nb: ${copy:c}\nc: ${copy:a}\n", "a -> b -> c -> a"),
    ],
    ids=["two blocks", "itself", "its own container", "three blocks"],
)
def test_an_inherit_or_copy_cycle_is_a_config_error(tmp_path: Path, text: str, chain: str) -> None:
    config = tmp_path / "cycle.yaml"
    config.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config([config], env_files=[])
    assert f"leads back to itself ({chain})" in str(caught.value)
