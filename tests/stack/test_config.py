"""Config loading: merging, selectors, interpolation, overrides, problem reports and secret masking."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from polygym.cli.stack_deaths import server_needs
from polygym.stack import catalog
from polygym.stack.catalog import NEMO_GYM_ROOT_ENV_VAR
from polygym.stack.config import (
    ConfigError,
    ServerSpec,
    StackConfig,
    load_config,
    parse_override,
)
from tests.nemo_gym_wheel import nemo_gym_tree

RESOURCES = """\
weather:
  resources_servers:
    weather_env:
      entrypoint: app.py
      domain: agent
      description: Weather lookup with one tool
weather_simple_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server: {type: resources_servers, name: weather}
      model_server: {type: responses_api_models, name: policy_model}
      datasets:
      - {name: example, type: example, jsonl_fpath: resources_servers/weather_env/data/example.jsonl}
"""

MODEL = """\
policy_model:
  responses_api_models:
    openai_model:
      entrypoint: app.py
      openai_base_url: ${policy_base_url}
      openai_api_key: ${policy_api_key}
      openai_model: ${policy_model_name}
      max_tokens: 256
"""

ENV = """\
policy_base_url: http://localhost:8000/v1
policy_api_key: sk-secret-123
policy_model_name: tiny
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with fake implementation folders that the catalog finds via the cwd root."""
    monkeypatch.chdir(tmp_path)
    for kind, impl in [
        ("resources_servers", "weather_env"),
        ("resources_servers", "math_env"),
        ("responses_api_agents", "simple_agent"),
        ("responses_api_models", "openai_model"),
    ]:
        folder = tmp_path / kind / impl
        (folder / "configs").mkdir(parents=True)
        (folder / "app.py").write_text("")
    return tmp_path


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def load(paths: list[Path], overrides: list[str] = (), env: list[Path] | None = None) -> StackConfig:
    """Load with an explicit env list so the real project's env.yaml never leaks into a test."""
    return load_config(paths, overrides, env_files=[] if env is None else env)


def problems_of(excinfo: pytest.ExceptionInfo[ConfigError]) -> list[str]:
    return excinfo.value.problems


# ------------------------------------------------------------------------------------------- merging


def test_full_stack_loads_with_env_interpolation(project: Path) -> None:
    files = [write(project / "model.yaml", MODEL), write(project / "res.yaml", RESOURCES)]
    env = write(project / "env.yaml", ENV)
    stack = load_config(files, env_files=None)  # default env files: the cwd's env.yaml is found

    assert list(stack.servers) == ["policy_model", "weather", "weather_simple_agent"]
    model = stack.servers["policy_model"].config
    assert model["openai_base_url"] == "http://localhost:8000/v1"
    assert model["openai_api_key"] == "sk-secret-123"
    assert model["openai_model"] == "tiny"
    assert stack.globals == {
        "policy_base_url": "http://localhost:8000/v1",
        "policy_api_key": "sk-secret-123",
        "policy_model_name": "tiny",
    }
    assert stack.sources == ["env.yaml", "model.yaml", "res.yaml"]
    assert env.exists()


def test_later_file_wins_and_dicts_merge_deeply(project: Path) -> None:
    first = write(project / "a.yaml", RESOURCES)
    second = write(
        project / "b.yaml",
        "weather:\n  resources_servers:\n    weather_env:\n      domain: knowledge\n      extra: 1\n",
    )
    model = write(project / "model.yaml", MODEL)
    stack = load([model, first, second], env=[write(project / "env.yaml", ENV)])

    weather = stack.servers["weather"]
    assert weather.config["domain"] == "knowledge"  # later wins
    assert weather.config["description"] == "Weather lookup with one tool"  # kept from the first file
    assert weather.config["extra"] == 1
    assert weather.source == "b.yaml"
    assert stack.servers["weather_simple_agent"].source == "a.yaml"


def test_required_value_in_later_file_does_not_erase_earlier_value(project: Path) -> None:
    first = write(project / "a.yaml", "limit: 5\n")
    second = write(project / "b.yaml", "limit: ???\n")
    assert load([first, second]).globals["limit"] == 5


