"""Small file readers and the one atomic write (stdlib only)."""

from __future__ import annotations

import contextlib
import json
import os


def read_bytes(path: str, limit: int = 1 << 20) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError:
        return None


def read_json(path: str) -> dict | None:
    data = read_bytes(path)
    if data is None:
        return None
    try:
        doc = json.loads(data.decode("utf-8", "replace"))
    except ValueError:
        return {"_unparsed": data.decode("utf-8", "replace")[:2000]}
    return doc if isinstance(doc, dict) else {"_value": doc}


def read_int(path: str) -> int | None:
    data = read_bytes(path, 64)
    try:
        return int(data.strip()) if data else None
    except ValueError:
        return None


def write_atomic(path: str, data: bytes) -> None:
    """path holds either its old content or all of data, never a part (a reader polls `pid`, `exit_code`)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk (ENOSPC), a signal: no `*.tmp-PID` left behind
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def try_write(path: str, data: bytes, unwritten: list) -> bool:
    """write_atomic as bookkeeping that must never stop what matters (a signal already sent, a run already ended):
    a failure is appended to unwritten as "NAME: why" and False returned."""
    try:
        write_atomic(path, data)
        return True
    except OSError as e:
        unwritten.append(f"{os.path.basename(path)}: {e.strerror or e}")
        return False
