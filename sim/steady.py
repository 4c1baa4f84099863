"""Several standalone RL steps in a row on one simulated cluster: the trainer publishes
every step and unpublishes at its next optimizer step; each rollout instance fetches
every version into the memory that held the one before.

Why: :func:`sim.workloads.standalone` simulates one publish, so it must count the trainer
stalled until the last byte it serves has left: nothing after that publish exists to say
when it could stop. A trainer run as the README shows serves until its next optimizer
step needs the buffers, then unpublishes: it waits until one full copy exists elsewhere
(``wait_replicated``) and until no upload reads its memory, and the fetches still under
way go on from the rollouts. In steps in a row, a rollout's fetch of v+1 into its own
weights is an unpublish of v there, so each version loses holders as the next spreads,
and a slow step's tail can meet the next step's publish on the same network.

The loop, the same for every scheme (times in seconds, k the step):

- the trainer publishes v_k at P_k and computes its next step for ``train_step_s``; it
  may mutate the published buffers at ``free_k``, stalls for
  ``max(0, free_k - P_k - train_step_s)``, and publishes v_{k+1} at
  ``max(P_k + train_step_s, free_k)``;
- instance i pauses for v_k at ``max(P_k, R_i,k-1) + g_i,k`` (step k's own generation
  draws; R_i,k-1: when it resumed with v_{k-1}) and resumes with v_k at R_i,k; it stalls
  for ``R_i,k - pause``. Step 0 of this loop is the one-step run's timing.

Schemes, each releasing the trainer its own way:

- ``tensorhub``: the trainers unpublish at P_k + train_step_s once a full copy is
  elsewhere; ``free_k`` is when their uploads under way have drained;
- ``tensorhub, serves all``: the one-step run's accounting: the trainers serve every
  fetch of v_k (``free_k``: the last instance has it, or the next step's end if later);
- ``nccl``: a ring broadcast after the barrier on every instance's pause (the closed
  form of :func:`sim.baselines.ring_broadcast`); ``free_k``: the ring's end;
- ``ucx``: every instance pulls its copy from the trainers (:func:`pull_from_trainer`);
  ``free_k``: the last pull's end, so no two versions are ever in flight.

Not modelled (stated, not hidden): the trainer waiting for the rollouts' samples (it is
paced by its compute and the release of its buffers only); the storage baseline and
snapshots; upload slots shared between versions (each version's swarm has its own; the
network, and each host's NIC, is shared).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rich.table import Table

from .baselines import pull_from_trainer
from .engine import Engine
from .headlines import Spread
from .network import Network
from .scenario import Scenario
from .strong import nccl_ring_s
from .swarm import Swarm
from .topology import Cluster
from .workloads import _control, _place, trainer_slices, unpublish

SCHEMES = ("tensorhub", "tensorhub, serves all", "nccl", "ucx")


@dataclass
class Steps:
    """One scheme's run of steps: when each version was published and released, and who
    stalled how long at each step."""

    name: str
    publish: list[float]  # P_k
    free: list[float]  # when the trainer could mutate v_k's buffers
    rollout_stall: list[dict[str, float]]  # per step: per instance, seconds
    trainer_stall: list[float]  # per step, per trainer GPU, seconds

    def step_stall(self, sc: Scenario, k: int) -> float:
        """GPU-seconds stalled at step ``k``: every rollout GPU and every trainer GPU."""
        rollouts = sum(self.rollout_stall[k].values())
        return sc.gpus_per_host * (rollouts + sc.trainer_hosts * self.trainer_stall[k])

    def mean_stall(self, sc: Scenario) -> float:
        return sum(self.step_stall(sc, k) for k in range(len(self.publish))) / len(self.publish)

    def period(self) -> float:
        """Mean seconds from one publish to the next (the step time the loop sustains)."""
        if len(self.publish) < 2:
            raise ValueError("a period takes two steps or more")
        return (self.publish[-1] - self.publish[0]) / (len(self.publish) - 1)

    def stalled_fraction(self, sc: Scenario) -> float:
        """The share of all GPU time spent stalled: a scheme that paces the loop slower
        stalls less per step but moves fewer steps an hour, and this counts both."""
        gpus = sc.gpus_per_host * (sc.trainer_hosts + sc.rollout_hosts)
        return self.mean_stall(sc) / (self.period() * gpus)

    def summary(self, sc: Scenario) -> dict[str, Any]:
        steps = range(len(self.publish))
        return {
            "mean_stall_gpu_s": round(self.mean_stall(sc), 1),
            "period_s": round(self.period(), 3),
            "stalled_fraction": round(self.stalled_fraction(sc), 4),
            "trainer_stall_s": [round(t, 3) for t in self.trainer_stall],
            "rollout_mean_s": [round(sum(s.values()) / len(s), 3) for s in self.rollout_stall],
            "rollout_worst_s": [round(max(s.values()), 3) for s in self.rollout_stall],
            "step_stall_gpu_s": [round(self.step_stall(sc, k), 1) for k in steps],
        }


def _trainer_stalls(sc: Scenario, publish: list[float], free: list[float]) -> list[float]:
    return [max(0.0, f - p - sc.train_step_s) for p, f in zip(publish, free, strict=True)]


# -- TensorHub: one swarm per version, all on one network ------------------------------------


class _SwarmLoop:
    """Drives one :class:`Swarm` per version on a shared engine, network and cluster."""

    def __init__(self, sc: Scenario, steps: int, serve_all: bool) -> None:
        self.sc, self.steps, self.serve_all = sc, steps, serve_all
        self.e = Engine()
        self.net = Network(self.e, depth=sc.solve_depth)
        self.c = Cluster.build(sc.topology, host_rate=sc.node_rate)
        self.trainers, self.rollouts, _ = _place(sc, self.c)
        # After a publish, when each instance has heard of it (committed, then gossiped).
        self.heard = _control(sc, len(self.trainers) + len(self.rollouts)).heard(self.rollouts)
        n = len(self.rollouts)
        self.gen = [
            dict(zip(self.rollouts, sc.generation_times(n, k), strict=True)) for k in range(steps)
        ]
        self.slices = trainer_slices(self.trainers, sc.swarm.chunks)
        self.swarms: list[Swarm] = []
        self.publish: list[float] = []
        self.free: list[float] = []
        self.paused: list[dict[str, float]] = [{} for _ in range(steps)]
        self.resumed: list[dict[str, float]] = [{} for _ in range(steps)]
        self._all_done: dict[int, Callable[[], None]] = {}

    def run(self) -> Steps:
        self.e.at(0.0, self._publish)
        self.e.run()
        for k, s in enumerate(self.swarms):
            if len(self.resumed[k]) != len(self.rollouts):
                raise AssertionError(f"step {k}: {len(self.resumed[k])} instances got v{k}")
            if not s.done:
                raise AssertionError(f"step {k}: a fetch did not finish")
        if len(self.free) != self.steps or self.net.flows:
            raise AssertionError(f"{len(self.free)} of {self.steps} steps released")
        name = "tensorhub, serves all" if self.serve_all else "tensorhub"
        stalls = [
            {f: self.resumed[k][f] - self.paused[k][f] for f in self.rollouts}
            for k in range(self.steps)
        ]
        return Steps(
            name, self.publish, self.free, stalls, _trainer_stalls(self.sc, self.publish, self.free)
        )

    def _publish(self) -> None:
        sc, k, now = self.sc, len(self.swarms), self.e.now
        s = Swarm(
            self.e,
            self.net,
            self.c,
            sc.size * sc.delta_fraction,  # every instance holds v_{k-1}: deltas, if any
            self.trainers,
            self.rollouts,
            sc.swarm,
            seed=sc.seed + 7907 * k,
            origin_chunks=self.slices,
        )
        s.on_done = functools.partial(self._done, k)
        self.swarms.append(s)
        self.publish.append(now)
        for f in self.rollouts:
            if k == 0 or f in self.resumed[k - 1]:
                self._schedule_pause(k, f)
        self.e.at(now + sc.train_step_s, functools.partial(self._next_step, k))

    def _schedule_pause(self, k: int, f: str) -> None:
        resumed = self.resumed[k - 1][f] if k else 0.0
        at = max(self.publish[k], resumed) + self.gen[k][f]
        self.e.at(at, functools.partial(self._pause, k, f))

    def _pause(self, k: int, f: str) -> None:
        self.paused[k][f] = self.e.now
        start = max(self.e.now, self.publish[k] + self.heard[f])
        self.e.at(start, functools.partial(self._start, k, f))

    def _start(self, k: int, f: str) -> None:
        """Fetch v_k into the memory that holds v_{k-1}: let go of that first (drained)."""
        begin = functools.partial(self.swarms[k].begin, f)
        if k:
            self.swarms[k - 1].withdraw(f, begin)
        else:
            begin()

    def _done(self, k: int, f: str) -> None:
        self.resumed[k][f] = self.e.now
        if k + 1 < len(self.swarms):
            self._schedule_pause(k + 1, f)
        if len(self.resumed[k]) == len(self.rollouts) and k in self._all_done:
            self._all_done.pop(k)()

    def _next_step(self, k: int) -> None:
        """The trainer's next optimizer step is due: release v_k's buffers when it may."""
        release = functools.partial(self._release, k)
        if not self.serve_all:
            self.swarms[k].when_replicated(release)
        elif len(self.resumed[k]) == len(self.rollouts):
            release()
        else:
            self._all_done[k] = release

    def _release(self, k: int) -> None:
        unpublish(self.swarms[k], self.trainers, functools.partial(self._released, k))

    def _released(self, k: int) -> None:
        """The trainers' uploads of v_k drained: it may mutate them, and publish again."""
        self.free.append(self.e.now)
        if k + 1 < self.steps:
            self._publish()


