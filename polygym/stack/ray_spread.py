"""Where resources-server replicas run on Ray: in turn over the nodes that could hold them.

Spreading is what makes replicas worth having on a cluster: one node's loss should take only part
of an environment with it. Ray's ``SPREAD`` strategy is best effort, and for actors that reserve
nothing (the default here, as HTTP servers mostly wait on the network) it often puts every replica
on one node (ray-project/ray#27577). Measured on Ray 2.60 with three nodes: an actor that
reserves nothing lands on a random node whatever its strategy says, soft node affinity included
(0 to 2 of 3 honoured), while one that reserves ``TOKEN_CPU`` goes where it is told (3 of 3, every
time). So a replica that reserves nothing reserves ``TOKEN_CPU`` (a thousand of them per CPU), and
is given a node: the next one, in a fixed order, whose total resources could hold it. The affinity
is soft, so a node that is gone, or cannot take the replica when it is restarted, sends it
elsewhere instead of leaving it queued forever.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from polygym.stack.backend import LaunchError
from polygym.stack.placement import Placement

TOKEN_CPU = 0.001
"""What a replica that reserves nothing reserves, so that Ray honours where it is placed."""


def schedulable(placement: Placement) -> Placement:
    """``placement``, reserving ``TOKEN_CPU`` when it reserves nothing at all."""
    if placement.num_cpus or placement.num_gpus or any(placement.resources.values()):
        return placement
    return replace(placement, num_cpus=TOKEN_CPU)


def bundle_of(placement: Placement) -> dict[str, float]:
    """What one replica reserves (Ray refuses zero amounts in a bundle)."""
    wanted = {"GPU": placement.num_gpus, "CPU": placement.num_cpus, **placement.resources}
    return {name: amount for name, amount in wanted.items() if amount > 0}


def fits(total: dict[str, float], bundle: dict[str, float]) -> bool:
    """Whether a node with resources ``total`` could ever hold ``bundle``."""
    return all(total.get(name, 0) >= amount for name, amount in bundle.items())


def alive_totals() -> dict[str, dict[str, float]]:
    """Each live node's total resources, by node id, in node-id order (the same on every call)."""
    nodes = sorted((node["NodeID"], node["Resources"]) for node in ray.nodes() if node["Alive"])
    return dict(nodes)


def placeable_nodes(what: str, placement: Placement) -> list[str]:
    """The live nodes that could hold one replica of ``what`` (``server 'NAME'``, a copy of the
    stack), in node-id order.

    None could: a LaunchError at once, naming the server and what the largest node has, instead
    of a replica that waits in Ray's queue until the start times out.
    """
    bundle = bundle_of(placement)
    totals = alive_totals()
    nodes = [node for node, total in totals.items() if fits(total, bundle)]
    if not nodes:
        best = {k: max((total.get(k, 0) for total in totals.values()), default=0) for k in bundle}
        most = ", ".join(f"{k} {v:g}" for k, v in best.items())
        raise LaunchError(
            f"{what} asks for {placement.replicas} replica(s) of {bundle}; "
            f"no node of the Ray cluster has that much (at most: {most})"
        )
    return nodes


class NodeTurns:
    """Hands out nodes in turn, across all the servers of one stack, so replicas spread evenly."""

    def __init__(self) -> None:
        self._turn = 0

    def strategy(self, nodes: list[str]) -> dict[str, Any]:
        """Actor options that place the next replica on its turn's node among ``nodes``."""
        node = nodes[self._turn % len(nodes)]
        self._turn += 1
        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node, soft=True)}
