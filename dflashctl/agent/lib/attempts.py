"""Restarts, container side: the next attempt's launch spec, and the wait before it starts (stdlib only).

The sentinel decides that an attempt gets another (it writes `<run>/restart.json`); the attempt's supervisor then
builds the next launch from the first one's (`launch_spec.json`, kept in every run directory) and starts it in a
new run directory. The new attempt's supervisor waits before it starts the program: the backoff, then until no
process of the previous attempt is left and every GPU the run uses holds less than `gpu_free_mib` (NVRx's rule:
memory a dying process still holds would make the next attempt fail with an out-of-memory error).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import time

from dflashctl.agent.lib.checkpoints import newest_checkpoint
from dflashctl.agent.lib.gpuleftout import left_out_note
from dflashctl.agent.lib.procfs import marked_processes
from dflashctl.agent.lib.rundir import now_iso
from dflashctl.agent.lib.runmeta import read_meta
from dflashctl.agent.lib.sentinelproc import AGENT_FILE
from dflashctl.agent.probe.gpus import GpuReader, gpu_report

SPEC_FILE = "launch_spec.json"  # what the launch was asked to start, for the next attempt
RESUME_VAR = "DFLASH_RESUME_FROM"  # any program: the previous attempt's run directory


def next_spec(prev_dir: str, prev_id: str, decision: dict) -> dict | None:
    """The launch spec of the attempt after prev (None when prev kept no spec). Our trainer resumes from the newest
    checkpoint it can find (prev's own, or the one prev itself was resumed from); any program is told where the
    previous attempt is (DFLASH_RESUME_FROM) and resumes the way it knows how."""
    try:
        with open(os.path.join(prev_dir, SPEC_FILE)) as f:
            spec = json.load(f)
    except (OSError, ValueError):
        return None
    attempt, gpus = int(decision.get("attempt") or 2), _recheck(decision)
    chain = read_meta(prev_dir).chain or {"first": prev_id}
    extra = [a for a in spec.get("extra") or [] if a != "--resume"]
    exec_mode = spec.get("command") is not None or spec.get("shell") is not None
    resume = None
    if not exec_mode and newest_checkpoint(prev_dir) is not None:
        resume, extra = prev_id, ["--resume", *extra]
    if not exec_mode:  # the trainer reads the config it was started with, not today's file
        spec["config_text"], spec["config_path"] = None, os.path.join(prev_dir, "config.toml")
    spec.update(extra=extra, resume_from=resume, base_id=f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-"
                f"{spec.get('slug') or 'run'}", env=_attempt_env(spec.get("env") or {}, gpus, prev_dir))
    sentinel = dict(spec.get("sentinel") or {})
    sentinel["attempt"] = attempt
    restart = sentinel.get("restart") or {}
    spec["sentinel"] = sentinel
    if gpus is not None:
        spec["meta"] = dict(spec.get("meta") or {}, gpus_left_out=gpus.get("left_out") or {})
    spec["meta"] = dict(spec.get("meta") or {}, attempt=attempt, restart_of=prev_id, restart_why=decision.get("why"),
                        chain={"first": chain.get("first") or prev_id, "previous": prev_id, "attempt": attempt,
                               "attempts_max": 1 + int(restart.get("max_restarts") or 0)})
    spec["wait"] = {"after": prev_id, "after_dir": prev_dir, "backoff_s": float(restart.get("backoff_s") or 0),
                    "gpu_free_mib": float(restart.get("gpu_free_mib") or 512),
                    "gpu_wait_s": float(restart.get("gpu_wait_s") or 600), "gpus": _run_gpus(spec),
                    "left_out": f"restart: {left_out_note(gpus.get('why'), gpus.get('visible'))}"
                    if gpus and gpus.get("left_out") else None}
    return spec


def _recheck(decision: dict) -> dict | None:
    """restart.json's `gpus`: the sentinel's GPU re-check (sentinel/gpurecheck.py), None without one."""
    gpus = decision.get("gpus")
    return gpus if isinstance(gpus, dict) else None


def _attempt_env(env: dict, gpus: dict | None, prev_dir: str) -> dict:
    """The next attempt's variables: the launch's, where the previous attempt is, and with --exclude-unhealthy-gpus
    the GPUs the sentinel found healthy just now (its `visible`; None: the user's own CUDA_VISIBLE_DEVICES, or
    none, as before anything was left out)."""
    out = {**env, RESUME_VAR: prev_dir}
    if gpus is not None:
        visible = gpus.get("visible")
        if visible is None:
            out.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            out["CUDA_VISIBLE_DEVICES"] = str(visible)
            out.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # nvidia-smi's indices; CUDA's own are fastest first
    return out


def _run_gpus(spec: dict) -> list | None:
    """The GPU indices the run uses: CUDA_VISIBLE_DEVICES, else the host's gpus (meta), else None (all)."""
    visible = (spec.get("env") or {}).get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        with contextlib.suppress(ValueError):
            return sorted({int(x) for x in str(visible).split(",") if x.strip()})
    gpus = (spec.get("meta") or {}).get("gpus") or {}
    found = sorted({int(i) for i in (gpus.get("target") or []) + (gpus.get("drafters") or [])
                    if isinstance(i, int)})
    return found or None


def gpu_memory_mib(indices: list | None, reader: GpuReader | None = None) -> dict | None:
    """index -> MiB used for the GPUs asked for (all when None); None when no GPU can be read. reader: kept across
    polls (NVML initialised once; an old driver's nvidia-smi fields found once)."""
    rep = gpu_report(reader)
    if rep.get("source") == "nvml":
        used = {int(g["index"]): float(g["memory_used_mib"]) for g in rep["nvml"]}
    elif rep.get("smi_csv"):
        used = {}
        for row in csv.DictReader(io.StringIO(rep["smi_csv"]), skipinitialspace=True):
            col = {k.split(" ")[0]: v for k, v in row.items() if k}
            with contextlib.suppress(KeyError, TypeError, ValueError):
                used[int(col["index"])] = float(col["memory.used"])
    else:
        return None
    return {i: m for i, m in used.items() if indices is None or i in indices}


def wait_before_start(wait: dict, say) -> dict:  # noqa: ANN001 - say: print a line into the run's log
    """The backoff, then the previous attempt's processes gone and its GPUs' memory below the limit (at most
    gpu_wait_s for both). Returns what was waited for, for meta.json."""
    started = time.time()
    backoff = float(wait.get("backoff_s") or 0)
    if backoff > 0:
        say(f"restart: waiting {backoff:g} s (backoff) before attempt starts")
        time.sleep(backoff)
    deadline = time.time() + float(wait.get("gpu_wait_s") or 600)
    limit = float(wait.get("gpu_free_mib") or 512)
    reader = GpuReader()
    try:
        return _wait_gone(wait, say, started, deadline, limit, reader)
    finally:
        reader.close()


def _wait_gone(wait: dict, say, started: float, deadline: float, limit: float,  # noqa: ANN001
               reader: GpuReader) -> dict:
    said = False
    while True:
        left = marked_processes(wait["after"], wait["after_dir"])
        used = gpu_memory_mib(wait.get("gpus"), reader)
        busy = {i: m for i, m in (used or {}).items() if m >= limit}
        if not left and not busy:
            return {"waited_s": round(time.time() - started, 3), "gpu_memory_mib": used, "timed_out": False}
        if time.time() >= deadline:
            say(f"restart: still waiting after {wait.get('gpu_wait_s')} s (processes of {wait['after']}: "
                f"{sorted(left)}; GPU memory ≥ {limit:g} MiB: {busy}); starting anyway")
            return {"waited_s": round(time.time() - started, 3), "gpu_memory_mib": used, "timed_out": True}
        if not said:
            say(f"restart: waiting for {len(left)} process(es) of {wait['after']} to end and GPU memory below "
                f"{limit:g} MiB ({busy or 'ok'})")
            said = True
        time.sleep(0.5)


def restart_event(prev_dir: str, prev_id: str, next_id: str | None, attempt: int, why: str, error: str | None,
                  verdict: str | None = None, gpus: dict | None = None) -> None:
    """The `restart` event in the previous attempt's events.jsonl (sentinel/events.py's record); gpus: the
    sentinel's GPU re-check, whose left-out GPUs the message names."""
    msg = (f"attempt {attempt} starts as run {next_id}: {why}" if next_id else
           f"attempt {attempt} could not start: {error}")
    if next_id and gpus and gpus.get("left_out"):
        msg += f"; {left_out_note(gpus.get('why'), gpus.get('visible'))}"
    rec = {"t": time.time(), "kind": "restart", "run": prev_id, "verdict": verdict or "", "message": msg,
           "attempt": attempt, "next_run": next_id, "why": why, "error": error, "at": now_iso(),
           **({"gpus": gpus} if gpus else {})}
    with contextlib.suppress(OSError):
        fd = os.open(os.path.join(prev_dir, "events.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, (json.dumps(rec, separators=(",", ":")) + "\n").encode())
        finally:
            os.close(fd)


def relaunch(run_dir: str, start) -> None:  # noqa: ANN001 - the launcher's start(spec, archive, wait_pid=)
    """The sentinel asked for another attempt (restart.json): start it in a new run directory, as a launch would,
    and record it in this attempt's events. Never reused: this run directory is only read."""
    path = os.path.join(run_dir, "restart.json")
    try:
        with open(path) as f:
            decision = json.load(f)
    except (OSError, ValueError):
        return
    run_id = os.path.basename(run_dir)
    attempt, why = int(decision.get("attempt") or 2), str(decision.get("why") or "")
    spec = next_spec(run_dir, run_id, decision)
    if spec is None:
        restart_event(run_dir, run_id, None, attempt, why, "this run kept no launch spec", decision.get("verdict"))
        return
    doc = start(spec, os.path.join(run_dir, AGENT_FILE), wait_pid=False)  # the same code runs every attempt
    gpus = _recheck(decision)
    restart_event(run_dir, run_id, doc.get("run_id"), attempt, why, doc.get("message") if "error" in doc else None,
                  decision.get("verdict"), gpus)
