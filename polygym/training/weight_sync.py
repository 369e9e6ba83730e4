"""Weight-sync hooks: put the trainer's weights on the generator before a step, and say which version.

``PolygymGRPO(weight_sync=...)`` calls ``sync(trainer, version)`` once before each step's rollouts
are generated (before step ``n`` is collected in on-policy mode; before step ``n + 1`` is started
in the one-step off-policy mode), with ``version`` = ``n``: the weights that train step ``n``
(the optimizer updates so far, counted from the run's first step). Every
hook publishes the version (``published``: the collector's fallback stamp, ``policy_version``),
and a hook that owns a polygym generator sets its ``policy_version`` too, so each completion states
the version that generated it.

- ``SharedWeights``: the generation server serves the very model object the trainer updates (what
  ``gym train run`` does on one machine): nothing to copy, the version is stamped. The weights
  change in place at every optimizer step, so no collection may run during training: on-policy only.
- ``SnapshotWeights``: the generation server serves its own copy, refreshed only by ``sync``. This is
  the vLLM arrangement on one machine (a policy that changes only when weights are pushed), so the
  off-policy mode can collect while the trainer updates the original.
- ``TRLServerWeights``: TRL with ``use_vllm=True, vllm_mode="server"`` owns the transfer (NCCL,
  ``trainer.vllm_generation.sync_weights()``); this hook makes sure it happened for the trainer's
  current weights (TRL syncs by itself before each generation batch, marking the ``global_step`` it
  loaded; the hook syncs when TRL has not) and publishes the version, since stock vLLM states none.
"""

from __future__ import annotations

from typing import Any, Protocol

from polygym.training.policy_version import PolicyVersion


class WeightSync(Protocol):
    published: PolicyVersion
    isolated: bool
    """True when the served weights change only at ``sync`` (collection may overlap training)."""

    def sync(self, trainer: Any, version: int) -> None: ...


class SharedWeights:
    """The generator serves the trainer's own model object (``generation_server.HFGenerator``)."""

    isolated = False

    def __init__(self, generator: Any) -> None:
        self.generator = generator
        self.published = PolicyVersion()

    def sync(self, trainer: Any, version: int) -> None:
        with self.generator.lock:
            self.generator.policy_version = version
        self.published.publish(version)


class SnapshotWeights:
    """The generator serves a copy of ``source``; ``sync`` copies ``source``'s weights into it."""

    isolated = True

    def __init__(self, generator: Any, source: Any) -> None:
        if generator.model is source:
            raise ValueError(
                "SnapshotWeights needs a generator with its own copy of the model (copy.deepcopy)"
            )
        self.generator = generator
        self.source = source
        self.published = PolicyVersion()

    def sync(self, trainer: Any, version: int) -> None:
        import torch

        with self.generator.lock, torch.no_grad():
            self.generator.model.load_state_dict(self.source.state_dict())
            self.generator.policy_version = version
        self.published.publish(version)


class TRLServerWeights:
    """TRL's server-mode vLLM weight transfer, checked and published (see the module docstring)."""

    isolated = True

    def __init__(self) -> None:
        self.published = PolicyVersion()
        self.transfers = 0
        """Syncs this hook had to run itself (TRL had not synced that version yet)."""

    def sync(self, trainer: Any, version: int) -> None:
        generation = getattr(trainer, "vllm_generation", None)
        if generation is None:
            raise RuntimeError("TRLServerWeights needs a GRPOTrainer with use_vllm=True, vllm_mode='server'")
        updates = trainer.state.global_step
        if getattr(trainer, "_last_loaded_step", None) != updates:
            generation.sync_weights()
            trainer._last_loaded_step = updates  # TRL's own "already synced" mark: it skips its sync
            self.transfers += 1
        self.published.publish(version)


def trl_server_settings(server_url: str, polygym_is_correction: bool) -> dict[str, Any]:
    """``GRPOConfig`` settings for TRL's vLLM server mode against ``server_url`` (``http://host:8000``,
    the server's root, not ``/v1``). TRL's own importance-sampling correction is turned off when
    polygym applies one (``off_policy``): both use the same ratio and would apply it twice."""
    return {
        "use_vllm": True,
        "vllm_mode": "server",
        "vllm_server_base_url": server_url.rstrip("/").removesuffix("/v1"),
        "vllm_importance_sampling_correction": not polygym_is_correction,
    }
