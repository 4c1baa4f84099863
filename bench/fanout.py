"""Fan-out: one publisher, R fetchers in two datacenters, swarm against star, same run.

Every node is a separate process on loopback running a full :class:`tensorhub.Hub` (the
publisher and one fetcher per datacenter are the Raft voters). Half the fetchers share the
publisher's datacenter, half are in the other. Three phases, on the same processes:

1. **point to point**: one fetcher pulls the model from the publisher alone — the time one
   copy takes on this machine now (the lower bound of any fan-out's last fetcher);
2. **star** (the baseline): all R fetchers pull from the publisher at once, as with a
   central store or a trainer serving every rollout;
3. **swarm**: the publisher publishes through the Hub (it super-seeds), and all R fetchers
   ``Hub.fetch`` at once: locality-aware, chunks passed on as soon as verified.

Reported, each as a ratio measured in this run: the publisher's egress / model size;
cross-datacenter bytes / model size per remote datacenter; last fetcher's completion time /
the point-to-point time. The WAN is not shaped here (loopback): the cross-datacenter figure
counts bytes by the localities of sender and receiver. On loopback every byte costs the
same CPU whoever sends it, so the star is not slowed by the publisher's link as it is on a
real network: the time ratio here shows the swarm's overhead, not its speed-up.

    python bench/fanout.py --fetchers 8 --size 128MiB --json out/fanout.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine, parse_size, print_table, write_json
from tensorhub.core.layout import DEFAULT_CHUNK_SIZE
from tensorhub.testing.hub_procs import HubProcs, Spec

MODEL = "bench"


def _seed_spare(args: argparse.Namespace) -> bool | None:
    """The publisher's ``Hub.seed_spare`` as asked (None: the preset's)."""
    if args.strict_seed and args.spare_seed:
        raise SystemExit("fanout: --strict-seed and --spare-seed ask opposite things")
    return False if args.strict_seed else True if args.spare_seed else None


def _specs(fetchers: int, preset: str = "node", seed_spare: bool | None = None) -> list[Spec]:
    half = (fetchers + 1) // 2
    specs = [
        Spec(
            "publisher", "dc0/rack0/publisher", voter=True, seed_spare=seed_spare, dataplane=preset
        )
    ]
    for i in range(fetchers):
        dc = "dc0" if i < half else "dc1"
        specs.append(
            Spec(f"f{i}", f"{dc}/rack{i % 2}/f{i}", voter=i in (0, half), dataplane=preset)
        )
    return specs


def _phase(
    c: HubProcs, fetchers: list[str], model: str, via: str | None, size: int
) -> dict[str, Any]:
    seconds, delta, failures = c.fetch_all(fetchers, model, 1, via)
    pub = sum(b for k, b in delta.items() if k.startswith("publisher>"))
    cross = sum(b for k, b in delta.items() if c.dc(k.split(">")[0]) != c.dc(k.split(">")[1]))
    remote_dcs = len({c.dc(f) for f in fetchers} - {c.dc("publisher")}) or 1
    return {
        "seconds": seconds,
        "publisher_egress_models": pub / size,
        "cross_dc_models_per_remote_dc": cross / size / remote_dcs,
        "fetchers": len(fetchers),
        "failures": failures,
        "bytes_by_link": dict(sorted(delta.items())),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--fetchers", type=int, default=8)
    ap.add_argument("--size", default="128MiB", help="model bytes (e.g. 64MiB, 1GiB)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument(
        "--strict-seed",
        action="store_true",
        help="the publisher sends each chunk once (Hub.seed_spare = False; the node's default)",
    )
    ap.add_argument(
        "--spare-seed",
        action="store_true",
        help="an idle publisher uplink also sends repeat copies (Hub.seed_spare = True)",
    )
    ap.add_argument("--preset", default="node", help="the data-plane preset (e.g. swarm)")
    args = ap.parse_args()
    size = parse_size(args.size)
    with (
        tempfile.TemporaryDirectory(prefix="tensorhub-fanout-") as tmp,
        HubProcs(_specs(args.fetchers, args.preset, _seed_spare(args)), tmp) as c,
    ):
        fetchers = [n for n in c.addr if n != "publisher"]
        c.call(["publisher"], "serve", "p2p", 1, size, 1)
        c.call(["publisher"], "serve", "star", 1, size, 2)
        p2p = _phase(c, ["f0"], "p2p", c.addr["publisher"], size)
        star = _phase(c, fetchers, "star", c.addr["publisher"], size)
        c.call(["publisher"], "publish", MODEL, 1, size, 3)
        swarm = _phase(c, fetchers, MODEL, None, size)
    for r in (star, swarm):
        r["last_fetcher_over_p2p"] = r["seconds"] / p2p["seconds"]
    rows = [
        [
            name,
            r["publisher_egress_models"],
            r["cross_dc_models_per_remote_dc"],
            r["seconds"],
            r["last_fetcher_over_p2p"],
        ]
        for name, r in (("star (baseline)", star), (f"tensorhub ({args.preset})", swarm))
    ]
    print_table(
        f"fan-out: 1 publisher → {args.fetchers} fetchers in 2 DCs, model {size / 2**20:.0f} MiB;"
        f" one p2p copy {p2p['seconds']:.2f}s",
        [
            "",
            "publisher egress (models)",
            "cross-DC (models/remote DC)",
            "last fetcher (s)",
            "last / p2p",
        ],
        rows,
    )
    write_json(
        args.json,
        {
            "bench": "fanout",
            "model_bytes": size,
            "chunk_bytes": DEFAULT_CHUNK_SIZE,
            "fetchers": args.fetchers,
            "preset": args.preset,
            "seed_spare": _seed_spare(args),  # (None: the preset's)
            "p2p_seconds": p2p["seconds"],
            "star": star,
            "swarm": swarm,
            "machine": machine(),
        },
    )


if __name__ == "__main__":
    main()
