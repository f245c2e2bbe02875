"""Judging a run (DESIGN §5): process state + log events + heartbeat + GPU samples over a window → verdict.

Pure: everything, including "now", comes in as arguments, so `diagnose` (files, no clock) and `status`
(probe readings, the probe's clock) get the same answer from the same evidence. Per-GPU and per-thread
failures are contained: one unreadable GPU is a row with no finding, not an exception.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dflashctl.analysis import signatures
from dflashctl.analysis.gpuhealth import gpu_health, health_findings, worst_action
from dflashctl.analysis.gpuwindow import (
    IDLE_HELD,
    STALL_SHAPES,
    GpuStatus,
    GpuSweep,
    StallShape,
    Thresholds,
    judge_gpus,
    ranges,
    shape_reason,
    stall_shape,
)
from dflashctl.analysis.logscan import LogReport, Traceback, scan
from dflashctl.analysis.records import progress_record
from dflashctl.analysis.verdict import ProcessState, recorded_end
from dflashctl.analysis.xids import xid_events
from dflashctl.model import (
    GpuAction,
    GpuFinding,
    GpuHealth,
    GpuProcess,
    GpuReport,
    HealthFinding,
    HealthSeverity,
    SignatureHit,
    ThreadState,
    Verdict,
)


@dataclass
class Evidence:
    """Everything health looks at. Only `now` and `process` are required; the rest may be missing."""

    now: float | None
    process: ProcessState = field(default_factory=ProcessState)
    log: LogReport | None = None
    sweeps: Sequence[GpuSweep] = ()
    errors: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # <run>/errors/<thread>.json
    heartbeat: Mapping[str, Any] | None = None
    last_progress_time: float | None = None  # when a new step was last seen (status keeps track)
    gpu_processes: Sequence[GpuProcess] = ()
    live_pids: frozenset[int] | None = None  # host-side pids of the live run (orphaned-memory check)
    gpu_report: GpuReport | None = None  # the latest reading as sent: its health fields (analysis/gpuhealth.py)
    xid_lines: Sequence[str] = ()  # the kernel log's NVIDIA Xid lines (analysis/xids.py)


@dataclass
class Health:
    verdict: Verdict
    reasons: list[str]
    threads: list[ThreadState]
    gpus: list[GpuStatus]
    hits: list[SignatureHit]  # active signature hits, one per id (the first, with its evidence line)
    final_exception: str | None
    progress: dict[str, float]  # latest step, total, loss, tok/s, it/s, eta_s, acc_len … (log, else heartbeat)
    seconds_since_progress: float | None
    root_cause: str | None = None  # the worker (thread or rank) that failed first
    stall_shape: StallShape | None = None  # stalled: what its GPUs show, "idle-held" | "spinning" (STALL_SHAPES)
    gpu_health: list[GpuHealth] = field(default_factory=list)  # per GPU: ECC, row remaps, throttling, …
    gpu_findings: list[HealthFinding] = field(default_factory=list)  # most severe first (docs/failures.md)

    @property
    def gpu_action(self) -> GpuAction | None:
        """The most the GPU findings ask for (restart the program < reset the GPU < drain the node < reboot)."""
        return worst_action(self.gpu_findings)

    @property
    def stall_remedy(self) -> str | None:
        return STALL_SHAPES[self.stall_shape].remedy if self.stall_shape is not None else None

    @property
    def exit_code(self) -> int:
        return self.verdict.exit_code

    def to_record(self) -> dict[str, Any]:
        """The `diagnose --json` contract (issue 4); `status --json` adds run and host fields around it. The table
        is drawn from the same Health, so the two cannot drift (every GPU column the table shows is here too)."""
        health = {r.index: r.to_record() for r in self.gpu_health}
        return {
            "verdict": str(self.verdict),
            "final_exception": self.final_exception,
            "root_cause": self.root_cause,
            "stall_shape": self.stall_shape,  # stalled: "idle-held" | "spinning" (docs/failures.md), else null
            "stall_remedy": self.stall_remedy,
            "progress": progress_record(self.progress),
            "threads": [
                {"name": t.name, "state": t.state, "exception": t.exception, "message": t.message,
                 "traceback": t.traceback}
                for t in self.threads
            ],
            "signatures": [
                {"id": x.signature.id, "summary": x.signature.summary, "remedy": x.signature.remedy,
                 "evidence": {"line": x.line, "text": x.text}}
                for x in self.hits
            ],
            "gpus": [
                {"index": int(g.sample.index), "memory_used_mib": g.sample.memory_used_mib,
                 "memory_total_mib": g.sample.memory_total_mib, "utilization_pct": g.sample.utilization_pct,
                 "power_w": g.sample.power_w, "finding": str(g.finding) if g.finding is not None else None,
                 "health": health.get(int(g.sample.index)),
                 "health_findings": [f.id for f in self.gpu_findings if f.gpu == int(g.sample.index)]}
                for g in self.gpus
            ],
            "gpu_findings": [f.to_record() for f in self.gpu_findings],  # docs/failures.md "GPU health findings"
            "gpu_action": None if self.gpu_action is None else str(self.gpu_action),
        }


# -- threads -------------------------------------------------------------------------------------------


def _threads(log: LogReport | None, errors: Mapping[str, Mapping[str, Any]],
             heartbeat: Mapping[str, Any] | None) -> tuple[list[ThreadState], list[SignatureHit]]:
    """Heartbeat states, then log tracebacks, then error files (the most exact source) on top."""
    threads: dict[str, ThreadState] = {}
    extra_hits: list[SignatureHit] = []
    for row in (heartbeat or {}).get("threads") or []:
        if isinstance(row, Mapping) and isinstance(row.get("name"), str):
            state = row.get("state")
            threads[row["name"]] = ThreadState(
                row["name"], state="crashed" if state == "crashed" else "finished" if state == "finished" else "running"
            )
    if log is not None:
        for name, f in log.workers.items():  # ranks a launcher reported failed (exit code, signal)
            threads[name] = ThreadState(name, "crashed", None, f.how, None)
        for name, ts in log.threads.items():  # their own tracebacks say more
            message = ts.message or (threads[name].message if name in threads else None)
            threads[name] = ThreadState(ts.name, ts.state, ts.exception, message, ts.traceback)
    for name, doc in errors.items():
        if not isinstance(doc, Mapping):
            continue
        name = str(doc.get("thread") or name)
        text = doc.get("traceback") if isinstance(doc.get("traceback"), str) else None
        threads[name] = ThreadState(name, "crashed", str(doc.get("type") or "") or None,
                                    str(doc.get("message") or "") or None, text)
        if text:
            for tb in scan(text.encode()).tracebacks:
                tb.thread = name
                extra_hits += _traceback_hits(tb)
    return sorted(threads.values(), key=lambda x: x.name), extra_hits


def _traceback_hits(tb: Traceback) -> list[SignatureHit]:
    hits = list(tb.hits)
    if not hits and tb.thread is not None:  # error files have no header: apply the worker-thread frame rule
        for rule in signatures.match_frames(tb.frames):
            hits.append(SignatureHit(rule.signature, tb.last_line, tb.exc_line))
    return hits


# -- signatures ------------------------------------------------------------------------------------------


def active_hits(log: LogReport | None, extra: Sequence[SignatureHit] = ()) -> list[SignatureHit]:
    """Hits that still matter: in a crashed thread's traceback; or not followed by later progress (a
    retried-and-recovered error is history, not a diagnosis) unless the signature is sticky."""
    out: dict[str, SignatureHit] = {}
    if log is not None:
        in_thread = {(h.signature.id, h.line) for tb in log.tracebacks if tb.thread is not None for h in tb.hits}
        last = log.last_progress
        for h in log.hits:
            rule = signatures.BY_ID[h.signature.id]
            recovered = last is not None and last.line > h.line
            if rule.progress_loss and (h.signature.id, h.line) not in in_thread:
                # a NaN loss is history once a finite loss came after it; the evidence is the latest NaN
                recovered = log.last_finite_loss_line is not None and log.last_finite_loss_line > h.line
                if not recovered:
                    out[h.signature.id] = h
                continue
            if rule.progress_zero:  # a run of 0.0 losses is history once the loss moved again
                if log.last_nonzero_loss_line is None or log.last_nonzero_loss_line < h.line:
                    out.setdefault(h.signature.id, h)
                continue
            if (h.signature.id, h.line) in in_thread or rule.sticky or not recovered:
                out.setdefault(h.signature.id, h)
    for h in extra:
        out.setdefault(h.signature.id, h)
    order = {r.signature.id: i for i, r in enumerate(signatures.RULES)}
    return sorted(out.values(), key=lambda h: (h.line, order[h.signature.id]))


# -- the verdict -------------------------------------------------------------------------------------------


def _final_main_traceback(log: LogReport | None) -> Traceback | None:
    """The main thread's uncaught exception that ended the log (no progress after it)."""
    if log is None or not log.tracebacks:
        return None
    tb = log.tracebacks[-1]
    if tb.thread is not None or tb.ignored or tb.exc_type is None:
        return None
    last = log.last_progress
    if last is not None and last.line > tb.last_line:
        return None
    return tb