def test_repeated_selectors_are_all_merged(project: Path) -> None:
    for name in ("weather_env", "math_env"):
        write(
            project / "resources_servers" / name / "configs" / f"{name}.yaml",
            f"{name}_instance:\n  resources_servers:\n    {name}:\n      domain: {name}\n",
        )
    write(project / "responses_api_models" / "openai_model" / "configs" / "openai_model.yaml", MODEL)
    extra = write(project / "extra.yaml", "note: hello\n")

    paths = catalog.selector_paths(["weather_env", "math_env"], ["openai_model"], ["extra.yaml"])
    assert [p.name for p in paths] == ["openai_model.yaml", "weather_env.yaml", "math_env.yaml", "extra.yaml"]
    assert paths[-1].resolve() == extra.resolve()

    stack = load(paths, env=[write(project / "env.yaml", ENV)])
    assert [s.name for s in stack.by_kind("resources_servers")] == [
        "weather_env_instance",
        "math_env_instance",
    ]
    assert [s.name for s in stack.by_kind("responses_api_models")] == ["policy_model"]
    assert stack.globals["note"] == "hello"


def test_selector_problems_are_reported_together(project: Path) -> None:
    with pytest.raises(ConfigError) as excinfo:
        catalog.selector_paths(["wether_env"], ["openai_modle"], ["nope.yaml"])
    problems = problems_of(excinfo)
    assert len(problems) == 3
    assert "Did you mean 'openai_model'?" in problems[0]
    assert "Did you mean 'weather_env'?" in problems[1]
    assert "math_env" in problems[1]  # the known list
    assert "nope.yaml" in problems[2] and "not found" in problems[2]


def test_catalog_lists_and_finds_implementations(project: Path) -> None:
    (project / "resources_servers" / "__pycache__").mkdir()
    (project / "resources_servers" / "_private").mkdir()
    names = catalog.list_implementations("resources_servers")  # also holds the project's own servers
    assert {"math_env", "weather_env"} <= set(names)
    assert names == sorted(names)
    assert not {"__pycache__", "_private"} & set(names)
    assert (
        catalog.find_implementation_dir("resources_servers", "math_env")
        == project / "resources_servers" / "math_env"
    )
    with pytest.raises(ConfigError, match="Did you mean 'math_env'"):
        catalog.find_implementation_dir("resources_servers", "math_envv")


def test_env_yaml_paths_finds_cwd_file(project: Path) -> None:
    assert catalog.env_yaml_paths() == [] or all(p.name == "env.yaml" for p in catalog.env_yaml_paths())
    write(project / "env.yaml", ENV)
    assert catalog.env_yaml_paths()[-1].resolve() == (project / "env.yaml").resolve()


# ----------------------------------------------------------------------------------------- overrides


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a.b=3", ("a.b", 3, False)),
        ("+a.b=x", ("a.b", "x", True)),
        ("a=[1, 2]", ("a", [1, 2], False)),
        ("a={x: 1}", ("a", {"x": 1}, False)),
        ("a=true", ("a", True, False)),
        ("a=http://h:8000/v1", ("a", "http://h:8000/v1", False)),
        ("a=x: y", ("a", "x: y", False)),
        ("a=", ("a", "", False)),
        ("a=${policy_base_url}", ("a", "${policy_base_url}", False)),
    ],
)
def test_parse_override(text: str, expected: tuple[str, object, bool]) -> None:
    assert parse_override(text) == expected


@pytest.mark.parametrize("text", ["novalue", "=3", "a..b=1", "a=[1,"])
def test_parse_override_rejects_malformed(text: str) -> None:
    with pytest.raises(ConfigError, match="bad override"):
        parse_override(text)


