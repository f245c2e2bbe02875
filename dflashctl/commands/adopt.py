"""adopt: make a process that dflashctl did not start (`nohup python train.py > train.log &`) the current run.

The run gets a directory like any other (meta.json kind "adopted", `pid`, `train.log` a symlink to the log the
process writes), and runs/latest points at it, so `status`, `logs`, `stop` and `kill-zombies` treat it as the
current run. It carries no DFLASH_RUN_ID marker: its identity is the pid plus the process's start time (clock
ticks since boot, /proc/PID/stat field 22), the boot time and its argv, recorded now and checked again by every
reader (agent/lib/runstate.py `liveness`) and before every signal (agent/reaper.py), so a reused pid is
never taken for it. Its exit code is unknown when it ends by itself (it is nobody's child of ours).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from dflashctl.commands.launch import LaunchRefused
from dflashctl.commands.program import program_name, run_slug
from dflashctl.commands.runlookup import runs_dir
from dflashctl.errors import ConfigError, DflashError, ExitCode, NotFound
from dflashctl.remote import agentcall, probe
from dflashctl.remote.target import Target


@dataclass
class AdoptResult:
    run_id: str
    run_dir: str
    pid: int
    log_path: str  # the log the process writes, absolute in the container (<run_dir>/train.log links to it)
    name: str
    cmdline: list[str]
    cwd: str | None
    started_at: str  # when the process started (UTC)
    leads_group: bool  # it leads a process group (stop ends its whole tree either way)
    host: str = ""  # the host's name in hosts.toml
    tree: list[dict[str, Any]] = field(default_factory=list)  # its descendants now: {pid, starttime, cmdline}
    writes_log: list[int] = field(default_factory=list)  # which of them hold the log open

    @property
    def found(self) -> str:
        """What adopt found, for a person: "pid 812 is `bash -c …`; its child 813 `python3 train.py` writes the
        log — adopting both"."""
        return tree_line(self.pid, self.cmdline, self.tree, self.writes_log)

    def to_record(self) -> dict[str, Any]:
        """`adopt --json`."""
        return {"host": self.host, "run_id": self.run_id, "run_dir": self.run_dir, "pid": self.pid,
                "log": self.log_path, "name": self.name, "cmdline": self.cmdline, "cwd": self.cwd,
                "started_at": self.started_at, "leads_group": self.leads_group, "tree": self.tree,
                "writes_log": self.writes_log, "found": self.found}


def tree_line(pid: int, cmdline: list[str], tree: list[dict[str, Any]], writers: list[int]) -> str:
    """One line naming the adopted process, its descendants and which of them writes the log."""

    def cmd(argv: list[str]) -> str:
        text = shlex.join(argv).replace("\n", "\\n")
        return f"`{text if len(text) <= 60 else text[:59] + '…'}`"

    def writes(p: int) -> str:
        return " writes the log" if p in writers else ""

    line = f"pid {pid} is {cmd(cmdline)}{writes(pid)}"
    if not tree:
        return line
    kin = "its child" if len(tree) == 1 else "below it"
    line += f"; {kin} " + ", ".join(f"{t['pid']} {cmd(list(t.get('cmdline') or []))}{writes(t['pid'])}"
                                    for t in tree[:6]) + (f" and {len(tree) - 6} more" if len(tree) > 6 else "")
    return line + (" — adopting both" if len(tree) == 1 else f" — adopting all {len(tree) + 1}")


def adopt(target: Target, pid: int, log: str, name: str | None = None) -> AdoptResult:
    """Errors (one line each): a pid that does not exist or has exited (102, like an unknown run id); a pid of a
    run dflashctl launched, one already adopted, a log that does not exist, a live current run (2)."""
    if pid <= 0:
        raise ConfigError(f"--pid must be a process id (a positive integer), not {pid}")
    if not log.strip() or "\0" in log:
        raise ConfigError("--log must name the file the process writes its output to")
    host = target.host
    target.ensure_running()
    doc = probe.probe_once(target, host.workspace, "latest", procs=True, gpus=False, log_max=0, pids=(pid,),
                           require_run=False)
    # the probe never lists itself or its callers (a pid of those is left to the launcher's own check)
    proc = next((p for p in doc.procs if p.pid == pid), None)
    starttime = proc.starttime if proc else None
    if proc and proc.state in ("Z", "X"):
        raise NotFound(f"process {pid} has exited (defunct) {_where(target)}")
    if proc and proc.run_id:
        raise ConfigError(f"pid {pid} is part of run {proc.run_id}, which dflashctl launched; nothing to adopt",
                          hint=f"it is already a run: dflashctl status {proc.run_id}")
    run = doc.run
    adopted = (run.meta.adopted_identity or {}) if run else {}
    if run and run.alive and adopted.get("pid") == pid and adopted.get("starttime") == starttime:
        raise ConfigError(f"pid {pid} is already adopted as run {run.id}",
                          hint=f"see it with dflashctl status {run.id}")
    if run and run.alive and proc:  # (a pid we could not see: the launcher says first whether it exists)
        raise LaunchRefused(f"run {run.id} is still running on {host.name}; refusing to adopt a second run "
                            "beside it", hint=f"stop it first: dflashctl stop {run.id}")
    name = name if name is not None else program_name((proc.cmdline if proc else "").split() or [f"pid{pid}"])
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    spec = {
        "runs_dir": runs_dir(host.workspace),
        "base_id": f"{stamp}-{run_slug(name)}",
        "pid": pid,
        "starttime": starttime,
        "log": log,
        "meta": {"name": name, "host": host.name, "container": host.container, "config": None, "code_hash": None,
                 "gpus": {"target": list(host.gpus_target), "drafters": list(host.gpus_drafters)}},
    }
    res = agentcall.call(target, "adopt", spec, timeout=60)
    error = res.get("error")
    if error == "no-such-pid":
        ct = host.container
        raise NotFound(f"{res['message']} {_where(target)}",
                       hint=f"give the pid as the container sees it: pct exec {ct} -- ps -ef" if ct is not None
                       else "find it with ps -ef")
    if error == "run-alive":
        raise LaunchRefused(f"{res['message']} on {host.name}; refusing to adopt a second run beside it",
                            hint=f"stop it first: dflashctl stop {res['run_id']}")
    if error in ("no-log", "log-not-file"):
        raise ConfigError(f"{res['message']} {_where(target)}",
                          hint="--log is the path the process writes to, inside the container (relative: to the "
                               "process's working directory)")
    if error in ("marked", "already-adopted", "init", "kernel-thread"):
        raise ConfigError(res["message"])
    if error:
        raise DflashError(f"adopt on {host.name} failed: {res.get('message') or error}", exit_code=ExitCode.CRASHED)
    return AdoptResult(res["run_id"], res["run_dir"], int(res["pid"]), res["log"], name, list(res["cmdline"]),
                       res.get("cwd"), res["started_at"], res.get("pgid") == pid, host.name,
                       tree=list(res.get("tree") or []), writes_log=list(res.get("writes_log") or []))


def _where(target: Target) -> str:
    host = target.host
    return f"in container {host.container} of {host.name}" if host.container is not None else f"on {host.name}"
