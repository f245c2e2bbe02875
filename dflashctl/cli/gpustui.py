"""`dflashctl gpus --watch` on a terminal: a live full-screen view in the spirit of nvitop, built on rich (Live on the
alternate screen) and a raw-mode key reader (termios cbreak + select; stdlib). Per GPU: bars for memory and
utilisation, sparklines of the readings kept (the last minutes), the processes under it; keys select a process (its
whole command line and what to do show at the bottom), change the processes' order, and `q` leaves.

Why not a TUI library (textual, urwid, curses): rich is already a dependency and draws everything else we show; a
screen of text redrawn per reading plus four keys needs no widget tree, and curses would be a second way to draw.
"""

from __future__ import annotations

import contextlib
import os
import queue
import select
import sys
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.text import Text

from dflashctl.analysis.hostgpus import HostProc, HostView
from dflashctl.cli.gpusview import FINDING_STYLE, ROLE_STYLE, memory, num, proc_order, run_cell, title, where
from dflashctl.cli.spark import bar, spark

SORTS = ("memory", "pid", "container", "run")
BAR_WIDTH = 30
SPARK_WIDTH = 40  # readings drawn per sparkline: 80 s at the default 2 s interval
KEEP = 300  # readings kept per GPU (10 minutes at 2 s)
HELP = "keys: ↑/↓ or j/k select a process · s sort · q quit"


@dataclass
class Screen:
    """What the live view shows: the latest view, each GPU's history, the chosen order and the selected process."""

    view: HostView | None = None
    sort: str = SORTS[0]
    selected: int = 0
    util: dict[int, deque[float | None]] = field(default_factory=dict)
    mem: dict[int, deque[float | None]] = field(default_factory=dict)
    error: str | None = None

    def update(self, view: HostView) -> None:
        self.view = view
        for g in view.gpus:
            s = g.sample
            share = None if s.memory_used_mib is None or not s.memory_total_mib else \
                100.0 * s.memory_used_mib / s.memory_total_mib
            self.util.setdefault(s.index, deque(maxlen=KEEP)).append(s.utilization_pct)
            self.mem.setdefault(s.index, deque(maxlen=KEEP)).append(share)
        self.selected = min(self.selected, max(0, len(self.procs()) - 1))

    def procs(self) -> list[HostProc]:
        """Every process in screen order (by GPU, then the chosen order): what ↑/↓ move through."""
        if self.view is None:
            return []
        return [p for g in self.view.gpus for p in proc_order(g.procs, self.sort)] + \
            proc_order(self.view.unplaced, self.sort)

    def key(self, k: str) -> bool:
        """Apply one key; False when it asks to leave."""
        if k in ("q", "Q", "\x03"):
            return False
        n = len(self.procs())
        if k in ("down", "j") and n:
            self.selected = (self.selected + 1) % n
        elif k in ("up", "k") and n:
            self.selected = (self.selected - 1) % n
        elif k == "s":
            self.sort = SORTS[(SORTS.index(self.sort) + 1) % len(SORTS)]
        return True

    def render(self) -> RenderableType:
        head = Text("dflashctl gpus  ", style="bold cyan")
        if self.view is None:
            return Group(head + Text("waiting for the first reading…", style="dim"), Text(HELP, style="dim"))
        head.append_text(title(self.view))
        lines: list[RenderableType] = [head, Text(f"{HELP} · order: {self.sort}", style="dim"), Text("")]
        chosen = self.procs()[self.selected] if self.procs() else None
        for g in self.view.gpus:
            s = g.sample
            line = Text(f"GPU {s.index}  ", style="bold")
            line.append(f"{s.name or '-'}  ")
            line.append(str(g.finding) if g.finding else "-", style=FINDING_STYLE.get(g.finding, "") if g.finding
                        else "dim")
            line.append(f"  {num(s.power_w, ' W')}  {num(g.temperature_c, ' °C')}")
            if g.health:
                line.append("  " + ",".join(g.health), style="yellow")
            lines.append(line)
            mem_pct = None if s.memory_used_mib is None or not s.memory_total_mib else \
                100 * s.memory_used_mib / s.memory_total_mib
            lines.append(Text(f"  MEM  {bar(s.memory_used_mib, s.memory_total_mib, BAR_WIDTH)} "
                              f"{memory(g):>20} {num(mem_pct, '%'):>4}  "
                              f"{spark(list(self.mem.get(s.index, ())), SPARK_WIDTH)}"))
            lines.append(Text(f"  UTIL {bar(s.utilization_pct, 100.0, BAR_WIDTH)} "
                              f"{num(s.utilization_pct, ' %'):>20} {'':>4}  "
                              f"{spark(list(self.util.get(s.index, ())), SPARK_WIDTH)}"))
            for p in proc_order(g.procs, self.sort):
                lines.append(self._proc_line(p, p is chosen))
            if g.remedy:
                lines.append(Text(f"  → {g.remedy}", style="yellow"))
        if self.view.unplaced:
            lines.append(Text("GPU ?  (the driver lists no processes here)", style="bold"))
            lines += [self._proc_line(p, p is chosen) for p in proc_order(self.view.unplaced, self.sort)]
        lines.append(Text(""))
        if chosen is not None:
            sel = Text(f"selected: pid {chosen.pid} · {where(chosen)} · {chosen.user or '-'} · ", style="bold")
            sel.append(run_cell(chosen), style=ROLE_STYLE.get(chosen.role, ""))
            lines += [sel, Text(f"  cmdline: {escape(chosen.cmdline)[:300]}")]
            if chosen.remedy:
                lines.append(Text(f"  what to do: {chosen.remedy}", style="yellow"))
        for n in self.view.notes:
            lines.append(Text(f"note: {n}", style="dim"))
        if self.error:
            lines.append(Text(f"ERROR: {self.error}", style="bold red"))
        return Group(*lines)

    @staticmethod
    def _proc_line(p: HostProc, chosen: bool) -> Text:
        t = Text("  ▶ " if chosen else "    ", style="bold reverse" if chosen else "")
        t.append(f"{p.pid:>8}  {where(p):<22} {(p.user or '-')[:10]:<10} {num(p.used_memory_mib, ' MiB'):>10}  ",
                 style="reverse" if chosen else "")
        t.append(f"{run_cell(p):<38}", style=(ROLE_STYLE.get(p.role, "") + (" reverse" if chosen else "")).strip())
        t.append(f" {escape(p.cmdline)[:48]}", style="reverse" if chosen else "")
        return t


