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
import sys
import time

FRAME = "DFLASH-RESULT "
MARKER = "DFLASH_RUN_ID"


def _emit(doc: dict) -> int:
    sys.stdout.write(FRAME + json.dumps(doc) + "\n")
    sys.stdout.flush()
    return 0


def _stat(pid: int) -> dict | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    rest = text[text.rfind(")") + 2:].split()
    return {"state": rest[0], "ppid": int(rest[1]), "pgid": int(rest[2]), "starttime": int(rest[19])}


def _marker(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:
        return None
    for item in data.split(b"\0"):
        if item.startswith(MARKER.encode() + b"="):
            return item[len(MARKER) + 1:].decode("utf-8", "replace")
    return None


def _ended(pid: int, starttime: int | None) -> bool:
    st = _stat(pid)
    return st is None or st["state"] in ("Z", "X") or (starttime is not None and st["starttime"] != starttime)


def _write_atomic(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def kill(spec: dict) -> int:
    """spec: {"targets": [{"pid", "starttime", "marker"}], "grace_s"}. Per pid: verified, signalled,
    ended. A pid whose start time or marker changed since the scan is left alone ("changed")."""
    results = {}
    live = []
    for t in spec["targets"]:
        pid = int(t["pid"])
        st = _stat(pid)
        if st is None:
            results[pid] = {"outcome": "gone-before"}
            continue
        if st["starttime"] != t["starttime"] or _marker(pid) != t.get("marker"):
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
    return _emit({"results": {str(k): v for k, v in results.items()}})


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
    end = time.time() + 5.0
    while pending and time.time() < end:
        time.sleep(0.1)
        pending = [t for t in pending if not _ended(int(t["pid"]), t["starttime"])]
    for t in killed:
        ok = t not in pending
        results[int(t["pid"])] = {"outcome": "killed" if ok else "survived",
                                  "detail": "SIGKILL after the grace period" if ok else "alive after SIGKILL"}
    return results


def stop(spec: dict) -> int:
    """spec: {"run_dir", "run_id", "grace_s"}: stop one run's process group and record it."""
    run_dir, run_id = spec["run_dir"], spec["run_id"]
    pid = _read_int(os.path.join(run_dir, "pid"))
    code = _read_int(os.path.join(run_dir, "exit_code"))
    st = _stat(pid) if pid else None
    if pid is None or st is None or st["state"] in ("Z", "X") or _marker(pid) != run_id:
        return _emit({"outcome": "not-running", "exit_code": code, "pid": pid})
    _write_atomic(os.path.join(run_dir, "stopped"),
                  json.dumps({"by": "dflashctl stop", "time": time.time(), "pid": pid}).encode())
    try:
        os.killpg(pid, signal.SIGTERM)
    except OSError:
        os.kill(pid, signal.SIGTERM)
    escalated = False
    deadline = time.time() + float(spec.get("grace_s", 30.0))
    while not _group_ended(pid) and time.time() < deadline:
        time.sleep(0.1)
    if not _group_ended(pid):
        escalated = True
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
        end = time.time() + 5.0
        while not _group_ended(pid) and time.time() < end:
            time.sleep(0.1)
    # The supervisor records the exit code; give it a moment, and write it ourselves if it is gone.
    end = time.time() + 5.0
    code = _read_int(os.path.join(run_dir, "exit_code"))
    while code is None and time.time() < end:
        time.sleep(0.1)
        code = _read_int(os.path.join(run_dir, "exit_code"))
    recorded_by = "supervisor"
    if code is None:
        code = 137 if escalated else 143
        _write_atomic(os.path.join(run_dir, "exit_code"), f"{code}\n".encode())
        recorded_by = "stop"
    return _emit({"outcome": "stopped", "pid": pid, "exit_code": code, "escalated": escalated,
                  "recorded_by": recorded_by, "ended": _group_ended(pid)})


def _group_ended(pgid: int) -> bool:
    """True when no live (non-defunct) process is left in the group."""
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None and st["pgid"] == pgid and st["state"] not in ("Z", "X"):
                return False
    return True
