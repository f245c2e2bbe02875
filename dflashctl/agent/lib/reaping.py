"""Ending a process group: SIGTERM, grace, SIGKILL, then wait until no member is alive (stdlib only).

A signal is delivered after kill() returns, so "signalled" is not "gone": both the supervisor (before it writes
`exit_code`) and `dflashctl stop` wait until the group has no live member. Defunct members count as gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

from dflashctl.agent.lib.procfs import group_live

KILL_WAIT_S = 5.0  # after SIGKILL: only a process stuck in the kernel (state D) outlives this


def wait_group_gone(pgid: int, timeout: float, poll: float = 0.1) -> bool:
    """Wait until group pgid has no live member, at most timeout seconds; True when it has none."""
    deadline = time.time() + timeout
    while group_live(pgid):
        if time.time() >= deadline:
            return False
        time.sleep(poll)
    return True


def end_group(pgid: int, grace_s: float, kill_wait_s: float = KILL_WAIT_S) -> bool | None:
    """SIGTERM group pgid, wait up to grace_s, then SIGKILL it and wait up to kill_wait_s for it to be gone.
    None: there is no such group (nothing was signalled); False: it ended within the grace; True: SIGKILLed."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except OSError:
        return None
    if wait_group_gone(pgid, grace_s):
        return False
    with contextlib.suppress(OSError):
        os.killpg(pgid, signal.SIGKILL)
    wait_group_gone(pgid, kill_wait_s, poll=0.02)
    return True
