"""`adopt`: record a run for a process dflashctl did not start (stdlib only; the `adopt` verb of the agent archive).

meta.json kind "adopted" with the process's identity (pid, start time, boot time, argv, cwd) and its process tree as
it stands now (`tree`: every descendant's pid, start time and argv; `writes_log`: which of them hold the log open),
`pid`, and `train.log` a symlink to the log it writes. Under the same lock as launch: never beside a live run. The
tree is what `stop` ends with it (found again at stop time, agent/reaper.py) and what keeps the run alive when the
adopted process itself is gone (runstate.liveness): a shell wrapping the trainer (`bash -c 'python3 train.py >
log'`) is adopted together with the trainer it waits for.
"""

from __future__ import annotations

import contextlib
import os

from dflashctl.agent.lib.frame import emit
from dflashctl.agent.lib.fsutil import read_bytes, write_atomic
from dflashctl.agent.lib.procfs import descendants, proc_argv, proc_marker, proc_stat, process_identity, process_table
from dflashctl.agent.lib.rundir import lock_runs, mkdir_exclusive, now_iso, point_latest
from dflashctl.agent.lib.runmeta import write_meta
from dflashctl.agent.lib.runstate import adopted_by, live_latest


def adopt(spec: dict) -> int:
    """spec: {runs_dir, base_id, pid, starttime (as the client saw it), log, meta}. Refusals, as {"error"}:
    no-such-pid (gone, defunct, or its start time changed: another process now), marked (a process of a run
    we started), already-adopted, run-alive, no-log, log-not-file."""
    pid = int(spec["pid"])
    if pid == 1:
        return emit({"error": "init", "message": "pid 1 is the container's init, not a training process"})
    st = proc_stat(pid)
    if st is None or st["state"] in ("Z", "X"):
        return emit({"error": "no-such-pid", "message": f"process {pid} " + ("has exited (defunct)" if st is not None
                                                                              else "does not exist")})
    if spec.get("starttime") is not None and st["starttime"] != int(spec["starttime"]):
        return emit({"error": "no-such-pid", "message": f"process {pid} exited (the pid now names another process)"})
    if not (read_bytes(f"/proc/{pid}/cmdline", 16) or b""):
        return emit({"error": "kernel-thread", "message": f"pid {pid} is a kernel thread (it has no command line)"})
    marker = proc_marker(pid)
    if marker:
        return emit({"error": "marked", "message": f"pid {pid} is part of run {marker}, which dflashctl launched",
                      "run_id": marker})
    runs_dir = spec["runs_dir"]
    lock_runs(runs_dir)
    identity = _identity(pid)
    if identity is None:
        return emit({"error": "no-such-pid", "message": f"process {pid} exited"})
    table = process_table()
    tree = [{"pid": k, "starttime": table[k]["starttime"], "cmdline": proc_argv(k) or []}
            for k in sorted(descendants([pid], table))]
    already = adopted_by(runs_dir, identity)
    if already:
        return emit({"error": "already-adopted", "message": f"pid {pid} is already adopted as run {already}",
                      "run_id": already})
    live = live_latest(runs_dir)
    if live:
        return emit({"error": "run-alive", "message": f"run {live} is still running", "run_id": live})
    log = spec["log"]
    if not os.path.isabs(log):  # `nohup prog > train.log &` names it relative to where it was started
        log = os.path.join(identity["cwd"] or "/", log)
    log = os.path.normpath(log)
    if not os.path.exists(log):
        return emit({"error": "no-log", "message": f"log {log} does not exist"})
    if not os.path.isfile(log):
        return emit({"error": "log-not-file", "message": f"log {log} is not a regular file"})
    writers = log_writers(log, [pid, *(t["pid"] for t in tree)])
    try:
        run_id, run_dir = mkdir_exclusive(runs_dir, spec["base_id"])
    except (OSError, RuntimeError) as e:
        return emit({"error": "run-dir", "message": str(e)})
    meta = dict(spec.get("meta") or {})
    meta.update({
        "id": run_id,
        "run_dir": run_dir,
        "kind": "adopted",
        "argv": identity["cmdline"],
        "cwd": identity["cwd"],
        "log": log,
        "adopted": {**{k: identity[k] for k in ("pid", "starttime", "boot_time", "clk_tck", "start_epoch",
                                                "cmdline")}, "tree": tree, "writes_log": writers},
        "started_at": now_iso(identity["start_epoch"]),
        "started_at_epoch": identity["start_epoch"],
        "adopted_at": now_iso(),
        "launched_by": "hand (adopted by dflashctl)",
    })
    write_meta(run_dir, meta)
    write_atomic(os.path.join(run_dir, "pid"), f"{pid}\n".encode())
    os.symlink(log, os.path.join(run_dir, "train.log"))  # the probe, logs and status read the adopted log
    point_latest(runs_dir, run_id)
    return emit({"run_id": run_id, "run_dir": run_dir, "pid": pid, "log": log, "cmdline": identity["cmdline"],
                  "cwd": identity["cwd"], "started_at": meta["started_at"], "pgid": identity["pgid"],
                  "tree": tree, "writes_log": writers})


def log_writers(log: str, pids: list) -> list:
    """Which of pids hold the log open (/proc/PID/fd links): the process that writes it, where a shell wraps it."""
    want = os.path.realpath(log)
    out = []
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                if os.readlink(os.path.join(fd_dir, fd)) == want:
                    out.append(pid)
                    break
    return out


def _identity(pid: int) -> dict | None:
    from_util = process_identity(pid)
    if from_util is None:
        return None
    try:
        from_util["cwd"] = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        from_util["cwd"] = None
    return from_util
