"""The probe (the program): its request (request.py, the one spelling of its options), one framed report per line
(`lib/frame.py`), and the --watch loop.

It runs from the agent archive (`probe` verb, agent/verbs.py; remote/agentcall.py); the laptop
side is dflashctl/remote/probe.py. A --watch sends a report every --interval, and one at once (at most every
0.1 s) when the run's log shows a crash or the run ends (logwait.py): the interval paces the idle updates only."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import TYPE_CHECKING

from dflashctl.agent.lib.frame import reply
from dflashctl.agent.lib.runstate import list_runs, log_tail, resolve_run, run_ids, run_state
from dflashctl.agent.probe.flightdumps import flight_dumps
from dflashctl.agent.probe.gpus import GpuReader, gpu_report
from dflashctl.agent.probe.layouts import rank_layouts
from dflashctl.agent.probe.logtail import read_log
from dflashctl.agent.probe.procs import host_gpu_procs, scan_procs
from dflashctl.agent.probe.request import ProbeRequest
from dflashctl.agent.probe.version import PROBE_VERSION
from dflashctl.agent.probe.xid import xid_report

if TYPE_CHECKING:
    from dflashctl.agent.probe.logwait import LogWaiter  # --watch only (inotify, ctypes): loaded there

CAPTURE_MAX = 1 << 20  # a saved stack capture larger than this is not sent with the status report
EVENTS_MAX = 64 << 10  # of a run's events.jsonl (the sentinel's timeline: a few hundred bytes per event)


def disk_free(path: str) -> dict | None:
    while path and not os.path.exists(path):
        path = os.path.dirname(path.rstrip("/")) or "/"
    try:
        st = os.statvfs(path or "/")
    except OSError:
        return None
    return {"path": path, "free_mib": st.f_bavail * st.f_frsize / 1048576.0,
            "total_mib": st.f_blocks * st.f_frsize / 1048576.0}


def newest_capture(run_dir: str) -> dict | None:
    """The newest stack capture the run's sentinel saved (stacks/capture-*.json), whole; None when there is none
    or it is too big to send with every report (`dflashctl stacks` reads live ones)."""
    folder = os.path.join(run_dir, "stacks")
    try:
        names = sorted(n for n in os.listdir(folder) if n.startswith("capture-") and n.endswith(".json"))
        path = os.path.join(folder, names[-1]) if names else None
        if path is None or os.path.getsize(path) > CAPTURE_MAX:
            return None
        with open(path, "rb") as f:
            return {"path": path, "doc": json.loads(f.read())}
    except (OSError, ValueError):
        return None


def report(args: ProbeRequest, offset, inode, gpu_reader: GpuReader | None = None) -> dict:
    """One report; gpu_reader: the GPU reader a --watch keeps (NVML handles, nvidia-smi's field list), else a
    one-shot read."""
    # nvidia-smi runs while we read the rest; not beside a process scan, which would see it (on a real driver it
    # holds /dev/nvidia*)
    gpus = _Soon(gpu_report) if args.gpus and gpu_reader is None and not args.procs else None
    # hostname: uname's nodename is what gethostname(2) returns (and `socket` costs ~3 ms at import)
    doc = {"probe_version": PROBE_VERSION, "time": time.time(), "hostname": os.uname().nodename,
           "run": None, "run_requested": args.run, "log": None}
    if args.workspace:
        runs_dir = os.path.join(args.workspace, "runs")
        doc["disk"] = disk_free(args.workspace)
        if args.run:
            found = resolve_run(runs_dir, args.run)
            if found:
                doc["run"] = run_state(*found)
                doc["log"] = read_log(os.path.join(found[1], "train.log"), offset, args.log_max, inode)
                if args.events:
                    doc["events_b64"] = log_tail(os.path.join(found[1], "events.jsonl"), EVENTS_MAX)
                    doc["stacks_capture"] = newest_capture(found[1])
                    # what status shows beside the sentinel's records: every rank's layout, the recorder's dumps
                    doc["layouts"] = rank_layouts(found[1], doc["run"].get("heartbeat"))
                    doc["flight_recorder"] = flight_dumps(found[1])
        if args.runs:
            doc["runs"] = list_runs(runs_dir)
    if args.gpus:
        doc["gpus"] = gpus.result() if gpus is not None else gpu_report(gpu_reader)
    if args.procs:
        doc["procs"] = scan_procs(exclude=(os.getpid(),), include=args.pids,
                                  runs_dir=os.path.join(args.workspace, "runs") if args.workspace else None)
        if args.workspace:
            doc["run_ids"] = run_ids(os.path.join(args.workspace, "runs"))
    if args.host_gpu_procs:
        doc["host_gpu_procs"] = host_gpu_procs(args.host_gpu_procs)
    if args.xid:
        doc["xid"] = xid_report()
    return doc


class _Soon:
    """A one-shot report's GPU reading on a thread of its own, begun first: a reading is mostly waiting for
    nvidia-smi to start (tens of ms), which now overlaps the log, process and disk reads instead of following them."""

    def __init__(self, read) -> None:  # noqa: ANN001 - read: () -> the gpus piece
        self._got: dict = {}
        self._thread = threading.Thread(target=self._run, args=(read,), name="gpus", daemon=True)
        self._thread.start()

    def _run(self, read) -> None:  # noqa: ANN001
        try:
            self._got["value"] = read()
        except BaseException as e:  # noqa: BLE001 - raised again where the reading is taken, as before
            self._got["error"] = e

    def result(self) -> dict:
        self._thread.join()
        if "error" in self._got:
            raise self._got["error"]
        return self._got["value"]


def sample_gpus(reader: GpuReader | None, every: float, start: float, until: float,
                waiter: LogWaiter | None = None) -> tuple[list, bool]:
    """GPU readings every `every` seconds after `start` until `until`, where the next report takes the interval's
    last one; each stamped with its time. A slow reading skips the moments it missed rather than catch up.
    With a waiter: (readings, True) as soon as the log shows something that matters (the report goes out now)."""
    out = []
    due = start + every
    while due < until - every / 2:
        if _pause(waiter, due):
            return out, True
        t = time.time()
        out.append(dict(gpu_report(reader), time=t))
        while due <= time.time():
            due += every
    return out, False


def _pause(waiter: LogWaiter | None, until: float) -> bool:
    if waiter is None:
        time.sleep(max(0.0, until - time.time()))
        return False
    return waiter.wait(until)


def _waiter() -> LogWaiter:
    from dflashctl.agent.probe.logwait import LogWaiter

    return LogWaiter()


def main(argv: list) -> int:
    try:
        args = ProbeRequest.from_argv(list(argv))
    except ValueError as e:
        sys.stderr.write(f"{e}\n")
        return 2
    offset, inode = args.log_offset, args.log_inode
    gpu_every = min(args.gpu_interval, args.interval) if args.gpu_interval and args.gpu_interval > 0 \
        else args.interval
    series = []  # --watch --gpus: the GPU readings taken since the last report
    gpus = GpuReader() if args.watch and args.gpus else None  # one NVML init / smi field list for the whole watch
    waiter = _waiter() if args.watch and args.workspace and args.run else None  # ends a wait on a crash
    try:
        while True:
            started = time.time()
            doc = report(args, offset, inode, gpus)
            if args.watch and args.gpus:  # the report's own reading is the interval's last
                doc["gpus_series"] = [*series, dict(doc["gpus"], time=doc["time"])]
            reply(doc)
            if not args.watch:
                return 0
            log = doc.get("log")
            if log is not None:
                offset, inode = log["next_offset"], log["inode"]
            elif doc.get("run") is None:
                offset, inode = None, None  # a new latest run will start from its tail
            if waiter is not None:
                waiter.follow(doc)
            until = started + args.interval
            series, now = sample_gpus(gpus, gpu_every, started, until, waiter) if args.gpus else ([], False)
            if not now:
                _pause(waiter, until)
    except (BrokenPipeError, KeyboardInterrupt):
        return 0
    finally:
        if gpus is not None:
            gpus.close()
        if waiter is not None:
            waiter.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
