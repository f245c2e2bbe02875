"""The one renderer of status, --watch, --all and diagnose (rich); imported only by a verb that draws a table.

Kept apart from cli/status.py so that registering the verbs (every `dflashctl` start, issue 16) imports no rich and
no analysis module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from dflashctl.analysis.cause import cause_of
from dflashctl.analysis.gpuwindow import STALL_SHAPES
from dflashctl.cli.common import age, console
from dflashctl.cli.gpuhealth import health_cell, render_gpu_health
from dflashctl.cli.spark import spark
from dflashctl.model import GpuFinding, Verdict

if TYPE_CHECKING:
    from dflashctl.analysis.gpuwindow import GpuStatus
    from dflashctl.analysis.health import Health
    from dflashctl.commands.status import HostLine, StatusView

VERDICT_STYLE = {
    Verdict.STARTING: "cyan", Verdict.TRAINING: "bold green", Verdict.FINISHED: "green",
    Verdict.DEGRADED: "bold yellow", Verdict.STALLED: "bold yellow", Verdict.CRASHED: "bold red",
    Verdict.LOST: "bold red", Verdict.STOPPED: "blue",
}
FINDING_STYLE = {GpuFinding.BUSY: "green", GpuFinding.IDLE: "dim", GpuFinding.IDLE_ALLOCATED: "bold yellow",
                 GpuFinding.SPINNING: "bold yellow", GpuFinding.ORPHANED: "bold red"}
SPARK_WIDTH = 16  # report intervals drawn per sparkline (the newest)
# the watch's three histories: column title, series key, unit
HISTORIES = (("utilisation history", "util", "%"), ("memory history", "memory_mib", "MiB"),
             ("power history", "power_w", "W"))


def _num(v: float | None, fmt: str = "{:.0f}") -> str:
    return "-" if v is None else fmt.format(v)


def _spark(values: list[float | None], width: int = SPARK_WIDTH, top: float = 100.0) -> str:
    """One block per value, its height the value's share of `top` (blank: no reading)."""
    return spark(values, width, top)


def training_line(training: dict[str, list[float]]) -> Text:
    """`training  loss ▇▆▅▄▃ 2.31  τ ▁▂▄▅▇ 3.40`: each series scaled between its own min and max (issue 29)."""
    line = Text("training", style="bold")
    for key, label in (("loss", "loss"), ("acc_len", "τ"), ("eval_acc_len", "τ eval")):
        xs = training.get(key)
        if not xs:
            continue
        low = min(xs)
        line.append(f"  {label} ")
        line.append(spark([x - low for x in xs], SPARK_WIDTH, top=max(xs) - low or 1.0), style="cyan")
        line.append(f" {xs[-1]:.4g}")
    return line


def _history(g: GpuStatus, key: str, unit: str) -> str:
    """The sparkline of each interval's mean, then the last interval's min–max (`status --watch`)."""
    spans = g.series.get(key) or []
    if not spans and key == "util":  # no series kept (not a watch): the window's utilisation readings
        return _spark(g.history)
    means = [None if x is None else x[1] for x in spans]
    top = 100.0
    if key == "memory_mib":
        top = g.sample.memory_total_mib or max((x[2] for x in spans if x is not None), default=1.0)
    elif key == "power_w":
        top = max((x[2] for x in spans[-SPARK_WIDTH:] if x is not None), default=1.0)
    last = spans[-1] if spans else None
    span = "-" if last is None else f"{last[0]:.0f}–{last[2]:.0f} {unit}" if round(last[0]) != round(last[2]) \
        else f"{last[2]:.0f} {unit}"
    return f"{_spark(means, top=top):<{SPARK_WIDTH}} {span}"


def _clock(seconds: float) -> str:
    """1:20:50, as tqdm prints an ETA."""
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60:02d}:{s % 60:02d}"


def _header(title: str, health: Health, extra: list[str], ended: str | None) -> Text:
    """One line. `ended` ("exited 1") only for a run whose process is gone: next to a live run's verdict
    an exit code would read as if it had exited (the command's own exit code is for scripts, in --json)."""
    t = Text()
    t.append(title, style="bold")
    t.append("  ")
    t.append(f"{health.verdict}".upper(), style=VERDICT_STYLE[health.verdict])
    if ended:
        t.append(f" ({ended})", style="dim")
    p = health.progress
    parts = [*extra]
    if "step" in p:
        parts.append(f"step {p['step']:.0f}" + (f"/{p['total']:.0f}" if "total" in p else ""))
    if "eta_s" in p:
        parts.append(f"ETA {_clock(p['eta_s'])}")
    if "tok/s" in p:
        parts.append(f"{p['tok/s']:.1f} tok/s")
    elif "it/s" in p:
        parts.append(f"{p['it/s']:.3g} it/s")
    if "loss" in p:
        parts.append(f"loss {p['loss']:.4g}")
    if "acc_len" in p:
        parts.append(f"τ {p['acc_len']:.2f}")
    if "eval_acc_len" in p:
        parts.append(f"eval τ {p['eval_acc_len']:.2f}" + (f" @ {p['eval_step']:.0f}" if "eval_step" in p else ""))
    if parts:
        t.append("  " + " · ".join(parts))
    return t


