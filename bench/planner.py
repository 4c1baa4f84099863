"""Planner cost per chunk against the cost of moving that chunk, same run.

The planner runs once per completed chunk, so its time per call must stay far below the
time the chunk itself takes to move, however many chunks a version has. The baseline here
is a memcpy of one chunk on this machine (a lower bound for any transfer of it); the figure
is planner time per completed chunk / memcpy time per chunk, for versions of 1,000 to
35,000 chunks (4 GB to 140 GB at 4 MiB) and 8 sources.

The source-update path is timed too, since the holder view feeds it all along a fetch: a
full holder announced (and a second one), and a swarm's worth of updates per chunk (4
fetchers announcing each chunk as they get it, then becoming full holders), per chunk;
and a link's first ``Have`` to a new asker, which lists every chunk it holds
(``PeerHandler._tell_held``): half the version, gossip having told the asker of all but
the last 5 of them (``FetchSession.add_chunks``).

    python bench/planner.py --json out/planner.json
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from bench.common import machine, median, print_table, write_json
from tensorhub.core.layout import DEFAULT_CHUNK_SIZE
from tensorhub.core.swarm import ChunkPlanner, PlannerConfig


def memcpy_seconds(nbytes: int, reps: int = 50) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8).fill_(1)
    dst = torch.empty_like(src)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t)
    return median(times)


def planner_seconds_per_chunk(chunks: int, sources: int = 8, budget_s: float = 2.0) -> float:
    """Run a fetch's request/complete cycle; the planner's time per completed chunk."""
    p = ChunkPlanner("me", chunks, random.Random(0), PlannerConfig())
    for i in range(sources):
        p.set_source(f"s{i}", 1 + i % 3, range(chunks))
    pending = p.next_requests()
    n, t0 = 0, time.perf_counter()
    while pending and time.perf_counter() - t0 < budget_s:
        r = pending.pop(0)
        p.received(r.chunk, r.source)
        pending += p.next_requests()
        n += 1
    return (time.perf_counter() - t0) / max(n, 1)


def full_holder_seconds(chunks: int, reps: int = 5) -> float:
    """Announcing one full holder (the holder view's common case), median of ``reps``."""
    times = []
    for _ in range(reps):
        p = ChunkPlanner("me", chunks, random.Random(0), PlannerConfig())
        p.set_source("origin", 3, None, origin=True)
        t = time.perf_counter()
        p.set_source("full", 1, None)
        times.append(time.perf_counter() - t)
    return median(times)


def first_have_seconds(chunks: int, reps: int = 5) -> float:
    """A new upstream's first Have of half the version, of which gossip told us all but the
    last 5 chunks, median of ``reps``."""
    held = list(range(chunks // 2))
    times = []
    for _ in range(reps):
        p = ChunkPlanner("me", chunks, random.Random(0), PlannerConfig(relay=True))
        p.set_source("up", 1, held[:-5])
        t = time.perf_counter()
        p.add_chunks("up", held)
        times.append(time.perf_counter() - t)
    return median(times)


def source_updates_seconds_per_chunk(chunks: int, peers: int = 4) -> float:
    """A fetch's worth of holder-view news, per chunk: ``peers`` fetchers each announce
    every chunk as they get it (add_chunk) and then complete (set_source(None))."""
    p = ChunkPlanner("me", chunks, random.Random(0), PlannerConfig())
    p.set_source("origin", 3, None, origin=True)
    for i in range(peers):
        p.set_source(f"f{i}", 1, ())
    order = list(range(chunks))
    random.Random(1).shuffle(order)
    t = time.perf_counter()
    for c in order:
        for i in range(peers):
            p.add_chunk(f"f{i}", c)
    for i in range(peers):
        p.set_source(f"f{i}", 1, None)
    return (time.perf_counter() - t) / chunks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    copy = memcpy_seconds(DEFAULT_CHUNK_SIZE)
    rows, results = [], []
    for chunks in (1_000, 10_000, 35_000):
        per = planner_seconds_per_chunk(chunks)
        full = full_holder_seconds(chunks)
        updates = source_updates_seconds_per_chunk(chunks)
        have = first_have_seconds(chunks)
        rows.append(
            [
                chunks,
                per * 1e6,
                updates * 1e6,
                copy * 1e6,
                (per + updates) / copy,
                full * 1e3,
                have * 1e3,
            ]
        )
        results.append(
            {
                "chunks": chunks,
                "planner_s_per_chunk": per,
                "source_updates_s_per_chunk": updates,
                "ratio_to_memcpy": (per + updates) / copy,
                "full_holder_announce_s": full,
                "first_have_of_half_s": have,
            }
        )
    print_table(
        "planner cost per completed 4 MiB chunk vs a memcpy of it",
        [
            "chunks",
            "planner µs",
            "source updates µs",
            "memcpy µs",
            "(planner + updates) / memcpy",
            "full holder announced, ms",
            "a new upstream's first Have (half held), ms",
        ],
        rows,
    )
    write_json(
        args.json,
        {"bench": "planner", "memcpy_s_per_chunk": copy, "results": results, "machine": machine()},
    )


if __name__ == "__main__":
    main()
