"""A check of :meth:`ChunkPlanner.next_due`, for tests and the simulator's ``check_due``.

A driver may skip the planner's calls before its next due tick (the node's fetch loop
wakes every tick; the memo answers those calls at once). That is safe only if a scan at
such a tick would ask for nothing and change nothing: this runs that scan on a copy, so
the planner under test keeps exactly the state a skipping driver leaves it in."""

from __future__ import annotations

import copy

from tensorhub.core.swarm import ChunkPlanner


class DueMissed(AssertionError):
    """A scan before the planner's next due tick would have asked for something, or
    changed the plan: some comparison with the clock was not noted (``_before``)."""


def check_quiet_until_due(planner: ChunkPlanner) -> bool:
    """If ``planner`` says nothing is due now (``next_due() > now``), scan a copy of it as
    a driver calling every tick would, and raise :class:`DueMissed` if that scan asks for
    anything or changes the plan. Returns whether a check ran."""
    if planner.next_due() <= planner.now:
        return False
    shadow = copy.deepcopy(planner)
    shadow._quiet = None  # scan, as if the memo did not exist
    effects = shadow._effects
    got = shadow.next_requests()
    if got or shadow._effects != effects:
        raise DueMissed(
            f"{planner.me} at tick {planner.now}: due at {planner.next_due()}, but a scan "
            f"asked for {got} (effects {shadow._effects - effects})"
        )
    return True
