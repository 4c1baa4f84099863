"""The multi-datacenter rollout launcher: run a topology of trainer and rollout processes on
this machine, with an emulated WAN, live progress, HTTP status pages, chaos and a report."""

from .launcher import LaunchFailed, launch, summary
from .topology import Chaos, NodeSpec, Topology, TopologyError, WanLink, default, from_dict, load

__all__ = [
    "Chaos",
    "LaunchFailed",
    "NodeSpec",
    "Topology",
    "TopologyError",
    "WanLink",
    "default",
    "from_dict",
    "launch",
    "load",
    "summary",
]
