"""Signal processes of runs inside the container, checking recorded state against reality first
(stdlib only; runs there). SkyPilot's shape: SIGTERM, grace period, SIGKILL, then verify.

A run is its process tree (issue 24): `stop` ends every process of it, found again at stop time (procfs.run_tree:
the trainer or adopted process, what adopt recorded, everything below them by parent links, everything carrying the
run's marker), whether or not anything leads a group, and looks again while it waits (a child forked during the
grace is ended too). Every pid is re-checked just before it is signalled: same start time (a reused pid has
another) and, for kill-zombies, the marker we were shown (DFLASH_RUN_ID, or none for a pid the user named). A
process that is gone or defunct counts as ended: a defunct one holds no memory and waits only to be reaped.

Signals before bookkeeping (issue 26): the `stopped` marker and `exit_code` are written after the first signal and
as best effort; what could not be written (a full disk) is reported, never a reason to leave the run running.
What a killed compile left half-written in its cache is removed afterwards (lib/compilecache.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time

from dflashctl.agent.lib.compilecache import cache_dirs_of, remove_half_written
from dflashctl.agent.lib.frame import reply
from dflashctl.agent.lib.fsutil import read_int, try_write
from dflashctl.agent.lib.procfs import (
    ancestors,
    boot_time,
    is_process,
    proc_cmdline,
    proc_marker,
    proc_stat,
    process_table,
    run_tree,
    same_process,
)
from dflashctl.agent.lib.reaping import KILL_WAIT_S


def _ended(pid: int, starttime: int | None) -> bool:
    st = proc_stat(pid)
    return st is None or st["state"] in ("Z", "X") or (starttime is not None and st["starttime"] != starttime)


def kill(spec: dict) -> int:
    """spec: {"targets": [{"pid", "starttime", "marker"}], "grace_s"}. Per pid: verified, signalled,
    ended. A pid whose start time or marker changed since the scan is left alone ("changed")."""
    results = {}
    live = []
    caches: list = []
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
        caches.extend(d for d in cache_dirs_of(pid) if d not in caches)  # read before it can go
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError as e:
            results[pid] = {"outcome": "error", "detail": str(e)}
            continue
        live.append(t)
    results.update(_grace_then_kill(live, float(spec.get("grace_s", 10.0))))
    btime, tck = boot_time(), float(os.sysconf("SC_CLK_TCK"))
    removed, failed = remove_half_written(caches, {int(t["pid"]): btime + int(t["starttime"]) / tck for t in live})
    return reply({"results": {str(k): v for k, v in results.items()}, "cache_removed": removed,
                  "cache_failed": failed})


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


def _mark(run_dir: str, pid: int | None, unwritten: list) -> None:
    """The `stopped` marker: the user stopped this run (status reads it; the supervisor records the stop's code)."""
    try_write(os.path.join(run_dir, "stopped"),
              json.dumps({"by": "dflashctl stop", "time": time.time(), "pid": pid}).encode(), unwritten)


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
    unwritten: list = []
    if alive:
        _mark(run_dir, pid, unwritten)
    return reply({"marked": alive and not unwritten, "pid": pid, **({"unwritten": unwritten} if unwritten else {})})


def _exclude(run_dir: str, trainer: int | None, table: dict) -> set:
    """Never part of the tree we end: the supervisor and its other children (the sentinel: it records the end and
    leaves by itself), and this program with everything above it."""
    out = ancestors(os.getpid(), table)
    sup = read_int(os.path.join(run_dir, "supervisor.pid"))
    if sup and sup in table:
        out.add(sup)
        out.update(p for p, st in table.items() if st["ppid"] == sup and p != trainer)
    return out


def tree_finder(spec: dict):  # noqa: ANN201 - () -> {pid: starttime}
    """The run's tree as it stands at each call (procfs.run_tree), the roots checked again each time."""
    run_dir, run_id, identity = spec["run_dir"], spec["run_id"], spec.get("identity")
    recorded = (identity or {}).get("tree") or []
    trainer = None if identity is not None else read_int(os.path.join(run_dir, "pid"))

    def find() -> dict:
        table = process_table()
        if identity is not None:
            roots = [int(identity["pid"])] if is_process(identity) else []
        else:
            roots = [trainer] if trainer and _ours_alive(trainer, run_id) else []
        return run_tree(run_id, run_dir, roots, recorded, _exclude(run_dir, trainer, table), table)

    return find


def end_tree(find, grace_s: float, after_first_signal=None) -> dict | None:  # noqa: ANN001
    """SIGTERM every process find() names, then (looking again every poll) each newcomer, grace, SIGKILL what is
    left, wait until nothing is. None when find() names nothing. Returns {"members": [{pid, cmdline, outcome}],
    "escalated", "survivors": [{pid, cmdline}], "cache_removed", "cache_failed"}."""
    seen: dict = {}
    cmdlines: dict = {}
    caches: list = []
    sent: dict = {}

    def hit(found: dict, sig: int) -> None:
        for pid, start in found.items():  # read them all first: a signalled process's parent may exit at once
            if pid not in seen:
                seen[pid], cmdlines[pid] = start, proc_cmdline(pid, 200)
                caches.extend(d for d in cache_dirs_of(pid) if d not in caches)
        for pid, start in found.items():
            if same_process(pid, start):  # the start time checked right before the signal: never a reused pid
                with contextlib.suppress(OSError):
                    os.kill(pid, sig)
                    sent[pid] = sig

    first = find()
    if not first:
        return None
    hit(first, signal.SIGTERM)
    if after_first_signal is not None:
        after_first_signal()
    escalated = False
    deadline = time.time() + grace_s
    while True:
        new = {p: s for p, s in find().items() if p not in seen}
        if new:
            hit(new, signal.SIGKILL if escalated else signal.SIGTERM)
        alive = {p: s for p, s in seen.items() if same_process(p, s)}
        if not alive:
            break
        if time.time() >= deadline:
            if escalated:
                break
            escalated = True
            hit(alive, signal.SIGKILL)
            deadline = time.time() + KILL_WAIT_S
        time.sleep(0.05 if escalated else 0.1)
    survivors = [p for p, s in seen.items() if same_process(p, s)]
    btime, tck = boot_time(), float(os.sysconf("SC_CLK_TCK"))
    removed, failed = remove_half_written(caches, {p: btime + s / tck for p, s in seen.items()})
    members = [{"pid": p, "cmdline": cmdlines[p],
                "outcome": "survived" if p in survivors else "killed" if sent.get(p) == signal.SIGKILL
                else "terminated"} for p in sorted(seen)]
    return {"members": members, "escalated": escalated,
            "survivors": [{"pid": p, "cmdline": cmdlines[p]} for p in sorted(survivors)],
            "cache_removed": removed, "cache_failed": failed}


def stop(spec: dict) -> int:
    """spec: {"run_dir", "run_id", "grace_s", "identity"}: end one run's whole process tree, then record it.
    identity: an adopted run's process (procfs.process_identity's record, with adopt's `tree`)."""
    run_dir, run_id = spec["run_dir"], spec["run_id"]
    grace_s = float(spec.get("grace_s", 30.0))
    identity = spec.get("identity")
    pid = int(identity["pid"]) if identity is not None else read_int(os.path.join(run_dir, "pid"))
    code = read_int(os.path.join(run_dir, "exit_code"))
    if identity is None and pid is None and code is None:
        return _stop_waiting(run_dir, run_id, grace_s)
    unwritten: list = []
    ended = end_tree(tree_finder(spec), grace_s, lambda: _mark(run_dir, pid, unwritten))
    if ended is None:
        st = proc_stat(pid) if pid else None
        return reply({"outcome": "not-running", "exit_code": code, "pid": pid,
                      "changed": identity is not None and st is not None and st["state"] not in ("Z", "X")})
    escalated = ended["escalated"]
    recorded_by = "stop"
    if identity is None:  # the supervisor records the exit code; give it a moment, and write it ourselves if not
        end = time.time() + 5.0
        new = read_int(os.path.join(run_dir, "exit_code"))
        while new is None and time.time() < end and _supervisor_alive(run_dir, run_id):
            time.sleep(0.1)
            new = read_int(os.path.join(run_dir, "exit_code"))
        if new is not None and code is None:
            code, recorded_by = new, "supervisor"
    if recorded_by == "stop" or code is None:
        code = 137 if escalated else 143 if code is None else code
        if not try_write(os.path.join(run_dir, "exit_code"), f"{code}\n".encode(), unwritten):
            recorded_by = "none"
    return reply({"outcome": "stopped", "pid": pid, "exit_code": code, "escalated": escalated,
                  "recorded_by": recorded_by, "ended": not ended["survivors"], **ended, "unwritten": unwritten})


def _supervisor_alive(run_dir: str, run_id: str) -> bool:
    return _ours_alive(read_int(os.path.join(run_dir, "supervisor.pid")), run_id)


def _stop_waiting(run_dir: str, run_id: str, grace_s: float) -> int:
    """A restart attempt still waiting to start its program (backoff, GPU memory): its supervisor ends the wait
    on SIGTERM and records 143 without starting anything."""
    sup = read_int(os.path.join(run_dir, "supervisor.pid"))
    if not sup or proc_marker(sup) != run_id:
        return reply({"outcome": "not-running", "exit_code": None, "pid": None})
    unwritten: list = []
    with contextlib.suppress(OSError):
        os.kill(sup, signal.SIGTERM)
    _mark(run_dir, sup, unwritten)
    end = time.time() + grace_s
    code = read_int(os.path.join(run_dir, "exit_code"))
    while code is None and time.time() < end:
        time.sleep(0.1)
        code = read_int(os.path.join(run_dir, "exit_code"))
    if code is None:
        code = 143
        try_write(os.path.join(run_dir, "exit_code"), b"143\n", unwritten)
    return reply({"outcome": "stopped", "pid": sup, "exit_code": code, "escalated": False,
                  "recorded_by": "supervisor", "ended": True, "members": [], "survivors": [],
                  "unwritten": unwritten})
