"""Restarts: whether an attempt that has just ended gets another, and why (pure).

The sentinel decides, since it knows how the attempt ended (its verdict, who stopped it and why); the supervisor
then starts the next attempt in a new run directory (agent/launcher.py `relaunch`)."""

from __future__ import annotations

from dflashctl.analysis.watcher import StatusView
from dflashctl.analysis.watchspec import Restart
from dflashctl.model import Verdict


def ending_kind(view: StatusView, exit_code: int | None) -> str | None:
    """"crashed" or "stalled" (what --restart-on names), or None for an ending that is neither: finished, stopped
    by the user. A run the failure policy stopped for a dead worker counts as crashed, for idling or not
    stepping as stalled."""
    run = view.run
    by = (run.stopped_by or {}) if run is not None else {}
    if run is not None and run.stopped:
        if by.get("by") != "sentinel":
            return None  # the user stopped it: never restarted
        return "crashed" if by.get("reason") == "worker-failure" else "stalled"
    if view.health.verdict in (Verdict.CRASHED, Verdict.LOST) or (exit_code not in (None, 0)):
        return "crashed"
    return None


def restart_why(restart: Restart | None, attempt: int, view: StatusView, exit_code: int | None) -> str | None:
    """One line saying why the next attempt starts, or None when none does."""
    if restart is None:
        return None
    kind = ending_kind(view, exit_code)
    if kind is None or kind not in restart.on:
        return None
    if exit_code is not None and exit_code in restart.never and kind == "crashed":
        return None  # a usage or config error fails the same way every time
    if attempt > restart.max_restarts:  # attempt 1 is the launch itself; restarts are attempts 2 … max+1
        return None
    what = f"exit code {exit_code}" if kind == "crashed" and exit_code is not None else kind
    return f"attempt {attempt} {kind} ({what}); restart {attempt} of {restart.max_restarts}"
