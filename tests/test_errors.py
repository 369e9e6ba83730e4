"""The "list of problems" errors share one base, one format and one exit code."""

import pickle

import pytest

from polygym.blend.spec import BlendSpecError
from polygym.collect.dataset import DatasetError
from polygym.errors import ProblemsError
from polygym.stack.config import ConfigError


@pytest.mark.parametrize("error", [ConfigError, DatasetError, BlendSpecError])
def test_problem_errors_share_the_base(error: type[ProblemsError]) -> None:
    exc = error(["one", "two"])
    assert isinstance(exc, ProblemsError) and exc.exit_code == 2
    assert exc.problems == ["one", "two"]
    assert str(exc) == f"2 {error.noun}s:\n  - one\n  - two"
    copy = pickle.loads(pickle.dumps(exc))  # errors cross process backends
    assert type(copy) is error and copy.problems == exc.problems


def test_a_long_list_is_capped() -> None:
    text = str(DatasetError([f"row {i}" for i in range(120)]))
    assert text.startswith("120 invalid row problems:")
    assert "row 49" in text and "row 50" not in text
    assert text.endswith("... and 70 more")


def test_catalog_raises_the_config_error() -> None:
    from polygym.stack import catalog

    with pytest.raises(ConfigError) as info:
        catalog.find_implementation_dir("resources_servers", "no_such_implementation")
    assert info.value.problems
