"""The garbage collector's pace in processes that hold many rollouts in flight."""

import gc
from collections.abc import Iterator

import pytest

from polygym.event_loop import run_async
from polygym.gc_pace import YOUNG_THRESHOLD, pace_for_rollouts


@pytest.fixture(autouse=True)
def thresholds() -> Iterator[None]:
    saved = gc.get_threshold()
    yield
    gc.set_threshold(*saved)


def test_the_young_threshold_is_raised_and_the_older_ones_kept() -> None:
    gc.set_threshold(700, 11, 12)
    pace_for_rollouts()
    assert gc.get_threshold() == (YOUNG_THRESHOLD, 11, 12)


@pytest.mark.parametrize("young", [YOUNG_THRESHOLD * 2, 0])
def test_a_process_that_collects_less_often_or_never_keeps_its_setting(young: int) -> None:
    gc.set_threshold(young, 10, 10)
    pace_for_rollouts()
    assert gc.get_threshold() == (young, 10, 10)


def test_the_gym_commands_event_loop_runs_paced() -> None:
    gc.set_threshold(700, 10, 10)

    async def young_threshold() -> int:
        return gc.get_threshold()[0]

    assert run_async(young_threshold()) == YOUNG_THRESHOLD
