"""One-step off-policy training: the truncated IS ratio on known log-probs, the overlap of collection
with training (observable ordering), and the weight-sync hook called once before each step.

The TRL tests train the tiny in-code policy on one environment with a generator serving its own
copy of the weights (``SnapshotWeights``), as a vLLM server would.
"""

from __future__ import annotations

import concurrent.futures
import copy
import math
import threading
from collections.abc import Iterator, Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from polygym.training.off_policy import (
    OffPolicy,
    OneStepAhead,
    ratio_summary,
    require_sampling_logprobs,
    truncated_is_ratios,
)

pytestmark = pytest.mark.slow


def test_truncated_is_ratio_on_known_log_probs() -> None:
    train = [-1.0, -2.0, -0.5, -0.1]
    gen = [-1.5, -1.0, -3.0, -0.1 - math.log(4.0)]
    mask = [1, 1, 0, 1]
    applied, raw = truncated_is_ratios(train, gen, mask, cap=3.0)
    assert raw == pytest.approx([math.exp(0.5), math.exp(-1.0), 1.0, 4.0])
    assert applied == pytest.approx([math.exp(0.5), math.exp(-1.0), 1.0, 3.0])  # 4 truncated at 3
    summary = ratio_summary([raw], [mask], cap=3.0)
    assert summary["is_ratio_mean"] == pytest.approx((math.exp(0.5) + math.exp(-1.0) + 3.0) / 3)
    assert summary["is_ratio_max"] == pytest.approx(4.0) and summary["is_ratio_min"] == pytest.approx(
        math.exp(-1)
    )
    assert summary["is_truncated_share"] == pytest.approx(1 / 3) and summary["is_tokens"] == 3
    with pytest.raises(ValueError, match="3 training log-probs, 2 generation log-probs"):
        truncated_is_ratios([0.0] * 3, [0.0] * 2, [1] * 3, cap=2.0)
    with pytest.raises(ValueError, match="cap must be >= 1"):
        OffPolicy(is_cap=0.5)


def test_raw_log_probs_at_another_temperature_are_refused() -> None:
    raw = SimpleNamespace(
        step=4, logprob_semantics=[{"source": "vllm", "temperature": 0.7, "processed": "raw"}]
    )
    with pytest.raises(ValueError, match=r"raw logits taken at temperature 0\.7"):
        require_sampling_logprobs(raw)  # type: ignore[arg-type]
    at_one = SimpleNamespace(
        step=4, logprob_semantics=[{"source": "vllm", "temperature": 1.0, "processed": "raw"}]
    )
    require_sampling_logprobs(at_one)  # type: ignore[arg-type]


class FakeCollector:
    """Steps collected on a worker thread; step 1's collection waits until the test lets it end."""

    def __init__(self, events: list[tuple[str, int]]) -> None:
        self.events = events
        self.release = threading.Event()
        self.pool = concurrent.futures.ThreadPoolExecutor(1)

    def _collect(self, number: int) -> Any:
        if number == 1:
            assert self.release.wait(10), "step 1's collection was never overlapped with training"
        return SimpleNamespace(step=number)

    def submit(self, number: int) -> concurrent.futures.Future[Any]:
        return self.pool.submit(self._collect, number)

    def step(self, number: int) -> Any:
        return self._collect(number)


def test_one_step_ahead_collects_the_next_step_while_the_caller_trains() -> None:
    events: list[tuple[str, int]] = []
    collector = FakeCollector(events)
    ahead = OneStepAhead(collector, lambda name, step: events.append((name, step)))  # type: ignore[arg-type]
    assert ahead.take(0).step == 0
    ahead.prefetch(1)
    events.append(("train", 0))  # the trainer's update of step 0, while step 1 is in flight
    collector.release.set()
    assert ahead.take(1).step == 1
    assert events.index(("collect_start", 1)) < events.index(("train", 0)) < events.index(("handover", 1))
    assert events[:3] == [("collect_start", 0), ("collect_end", 0), ("handover", 0)]


