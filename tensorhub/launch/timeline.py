"""A launch run's timeline as a PNG beside its JSON: per version, the trainer's stall and
each rollout's fetch and stall, so a slow version or a slow datacenter shows at a glance.

matplotlib is optional (the ``sim`` extra; ``make test`` has it): without it the run says
how to get the picture instead of failing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def png_path(json_path: str | Path) -> Path:
    p = Path(json_path)
    return p.with_suffix(".png") if p.suffix == ".json" else p.with_name(p.name + ".png")


def write_timeline(res: dict[str, Any], path: str | Path) -> Path | None:
    """Draw ``res`` (a launch's results) to ``path``; None if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    versions = res["versions"]
    dcs = sorted({f["dc"] for v in versions for f in v["fetches"]})
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=110)
    xs = [v["version"] for v in versions]
    ax.plot(xs, [v["trainer_stall_s"] for v in versions], "k-o", label="trainer stall")
    for i, dc in enumerate(dcs):
        color = f"C{i}"
        for key, style, what in (("stall_s", "-", "stall"), ("fetch_s", ":", "fetch")):
            ys = [
                max((f[key] for f in v["fetches"] if f["dc"] == dc), default=float("nan"))
                for v in versions
            ]
            ax.plot(xs, ys, style, color=color, marker=".", label=f"{dc} rollouts: max {what}")
    ax.set_xlabel("version")
    ax.set_ylabel("seconds")
    ax.set_xticks(xs)
    ax.set_title(
        f"tensorhub launch: {len(res['topology']['nodes'])} nodes, {len(dcs)} datacenters, "
        f"{res['wall_s']:.0f} s"
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out)
    plt.close(fig)
    return out
