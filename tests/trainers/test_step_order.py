"""The step-ordered file (`gym data blend --order steps`) keeps its steps through each trainer's loader.

TRL's case runs TRL's own ``RepeatSampler`` with the arguments ``GRPOTrainer._get_train_sampler``
gives it (trl 1.16). NeMo RL and verl do not install here (``nemo-rl`` on PyPI is an empty 0.0.0
placeholder and NeMo RL needs Python 3.12 and NeMo Gym; verl's trainer needs its GPU stack), so their
loaders are re-stated from the code read (docs/trainers.md cites it): a ``StatefulDataLoader`` over
the rows, ``batch_size`` = the step size, ``drop_last=True``, and with ``shuffle`` off NeMo RL's
default sampler / verl's ``SequentialSampler``; torch's ``DataLoader`` batches the same way.
"""

from __future__ import annotations

from collections import Counter

import pytest

from polygym.jsonl import iter_jsonl
from tests.conftest import ROOT, run_gym

SPEC = ROOT / "examples" / "trainers" / "nemo_rl" / "blend.yaml"
STEPS, STEP_SIZE, REPEATS = 3, 4, 4
QUOTA = {"example_single_tool_call_simple_agent": 3, "example_multi_step_simple_agent": 1}


@pytest.fixture(scope="module")
def step_rows(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("steps") / "steps.jsonl"
    done = run_gym(
        "data", "blend", "--spec", str(SPEC), "--order", "steps", "--steps", str(STEPS), "--output", str(out)
    )
    assert done.returncode == 0, done.stderr
    return list(iter_jsonl(out))


def quotas(rows: list[dict]) -> Counter[str]:
    return Counter(row["agent_ref"]["name"] for row in rows)


def test_the_step_file_holds_exact_quotas(step_rows: list[dict]) -> None:
    assert len(step_rows) == STEPS * STEP_SIZE
    for k in range(STEPS):
        assert quotas(step_rows[k * STEP_SIZE : (k + 1) * STEP_SIZE]) == QUOTA


def test_trl_generation_batches_are_the_steps(step_rows: list[dict]) -> None:
    """shuffle_dataset=False, generation_batch_size = step x num_generations, num_iterations=1."""
    from trl.trainer.utils import RepeatSampler

    sampler = RepeatSampler(
        data_source=step_rows,
        mini_repeat_count=REPEATS,
        batch_size=STEP_SIZE,
        repeat_count=1,
        shuffle=False,
        seed=0,
    )
    indices = list(sampler)
    batch = STEP_SIZE * REPEATS
    for k in range(STEPS):
        generation = indices[k * batch : (k + 1) * batch]
        assert generation == [i for i in range(k * STEP_SIZE, (k + 1) * STEP_SIZE) for _ in range(REPEATS)]
        assert quotas([step_rows[i] for i in generation[::REPEATS]]) == QUOTA


def test_nemo_rl_and_verl_batches_are_the_steps(step_rows: list[dict]) -> None:
    """NeMo RL: data.shuffle False, num_prompts_per_step = step; verl: data.shuffle False,
    train_batch_size = step (no gen_batch_size); both drop the last partial batch."""
    torch_data = pytest.importorskip("torch.utils.data")
    loader = torch_data.DataLoader(
        step_rows,
        batch_size=STEP_SIZE,
        sampler=torch_data.SequentialSampler(step_rows),
        drop_last=True,
        collate_fn=list,
    )
    batches = list(loader)
    assert batches == [step_rows[k * STEP_SIZE : (k + 1) * STEP_SIZE] for k in range(STEPS)]
    assert all(quotas(batch) == QUOTA for batch in batches)