def test_command_line_override_and_add(project: Path) -> None:
    files = [write(project / "model.yaml", MODEL), write(project / "res.yaml", RESOURCES)]
    stack = load(
        files,
        [
            "policy_base_url=http://remote:9000/v1",  # referenced by ${...}: allowed without +
            "policy_api_key=sk-cli",
            "policy_model_name=big",
            "weather.resources_servers.weather_env.domain=math",
            "+weather.resources_servers.weather_env.new_key=[1, 2]",
        ],
    )
    model = stack.servers["policy_model"].config
    assert model["openai_base_url"] == "http://remote:9000/v1"
    assert model["openai_api_key"] == "sk-cli"
    weather = stack.servers["weather"].config
    assert weather["domain"] == "math"
    assert weather["new_key"] == [1, 2]


def test_unknown_override_key_suggests_close_key(project: Path) -> None:
    files = [write(project / "res.yaml", RESOURCES)]
    with pytest.raises(ConfigError) as excinfo:
        load(files, ["weather.resources_servers.weather_env.domian=x", "+fresh=1", "policy_model=x"])
    problems = problems_of(excinfo)
    assert problems[0] == (
        "unknown key 'weather.resources_servers.weather_env.domian' in override "
        "'weather.resources_servers.weather_env.domian=x'; use "
        "+weather.resources_servers.weather_env.domian=x to add it. "
        "Did you mean 'weather.resources_servers.weather_env.domain'?"
    )
    # +fresh was accepted; the only other complaint is the unknown model reference, not the override
    assert not any("fresh" in p for p in problems)


# ---------------------------------------------------------------------------------- problem reports


def test_all_missing_values_reported_together_with_files(project: Path) -> None:
    first = write(project / "one.yaml", "alpha: ???\n")
    second = write(
        project / "two.yaml",
        "weather:\n  resources_servers:\n    weather_env:\n      domain: ???\n",
    )
    with pytest.raises(ConfigError) as excinfo:
        load([first, second])
    problems = problems_of(excinfo)
    assert "alpha: missing required value (from one.yaml)" in problems
    assert "weather.resources_servers.weather_env.domain: missing required value (from two.yaml)" in problems
    assert str(excinfo.value).startswith("2 config problems:\n  - ")


def test_unset_interpolation_names_key_and_fix(project: Path) -> None:
    files = [write(project / "model.yaml", MODEL)]
    env = write(project / "env.yaml", "policy_base_url: http://x/v1\npolicy_model_name: m\n")
    with pytest.raises(ConfigError) as excinfo:
        load(files, env=[env])
    assert problems_of(excinfo) == [
        "policy_model.responses_api_models.openai_model.openai_api_key: needs '${policy_api_key}', which "
        "is not set; add policy_api_key to env.yaml or pass policy_api_key=... (from model.yaml)"
    ]


def test_bad_yaml_names_file_and_line(project: Path) -> None:
    good = write(project / "good.yaml", "a: 1\n")
    bad = write(project / "bad.yaml", "a: 1\nb: [1, 2\nc: 3\n")
    not_mapping = write(project / "list.yaml", "- 1\n- 2\n")
    with pytest.raises(ConfigError) as excinfo:
        load([good, bad, not_mapping])
    problems = problems_of(excinfo)
    assert len(problems) == 2
    assert problems[0].startswith("bad.yaml:3:")
    assert "invalid YAML" in problems[0]
    assert problems[1].startswith("list.yaml: the top level must be a mapping")


def test_unknown_reference_suggests_and_lists_known(project: Path) -> None:
    files = [write(project / "model.yaml", MODEL), write(project / "res.yaml", RESOURCES)]
    typo = write(
        project / "typo.yaml",
        "weather_simple_agent:\n  responses_api_agents:\n    simple_agent:\n"
        "      model_server: {type: responses_api_models, name: policy_modle}\n",
    )
    with pytest.raises(ConfigError) as excinfo:
        load([*files, typo], env=[write(project / "env.yaml", ENV)])
    assert problems_of(excinfo) == [
        "weather_simple_agent.responses_api_agents.simple_agent.model_server: unknown responses_api_models "
        "server 'policy_modle' (from typo.yaml). Did you mean 'policy_model'? Known: policy_model"
    ]


