"""The code's fingerprint: a sha256 of the .py files a connection master runs, by relative path and content.

A master's key carries it (masterwire.connection_key), so a CLI whose code changed — an upgrade, an edited checkout —
never talks to a master still running the old code: it starts its own, and the old one ends at its idle time or at
`hosts disconnect`. Contents, not mtimes: a reinstall of the same code keeps the master, any edit of its code does
not. MASTER_CODE is every part of dflashctl the master process imports (tests/remote/test_master_trust.py checks
that list against a real master's sys.modules); hashing those instead of the whole package keeps the per-command
cost to a few milliseconds.
"""

from __future__ import annotations

import hashlib
import os
from functools import cache
from pathlib import Path

import dflashctl

PACKAGE_DIR = Path(dflashctl.__file__).resolve().parent
MASTER_CODE = ("__init__.py", "errors.py", "model.py", "remote")  # what `python -m dflashctl.remote.master` imports


def source_files(root: Path, parts: tuple[str, ...]) -> list[Path]:
    """The .py files of `parts` (files or folders, relative to root), sorted by relative path, caches left out."""
    found = []
    for part in parts:
        path = root / part
        if path.is_file():
            found.append(path)
            continue
        for folder, dirs, files in os.walk(path):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            found += [Path(folder) / f for f in files if f.endswith(".py")]
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def source_fingerprint(root: Path, parts: tuple[str, ...]) -> str:
    """sha256 over (relative path, length, bytes) of each file of source_files: 64 hex digits."""
    h = hashlib.sha256()
    for path in source_files(root, parts):
        data = path.read_bytes()
        name = path.relative_to(root).as_posix().encode()
        h.update(b"%d:%s:%d:" % (len(name), name, len(data)))
        h.update(data)
    return h.hexdigest()


@cache
def code_fingerprint() -> str:
    """The master's code in this installation (computed once a process)."""
    return source_fingerprint(PACKAGE_DIR, MASTER_CODE)
