"""A run directory's state (meta, pid, exit code, heartbeat, errors) and THE liveness rule (stdlib only).

The probe reports it, the launcher refuses to start beside a live run with it, `adopt` checks it: one copy,
in the agent archive with every program."""

from __future__ import annotations

import base64
import os

from dflashctl.agent.lib.fsutil import read_int, read_json
from dflashctl.agent.lib.procfs import (
    RUN_DIR_VAR,
    ancestors,
    group_alive,
    is_process,
    proc_cmdline,
    proc_env_var,
    proc_marker,
    process_table,
    run_alive,
    run_tree,
)
from dflashctl.agent.lib.runmeta import META_FILE, RunMeta, read_meta


def resolve_run(runs_dir: str, run: str) -> tuple[str, str] | None:
    """("id", "dir") for a run id or "latest"; None when there is no such run."""
    if run == "latest":
        try:
            run = os.path.basename(os.readlink(os.path.join(runs_dir, "latest")).rstrip("/"))
        except OSError:
            return None
    if not run or "/" in run or run in (".", "..", "latest"):
        return None
    path = os.path.join(runs_dir, run)
    return (run, path) if os.path.isdir(path) else None


def liveness(run_id: str, run_dir: str, pid: int | None, exit_code: int | None,
             cache: dict | None = None, meta: RunMeta | None = None) -> tuple[bool, bool, int | None]:
    """(alive, ending, supervisor pid): THE rule, for the probe, the launcher and every reader.

    A run we started is alive while its trainer (the recorded pid) is and carries the run's marker,
    and, until its exit code is recorded, while its supervisor or any marked process of the trainer's
    group lives: between the trainer's exit and `exit_code` the supervisor is still reaping, and that
    run is ending, not lost. `ending`: alive, but the trainer itself is gone. Runs started by a
    launcher that wrote no supervisor.pid fall back to the group alone.
    An adopted run (meta kind "adopted") carries no marker and has no supervisor: it is alive while
    its process is the one adopted (procfs.is_process: same pid, start time, boot and argv), or any process of
    its tree (tree_left: what adopt recorded, what lives below it) still lives (`ending`: the adopted one is gone).
    A run is its process tree (issue 24): once its end is recorded, a process of its tree still alive (one that
    survived `stop`, one planted with its marker) keeps it alive and ending, never STOPPED: tree_left names them.
    cache: see procfs.group_alive."""
    identity = meta.adopted_identity if meta is not None else None
    if identity is not None:
        root = is_process(identity)
        left = bool(tree_left(run_id, run_dir, identity, None, cache))
        return root or left, left and not root, None
    sup = read_int(os.path.join(run_dir, "supervisor.pid"))
    if run_alive(pid, run_id):
        return True, False, sup
    if exit_code is not None:  # recorded: the supervisor's last moments, or a stale file, do not count
        left = bool(tree_left(run_id, run_dir, None, sup, cache))
        return left, left, sup
    if run_alive(sup, run_id) or group_alive(pid, run_id, cache):
        return True, pid is not None, sup
    return False, False, sup


def tree_left(run_id: str, run_dir: str, identity: dict | None, sup: int | None, cache: dict | None = None) -> list:
    """Live processes of a run's tree apart from its root: an adopted run's recorded members (adopt's `tree`,
    each still the same process) and what lives below them and its root, and every process carrying the run's
    marker and directory; never the supervisor (its last moments after `exit_code`) or this program and its
    callers. cache: one /proc pass and one read of every process's marker, shared by every run of a listing."""
    cache = {} if cache is None else cache
    key = ("tree", run_id, run_dir)
    if key in cache:
        return cache[key]
    if "table" not in cache:
        cache["table"] = process_table()
    table = cache["table"]
    if "marked" not in cache:
        marked: dict = {}
        for p, st in table.items():
            mark = proc_marker(p) if st["state"] not in ("Z", "X") else None
            if mark:
                marked.setdefault(mark, []).append(p)
        cache["marked"] = marked
    skip = ancestors(os.getpid(), table) | ({sup} if sup else set())
    roots = [int(identity["pid"])] if identity is not None and is_process(identity) else []
    found = run_tree("", run_dir, roots, (identity or {}).get("tree") or [], skip, table)
    for p in cache["marked"].get(run_id, ()):
        if p not in skip and proc_env_var(p, RUN_DIR_VAR) == run_dir:
            found[p] = table[p]["starttime"]
    cache[key] = sorted(p for p in found if p not in roots)
    return cache[key]


def live_latest(runs_dir: str) -> str | None:
    """The latest run's id while it is alive (the rule above), else None: what a new launch or adopt
    must not start beside."""
    found = resolve_run(runs_dir, "latest")
    if found is None:
        return None
    run_id, run_dir = found
    pid = read_int(os.path.join(run_dir, "pid"))
    exit_code = read_int(os.path.join(run_dir, "exit_code"))
    return run_id if liveness(run_id, run_dir, pid, exit_code, meta=read_meta(run_dir))[0] else None


