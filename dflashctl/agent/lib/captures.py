"""A hang's evidence kept together (issue 28 part 5; stdlib only: the sentinel runs it in the container).

When a run stalls or a collective times out, what explains it is gone minutes later: the ranks are killed, the
flight recorder's dumps are overwritten by the next attempt. So the sentinel saves, once per stall, one folder
`<run>/captures/<attempt>-<UTC stamp>/` holding every process's stacks (one file per rank: `rank-R.pid-P.json`; other
processes of the run `pid-P.<role>.json`), a copy of the flight-recorder dumps present at that moment (`flightrec/`),
and `index.json` saying what is there and what was left out. A rank is a process of the program's tree carrying
torchrun's RANK whose parent does not (torchrun's agent starts the ranks; a rank's own children inherit RANK).

Bounded: at most MAX_CAPTURES folders per run directory (a run stalling again and again keeps its first ones), each
stacks file cut at STACKS_MAX bytes of raw dump, dumps copied up to DUMPS_MAX bytes per capture (the rest listed).
"""

from __future__ import annotations

import json
import os
import shutil
import time

from dflashctl.agent.lib.flightrec_env import DUMP_DIR, DUMP_FILE, DUMP_PREFIX
from dflashctl.agent.lib.fsutil import read_int, read_json, write_atomic
from dflashctl.agent.lib.procfs import descendants, proc_env_var, process_table

CAPTURES_DIR = "captures"
MAX_CAPTURES = 8
STACKS_MAX = 4 << 20  # raw dump bytes kept per process
DUMPS_MAX = 256 << 20  # flight-recorder bytes copied per capture (a dump is a few MB per rank)
SETTLE_S, SETTLE_MAX_S = 0.25, 3.0  # a dump being written is waited for this long at most


def ranks(program: int | None) -> dict[int, dict]:
    """pid -> {"rank", "local_rank"} of the rank processes below the program (torchrun's workers)."""
    if not program:
        return {}
    table = process_table()
    out: dict[int, dict] = {}
    for pid in descendants([program], table):
        rank = proc_env_var(pid, "RANK")
        parent = table[pid]["ppid"]
        if rank is None or not rank.isdigit() or proc_env_var(parent, "RANK") == rank:
            continue
        local = proc_env_var(pid, "LOCAL_RANK")
        out[pid] = {"rank": int(rank), "local_rank": int(local) if local and local.isdigit() else None}
    return out


def dump_prefix(run_dir: str) -> str:
    """Where the program's flight recorder writes: the user's own TORCH_FR_DUMP_TEMP_FILE (either name) from
    launch.json, else ours (agent/lib/flightrec_env.py)."""
    env = (read_json(os.path.join(run_dir, "launch.json")) or {}).get("env") or {}
    for name in DUMP_FILE:
        if isinstance(env.get(name), str) and env[name]:
            return env[name]
    return os.path.join(run_dir, DUMP_DIR, DUMP_PREFIX)


def _new_dir(run_dir: str, attempt: int, now: float) -> str | None:
    root = os.path.join(run_dir, CAPTURES_DIR)
    os.makedirs(root, exist_ok=True)
    if len([n for n in os.listdir(root) if not n.startswith(".")]) >= MAX_CAPTURES:
        return None
    base = os.path.join(root, f"{attempt}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(now))}")
    path, n = base, 1
    while True:
        try:
            os.mkdir(path, 0o700)
            return path
        except FileExistsError:
            n += 1
            path = f"{base}-{n}"


def dump_files(folder: str, start: str = "") -> list[tuple[str, str, os.stat_result]]:
    """[(name, path, stat)] of the regular files in folder whose names start with `start` (no hidden ones, no
    links): the dumps a capture copies and the probe reads (agent/probe/flightdumps.py)."""
    try:
        with os.scandir(folder) as it:
            return [(e.name, e.path, e.stat(follow_symlinks=False)) for e in it
                    if e.name.startswith(start) and not e.name.startswith(".") and e.is_file(follow_symlinks=False)]
    except OSError:
        return []