def _cause(health: Health) -> list[Text]:
    """The cause first (issue 28): signature and remedy, the worker that failed first, its traceback's last lines."""
    cause = cause_of(health)
    if cause is None:
        return []
    out = []
    for ln in cause.lines():
        style = "bold red" if ln.startswith("cause:") else "dim" if ln.startswith("  |") else "bold" \
            if ln.startswith("in:") else ""
        out.append(Text(ln, style=style))
    return out


def render(title: str, health: Health, *, extra: list[str] = (), history: bool = False,
           notes: list[str | Text] = (), ended: str | None = None, gpu_note: str | None = None,
           share: dict[int, tuple[float, float]] | None = None,
           training: dict[str, list[float]] | None = None, layout: str | None = None,
           holds: dict[int, str] | None = None) -> RenderableType:
    """The whole view: header, why, threads, GPUs, diagnoses. Used by status, --watch and diagnose.
    gpu_note: one line in the GPU section when there are no readings (why there are none). share: GPU → MiB held
    by the run's processes and by all others (the host view, `gpus`); training: loss and τ series (sparklines).
    layout: the trainer's layout in one line; holds: GPU → what it holds (a GPU column)."""
    parts: list[RenderableType] = [_header(title, health, list(extra), ended), *_cause(health)]
    for note in notes:
        parts.append(note if isinstance(note, Text) else Text(note, style="bold magenta"))
    for i, reason in enumerate(health.reasons):  # why the verdict: labelled, one reason a line, aligned
        parts.append(Text(f"  {'why:' if i == 0 else '    '} {reason}", style="dim"))
    if layout:
        parts.append(Text.assemble(("layout", "bold"), f"  {layout}"))
    if health.threads:
        tt = Table(title="threads", title_justify="left", box=None, pad_edge=False, show_edge=False)
        for col in ("name", "state", "exception", "message"):
            tt.add_column(col, overflow="fold")
        for th in health.threads:
            style = "bold red" if th.state == "crashed" else "green" if th.state == "running" else "dim"
            msg = (th.message or "").splitlines()[0][:160] if th.message else ""
            tt.add_row(th.name, Text(th.state, style=style), th.exception or "-", escape(msg))
        parts.append(tt)
    if health.gpus:
        gt = Table(title="GPUs", title_justify="left", box=None, pad_edge=False, show_edge=False)
        for col in ("gpu", "memory used/total", "util", "power", "finding", "health"):
            gt.add_column(col, justify="right" if col not in ("finding", "health") else "left")
        if share is not None:
            gt.add_column("run / others (host)", justify="right")
        if holds:
            gt.add_column("holds")
        if history:
            for title, _, _ in HISTORIES:
                gt.add_column(title, no_wrap=True)
        for g in health.gpus:
            s = g.sample
            mem = f"{_num(s.memory_used_mib)} / {_num(s.memory_total_mib)} MiB"
            finding = Text(str(g.finding) if g.finding else "-", style=FINDING_STYLE.get(g.finding, "dim"))
            row = [str(s.index), mem, f"{_num(s.utilization_pct)} %", f"{_num(s.power_w)} W", finding,
                   health_cell(health, s.index)]
            if share is not None:
                ours, others = share.get(s.index, (None, None))
                row.append("-" if ours is None else f"{ours:.0f} / {others:.0f} MiB")
            if holds:
                row.append(escape(holds.get(s.index, "-")))
            if history:
                row += [_history(g, key, unit) for _, key, unit in HISTORIES]
            gt.add_row(*row)
        parts.append(gt)
    if training and history:  # beside the GPU histories of a watch: training (loss falls, τ rises) or stuck
        parts.append(training_line(training))
    if gpu_note:
        parts.append(Text(f"GPUs: {gpu_note}", style="dim" if not health.gpus else "yellow"))
    gpu_health = render_gpu_health(health)
    if gpu_health is not None:
        parts.append(gpu_health)
    if health.hits or health.stall_shape:
        parts.append(Text("diagnosis", style="bold"))
    if health.stall_shape:  # how the GPUs look while nothing moves: the remedy differs by shape
        shape = STALL_SHAPES[health.stall_shape]
        line = Text("  ")
        line.append(f"stall: {shape.id}", style="bold yellow")
        line.append(f"  {shape.summary}")
        parts += [line, Text(f"    what to do: {shape.remedy}")]
    if health.hits:
        for h in health.hits:
            line = Text("  ")
            line.append(h.signature.id, style="bold red")
            line.append(f"  {h.signature.summary}")
            parts.append(line)
            parts.append(Text(f"    evidence (line {h.line}): {h.text[:200]}", style="dim"))
            parts.append(Text(f"    what to do: {h.signature.remedy}"))
    if health.final_exception:
        parts.append(Text(f"final exception: {health.final_exception}", style="red"))
    return Group(*parts)