def adopted_by(runs_dir: str, identity: dict) -> str | None:
    """The run that has already adopted this very process (same pid and start time), if any."""
    for run_id in run_ids(runs_dir):
        ident = read_meta(os.path.join(runs_dir, run_id)).adopted_identity
        if ident and ident.get("pid") == identity.get("pid") and ident.get("starttime") == identity.get("starttime"):
            return run_id
    return None


def node_lead_dir(run_dir: str, meta: RunMeta) -> str:
    """Where this host's lowest rank writes its heartbeat and errors/: the run dir itself, except on a later node
    of a run across hosts (meta.json `cluster`), whose lowest rank R = node_rank x nproc_per_node writes them in
    rank-R/ (trainer/pipeline.py: only global rank 0 writes into the run dir)."""
    rank = meta.lead_rank
    return os.path.join(run_dir, f"rank-{rank}") if rank > 0 else run_dir


def run_state(run_id: str, run_dir: str, cache: dict | None = None) -> dict:
    raw = read_json(os.path.join(run_dir, META_FILE))  # sent as it is: the laptop reads it as a RunMeta too
    meta = RunMeta.from_record(raw)
    pid = read_int(os.path.join(run_dir, "pid"))
    exit_code = read_int(os.path.join(run_dir, "exit_code"))
    alive, ending, sup = liveness(run_id, run_dir, pid, exit_code, cache, meta)
    if not alive and exit_code is None:  # the supervisor writes it before it exits: one that just did is seen
        exit_code = read_int(os.path.join(run_dir, "exit_code"))
    survivors = []
    if ending and (exit_code is not None or meta.adopted_identity is not None):
        identity = meta.adopted_identity
        survivors = [{"pid": p, "cmdline": proc_cmdline(p, 200)}
                     for p in tree_left(run_id, run_dir, identity, None if identity is not None else sup, cache)]
    lead = node_lead_dir(run_dir, meta)
    errors = {}
    err_dir = os.path.join(lead, "errors")
    try:
        names = sorted(os.listdir(err_dir))
    except OSError:
        names = []
    for name in names:
        if name.endswith(".json"):
            errors[name[: -len(".json")]] = read_json(os.path.join(err_dir, name)) or {}
    return {
        "id": run_id,
        "dir": run_dir,
        "meta": raw,
        "pid": pid,
        "alive": alive,
        "ending": ending,
        "supervisor_pid": sup,
        "exit_code": exit_code,
        "ended_at": _mtime(os.path.join(run_dir, "exit_code")),
        "stopped": os.path.exists(os.path.join(run_dir, "stopped")),
        "stopped_by": read_json(os.path.join(run_dir, "stopped")),  # {"by": "dflashctl stop" | "sentinel", ...}
        "heartbeat": read_json(os.path.join(lead, "heartbeat.json")),
        "restart": read_json(os.path.join(run_dir, "restart.json")),  # the sentinel asked for another attempt
        "errors": errors,
        "survivors": survivors,  # processes of its tree alive after its end was recorded (issue 24)
    }


def run_ids(runs_dir: str) -> list[str]:
    """Names of this workspace's run directories: a marker naming none of them is someone else's."""
    try:
        return sorted(n for n in os.listdir(runs_dir) if n != "latest" and not n.startswith(".")
                      and os.path.isdir(os.path.join(runs_dir, n)))
    except OSError:
        return []


def list_runs(runs_dir: str) -> list[dict]:
    """Every run directory's state, newest id first (ids start with a UTC timestamp)."""
    try:
        names = os.listdir(runs_dir)
    except OSError:
        return []
    out = []
    cache: dict = {}  # one /proc pass for every run that needs the group rule
    for name in sorted(names, reverse=True):
        path = os.path.join(runs_dir, name)
        if name == "latest" or name.startswith(".") or os.path.islink(path) or not os.path.isdir(path):
            continue
        state = run_state(name, path, cache)
        log = os.path.join(path, "train.log")
        state["log_size"] = _size(log)
        state["log_tail_b64"] = log_tail(log)
        state["events_tail_b64"] = log_tail(os.path.join(path, "events.jsonl"), EVENTS_TAIL)  # its last event
        out.append(state)
    return out


def _size(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except OSError:
        return None


TAIL_BYTES = 8192  # of each run's log, for its last step: the laptop reads it with the one log engine
EVENTS_TAIL = 2048  # of each run's events.jsonl, for its last event


def log_tail(path: str, size: int = TAIL_BYTES) -> str:
    """The log's last bytes, base64 (cheap on multi-GB logs; which line is a step is judged on the laptop)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - size))
            return base64.b64encode(f.read()).decode()
    except OSError:
        return ""


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None
