"""Type aliases shared across layers."""

from __future__ import annotations

from typing import TypeAlias

# Anything exposing the buffer protocol; memoryview is what the hot paths pass around.
Buffer: TypeAlias = bytes | bytearray | memoryview
