"""The drawing of `dflashctl gpus`: the table (one-shot), plain rows (a piped watch) and the pieces the live screen
(cli/gpustui.py) is made of. One record, analysis/hostgpus.HostView, feeds all three and `--json`."""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from dflashctl.analysis.hostgpus import CURRENT, EARLIER, GONE, NONE, OTHER, HostGpu, HostProc, HostView
from dflashctl.model import GpuFinding

FINDING_STYLE = {GpuFinding.BUSY: "green", GpuFinding.IDLE: "dim", GpuFinding.IDLE_ALLOCATED: "bold yellow",
                 GpuFinding.SPINNING: "bold yellow", GpuFinding.ORPHANED: "bold red"}
ROLE_STYLE = {CURRENT: "bold green", EARLIER: "bold red", OTHER: "cyan", NONE: "", GONE: "dim"}
SEEN_FROM = {"host": "seen from the Proxmox host", "machine": "seen from the machine itself",
             "container": "seen from inside the container only"}


def num(v: float | None, unit: str = "", fmt: str = "{:.0f}") -> str:
    return "-" if v is None else fmt.format(v) + unit


def memory(g: HostGpu) -> str:
    s = g.sample
    return f"{num(s.memory_used_mib)} / {num(s.memory_total_mib)} MiB"


def where(p: HostProc) -> str:
    """`ct 200 pid 57`, `host`, or `?` (gone)."""
    if p.role == GONE:
        return "?"
    if p.container is None:
        return "host" if p.ns_pid == p.pid else "here"
    return f"ct {p.container} pid {p.ns_pid if p.ns_pid is not None else '?'}"


def run_cell(p: HostProc) -> str:
    if p.role == CURRENT:
        return f"current {p.run_id}"
    if p.role == EARLIER:
        return f"earlier {p.run_id} (zombie)"
    if p.role == OTHER:
        return f"other {p.run_id}"
    return "none" if p.role == NONE else "gone"


def title(view: HostView) -> Text:
    t = Text(f"{view.host}", style="bold")
    t.append(f"  {SEEN_FROM.get(view.seen_from, view.seen_from)}", style="dim")
    if view.container:
        t.append(f"  container {view.container}", style="dim")
    t.append(f"  live run: {view.runs.current or 'none'}", style="dim")
    if view.time:
        t.append(f"  {time.strftime('%H:%M:%S', time.localtime(view.time))}", style="dim")
    return t


def proc_row(p: HostProc) -> list[str | Text]:
    return ["", Text(f"└ {p.pid}", style="dim"), where(p), p.user or "-", num(p.used_memory_mib, " MiB"),
            Text(run_cell(p), style=ROLE_STYLE.get(p.role, "")), escape(p.cmdline[:120])]


def render_table(view: HostView) -> RenderableType:
    """One row per GPU, its processes under it, then what to do and what could not be seen."""
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for col in ("GPU", "NAME / PID", "MEMORY / WHERE", "UTIL / USER", "POWER / MEM", "TEMP / RUN", "FINDING / CMD"):
        table.add_column(col, no_wrap=col != "FINDING / CMD")
    for g in view.gpus:
        s = g.sample
        finding = Text(str(g.finding), style=FINDING_STYLE.get(g.finding, "")) if g.finding else Text("-")
        if g.health:
            finding.append("  " + ",".join(g.health), style="yellow")
        table.add_row(str(s.index), escape(s.name or "-"), memory(g), num(s.utilization_pct, " %"),
                      num(s.power_w, " W"), num(g.temperature_c, " °C"), finding)
        for p in g.procs:
            table.add_row(*proc_row(p))
    if view.unplaced:
        table.add_row("?", Text("GPU unknown", style="dim"), "", "", "", "", "")
        for p in view.unplaced:
            table.add_row(*proc_row(p))
    parts: list[RenderableType] = [title(view), table]
    parts += remedies(view)
    if not view.gpus and not view.unplaced:
        parts.append(Text("no GPUs visible", style="dim"))
    return Group(*parts)


def remedies(view: HostView) -> list[Text]:
    out: list[Text] = []
    for g in view.gpus:
        if g.remedy:
            out.append(Text(f"GPU {g.sample.index}: {g.remedy}", style="yellow"))
    for p in view.procs:
        if p.role in (EARLIER, OTHER) or (p.role == NONE and p.container == view.container):
            out.append(Text(f"pid {p.pid} ({where(p)}): {p.remedy}", style="red" if p.zombie else "dim"))
    for n in view.notes:
        out.append(Text(f"note: {n}", style="dim"))
    return out


def plain_rows(view: HostView) -> list[str]:
    """One line per GPU and per process, no colour, nothing redrawn: a piped `--watch` prints these per reading."""
    when = time.strftime("%H:%M:%S", time.localtime(view.time)) if view.time else "--:--:--"
    lines = [f"{when} {view.host} ({view.seen_from}) live run: {view.runs.current or 'none'}"]
    for g in view.gpus:
        s = g.sample
        lines.append(f"{when} gpu {s.index} {s.name or '-'} mem {memory(g)} util {num(s.utilization_pct, '%')} "
                     f"power {num(s.power_w, 'W')} temp {num(g.temperature_c, 'C')} "
                     f"{g.finding or '-'}{' ' + ','.join(g.health) if g.health else ''}")
        lines += [f"{when}   pid {p.pid} {where(p)} {p.user or '-'} {num(p.used_memory_mib, 'MiB')} "
                  f"run {run_cell(p)} {p.cmdline[:100]}" for p in g.procs]
    lines += [f"{when}   pid {p.pid} {where(p)} gpu ? run {run_cell(p)} {p.cmdline[:100]}" for p in view.unplaced]
    lines += [f"{when} note: {n}" for n in view.notes]
    return lines


def proc_order(procs: Sequence[HostProc], key: str) -> list[HostProc]:
    """A GPU's processes in the chosen order: memory (largest first), pid, container, run."""
    if key == "pid":
        return sorted(procs, key=lambda p: p.pid)
    if key == "container":
        return sorted(procs, key=lambda p: (p.container or "", p.pid))
    if key == "run":
        order = [CURRENT, EARLIER, OTHER, NONE, GONE]
        return sorted(procs, key=lambda p: (order.index(p.role) if p.role in order else 9, p.pid))
    return sorted(procs, key=lambda p: (-(p.used_memory_mib or 0.0), p.pid))
