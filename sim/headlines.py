"""The reproduction's headline table: each paper figure beside two ratios over many seeds.

One seed is one draw of the generation tail and of the preemptions; a ratio from one seed
can sit anywhere in a wide spread (standalone, seeds 1-30: 12.8x-33.9x against NCCL), so
every ratio here is a median with its interquartile range over the seeds run. Two
columns per headline: against the paper's kind of baseline (as ``workloads.py`` models
it), and against the strongest honest baseline of ``strong.py`` (the one TensorHub does
worst against, by median), so a reader sees how much of a ratio is the design and how
much the baseline.

Every column is TensorHub as built (its TCP data plane, ``Scenario.dataplane``); a last
pair of columns gives the paper's kind of baseline against TensorHub on a hypothetical
GPUDirect data plane at the NIC's rate, labelled as such: it is what the design would
reach, not what the code does.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.table import Table

from .workloads import Outcome


@dataclass(frozen=True)
class Spread:
    """Median and quartiles of one figure over seeds."""

    median: float
    q1: float
    q3: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        if len(values) == 1:
            return cls(values[0], values[0], values[0])
        q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
        return cls(q2, q1, q3)

    def text(self, digits: int = 2) -> str:
        if self.q1 == self.q3:
            return f"{self.median:.{digits}f}x"
        return f"{self.median:.{digits}f}x [{self.q1:.{digits}f}-{self.q3:.{digits}f}]"

    def summary(self) -> dict[str, float]:
        return {"median": round(self.median, 3), "q1": round(self.q1, 3), "q3": round(self.q3, 3)}

    @classmethod
    def from_summary(cls, d: dict[str, float]) -> Spread:
        return cls(d["median"], d["q1"], d["q3"])


@dataclass(frozen=True)
class Headline:
    """One scenario over its seeds."""

    scenario: str
    headline: str
    paper: float | None
    baseline: str
    seeds: int
    vs_paper_kind: Spread
    versus: dict[str, Spread]
    over_lower_bound: Spread
    tail_over_copy: Spread
    dataplane: str = "tcp"
    # The same against the paper's kind with TensorHub on GPUDirect (hypothetical; None:
    # not run).
    gpudirect: Spread | None = None
    gpudirect_over_lower_bound: Spread | None = None

    @property
    def strongest(self) -> tuple[str, Spread] | None:
        if not self.versus:
            return None
        name = min(self.versus, key=lambda n: (self.versus[n].median, n))
        return name, self.versus[name]

    def summary(self) -> dict[str, Any]:
        strong = self.strongest
        return {
            "scenario": self.scenario,
            "headline": self.headline,
            "paper_ratio": self.paper,
            "paper_kind_baseline": self.baseline,
            "seeds": self.seeds,
            "vs_paper_kind": self.vs_paper_kind.summary(),
            "strongest_baseline": strong[0] if strong else None,
            "vs_strongest": strong[1].summary() if strong else None,
            "versus": {n: s.summary() for n, s in self.versus.items()},
            "tensorhub_over_lower_bound_mean": self.over_lower_bound.summary(),
            "tail_over_copy": self.tail_over_copy.summary(),
            "dataplane": self.dataplane,
            "gpudirect_vs_paper_kind": self.gpudirect.summary() if self.gpudirect else None,
            "gpudirect_over_lower_bound_mean": (
                self.gpudirect_over_lower_bound.summary()
                if self.gpudirect_over_lower_bound
                else None
            ),
        }


def from_json(data: dict[str, Any]) -> list[Headline]:
    """The headlines a ``reproduce --json`` file holds (``sweep --headlines`` renders them
    without running the seeds again)."""
    return [
        Headline(
            h["scenario"],
            h["headline"],
            h["paper_ratio"],
            h["paper_kind_baseline"],
            h["seeds"],
            Spread.from_summary(h["vs_paper_kind"]),
            {n: Spread.from_summary(v) for n, v in h["versus"].items()},
            Spread.from_summary(h["tensorhub_over_lower_bound_mean"]),
            Spread.from_summary(h["tail_over_copy"]),
            h.get("dataplane", "gpudirect"),  # files before the TCP default: GPUDirect
            _spread_or_none(h.get("gpudirect_vs_paper_kind")),
            _spread_or_none(h.get("gpudirect_over_lower_bound_mean")),
        )
        for h in data["headlines"]
    ]


def _spread_or_none(d: dict[str, float] | None) -> Spread | None:
    return Spread.from_summary(d) if d else None


def headlines(outcomes: Sequence[Outcome], gpudirect: Sequence[Outcome] = ()) -> list[Headline]:
    """Group runs by scenario (in first-seen order) and summarize each over its seeds;
    ``gpudirect`` holds the same scenarios and seeds with the hypothetical data plane."""
    by: dict[str, list[Outcome]] = defaultdict(list)
    for o in outcomes:
        by[o.scenario.name].append(o)
    hyp: dict[str, list[Outcome]] = defaultdict(list)
    for o in gpudirect:
        hyp[o.scenario.name].append(o)
    out = []
    for name, runs in by.items():
        versus: dict[str, list[float]] = defaultdict(list)
        for o in runs:
            for k, v in o.extra.get("versus", {}).items():
                versus[k].append(v)
        first = runs[0]
        out.append(
            Headline(
                name,
                first.headline,
                first.paper,
                first.baseline,
                len(runs),
                Spread.of([o.ratio for o in runs]),
                {k: Spread.of(v) for k, v in versus.items()},
                Spread.of([o.over_lb_mean for o in runs]),
                Spread.of([float(o.extra.get("tail_over_copy", 0.0)) for o in runs]),
                first.scenario.dataplane,
                Spread.of([o.ratio for o in hyp[name]]) if hyp[name] else None,
                Spread.of([o.over_lb_mean for o in hyp[name]]) if hyp[name] else None,
            )
        )
    return out


def table(rows: Sequence[Headline]) -> Table:
    seeds = max((h.seeds for h in rows), default=0)
    plane = rows[0].dataplane if rows else "tcp"
    t = Table(
        title=f"the paper's figures, ours over {seeds} seed(s): median [quartiles]",
        caption=f"TensorHub as built ({plane} data plane) unless labelled. above 1: "
        "TensorHub's figure is better; strongest: the baseline it does worst against "
        "(sim/strong.py). tail/copy: the slowest rollout's generation past the median's, in "
        "model-copy times (S/B). *GPUDirect: a hypothetical data plane at the NIC's rate, "
        "not built.",
    )
    for col in ("scenario", "paper", "vs paper's kind", "strongest", "vs strongest",
                "TH / bound", "tail/copy", "GPUDirect*: vs kind",
                "GPUDirect*: / bound"):  # fmt: skip
        t.add_column(col, justify="left" if col in ("scenario", "strongest") else "right")
    for h in rows:
        strong = h.strongest
        t.add_row(
            h.scenario,
            f"{h.paper:.1f}x" if h.paper else "-",
            f"{h.vs_paper_kind.text(1)} ({h.baseline})",
            strong[0] if strong else "-",
            strong[1].text() if strong else "-",
            h.over_lower_bound.text(),
            f"{h.tail_over_copy.median:.1f}",
            h.gpudirect.text(1) if h.gpudirect else "-",
            h.gpudirect_over_lower_bound.text() if h.gpudirect_over_lower_bound else "-",
        )
    return t
