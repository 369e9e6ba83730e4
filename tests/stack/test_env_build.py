"""The NeMo Gym environment cache: keyed on its inputs, and a failed build is never kept."""

from __future__ import annotations

import shutil
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from polygym.errors import ConfigError
from polygym.stack import env_build
from polygym.stack.env_build import EnvBuildError, EnvInputs, ensure_env, find_python

pytestmark = [pytest.mark.nemo_gym, pytest.mark.slow]

INPUTS = EnvInputs(
    python=sys.executable,
    python_version="3.12.1",
    ignore_requires_python=False,
    nemo_gym="nemo-gym==0.7.0",
    nemo_gym_digest="nemo-gym==0.7.0",
    requirements=("fastapi",),
)


def test_every_input_changes_the_key() -> None:
    changed = [
        replace(INPUTS, python_version="3.13.0"),
        replace(INPUTS, ignore_requires_python=True),
        replace(INPUTS, nemo_gym_digest="0" * 64),
        replace(INPUTS, requirements=("fastapi==0.1",)),
    ]
    keys = {INPUTS.key(), *(inputs.key() for inputs in changed)}
    assert len(keys) == 1 + len(changed)
    assert INPUTS.key() == replace(INPUTS).key()


def test_a_failed_build_shows_pips_tail_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(env_build.CACHE_ENV_VAR, str(tmp_path))
    broken = replace(INPUTS, nemo_gym=str(tmp_path / "no-such-nemo_gym-0.0.0-py3-none-any.whl"))
    with pytest.raises(EnvBuildError) as failed:
        ensure_env(broken, announce=False)
    assert "pip install exited" in str(failed.value) and "no-such-nemo_gym" in str(failed.value)
    assert failed.value.exit_code == 1
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


def test_a_ready_entry_is_reused_without_building(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(env_build.CACHE_ENV_VAR, str(tmp_path))
    ready = tmp_path / INPUTS.key()
    ready.mkdir()
    (ready / env_build.READY_MARKER).write_text("{}")
    monkeypatch.setattr(env_build, "_build", lambda *args: pytest.fail("rebuilt a ready environment"))
    assert ensure_env(INPUTS, announce=False) == ready


def test_an_unfinished_entry_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(env_build.CACHE_ENV_VAR, str(tmp_path))
    (tmp_path / INPUTS.key()).mkdir()  # no ready marker: a leftover, never used as is
    killed = tmp_path / f".build-{INPUTS.key()}-killed"  # a builder that was killed mid-way
    killed.mkdir()
    built: list[Path] = []

    def build(work: Path, inputs: EnvInputs) -> None:
        built.append(work)
        (work / env_build.READY_MARKER).write_text("{}")

    monkeypatch.setattr(env_build, "_build", build)
    assert (ensure_env(INPUTS, announce=False) / env_build.READY_MARKER).is_file()
    assert built == [tmp_path / INPUTS.key()]  # built where it stays: its scripts name that folder
    assert not killed.exists()


def test_a_copied_environments_scripts_point_at_the_copy(tmp_path: Path) -> None:
    """A venv copied from the base one gets its scripts' paths rewritten; links are left alone."""
    base, copy = tmp_path / "base", tmp_path / "copy"
    (base / "bin").mkdir(parents=True)
    (base / "bin" / "pip").write_text(f"#!{base}/bin/python\nimport pip\n")
    (base / "bin" / "activate").write_text(f'VIRTUAL_ENV="{base}"\nPS1="(base) $PS1"\n')
    (base / "bin" / "python").symlink_to(sys.executable)
    shutil.copytree(base, copy, symlinks=True)
    env_build.relocate_scripts(copy, base)
    assert (copy / "bin" / "pip").read_text() == f"#!{copy}/bin/python\nimport pip\n"
    assert (copy / "bin" / "activate").read_text() == f'VIRTUAL_ENV="{copy}"\nPS1="(copy) $PS1"\n'
    assert (copy / "bin" / "python").readlink() == Path(sys.executable)


def test_uv_installs_when_at_hand_and_pip_when_requires_python_must_be_ignored(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "uv").write_text("")
    install, what = env_build.installer(tmp_path, INPUTS)
    assert what == "uv pip install" and install[:4] == [
        str(tmp_path / "bin" / "uv"),
        "pip",
        "install",
        "--python",
    ]
    older = replace(INPUTS, ignore_requires_python=True)
    install, what = env_build.installer(tmp_path, older)  # nemo-gym's floor unknown: pip
    assert what == "pip install" and "--ignore-requires-python" in install
    wheel = tmp_path / "nemo_gym-9.9.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("nemo_gym-9.9.0.dist-info/METADATA", "Name: nemo-gym\nRequires-Python: >=3.12.14\n")
    install, what = env_build.installer(tmp_path, replace(older, nemo_gym=str(wheel)))
    assert what == "uv pip install" and install[-2:] == ["--python-version", "3.12.14"]


def test_a_python_that_does_not_exist_is_a_usage_error() -> None:
    with pytest.raises(ConfigError) as refused:
        find_python("/no/such/python3.13", ">=3.13.14")
    assert refused.value.exit_code == 2 and "--nemo-gym-python" in str(refused.value)


def test_an_older_python_installs_with_ignore_requires_python() -> None:
    chosen = find_python(sys.executable, ">=99.0")
    assert chosen.ignore_requires_python and chosen.path == Path(sys.executable)
    assert not find_python(sys.executable, ">=3.0").ignore_requires_python


def test_overrides_change_the_key_and_no_overrides_keep_the_old_one(tmp_path: Path) -> None:
    fixed = replace(INPUTS, python="/usr/bin/python3")
    assert fixed.key() == "py3.12.1-818ce195f924df9d"  # as before overrides were read: caches stay
    assert replace(fixed, overrides=("pycountry",)).key() != fixed.key()
    assert env_build._override_args(tmp_path, fixed, "uv pip install") == []
    args = env_build._override_args(tmp_path, replace(fixed, overrides=("pycountry",)), "uv pip install")
    assert args == ["--override", str(tmp_path / "overrides.txt")]
    assert (tmp_path / "overrides.txt").read_text() == "pycountry\n"
