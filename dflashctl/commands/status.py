"""status: probe reports → the same judgement diagnose makes, once or as a live stream.

`Watcher` holds what must survive between probe reports (the log scanner and its offset, GPU samples
over the window, when the step last moved); `status_once`, `watch` and `status_all` only move reports
into it. The CLI renders the `StatusView` it returns — the table and `--json` come from that one record.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from dflashctl.analysis.gpus import from_probe
from dflashctl.analysis.health import Evidence, GpuSweep, Health, Thresholds, judge
from dflashctl.analysis.logscan import LogScanner
from dflashctl.analysis.records import to_record
from dflashctl.analysis.stepclock import StepClock
from dflashctl.analysis.verdict import EndWatch, ProcessState
from dflashctl.commands._runs import JOB_KINDS, host_progress
from dflashctl.errors import ConnectFailed, DflashError, NotFound, RemoteTimeout
from dflashctl.model import Host, Verdict
from dflashctl.remote import probe
from dflashctl.remote.report import ProbeReport, RunRecord
from dflashctl.remote.target import Target

HISTORY = 120  # GPU sweeps kept (utilisation history in watch mode)
RECONNECT_BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 8.0)


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

    @property
    def run_id(self) -> str | None:
        return self.run.id if self.run else None

    @property
    def exit_code(self) -> int:
        return self.health.exit_code

    def to_record(self) -> dict[str, Any]:
        rec = {
            "host": self.host,
            "run": None if self.run is None else self.run.to_record(),
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
        }
        rec.update(to_record(self.health))
        rec["gpus"] = [dict(g, history=h.history) for g, h in zip(rec["gpus"], self.health.gpus, strict=True)]
        return rec


def _job(run: RunRecord) -> str | None:
    """What a run that is not training does (meta.json `kind` eval / generate, its `job` line), else None."""
    meta = run.meta or {}
    if meta.get("kind", "train") not in JOB_KINDS:  # train, exec, adopted: a training program of some kind
        return None
    return str(meta.get("job") or f"a {meta.get('kind')} run")


def _started_at(run: RunRecord) -> float | None:
    meta = run.meta or {}
    v = meta.get("started_at_epoch")
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def gpu_sweep(doc: ProbeReport) -> tuple[GpuSweep | None, str | None]:
    """The GPU readings of one probe report (NVML or nvidia-smi CSV), or why there are none."""
    samples, error = from_probe(doc.gpus, doc.time)
    return (GpuSweep(doc.time, samples) if samples is not None else None), error


@dataclass
class Watcher:
    """State carried from one probe report to the next."""

    host: str
    thresholds: Thresholds = field(default_factory=Thresholds)
    scanner: LogScanner = field(default_factory=LogScanner)
    sweeps: deque[GpuSweep] = field(default_factory=lambda: deque(maxlen=HISTORY))
    next_offset: int | None = None
    inode: int | None = None
    run_id: str | None = None
    from_start: bool = True
    last_log_at: float | None = None
    last: StatusView | None = None
    live: bool = False  # watching: a step seen at the first look counts as fresh until it stops moving
    end: EndWatch = field(default_factory=EndWatch)  # a gone process is lost only after the exit-code grace
    steps: StepClock = field(init=False)  # when the last new step happened (the stall rule's clock)

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
                                   started_at=_started_at(run), ending=run.ending, job=_job(run))
        ev = Evidence(now=now, process=process, log=report, sweeps=list(self.sweeps),
                      errors=run.errors if run else {}, heartbeat=hb,
                      last_progress_time=progress_time)
        health = judge(ev, self.thresholds)
        started = process.started_at
        ending = self.end.see(process, now) if run and now is not None else "running"
        settling = self.live and health.verdict == Verdict.LOST and ending == "settling"
        view = StatusView(
            host=self.host, run=run, health=health, time=now,
            uptime_s=(now - started) if started is not None and now is not None and process.alive else None,
            seconds_since_log=(now - self.last_log_at) if now is not None and self.last_log_at is not None else None,
            log_path=log.path if log else None, log_lines_from_start=self.from_start, gpu_error=gpu_error,
            log_offset=self.next_offset, log_bytes_scanned=self.scanner.bytes_scanned, settling=settling,
        )
        self.last = view
        return view

    def reconnecting(self, why: str) -> StatusView | None:
        """The last view, marked as waiting for the connection to come back."""
        if self.last is None:
            return None
        return dataclasses.replace(self.last, reconnecting=why)


def _no_run(host: Host, run: str | None) -> NotFound:
    what = f"run {run!r}" if run and run != "latest" else "no run (runs/latest is missing)"
    return NotFound(f"{what} on {host.name} ({host.workspace}/runs)" if run and run != "latest" else
                    f"{what} on {host.name}", hint="list runs with `dflashctl runs`; start one with `dflashctl launch`")


def status_once(target: Target, run: str | None = None, *, thresholds: Thresholds = Thresholds(),
                log_max: int = probe.DEFAULT_LOG_MAX) -> StatusView:
    """One probe round trip: the log's tail, GPUs, process state → a judged view."""
    doc = probe.probe_once(target, target.host.workspace, run or "latest", log_max=log_max, require_run=False)
    if doc.run is None:
        raise _no_run(target.host, run)
    return Watcher(target.host.name, thresholds, scanner=LogScanner(host_progress(target.host))).update(doc)


