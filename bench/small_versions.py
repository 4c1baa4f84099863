"""Small versions at a fast cadence: LoRA-adapter-sized versions published every interval,
the last few retained, fetched by every rollout (issue #21: does the control plane keep up?).

Every node is a Hub process on loopback: a publisher and ``--rollouts`` rollouts in two
datacenters (the publisher and two rollouts are the Raft voters). Each step the publisher
publishes version v (``--size`` bytes, committed through Raft), retains it and releases
v - keep (``--keep``: max_staleness + 1, as TRL keeps), and stops serving v - keep; every
rollout fetches v into fresh buffers and drops its copy of v - keep. Measured in the same
run, each as a ratio to a bound or baseline:

- **commit**: publish → committed, against the interval between versions (a control plane
  that keeps up commits well inside it);
- **fetch**: commit → the last rollout verified, against one point-to-point copy of the
  same bytes from the publisher (measured first, same processes);
- **churn**: gossip keys, holder-view entries and replicas, the most on any node, every 5
  versions (they must level off, not grow with versions);
- **CPU**: the CPU seconds each process spent per version.

    python bench/small_versions.py --rollouts 12 --size 4MiB --interval 1 --versions 40
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine, parse_size, print_table, process_cpu, write_json
from tensorhub.testing.hub_procs import HubProcs, Spec

MODEL = "lora"


def _specs(rollouts: int) -> list[Spec]:
    specs = [Spec("publisher", "dc0/rack0/publisher", voter=True)]
    for i in range(rollouts):
        dc = i % 2
        specs.append(Spec(f"r{i}", f"dc{dc}/rack{i % 4}/r{i}", voter=i < 2))
    return specs


KEYS = ("gossip_keys", "holder_versions", "replicas")


def state(snap: dict[str, Any], key: str) -> int:
    """The most of ``key`` on any node, from each node's "control" answer."""
    return max(int(s[0][key]) for s in snap.values())


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rollouts", type=int, default=12)
    ap.add_argument("--size", default="4MiB", help="bytes per version (a LoRA adapter)")
    ap.add_argument("--chunk", default="1MiB")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between versions")
    ap.add_argument("--versions", type=int, default=40)
    ap.add_argument("--keep", type=int, default=3, help="versions retained (max_staleness + 1)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    size, chunk = parse_size(args.size), parse_size(args.chunk)
    with (
        tempfile.TemporaryDirectory(prefix="tensorhub-small-") as tmp,
        HubProcs(_specs(args.rollouts), tmp) as c,
    ):
        rollouts = [n for n in c.addr if n != "publisher"]
        c.call(["publisher"], "serve", "p2p", 1, size, 0)
        copies = [c.fetch_all([rollouts[0]], "p2p", 1, c.addr["publisher"])[0] for _ in range(5)]
        one_copy = statistics.median(copies)
        cpu0 = {n: process_cpu(c.procs[n].pid) for n in c.addr}
        commit, manifest, fetch, late = [], [], [], 0
        each: list[list[float]] = []
        series: list[dict[str, int]] = []
        t_start = time.monotonic()
        for v in range(1, args.versions + 1):
            t0 = time.monotonic()
            c.call(["publisher"], "publish", MODEL, v, size, v, chunk)
            t_commit = time.monotonic()
            commit.append(t_commit - t0)
            c.call(["publisher"], "retain", MODEL, v)
            c.call(rollouts, "prepare", MODEL, v, None)  # the manifest: needs a holder known
            manifest.append(time.monotonic() - t_commit)
            c.call(rollouts, "fetch", MODEL, v, None)
            ends = c.call(rollouts, "result", MODEL, v, tag="done")
            fetch.append(max(e[1] for e in ends) - t_commit)
            each.append([e[1] - e[0] for e in ends])  # each rollout's Hub.fetch alone
            old = v - args.keep
            if old >= 1:
                c.call(["publisher"], "release", MODEL, old)
                c.call(["publisher"], "unpublish", MODEL, old, False)
                c.call(rollouts, "drop", MODEL, old)
            if v % 5 == 0:  # the state's size over the run: it must level off, not grow
                snap = dict(zip(c.addr, c.call(list(c.addr), "control"), strict=True))
                series.append({"version": v, **{k: state(snap, k) for k in KEYS}})
            spare = t0 + args.interval - time.monotonic()
            if spare > 0:
                time.sleep(spare)
            else:
                late += 1
        wall = time.monotonic() - t_start
        cpu = {n: (process_cpu(c.procs[n].pid) - cpu0[n]) / args.versions for n in c.addr}

    res: dict[str, Any] = {
        "bench": "small_versions",
        "rollouts": args.rollouts,
        "bytes": size,
        "chunk_bytes": chunk,
        "interval_s": args.interval,
        "versions": args.versions,
        "keep": args.keep,
        "one_copy_s": one_copy,
        "one_copy_runs_s": copies,
        "commit_s": commit,
        "manifest_after_commit_s": manifest,
        "fetch_after_commit_s": fetch,
        "fetch_each_s": each,
        "versions_late": late,
        "achieved_interval_s": wall / args.versions,
        "state_by_version": series,
        "cpu_s_per_version": cpu,
        "machine": machine(),
    }
    rows = [
        [
            "commit (publish → committed)",
            f"{statistics.median(commit) * 1e3:.0f}",
            f"{_pct(commit, 0.99) * 1e3:.0f}",
            f"{statistics.median(commit) / args.interval:.3f}",
            "of the interval",
        ],
        [
            "every rollout has the manifest, after commit",
            f"{statistics.median(manifest) * 1e3:.0f}",
            f"{_pct(manifest, 0.99) * 1e3:.0f}",
            f"{statistics.median(manifest) / one_copy:.2f}",
            "of one copy",
        ],
        [
            "last rollout verified, after commit",
            f"{statistics.median(fetch) * 1e3:.0f}",
            f"{_pct(fetch, 0.99) * 1e3:.0f}",
            f"{statistics.median(fetch) / one_copy:.2f}",
            f"of one copy ({one_copy * 1e3:.0f} ms)",
        ],
    ]
    print_table(
        f"{args.versions} versions of {size / 2**20:g} MiB every {args.interval:g} s to "
        f"{args.rollouts} rollouts, keep {args.keep} (achieved {wall / args.versions:.2f} s "
        f"per version, {late} late)",
        ["", "median ms", "p99 ms", "ratio", "to"],
        rows,
    )
    print_table(
        "control-plane state, most on any node, as versions go by (it must level off: "
        "tombstones live 100 gossip rounds, 20 s)",
        ["after version", "gossip keys", "holder-view versions", "replicas held"],
        [[r["version"], *(r[k] for k in KEYS)] for r in series],
    )
    roll_cpu = [cpu[n] for n in cpu if n != "publisher"]
    print(
        f"CPU per version: publisher {cpu['publisher'] * 1e3:.0f} ms, rollouts median "
        f"{statistics.median(roll_cpu) * 1e3:.0f} ms (max {max(roll_cpu) * 1e3:.0f})"
    )
    write_json(args.json, res)


if __name__ == "__main__":
    main()
