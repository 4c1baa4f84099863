"""Session 49's paired tables: each round's last healthy receiver over one copy with one
data-plane setting on and off, from bench/linerate.py JSON run with ``--presets``
holding both (``node`` and ``node:SETTING=false``, say), so both ran in every round.

    python docs/results/linerate/session49/compare.py park_starting on FILES...

``on``/``off``: what the plain ``node`` preset runs. A ``--steps`` run's rounds are
reported per step (step 1 is the job's first step, the last one is what the lag memory
learnt in the steps before)."""

from __future__ import annotations

import json
import statistics
import sys


def kind(preset: str, setting: str, default: str) -> str:
    if preset.endswith(f"{setting}=true"):
        return "on"
    if preset.endswith(f"{setting}=false"):
        return "off"
    return default


def main(setting: str, default: str, paths: list[str]) -> None:
    steps: dict[int, dict[str, list[float]]] = {}
    for path in paths:
        with open(path) as f:
            run = json.load(f)
        for label, name in run["presets"].items():
            k = kind(name, setting, default)
            for r in run[label]["rounds"]:
                for step, x in enumerate(r.get("steps_over_one_copy") or [r["last_over_one_copy"]]):
                    steps.setdefault(step + 1, {"on": [], "off": []})[k].append(x)
    for step, rounds in sorted(steps.items()):
        on, off = rounds["on"], rounds["off"]
        print(f"step {step}: setting  rounds  median  [least-most]  over 1.2x")
        for name, v in (("on", on), ("off", off)):
            if v:
                over = sum(x > 1.2 for x in v)
                print(
                    f"         {name:8} {len(v):6}  {statistics.median(v):.3f}  "
                    f"[{min(v):.3f}-{max(v):.3f}]  {over}"
                )
        if len(on) == len(off) and on:
            lower = sum(a < b for a, b in zip(on, off, strict=True))
            diff = statistics.median(b - a for a, b in zip(on, off, strict=True))
            print(f"         pairs: on lower in {lower} of {len(on)}, median difference {diff:.3f}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
