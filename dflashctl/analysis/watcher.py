"""What status carries from one probe report to the next, and the view it judges: one engine for the laptop's
`status` and the container's sentinel.

`Watcher` holds what must survive between probe reports (the log scanner and its offset, GPU samples over the
window, each GPU's readings per report reduced to min/mean/max, when the step last moved); each `update` turns one
report into a judged `StatusView`, from which the table, `--json` and the sentinel's events are all built.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from dflashctl.analysis.gpus import from_probe
from dflashctl.analysis.gpuwindow import SERIES, Span, reduce_interval
from dflashctl.analysis.health import Evidence, GpuSweep, Health, Thresholds, judge
from dflashctl.analysis.layout import LayoutView, layout_of
from dflashctl.analysis.logscan import LogScanner
from dflashctl.analysis.stepclock import StepClock
from dflashctl.analysis.trainseries import training_series
from dflashctl.analysis.verdict import EndWatch, ProcessState
from dflashctl.model import GpuReport, Verdict
from dflashctl.report import FlightRecorderReport, ProbeReport, RunRecord

# How a watch ends when its run is gone (not a verdict of the run: of the watch), and the exit code of each
# (DESIGN §5: run or host not found 102; a host key mismatch 2). docs/usage.md, "When a watch ends".
RUN_GONE, RUN_REPLACED, CONTAINER_GONE, HOST_REPLACED = "run-gone", "run-replaced", "container-gone", "host-replaced"
GONE_EXIT_CODES = {RUN_GONE: 102, RUN_REPLACED: 102, CONTAINER_GONE: 102, HOST_REPLACED: 2}
HISTORY = 120  # GPU sweeps kept (the judge's window), and report intervals of each GPU's series (the watch's view)


@dataclass
class StatusView:
    """One moment of one run, as judged. Both the table and --json are built from this."""

    host: str
    run: RunRecord | None  # the probe's run record (id, dir, pid, alive, exit_code, meta …)
    health: Health
    time: float | None  # the container's clock at the report
    uptime_s: float | None = None
    seconds_since_log: float | None = None  # since new log bytes last arrived
    log_path: str | None = None
    log_lines_from_start: bool = True  # False: line numbers count from where reading began (tail)
    gpu_error: str | None = None
    reconnecting: str | None = None  # why the watch is reconnecting (None: connected)
    settling: bool = False  # watching: the trainer is gone and its exit code not written yet (not final)
    log_offset: int | None = None  # where the next read of the log starts
    log_bytes_scanned: int = 0  # bytes the scanner has read so far (each byte once, unless rotated)
    events: list[dict[str, Any]] = field(default_factory=list)  # the sentinel's timeline (events.jsonl records)
    restart_pending: bool = False  # ended, and its sentinel asked for another attempt (restart.json)
    stacks: dict[str, Any] | None = None  # the sentinel's newest stall capture: {"path", "time", "reason", "processes"}
    gone: str | None = None  # the watch ended because its run is gone: a GONE_EXIT_CODES key
    gone_why: str | None = None  # that, in one line
    training: dict[str, list[float]] = field(default_factory=dict)  # loss, acc_len (τ) per logged step (trainseries)
    gpu_share: dict[int, tuple[float, float]] | None = None  # GPU → (MiB of the run's processes, of all others)
    layout: LayoutView | None = None  # which GPU holds what (the dflashctl trainer's heartbeats; None: another program)
    flight_recorder: FlightRecorderReport | None = None  # the run's flight recorder dumps, judged in the container

    @property
    def run_id(self) -> str | None:
        return self.run.id if self.run else None

    @property
    def exit_code(self) -> int:
        return GONE_EXIT_CODES[self.gone] if self.gone else self.health.exit_code

    def to_record(self) -> dict[str, Any]:
        rec = {
            "host": self.host,
            "run": None if self.run is None else self.run.to_record(
                verdict=str(self.health.verdict), now=self.time, last_step=_step(self.health.progress),
                last_event=self.events[-1] if self.events else None),
            "time": self.time,
            "uptime_s": self.uptime_s,
            "seconds_since_log": self.seconds_since_log,
            "seconds_since_progress": self.health.seconds_since_progress,
            "reasons": self.health.reasons,
            "exit_code": self.exit_code,
            "log": {"path": self.log_path, "lines_from_start": self.log_lines_from_start,
                    "offset": self.log_offset, "bytes_scanned": self.log_bytes_scanned},
            "gpu_error": self.gpu_error,
            "reconnecting": self.reconnecting,
            "settling": self.settling,
            "events": self.events,
            "restart": None if self.run is None else self.run.restart,
            "restart_pending": self.restart_pending,
            "stacks": self.stacks,
            "training": self.training,
            "gpu_share": None if self.gpu_share is None else
            [{"gpu": i, "ours_mib": o, "others_mib": x} for i, (o, x) in sorted(self.gpu_share.items())],
            "layout": None if self.layout is None else self.layout.to_record(),
            "flight_recorder": None if self.flight_recorder is None else self.flight_recorder.to_record(),
        }
        rec.update(self.health.to_record())
        rec["gpus"] = [dict(g, history=h.history, series={k: [None if x is None else list(x) for x in xs]
                                                          for k, xs in h.series.items()})
                       for g, h in zip(rec["gpus"], self.health.gpus, strict=True)]
        if self.gone:
            rec.update(verdict=self.gone, reasons=[self.gone_why, *rec["reasons"]])
        return rec


def _step(progress: dict[str, float]) -> int | None:
    step = progress.get("step") if progress else None
    return int(step) if step is not None else None


def gone_text(kind: str, host: str, run_id: str, detail: str = "") -> str:
    """The one line a watch or a follow ends with when its run is gone (GONE_EXIT_CODES' kinds)."""
    return {RUN_GONE: f"run {run_id} is gone from {host}: its run directory was deleted",
            RUN_REPLACED: f"run {run_id} on {host} was replaced by another run of the same id ({detail})",
            CONTAINER_GONE: f"run {run_id} can no longer be watched: {detail}",
            HOST_REPLACED: f"run {run_id} can no longer be watched: {detail}"}[kind]


def stopped_why(run: RunRecord) -> str | None:
    """Why the sentinel's failure policy stopped the run (its `stopped` marker), None when the user did."""
    by = run.stopped_by or {}
    return str(by.get("detail") or by.get("reason") or "the run broke its limit") if by.get("by") == "sentinel" \
        else None


def gpu_sweep(doc: ProbeReport) -> tuple[GpuSweep | None, str | None]:
    """The GPU readings of one probe report (NVML or nvidia-smi CSV), or why there are none."""
    samples, error = from_probe(doc.gpus, doc.time)
    return (GpuSweep(doc.time, samples) if samples is not None else None), error


def interval_sweeps(doc: ProbeReport, sweep: GpuSweep | None) -> list[GpuSweep]:
    """Every GPU reading of the report's interval (a watch probe's gpus_series), else the report's one reading."""
    out = []
    for piece in doc.gpus_series:
        t = piece.time if piece.time is not None else doc.time
        samples, _ = from_probe(piece, t)
        if samples is not None:
            out.append(GpuSweep(t, samples))
    return out or ([sweep] if sweep is not None else [])


@dataclass
class GpuSeries:
    """One GPU's readings per report interval, reduced to (min, mean, max): HISTORY intervals per SERIES key."""

    spans: dict[str, deque[Span | None]] = field(
        default_factory=lambda: {k: deque(maxlen=HISTORY) for k in SERIES})

    def add(self, reduced: dict[str, Span | None] | None) -> None:
        for k, xs in self.spans.items():
            xs.append(None if reduced is None else reduced.get(k))

    def lists(self) -> dict[str, list[Span | None]]:
        return {k: list(xs) for k, xs in self.spans.items()}


@dataclass
class Watcher:
    """State carried from one probe report to the next."""

    host: str
    thresholds: Thresholds = field(default_factory=Thresholds)
    scanner: LogScanner = field(default_factory=LogScanner)
    sweeps: deque[GpuSweep] = field(default_factory=lambda: deque(maxlen=HISTORY))
    series: dict[int, GpuSeries] = field(default_factory=dict)  # by GPU index
    next_offset: int | None = None
    inode: int | None = None
    run_id: str | None = None
    from_start: bool = True
    last_log_at: float | None = None
    last: StatusView | None = None
    live: bool = False  # watching: a step seen at the first look counts as fresh until it stops moving
    end: EndWatch = field(default_factory=EndWatch)  # a gone process is lost only after the exit-code grace
    steps: StepClock = field(init=False)  # when the last new step happened (the stall rule's clock)
    gpu_report: GpuReport | None = None  # the latest GPU reading with its health fields
    xid_lines: tuple[str, ...] = ()  # the kernel log's Xid lines, as last read (a watch reads them at its first look)

    def __post_init__(self) -> None:
        self.steps = StepClock(self.thresholds.stall_window_s, live=self.live)

    def update(self, doc: ProbeReport) -> StatusView:
        now = doc.time
        run = doc.run
        if run and run.id != self.run_id:  # a different run: start over
            self.scanner.reset()
            self.run_id, self.next_offset, self.inode = run.id, None, None
            self.last_log_at = None
            self.steps.reset()
        log = doc.log
        if log:
            data = log.data
            if log.rotated:
                self.scanner.reset()
                self.from_start = True
            elif self.next_offset is None:
                self.from_start = log.offset == 0
                if not self.from_start:  # a tail starts mid-line: skip to the first whole line
                    data = data[data.find(b"\n") + 1:] if b"\n" in data else b""
            mtime = log.mtime
            if data:
                self.scanner.feed(data)
                # the file's mtime is when these bytes were written (a tail read at the first look may be
                # hours old); `now` only when the probe did not say
                self.last_log_at = min(mtime, now) if mtime is not None and now is not None else (mtime or now)
            elif self.last_log_at is None and mtime is not None:
                self.last_log_at = mtime
            self.next_offset, self.inode = log.next_offset, log.inode
        sweep, gpu_error = gpu_sweep(doc)
        if sweep is not None:
            self.sweeps.append(sweep)
        self._keep_series(interval_sweeps(doc, sweep))
        report = self.scanner.report()
        hb = run.heartbeat if run else None
        stepped = report.last_step_point  # a dict line without a step (HF Trainer) between two bars is no new step
        step = stepped.values.get("step") if stepped else None
        if step is None and hb is not None and isinstance(hb.get("step"), int | float):
            step = float(hb["step"])
        progress_time = self.steps.see(step, now, log.mtime if log else None)
        process = ProcessState()
        if run:
            process = ProcessState(alive=run.alive, exit_code=run.exit_code, stopped=run.stopped,
                                   stopped_why=stopped_why(run),
                                   started_at=run.meta.started_at_epoch, ending=run.ending, job=run.meta.job_line,
                                   survivors=run.survivors)
        if doc.gpus is not None and doc.gpus.source is not None:
            self.gpu_report = doc.gpus
        if doc.xid is not None:
            self.xid_lines = doc.xid.lines
        ev = Evidence(now=now, process=process, log=report, sweeps=list(self.sweeps),
                      errors=run.errors if run else {}, heartbeat=hb,
                      last_progress_time=progress_time, gpu_report=self.gpu_report, xid_lines=self.xid_lines)
        health = judge(ev, self.thresholds)
        for g in health.gpus:
            if g.index in self.series:
                g.series = self.series[g.index].lists()
        started = process.started_at
        ending = self.end.see(process, now) if run and now is not None else "running"
        settling = self.live and health.verdict == Verdict.LOST and ending == "settling"
        view = StatusView(
            host=self.host, run=run, health=health, time=now,
            uptime_s=(now - started) if started is not None and now is not None and process.alive else None,
            seconds_since_log=(now - self.last_log_at) if now is not None and self.last_log_at is not None else None,
            log_path=log.path if log else None, log_lines_from_start=self.from_start, gpu_error=gpu_error,
            log_offset=self.next_offset, log_bytes_scanned=self.scanner.bytes_scanned, settling=settling,
            restart_pending=bool(run and run.restart) and health.verdict.is_terminal,
            training=training_series(report.progress), layout=layout_of(doc.layouts, sweep.samples if sweep else ()),
            flight_recorder=doc.flight_recorder,
        )
        self.last = view
        return view

    def _keep_series(self, sweeps: list[GpuSweep]) -> None:
        """One more interval for every GPU: its readings reduced, None for a GPU known before that has none now."""
        reduced = reduce_interval(sw.samples for sw in sweeps)
        for i in sorted(set(reduced) | set(self.series)):
            self.series.setdefault(i, GpuSeries()).add(reduced.get(i))

    def gone_from(self, doc: ProbeReport, host: str) -> tuple[str, str] | None:
        """(GONE key, one line) when this report says the run watched so far is no more: its directory deleted
        (the probe finds no run by that id) or replaced by another run of the same id (another group leader)."""
        if self.last is None or self.run_id is None:
            return None
        if doc.run is None:
            return RUN_GONE, gone_text(RUN_GONE, host, self.run_id)
        before = self.last.run.pid if self.last.run else None
        if doc.run.id == self.run_id and None not in (before, doc.run.pid) and doc.run.pid != before:
            return RUN_REPLACED, gone_text(RUN_REPLACED, host, self.run_id, f"pid {before} → {doc.run.pid}")
        return None

    def gone(self, kind: str, why: str) -> StatusView:
        """The last view, marked as the watch's end: kind is a GONE_EXIT_CODES key."""
        assert self.last is not None
        return dataclasses.replace(self.last, gone=kind, gone_why=why, reconnecting=None, settling=False)

    def reconnecting(self, why: str) -> StatusView | None:
        """The last view, marked as waiting for the connection to come back."""
        if self.last is None:
            return None
        return dataclasses.replace(self.last, reconnecting=why)