# -- the baselines ---------------------------------------------------------------------------


def _pauses(p: float, resumed: dict[str, float], gen: dict[str, float]) -> dict[str, float]:
    """When each instance pauses for the version published at ``p``: its generation
    time after the publish, or after it resumed with the last version if that is later."""
    return {f: max(p, resumed[f]) + g for f, g in gen.items()}


def _closed_form_steps(
    name: str,
    sc: Scenario,
    gen: list[dict[str, float]],
    steps: int,
    transfer: Callable[[float, dict[str, float]], tuple[dict[str, float], float]],
) -> Steps:
    """The loop for a baseline whose step has a closed form: ``transfer(p, pause)`` gives,
    for the version published at ``p`` and each instance's pause, when each instance
    resumes with it and when the trainer may mutate its buffers."""
    publish, free, stalls = [], [], []
    p, resumed = 0.0, dict.fromkeys(gen[0], 0.0)
    for k in range(steps):
        pause = _pauses(p, resumed, gen[k])
        resumed, freed = transfer(p, pause)
        publish.append(p)
        free.append(freed)
        stalls.append({f: resumed[f] - at for f, at in pause.items()})
        p = max(p + sc.train_step_s, freed)
    return Steps(name, publish, free, stalls, _trainer_stalls(sc, publish, free))


