"""`dflashctl stacks`, the container side, and capture() for the run's sentinel (stdlib only; runs there).

The run's processes are those carrying its marker (DFLASH_RUN_ID and DFLASH_RUN_DIR); its supervisor
(supervisor.pid) and its sentinel (argv `agent.pyz sentinel`) are left out unless asked. Each is dumped with py-spy
when the container has it, else with the trainer's dump signal when it registered one (lib/pystacks.py), else it
gets a one-line reason. The raw dumps travel as they are (the laptop parses them: analysis/stacks.py) with each
frame's line of code read here, and can be saved as <run>/stacks/capture-<UTC stamp>.json.

A capture doc: {"v", "run_id", "run_dir", "time", "at", "reason", "py_spy", "py_spy_version", "processes":
[{"pid", "role", "argv", "kind", "dump_signal", "method", "format", "raw", "threads", "code", "error", "notes"}],
"skipped": [{"pid", "role", "argv"}]}. role: program | child | supervisor | sentinel; method: "py-spy",
"py-spy --nonblocking", "faulthandler" or null (then error says why); format: py-spy-json | faulthandler.
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

from dflashctl.agent.lib.captures import save_capture
from dflashctl.agent.lib.frame import reply
from dflashctl.agent.lib.fsutil import read_int, write_atomic
from dflashctl.agent.lib.procfs import marked_processes, proc_argv
from dflashctl.agent.lib.pystacks import (
    STACKS_DIR,
    code_lines,
    find_py_spy,
    frame_locations,
    has_dump_signal,
    py_spy_dump,
    py_spy_version,
    signal_dumps,
)
from dflashctl.agent.lib.rundir import now_iso
from dflashctl.agent.lib.runmeta import read_meta
from dflashctl.agent.lib.sentinelproc import is_sentinel

DOC_VERSION = 1
PY_SPY_PARALLEL = 8
NO_METHOD = "py-spy is not installed in the container and this process registered no dump signal"


def _role(pid: int, argv: list, program: int | None, supervisor: int | None) -> str:
    if pid == program:
        return "program"
    if pid == supervisor:
        return "supervisor"
    if is_sentinel(argv):
        return "sentinel"
    return "child"


def collect(run_dir: str, run_id: str, reason: str = "", *, include_all: bool = False) -> dict:
    """Every thread's stack of every process of the run, as a capture doc (the module's docstring)."""
    program, supervisor = read_int(os.path.join(run_dir, "pid")), read_int(os.path.join(run_dir, "supervisor.pid"))
    kind = read_meta(run_dir).kind
    found = marked_processes(run_id, run_dir, exclude=(os.getpid(),))
    procs, skipped = [], []
    for pid in sorted(found, key=lambda p: (p != program, p)):
        argv = proc_argv(pid) or []
        role = _role(pid, argv, program, supervisor)
        rec = {"pid": pid, "role": role, "argv": argv, "kind": kind if role == "program" else None,
               "dump_signal": has_dump_signal(run_dir, pid), "method": None, "format": None, "raw": None,
               "threads": None, "code": {}, "error": None, "notes": []}
        if role in ("supervisor", "sentinel") and not include_all:
            skipped.append({"pid": pid, "role": role, "argv": argv})
        else:
            procs.append(rec)
    exe = find_py_spy()
    if exe is not None:
        with ThreadPoolExecutor(max_workers=PY_SPY_PARALLEL) as pool:
            dumps = list(pool.map(lambda r: py_spy_dump(exe, r["pid"], found.get(r["pid"])), procs))
        for rec, got in zip(procs, dumps, strict=True):
            _take(rec, got)
    rest = {r["pid"]: found.get(r["pid"]) for r in procs if r["method"] is None and r["dump_signal"]}
    by_signal = signal_dumps(run_dir, rest)
    for rec in procs:
        if rec["method"] is not None:
            continue
        if rec["pid"] in by_signal:
            _take(rec, by_signal[rec["pid"]])
        elif exe is None:
            rec["error"] = NO_METHOD
    for rec in procs:
        if rec["raw"]:
            rec["code"] = code_lines(rec["pid"], frame_locations(rec["format"], rec["raw"]))
    now = time.time()
    return {"v": DOC_VERSION, "run_id": run_id, "run_dir": run_dir, "time": now, "at": now_iso(now),
            "reason": reason, "py_spy": exe, "py_spy_version": py_spy_version(exe) if exe else None,
            "processes": procs, "skipped": skipped}


def _take(rec: dict, got: dict) -> None:
    """One method's result into the process's record; a failed py-spy's error stays a note if another works."""
    if got.get("method"):
        rec["notes"] += ([rec["error"]] if rec["error"] else []) + (got.get("notes") or [])
        rec.update(method=got["method"], format=got["format"], raw=got["raw"], threads=got.get("threads"),
                   error=None)
    else:
        if rec["error"]:
            rec["notes"].append(rec["error"])
        rec["error"] = got.get("error")


