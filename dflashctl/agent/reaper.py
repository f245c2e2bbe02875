"""Signal processes of runs inside the container, checking recorded state against reality first
(stdlib only; runs there). SkyPilot's shape: SIGTERM, grace period, SIGKILL, then verify.

Every pid is re-checked just before it is signalled: same start time (a reused pid has another)
and the marker we were shown (DFLASH_RUN_ID, or none for a pid the user named). A process that
is gone or defunct counts as ended: a defunct one holds no memory and waits only to be reaped.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time

from dflashctl.agent.lib.frame import reply
from dflashctl.agent.lib.fsutil import read_int, write_atomic
from dflashctl.agent.lib.procfs import group_live, is_process, proc_marker, proc_stat
from dflashctl.agent.lib.reaping import KILL_WAIT_S, end_group


def _ended(pid: int, starttime: int | None) -> bool:
    st = proc_stat(pid)
    return st is None or st["state"] in ("Z", "X") or (starttime is not None and st["starttime"] != starttime)


def kill(spec: dict) -> int:
    """spec: {"targets": [{"pid", "starttime", "marker"}], "grace_s"}. Per pid: verified, signalled,
    ended. A pid whose start time or marker changed since the scan is left alone ("changed")."""
    results = {}
    live = []
    for t in spec["targets"]:
        pid = int(t["pid"])
        st = proc_stat(pid)
        if st is None:
            results[pid] = {"outcome": "gone-before"}
            continue
        if st["starttime"] != t["starttime"] or proc_marker(pid) != t.get("marker"):
            results[pid] = {"outcome": "changed", "detail": "start time or marker differs from the scan: not ours"}
            continue
        if st["state"] == "Z":
            results[pid] = {"outcome": "defunct", "detail": f"defunct; reaped when parent {st['ppid']} reaps it"}
            continue
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError as e:
            results[pid] = {"outcome": "error", "detail": str(e)}
            continue
        live.append(t)
    results.update(_grace_then_kill(live, float(spec.get("grace_s", 10.0))))
    return reply({"results": {str(k): v for k, v in results.items()}})


def _grace_then_kill(live: list, grace_s: float) -> dict:
    pending = list(live)
    deadline = time.time() + grace_s
    while pending and time.time() < deadline:
        time.sleep(0.1)
        pending = [t for t in pending if not _ended(int(t["pid"]), t["starttime"])]
    results = {int(t["pid"]): {"outcome": "terminated", "detail": "ended after SIGTERM"}
               for t in live if t not in pending}
    for t in pending:
        with contextlib.suppress(OSError):
            os.kill(int(t["pid"]), signal.SIGKILL)
    killed = list(pending)
    end = time.time() + KILL_WAIT_S
    while pending and time.time() < end:
        time.sleep(0.1)
        pending = [t for t in pending if not _ended(int(t["pid"]), t["starttime"])]
    for t in killed:
        ok = t not in pending
        results[int(t["pid"])] = {"outcome": "killed" if ok else "survived",
                                  "detail": "SIGKILL after the grace period" if ok else "alive after SIGKILL"}
    return results


def _mark(run_dir: str, pid: int) -> None:
    """The `stopped` marker: the user stopped this run (status reads it; the supervisor records the stop's code)."""
    write_atomic(os.path.join(run_dir, "stopped"),
                 json.dumps({"by": "dflashctl stop", "time": time.time(), "pid": pid}).encode())


def _ours_alive(pid: int | None, run_id: str) -> bool:
    st = proc_stat(pid) if pid else None
    return st is not None and st["state"] not in ("Z", "X") and proc_marker(pid) == run_id


def mark(spec: dict) -> int:
    """spec: {"run_dir", "run_id"}: the marker alone, on a run that is alive (its pid carries our marker). A run
    across hosts marks every node before any is signalled (commands/cluster_runs.stop_all): a node whose workers
    end because a peer's did, before its own stop arrives, then reads as stopped, not crashed."""
    run_dir = spec["run_dir"]
    pid = read_int(os.path.join(run_dir, "pid"))
    alive = _ours_alive(pid, spec["run_id"])
    if alive:
        _mark(run_dir, pid)
    return reply({"marked": alive, "pid": pid})


def stop(spec: dict) -> int:
    """spec: {"run_dir", "run_id", "grace_s", "identity"}: stop one run's process group and record it.
    identity (an adopted run's process, procfs.process_identity's record): see _stop_adopted."""
    if spec.get("identity") is not None:
        return _stop_adopted(spec)
    run_dir, run_id = spec["run_dir"], spec["run_id"]
    pid = read_int(os.path.join(run_dir, "pid"))
    code = read_int(os.path.join(run_dir, "exit_code"))
    if pid is None and code is None:
        return _stop_waiting(run_dir, run_id, float(spec.get("grace_s", 30.0)))
    if not _ours_alive(pid, run_id):
        return reply({"outcome": "not-running", "exit_code": code, "pid": pid})
    _mark(run_dir, pid)
    escalated = end_group(pid, float(spec.get("grace_s", 30.0)))
    if escalated is None:  # it leads no group: the process alone
        os.kill(pid, signal.SIGTERM)
        escalated = False
    # The supervisor records the exit code; give it a moment, and write it ourselves if it is gone.
    end = time.time() + 5.0
    code = read_int(os.path.join(run_dir, "exit_code"))
    while code is None and time.time() < end:
        time.sleep(0.1)
        code = read_int(os.path.join(run_dir, "exit_code"))
    recorded_by = "supervisor"
    if code is None:
        code = 137 if escalated else 143
        write_atomic(os.path.join(run_dir, "exit_code"), f"{code}\n".encode())
        recorded_by = "stop"
    return reply({"outcome": "stopped", "pid": pid, "exit_code": code, "escalated": escalated,
                  "recorded_by": recorded_by, "ended": _group_ended(pid)})


def _stop_waiting(run_dir: str, run_id: str, grace_s: float) -> int:
    """A restart attempt still waiting to start its program (backoff, GPU memory): its supervisor ends the wait
    on SIGTERM and records 143 without starting anything."""
    sup = read_int(os.path.join(run_dir, "supervisor.pid"))
    if not sup or proc_marker(sup) != run_id:
        return reply({"outcome": "not-running", "exit_code": None, "pid": None})
    _mark(run_dir, sup)
    with contextlib.suppress(OSError):
        os.kill(sup, signal.SIGTERM)
    end = time.time() + grace_s
    code = read_int(os.path.join(run_dir, "exit_code"))
    while code is None and time.time() < end:
        time.sleep(0.1)
        code = read_int(os.path.join(run_dir, "exit_code"))
    if code is None:
        code = 143
        write_atomic(os.path.join(run_dir, "exit_code"), b"143\n")
    return reply({"outcome": "stopped", "pid": sup, "exit_code": code, "escalated": False,
                  "recorded_by": "supervisor", "ended": True})


def _stop_adopted(spec: dict) -> int:
    """A process dflashctl did not start: no marker, no supervisor. Its identity (pid, start time, boot, argv)
    is checked right before every signal, so a pid reused since the adopt is never signalled. SIGTERM goes to
    its process group when it leads one (else to the pid), then grace, then SIGKILL the same way; what is left
    of a group it led once it is gone gets SIGKILL only while nothing else holds its pid. We record the exit code
    (143 after SIGTERM, 137 after SIGKILL: nobody can wait for a process that is not its child) and `stopped`."""
    run_dir, identity = spec["run_dir"], spec["identity"]
    pid = int(identity["pid"])
    code = read_int(os.path.join(run_dir, "exit_code"))
    st = proc_stat(pid)
    if not is_process(identity) or st is None:
        return reply({"outcome": "not-running", "exit_code": code, "pid": pid,
                      "changed": st is not None and st["state"] not in ("Z", "X")})
    leads = st["pgid"] == pid

    def signal_it(sig: int) -> bool:
        if not is_process(identity):
            return False
        with contextlib.suppress(OSError):
            if leads:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        return True

    def ended() -> bool:
        return not is_process(identity) and (not leads or _group_ended(pid))

    _mark(run_dir, pid)
    signal_it(signal.SIGTERM)
    escalated = False
    deadline = time.time() + float(spec.get("grace_s", 30.0))
    while not ended() and time.time() < deadline:
        time.sleep(0.1)
    if not ended():
        escalated = True
        if not signal_it(signal.SIGKILL) and leads:
            now = proc_stat(pid)  # the leader is gone; its group's pid is not reused while members remain
            if now is None or now["state"] in ("Z", "X"):
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
        end = time.time() + 5.0
        while not ended() and time.time() < end:
            time.sleep(0.1)
    code = 137 if escalated else 143
    write_atomic(os.path.join(run_dir, "exit_code"), f"{code}\n".encode())
    return reply({"outcome": "stopped", "pid": pid, "exit_code": code, "escalated": escalated,
                  "recorded_by": "stop", "ended": ended()})


def _group_ended(pgid: int) -> bool:
    """True when no live (non-defunct) process is left in the group."""
    return not group_live(pgid)
