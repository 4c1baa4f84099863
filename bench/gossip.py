"""Gossip convergence and failure detection in the core-level simulation.

For each cluster size and loss rate, over several seeds: the rounds until a new holder
entry reaches every node (p50, p99), the rounds until every live node marks a crashed node
dead (p99), and how many live nodes were ever declared dead (false positives). The bound for
convergence is the issue's (15 rounds at N = 1,000 without loss, 20 with 10 % loss); each
figure is also given as a ratio to log2(N), the lower bound of any single-source epidemic.

    python bench/gossip.py --json out/gossip.json            # N = 100, 1,000, 10,000
    python bench/gossip.py --sizes 100,1000 --seeds 5
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine, print_table, write_json
from tensorhub.core.gossip import Status
from tensorhub.core.gossip.holders import Holding, encode_holding, hold_key
from tensorhub.testing.gossip_cluster import GossipCluster

HOLD = encode_holding(Holding.of(b"\1" * 64))


def p99(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, math.ceil(0.99 * len(xs)) - 1)]


def one_run(n: int, loss: float, seed: int, detect: bool) -> dict[str, float]:
    c = GossipCluster(n, seed, loss=loss)
    c.run_rounds(2)
    owner = c.names[n // 2]
    key = hold_key("policy", 1)
    c.write(owner, key, HOLD)
    start = c.ticks
    while not all(nm == owner or c.knows(nm, owner, key) == HOLD for nm in c.names):
        c.tick()
    converge = (c.ticks - start) / c.cfg.round_ticks
    out = {"converge": converge, "detect": float("nan"), "false_dead": 0.0}
    if detect:
        victim = c.names[1]
        c.crash(victim)
        start = c.ticks
        while not all(c.status(o, victim) in (Status.DEAD, None) for o in c.live()):
            c.tick()
        out["detect"] = (c.ticks - start) / c.cfg.round_ticks
    out["false_dead"] = float(
        sum(
            1
            for nm in c.live()
            for e in c.nodes[nm].events
            if e[2] is Status.DEAD and e[1] in c.live()
        )
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sizes", default="100,1000,10000")
    ap.add_argument("--losses", default="0,0.1")
    ap.add_argument("--seeds", type=int, default=5, help="seeds per point (10,000: 1 seed)")
    ap.add_argument(
        "--max-lossy-n",
        type=int,
        default=1000,
        help="skip lossy points above this size (their suspicion churn is slow "
        "to simulate in Python)",
    )
    ap.add_argument("--json")
    a = ap.parse_args()
    rows: list[dict[str, Any]] = []
    for n in (int(x) for x in a.sizes.split(",")):
        for loss in (float(x) for x in a.losses.split(",")):
            if loss and n > a.max_lossy_n:
                continue
            seeds = 1 if n >= 10000 else a.seeds
            detect = True
            t0 = time.perf_counter()
            runs = [one_run(n, loss, s, detect) for s in range(seeds)]
            conv = [r["converge"] for r in runs]
            det = [r["detect"] for r in runs if not math.isnan(r["detect"])]
            row = {
                "n": n,
                "loss": loss,
                "seeds": seeds,
                "rounds_p50": statistics.median(conv),
                "rounds_p99": p99(conv),
                "rounds_over_log2n": p99(conv) / math.log2(n),
                "detect_rounds_p99": p99(det) if det else None,
                "false_dead": int(sum(r["false_dead"] for r in runs)),
                "sim_seconds": time.perf_counter() - t0,
            }
            rows.append(row)
            print(f"n={n} loss={loss}: {row}", flush=True)
    print_table(
        "gossip: rounds for a new holder entry to reach every node; detection of a crash",
        ["n", "loss", "seeds", "p50", "p99", "p99/log2(n)", "detect p99", "false dead", "sim s"],
        [
            [
                r["n"],
                r["loss"],
                r["seeds"],
                r["rounds_p50"],
                r["rounds_p99"],
                r["rounds_over_log2n"],
                r["detect_rounds_p99"] if r["detect_rounds_p99"] else "-",
                r["false_dead"],
                r["sim_seconds"],
            ]
            for r in rows
        ],
    )
    write_json(a.json, {"bench": "gossip", "rows": rows, "machine": machine()})


if __name__ == "__main__":
    main()
