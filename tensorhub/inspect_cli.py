"""``tensorhub status URL`` and ``tensorhub ls URL``: a running cluster from a terminal.

Both read one node's HTTP endpoints (any node answers for the whole cluster, from its
gossip view): ``/cluster.json`` for status, ``/status`` for the versions and their holders.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections import defaultdict
from typing import Any

from rich.console import Console
from rich.table import Table

from .core.naming import display_name


class Unreachable(Exception):
    """The node's HTTP endpoint did not answer (one line for the user)."""


def get_json(url: str, path: str, timeout: float = 5.0) -> dict[str, Any]:
    base = url if "://" in url else f"http://{url}"
    target = base.rstrip("/") + path
    try:
        with urllib.request.urlopen(target, timeout=timeout) as r:
            out: dict[str, Any] = json.load(r)
            return out
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise Unreachable(f"cannot read {target}: {reason}") from None


def show_status(url: str, console: Console) -> None:
    c = get_json(url, "/cluster.json")
    m = c["members"]
    console.print(
        f"members: [green]{m['alive']} alive[/], [yellow]{m['suspect']} suspect[/], "
        f"[red]{m['dead']} dead[/]"
    )
    if not c["models"]:
        console.print("no versions yet")
    for model in c["models"]:
        rate = (
            f"{model['bytes_per_s'] / 1e6:.1f} MB/s"
            if model["bytes_per_s"] is not None
            else f"{model['chunks_per_s']:.1f} chunks/s"
        )
        t = Table(
            title=f"{model['model']} v{model['latest']}"
            + ("" if model["committed"] else " (newest held; registry did not answer)")
            + f" · {rate}"
        )
        for col in ("datacenter", "alive", "suspect", "dead", "complete copies", "fetching"):
            t.add_column(col, justify="right")
        for dc, d in c["dcs"].items():
            p = model["per_dc"].get(dc, {"complete": 0, "partial": 0})
            t.add_row(
                dc,
                str(d["alive"]),
                str(d["suspect"]),
                str(d["dead"]),
                str(p["complete"]),
                str(p["partial"]),
            )
        console.print(t)
    for n in c["not_alive"]:
        console.print(f"  {n['name']} ({n['dc']}): {n['status']}")
    if c["not_alive_total"] > len(c["not_alive"]):
        console.print(f"  … and {c['not_alive_total'] - len(c['not_alive'])} more not alive")


def show_versions(url: str, console: Console) -> None:
    s = get_json(url, "/status")
    t = Table(title=f"versions held, as {s['name']} sees them")
    for col in ("model", "version", "complete copies", "fetching", "publisher"):
        t.add_column(col, justify="right")
    rows: dict[tuple[str, int], dict[str, Any]] = defaultdict(
        lambda: {"complete": 0, "partial": 0, "origin": "-"}
    )
    for v in s["versions"]:
        row = rows[(display_name(v["model"]), v["version"])]
        for h in v["holders"]:
            row["complete" if h["complete"] else "partial"] += 1
            if h["origin"]:
                row["origin"] = h["name"]
    for (model, version), row in sorted(rows.items()):
        t.add_row(model, str(version), str(row["complete"]), str(row["partial"]), row["origin"])
    console.print(t if rows else "no versions held")
