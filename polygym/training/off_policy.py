"""One-step off-policy training: collect step N+1 while step N trains, and correct for the lag.

On-policy GRPO alternates: the generator idles while the trainer updates, the trainer idles while
the environments play. With rollouts that take as long as an update (multi-turn games, slow
verifiers) half the wall time is waiting. ``OneStepAhead`` overlaps them: when the trainer takes
step ``n`` it starts collecting step ``n + 1`` in the background, with the weights synced for step
``n`` (version ``n``); step ``n + 1`` is then trained by version ``n + 1``: one step stale, never more
(the collector's ``max_staleness`` bound refuses or reports anything older, ``policy_version``).

The policy gradient of stale samples is biased; the **truncated importance-sampling** correction
weighs each generated token by ``w = min(exp(logp_now - logp_gen), cap)`` where ``logp_gen`` is
the log-prob the generator recorded when it sampled the token and ``logp_now`` the trainer's
log-prob of it under the weights about to be updated, at the sampling temperature. ``cap`` bounds
the variance a rare token can add (truncated IS, as in IMPALA's V-trace and TRL's
``vllm_importance_sampling_mode="token_truncate"``). The weights multiply the loss mask TRL
receives (``env_mask``, a per-token weight): with TRL's token-summed losses the normalizer is the
sum of those weights, so within a step the ratios act self-normalized (weighted IS). Every step
records the ratios' mean, min, max and the share of tokens truncated (``TokenStep.off_policy``:
``is_ratio_mean`` ...).

The ratio needs ``logp_gen`` to be log-probs of the distribution that was sampled: polygym's
generation server records those; vLLM's are raw logits before temperature unless it runs with
``--logprobs-mode processed_logprobs`` (what ``trl vllm-serve`` sets; ``vllm_model`` labels vLLM's
log-probs raw either way), so ``require_sampling_logprobs`` refuses raw log-probs taken at a
temperature other than 1.
"""

from __future__ import annotations

import concurrent.futures
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from polygym.training.collector import TokenCollector, TokenStep

DEFAULT_IS_CAP = 3.0
Event = Callable[[str, int], None]


@dataclass(frozen=True)
class OffPolicy:
    """The one-step off-policy mode's settings (``PolygymGRPO(off_policy=...)``)."""

    is_cap: float | None = DEFAULT_IS_CAP
    """Truncation of the importance ratio; None: no correction (the lag is left uncorrected)."""
    on_event: Event | None = None
    """Called with ``("collect_start" | "collect_end" | "handover", step)``: the overlap, observable."""

    def __post_init__(self) -> None:
        if self.is_cap is not None and not self.is_cap >= 1.0:
            raise ValueError(f"the importance-sampling cap must be >= 1, not {self.is_cap}")


def truncated_is_ratios(
    train_logps: Sequence[float], gen_logps: Sequence[float], mask: Sequence[float], cap: float
) -> tuple[list[float], list[float]]:
    """``(applied, raw)`` per-token ratios: ``raw = exp(train - gen)``, ``applied = min(raw, cap)``
    on trained tokens (``mask != 0``); 1.0 on every other token, which the mask zeroes anyway."""
    if not len(train_logps) == len(gen_logps) == len(mask):
        raise ValueError(
            f"{len(train_logps)} training log-probs, {len(gen_logps)} generation log-probs, {len(mask)} mask"
        )
    raw, applied = [], []
    for now, then, weight in zip(train_logps, gen_logps, mask, strict=True):
        ratio = math.exp(min(now - then, 50.0)) if weight else 1.0
        raw.append(ratio)
        applied.append(min(ratio, cap))
    return applied, raw


def ratio_summary(
    raws: Sequence[Sequence[float]], masks: Sequence[Sequence[float]], cap: float
) -> dict[str, float]:
    """The step's ratios over its trained tokens: mean of the applied ones, min and max of the raw
    ones, share truncated, and how many tokens."""
    trained = [r for raw, mask in zip(raws, masks, strict=True) for r, m in zip(raw, mask, strict=True) if m]
    if not trained:
        return {"is_tokens": 0.0}
    return {
        "is_ratio_mean": sum(min(r, cap) for r in trained) / len(trained),
        "is_ratio_min": min(trained),
        "is_ratio_max": max(trained),
        "is_truncated_share": sum(r > cap for r in trained) / len(trained),
        "is_cap": cap,
        "is_tokens": float(len(trained)),
    }