def test_reference_with_bad_kind(project: Path) -> None:
    cfg = write(
        project / "c.yaml",
        "agent:\n  responses_api_agents:\n    simple_agent:\n"
        "      model_server: {type: response_api_models, name: m}\n",
    )
    with pytest.raises(ConfigError) as excinfo:
        load([cfg])
    (problem,) = problems_of(excinfo)
    assert "reference to unknown server kind 'response_api_models'" in problem
    assert "Did you mean 'responses_api_models'?" in problem


def test_unknown_implementation_and_kind_and_shape(project: Path) -> None:
    cfg = write(
        project / "c.yaml",
        "a:\n  resources_servers:\n    wether_env: {domain: x}\n"
        "b:\n  resource_servers:\n    weather_env: {}\n"
        "c:\n  resources_servers:\n    weather_env: {}\n    math_env: {}\n"
        "settings:\n  retries: 3\n",
    )
    with pytest.raises(ConfigError) as excinfo:
        load([cfg])
    problems = problems_of(excinfo)
    assert len(problems) == 3
    assert problems[0].startswith(
        "a.resources_servers: unknown resources_servers implementation 'wether_env'"
    )
    assert "Did you mean 'weather_env'?" in problems[0]
    assert "(from c.yaml)" in problems[0]
    assert problems[1].startswith("b: unknown server kind 'resource_servers'")
    assert "Did you mean 'resources_servers'?" in problems[1]
    assert problems[2].startswith("c.resources_servers: expected exactly one implementation")


def test_override_provenance_is_command_line(project: Path) -> None:
    cfg = write(project / "c.yaml", "x: 1\n")
    with pytest.raises(ConfigError) as excinfo:
        load([cfg], ["x=???"])
    assert problems_of(excinfo) == ["x: missing required value (from command line)"]


def test_config_error_survives_pickling() -> None:
    error = pickle.loads(pickle.dumps(ConfigError(["one", "two"])))
    assert error.problems == ["one", "two"]
    assert str(error) == "2 config problems:\n  - one\n  - two"


# -------------------------------------------------------------------------------------------- secrets


def test_to_dict_masks_by_default(project: Path) -> None:
    files = [write(project / "model.yaml", MODEL), write(project / "res.yaml", RESOURCES)]
    stack = load(files, env=[write(project / "env.yaml", ENV)])
    shown = stack.to_dict()
    inner = shown["policy_model"]["responses_api_models"]["openai_model"]
    assert inner["openai_api_key"] == "****"
    assert inner["max_tokens"] == 256
    assert shown["policy_api_key"] == "****"
    assert stack.to_dict(mask_secrets=False)["policy_api_key"] == "sk-secret-123"
    assert stack.servers["policy_model"].config["openai_api_key"] == "sk-secret-123"


# ---------------------------------------------------------------------------------------- ServerSpec


def test_server_spec_fields_and_references(project: Path) -> None:
    files = [write(project / "model.yaml", MODEL), write(project / "res.yaml", RESOURCES)]
    stack = load(files, env=[write(project / "env.yaml", ENV)])
    agent = stack.servers["weather_simple_agent"]
    assert isinstance(agent, ServerSpec)
    assert (agent.name, agent.kind, agent.implementation) == (
        "weather_simple_agent",
        "responses_api_agents",
        "simple_agent",
    )
    assert agent.source == "res.yaml"
    assert agent.directory == project / "responses_api_agents" / "simple_agent"
    assert type(agent.config) is dict and type(agent.config["datasets"]) is list
    assert agent.references() == [
        ("resources_server", "resources_servers", "weather"),
        ("model_server", "responses_api_models", "policy_model"),
    ]
    assert stack.servers["weather"].references() == []
    with pytest.raises(ValueError, match="Did you mean 'resources_servers'"):
        stack.by_kind("resource_servers")


# ------------------------------------------------------------------- NeMo Gym's directives, includes


