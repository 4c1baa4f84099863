"""The pace verdict (tensorhub/core/swarm/pace.py) applied to traced rounds, before it was
built: for each link, when ``PaceWatch.slow()`` would first hold over its arrivals from
its upstream (the traces' true times and counts) behind the same fall that begins the
planner's look (``LAG_FALL`` over the upstream's last ``LAG_WINDOW`` chunks, at least
``LAG_CHUNKS // 2`` held, ``RELAY_START_WAIT`` after moving to that upstream), beside
the lag verdict the round had. Approximate as session 47's lag_oracle.py is: it reads
the rule at each arrival, not each tick, and each node's news as it happened, not as
the node heard it.

    mkdir -p /tmp/t && tar xzf docs/results/linerate/session47/traces.tar.gz -C /tmp/t
    python docs/results/linerate/session48/pace_oracle.py '/tmp/t/*/round*-node'

Each line: the round, then each link the rule would judge: ``pace (seconds, upstream,
chunks held)`` and ``verdict [seconds]`` (the round's own; empty: none)."""

from __future__ import annotations

import glob
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))

from tensorhub.core.swarm.pace import PaceWatch
from tensorhub.core.swarm.planner import LAG_CHUNKS, LAG_FALL, LAG_WINDOW

TICK = 0.01
SETTLE = 0.2  # RELAY_START_WAIT ticks


def rounds(pattern: str):  # type: ignore[no-untyped-def]
    for rd in sorted(glob.glob(pattern)):
        files = glob.glob(rd + "/r*.jsonl")
        if not files:
            continue
        ev, addr = {}, {}
        for f in files:
            with open(f) as fh:
                lines = [json.loads(x) for x in fh]
            lines = [e for e in lines if e.get("version") == lines[0].get("version")]
            ev[lines[0]["node"]] = lines
            addr[lines[0].get("addr")] = lines[0]["node"]
        yield rd, ev, addr


def main(patterns: list[str]) -> None:
    for pattern in patterns:
        for rd, ev, addr in rounds(pattern):
            t0 = min(e[0]["t"] for e in ev.values())
            gots = {
                n: [(e["t"] - t0, addr.get(e["src"], "P")) for e in lines if e["ev"] == "got"]
                for n, lines in ev.items()
            }
            out = []
            for n in sorted(ev):
                watch, up, first, window, since = PaceWatch(), None, None, [], 0.0
                verdicts = [round(e["t"] - t0, 3) for e in ev[n] if e["ev"] == "lagging"]
                for t, s in gots[n]:
                    if s != up:
                        watch.moved()
                        up, window, since = s, [], t
                    if s == "P" or s not in gots:
                        continue
                    theirs = sum(1 for tt, _ in gots[s] if tt <= t)
                    watch.arrived(int(t / TICK), theirs)
                    ours = sum(1 for tt, _ in gots[n] if tt <= t)
                    gap = theirs - ours
                    window.append((theirs, gap))
                    window = [w for w in window if w[0] > theirs - LAG_WINDOW] or window[-1:]
                    fall = gap - min(g for _, g in window)
                    if fall < LAG_FALL or ours < LAG_CHUNKS // 2 or t - since < SETTLE:
                        continue
                    if first is None and watch.slow():
                        first = (round(t, 3), s, ours)
                if first or verdicts:
                    out.append(f"{n}: pace {first} verdict {verdicts}")
            print(Path(rd).parent.name, Path(rd).name, "; ".join(out) or "-")


if __name__ == "__main__":
    main(sys.argv[1:])