def write_capture(run_dir: str, doc: dict) -> str:
    """<run>/stacks/capture-<UTC stamp>.json (never overwritten: -2, -3 … within one second)."""
    folder = os.path.join(run_dir, STACKS_DIR)
    os.makedirs(folder, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(doc.get("time")))
    path = os.path.join(folder, f"capture-{stamp}.json")
    n = 1
    while os.path.exists(path):
        n += 1
        path = os.path.join(folder, f"capture-{stamp}-{n}.json")
    write_atomic(path, (json.dumps(doc, indent=1) + "\n").encode())
    return path


def summary(doc: dict, path: str | None) -> dict:
    """What a capture found, per process: method, thread count (the header lines of its dump) or error."""
    procs = []
    for rec in doc["processes"]:
        raw = rec.get("raw") or ""
        if rec.get("format") == "py-spy-json":
            try:
                threads = len(json.loads(raw))
            except ValueError:
                threads = 0
        else:
            threads = sum(1 for ln in raw.splitlines() if ln.startswith(("Thread 0x", "Current thread 0x")))
        procs.append({"pid": rec["pid"], "role": rec["role"], "method": rec["method"],
                      "threads": threads if rec["method"] else 0, "error": rec["error"]})
    return {"path": path, "reason": doc["reason"], "time": doc["time"], "py_spy": doc["py_spy"],
            "dumped": sum(1 for p in procs if p["method"]), "processes": procs}


def capture(run_dir: str, run_id: str, reason: str, *, attempt: int | None = None) -> dict:
    """Dump the run's stacks now and save them (<run>/stacks/capture-<stamp>.json); returns summary()'s record.
    Bounded: py-spy 10 s per process (8 at once), the dump signal 5 s for all. Never raises for a process it
    cannot dump (that process's error says why); an unwritable run directory gives path None and "write_error".
    attempt: also keep them with the flight recorder's dumps in <run>/captures/<attempt>-<stamp>/ (a hang's
    evidence together, lib/captures.py), described under "capture"."""
    doc = collect(run_dir, run_id, reason)
    path, write_error = None, None
    try:
        path = write_capture(run_dir, doc)
    except OSError as e:
        write_error = f"{e.strerror or e}: {e.filename or run_dir}"
    out = summary(doc, path)
    if write_error:
        out["write_error"] = write_error
    if attempt is not None:
        out["capture"] = save_capture(run_dir, attempt, doc)
    return out


def main(spec: dict) -> int:
    """spec: {"run_dir", "run_id", "reason", "all", "save"}; replies with the capture doc (+ "saved": its path,
    saved only when some process was dumped; capture() keeps every attempt, the sentinel's record of a stall)."""
    doc = collect(spec["run_dir"], spec["run_id"], spec.get("reason") or "", include_all=bool(spec.get("all")))
    doc["saved"], doc["save_error"] = None, None
    if spec.get("save") and any(p["method"] for p in doc["processes"]):  # a failed dump is not worth a file here
        try:
            doc["saved"] = write_capture(spec["run_dir"], doc)
        except OSError as e:
            doc["save_error"] = f"{e.strerror or e}: {e.filename or spec['run_dir']}"
    return reply(doc)
