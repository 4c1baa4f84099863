"""The swarm's scheduling logic: which chunk to ask of which holder, and when; and the
serving side's: upload slots and super-seeding."""

from .planner import (
    ChunkPlanner,
    DcView,
    Failure,
    PlannerConfig,
    Request,
    SourceInfo,
    wan_owner,
)
from .seeding import SeedDecision, SuperSeeder, holder_seeder
from .slots import UploadSlots

__all__ = [
    "ChunkPlanner",
    "DcView",
    "Failure",
    "PlannerConfig",
    "Request",
    "SeedDecision",
    "SourceInfo",
    "SuperSeeder",
    "holder_seeder",
    "UploadSlots",
    "wan_owner",
]
