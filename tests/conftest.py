"""Shared fixtures: every async test runs on both asyncio's default loop and uvloop."""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Callable

import pytest
import uvloop
from hypothesis import HealthCheck, settings

from tensorhub.io import ucx

from . import progress

ucx.loopback_defaults()  # before any UCX context exists: UCX over loopback TCP in tests

settings.register_profile(
    "ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=100, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


def pytest_configure(config: pytest.Config) -> None:
    progress.pytest_configure(config)  # each test's start and end, written as they come


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Run every async test on the default loop and on uvloop."""
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    """A per-test random seed, printed so any failure can be replayed with TENSORHUB_SEED."""
    value = int(os.environ.get("TENSORHUB_SEED", random.SystemRandom().randrange(2**32)))
    print(f"\n[seed] {request.node.nodeid}: TENSORHUB_SEED={value}")
    progress.note("seed", request.node.nodeid, str(value))  # (a run killed in it keeps the seed)
    return value


@pytest.fixture(params=["tcp", "ucx"])
def transport(request: pytest.FixtureRequest) -> str:
    """Run a transfer test over TCP and over UCX (loopback TCP under UCX here)."""
    if request.param == "ucx" and not ucx.available():
        pytest.skip("UCX transport: ucxx is not installed (pip install 'tensorhub[ucx]')")
    return str(request.param)