def test_parse_override_double_plus_adds_or_changes() -> None:
    assert parse_override("++a.b=3") == ("a.b", 3, True)
    with pytest.raises(ConfigError):
        parse_override("+++a=1")


def test_inherit_from_moves_a_block_and_merges_the_mapping_over_it(project: Path) -> None:
    base = write(project / "base.yaml", RESOURCES + MODEL)
    child = write(
        project / "child.yaml",
        "fast_agent:\n  _inherit_from: weather_simple_agent\n"
        "  responses_api_agents:\n    simple_agent:\n      max_steps: 3\n"
        "judge_copy: ${copy:policy_model}\n",
    )
    config = load(["base.yaml", "child.yaml"], env=[write(project / "env.yaml", ENV)])
    assert base.exists() and child.exists()
    assert "weather_simple_agent" not in config.servers  # moved, not copied
    agent = config.servers["fast_agent"]
    assert agent.config["max_steps"] == 3
    assert agent.config["resources_server"] == {"type": "resources_servers", "name": "weather"}
    assert config.servers["judge_copy"].config["openai_model"] == "tiny"
    assert "policy_model" in config.servers  # a copy keeps its source


def test_delete_key_removes_inherited_keys(project: Path) -> None:
    write(project / "base.yaml", RESOURCES + MODEL)
    write(
        project / "child.yaml",
        "weather:\n  resources_servers:\n    weather_env:\n      _delete_key: domain, description\n",
    )
    config = load(["base.yaml", "child.yaml"], env=[write(project / "env.yaml", ENV)])
    assert "domain" not in config.servers["weather"].config
    assert "description" not in config.servers["weather"].config


def test_inherit_from_unknown_source_is_named(project: Path) -> None:
    write(project / "a.yaml", RESOURCES + MODEL + "other: ${inherit_from:no_such.block}\n")
    with pytest.raises(ConfigError) as excinfo:
        load(["a.yaml"], env=[write(project / "env.yaml", ENV)])
    assert any("other: _inherit_from 'no_such.block': no such key" in p for p in problems_of(excinfo))


def test_config_paths_includes_merge_before_the_including_file(project: Path) -> None:
    write(project / "model.yaml", MODEL)
    write(project / "res.yaml", "config_paths: [model.yaml]\n" + RESOURCES)
    write(
        project / "top.yaml",
        "config_paths: [res.yaml]\npolicy_model:\n  responses_api_models:\n"
        "    openai_model:\n      max_tokens: 9\n",
    )
    config = load(["top.yaml"], env=[write(project / "env.yaml", ENV)])
    assert set(config.servers) == {"weather", "weather_simple_agent", "policy_model"}
    assert config.servers["policy_model"].config["max_tokens"] == 9  # the includer wins
    assert config.sources == ["env.yaml", "model.yaml", "res.yaml", "top.yaml"]
    assert "config_paths" not in config.globals


def test_config_paths_override_and_missing_include(project: Path) -> None:
    write(project / "model.yaml", MODEL)
    write(project / "res.yaml", RESOURCES)
    config = load([], ["+config_paths=[model.yaml,res.yaml]"], env=[write(project / "env.yaml", ENV)])
    assert "weather" in config.servers
    write(project / "bad.yaml", "config_paths: [nope.yaml]\n")
    with pytest.raises(ConfigError) as excinfo:
        load(["bad.yaml"], env=[])
    assert any("bad.yaml: config_paths entry 'nope.yaml' not found" in p for p in problems_of(excinfo))


def test_legacy_agent_environment_server_is_a_relay_others_are_refused(project: Path) -> None:
    relay = (
        "weather_env_server:\n  environment_servers:\n    legacy_agent:\n      entrypoint: app.py\n"
        "      agent_server: {type: responses_api_agents, name: weather_simple_agent}\n"
    )
    write(project / "a.yaml", RESOURCES + MODEL + relay)
    config = load(["a.yaml"], env=[write(project / "env.yaml", ENV)])
    assert config.relays == {"weather_env_server": "weather_simple_agent"}
    assert "weather_env_server" not in config.servers and "weather_env_server" not in config.globals
    write(project / "b.yaml", RESOURCES + MODEL + relay.replace("legacy_agent:", "single_agent_turn:"))
    with pytest.raises(ConfigError) as excinfo:
        load(["b.yaml"], env=[write(project / "env.yaml", ENV)])
    (problem,) = problems_of(excinfo)
    assert "weather_env_server.environment_servers: unknown environment_servers implementation" in problem
    assert "'single_agent_turn'" in problem


