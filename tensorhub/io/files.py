"""Durable file writes."""

from __future__ import annotations

import json
import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Make a rename or a new file in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves the old or the new file, whole.

    Writes a temporary file, fsyncs it, renames it over ``path`` and fsyncs the directory.
    Raises OSError (a full disk, say) with ``path`` untouched.
    """
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_json(path: str | Path, data: object) -> None:
    """Write ``data`` as indented JSON, atomically (results files that tools read)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(p, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())
