"""inotify through ctypes (stdlib only): a file descriptor that becomes readable when a watched directory changes.

Why not stat polling: a probe that sleeps in select() on this costs nothing while the run is quiet and wakes within
a millisecond of a write. Where the kernel or libc lacks it (not Linux, no ctypes, a full watch table), open_dir
returns None and the caller polls with stat instead.
"""

from __future__ import annotations

import os

try:
    import ctypes
    import ctypes.util
except ImportError:  # a Python built without ctypes
    ctypes = None  # type: ignore[assignment]

IN_MODIFY = 0x002
IN_CLOSE_WRITE = 0x008
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
DIR_EVENTS = IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_DELETE_SELF | IN_MOVE_SELF

_libc = None


def _load():  # noqa: ANN202 - a ctypes.CDLL or None
    global _libc
    if _libc is None:
        _libc = False
        if ctypes is not None:
            try:
                lib = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
                lib.inotify_init1.argtypes = [ctypes.c_int]
                lib.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
                _libc = lib
            except (OSError, AttributeError):
                pass
    return _libc or None


class DirWatch:
    """One inotify instance watching one directory (a run's: its train.log and exit_code live there)."""

    def __init__(self, fd: int, path: str):
        self.fd, self.path = fd, path

    def drain(self) -> int:
        """Read every queued event (their details do not matter: the caller looks at the files); bytes read."""
        n = 0
        while True:
            try:
                got = os.read(self.fd, 65536)
            except BlockingIOError:
                return n
            except OSError:
                return n
            if not got:
                return n
            n += len(got)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def open_dir(path: str) -> DirWatch | None:
    """A watch on directory `path`, or None where inotify is not to be had (the caller falls back to stat)."""
    lib = _load()
    if lib is None:
        return None
    fd = lib.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
    if fd < 0:
        return None
    if lib.inotify_add_watch(fd, os.fsencode(path), DIR_EVENTS) < 0:
        os.close(fd)
        return None
    return DirWatch(fd, path)
