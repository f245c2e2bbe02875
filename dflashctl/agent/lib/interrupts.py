"""Catchable signals as exceptions while a temporary folder exists, and folders an uncatchable one left (stdlib).

A transfer (export's `.NAME.part-PID` on the laptop, deploy's `.code/.tmp-PID-T` in the container) cleans its
temporary folder in a `finally`/`except BaseException`; Python runs those for Ctrl-C only. `raising_on_signals`
turns SIGTERM and SIGHUP (a closed terminal, a dropped ssh session, `kill`) into `Interrupted` for the duration, so
the same cleanup runs for every signal a process can catch. SIGKILL cannot be caught: the next run of the same
command calls `remove_dead_leftovers`, which removes the folders whose PID (in their name) no longer runs.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import threading
from collections.abc import Iterator

CAUGHT = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


class Interrupted(KeyboardInterrupt):
    """A catchable signal arrived during a transfer (a KeyboardInterrupt: the CLI's boundary ends with 130)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


@contextlib.contextmanager
def raising_on_signals() -> Iterator[None]:
    """SIGTERM / SIGHUP / SIGINT raise Interrupted in the main thread while inside; the old handlers come back after.
    Elsewhere than in the main thread (Python only lets that one set handlers) it changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: object) -> None:
        raise Interrupted(signum)

    old = {s: signal.getsignal(s) for s in CAUGHT}
    for s in CAUGHT:
        if old[s] is not signal.SIG_IGN:  # nohup's SIGHUP stays ignored
            signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def remove_dead_leftovers(folder: str, pattern: re.Pattern[str]) -> list[str]:
    """Remove the directories in folder whose name matches pattern (its group `pid` a process id) and whose process
    is gone; the paths removed. A folder of a live process (a transfer running now) is never touched."""
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        m = pattern.fullmatch(name)
        path = os.path.join(folder, name)
        if m is None or int(m.group("pid")) == os.getpid() or pid_alive(int(m.group("pid"))):
            continue
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed

