"""How large a simulation runs in how long (issue #18's scale targets).

Each row is one run of the standalone workload (``sim/scenarios/standalone.yaml``)
scaled by a factor: 32 trainer hosts, 96 rollout hosts and 16 racks of 8 hosts per
factor, 8 GPUs a host (factor 1 is the paper's 1,024 GPUs; 4 is 4,096; 10 is 10,240).
"all baselines" runs what ``python -m sim run`` runs (TensorHub, staged TensorHub, NCCL,
UCX, storage and the strong baselines); "TensorHub only" its control plane and swarm
alone. Every figure is wall seconds on this machine against the target #18 sets, and
TensorHub's simulated events per wall second (the baselines' events are not counted);
each run is a fresh process, one after the other. ``--dataplane`` picks TensorHub's data
plane (``tcp``, the default as built: 7x longer transfers, so 8x more flows at once and
13x larger groups of flows to re-solve per change; ``gpudirect``, the hypothetical).

    python bench/sim_scale.py                      # 1,024 all; 4,096 TensorHub; 10,240 TensorHub
    python bench/sim_scale.py --runs 1:all,4:all   # the 4,096-GPU run with every baseline
    python bench/sim_scale.py --dataplane gpudirect
    python bench/sim_scale.py --native             # compiled with mypyc (sim/native.py)

``--native`` runs the network, event loop and planner compiled by mypyc from the same
source. Before timing anything it runs a small standalone and cross-DC scenario both
ways and stops unless their trace hashes are equal: a compiled figure is a figure of
the same simulation.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine, print_table, write_json
from sim.native import ENV, MODULES, NativeError, build, same_runs

ROOT = Path(__file__).resolve().parent.parent

TARGET_S = {(1, "all"): 30.0, (4, "all"): 120.0, (4, "th"): 120.0, (10, "th"): 60.0}
"""#18's acceptance: 1,024 GPUs with all baselines <= 30 s, 4,096 <= 120 s, 10,000 nodes
TensorHub only <= 60 s (a 4,096-GPU TensorHub-only run is held to the 4,096 target)."""

_CHILD = """
import json, sys, time
from sim.scenario import load
from sim import workloads
k, what, plane = int(sys.argv[1]), sys.argv[2], sys.argv[3]
sc = load("sim/scenarios/standalone.yaml").replace(
    trainer_hosts=32 * k, rollout_hosts=96 * k, dataplane=plane,
    **{"topology.racks_per_dc": 16 * k})
t = time.perf_counter()
if what == "th":
    out = workloads.standalone_swarm_only(sc)
else:
    o = workloads.run(sc)
    out = {"events": o.events, "mean_over_bound": o.over_lb_mean,
           "worst_over_bound": o.over_lb_worst}
out["wall_s"] = time.perf_counter() - t
print(json.dumps(out))
"""


def _env(native: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    return {**env, ENV: "1"} if native else env


def run_one(
    factor: int, what: str, plane: str, timeout: float, native: bool = False
) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        p = subprocess.run(
            [sys.executable, "-c", _CHILD, str(factor), what, plane],
            cwd=ROOT, env=_env(native), capture_output=True, text=True, timeout=timeout,
            check=True,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"wall_s": None, "timed_out_after_s": timeout}
    out: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    out["process_s"] = time.perf_counter() - t0
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="1:all,4:th,10:th", help="FACTOR:all|th, comma-separated")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds a run may take")
    ap.add_argument("--dataplane", choices=("tcp", "gpudirect"), default="tcp")
    ap.add_argument("--native", action="store_true", help="compiled with mypyc (sim/native.py)")
    ap.add_argument("--json")
    a = ap.parse_args()
    rows, results = [], []
    checked = None
    if a.native:
        build(MODULES)  # (once, before any timing: about 100 s)
        try:
            checked = same_runs(MODULES)
        except NativeError as e:
            sys.exit(str(e))
        print(f"compiled and source runs give the same trace hashes: {checked}")
    for item in a.runs.split(","):
        k, what = item.split(":")
        factor = int(k)
        r = run_one(factor, what, a.dataplane, a.timeout, a.native)
        target = TARGET_S.get((factor, what))
        r.update(factor=factor, gpus=1024 * factor, what=what, target_s=target,
                 dataplane=a.dataplane, native=a.native)  # fmt: skip
        results.append(r)
        wall = r["wall_s"]
        rows.append([
            f"{1024 * factor:,}", "all baselines" if what == "all" else "TensorHub only",
            f"{wall:.1f}" if wall is not None else f"> {a.timeout:.0f}",
            f"{target:.0f}" if target else "-",
            f"{wall / target:.2f}" if wall is not None and target else "-",
            f"{r['events'] / wall:,.0f}" if wall else "-",
            f"{r['mean_over_bound']:.2f} / {r['worst_over_bound']:.2f}" if wall else "-",
        ])  # fmt: skip
    print_table(
        f"simulator scale (standalone workload, {a.dataplane} data plane"
        + (", compiled)" if a.native else ")"),
        ["GPUs", "runs", "wall s", "target s", "wall / target", "TH events / s", "TH mean / worst"],
        rows,
    )
    write_json(a.json, {"machine": machine(), "native_same_hashes": checked, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
