"""Event-loop choice: uvloop where installed, the default asyncio loop otherwise.

Only entry points call this; library code runs on whatever loop the caller has.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_name() -> str:
    return type(asyncio.get_running_loop()).__module__.split(".")[0]


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on uvloop if it is importable, else on asyncio's default loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a hard dependency on Linux
        return asyncio.run(main)
    return uvloop.run(main)


def new_loop() -> asyncio.AbstractEventLoop:
    """A fresh event loop (uvloop where installed) for a thread of its own."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
