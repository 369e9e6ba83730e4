"""Training hookup: token-level rollouts for RL trainers, GRPO advantages, trainer adapters.

- ``tokens``: one rollout's token sequence, loss mask and sampling log-probs, assembled from the
  training token fields model servers put on their output (DESIGN §3), with a contiguity check.
- ``continuation``: token-in/token-out multi-turn — how a model server builds the next turn's
  prompt from the exact ids already generated plus the new messages' tokens.
- ``advantages``: group-relative (GRPO) advantages, a small documented helper.
- ``collector``: the per-step API a trainer calls — the blend's step N, collected with token
  capture on, as token rollouts plus per-environment step statistics.
- ``generation_server``: a Hugging Face causal LM served as a vLLM-like Chat Completions server
  (token ids and log-probs included), so the weights being trained are the policy.
- ``models``: policies whose weights come from pip packages (SmolLM2-135M by default), a tiny
  random policy for tests, and freezing all but the top blocks.
- ``trl_adapter``: TRL's ``GRPOTrainer`` trained on a polygym blend (needs ``pip install -e .[train]``).
- ``run``: ``gym train run``, a complete GRPO run on CPU with validation before and after.

``tokens``, ``continuation``, ``advantages`` and ``collector`` need nothing beyond polygym's own
dependencies; the other modules need the ``train`` extra (torch, transformers, trl). Nothing is
imported here.
"""
