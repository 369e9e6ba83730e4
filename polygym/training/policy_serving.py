"""Where ``gym train run``'s policy is served, and the weight-sync hook that goes with it.

Three arrangements, one interface (a URL for ``vllm_model``, a ``WeightSync``, the GRPOConfig
settings it needs):

- **on-policy, in this process** (the default): the generation server serves the model object being
  trained (``SharedWeights``); every rollout uses the current weights with nothing to copy.
- **one-step off-policy, in this process** (``--off-policy``): the generation server serves a copy,
  refreshed before each step (``SnapshotWeights``), so step N+1 can be collected while step N
  updates the original.
- **a vLLM server** (``--vllm-server URL``, a GPU machine): TRL's ``use_vllm=True`` server mode
  pushes the trainer's weights to it over NCCL before each step (``TRLServerWeights``), and the
  environments reach it through ``vllm_model``. The server must run with TRL's weight-transfer
  engine (``trl vllm-serve``, or ``vllm serve --weight-transfer-config '{"backend": "nccl"}'`` with
  ``VLLM_SERVER_DEV_MODE=1``; recipe in ``examples/train_grpo_vllm/``).

Token-in/token-out multi-turn (``continuation``) needs the server to extend the ids it is sent as
``required_prefix_token_ids``. polygym's generation server does; stock ``vllm serve`` and
``trl vllm-serve`` do not, and ``vllm_model`` answers a turn whose prompt does not start with the ids
it sent with a 502 rather than let a re-rendered history pass as exact. So with a vLLM server the
ids are supplied only when the caller says the server implements the extension (NeMo RL's vLLM
server does); otherwise later turns are rendered from the history's text, counted as
``retemplated_turns``, and a rollout whose rendering drifted is masked and counted in
``masked_share``.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from polygym.training.weight_sync import (
    SharedWeights,
    SnapshotWeights,
    TRLServerWeights,
    WeightSync,
    trl_server_settings,
)

RETEMPLATED_MASKED_SHARE = 0.1
"""The masked-share alarm when later turns are rendered from text (a vLLM server without the prefix
extension) and no ``max_masked_share`` was given: drift there masks rollouts, and a silent bias is
what the alarm exists for."""


def masked_share_bound(max_masked_share: float | None, prefix_token_ids: bool) -> float | None:
    """The masked-share alarm of a run: the one asked for, else ``RETEMPLATED_MASKED_SHARE`` when the
    server cannot extend exact ids (every later turn is re-rendered and may drift), else none."""
    if max_masked_share is None and not prefix_token_ids:
        return RETEMPLATED_MASKED_SHARE
    return max_masked_share


def vllm_trainer_problem() -> str | None:
    """Why this machine cannot train against a vLLM server (TRL's NCCL weight transfer needs vllm
    installed next to the trainer and a CUDA device), or None."""
    import importlib.util

    import torch

    if importlib.util.find_spec("vllm") is None:
        return "needs vllm installed with the trainer (pip install 'vllm>=0.22.0,<=0.31.0', TRL 1.16's range)"
    if not torch.cuda.is_available():
        return "needs a CUDA device for the trainer (TRL pushes the weights to vLLM over NCCL)"
    return None


@dataclass
class PolicyServing:
    url: str
    """``vllm_model``'s ``base_url`` (``http://host:port/v1``)."""
    weight_sync: WeightSync
    generator: Any = None
    """The in-process ``HFGenerator`` (its stats go to ``summary.json``); None with a vLLM server."""
    trainer_settings: dict[str, Any] = field(default_factory=dict)
    prefix_token_ids: bool = True
    """Whether the server implements ``required_prefix_token_ids``: ``vllm_model`` supplies the
    previous turn's ids only then (see the module docstring)."""


@contextlib.contextmanager
def serve_policy(
    model: Any,
    tokenizer: Any,
    model_name: str,
    off_policy: bool = False,
    vllm_server: str | None = None,
    vllm_prefix_token_ids: bool = False,
) -> Iterator[PolicyServing]:
    """Serve ``model`` as the module docstring says, for the duration of the block (the off-policy
    mode always corrects with its own importance ratios, so TRL's is turned off then).
    ``vllm_prefix_token_ids``: the vLLM server implements ``required_prefix_token_ids``."""
    if vllm_server is not None:
        root = vllm_server.rstrip("/").removesuffix("/v1")
        settings = trl_server_settings(root, off_policy)
        yield PolicyServing(f"{root}/v1", TRLServerWeights(), None, settings, vllm_prefix_token_ids)
        return
    from polygym.training.generation_server import GenerationServerThread, HFGenerator

    generator = HFGenerator(copy.deepcopy(model) if off_policy else model, tokenizer)
    sync: WeightSync = SnapshotWeights(generator, model) if off_policy else SharedWeights(generator)
    with GenerationServerThread(generator, model_name) as server:
        yield PolicyServing(server.url, sync, generator)
