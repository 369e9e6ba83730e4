"""NeMo Gym 0.7.0's own reverify against a running stack; run with a NeMo Gym environment's python.

``gym eval reverify`` of NeMo Gym starts the servers of its config first; this runs only its
``RolloutReverificationHelper`` (payloads, ``/reverify_mode`` guard, ``/verify``, output files),
which finds the stack's servers through the head named by ``++head_server.host/port``.
"""

import asyncio

from nemo_gym.global_config import get_global_config_dict
from nemo_gym.rollout_reverification import RolloutReverificationConfig, RolloutReverificationHelper

config = RolloutReverificationConfig.model_validate(get_global_config_dict())
asyncio.run(RolloutReverificationHelper().run_from_config(config))