class KeyReader:
    """Keys one at a time from a terminal's stdin (cbreak: no echo, no line buffering), restored on exit; reads
    nothing where stdin is not a terminal (Ctrl-C still leaves)."""

    _ARROWS = {"\x1b[A": "up", "\x1b[B": "down", "\x1bOA": "up", "\x1bOB": "down"}

    def __init__(self) -> None:
        self.fd: int | None = None
        self.saved: list | None = None

    def __enter__(self) -> KeyReader:
        if sys.stdin.isatty():
            import termios
            import tty

            self.fd = sys.stdin.fileno()
            self.saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None and self.saved is not None:
            import termios

            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)

    def read(self, timeout: float) -> list[str]:
        """The keys pressed within timeout seconds (arrows as "up"/"down"), [] when none."""
        if self.fd is None:
            threading.Event().wait(timeout)
            return []
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return []
        data = os.read(self.fd, 64).decode("utf-8", "replace")
        keys: list[str] = []
        while data:
            seq = next((s for s in self._ARROWS if data.startswith(s)), None)
            if seq is not None:
                keys.append(self._ARROWS[seq])
                data = data[len(seq):]
            else:
                keys.append(data[0])
                data = data[1:]
        return keys


def _pull(views: Iterator[HostView], into: queue.Queue) -> None:
    """The readings, as they come, onto the queue (then None); an error as its message."""
    try:
        for view in views:
            into.put(view)
    except Exception as e:  # noqa: BLE001 - shown on the screen, the view stays up until q
        into.put(str(getattr(e, "message", e)) or type(e).__name__)
    into.put(None)


def run_tui(views: Iterator[HostView]) -> None:
    """The live screen until `q` (or Ctrl-C): redrawn on each reading and each key."""
    from rich.live import Live

    from dflashctl.cli.common import rich_console

    screen = Screen()
    got: queue.Queue = queue.Queue()
    threading.Thread(target=_pull, args=(views, got), name="gpus-watch", daemon=True).start()
    with KeyReader() as keys, Live(screen.render(), console=rich_console(), screen=True, auto_refresh=False,
                                   vertical_overflow="crop") as live:
        going = True
        while going:
            changed = False
            for k in keys.read(0.1):
                going = going and screen.key(k)
                changed = True
            with contextlib.suppress(queue.Empty):
                while True:
                    item = got.get_nowait()
                    if isinstance(item, HostView):
                        screen.update(item)
                    elif isinstance(item, str):
                        screen.error = item
                    changed = True
            if changed and going:
                live.update(screen.render(), refresh=True)
