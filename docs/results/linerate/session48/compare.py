"""Session 48's paired table: each round's last healthy receiver over one copy, with the
pace verdict on and off (``PlannerConfig.pace_verdict``), from bench/linerate.py JSON run
with ``--presets`` holding both settings.

    python docs/results/linerate/session48/compare.py docs/results/linerate/session48/s8-*.json \
        docs/results/linerate/session48/fin-*.json

Which row is which is read from each file's ``presets`` (the first batch ran the default,
then off, against ``node:planner.pace_verdict=true``; the batch at the final commit ran
the default, then on, against ``node:planner.pace_verdict=false``)."""

from __future__ import annotations

import json
import statistics
import sys


def setting(preset: str) -> str:
    if preset.endswith("pace_verdict=true"):
        return "on"
    if preset.endswith("pace_verdict=false"):
        return "off"
    return "default"


def main(paths: list[str]) -> None:
    rounds: dict[str, list[float]] = {"on": [], "off": []}
    for path in paths:
        with open(path) as f:
            run = json.load(f)
        kinds = {label: setting(name) for label, name in run["presets"].items()}
        # (the default is whichever of on and off the run does not name)
        named = set(kinds.values()) - {"default"}
        other = "off" if named == {"on"} else "on"
        for label, kind in kinds.items():
            rounds[other if kind == "default" else kind] += run[label]["last_over_one_copy_rounds"]
    on, off = rounds["on"], rounds["off"]
    print("setting  rounds  median  [least-most]  over 1.2x")
    for name, v in (("on", on), ("off", off)):
        over = sum(x > 1.2 for x in v)
        print(
            f"{name:8} {len(v):6}  {statistics.median(v):.3f}  [{min(v):.3f}-{max(v):.3f}]  {over}"
        )
    lower = sum(a < b for a, b in zip(on, off, strict=True))
    diff = statistics.median(b - a for a, b in zip(on, off, strict=True))
    print(f"pairs (same round): on lower in {lower} of {len(on)}, median difference {diff:.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
