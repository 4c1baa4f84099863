"""Per-node HTTP endpoints: /status, /metrics, and the dashboard in a real headless browser."""

from __future__ import annotations

import asyncio
import html
import re
import shutil
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tensorhub.hub import Hub
from tensorhub.io.tensors import empty_like_manifest
from tensorhub.status_http import StatusServer

from .test_hub import cluster, weights

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


async def _status_and_metrics(hub: Hub) -> tuple[dict[str, Any], str]:
    server = StatusServer(hub)
    url = await server.start()
    try:
        async with aiohttp.ClientSession() as s:
            status = await (await s.get(f"{url}/status")).json()
            metrics = await (await s.get(f"{url}/metrics")).text()
    finally:
        await server.close()
    return status, metrics


async def test_status_and_metrics_describe_versions_holders_and_transfers(tmp_path: Path) -> None:
    async with cluster(tmp_path, rollouts=1) as (voters, (roll,)):
        pub = await voters[0].publish("policy", 1, weights(1), chunk_size=1 << 20)
        await roll.fetch("policy", 1, empty_like_manifest(pub.manifest))
        status, metrics = await _status_and_metrics(roll)
    assert status["name"] == "rollout0" and status["raft"] is None
    (v,) = [v for v in status["versions"] if v["model"] == "policy@0"]
    holders = {h["name"]: h for h in v["holders"]}
    assert holders["voter0"]["origin"] and holders["rollout0"]["complete"]
    assert status["fetches"][0]["bytes"] == pub.manifest.total_bytes
    families = {f.name: f for f in text_string_to_metric_families(metrics)}
    assert families["tensorhub_fetches"].samples[0].value == 1
    assert families["tensorhub_fetch_bytes"].samples[0].value == pub.manifest.total_bytes
    assert families["tensorhub_members_alive"].samples[0].value >= 3


async def test_voter_status_reports_raft(tmp_path: Path) -> None:
    async with cluster(tmp_path, rollouts=0) as (voters, _):
        await voters[0].publish("policy", 1, weights(1, mib=1))
        status, metrics = await _status_and_metrics(voters[1])
    assert status["raft"]["role"] in ("leader", "follower") and status["raft"]["term"] >= 1
    assert "tensorhub_raft_commit_index" in metrics


async def test_dashboard_in_a_headless_browser_shows_versions_and_holders(tmp_path: Path) -> None:
    browser = next((b for b in BROWSERS if shutil.which(b)), None)
    if browser is None:
        pytest.skip("no chromium on this machine (.ci/run installs Debian's chromium)")
    async with cluster(tmp_path, rollouts=2) as (voters, rolls):
        pub = await voters[0].publish("policy", 1, weights(1), chunk_size=1 << 20)
        for r in rolls:
            await r.fetch("policy", 1, empty_like_manifest(pub.manifest))
        await asyncio.sleep(0.3)  # let gossip tell rollout1 what rollout0 holds
        server = StatusServer(rolls[1])
        url = await server.start()
        try:
            proc = await asyncio.create_subprocess_exec(
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                f"--user-data-dir={tmp_path / 'profile'}",
                "--virtual-time-budget=5000",
                "--dump-dom",
                f"{url}/",
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await asyncio.wait_for(proc.communicate(), 120)
        finally:
            await server.close()
    dom = out.decode()
    assert proc.returncode == 0, err.decode()[-2000:]
    body = dom.split('id="versions"')[1].split("</table>")[0]
    rows = [html.unescape(re.sub(r"<[^>]+>", "|", r)) for r in body.split("<tr>")[2:]]
    print("\n".join(rows))
    assert not any("policy@0" in r for r in rows), rows  # users see "policy"
    holders = {r.split("|")[5] for r in rows if "|policy|" in r and "v1" in r}
    assert {"voter0 (publisher)", "rollout0", "rollout1"} <= holders, rows
    assert "rollout1" in dom.split('id="node"')[1][:200]  # the page names its node
