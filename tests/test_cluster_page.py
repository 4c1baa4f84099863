"""The cluster-wide page (issue #20): latest version per model, per-datacenter spread,
throughput and who is not alive, aggregated; and metrics with histograms and a latest gauge.

The browser test loads the page from a node of a real launch (7 processes) after chaos has
killed a rollout, in headless Chromium, and reads what a person would see.
"""

from __future__ import annotations

import asyncio
import html
import io
import json
import os
import re
import shutil
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from tensorhub.cluster_view import SpreadRate
from tensorhub.core.naming import display_name
from tensorhub.inspect_cli import show_status, show_versions
from tensorhub.io.tensors import empty_like_manifest
from tensorhub.launch import from_dict, launch
from tensorhub.status_http import StatusServer

from .test_hub import cluster, weights

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def test_display_names_hide_the_shard_suffix() -> None:
    assert display_name("policy@0") == "policy"
    assert display_name("policy@3") == "policy (shard 3)"
    assert display_name("plain") == "plain"


def test_spread_rate_is_chunks_per_second_over_the_window() -> None:
    r = SpreadRate()
    assert r.observe(0.0, {("m@0", 1): 0}) == {("m@0", 1): 0.0}
    assert r.observe(2.0, {("m@0", 1): 100}) == {("m@0", 1): 50.0}
    assert r.observe(10.0, {("m@0", 1): 100})[("m@0", 1)] == pytest.approx(0.0)


async def test_cluster_json_and_metrics(tmp_path: Path) -> None:
    async with cluster(tmp_path, rollouts=2) as (voters, rolls):
        pub = await voters[0].publish("policy", 1, weights(1, mib=2), chunk_size=1 << 20)
        for r in rolls:
            await r.fetch("policy", 1, empty_like_manifest(pub.manifest))
        await voters[0].wait_replicated("policy", 1, copies=2, timeout=20)
        await asyncio.sleep(0.3)  # gossip: every holder's advertisement reaches rollout1
        server = StatusServer(rolls[1])
        url = await server.start()
        try:
            async with aiohttp.ClientSession() as s:
                c = await (await s.get(f"{url}/cluster.json")).json()
                metrics = await (await s.get(f"{url}/metrics")).text()
                page = await (await s.get(f"{url}/cluster")).text()
            term = io.StringIO()  # `tensorhub status URL` and `tensorhub ls URL`
            await asyncio.to_thread(show_status, url, Console(file=term, width=120))
            await asyncio.to_thread(show_versions, url, Console(file=term, width=120))
        finally:
            await server.close()
    shown = term.getvalue()
    print(shown)
    assert "policy v1" in shown and "policy@0" not in shown
    assert re.search(r"│\s+policy │\s+1 │\s+3 │", shown), shown  # ls: 3 complete copies
    (m,) = c["models"]
    assert m["model"] == "policy" and m["latest"] == 1 and m["committed"]
    copies = sum(d["complete"] for d in m["per_dc"].values())
    assert copies >= 3  # the publisher and both rollouts
    assert m["bytes_per_s"] is not None  # rollout1 holds the manifest: bytes, not chunks
    assert c["members"]["alive"] >= 5 and c["not_alive_total"] == 0
    assert "cluster.json" in page
    families = {f.name: f for f in text_string_to_metric_families(metrics)}
    fetch = families["tensorhub_fetch_seconds"]
    count = [s for s in fetch.samples if s.name.endswith("_count")]
    assert count[0].labels == {"model": "policy"} and count[0].value == 1
    assert "tensorhub_publisher_stall_seconds" in families  # rollout1 published nothing
    chunks = [s for s in families["tensorhub_chunk_seconds"].samples if s.name.endswith("_count")]
    assert chunks[0].value >= pub.manifest.num_chunks  # every chunk it fetched, timed
    latest = families["tensorhub_latest_version"].samples
    assert [(s.labels["model"], s.value) for s in latest] == [("policy", 1)]