def render_view(v: StatusView, *, history: bool = False, events: int | None = 5) -> RenderableType:
    """events: how many of the sentinel's latest events to show (0: none, None: all)."""
    extra = []
    if v.run:
        extra.append(f"pid {v.run.pid or '-'}")
    if v.uptime_s is not None:
        extra.append(f"up {age(v.uptime_s)}")
    extra.append(f"last log {age(v.seconds_since_log)} ago" if v.seconds_since_log is not None else "last log -")
    notes: list[str | Text] = flight_lines(v)  # beside the cause: who is behind, in which collective
    if v.reconnecting:
        notes.append(f"reconnecting… ({v.reconnecting})")
    if v.settling:
        notes.append("the trainer is gone; waiting for the exit code its supervisor writes…")
    code = v.run.exit_code if v.run else None
    ended = f"exited {code}" if v.health.verdict.is_terminal and code is not None else None
    if v.restart_pending:
        notes.append(f"restarting: {(v.run.restart or {}).get('why') if v.run else ''}")
    view = render(f"{v.host} · run {v.run_id or '-'}", v.health, extra=extra, history=history, notes=notes,
                  ended=ended, gpu_note=gpu_note(v.gpu_error, has_gpus=bool(v.health.gpus)),
                  share=v.gpu_share, training=v.training, layout=v.layout.line() if v.layout else None,
                  holds=v.layout.gpus() if v.layout else None)
    from dflashctl.cli.timeline import render_capture, render_events

    extra_parts = [render_capture(v.stacks)] if v.stacks else []
    if events != 0 and (v.events or events is None):
        extra_parts.append(render_events(v.events, limit=events))
    return Group(view, *extra_parts) if extra_parts else view


def flight_lines(v: StatusView) -> list[str | Text]:
    """The flight recorder's dumps of the run: per process group who is behind and where the others wait, then which
    dumps say so (how old, those left out). Nothing when the run has none."""
    fr = v.flight_recorder
    if fr is None:
        return []
    out: list[str | Text] = [Text(f"flight recorder: {b.line()}", style="bold red") for b in fr.behind]
    when = f", {age(v.time - fr.newest)} ago" if v.time is not None and fr.newest is not None else ""
    ranks = ",".join(map(str, fr.ranks)) or "-"
    verdict = "" if fr.behind else ": every rank got equally far" if fr.dumps > 1 else ": one rank's only"
    line = f"  flight recorder dumps of rank{'s' if len(fr.ranks) != 1 else ''} {ranks}{verdict}{when} ({fr.dir})"
    if fr.skipped_count:
        line += f"; {fr.skipped_count} left out: " + "; ".join(f"{n} ({w})" for n, w in fr.skipped[:2])
    out.append(Text(line, style="dim"))
    return out


def gpu_note(error: str | None, *, has_gpus: bool) -> str | None:
    """The GPU problem in a few words; the probe's full text (NVML's error too) stays in --json."""
    if error is None:
        return None if has_gpus else "none reported"
    if "nvidia-smi not found" in error:
        return "none (CPU host: nvidia-smi not found)"
    return error


def print_wide(renderable: RenderableType) -> None:
    """Piped output keeps long lines (remedies, messages) whole instead of wrapping them at 80 columns."""
    if console.is_terminal:
        console.print(renderable)
        return
    saved, console.width = console.width, 160
    try:
        console.print(renderable)
    finally:
        console.width = saved


def render_all(lines: list[HostLine]) -> Table:
    """`status --all`: one line per host."""
    t = Table(box=None, pad_edge=False, show_edge=False)
    for col in ("host", "run", "verdict", "step", "tok/s", "threads", "GPUs", "note"):
        t.add_column(col)
    for ln in lines:
        if ln.view is None:
            t.add_row(ln.host, "-", Text("unreachable" if ln.exit_code == 102 else "error", style="red"),
                      "-", "-", "-", "-", escape(ln.error or ""))
            continue
        hh = ln.view.health
        crashed = [th.name for th in hh.threads if th.state == "crashed"]
        findings = [g.finding for g in hh.gpus]
        flagged = [f"{findings.count(f)} {f}" for f in (GpuFinding.IDLE_ALLOCATED, GpuFinding.SPINNING)
                   if f in findings]
        gpus = f"{len(hh.gpus)}" + (f" ({', '.join(flagged)})" if flagged else "")
        t.add_row(ln.host, ln.view.run_id or "-", Text(str(hh.verdict), style=VERDICT_STYLE[hh.verdict]),
                  _num(hh.progress.get("step")), _num(hh.progress.get("tok/s"), "{:.1f}"),
                  f"{len(crashed)} crashed" if crashed else str(len(hh.threads)), gpus,
                  escape(", ".join(x.signature.id for x in hh.hits)))
    return t