_STEP_KEYS = ("step", "total", "it/s", "eta_s")  # what a step-counting line (a bar) says, beside dict lines


def _progress(log: LogReport | None, heartbeat: Mapping[str, Any] | None) -> dict[str, float]:
    if log is not None and log.last_progress is not None:
        values = dict(log.last_progress.values)
        stepped = log.last_step_point
        if "step" not in values and stepped is not None:  # HF Trainer: `{'loss': …}` between two tqdm bars
            values.update({k: v for k, v in stepped.values.items() if k in _STEP_KEYS})
        if "step" in values and "total" not in values:  # the total an earlier line gave (Megatron, a bar) still holds
            total = next((p.values["total"] for p in reversed(log.progress)
                          if p.kind == "train" and p.values.get("total", -1) >= values["step"]), None)
            if total is not None:
                values["total"] = total
        evaluated = log.last_eval
        if evaluated is not None:  # τ by real speculative decoding, next to the training batch's estimate
            values.update({f"eval_{k}": v for k, v in evaluated.values.items()
                           if k in ("step", "acc_len", "tokens_per_forward")})
        return values
    hb = heartbeat or {}
    out: dict[str, float] = {}
    for src, dst in (("step", "step"), ("loss", "loss"), ("tok_s", "tok/s")):
        v = hb.get(src)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[dst] = float(v)
    return out if out.get("step") else {}


