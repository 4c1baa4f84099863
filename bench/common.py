"""Helpers shared by the benchmarks: size parsing, medians, tables and JSON output."""

from __future__ import annotations

import os
import platform
import re
import statistics
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from tensorhub.io import files

_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "K": 2**10,
    "M": 2**20,
    "G": 2**30,
}


def parse_size(text: str) -> int:
    """'1GiB' → 1073741824; '256MiB', '100MB', '4096' work too."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError(f"cannot parse size {text!r} (try 1GiB, 256MiB, 100MB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def process_cpu(pid: int) -> float:
    """CPU seconds (user and system) process ``pid`` has used so far, from ``/proc``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def print_table(
    title: str, columns: Sequence[str], rows: Sequence[Sequence[object]], width: int | None = None
) -> None:
    """``width``: the console's, in characters, for tables whose cells must not be cut.
    Written to a file or a pipe (a log, CI), the table is as wide as its cells need: at
    rich's default of 80 columns a wide one was cut to "tenso…" and "1.10…", in the very
    logs a result is read back from later."""
    table = Table(title=title)
    for c in columns:
        table.add_column(c, justify="right" if c != columns[0] else "left")
    for r in rows:
        table.add_row(*(f"{x:.3f}" if isinstance(x, float) else str(x) for x in r))
    console = Console(width=width)
    if width is None and not console.is_terminal:
        wide = console.options.update_width(1 << 16)
        console = Console(width=max(console.width, console.measure(table, options=wide).maximum))
    console.print(table)


def write_json(path: str | None, data: dict[str, Any]) -> None:
    if path:
        files.write_json(path, data)