def _settled(folder: str, start: str) -> list[str]:
    """The dump files, once two readings SETTLE_S apart agree (a rank may be writing its dump as the timeout is
    seen), at most SETTLE_MAX_S."""
    def sizes_now() -> dict[str, int]:
        return {name: st.st_size for name, _, st in dump_files(folder, start)}

    deadline, sizes = time.monotonic() + SETTLE_MAX_S, sizes_now()
    while time.monotonic() < deadline:
        time.sleep(SETTLE_S)
        again = sizes_now()
        if again == sizes:
            break
        sizes = again
    return sorted(sizes)


def _copy_dumps(prefix: str, into: str) -> tuple[list[dict], list[dict]]:
    """The dump files present now (names starting with the prefix's base), copied while under DUMPS_MAX."""
    folder, start = os.path.dirname(prefix) or ".", os.path.basename(prefix)
    names = _settled(folder, start)
    copied, skipped, total = [], [], 0
    for name in names:
        src = os.path.join(folder, name)
        try:
            size = os.path.getsize(src)
            if total + size > DUMPS_MAX:
                skipped.append({"name": name, "bytes": size, "why": f"over {DUMPS_MAX >> 20} MiB per capture"})
                continue
            os.makedirs(into, exist_ok=True)
            shutil.copyfile(src, os.path.join(into, name))
        except OSError as e:
            skipped.append({"name": name, "why": e.strerror or str(e)})
            continue
        total += size
        copied.append({"name": name, "bytes": size})
    return copied, skipped


def _stacks_file(folder: str, rec: dict, rank: dict | None) -> str:
    name = f"rank-{rank['rank']}.pid-{rec['pid']}.json" if rank else f"pid-{rec['pid']}.{rec.get('role')}.json"
    raw = rec.get("raw") or ""
    out = dict(rec, rank=rank["rank"] if rank else None, local_rank=rank["local_rank"] if rank else None)
    if len(raw) > STACKS_MAX:
        out.update(raw=raw[:STACKS_MAX], truncated=len(raw))
    write_atomic(os.path.join(folder, name), (json.dumps(out, indent=1) + "\n").encode())
    return name


def save_capture(run_dir: str, attempt: int, doc: dict, rank_of: dict[int, dict] | None = None) -> dict:
    """doc (agent/stacks.py collect()) and the flight-recorder dumps present now, into a new capture folder.
    Returns {"dir", "stacks": [{"pid", "rank", "role", "file", "method", "error"}], "dumps": [...],
    "dumps_skipped": [...]}; "dir" None with "error" when no folder was made (the limit, a write that failed)."""
    now = float(doc.get("time") or time.time())
    rank_of = ranks(read_int(os.path.join(run_dir, "pid"))) if rank_of is None else rank_of
    try:
        folder = _new_dir(run_dir, attempt, now)
    except OSError as e:
        return {"dir": None, "error": f"{e.strerror or e}: {e.filename or run_dir}", "stacks": [], "dumps": []}
    if folder is None:
        return {"dir": None, "error": f"{MAX_CAPTURES} captures kept already in {CAPTURES_DIR}/", "stacks": [],
                "dumps": []}
    out: dict = {"dir": folder, "stacks": [], "dumps": [], "dumps_skipped": []}
    try:
        for rec in doc.get("processes") or []:
            rank = rank_of.get(rec["pid"])
            out["stacks"].append({"pid": rec["pid"], "rank": rank["rank"] if rank else None, "role": rec.get("role"),
                                  "file": _stacks_file(folder, rec, rank), "method": rec.get("method"),
                                  "error": rec.get("error")})
        prefix = dump_prefix(run_dir)
        out["dump_prefix"] = prefix
        out["dumps"], out["dumps_skipped"] = _copy_dumps(prefix, os.path.join(folder, DUMP_DIR))
        index = {"time": now, "reason": doc.get("reason"), "attempt": attempt, "run_id": doc.get("run_id"),
                 **{k: v for k, v in out.items() if k != "dir"}}
        write_atomic(os.path.join(folder, "index.json"), (json.dumps(index, indent=1) + "\n").encode())
    except OSError as e:  # a full disk: what was written stays, and the event says what failed
        out["error"] = f"{e.strerror or e}: {e.filename or folder}"
    return out