def judge(ev: Evidence, thresholds: Thresholds = Thresholds()) -> Health:
    """The run's verdict, with the reasons, threads, GPU findings and active signatures behind it."""
    t = thresholds
    proc = ev.process
    threads, extra_hits = _threads(ev.log, ev.errors, ev.heartbeat)
    crashed = [x for x in threads if x.state == "crashed"]
    since = None
    if ev.now is not None and ev.last_progress_time is not None:
        since = max(0.0, ev.now - ev.last_progress_time)
    gpus = judge_gpus(ev.sweeps, ev.now, run_alive=proc.alive, thresholds=t, gpu_processes=ev.gpu_processes,
                      live_pids=ev.live_pids, stepping=since is not None and since < t.idle_window_s)
    hits = active_hits(ev.log, extra_hits)
    final_tb = _final_main_traceback(ev.log)
    final_exception = ev.log.final_exception if ev.log is not None else None
    if final_exception is None and crashed:
        final_exception = next((x.exception for x in reversed(crashed) if x.exception), None)
    root_cause = _root_cause(ev.log, crashed)
    progress = _progress(ev.log, ev.heartbeat)
    reasons: list[str] = []
    crashed_names = ", ".join(x.name for x in crashed)

    end = recorded_end(proc)
    if end is not None:
        verdict = end[0]
        reasons.append(end[1] + (f"; crashed workers: {crashed_names}"
                                 if crashed and verdict == Verdict.CRASHED else ""))
    elif proc.alive is False:
        if final_tb is not None:
            verdict = Verdict.CRASHED
            reasons.append(f"process gone after an uncaught {final_tb.exc_type}")
        elif crashed:
            verdict = Verdict.CRASHED
            reasons.append(f"process gone (no exit code) after worker(s) crashed: {crashed_names}")
        else:
            verdict = Verdict.LOST
            reasons.append("no process and no exit code (killed, or the host rebooted)")
    elif proc.alive is None and final_tb is not None:
        verdict = Verdict.CRASHED
        reasons.append(f"the log ends in an uncaught {final_tb.exc_type} (main thread)")
    elif proc.alive is None and ev.log is not None and ev.log.end is not None:  # offline: the trainer's last line
        how, line = ev.log.end
        verdict = {"finished": Verdict.FINISHED, "aborted": Verdict.CRASHED, "stopped": Verdict.STOPPED}[how]
        reasons.append(f"the trainer reported `training {how}` (line {line})"
                       + (f"; crashed workers: {crashed_names}" if crashed else ""))
    elif crashed:
        verdict = Verdict.DEGRADED
        reasons.append(f"worker(s) crashed: {crashed_names}; "
                       + ("process alive" if proc.alive else "process state unknown (offline)"))
    else:
        verdict, why = _liveness(ev, gpus, progress, since, t)
        if proc.survivors:  # its end is recorded, yet part of its tree lives: not stopped, not finished
            reasons.append("its main process has ended but not its process tree: "
                           + ", ".join(f"pid {s.get('pid')} ({s.get('cmdline')})" for s in proc.survivors[:5])
                           + " still alive; `dflashctl stop` ends them")
        elif proc.ending:  # not lost: the exit code comes once the rest of the group is gone
            reasons.append("the trainer has exited; its supervisor is ending the rest of its process group "
                           "before it records the exit code")
        reasons += why

    shape = stall_shape(gpus, t) if verdict == Verdict.STALLED else None  # a stall reason named it already
    idle_alloc = [g.index for g in gpus if g.finding == GpuFinding.IDLE_ALLOCATED]
    if idle_alloc and verdict != Verdict.STALLED:
        reasons.append(f"GPU(s) {ranges(idle_alloc)} hold memory at ≈0 % utilisation")
    spinning = [g.index for g in gpus if g.finding == GpuFinding.SPINNING]
    if spinning and shape is None:
        reasons.append(f"GPU(s) {ranges(spinning)} spinning: ≈100 % utilisation at near-idle power, no new step "
                       "(waiting in a collective?)")
    orphaned = [g.index for g in gpus if g.finding == GpuFinding.ORPHANED]
    if orphaned:
        reasons.append(f"GPU(s) {ranges(orphaned)} hold memory that belongs to no live run")
    if root_cause is not None and len(crashed) > 1:
        reasons.append(f"first to fail: {root_cause}")
    readings = gpu_health(ev.gpu_report)
    findings = health_findings(readings, xid_events(ev.xid_lines))
    reasons += [f"GPU {f.gpu if f.gpu is not None else '?'}: {f.meaning} ({f.id})"
                + (f" — {f.action}" if f.action is not None else "")
                for f in findings if f.severity != HealthSeverity.INFO]
    return Health(verdict, reasons, threads, gpus, hits, final_exception, progress, since, root_cause, shape,
                  readings, findings)


