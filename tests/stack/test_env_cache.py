"""The NeMo Gym environment cache's bound: least recently used first, never one in use."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from polygym.cli import gym
from polygym.errors import ConfigError
from polygym.stack import env_build, env_cache
from polygym.stack.env_build import EnvInputs, lease_env
from polygym.stack.env_cache import READY_MARKER, lease_ready, parse_size, prune
from tests.stack.test_env_build import INPUTS

MB = 1_000_000


def cached(root: Path, name: str, size: int, last_used: float, requirements: tuple[str, ...] = ()) -> Path:
    """A ready environment of ``size`` bytes on disk, last used at ``last_used`` (epoch seconds)."""
    env = root / f"py3.12.1-{name:0>16}"
    env.mkdir(parents=True)
    (env / "payload").write_bytes(os.urandom(size))
    marker = env / READY_MARKER
    marker.write_text(json.dumps({"requirements": list(requirements)}))
    os.utime(marker, (last_used, last_used))
    return env


def names(envs: list[env_cache.CachedEnv]) -> list[str]:
    return [env.path.name[-1] for env in envs]


@pytest.fixture
def four(tmp_path: Path) -> list[Path]:
    """Environments a..d, 1 MB each, d the most recently used."""
    return [cached(tmp_path, name, MB, 1_000_000 + 60 * i) for i, name in enumerate("abcd")]


def test_sizes_read_as_people_write_them() -> None:
    assert parse_size("20GB") == 20 * 10**9
    assert parse_size("1.5GiB") == int(1.5 * 2**30)
    assert parse_size("500m") == 500 * MB
    assert parse_size("1000000") == MB
    with pytest.raises(ValueError, match="not a size"):
        parse_size("lots")
    assert env_cache.format_size(1_400_000_000) == "1.4 GB"


def test_a_file_linked_from_outside_is_not_counted_as_freed(tmp_path: Path) -> None:
    """uv links the packages it installs from its cache: removing the environment leaves them."""
    env = cached(tmp_path / "cache", "e", 0, 1_000_000)
    before = env_cache.disk_usage(env)
    (tmp_path / "uv-cache").write_bytes(os.urandom(MB))
    os.link(tmp_path / "uv-cache", env / "linked")
    assert env_cache.disk_usage(env) == before
    (env / "own").write_bytes(os.urandom(MB))
    os.link(env / "own", env / "own-again")
    assert before + MB <= env_cache.disk_usage(env) < before + 2 * MB


def test_keep_last_removes_the_least_recently_used(tmp_path: Path, four: list[Path]) -> None:
    assert prune(tmp_path, keep_last=9, max_size=None).removed == []
    report = prune(tmp_path, keep_last=2, max_size=None)
    assert names(report.removed) == ["a", "b"]
    assert [p.exists() for p in four] == [False, False, True, True]
    assert report.freed >= 2 * MB
    assert sorted(p.name for p in tmp_path.glob("*.lock")) == sorted(f"{p.name}.lock" for p in four[:2])


def test_max_size_removes_the_oldest_until_the_rest_fits(tmp_path: Path, four: list[Path]) -> None:
    report = prune(tmp_path, keep_last=None, max_size=int(2.5 * MB))
    assert names(report.removed) == ["a", "b"]
    assert env_cache.disk_usage(tmp_path) <= 2.5 * MB


def test_a_dry_run_removes_nothing(tmp_path: Path, four: list[Path]) -> None:
    report = prune(tmp_path, keep_last=1, max_size=None, dry_run=True)
    assert names(report.removed) == ["a", "b", "c"]
    assert all(p.exists() for p in four)


def test_an_environment_in_use_stays_and_the_next_oldest_goes(tmp_path: Path, four: list[Path]) -> None:
    lease = lease_ready(four[0])  # a stack running from a: its lease makes it the most recent, too
    assert lease is not None
    os.utime(four[0] / READY_MARKER, (1, 1))  # ... so make it the oldest again
    with lease:
        report = prune(tmp_path, keep_last=None, max_size=int(2.5 * MB))
    assert names(report.removed) == ["b", "c"]
    assert [(env.path, why) for env, why in report.kept] == [(four[0], "in use by a stack")]
    assert four[0].exists()


def test_a_process_running_from_an_environment_keeps_it(tmp_path: Path, four: list[Path]) -> None:
    """A server started from it by anything (no lease): its command line names a path inside it."""
    script = four[0] / "serve.py"
    script.write_text("import sys, time; print('up', flush=True); time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "up\n"
        report = prune(tmp_path, keep_last=3, max_size=None)
    finally:
        proc.kill()
        proc.wait()
    assert report.removed == [] and four[0].exists()
    assert report.kept[0][1] == f"in use: pid {proc.pid} runs from it"


def test_a_lease_passed_to_a_child_holds_after_the_parent_lets_go(tmp_path: Path, four: list[Path]) -> None:
    """A NeMo Gym server inherits its stack's lease: killed stack, live server, environment kept."""
    lease = lease_ready(four[0])
    assert lease is not None
    os.utime(four[0] / READY_MARKER, (1, 1))
    code = "import sys, time; print('up', flush=True); time.sleep(60)"
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, pass_fds=(lease.fileno(),)
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "up\n"
        lease.close()
        assert prune(tmp_path, keep_last=3, max_size=None).removed == []
    finally:
        child.kill()
        child.wait()
    assert names(prune(tmp_path, keep_last=3, max_size=None).removed) == ["a"]