EPISODES = """weather_episodes:
  environment_servers:
    single_agent_turn:
      entrypoint: app.py
      resources_server: {type: resources_servers, name: weather}
      agent_server: {type: responses_api_agents, name: weather_simple_agent}
      cleanup_timeout_seconds: 30
"""


def test_a_nemo_gym_environment_server_is_a_server_and_routes_must_name_one(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NeMo Gym's ``single_agent_turn`` is a server of the stack (kind ``environment_servers``, run
    as NeMo Gym's servers are); ``environment_server_routes`` is used, and must name such a server;
    a folder of that kind that is not NeMo Gym's is refused, since polygym ships none."""
    root = project / "nemo_gym_root"
    write(
        root / "environment_servers/single_agent_turn/app.py",
        "from nemo_gym import base_environment_server\n",
    )
    monkeypatch.setenv(NEMO_GYM_ROOT_ENV_VAR, str(root))
    routes = "environment_server_routes:\n  weather: weather_episodes\n"
    write(project / "a.yaml", RESOURCES + MODEL + EPISODES + routes)
    config = load(["a.yaml"], env=[write(project / "env.yaml", ENV)])
    spec = config.servers["weather_episodes"]
    assert (spec.kind, spec.implementation) == ("environment_servers", "single_agent_turn")
    assert spec.directory == root / "environment_servers/single_agent_turn"
    assert config.by_kind("environment_servers") == [spec] and config.warnings == []
    assert config.globals["environment_server_routes"] == {"weather": "weather_episodes"}
    # a run stops an environment server's episodes when a server they go through dies
    needs = server_needs(config)["weather_episodes"]
    assert needs == {"weather_episodes", "weather", "weather_simple_agent", "policy_model"}
    write(
        project / "b.yaml", RESOURCES + MODEL + EPISODES + "environment_server_routes: {weather: weather}\n"
    )
    with pytest.raises(ConfigError) as excinfo:
        load(["b.yaml"], env=[write(project / "env.yaml", ENV)])
    (problem,) = problems_of(excinfo)
    assert problem.startswith("environment_server_routes.weather: unknown environment server 'weather'")
    write(project / "environment_servers/mine/app.py", "")
    write(project / "c.yaml", RESOURCES + MODEL + EPISODES.replace("single_agent_turn:", "mine:"))
    with pytest.raises(ConfigError) as excinfo:
        load(["c.yaml"], env=[write(project / "env.yaml", ENV)])
    (problem,) = problems_of(excinfo)
    assert "weather_episodes: 'environment_servers/mine'" in problem and "is not NeMo Gym's" in problem


def test_unused_top_level_value_is_a_warning_naming_it(project: Path) -> None:
    write(project / "a.yaml", RESOURCES + MODEL + "trainer_lr: 0.1\n")
    config = load(["a.yaml"], env=[write(project / "env.yaml", ENV + "shared_unused: 1\n")])
    assert config.warnings == ["trainer_lr: not used by any server of this stack, ignored (from a.yaml)"]


def test_implementation_named_after_a_variant_runs_the_folder_holding_its_config(project: Path) -> None:
    """resources_servers/weather_env/configs/weather_arctic.yaml declares ``weather_arctic``: the
    code is weather_env's, as in NeMo Gym's ns_tools variants; a bare typo is still refused."""
    variant = RESOURCES.replace("    weather_env:\n", "    weather_arctic:\n")
    write(project / "resources_servers/weather_env/configs/weather_arctic.yaml", variant)
    write(project / "model.yaml", MODEL)
    env = [write(project / "env.yaml", ENV)]
    config = load(["model.yaml", "resources_servers/weather_env/configs/weather_arctic.yaml"], env=env)
    assert config.servers["weather"].directory == project / "resources_servers/weather_env"
    write(project / "typo.yaml", variant)
    with pytest.raises(ConfigError) as excinfo:
        load(["model.yaml", "typo.yaml"], env=env)
    assert any("unknown resources_servers implementation 'weather_arctic'" in p for p in problems_of(excinfo))


@pytest.mark.nemo_gym
def test_nemo_gym_own_configs_load_or_are_refused_clearly() -> None:
    """NeMo Gym 0.7's config files load, or are refused with a ConfigError, never a crash. Every
    fourth of the 561 here (141: 110 accepted when this was written); the whole sweep is the
    benchmark ``python -m benchmarks.nemo_gym_configs`` (437 accepted, 290 before #12), at ~25 s
    of CPU too slow for every run of the suite."""
    from benchmarks.nemo_gym_configs import measure

    counts, reasons = measure(nemo_gym_tree(), every=4)
    assert counts["crashed"] == 0, reasons
    assert counts["accepted"] >= 108, (counts, reasons.most_common(10))


def nemo_gym_shaped_tree(root: Path) -> Path:
    """A NeMo Gym-shaped tree: an environment whose config includes its agent's config by a path
    relative to the tree's root, as NeMo Gym's configs do. Returns the environment's config."""
    write(
        root / "responses_api_agents" / "simple_agent" / "configs" / "weather_agent.yaml",
        "weather_simple_agent:\n  responses_api_agents:\n    simple_agent:\n"
        "      resources_server: {type: resources_servers, name: weather}\n"
        "      model_server: {type: responses_api_models, name: policy_model}\n",
    )
    return write(
        root / "resources_servers" / "weather_env" / "configs" / "weather_env.yaml",
        "config_paths:\n- responses_api_agents/simple_agent/configs/weather_agent.yaml\n"
        "weather:\n  resources_servers:\n    weather_env: {entrypoint: app.py}\n",
    )


def test_config_paths_of_a_nemo_gym_config_resolve_in_its_own_tree_from_any_directory(
    project: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """NeMo Gym resolves a config's includes under its install root: the tree the file lives in."""
    config_file = nemo_gym_shaped_tree(tmp_path_factory.mktemp("ng"))
    write(project / "model.yaml", MODEL)
    config = load([config_file, project / "model.yaml"], env=[write(project / "env.yaml", ENV)])
    assert "weather_simple_agent" in config.servers
    assert config.sources[1].endswith("weather_agent.yaml")


def test_config_paths_resolve_under_the_nemo_gym_root_for_a_users_own_config(
    project: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file of the user's own that includes NeMo Gym's files by their root-relative paths finds
    them under ``--nemo-gym-root`` (NeMo Gym's ``--search-dir``), from any working directory."""
    root = tmp_path_factory.mktemp("ng")
    nemo_gym_shaped_tree(root)
    mine = write(
        project / "mine.yaml",
        "config_paths:\n- resources_servers/weather_env/configs/weather_env.yaml\n" + MODEL,
    )
    env = [write(project / "env.yaml", ENV)]
    with pytest.raises(ConfigError) as excinfo:
        load([mine], env=env)
    assert any(
        "resources_servers/weather_env/configs/weather_env.yaml' not found" in p for p in problems_of(excinfo)
    )
    monkeypatch.setenv(NEMO_GYM_ROOT_ENV_VAR, str(root))
    config = load([mine], env=env)
    assert {"weather", "weather_simple_agent", "policy_model"} <= set(config.servers)


def test_config_paths_relative_to_the_including_file(
    project: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    folder = tmp_path_factory.mktemp("elsewhere")
    write(folder / "model.yaml", MODEL)
    top = write(folder / "top.yaml", "config_paths: [model.yaml]\n" + RESOURCES)
    assert "policy_model" in load([top], env=[write(project / "env.yaml", ENV)]).servers
