"""Probe piece: the state of one run directory (meta, pid, liveness, exit code, heartbeat, errors)."""

from __future__ import annotations

import os
import re

from .util import read_int, read_json, run_alive  # probe:strip


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


def run_state(run_id: str, run_dir: str) -> dict:
    pid = read_int(os.path.join(run_dir, "pid"))
    errors = {}
    err_dir = os.path.join(run_dir, "errors")
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
        "meta": read_json(os.path.join(run_dir, "meta.json")),
        "pid": pid,
        "alive": run_alive(pid, run_id),
        "exit_code": read_int(os.path.join(run_dir, "exit_code")),
        "ended_at": _mtime(os.path.join(run_dir, "exit_code")),
        "stopped": os.path.exists(os.path.join(run_dir, "stopped")),
        "heartbeat": read_json(os.path.join(run_dir, "heartbeat.json")),
        "errors": errors,
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
    for name in sorted(names, reverse=True):
        path = os.path.join(runs_dir, name)
        if name == "latest" or name.startswith(".") or os.path.islink(path) or not os.path.isdir(path):
            continue
        state = run_state(name, path)
        log = os.path.join(path, "train.log")
        state["log_size"] = _size(log)
        state["last_step"] = last_step(log)
        out.append(state)
    return out


def _size(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except OSError:
        return None


_STEP = re.compile(rb"\bstep[=:]\s*(\d+)")


def last_step(path: str, window: int = 65536) -> int | None:
    """The last `step=N` in the log's final window (cheap on multi-GB logs)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - window))
            steps = _STEP.findall(f.read())
    except OSError:
        return None
    return int(steps[-1]) if steps else None


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None
