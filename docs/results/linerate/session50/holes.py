"""Session 50: the link after the half-rate r5 (r6), from its move to r4 on, in each traced
first step: its requests (``a``) and chunks got (``g``), in ms after the move. A chunk got
with no request after it, then four requests at once, is the hole in its view of r4's
chunks (docs/results.md, session 50).

    python docs/results/linerate/session50/holes.py DIR   # a --trace DIR, or an unpacked tarball
"""

from __future__ import annotations

import glob
import json
import sys


def main(root: str) -> None:
    for d in sorted(glob.glob(f"{root}/**/round*", recursive=True)):
        if d.endswith("simulated"):
            continue
        files = glob.glob(f"{d}/r6-*.jsonl")
        if not files:
            continue
        with open(files[0]) as f:
            ev = [json.loads(line) for line in f]
        first = min(e["version"] for e in ev)
        ev = [e for e in ev if e["version"] == first]
        moves = [e for e in ev if e["ev"] == "upstream" and e["to"].endswith(".5:7100")]
        if not moves:
            continue
        t0 = moves[0]["t"]
        seq = [
            (round((e["t"] - t0) * 1000), e["ev"][0], e["chunk"])
            for e in ev
            if e["ev"] in ("ask", "got") and 0 <= e["t"] - t0 < 0.5
        ]
        print(d, "held", moves[0]["held"])
        print("   ", " ".join(f"{t}{k}{c}" for t, k, c in seq))


if __name__ == "__main__":
    main(sys.argv[1])
