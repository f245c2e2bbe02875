"""The sentinel program: `python3 <run>/agent.pyz sentinel <run-dir>`, started by the run's supervisor (launcher.py).

Each `interval_s` it takes the probe's own report of the run (agent/probe/main.py `report`, read in-process: the
log's new bytes, the run's state, the GPUs every `gpu_interval_s`), feeds it to the same `Watcher` `status` uses,
and turns what changed into events (events.EventTracker), notifications (notify.Notifier, a thread of its own:
a hanging webhook never slows the watch) and, when the failure policy says so, a stop of the run.

Its life is the run's: the supervisor holds its stdin. When the program has exited and its group is reaped, the
supervisor writes the exit code there and waits (at most END_WAIT_S) for the sentinel's last events, its last
notifications and its restart decision (`restart.json`) before it records `exit_code`. EOF without a code (the
supervisor was killed) ends it too. It never touches a GPU beyond reading NVML / nvidia-smi, and writes only
events.jsonl, sentinel.log (its stdout/stderr), restart.json, stacks/ and captures/ (a stall's evidence) and, when it
stops the run, the `stopped` marker. With --exclude-unhealthy-gpus it reads the GPUs again before it asks for a
restart (gpurecheck.py): the next attempt gets the healthy ones, or none starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time

from dflashctl.agent.lib.flightrec import behind_from_record
from dflashctl.agent.lib.fsutil import read_json, try_write, write_atomic
from dflashctl.agent.lib.procfs import MARKER
from dflashctl.agent.lib.reaping import end_group
from dflashctl.agent.probe.flightdumps import flight_dumps
from dflashctl.agent.probe.gpus import GpuReader
from dflashctl.agent.probe.main import report
from dflashctl.agent.probe.request import ProbeRequest
from dflashctl.agent.stacks import capture
from dflashctl.analysis import judging
from dflashctl.analysis.events import EVENTS_FILE, Event
from dflashctl.analysis.watcher import StatusView
from dflashctl.analysis.watchspec import SentinelSpec
from dflashctl.model import Verdict
from dflashctl.report import parse_report
from dflashctl.sentinel.chain import restart_why
from dflashctl.sentinel.events import EventTracker
from dflashctl.sentinel.gpurecheck import recheck_within, refusal_message
from dflashctl.sentinel.notify import Notifier
from dflashctl.sentinel.policy import Decision, PolicyState

END_WAIT_S = 8.0  # the supervisor waits this long for the sentinel's end (exit_code waits on it)
FLUSH_S = 5.0  # of which the GPU re-check before a restart and the last notifications may take this long together
RECHECK_S = 4.0  # at most this of it for the GPU re-check
END_SMI_S = 2.0  # the watch's nvidia-smi once the run has ended: the one in flight is ended, the final one gets this
STOP_GRACE_S = 30.0  # a policy stop: SIGTERM, this long, then SIGKILL (as `dflashctl stop`)
READ_MAX = 4 << 20  # log bytes per read: a burst is read in several passes, memory stays bounded



def recorder_verdict(run_dir: str) -> list[str]:
    """Who is behind where, from the run's newest set of flight-recorder dumps (the capture just saved), as `status`
    says it; [] when they name no one or cannot be read (a capture never fails for it)."""
    try:
        doc = flight_dumps(run_dir) or {}
        return [behind_from_record(b).line() for b in doc.get("behind") or ()][:4]
    except Exception:  # noqa: BLE001 - a dump mid-write or malformed: the capture is still reported
        return []

class Sentinel:
    def __init__(self, run_dir: str, run_id: str, spec: SentinelSpec, gpu_health: dict | None = None) -> None:
        self.run_dir, self.run_id, self.spec = run_dir, run_id, spec
        self.gpu_health = gpu_health  # launch --exclude-unhealthy-gpus: what a restart re-checks (gpurecheck.py)
        self.workspace = os.path.dirname(os.path.dirname(os.path.abspath(run_dir)))
        self.watcher = judging.watcher(spec.host, spec.judge, live=True)  # as `status --watch` judges it
        self.tracker = EventTracker(run_id, policy=spec.policy)
        self.policy = PolicyState(spec.policy, judging.thresholds(spec.judge))
        self.notifier = Notifier(spec.targets, spec.kinds, spec.host, on_failure=self._delivery_failed,
                                 gather_s=spec.gather_s, min_gap_s=spec.min_gap_s)
        self.offset: int | None = 0
        self.inode: int | None = None
        self.next_gpus = 0.0
        self.ended = threading.Event()
        self.exit_code: int | None = None
        self.last: StatusView | None = None
        self._write_lock = threading.Lock()
        self.gpu_reader = GpuReader()  # NVML initialised once, device handles kept for the run's life
        self.hung: str | None = None  # "stalled" | "collective timeout" whose evidence was captured: once each

    # -- I/O at the edges -------------------------------------------------------------------------------------
    def append(self, event: Event) -> None:
        with self._write_lock, contextlib.suppress(OSError):
            fd = os.open(os.path.join(self.run_dir, EVENTS_FILE), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, event.to_line())
            finally:
                os.close(fd)

    def _delivery_failed(self, rec: dict) -> None:
        verdict = self.last.health.verdict.value if self.last else ""
        self.append(Event(time.time(), "notify-failed", self.run_id, verdict,
                          f"notification to {rec.get('target')} failed after {rec.get('attempts')} attempt(s): "
                          f"{rec.get('error')}", dict(rec)))

    def sample(self, *, final: bool = False) -> StatusView:
        gpus = final or time.monotonic() >= self.next_gpus
        if gpus:
            self.next_gpus = time.monotonic() + self.spec.gpu_interval_s
        req = ProbeRequest(workspace=self.workspace, run=self.run_id, log_max=READ_MAX, gpus=gpus)
        doc = report(req, self.offset, self.inode, self.gpu_reader)  # the probe's own report, read in-process
        if final and doc.get("run") is not None and self.exit_code is not None:
            # the supervisor has told us the code it is about to record: judge the run as it will stand
            doc["run"].update(alive=False, ending=False, exit_code=self.exit_code)
        rep = parse_report(doc)
        if rep.log is not None:
            self.offset, self.inode = rep.log.next_offset, rep.log.inode
        view = self.watcher.update(rep)
        self.last = view
        return view

    def stop_run(self, decision: Decision) -> None:
        """As `dflashctl stop` does it: the signal first (a full disk must not keep the GPUs busy), then the marker
        as best effort (so every reader says why), then grace and SIGKILL for the group on a thread of its own."""
        pid = (self.last.run.pid if self.last and self.last.run else None)
        if pid:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGTERM)
        unwritten: list = []
        try_write(os.path.join(self.run_dir, "stopped"), json.dumps({
            "by": "sentinel", "reason": decision.reason, "detail": decision.detail, "time": time.time(),
            "pid": pid}).encode(), unwritten)
        for u in unwritten:
            sys.stderr.write(f"[sentinel] stopped the run but could not write {u}\n")
        if pid:
            threading.Thread(target=end_group, args=(pid, STOP_GRACE_S), daemon=True, name="policy-stop").start()

    # -- the loop ---------------------------------------------------------------------------------------------
    def handle(self, view: StatusView) -> None:
        events = self.tracker.update(view)
        decision = self.policy.decide(view)
        if decision is not None:
            events.append(decision.to_event(view))
        for ev in events:
            self.append(ev)
            self.notifier.submit(ev)
        why = hang_reason(view)
        kind = why.partition(":")[0] if why is not None else None
        if kind is not None and kind != self.hung and view.run is not None and view.run.alive:
            threading.Thread(target=self.capture_stacks, args=(view, why), daemon=True, name="stacks").start()
            self.hung = kind
        elif kind is None:
            self.hung = None
        if decision is not None:
            self.stop_run(decision)

    def capture_stacks(self, view: StatusView, reason: str) -> None:
        """What every thread is doing, once per stall, saved in <run>/stacks/ (agent/stacks.py: py-spy, else our
        trainer's dump signal) and, with the flight recorder's dumps, in <run>/captures/<attempt>-<stamp>/ (one
        stacks file per rank); off the loop, since it may take seconds."""
        try:
            got = capture(self.run_dir, self.run_id, reason, attempt=self.spec.attempt)
        except Exception as e:  # noqa: BLE001 - a failed capture must not end the watch
            got = {"path": None, "reason": reason, "processes": [], "error": f"{type(e).__name__}: {e}"}
        dumped = got.get("dumped", 0)
        where = got.get("path") or "not saved"
        kept = got.get("capture") or {}
        if kept.get("dir"):
            ranks = sorted(s["rank"] for s in kept.get("stacks") or () if s.get("rank") is not None)
            where += (f"; with {len(kept.get('dumps') or ())} flight-recorder dump(s)"
                      + (f" and the stacks of rank(s) {','.join(map(str, ranks))}" if ranks else "")
                      + f" in {kept['dir']}")
            behind = recorder_verdict(self.run_dir) if kept.get("dumps") else []
            if behind:
                where += "; flight recorder: " + "; ".join(behind)
                got = dict(got, flight_recorder=behind)
        elif kept.get("error"):
            where += f"; no capture folder ({kept['error']})"
        self.append(Event(time.time(), "stacks", self.run_id, view.health.verdict.value,
                          f"stacks of {dumped} process(es) captured ({reason}): {where}",
                          dict(got, capture_dir=kept.get("dir"))))

    def gpus_for_restart(self, why: str, final: StatusView) -> tuple[str | None, dict | None]:
        """--exclude-unhealthy-gpus: the GPUs the next attempt gets (restart.json `gpus`), or no restart and an
        event (notified) that says which GPUs and why. A check that fails to run, or does not answer within
        RECHECK_S (nvidia-smi hangs after an Xid 79; the supervisor ends a sentinel END_WAIT_S after the run), leaves
        the restart as it was."""
        if not self.gpu_health or not self.gpu_health.get("pool"):
            return why, None
        attempt = self.spec.attempt + 1
        check = recheck_within(self.gpu_health, RECHECK_S)
        if isinstance(check, str):
            sys.stderr.write(f"[sentinel] GPU re-check before attempt {attempt} failed: {check}\n")
            return why, None
        if check.exclusion.refused is None:
            return why, check.to_record()
        ev = Event(time.time(), "restart", self.run_id, final.health.verdict.value, refusal_message(attempt, check),
                   {"attempt": attempt, "next_run": None, "why": why, "error": check.exclusion.refused,
                    "gpus": check.to_record()})
        self.append(ev)
        self.notifier.submit(ev)
        return None, None

    def watch_end(self, stream) -> None:  # noqa: ANN001 - the supervisor's pipe (a binary file)
        """The supervisor's word: one line with the exit code, or EOF (it is gone)."""
        try:
            line = stream.readline()
            self.exit_code = int(line.strip()) if line.strip() else None
        except (OSError, ValueError):
            self.exit_code = None
        self.gpu_reader.smi.cut(END_SMI_S)  # a hung nvidia-smi must not eat the supervisor's END_WAIT_S
        self.ended.set()

    def run(self) -> int:
        spec = self.spec
        self.append(Event(time.time(), "sentinel", self.run_id, "starting",
                          f"watching run {self.run_id} every {spec.interval_s:g} s"
                          + (f", notifying {len(spec.targets)} target(s)" if spec.targets else ""),
                          {"pid": os.getpid(), "interval_s": spec.interval_s, "attempt": spec.attempt,
                           "targets": [t.label for t in spec.targets], "kinds": list(spec.kinds),
                           "policy": spec.to_record()["policy"], "restart": spec.to_record()["restart"]}))
        threading.Thread(target=self.watch_end, args=(sys.stdin.buffer,), daemon=True, name="end").start()
        while not self.ended.is_set():
            started = time.monotonic()
            view = self.sample()
            self.handle(view)
            drained = view.run is None or self.offset is None or not self._more_log()
            if drained:
                self.ended.wait(max(0.0, spec.interval_s - (time.monotonic() - started)))
        while self._more_log():  # what the program wrote last, before judging its end
            self.handle(self.sample())
        final = self.sample(final=True)
        self.handle(final)
        gpus = None
        why = restart_why(spec.restart, spec.attempt, final, self.exit_code)
        checked = time.monotonic()
        if why is not None:
            why, gpus = self.gpus_for_restart(why, final)
        if why is not None:  # the decision first: the notifications get what is left of the supervisor's wait
            write_atomic(os.path.join(self.run_dir, "restart.json"), json.dumps(
                {"attempt": spec.attempt + 1, "why": why, "verdict": final.health.verdict.value,
                 "exit_code": self.exit_code, **({"gpus": gpus} if gpus is not None else {})}).encode())
        self.notifier.flush(max(0.5, FLUSH_S - (time.monotonic() - checked)))
        self.notifier.close()
        self.gpu_reader.close()
        return 0

    def _more_log(self) -> bool:
        try:
            return os.stat(os.path.join(self.run_dir, "train.log")).st_size > (self.offset or 0)
        except OSError:
            return False


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write("usage: python3 agent.pyz sentinel RUN_DIR\n")
        return 2
    run_dir = argv[0]
    launch = read_json(os.path.join(run_dir, "launch.json")) or {}
    spec = SentinelSpec.from_record(launch.get("sentinel") or {"host": "?"})
    run_id = os.environ.get(MARKER) or os.path.basename(os.path.abspath(run_dir))
    gpu_health = launch.get("gpu_health")
    return Sentinel(run_dir, run_id, spec, gpu_health if isinstance(gpu_health, dict) else None).run()


def hang_reason(view: StatusView) -> str | None:
    """Why the run's evidence should be captured now: a stall (with its GPU shape where seen), or a collective that
    timed out (the ranks are about to be torn down); None otherwise."""
    if any(h.signature.id == "nccl-timeout" for h in view.health.hits):
        return "collective timeout"
    if view.health.verdict == Verdict.STALLED:
        shape = view.health.stall_shape
        return f"stalled: {shape}" if shape else "stalled"
    return None
