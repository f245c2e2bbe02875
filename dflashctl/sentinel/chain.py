"""Restarts: whether an attempt that has just ended gets another, and why (pure).

The sentinel decides, since it knows how the attempt ended (its verdict, who stopped it and why); the supervisor
then starts the next attempt in a new run directory (agent/launcher.py `relaunch`)."""

from __future__ import annotations

from dflashctl.analysis.watcher import StatusView
from dflashctl.analysis.watchspec import NEVER_RESTART_IDS, Restart
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
    """One line saying why the next attempt starts, or None when none does. An attempt restarts when it ended as
    `--restart-on` names (crashed, stalled) or with a cause it names (a signature id among the attempt's active
    hits); never when it ended with a cause that fails every attempt the same way (import-error) or a config error."""
    if restart is None:
        return None
    kind = ending_kind(view, exit_code)
    if kind is None:
        return None
    causes = [h.signature.id for h in view.health.hits]
    if any(c in NEVER_RESTART_IDS for c in causes):
        return None  # a missing package: the next attempt fails the same way
    cause = next((c for c in causes if c in restart.on), None)
    if kind not in restart.on and cause is None:
        return None
    if exit_code is not None and exit_code in restart.never and kind == "crashed":
        return None  # a usage or config error fails the same way every time
    if attempt > restart.max_restarts:  # attempt 1 is the launch itself; restarts are attempts 2 … max+1
        return None
    what = f"exit code {exit_code}" if kind == "crashed" and exit_code is not None else kind
    if cause is not None:
        what += f", cause {cause}"
    return f"attempt {attempt} {kind} ({what}); restart {attempt} of {restart.max_restarts}"