def policy_logprobs(
    model: Any, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], temperature: float
) -> list[list[float]]:
    """Log-prob of each completion token under ``model`` at ``temperature`` (logits / T, log-softmax:
    how TRL computes the training log-probs), one forward pass per sequence, no gradient."""
    import torch

    device = next(model.parameters()).device
    out: list[list[float]] = []
    with torch.no_grad():
        for prompt, completion in zip(prompts, completions, strict=True):
            if not completion:
                out.append([])
                continue
            ids = torch.tensor([[*prompt, *completion]], dtype=torch.long, device=device)
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
            logps = torch.log_softmax(logits / (temperature if temperature > 0 else 1.0), dim=-1)
            chosen = logps.gather(1, ids[0, len(prompt) :].unsqueeze(1)).squeeze(1)
            out.append([float(x) for x in chosen.cpu()])
    return out


def require_sampling_logprobs(step: TokenStep) -> None:
    """Refuse log-probs that are not the sampled distribution's (raw logits at T != 1)."""
    for semantics in step.logprob_semantics:
        temperature = semantics.get("temperature")
        if semantics.get("processed") == "raw" and temperature not in (None, 0.0, 1.0):
            raise ValueError(
                f"step {step.step}: the generator's log-probs are raw logits taken at temperature "
                f"{temperature} ({semantics}), not the sampled distribution: the importance ratio "
                "would be biased (sample at temperature 1)"
            )


def apply_is_correction(
    batch: dict[str, list[Any]], step: TokenStep, model: Any, temperature: float, cap: float
) -> None:
    """Multiply each row's ``env_mask`` by its truncated ratios and record them in ``step.off_policy``."""
    require_sampling_logprobs(step)
    masks = list(batch["env_mask"])
    now = policy_logprobs(model, batch["prompt_ids"], batch["completion_ids"], temperature)
    raws = []
    for k, mask in enumerate(masks):
        applied, raw = truncated_is_ratios(now[k], batch["logprobs"][k], mask, cap)
        batch["env_mask"][k] = [m * w for m, w in zip(mask, applied, strict=True)]
        raws.append(raw)
    step.off_policy.update(ratio_summary(raws, masks, cap))


def describe(step: TokenStep) -> str:
    """The step's lag and correction for a progress line (empty when on-policy and uncorrected)."""
    values = step.off_policy
    lag = values.get("staleness_max")
    parts = [f"{int(lag)} step(s) stale"] if lag else []
    if "is_ratio_mean" in values:
        parts.append(f"IS ratio {values['is_ratio_mean']:.3f} ({values['is_truncated_share']:.0%} truncated)")
    if values.get("refused"):
        parts.append(f"{int(values['refused'])} refused as stale")
    return "".join(f"; {part}" for part in parts)


class OneStepAhead:
    """Hands a trainer step ``n`` while step ``n + 1`` is collected in the background."""

    def __init__(self, collector: TokenCollector, on_event: Event | None = None) -> None:
        self.collector = collector
        self.on_event = on_event
        self._pending: tuple[int, concurrent.futures.Future[TokenStep]] | None = None

    def _event(self, name: str, step: int) -> None:
        if self.on_event is not None:
            self.on_event(name, step)

    def prefetch(self, number: int) -> None:
        """Start collecting step ``number`` (waits for a collection already in flight first)."""
        self.drain()
        self._event("collect_start", number)
        future = self.collector.submit(number)
        future.add_done_callback(lambda _: self._event("collect_end", number))
        self._pending = (number, future)

    def drain(self) -> None:
        """Wait until no collection is in flight (before weights are pushed to the generator)."""
        if self._pending is not None:
            concurrent.futures.wait([self._pending[1]])

    def take(self, number: int) -> TokenStep:
        """Step ``number``: the one collected in the background, or collected now."""
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] == number:
            step = pending[1].result()
        else:
            if pending is not None:
                concurrent.futures.wait([pending[1]])
            self._event("collect_start", number)
            step = self.collector.step(number)
            self._event("collect_end", number)
        self._event("handover", number)
        return step


def drain_callback(ahead: OneStepAhead) -> Any:
    """A ``TrainerCallback`` that waits for the background collection at the end of every optimizer
    step: TRL's own vLLM weight sync runs right after it, and must not change the weights under a
    collection in flight."""
    from transformers import TrainerCallback

    class DrainBeforeSync(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            ahead.drain()

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            ahead.drain()  # a run stopped early leaves no collection running into the shutdown

    return DrainBeforeSync()
