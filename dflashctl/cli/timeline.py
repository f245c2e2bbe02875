"""The sentinel's timeline (<run>/events.jsonl) as `status`, `status --events`, `runs` and `logs --events` show it,
and desktop notifications for `status --watch --notify-desktop`."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.text import Text

KIND_STYLE = {"worker-crashed": "bold red", "policy": "bold magenta", "stalled": "bold yellow",
              "idle-gpus": "yellow", "signature": "red", "ended": "bold", "restart": "bold cyan",
              "notify-failed": "yellow", "first-step": "green", "verdict": "", "sentinel": "dim"}


def _when(t: object) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) if isinstance(t, int | float) and t > 0 else "--:--:--"


def render_events(events: Sequence[Mapping[str, Any]], *, limit: int | None = None) -> RenderableType:
    """One line per event, oldest first (the last `limit` when given)."""
    shown = list(events)[-limit:] if limit else list(events)
    title = Text("events", style="bold")
    if limit and len(events) > len(shown):
        title.append(f" (last {len(shown)} of {len(events)}; all: status --events)", style="dim")
    lines: list[RenderableType] = [title]
    for ev in shown:
        kind = str(ev.get("kind") or "?")
        line = Text(f"  {_when(ev.get('t'))}  ")
        line.append(f"{kind:<14}", style=KIND_STYLE.get(kind, ""))
        line.append(f" {escape(str(ev.get('message') or ''))[:220]}")
        lines.append(line)
    if not shown:
        lines.append(Text("  none yet (the run's sentinel writes <run>/events.jsonl)", style="dim"))
    return Group(*lines)


def render_capture(cap: Mapping[str, Any]) -> RenderableType:
    """The sentinel's stall capture, short: each thread's innermost frame and its line of code."""
    title = Text("stacks", style="bold")
    title.append(f" (captured {_when(cap.get('time'))}, {cap.get('reason') or 'stalled'}; saved in {cap.get('path')};"
                 " live: dflashctl stacks)", style="dim")
    lines: list[RenderableType] = [title]
    for proc in cap.get("processes") or []:
        if not proc.get("threads"):
            lines.append(Text(f"  pid {proc.get('pid')} ({proc.get('role')}): {proc.get('error') or 'no stacks'}",
                              style="yellow"))
        for t in proc.get("threads") or []:
            top = (t.get("frames") or [{}])[0]
            where = f"{top.get('function', '?')} ({str(top.get('file', '?')).rsplit('/', 1)[-1]}:{top.get('line')})"
            line = Text(f"  {t.get('thread')}", style="bold cyan")
            line.append(f"  {where}")
            if top.get("code"):
                line.append(f"  {escape(str(top['code']))[:100]}", style="dim")
            lines.append(line)
    return Group(*lines)


def desktop_notify(title: str, body: str) -> str | None:
    """Raise a desktop notification where the platform has one (notify-send, osascript); the reason it cannot,
    else None. Never raises: a watch goes on without it."""
    try:
        if sys.platform == "darwin" and shutil.which("osascript"):
            script = f"display notification {_applescript(body)} with title {_applescript(title)}"
            subprocess.run(["osascript", "-e", script], timeout=5, capture_output=True, check=True)
            return None
        if shutil.which("notify-send"):
            subprocess.run(["notify-send", "--app-name=dflashctl", "--urgency=critical", title, body], timeout=5,
                           capture_output=True, check=True)
            return None
    except (OSError, subprocess.SubprocessError) as e:
        return f"desktop notification failed: {e}"
    return "no desktop notifier here (install libnotify's notify-send)"


def _applescript(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