def _root_cause(log: LogReport | None, crashed: list[ThreadState]) -> str | None:
    """The launcher's word (torchrun's "Root Cause (first observed failure)"), else the worker whose failure the
    log shows first, else (error files only) the first crashed thread by name."""
    if log is not None and log.root_cause is not None:
        return log.root_cause
    if log is not None:
        order = log.crashed_workers()
        if order:
            return order[0][1]
    return crashed[0].name if crashed else None


def _liveness(ev: Evidence, gpus: list[GpuStatus], progress: dict[str, float], since: float | None,
              t: Thresholds) -> tuple[Verdict, list[str]]:
    """Alive (or unknown) with no crashed thread: training, starting, or stalled."""
    if ev.process.job is not None:  # no steps to count: running is all there is to say until it ends
        return Verdict.TRAINING, [f"{ev.process.job} (not a training run: no steps to wait for)"]
    shape = stall_shape(gpus, t)
    why = [shape_reason(gpus, shape, t)] if shape is not None else []
    if since is not None and since >= t.stall_window_s and progress:
        return Verdict.STALLED, [f"no new step for {since:.0f} s (stall window {t.stall_window_s:.0f} s)", *why]
    if (not progress and ev.process.started_at is not None and ev.now is not None
            and ev.now - ev.process.started_at >= t.startup_grace_s):
        return Verdict.STALLED, [f"no first step {ev.now - ev.process.started_at:.0f} s after start", *why]
    # Compiling and loading also hold memory at 0 % (and a first collective may spin): before the first step that
    # is "starting" until the grace.
    started = bool(progress) or ev.process.started_at is None
    quiet_for = t.idle_window_s if shape == IDLE_HELD else t.stall_window_s
    if shape is not None and started and (since is None or since >= quiet_for):
        return Verdict.STALLED, [why[0] + ("" if since is None else f", no new step for {since:.0f} s")]
    if progress:
        # why it counts as training (the step itself is in the progress fields, not repeated here)
        return Verdict.TRAINING, [f"last new step {since:.0f} s ago" if since is not None
                                  else "steps logged, no sign of a stall"]
    return Verdict.STARTING, ["no training step yet"]
