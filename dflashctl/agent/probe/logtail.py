"""The probe's the log bytes past an offset, noticing truncation and rotation."""

from __future__ import annotations

import base64
import os


def read_log(path: str, offset: int | None, max_bytes: int, inode: int | None = None) -> dict | None:
    """New bytes of `path` from `offset` (None: the last max_bytes). If the file shrank below the
    offset or is a different file (inode), start again at 0 and say "rotated"."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed by the `with f` below
    except OSError:
        return None
    with f:
        st = os.fstat(f.fileno())
        rotated = False
        if offset is None:
            offset = max(0, st.st_size - max_bytes)
        elif st.st_size < offset or (inode is not None and inode != st.st_ino):
            offset, rotated = 0, True
        f.seek(offset)
        data = f.read(max(0, min(max_bytes, st.st_size - offset)))
    return {
        "path": path,
        "size": st.st_size,
        "inode": st.st_ino,
        "mtime": st.st_mtime,  # when the log last grew: status's "last log N s ago" on a first look
        "offset": offset,
        "next_offset": offset + len(data),
        "data_b64": base64.b64encode(data).decode("ascii"),
        "rotated": rotated,
    }
