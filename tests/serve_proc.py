"""A tensorhub node in its own process, for multi-process tests.

Prints one JSON line (address, manifest roots, per-tensor digests) and serves until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

import torch

from tensorhub.dataplane.node import Node
from tensorhub.io.loop import run
from tensorhub.io.tensors import tensor_digests

from .models import every_dtype


async def main(mib: int, secret: str) -> None:
    node = await Node.start("server", secret=secret)
    small = every_dtype(seed=7)
    big = {"w": torch.randn(mib << 18, generator=torch.Generator().manual_seed(1))}
    m1 = node.serve("dtypes", 1, small, chunk_size=8192)
    m2 = node.serve("big", 1, big, chunk_size=1 << 20)
    print(
        json.dumps(
            {
                "address": node.address,
                "roots": [m1.root.hex(), m2.root.hex()],
                "digests": tensor_digests(small),
                "big": tensor_digests(big),
            }
        ),
        flush=True,
    )
    await asyncio.Event().wait()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--secret", default="mp-secret")
    ap.add_argument("--nofile", type=int, default=0, help="lower RLIMIT_NOFILE to this")
    a = ap.parse_args()
    if a.nofile:
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (a.nofile, a.nofile))
    try:
        run(main(a.mib, a.secret))
    except KeyboardInterrupt:
        sys.exit(0)
