"""A sans-IO Raft core in the etcd/raft style (tick / step / propose / ready / advance).

Only metadata goes through Raft: the version registry. Time is counted in ticks and
randomness comes from a generator the caller passes in, so a seed reproduces a run.
"""

from .core import ProposalDropped, RaftConfig, RaftCore, Ready, Role, SoftState
from .types import Entry, HardState, RaftMessage, ReadState, Snapshot

__all__ = [
    "Entry",
    "HardState",
    "ProposalDropped",
    "RaftConfig",
    "RaftCore",
    "RaftMessage",
    "ReadState",
    "Ready",
    "Role",
    "Snapshot",
    "SoftState",
]
