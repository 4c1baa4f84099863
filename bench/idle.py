"""What an idle cluster costs: Hub processes that hold no transfer, only gossip and Raft.

Every engine and trainer that embeds a Hub pays this for as long as it runs, and at N=8 on
this host's two cores every percent of a core the nine processes of
``bench/linerate.py`` spend between transfers is one the transfer lacks. Per process, over
``--seconds`` once every member is alive everywhere: the cores it kept busy, and how often
it woke (context switches a second, from ``/proc``), each also as a ratio to the gossip
tick rate (one wakeup per tick is what a timer every tick costs by itself).

    python bench/idle.py --nodes 9 --voters 3 --seconds 20 --json out/idle.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine, print_table, process_cpu, write_json
from tensorhub.control.gossip_driver import TICK_SECONDS
from tensorhub.testing.hub_procs import HubProcs, Spec


def _usage(pid: int) -> tuple[float, int]:
    """(CPU seconds, context switches) of process ``pid`` so far."""
    switches = sum(
        int(line.split(":")[1])
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if "ctxt_switches" in line  # (voluntary and not)
    )
    return process_cpu(pid), switches


def measure(nodes: int, voters: int, seconds: float) -> dict[str, Any]:
    specs = [Spec(f"n{i}", f"dc0/rack0/n{i}", voter=i < voters) for i in range(nodes)]
    with tempfile.TemporaryDirectory(prefix="tensorhub-idle-") as tmp, HubProcs(specs, tmp) as c:
        settled = c.wait_members([s.name for s in specs])
        time.sleep(2.0)  # (the first syncs after everyone is alive)
        pids = {name: p.pid for name, p in c.procs.items()}
        before = {n: _usage(p) for n, p in pids.items()}
        t0 = time.monotonic()
        time.sleep(seconds)
        elapsed = time.monotonic() - t0
        after = {n: _usage(p) for n, p in pids.items()}
    ticks = 1 / TICK_SECONDS
    per = {}
    for s in specs:
        cores = (after[s.name][0] - before[s.name][0]) / elapsed
        wakeups = (after[s.name][1] - before[s.name][1]) / elapsed
        per[s.name] = {
            "voter": s.voter,
            "cores": round(cores, 5),
            "wakeups_per_s": round(wakeups, 1),
            "wakeups_per_gossip_tick": round(wakeups / ticks, 3),
        }
    return {
        "nodes": per,
        "cores_total": round(sum(p["cores"] for p in per.values()), 4),
        "seconds": round(elapsed, 2),
        "membership_wait_s": round(settled, 3),
        "gossip_ticks_per_s": ticks,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--nodes", type=int, default=9)
    ap.add_argument("--voters", type=int, default=3, help="how many of them are Raft voters")
    ap.add_argument("--seconds", type=float, default=20.0, help="how long to measure")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    if not 1 <= args.voters <= args.nodes:
        ap.error("--voters wants 1..--nodes")
    res = measure(args.nodes, args.voters, args.seconds)
    rows = [
        [
            name,
            "voter" if p["voter"] else "-",
            f"{p['cores']:.4f}",
            f"{p['wakeups_per_s']:.0f}",
            f"{p['wakeups_per_gossip_tick']:.2f}",
        ]
        for name, p in res["nodes"].items()
    ]
    print_table(
        f"{args.nodes} idle Hub processes over {res['seconds']} s: "
        f"{res['cores_total']:.3f} cores in all",
        ["node", "Raft", "cores", "wakeups / s", "wakeups / gossip tick"],
        rows,
    )
    write_json(args.json, {"bench": "idle", "machine": machine(), **vars(args), **res})


if __name__ == "__main__":
    main()
