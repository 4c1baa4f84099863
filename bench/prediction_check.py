"""#18's check over every round on record: the simulator's prediction of the namespace
fan-out (``bench/linerate.py``) against what was measured, pooled over runs.

One run of ``bench/linerate.py`` holds two to four rounds, and the node preset's last
receiver moves from 1.37x to 1.80x one copy between rounds on this host (which receiver
asked whom first); a median of three rounds against the simulator's median then swings
by +-11 % from run to run (docs/results.md, session 20). Pooled, the check compares
distributions: every round given, each predicted again *by the simulator as it is now*
from the starts that round measured, grouped by case, size and preset.

    python bench/prediction_check.py docs/results/linerate/n8-256MiB-1g-rounds3-session20.json \
        'docs/results/linerate/n8-256MiB-1g-slow-rounds2-session20.json:node' ... --json out.json

A ``FILE:preset,preset`` takes only those presets from the file (``swarm``, ``relay``,
``node``; in a file written before session 23 the plain row is ``swarm``, the node's
settings then): a run measured before a change to one preset's data plane is no
measurement of it now.
Only rounds that recorded their starts (``bench/linerate.py`` since session 19) count.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine, parse_size, print_table, write_json
from bench.linerate import Case, _predicted

WITHIN = 0.10
"""#18's acceptance: the prediction within 10 % of the measurement."""


@dataclass
class Pool:
    """One (case, size, preset): the rounds measured and their predictions."""

    measured: list[float]
    simulated: list[float]
    files: list[str]


def _preset(label: str, run: dict[str, Any]) -> str:
    """The preset a row ran. A run written before session 23 names none: its plain row
    ran the node's settings of then, the swarm (``node`` has been the relay since)."""
    if "presets" in run:
        name: str = run["presets"][label]
        return name
    return "swarm" if label == "tensorhub" else label.split("(")[1].rstrip(")")


def _case(d: dict[str, Any], one: float) -> Case | None:
    if d["case"] == "healthy":
        return None
    return Case(d["case"], d["victim"] or 0, kill_after=one / 2)


def collect(specs: list[str], chunk: int) -> dict[tuple[str, int, str], Pool]:
    pools: dict[tuple[str, int, str], Pool] = {}
    for spec in specs:
        path, _, only = spec.partition(":")
        keep = set(only.split(",")) if only else None
        d = json.loads(Path(path).read_text())
        args = argparse.Namespace(rate=d["rate_mbit"])
        slow = {d["victim"]: d["rate_mbit"] / 2} if d["case"] == "slow" else {}
        p2p = d["p2p"].get("rounds") or []
        for label in (k for k in d if k.startswith("tensorhub")):
            name = _preset(label, d)
            if keep is not None and name not in keep:
                continue
            for i, r in enumerate(d[label].get("rounds", [])):
                if "starts" not in r or r.get("last_over_one_copy") is None:
                    continue
                one = p2p[i]["seconds"] if i < len(p2p) else d["p2p"]["seconds"]
                sim = _predicted(
                    args, d["receivers"], d["model_bytes"], chunk, name, slow,
                    _case(d, one), r["starts"], d.get("steps", 1),
                )  # fmt: skip
                pool = pools.setdefault((d["case"], d["model_bytes"], name), Pool([], [], []))
                pool.measured.append(r["last_over_one_copy"])
                pool.simulated.extend(sim["simulated_over_one_copy"])
                if path not in pool.files:
                    pool.files.append(path)
    return pools


def _quartiles(xs: list[float]) -> list[float]:
    return statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="bench/linerate.py JSON (FILE or FILE:preset,...)")
    ap.add_argument("--chunk", default="4MiB", help="the runs' tensorhub chunk size")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    pools = collect(args.files, parse_size(args.chunk))
    rows, out = [], []
    for (case, size, name), p in sorted(pools.items()):
        m, s = _quartiles(p.measured), _quartiles(p.simulated)
        error = s[1] / m[1] - 1
        rows.append([
            case, f"{size >> 20} MiB", name, len(p.measured),
            f"{m[1]:.3f} [{m[0]:.2f}-{m[2]:.2f}]", f"{s[1]:.3f} [{s[0]:.2f}-{s[2]:.2f}]",
            f"{100 * error:+.1f} %", "yes" if abs(error) <= WITHIN else "NO",
        ])  # fmt: skip
        out.append({
            "case": case, "model_bytes": size, "preset": name, "rounds": len(p.measured),
            "measured": p.measured, "simulated": p.simulated,
            "measured_quartiles": m, "simulated_quartiles": s,
            "simulator_error": error, "within_10_percent": abs(error) <= WITHIN,
            "files": p.files,
        })  # fmt: skip
    print_table(
        "#18's check, pooled: the last healthy receiver over one copy, measured in network "
        "namespaces and predicted from each round's starts (median [IQR])",
        ["case", "size", "preset", "rounds", "measured", "simulated", "error", "within 10 %"],
        rows,
    )
    write_json(args.json, {"bench": "prediction_check", "machine": machine(), "pools": out})


if __name__ == "__main__":
    main()
