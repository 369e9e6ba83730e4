"""GPU servers on Ray: their replicas' GPUs reserved together, in one placement group per server.

A model server that needs GPUs must not half-start: with plain actors, replicas that fit start,
the others wait in Ray's queue forever, and the stack looks up while a part of it never serves.
A placement group reserves every replica's bundle (its ``num_gpus``, ``num_cpus``, custom
``resources``) at once or not at all, and each replica runs in its own bundle, so the GPUs it was
given stay its own across restarts. The group is ``PACK``: replicas share a node where they fit
(a fast local interconnect), and spread over nodes where they do not; a replica that needs
several GPUs is one bundle, so those are always on one node.

A request no node could ever hold (8 GPUs per replica on nodes of 1) fails at once, naming the
server and what the cluster's largest node has; one that fits a node but not now (GPUs held by
others) fails after ``START_TIMEOUT_S``. Either is a ``LaunchError``, never a wait without end.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from polygym.stack.backend import START_TIMEOUT_S, LaunchError
from polygym.stack.placement import Placement
from polygym.stack.ray_spread import bundle_of

STRATEGY = "PACK"


def needs_group(placement: Placement) -> bool:
    return placement.num_gpus > 0


async def reserve(name: str, placement: Placement) -> PlacementGroup:
    """One bundle per replica of server ``name``, all reserved; a LaunchError when they cannot be
    (the caller has checked that some node could hold one: ``ray_spread.placeable_nodes``)."""
    bundle = bundle_of(placement)
    asked = f"server '{name}' asks for {placement.replicas} replica(s) of {bundle}"
    group = placement_group([bundle] * placement.replicas, strategy=STRATEGY, name=f"polygym:{name}")
    try:
        await asyncio.wait_for(group.ready(), START_TIMEOUT_S)
    except TimeoutError:
        remove_placement_group(group)
        raise LaunchError(
            f"{asked}; the Ray cluster could not reserve them within {START_TIMEOUT_S:g}s "
            "(other work holds those resources?)"
        ) from None
    return group


def in_bundle(group: PlacementGroup, index: int) -> dict[str, Any]:
    """Actor options that run replica ``index`` in its own bundle of ``group``."""
    return {
        "scheduling_strategy": PlacementGroupSchedulingStrategy(
            group, placement_group_bundle_index=index, placement_group_capture_child_tasks=False
        )
    }


def release(groups: list[PlacementGroup]) -> None:
    for group in groups:
        remove_placement_group(group)