def _nccl_steps(sc: Scenario, members: int, gen: list[dict[str, float]], steps: int) -> Steps:
    ring = nccl_ring_s(sc, members, sc.nic)

    def transfer(_p: float, pause: dict[str, float]) -> tuple[dict[str, float], float]:
        end = max(pause.values()) + ring  # a ring after the barrier; the trainer is in it
        return dict.fromkeys(pause, end), end

    return _closed_form_steps("nccl", sc, gen, steps, transfer)


def _ucx_steps(sc: Scenario, trainers: list[str], gen: list[dict[str, float]], steps: int) -> Steps:
    def transfer(p: float, pause: dict[str, float]) -> tuple[dict[str, float], float]:
        # The trainer serves every pull before it may publish again, so no two versions
        # are ever in flight: each step runs on a network of its own, from its publish.
        pulls = pull_from_trainer(
            Cluster.build(sc.topology), trainers, {f: t - p for f, t in pause.items()}, sc.size
        )
        return {f: p + d for f, d in pulls.done.items()}, p + pulls.senders_free

    return _closed_form_steps("ucx", sc, gen, steps, transfer)


# -- the run -----------------------------------------------------------------------------------


@dataclass
class SteadyOutcome:
    scenario: Scenario
    runs: dict[str, Steps]

    def ratio(self, scheme: str, over: str = "tensorhub") -> float:
        """``scheme``'s mean GPU stall per step over ``over``'s (above 1: ``over`` better)."""
        return self.runs[scheme].mean_stall(self.scenario) / self.runs[over].mean_stall(
            self.scenario
        )

    def summary(self) -> dict[str, Any]:
        sc = self.scenario
        return {
            "scenario": sc.name,
            "seed": sc.seed,
            "steps": len(self.runs["tensorhub"].publish),
            "schemes": {n: r.summary(sc) for n, r in self.runs.items()},
            "ratios_vs_tensorhub": {
                n: round(self.ratio(n), 3) for n in self.runs if n != "tensorhub"
            },
        }


