"""Session 47's check of how much a slow link's delayed view of its upstream costs its lag
verdict (docs/results.md, session 47).

For each traced round of ``bench/linerate.py --case slow --trace DIR`` (N=8, the slow
link r5 relaying from r4), this applies the planner's lag rule as the node ran it then
(``core/swarm/planner.py``: a fall of ``LAG_FALL`` = 4 chunks below the least gap, r5
holding at least 4, then a look of ``RELAY_START_WAIT`` = 20 ticks (200 ms) in which r4
gains ``LAG_WATCH_CHUNKS`` = 5 chunks and the gap grows by ``lag // 4`` = 2) to the true
chunk counts, each node's own "got" times, and prints when it would have fired against
r5's own "lagging" event. Every time is in seconds after the round's first fetch began.
The reconstruction is approximate (ticks, when each look begins): on the simulator's rounds
(``round*-node-simulated``), where news is instant, it fires 7-29 ms after the verdict.

    tar xzf traces.tar.gz -C /tmp/t && python lag_oracle.py /tmp/t/*/round*-node
"""

from __future__ import annotations

import glob
import json
import statistics
import sys


def load(d: str) -> tuple[dict[str, list[float]], float]:
    got: dict[str, list[float]] = {}
    begun, verdict = [], None
    for f in glob.glob(f"{d}/*.jsonl"):
        with open(f) as lines:
            for line in lines:
                e = json.loads(line)
                if e["ev"] == "begin":
                    begun.append(e["t"])
                elif e["ev"] == "got":
                    got.setdefault(e["node"], []).append(e["t"])
                elif e["ev"] == "lagging" and e["node"] == "r5" and verdict is None:
                    verdict = e["t"]
    t0 = min(begun)
    assert verdict is not None, f"{d}: r5 never judged itself lagging"
    return {k: sorted(x - t0 for x in v) for k, v in got.items()}, verdict - t0


def oracle(r4: list[float], r5: list[float]) -> tuple[float, float]:
    """(when the fall reached 4, when the rule would have fired), on the true counts."""

    def held(ts: list[float], t: float) -> int:
        return sum(1 for x in ts if x <= t)

    least, began = None, None
    for ms in range(3000):
        t = ms / 1000
        gap = held(r4, t) - held(r5, t)
        if held(r5, t) >= 1:
            least = gap if least is None else min(least, gap)
        if began is None and least is not None and gap - least >= 4 and held(r5, t) >= 4:
            began = (t, gap, held(r4, t))
        looked = began is not None and t >= began[0] + 0.2 and held(r4, t) - began[2] >= 5
        if looked and gap - began[1] >= 2:
            return began[0], t
    raise ValueError("the rule never fired on these counts")


def main() -> None:
    late = []
    for d in sys.argv[1:]:
        got, verdict = load(d)
        fell, fired = oracle(got["r4"], got["r5"])
        late.append(verdict - fired)
        print(
            f"{d}: verdict {verdict:.3f} s; on true counts the fall reached 4 at {fell:.3f}, "
            f"the rule fired at {fired:.3f}: the verdict {1000 * (verdict - fired):.0f} ms later"
        )
    if late:
        print(
            f"median {1000 * statistics.median(late):.0f} ms [{1000 * min(late):.0f}-"
            f"{1000 * max(late):.0f}] over {len(late)} rounds"
        )


if __name__ == "__main__":
    main()
