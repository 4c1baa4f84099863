"""The data plane's presets: the node's settings, and the simulator's named departures."""

from __future__ import annotations

import dataclasses

import pytest

from sim.swarm import SwarmConfig
from tensorhub.core.swarm.presets import (
    DEPARTURES,
    NODE,
    PRESETS,
    RELAY,
    SIMULATED,
    DataPlaneConfig,
    differences,
    preset,
)
from tensorhub.dataplane.swarm import SWARM_CONFIG
from tensorhub.dataplane.upload_grants import UploadGrants
from tensorhub.hub import SUPER_SEED_AFTER, Hub


def test_the_simulator_departs_from_the_node_only_where_it_says_why() -> None:
    assert differences(SIMULATED, NODE) == set(DEPARTURES)
    assert all(len(why) > 40 for why in DEPARTURES.values())


def test_the_simulator_runs_its_preset_by_default() -> None:
    assert SwarmConfig().dataplane() == SIMULATED


def test_the_node_runs_its_preset() -> None:
    uploads = UploadGrants()
    got = DataPlaneConfig(
        planner=SWARM_CONFIG,
        upload_slots=uploads.policy.slots,
        max_waiting=uploads.policy.max_waiting,
        near_waiting=None,  # (the Hub sets the rack's limit from gossip: as for anyone)
        uploads_per_peer=uploads.policy.per_peer,
        reserve_after=SUPER_SEED_AFTER,
        seed_spare=NODE.seed_spare,
        cut_through=NODE.cut_through,  # (Node.start hands it to each PeerHandler)
        park_starting=NODE.park_starting,  # (the same)
    )
    assert got == NODE
    assert uploads.policy.near_waiting == uploads.policy.max_waiting


def test_differences_names_nested_settings() -> None:
    other = dataclasses.replace(NODE, planner=dataclasses.replace(NODE.planner, total=1))
    assert differences(other, NODE) == {"planner.total"}
    assert differences(dataclasses.replace(NODE, seed_spare=True), NODE) == {"seed_spare"}


@pytest.mark.parametrize("name", sorted(PRESETS))
async def test_a_hub_runs_the_preset_it_is_given(name: str) -> None:
    """A preset chosen by name reaches every setting it names: the upload slots and queue
    limits, the super-seeder's, and the fetch planner's (bench/linerate.py compares presets
    in one run this way)."""
    hub = await Hub.start("p", secret="s" * 32, dataplane=name)
    try:
        grants = hub.node.upload_grants.policy
        got = DataPlaneConfig(
            planner=hub.node.dataplane.planner,
            upload_slots=grants.slots,
            max_waiting=grants.max_waiting,
            near_waiting=None if grants.near_waiting == grants.max_waiting else grants.near_waiting,
            uploads_per_peer=grants.per_peer,
            reserve_after=hub.super_seed_after,
            seed_spare=hub.seed_spare,
            cut_through=hub.node.dataplane.cut_through,  # (what each PeerHandler is given)
            park_starting=hub.node.dataplane.park_starting,  # (the same)
        )
        assert got == PRESETS[name]
    finally:
        await hub.close()
    with pytest.raises(ValueError, match="no data-plane preset 'fast'"):
        preset("fast")


def test_the_simulator_can_run_any_preset() -> None:
    """sim/fanout.py runs the node's preset in the simulator: SwarmConfig.of inverts
    SwarmConfig.dataplane."""
    assert SwarmConfig.of(NODE).dataplane() == NODE
    assert SwarmConfig.of(SIMULATED, chunks=8).dataplane() == SIMULATED
    assert SwarmConfig.of(RELAY).dataplane() == RELAY


def test_a_preset_name_may_change_settings_and_bad_ones_are_named() -> None:
    """``node:max_waiting=8`` is NODE with one setting changed: how an experiment passes
    one configuration, as a string, to every process of a run (bench/linerate.py)."""
    assert preset("node:max_waiting=8") == dataclasses.replace(NODE, max_waiting=8)
    two = preset("relay:planner.per_source=2:seed_spare=true:reserve_after=0.5")
    assert (two.planner.per_source, two.seed_spare, two.reserve_after) == (2, True, 0.5)
    assert two.planner.relay  # the rest is the base preset's
    assert preset("simulated:near_waiting=none").near_waiting is None
    for bad, why in [
        ("nod", "no data-plane preset"),
        ("node:bogus=1", "not a known setting"),
        ("node:max_waiting", "not a known setting"),
        ("node:max_waiting=x", "not a number"),
        ("node:seed_spare=3", "not true or false"),
        ("node:max_waiting=none", "cannot be none"),
        ("node:max_waiting=true", "not a number"),  # a count is not a flag
        ("node:max_waiting=8.5", "not a number"),  # nor a fraction
    ]:
        with pytest.raises(ValueError, match=why):
            preset(bad)
