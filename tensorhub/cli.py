"""The ``tensorhub`` command."""

from __future__ import annotations

import argparse
import logging
import sys

from . import __version__


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tensorhub", description=__doc__)
    ap.add_argument("--version", action="version", version=f"tensorhub {__version__}")
    ap.add_argument("-v", "--verbose", action="store_true")
    sub = ap.add_subparsers(dest="cmd", required=True)
    demo = sub.add_parser("demo", help="a trainer and a rollout process moving real weights")
    demo.add_argument("--versions", type=int, default=3)
    demo.add_argument("--steps", type=int, default=20, help="training steps per version")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    if args.cmd == "demo":
        from .demo.two_process import main as demo_main

        return demo_main(args.versions, args.steps)
    return 2  # pragma: no cover - argparse enforces a command


if __name__ == "__main__":
    sys.exit(main())
