"""A shipped server whose polygym extra is not installed fails when built, naming the extra."""

from __future__ import annotations

import sys

import pytest

from polygym.servers.extras import MissingExtraError, require_extra
from resources_servers.math_with_verify.app import MathWithVerify
from resources_servers.reasoning_gym.app import ReasoningGym
from responses_api_models.local_model.app import LocalModel


def test_require_extra_names_the_missing_modules_and_the_pip_command() -> None:
    require_extra("env", "test", "json")  # installed: nothing happens
    with pytest.raises(MissingExtraError) as err:
        require_extra("env", "test", "json", "no_such_module_xyz")
    assert str(err.value) == (
        "env needs no_such_module_xyz, from polygym's [test] extra: "
        "pip install 'polygym[test]' (from a clone: pip install -e '.[test]')"
    )


@pytest.mark.parametrize(
    ("server_class", "module", "extra"),
    [
        (MathWithVerify, "math_verify", "envs"),
        (ReasoningGym, "reasoning_gym", "envs"),
        (LocalModel, "xllamacpp", "local"),
    ],
)
def test_shipped_servers_name_their_extra(monkeypatch, server_class, module, extra) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # what find_spec (and import) treat as not installed
    with pytest.raises(MissingExtraError, match=rf"needs {module}, .*pip install 'polygym\[{extra}\]'"):
        server_class("server")
