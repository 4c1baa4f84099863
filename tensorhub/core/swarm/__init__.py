"""The swarm's scheduling logic: which chunk to ask of which holder, and when."""

from .planner import ChunkPlanner, PlannerConfig, Request, SourceInfo, wan_owner

__all__ = ["ChunkPlanner", "PlannerConfig", "Request", "SourceInfo", "wan_owner"]
