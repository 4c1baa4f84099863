"""The bench harness starts timing only once every node's gossip holds every other alive
(HubProcs.wait_members): fetches that began on a partial view built their relay chains
from it (bench/linerate.py, N=8, 1 GiB: 1.46-2.0x one copy in such rounds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorhub.testing.hub_procs import HubProcs, Spec, lacking


def test_lacking_names_each_node_and_the_members_it_does_not_hold_alive() -> None:
    views = {
        "a": {"a": "alive", "b": "alive", "c": "suspect"},
        "b": {"a": "alive", "b": "alive", "c": "alive"},
        "c": {"c": "alive", "a": "dead"},  # b unknown to c
    }
    assert lacking(views) == {"a": ["c"], "c": ["a", "b"]}
    assert lacking({"a": {"a": "alive", "b": "alive"}, "b": {"a": "alive"}}) == {}


@pytest.mark.timeout(300)
def test_wait_members_returns_once_every_view_holds_every_node_alive(tmp_path: Path) -> None:
    specs = [
        Spec("voter", "dc0/rack0/voter", voter=True),
        Spec("a", "dc0/rack0/a"),
        Spec("b", "dc0/rack1/b"),
    ]
    with HubProcs(specs, str(tmp_path)) as c:
        c.call(["voter"], "publish", "m", 1, 4 << 20, 1)
        c.call(["a", "b"], "prepare", "m", 1, None)  # (zeroed off the event loop)
        names = ["voter", "a", "b"]
        waited = c.wait_members(names)
        print(f"membership converged {waited:.3f} s after the destinations were allocated")
        views = {n: view for n, (view,) in zip(names, c.call(names, "view"), strict=True)}
        assert lacking(views) == {}
        assert set(views["a"]) >= set(names)
