"""Per-byte passes the data plane can make over a chunk, against a memcpy of the same chunk.

Why: a chunk's bytes are verified once by the fetcher, and how much that costs decides
whether verification hides behind the network (docs/results.md, "authenticated frames").
Each pass is timed on one 4 MiB buffer (the default chunk), single-threaded unless named,
and reported as GB/s and as a ratio to ``memcpy`` (a copy into a preallocated buffer) timed
in the same run.

    python bench/hashes.py --json out/hashes.json
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import blake3
import xxhash
from cryptography.hazmat.primitives.poly1305 import Poly1305

from bench.common import machine, median, parse_size, print_table, write_json


def rate(fn: Callable[[], object], nbytes: int, rounds: int, reps: int) -> float:
    """GB/s of ``fn`` over ``nbytes``, the median of ``rounds`` timings of ``reps`` calls."""
    fn()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        times.append(time.perf_counter() - t0)
    return nbytes * reps / median(times) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--size", default="4MiB", help="buffer size (one chunk)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", help="write results here")
    args = ap.parse_args()
    n = parse_size(args.size)
    data, dst = os.urandom(n), bytearray(n)
    key = os.urandom(32)
    view = memoryview(dst)
    reps = max(1, (256 << 20) // n)

    def copy() -> None:
        view[:] = data

    passes: dict[str, Callable[[], object]] = {
        "memcpy (baseline)": copy,
        "BLAKE3-128, 1 thread (chunk digest)": lambda: blake3.blake3(data).digest(16),
        "BLAKE3-128, all cores (publish)": lambda: blake3.blake3(
            data, max_threads=blake3.blake3.AUTO
        ).digest(16),
        "Poly1305 (control payload MAC)": lambda: Poly1305.generate_tag(key, data),
        "xxh3-128 (not adversary-resistant)": lambda: xxhash.xxh3_128_digest(data),
    }
    rates = {name: rate(fn, n, args.rounds, reps) for name, fn in passes.items()}
    base = rates["memcpy (baseline)"]
    print_table(
        f"passes over one {n >> 10} KiB buffer ({os.cpu_count()} cores), median of "
        f"{args.rounds} rounds",
        ["pass", "GB/s", "time / memcpy"],
        [[name, r, base / r] for name, r in rates.items()],
    )
    write_json(
        args.json,
        {
            "bench": "hashes",
            "bytes": n,
            "gbps": rates,
            "time_over_memcpy": {k: base / r for k, r in rates.items()},
            "machine": machine(),
        },
    )


if __name__ == "__main__":
    main()