TOPOLOGY = {
    "model": {"dim": 64, "layers": 2, "vocab": 512, "heads": 2, "context": 16},
    # Long enough that the page is read while the run goes on: chaos kills after v1, the
    # test waits for gossip to see it, then a browser loads the page, 10 s before the end
    # here with 48 versions. With 8, the run once ended first and the browser got no page
    # (session 8's fresh-clone run).
    "run": {"versions": 48, "train_steps": 3, "chunk_mb": 0.25, "timeout_s": 300},
    "nodes": [
        {"name": "trainer", "at": "dc1/rack1", "role": "trainer"},
        {"name": "a1", "at": "dc1/rack1", "voter": True},
        {"name": "a2", "at": "dc1/rack2"},
        {"name": "b1", "at": "dc2/rack1"},
        {"name": "b2", "at": "dc2/rack1"},
    ],
    "chaos": {"kill_rollouts": 1, "seed": 5},
    "http": True,
}


def _get_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=5) as r:
        out: dict[str, Any] = json.load(r)
        return out


@pytest.mark.timeout(600)
def test_cluster_page_during_a_launch_shows_the_latest_version_and_a_killed_node(
    tmp_path: Path,
) -> None:
    browser = next((b for b in BROWSERS if shutil.which(b)), None)
    if browser is None:
        pytest.skip("no chromium on this machine (.ci/run installs Debian's chromium)")
    out = io.StringIO()
    console = Console(file=out, width=200, force_terminal=False)
    result: dict[str, Any] = {}
    run = threading.Thread(
        target=lambda: result.update(launch(from_dict(TOPOLOGY), progress=False, console=console)),
        daemon=True,
    )
    run.start()
    deadline = time.monotonic() + 400
    killed = url = None
    while (killed is None or url is None) and time.monotonic() < deadline and run.is_alive():
        text = out.getvalue()
        if killed is None and (m := re.search(r"chaos: killed (\S+)", text)):
            killed = m.group(1)
        # The last page announced: the launcher names another node's if chaos killed it.
        pages = re.findall(r"Cluster page: (\S+)/cluster", out.getvalue())
        url = pages[-1] if pages and killed is not None else None
        time.sleep(0.2)
    assert url and killed, out.getvalue()
    # Wait until gossip has noticed the kill (suspect, then dead), while the run goes on.
    state = None
    while state is None and time.monotonic() < deadline and run.is_alive():
        c = _get_json(f"{url}/cluster.json")
        state = next((n["status"] for n in c["not_alive"] if n["name"] == killed), None)
        time.sleep(0.3)
    assert state in ("suspect", "dead"), (state, out.getvalue())
    shot = os.environ.get("TENSORHUB_SCREENSHOT")  # docs/cluster.png is made this way
    args = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--virtual-time-budget=4000",
    ]
    assert run.is_alive(), "the launch ended before the browser could read its page"
    dom = subprocess.run(
        [*args, "--dump-dom", f"{url}/cluster"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    if shot:
        subprocess.run(
            [*args, "--window-size=1000,700", f"--screenshot={shot}", f"{url}/cluster"],
            capture_output=True,
            timeout=120,
            check=True,
        )
    dumped = time.monotonic()
    run.join(400)
    print(f"the run went on {time.monotonic() - dumped:.1f}s after the page was read")
    assert result.get("ok"), out.getvalue()
    headline = html.unescape(re.sub(r"<[^>]+>", " ", dom.split('id="headline"')[1][:400]))
    m = re.search(r"policy v(\d+)", headline)
    assert m and int(m.group(1)) >= 1, headline
    rows = dom.split('id="not-alive"')[1].split("</table>")[0]
    cells = [html.unescape(re.sub(r"<[^>]+>", "|", r)) for r in rows.split('<tr class="node">')[1:]]
    row = next((r for r in cells if f"|{killed}|" in r), None)
    assert row is not None and re.search(r"\|(suspect|dead)\|", row), cells
