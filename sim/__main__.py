"""``python -m sim``: run a scenario, reproduce the paper's three results, or sweep.

python -m sim run sim/scenarios/elastic.yaml [--set joiners=32] [--json out.json]
python -m sim reproduce [--seeds 20] --json out.json
python -m sim sweep [--report docs/results.md] [--json sweeps.json]
python -m sim steady [--steps 4] [--set dataplane=gpudirect] [--json out.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from . import headlines, report, steady
from .scenario import Scenario, load
from .workloads import Outcome, run

SCENARIOS = Path(__file__).parent / "scenarios"
PAPER_SCENARIOS = ("standalone", "elastic", "crossdc", "broadcast")


def _override(sc: Scenario, sets: list[str], seed: int | None) -> Scenario:
    changes: dict[str, Any] = {}
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set wants key=value, got {item!r}")
        changes[key] = yaml.safe_load(value)
    if seed is not None:
        changes["seed"] = seed
    try:
        return sc.replace(**changes)
    except TypeError as e:
        raise SystemExit(f"bad --set: {e}") from None


def _write_json(path: str | None, data: Any) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(data, indent=2) + "\n")
        print(f"wrote {path}")


def paper_outcomes(
    seed: int | None = None, seeds: list[int] | None = None, *, gpudirect: bool = False
) -> tuple[list[Outcome], list[Outcome]]:
    """The four scenarios as built, for each of ``seeds`` (or once, with ``seed`` or the
    files' own); and, with ``gpudirect``, the same on the hypothetical GPUDirect data plane
    (against the paper's kind only: the strong baselines do not depend on our data plane
    and are run once, as built)."""
    scs = [load(SCENARIOS / f"{name}.yaml") for name in PAPER_SCENARIOS]
    if seeds is not None:
        scs = [sc.replace(seed=s) for s in seeds for sc in scs]
    elif seed is not None:
        scs = [sc.replace(seed=seed) for sc in scs]
    hyp = [sc.replace(dataplane="gpudirect", strong_baselines=False) for sc in scs if gpudirect]
    outs = run_all(scs + hyp)
    return outs[: len(scs)], outs[len(scs) :]


def run_all(scs: list[Scenario]) -> list[Outcome]:
    """Every scenario, one process each up to the cores there are (every run is seeded and
    self-contained, so the results do not depend on how they were spread)."""
    workers = min(len(scs), os.cpu_count() or 1)
    if workers == 1:
        return [run(sc) for sc in scs]
    # The longest runs first, so the last to start are short ones (a balanced pool).
    order = sorted(range(len(scs)), key=lambda i: -_COST.get(scs[i].name, 1.0))
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        done = dict(zip(order, pool.map(run, [scs[i] for i in order]), strict=True))
    return [done[i] for i in range(len(scs))]


_COST = {"standalone": 16.0, "broadcast": 15.0, "crossdc": 9.0, "elastic": 7.5}
"""Seconds one run of each takes on this machine (2 cores): only the pool's order uses it."""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sim", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run one scenario file against its baselines")
    r.add_argument("scenario")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    r.add_argument("--seed", type=int)
    r.add_argument("--json")
    p = sub.add_parser("reproduce", help="the paper's three scenarios with their baselines")
    p.add_argument("--seed", type=int, help="one seed (default: the scenario files' own)")
    p.add_argument("--seeds", type=int, help="run seeds 1..N and report medians and quartiles")
    p.add_argument("--json")
    p.add_argument(
        "--as-built-only",
        action="store_true",
        help="skip the hypothetical GPUDirect runs (about 40%% of the time)",
    )
    s = sub.add_parser("sweep", help="move each assumed parameter; write the report")
    s.add_argument("--report", default="docs/results.md")
    s.add_argument("--json")
    s.add_argument("--only", help="run only the sweeps whose name contains this")
    s.add_argument(
        "--headlines",
        metavar="JSON",
        help="a `reproduce --seeds N --json` file: its two-column table goes in the report",
    )
    d = sub.add_parser("steady", help="standalone steps in a row, the trainer unpublishing")
    d.add_argument("scenario", nargs="?", default=str(SCENARIOS / "standalone.yaml"))
    d.add_argument("--steps", type=int, default=4)
    d.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    d.add_argument("--seed", type=int)
    d.add_argument("--seeds", type=int, help="run seeds 1..N and report medians and quartiles")
    d.add_argument("--json")
    a = ap.parse_args(argv)

    t0 = time.perf_counter()
    if a.cmd == "run":
        try:
            sc = _override(load(a.scenario), a.set, a.seed)
        except (OSError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        o = run(sc)
        report.print_outcomes([o])
        _write_json(a.json, o.summary())
    elif a.cmd == "steady":
        return _steady(a, t0)
    elif a.cmd == "reproduce":
        if a.seeds is not None and (a.seeds < 1 or a.seed is not None):
            print("error: --seeds N wants N >= 1 and no --seed", file=sys.stderr)
            return 2
        seeds = list(range(1, a.seeds + 1)) if a.seeds else None
        outs, hyp = paper_outcomes(a.seed, seeds, gpudirect=not a.as_built_only)
        report.print_outcomes(outs if seeds is None else outs[: len(PAPER_SCENARIOS)])
        rows = headlines.headlines(outs, hyp)
        Console(width=max(Console().width, 150)).print(headlines.table(rows))
        _write_json(a.json, {"wall_s": round(time.perf_counter() - t0, 1),
                             "seeds": seeds or [outs[0].scenario.seed],
                             "headlines": [h.summary() for h in rows],
                             "results": [o.summary() for o in outs],
                             "gpudirect_results": [o.summary() for o in hyp]})  # fmt: skip
    else:
        outs, hyp = paper_outcomes(gpudirect=not a.headlines)
        done = []
        images: dict[str, str] = {}
        rep = Path(a.report)
        img_dir = rep.parent / "results"
        img_dir.mkdir(parents=True, exist_ok=True)
        sweeps = [sw for sw in report.SWEEPS if not a.only or a.only in sw.name]
        points_of = [report.sweep_points(load(SCENARIOS / f"{sw.kind}.yaml"), sw) for sw in sweeps]
        ran = iter(run_all([sc for pts in points_of for _, sc in pts]))
        for sw, pts in zip(sweeps, points_of, strict=True):
            points = [(v, next(ran)) for v, _ in pts]
            done.append((sw, points))
            png = img_dir / f"{re.sub(r'[^A-Za-z0-9]+', '-', sw.key)}.png"
            report.plot(sw, points, png)
            images[sw.key] = f"results/{png.name}"
            shown = ", ".join(
                f"{v}: {sw.ratio(o):.1f}x ({o.over_lb_mean:.2f}x LB)" for v, o in points
            )
            print(f"{sw.kind}/{sw.name} (vs {sw.baseline(points[0][1])}): {shown}")
        kept = rep.read_text().partition(report.MEASURED)[2] if rep.exists() else ""
        if a.headlines:
            heads = headlines.from_json(json.loads(Path(a.headlines).read_text()))
            source = f"python -m sim reproduce --seeds {heads[0].seeds} --json {a.headlines}"
        else:
            heads, source = headlines.headlines(outs, hyp), "python -m sim reproduce"
        text = report.markdown(outs, done, images, "python -m sim sweep", heads, source)
        rep.write_text(text + (f"\n{report.MEASURED}{kept}" if kept else ""))
        print(f"wrote {rep}")
        _write_json(a.json, {
            sw.key: [{"value": v, **o.summary()} for v, o in pts] for sw, pts in done
        })  # fmt: skip
    print(f"({time.perf_counter() - t0:.1f} s)")
    return 0


def _steady(a: argparse.Namespace, t0: float) -> int:
    """``python -m sim steady``: one seed's table, or medians over ``--seeds``."""
    try:
        sc = _override(load(a.scenario), a.set, a.seed)
        if a.seeds is not None and (a.seeds < 1 or a.seed is not None):
            raise ValueError("--seeds N wants N >= 1 and no --seed")
        scs = [sc.replace(seed=s) for s in range(1, a.seeds + 1)] if a.seeds else [sc]
        steady.check(scs[0], a.steps)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    run_one = functools.partial(steady.steady, steps=a.steps)
    workers = min(len(scs), os.cpu_count() or 1)
    if workers == 1:
        outs = [run_one(sc) for sc in scs]
    else:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
            outs = list(pool.map(run_one, scs))
    console = Console(width=max(Console().width, 120))
    console.print(steady.table(outs[0]) if len(outs) == 1 else steady.seeds_table(outs))
    _write_json(a.json, {
        "wall_s": round(time.perf_counter() - t0, 1),
        "seeds": [o.scenario.seed for o in outs],
        "over_seeds": {n: {k: v.summary() for k, v in sp.items()}
                       for n, sp in steady.over_seeds(outs).items()},
        "runs": [o.summary() for o in outs],
    })  # fmt: skip
    print(f"({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
