"""A fetch's timeline, written as it happens when ``TENSORHUB_TRACE`` names a directory.

Why: the line-rate faults of issue #17 were found by reading, across every node of a run,
when each chunk came from whom, when a link moved to another upstream and when it judged
itself lagging (docs/results.md, sessions 30-37). Each time that took a throwaway patch of
log lines; this is the same record, kept, off unless asked for, so that a "traced" claim
in the docs is a command anyone can run again (``bench/linerate.py --trace DIR``, then
``python bench/trace_report.py DIR``).

One JSON object a line, one file per node and process (``<node>-<pid>.jsonl``), each with
``t`` (wall-clock seconds: every process of one host shares the clock), ``node``,
``model``, ``version`` and ``ev``, one of:

- ``begin``: the fetch starts (``chunks``, ``held`` already, ``addr``: the node's own,
  as others name it in ``src``);
- ``ask``: a chunk request goes out (``chunk``, ``src``, ``dup`` for an endgame copy);
- ``got``: a chunk verified (``chunk``, ``src``, ``s``: seconds since it was asked);
- ``failed``: a request ended without the chunk (``chunk``, ``src``, ``why``);
- ``upstream``: the relay link we take chunks from changed (``to``, ``held``), and
  ``passed``: why each link between it and us was passed over (``planner.Passed``), and
  ``before``: the links before us in the chain as we saw it, nearest first, and ``lost``:
  sources we lost (left, died, or gone from the holder view), with the tick; and what the
  chain was made of (``sources``, ``fetchers``, ``members``, ``laggards``:
  ``ChunkPlanner.chain_inputs``);
- ``lagging``: we judged ourselves behind the chain (``held``, ``up``; ``paced`` if by our
  pace, before the look ended: ``core/swarm/pace.py``), and ``refused``:
  how many queued replies our serving side then answered "busy"; ``told`` when the link
  after us found us a slow chain head instead (its ``Behind``);
- ``end``: the fetch ended (``held``, ``error`` if it failed).

The simulator writes the same events for the same case (``sim/swarm.py``
``Swarm.timeline``, ``sim/fanout.py`` ``predict_each(trace=)``; ``--trace`` puts its
timeline beside each measured one), so one reader shows both.

Writing is best effort: a trace that cannot be written (a full disk, a directory gone)
says so once in the log and stops; the fetch goes on.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from pathlib import Path
from typing import IO, Any

from ..core.naming import ShardKey, display_name

TRACE_ENV = "TENSORHUB_TRACE"
"""The directory to write fetch timelines into (unset or empty: none are written)."""

log = logging.getLogger(__name__)


def file_safe(name: str) -> str:
    """``name`` as a file name: anything but letters, digits and ``-_.=`` becomes ``_``."""
    return "".join(ch if ch.isalnum() or ch in "-_.=" else "_" for ch in name)


class FetchTrace:
    """One fetch's events, appended to its node's file (see the module's docstring)."""

    def __init__(self, out: IO[str], node: str, key: ShardKey, version: int) -> None:
        self._out: IO[str] | None = out
        self._base = {"node": node, "model": display_name(key), "version": version}

    @classmethod
    def open(cls, node: str, key: ShardKey, version: int) -> FetchTrace | None:
        """A trace for this fetch when ``TENSORHUB_TRACE`` is set, else None."""
        where = os.environ.get(TRACE_ENV)
        if not where:
            return None
        path = Path(where) / f"{file_safe(node)}-{os.getpid()}.jsonl"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            out = path.open("a", encoding="utf-8", buffering=1)  # (a line at a time)
        except OSError as e:
            log.warning("%s=%s: no fetch trace (%s)", TRACE_ENV, where, e)
            return None
        return cls(out, node, key, version)

    def event(self, ev: str, **fields: Any) -> None:
        """Append one event (``fields`` must be JSON: ints, strings, bools, None)."""
        if self._out is None:
            return
        line = json.dumps({"t": round(time.time(), 6), **self._base, "ev": ev, **fields})
        try:
            self._out.write(line + "\n")
        except OSError as e:  # (a full disk: the fetch matters more than its trace)
            log.warning("fetch trace stopped: %s", e)
            self.close()

    def close(self) -> None:
        out, self._out = self._out, None
        if out is not None:
            with contextlib.suppress(OSError):  # (what was lost is lost; the fetch goes on)
                out.close()
