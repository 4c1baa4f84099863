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
    demo = sub.add_parser(
        "demo", help="the launcher on its default topology: 2 DCs, a trainer, 6 rollouts"
    )
    _run_options(demo)
    demo.add_argument(
        "--two-process",
        action="store_true",
        help="the minimal demo: one trainer, one rollout, no registry",
    )
    launch = sub.add_parser("launch", help="run a topology: trainer and rollouts as processes")
    launch.add_argument("topology", help="a topology YAML file (see tensorhub.launch.topology)")
    _run_options(launch)
    voter = sub.add_parser("voter", help="run one Raft voter of the version registry")
    voter.add_argument("--listen", required=True, help="host:port; also this voter's id")
    voter.add_argument("--voters", required=True, help="comma-separated voter addresses")
    voter.add_argument("--data-dir", required=True)
    voter.add_argument("--name", default=None)
    g = sub.add_parser("gossip-node", help="run a node that only gossips (operators, tests)")
    g.add_argument("--listen", required=True)
    g.add_argument("--name", required=True)
    g.add_argument("--locality", required=True, help="dc/rack/host")
    g.add_argument("--seeds", default="", help="comma-separated addresses")
    g.add_argument("--data-dir", default=None)
    g.add_argument("--advertise", default="", help="model/version to advertise as held")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    if args.cmd == "demo" and args.two_process:
        from .demo.two_process import main as two_process_main

        return two_process_main(args.versions or 3, args.steps or 20)
    if args.cmd in ("demo", "launch"):
        return run_launch(args)
    if args.cmd == "gossip-node":
        return run_gossip_node(args)
    if args.cmd == "voter":
        return run_voter(args.listen, args.voters.split(","), args.data_dir, args.name)
    return 2  # pragma: no cover - argparse enforces a command


def _run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--versions", type=int, default=None, help="override run.versions")
    p.add_argument("--steps", type=int, default=None, help="override run.train_steps")
    p.add_argument("--json", default=None, help="write the results as JSON here")
    p.add_argument("--kill-rollouts", type=int, default=None, help="chaos: kill N rollouts")
    p.add_argument("--kill-leader", action="store_true", help="chaos: kill the Raft leader")
    p.add_argument("--no-wan", action="store_true", help="do not shape the WAN")
    p.add_argument("--no-http", action="store_true", help="no /status, /metrics, dashboard")
    p.add_argument("--no-progress", action="store_true", help="no live progress bars")


def run_launch(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from .launch import LaunchFailed, TopologyError, default, launch, load

    try:
        t = load(args.topology) if args.cmd == "launch" else default()
        chaos = t.chaos
        if args.kill_rollouts is not None:
            chaos = replace(chaos, kill_rollouts=args.kill_rollouts)
        if args.kill_leader:
            chaos = replace(chaos, kill_leader=True)
        t = replace(
            t,
            versions=args.versions or t.versions,
            train_steps=args.steps or t.train_steps,
            chaos=chaos,
            wan=() if args.no_wan else t.wan,
            http=t.http and not args.no_http,
        )
        from .launch.topology import validate

        validate(t)
    except (TopologyError, OSError) as e:
        print(f"tensorhub: {e}", file=sys.stderr)
        return 2
    try:
        res = launch(t, json_path=args.json, progress=not args.no_progress)
    except LaunchFailed as e:
        print(f"tensorhub: the run failed: {e}", file=sys.stderr)
        return 1
    return 0 if res["ok"] else 1


def run_voter(listen: str, voters: list[str], data_dir: str, name: str | None) -> int:
    """Serve as a voter until killed; prints ``READY <address>`` once listening."""
    import asyncio

    from .io.loop import run
    from .io.raft_storage import RaftStorage
    from .node import Node
    from .raft_driver import RaftNode

    async def main() -> None:
        node = await Node.start(name or listen, listen=listen)
        raft = RaftNode(node, voters, RaftStorage.open(data_dir))
        await raft.start()
        print(f"READY {node.address}", flush=True)
        await asyncio.Event().wait()

    run(main())
    return 0


def run_gossip_node(args: argparse.Namespace) -> int:
    """Gossip until killed; prints ``READY <address> <incarnation>`` once listening."""
    import asyncio

    from .gossip_driver import GossipNode
    from .io.loop import run
    from .node import Node

    async def main() -> None:
        node = await Node.start(args.name, listen=args.listen)
        seeds = [s for s in args.seeds.split(",") if s]
        gossip = GossipNode(node, args.locality, seeds, data_dir=args.data_dir)
        await gossip.start()
        if args.advertise:
            model, version = args.advertise.rsplit("/", 1)
            gossip.advertise(model, int(version), b"\1" * 16)
        print(f"READY {node.address} {gossip.core.me.inc}", flush=True)
        await asyncio.Event().wait()

    run(main())
    return 0


if __name__ == "__main__":
    sys.exit(main())