def check(sc: Scenario, steps: int) -> None:
    """What :func:`steady` can run (ValueError, saying why, if not)."""
    if sc.kind != "standalone":
        raise ValueError(f"steady state is modelled for standalone scenarios, not {sc.kind!r}")
    if steps < 2:
        raise ValueError("steps: at least two (a steady state has a period)")


def steady(sc: Scenario, steps: int) -> SteadyOutcome:
    """``steps`` standalone steps of every scheme in :data:`SCHEMES`."""
    check(sc, steps)
    loop = _SwarmLoop(sc, steps, serve_all=False)
    runs = {"tensorhub": loop.run()}
    runs["tensorhub, serves all"] = _SwarmLoop(sc, steps, serve_all=True).run()
    members = len(loop.trainers) + len(loop.rollouts)
    runs["nccl"] = _nccl_steps(sc, members, loop.gen, steps)
    runs["ucx"] = _ucx_steps(sc, loop.trainers, loop.gen, steps)
    return SteadyOutcome(sc, runs)


def table(o: SteadyOutcome) -> Table:
    """One row per scheme: its mean stall per step, against TensorHub's, and the pace."""
    sc = o.scenario
    steps = len(o.runs["tensorhub"].publish)
    t = Table(
        title=f"{sc.name}, {steps} steps in a row ({sc.dataplane} data plane, seed {sc.seed})",
        caption="stall: GPU-seconds per step, every rollout and trainer GPU. vs TensorHub: "
        "the scheme's stall over TensorHub's (above 1: TensorHub better). period: mean "
        "seconds from one publish to the next. GPU time stalled: stall / (period x GPUs).",
    )
    for col in ("scheme", "stall / step", "vs TensorHub", "period", "GPU time stalled",
                "trainer stall", "rollout stall (mean)"):  # fmt: skip
        t.add_column(col, justify="left" if col == "scheme" else "right")
    for name, r in o.runs.items():
        stalls = [v for step in r.rollout_stall for v in step.values()]
        t.add_row(
            name,
            f"{r.mean_stall(sc):,.0f}",
            "-" if name == "tensorhub" else f"{o.ratio(name):.2f}x",
            f"{r.period():.1f} s",
            f"{r.stalled_fraction(sc):.1%}",
            f"{sum(r.trainer_stall) / len(r.trainer_stall):.1f} s",
            f"{sum(stalls) / len(stalls):.1f} s",
        )
    return t


def over_seeds(outs: Sequence[SteadyOutcome]) -> dict[str, dict[str, Spread]]:
    """Per scheme, over the seeds: its stall per step over TensorHub's, its share of GPU
    time stalled and its period."""
    spreads: dict[str, dict[str, Spread]] = {}
    for name in SCHEMES:
        runs = [(o.scenario, o.runs[name]) for o in outs]
        spreads[name] = {
            "vs_tensorhub": Spread.of([o.ratio(name) for o in outs]),
            "stalled_fraction": Spread.of([r.stalled_fraction(sc) for sc, r in runs]),
            "period_s": Spread.of([r.period() for _sc, r in runs]),
        }
    return spreads


def seeds_table(outs: Sequence[SteadyOutcome]) -> Table:
    sc = outs[0].scenario
    t = Table(
        title=f"{sc.name}, {len(outs[0].runs['tensorhub'].publish)} steps in a row over "
        f"{len(outs)} seeds ({sc.dataplane} data plane): median [quartiles]",
        caption="vs TensorHub: the scheme's GPU stall per step over TensorHub's (above 1: "
        "TensorHub better). GPU time stalled: stall / (period x GPUs).",
    )
    for col in ("scheme", "vs TensorHub", "GPU time stalled", "period (s)"):
        t.add_column(col, justify="left" if col == "scheme" else "right")
    for name, sp in over_seeds(outs).items():
        frac, period = sp["stalled_fraction"], sp["period_s"]
        t.add_row(
            name,
            "-" if name == "tensorhub" else sp["vs_tensorhub"].text(),
            f"{frac.median:.1%} [{frac.q1:.1%}-{frac.q3:.1%}]",
            f"{period.median:.1f} [{period.q1:.1f}-{period.q3:.1f}]",
        )
    return t