def watch(connect: Callable[[], Target], run: str | None = None, *, interval: float = 1.0,
          thresholds: Thresholds = Thresholds(), log_max: int = probe.DEFAULT_LOG_MAX,
          sleep: Callable[[float], None] = time.sleep) -> Iterator[StatusView]:
    """Views from one streaming probe, forever (the caller stops). A dropped connection yields the
    last view marked "reconnecting", then reconnects with backoff and resumes at the last log offset."""
    target = connect()
    w: Watcher | None = None
    failures = 0
    try:
        while True:
            try:
                if w is None:  # first look: the log's tail, then follow from its end
                    doc = probe.probe_once(target, target.host.workspace, run or "latest", log_max=log_max,
                                           require_run=False)
                    if doc.run is None:
                        raise _no_run(target.host, run)
                    w = Watcher(target.host.name, thresholds, live=True, scanner=LogScanner(host_progress(target.host)))
                    yield w.update(doc)
                for doc in probe.probe_stream(target, target.host.workspace, w.run_id, w.next_offset, interval,
                                              log_max=log_max, log_inode=w.inode):
                    failures = 0
                    yield w.update(doc)
                raise ConnectFailed(f"host {target.host.name}: the watch probe ended")
            except DflashError as e:
                if w is None or not isinstance(e, ConnectFailed | RemoteTimeout):
                    raise  # nothing to resume, or not a connection problem (a missing run, bad auth)
                view = w.reconnecting(e.message) if w is not None else None
                if view is not None:
                    yield view
                sleep(RECONNECT_BACKOFF_S[min(failures, len(RECONNECT_BACKOFF_S) - 1)])
                failures += 1
                with contextlib.suppress(Exception):  # closing a dead connection may fail in any way
                    target.close()
                target = connect()
    finally:
        target.close()


@dataclass
class HostLine:
    """`status --all`: one host, one line."""

    host: str
    view: StatusView | None = None
    error: str | None = None
    exit_code: int = 0

    def to_record(self) -> dict[str, Any]:
        if self.view is None:
            return {"host": self.host, "error": self.error, "exit_code": self.exit_code}
        return {"host": self.host, "error": None, **self.view.to_record()}


def status_all(hosts: list[Host], connect: Callable[[Host], Target], *,
               thresholds: Thresholds = Thresholds(), workers: int = 16) -> list[HostLine]:
    """Every host at once (a slow host costs its own timeout, not everyone's)."""
    def one(host: Host) -> HostLine:
        try:
            with connect(host) as target:
                v = status_once(target, None, thresholds=thresholds, log_max=64 << 10)
            return HostLine(host.name, v, exit_code=v.exit_code)
        except DflashError as e:
            return HostLine(host.name, error=e.message, exit_code=int(e.exit_code))

    if not hosts:
        return []
    with ThreadPoolExecutor(max_workers=min(workers, len(hosts))) as pool:
        return list(pool.map(one, hosts))


def is_failure(v: StatusView) -> bool:
    """What `--exit-on-failure` stops on: a crash, a dead thread, a stall, a lost run (once it is sure)."""
    if v.settling:
        return False
    return v.health.verdict.is_failure


def all_exit_code(lines: list[HostLine]) -> int:
    """`status --all`'s exit code: the worst host's (0 when there are none)."""
    return max((ln.exit_code for ln in lines), default=0)


def all_record(lines: list[HostLine]) -> dict[str, Any]:
    """`status --all --json`."""
    return {"hosts": [ln.to_record() for ln in lines], "exit_code": all_exit_code(lines)}