# -- with TRL --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    pytest.importorskip("torch")
    pytest.importorskip("trl")
    from polygym.blend.spec import parse_spec
    from polygym.training.generation_server import GenerationServerThread, HFGenerator
    from polygym.training.models import tiny_policy
    from polygym.training.run import stack_config

    class GatedGenerator(HFGenerator):
        """Generation that, once armed, waits for the gate: proves a collection runs during training."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.armed = False
            self.gate = threading.Event()
            self.gate_timed_out = False

        def generate(self, requests: Sequence[Any]) -> list[Any]:
            if self.armed and not self.gate.wait(30):
                self.gate_timed_out = True
            return super().generate(requests)

    tmp = tmp_path_factory.mktemp("offpolicy")
    spec = parse_spec(
        {"environments": [{"name": "mcqa"}], "prompts_per_step": 2, "responses_per_prompt": 3, "seed": 5},
        "test",
        tmp,
    )
    model, tokenizer = tiny_policy(seed=4)
    generator = GatedGenerator(copy.deepcopy(model), tokenizer)
    with GenerationServerThread(generator) as server:
        yield {
            "tmp": tmp,
            "spec": spec,
            "model": model,
            "tokenizer": tokenizer,
            "generator": generator,
            "config": stack_config(spec, server.url, [], []),
        }


def by_position(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
    """Rewards 0, 1, 2 within every group of 3: each step has a gradient, whatever was sampled."""
    return [float(i % 3) for i in range(len(completions))]


def _collector(policy: dict[str, Any], name: str, bound: Any) -> Any:
    from polygym.training.collector import TokenCollector

    sampling = {"max_output_tokens": 6, "temperature": 1.0}
    return TokenCollector(
        policy["spec"],
        policy["tmp"] / name,
        stack_config=policy["config"],
        sampling=sampling,
        staleness=bound,
    )


class Recording:
    """A weight-sync hook wrapper whose calls the test reads."""

    def __init__(self, inner: Any, events: list[tuple[str, int]]) -> None:
        self.inner = inner
        self.events = events
        self.published = inner.published
        self.isolated = inner.isolated

    def sync(self, trainer: Any, version: int) -> None:
        self.events.append(("sync", version))
        self.inner.sync(trainer, version)


def test_weights_are_synced_once_before_each_step(policy: dict[str, Any]) -> None:
    from polygym.training.policy_version import StalenessBound
    from polygym.training.trl_adapter import PolygymGRPO
    from polygym.training.weight_sync import SnapshotWeights

    events: list[tuple[str, int]] = []
    hook = Recording(SnapshotWeights(policy["generator"], policy["model"]), events)
    bound = StalenessBound(max_staleness=0, published=hook.published)
    with _collector(policy, "onpolicy.jsonl", bound) as collector:
        grpo = PolygymGRPO(
            collector, steps=3, weight_sync=hook, on_step=lambda s: events.append(("collected", s.step))
        )
        trainer = grpo.trainer(
            policy["model"],
            policy["tokenizer"],
            grpo.grpo_config(policy["tmp"] / "t1", learning_rate=1e-2),
            [by_position],
        )
        trainer.train()
    assert events == [
        ("sync", 0),
        ("collected", 0),
        ("sync", 1),
        ("collected", 1),
        ("sync", 2),
        ("collected", 2),
    ]
    assert [{r.policy_version for r in s.rollouts} for s in grpo.history] == [{0}, {1}, {2}]
    assert all(s.total.stale == 0 and s.total.staleness_max == 0 for s in grpo.history)
    served = policy["generator"].model.model.layers[-1].mlp.down_proj.weight
    trained = policy["model"].model.layers[-1].mlp.down_proj.weight
    assert policy["generator"].policy_version == 2
    assert (served - trained).abs().max().item() != 0  # step 2's update came after the last sync

    # a run that starts at step 5 (a fresh trainer, global_step 0) keeps the blend's numbering
    events.clear()
    with _collector(policy, "offset.jsonl", bound) as collector:
        offset = PolygymGRPO(collector, steps=1, start_step=5, weight_sync=hook)
        args = offset.grpo_config(policy["tmp"] / "t4", learning_rate=1e-2)
        offset.trainer(policy["model"], policy["tokenizer"], args, [by_position]).train()
    assert events == [("sync", 5)]
    (step,) = offset.history
    assert step.step == 5 and {r.staleness for r in step.rollouts} == {0} and step.total.stale == 0


def test_off_policy_overlaps_collection_with_training_and_corrects_it(policy: dict[str, Any]) -> None:
    from transformers import TrainerCallback

    from polygym.training.policy_version import StalenessBound
    from polygym.training.trl_adapter import PolygymGRPO
    from polygym.training.weight_sync import SnapshotWeights

    generator = policy["generator"]
    events: list[tuple[str, int]] = []

    def on_event(name: str, step: int) -> None:
        events.append((name, step))
        if name == "collect_start" and step == 1:
            generator.armed = True  # step 1's generation now waits for step 0's optimizer step

    class Updates(TrainerCallback):
        def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            events.append(("optimizer_step", state.global_step))
            generator.gate.set()

    hook = Recording(SnapshotWeights(generator, policy["model"]), events)
    bound = StalenessBound(max_staleness=1, published=hook.published)
    with _collector(policy, "offpolicy.jsonl", bound) as collector:
        grpo = PolygymGRPO(
            collector, steps=3, weight_sync=hook, off_policy=OffPolicy(is_cap=2.0, on_event=on_event)
        )
        args = grpo.grpo_config(policy["tmp"] / "t2", learning_rate=1e-2)
        trainer = grpo.trainer(
            policy["model"], policy["tokenizer"], args, [by_position], callbacks=[Updates()]
        )
        trainer.train()
    generator.armed = False
    assert not generator.gate_timed_out, "step 1 was not collected while step 0 trained"
    # step 1 is collected (with version 0's weights) while step 0 trains, weights are pushed only
    # once no collection is in flight, and each sync happens once, before its step is handed over
    order = [e for e in events if e[0] != "collect_end"]
    assert order[:6] == [
        ("sync", 0),
        ("collect_start", 0),
        ("handover", 0),
        ("collect_start", 1),
        ("optimizer_step", 0),
        ("sync", 1),
    ]
    assert events.index(("collect_end", 1)) < events.index(("sync", 1))
    assert [e for e in events if e[0] == "sync"] == [("sync", 0), ("sync", 1), ("sync", 2)]
    assert events.index(("collect_start", 2)) > events.index(("sync", 1))

    first, second, third = grpo.history
    assert {r.policy_version for r in first.rollouts} == {0} and first.off_policy["staleness_max"] == 0
    # step 0 is trained by the weights that generated it: the trainer's recomputed log-probs match
    # the generator's recorded ones token for token (ratios 1), so the ratio's alignment is right
    assert first.off_policy["is_ratio_min"] == pytest.approx(1.0, abs=1e-4)
    assert first.off_policy["is_ratio_max"] == pytest.approx(1.0, abs=1e-4)
    assert {r.policy_version for r in second.rollouts} == {0} and second.off_policy["staleness_max"] == 1
    assert {r.policy_version for r in third.rollouts} == {1} and third.total.stale == 0
    for step in (second, third):  # the lag is corrected, and recorded per step
        assert 0 < step.off_policy["is_ratio_mean"] <= 2.0 and step.off_policy["is_cap"] == 2.0
        assert step.off_policy["is_ratio_max"] != 1.0  # the weights moved: ratios differ from 1
    log = trainer.state.log_history
    assert "polygym/off_policy/is_ratio_mean" in log[1] and log[1]["polygym/off_policy/staleness_max"] == 1


def test_off_policy_needs_isolated_weights_and_one_correction(policy: dict[str, Any]) -> None:
    from polygym.training.policy_version import StalenessBound
    from polygym.training.trl_adapter import PolygymGRPO
    from polygym.training.weight_sync import SharedWeights, SnapshotWeights

    with _collector(policy, "refused.jsonl", StalenessBound(max_staleness=0)) as collector:
        with pytest.raises(ValueError, match="max_staleness 0 refuses them"):
            PolygymGRPO(
                collector,
                2,
                weight_sync=SnapshotWeights(policy["generator"], policy["model"]),
                off_policy=OffPolicy(),
            )
        with pytest.raises(ValueError, match="changes only at sync"):
            PolygymGRPO(collector, 2, weight_sync=SharedWeights(policy["generator"]), off_policy=OffPolicy())
        with pytest.raises(ValueError, match="own copy"):
            SnapshotWeights(policy["generator"], policy["generator"].model)
        collector.staleness = StalenessBound(max_staleness=1)
        grpo = PolygymGRPO(
            collector,
            2,
            weight_sync=SnapshotWeights(policy["generator"], policy["model"]),
            off_policy=OffPolicy(),
        )
        both = grpo.grpo_config(policy["tmp"] / "t3", use_vllm=True, vllm_mode="server")
        with pytest.raises(ValueError, match="applied twice"):
            grpo._check_args(both)
