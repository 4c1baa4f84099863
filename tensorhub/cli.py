"""The ``tensorhub`` command.

A user's mistake (a bad flag, a missing secret, a port in use, an invalid topology) ends
with one line on stderr and exit status 2, never a traceback: the line is the whole story.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from . import __version__

DESCRIPTION = """\
tensorhub moves LLM weights from trainers to rollout workers peer to peer.

  tensorhub demo                 a local 2-datacenter cluster moving real weights
  tensorhub launch TOPOLOGY      the same for your own topology (YAML)
  tensorhub voter ...            one Raft voter of the version registry
  tensorhub gossip-node ...      a node that only gossips
  tensorhub status URL           a running cluster, from any node's HTTP address
  tensorhub ls URL               the versions it holds

Every node of a cluster shares one secret: TENSORHUB_SECRET in the environment, or
--secret-file (launch and demo make one up when neither is given).
"""

SECRET_HELP = "file holding the cluster secret (default: the TENSORHUB_SECRET variable)"


class UsageError(Exception):
    """A mistake on the command line or in its environment: one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, minus the usage dump: a mistake is one line naming the help to read."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see {self.prog} --help)")


def address(text: str) -> str:
    """argparse type for ``host:port``."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not host:port (e.g. 127.0.0.1:7000)")
    return text


def address_list(text: str) -> list[str]:
    return [address(a) for a in text.split(",") if a]


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except UsageError as e:
        print(f"tensorhub: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _main(argv: list[str] | None) -> int:
    ap = _Parser(
        prog="tensorhub", description=DESCRIPTION, formatter_class=argparse.RawTextHelpFormatter
    )
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
    voter = sub.add_parser(
        "voter",
        help="run one Raft voter of the version registry",
        description="Run one Raft voter; prints READY <address> once it listens.",
    )
    voter.add_argument("--listen", required=True, type=address, help="host:port; its id")
    voter.add_argument(
        "--voters",
        required=True,
        type=address_list,
        help="comma-separated addresses of all voters, this one included (1, 3, 5 or 7)",
    )
    voter.add_argument("--data-dir", required=True)
    voter.add_argument("--name", default=None)
    voter.add_argument(
        "--locality", default=None, help="dc/rack/host for gossip (default dc0/rack0/NAME)"
    )
    voter.add_argument("--secret-file", default=None, help=SECRET_HELP)
    g = sub.add_parser(
        "gossip-node",
        help="run a node that only gossips (operators, tests)",
        description="Gossip until killed; prints READY <address> <incarnation>.",
    )
    g.add_argument("--listen", required=True, type=address, help="host:port")
    g.add_argument("--name", required=True)
    g.add_argument("--locality", required=True, help="dc/rack/host")
    g.add_argument("--seeds", default=[], type=address_list, help="comma-separated addresses")
    g.add_argument("--data-dir", default=None)
    g.add_argument("--advertise", default="", help="model/version to advertise as held")
    g.add_argument("--secret-file", default=None, help=SECRET_HELP)
    for cmd, what in (
        ("status", "the cluster as a node sees it: latest versions, spread, who is down"),
        ("ls", "the versions held in the cluster and their copies"),
    ):
        p = sub.add_parser(cmd, help=what, description=what)
        p.add_argument("url", help="any node's HTTP address (the launcher prints them)")
        p.set_defaults(secret_file=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    if args.cmd in ("status", "ls"):
        return run_inspect(args.cmd, args.url)
    _load_secret(args.secret_file)
    if args.cmd == "demo" and args.two_process:
        from .demo.two_process import main as two_process_main

        return two_process_main(args.versions or 3, args.steps or 20)
    if args.cmd in ("demo", "launch"):
        return run_launch(args)
    if args.cmd == "gossip-node":
        return run_gossip_node(args)
    if args.cmd == "voter":
        if len(args.voters) not in (1, 3, 5, 7):
            raise UsageError(
                f"--voters lists {len(args.voters)} voters; use 1, 3, 5 or 7 (an even count "
                "tolerates no more failures than one fewer)"
            )
        if args.listen not in args.voters:
            raise UsageError(f"--listen {args.listen} must be one of --voters")
        return run_voter(args.listen, args.voters, args.data_dir, args.name, args.locality)
    return 2  # pragma: no cover - argparse enforces a command


def run_inspect(cmd: str, url: str) -> int:
    from rich.console import Console

    from .inspect_cli import Unreachable, show_status, show_versions

    try:
        (show_status if cmd == "status" else show_versions)(url, Console())
    except Unreachable as e:
        raise UsageError(str(e)) from None
    return 0


def _load_secret(path: str | None) -> None:
    """``--secret-file``: its contents (stripped) become this process's cluster secret, for
    its own nodes and the processes it starts (through TENSORHUB_SECRET)."""
    if path is None:
        return
    try:
        secret = Path(path).read_text().strip()
    except OSError as e:
        raise UsageError(f"--secret-file: {e.strerror or e}: {path}") from None
    if not secret:
        raise UsageError(f"--secret-file: {path} is empty")
    os.environ["TENSORHUB_SECRET"] = secret


def _serve(start: Callable[[], object]) -> int:
    """Run a node until killed; a mistake while it starts is one line and exit status 2."""
    from .io.loop import run

    try:
        run(start())  # type: ignore[arg-type]
    except OSError as e:  # e.g. the address is in use
        raise UsageError(f"cannot listen: {e.strerror or e}") from None
    except ValueError as e:  # e.g. no secret
        raise UsageError(str(e)) from None
    return 0


def _run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--versions", type=int, default=None, help="override run.versions")
    p.add_argument("--steps", type=int, default=None, help="override run.train_steps")
    p.add_argument("--json", default=None, help="write the results as JSON here")
    p.add_argument("--kill-rollouts", type=int, default=None, help="chaos: kill N rollouts")
    p.add_argument("--kill-leader", action="store_true", help="chaos: kill the Raft leader")
    p.add_argument("--no-wan", action="store_true", help="do not shape the WAN")
    p.add_argument("--lr", type=float, default=None, help="override run.lr (the trainer's)")
    p.add_argument(
        "--deltas", action="store_true", help="publish each version as a delta too (run.deltas)"
    )
    p.add_argument(
        "--dataplane",
        default=None,
        help="every node's data-plane preset, e.g. swarm (run.dataplane; core/swarm/presets.py)",
    )
    p.add_argument("--no-http", action="store_true", help="no /status, /metrics, dashboard")
    p.add_argument("--no-progress", action="store_true", help="no live progress bars")
    p.add_argument(
        "--backend",
        choices=("process", "ray"),
        default="process",
        help="run the nodes as local processes (default) or as Ray actors (pip install ray)",
    )
    p.add_argument(
        "--ray-address",
        default=None,
        help="the Ray cluster to join (e.g. auto, or ray://head:10001); default: start one here",
    )
    p.add_argument("--secret-file", default=None, help=SECRET_HELP)


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
            lr=args.lr or t.lr,
            deltas=t.deltas or args.deltas,
            dataplane=args.dataplane or t.dataplane,
        )
        from .launch.topology import validate

        validate(t)
    except (TopologyError, OSError) as e:
        print(f"tensorhub: {e}", file=sys.stderr)
        return 2
    try:
        res = launch(
            t,
            json_path=args.json,
            progress=not args.no_progress,
            backend=args.backend,
            ray_address=args.ray_address,
        )
    except LaunchFailed as e:
        print(f"tensorhub: the run failed: {e}", file=sys.stderr)
        return 1
    return 0 if res["ok"] else 1


def run_voter(
    listen: str, voters: list[str], data_dir: str, name: str | None, locality: str | None = None
) -> int:
    """Serve as a voter (and a gossip seed) until killed; prints ``READY <address>``."""
    import asyncio

    from .control.gossip_driver import GossipNode
    from .control.raft_driver import RaftNode
    from .dataplane.node import Node
    from .hub import ROLE_KEY
    from .io.raft_storage import RaftStorage

    async def main() -> None:
        node = await Node.start(name or listen, listen=listen)
        raft = RaftNode(node, voters, RaftStorage.open(data_dir))
        # Hubs name the voters as their seeds, so a voter must gossip too: without it a
        # cluster whose seeds are all CLI voters never learns who holds what.
        gossip = GossipNode(
            node,
            locality or f"dc0/rack0/{node.name}",
            [v for v in voters if v != node.address],
            data_dir=Path(data_dir) / "gossip",
        )
        gossip.core.set_local(ROLE_KEY, b"voter")
        await gossip.start()
        await raft.start()
        print(f"READY {node.address}", flush=True)
        await asyncio.Event().wait()

    return _serve(main)


def run_gossip_node(args: argparse.Namespace) -> int:
    """Gossip until killed; prints ``READY <address> <incarnation>`` once listening."""
    import asyncio

    from .control.gossip_driver import GossipNode
    from .dataplane.node import Node

    async def main() -> None:
        node = await Node.start(args.name, listen=args.listen)
        gossip = GossipNode(node, args.locality, args.seeds, data_dir=args.data_dir)
        await gossip.start()
        if args.advertise:
            model, version = args.advertise.rsplit("/", 1)
            gossip.advertise(model, int(version), b"\1" * 16)
        print(f"READY {node.address} {gossip.core.me.inc}", flush=True)
        await asyncio.Event().wait()

    return _serve(main)


if __name__ == "__main__":
    sys.exit(main())