def test_an_unfinished_build_goes_unless_it_is_being_built(tmp_path: Path) -> None:
    building, killed = tmp_path / INPUTS.key(), tmp_path / "py3.12.1-00000000000000ff"
    building.mkdir()
    killed.mkdir()
    with env_cache.exclusive(building):
        report = prune(tmp_path, keep_last=None, max_size=None)
    assert [env.path for env in report.removed] == [killed]
    assert [(env.path, why) for env, why in report.kept] == [(building, "being built")]


def fake_build(size: int) -> object:
    def build(work: Path, inputs: EnvInputs) -> None:
        (work / "payload").write_bytes(os.urandom(size))
        (work / READY_MARKER).write_text(json.dumps({"requirements": list(inputs.requirements)}))

    return build


def test_a_build_past_the_bound_removes_the_least_recently_used(
    tmp_path: Path, four: list[Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(env_build.CACHE_ENV_VAR, str(tmp_path))
    monkeypatch.setenv(env_cache.MAX_SIZE_ENV_VAR, "3.5MB")
    monkeypatch.setattr(env_build, "_build", fake_build(MB))
    held = lease_ready(four[0])  # in use: stays though it is the oldest
    assert held is not None
    os.utime(four[0] / READY_MARKER, (1, 1))
    with held, lease_env(replace(INPUTS, requirements=("rich",)), announce=False) as new:
        assert new.path.is_dir()
    assert [p.exists() for p in four] == [True, False, False, True]
    logged = capsys.readouterr().err
    assert logged.count("removed the least recently used NeMo Gym environment") == 2
    assert f"{four[1].name} (1.0 MB, last used" in logged and "within 3.5 MB" in logged
    assert "1 requirements: rich)" not in logged  # the new one, the most recently used, stays


def test_no_bound_when_it_is_none(tmp_path: Path, four: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(env_build.CACHE_ENV_VAR, str(tmp_path))
    monkeypatch.setenv(env_cache.MAX_SIZE_ENV_VAR, "none")
    monkeypatch.setattr(env_build, "_build", fake_build(MB))
    env_build.ensure_env(INPUTS, announce=False)
    assert all(p.exists() for p in four)


def test_gym_env_prune_prints_what_it_removes_and_the_bytes_freed(
    tmp_path: Path, four: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(env_build.CACHE_ENV_VAR, str(tmp_path))
    runner = CliRunner()
    done = runner.invoke(gym, ["env", "prune", "--keep-last", "3", "--dry-run"])
    assert done.exit_code == 0, done.output
    assert f"would remove {four[0].name} (1.0 MB" in done.output and four[0].exists()
    assert f"kept {four[3].name} (1.0 MB, last used" in done.output  # every environment is listed
    done = runner.invoke(gym, ["env", "prune", "--max-size", "2.5MB"])
    assert done.exit_code == 0, done.output
    assert [p.exists() for p in four] == [False, False, True, True]
    freed = int(done.output.rsplit("(", 1)[1].split(" bytes")[0])
    assert freed >= 2 * MB and "removed 2 of 4, freed" in done.output
    refused = runner.invoke(gym, ["env", "prune", "--max-size", "a lot"])
    assert refused.exit_code == 2 and "not a size" in refused.output


def test_an_environment_is_described_by_its_requirements(tmp_path: Path) -> None:
    cached(tmp_path, "e", 1000, 1_000_000, ("attrs>=23.2.0            # MIT", "rich", "tenacity"))
    (found,) = env_cache.scan(tmp_path)
    assert found.describe().endswith("3 requirements: attrs>=23.2.0, rich, ...)")


def test_a_bad_bound_is_said_before_anything_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(env_build.CACHE_ENV_VAR, str(tmp_path))
    monkeypatch.setenv(env_cache.MAX_SIZE_ENV_VAR, "forty gigs")
    monkeypatch.setattr(env_build, "_build", lambda *args: pytest.fail("built before the setting was read"))
    with pytest.raises(
        ConfigError, match="POLYGYM_ENV_CACHE_MAX_SIZE: 'forty gigs' is not a size"
    ) as refused:
        env_build.ensure_env(INPUTS, announce=False)
    assert refused.value.exit_code == 2
