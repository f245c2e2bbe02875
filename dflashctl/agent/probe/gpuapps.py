"""Who holds the GPUs as the driver knows them (stdlib only): nvidia-smi's compute apps (`--query-compute-apps`,
pids as the driver knows them: the host's) and what /proc says of each listed pid — its cgroup lines (`lxc/<CTID>`
or `lxc.payload.<CTID>` name its container), NSpid (its pid in there), uid and user, command line and our marker
(DFLASH_RUN_ID / DFLASH_RUN_DIR). Values cross as read; the laptop (analysis/hostgpus.py) judges them.

A module of its own, without a program's main, so two host-side programs paste it in: `dflashctl gpus`'s host
probe (probe/hostgpus.py, beside the GPU readings) and status's host half (agent/hostpair.py, beside the kernel
log's Xid lines: status takes the GPUs from the container probe's own reading, so the host reads only who holds
them).
"""

from __future__ import annotations

import subprocess
import time

from dflashctl.agent.lib.procfs import RUN_DIR_VAR, proc_cmdline, proc_env_var, proc_marker, proc_stat

APPS_QUERY = "pid,process_name,used_memory,gpu_uuid"
APPS_TIMEOUT_S = 20


def compute_apps() -> tuple:
    """(nvidia-smi's compute-apps CSV with its header, None) or (None, why not)."""
    argv = ["nvidia-smi", "--query-compute-apps=" + APPS_QUERY, "--format=csv,nounits"]
    try:
        res = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=APPS_TIMEOUT_S)
    except FileNotFoundError:
        return None, "nvidia-smi not found"
    except subprocess.TimeoutExpired:
        return None, f"nvidia-smi --query-compute-apps timed out after {APPS_TIMEOUT_S}s"
    if res.returncode == 6:  # "No devices were found"
        return "", None
    if res.returncode != 0:
        msg = " | ".join((res.stderr or res.stdout).decode("utf-8", "replace").strip().splitlines()[-2:])
        return None, f"nvidia-smi --query-compute-apps exit {res.returncode}: {msg}"
    return res.stdout.decode("utf-8", "replace"), None


def proc_info(pid: int) -> dict | None:
    """What /proc says about one pid; None when it is gone (or not visible from here)."""
    st = proc_stat(pid)
    if st is None:
        return None
    cgroup, nspid, uid = "", [], None
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            cgroup = f.read()
    except OSError:
        pass
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    nspid = [int(x) for x in line.split()[1:]]
                elif line.startswith("Uid:"):
                    uid = int(line.split()[1])
    except (OSError, ValueError):
        pass
    return {"state": st["state"], "starttime": st["starttime"], "cgroup": cgroup[-2000:], "nspid": nspid,
            "uid": uid, "user": _user(pid, uid), "cmdline": proc_cmdline(pid), "run_id": proc_marker(pid),
            "run_dir": proc_env_var(pid, RUN_DIR_VAR)}


def _user(pid: int, uid: int | None) -> str | None:
    """The process's user as its own system names it: an unprivileged container's root is uid 100000 here, so the
    uid is mapped back through /proc/PID/uid_map and looked up in the container's /etc/passwd (/proc/PID/root)."""
    if uid is None:
        return None
    inner = uid
    try:
        with open(f"/proc/{pid}/uid_map") as f:
            for line in f:
                inside, outside, count = (int(x) for x in line.split()[:3])
                if outside <= uid < outside + count:
                    inner = inside + uid - outside
                    break
    except (OSError, ValueError):
        pass
    try:
        with open(f"/proc/{pid}/root/etc/passwd", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split(":")
                if len(fields) > 2 and fields[2] == str(inner):
                    return fields[0]
    except OSError:
        pass
    return None


def apps_pids(csv: str | None) -> list:
    """The pid column of the compute-apps CSV (the laptop parses the rest; here only: which pids to look up)."""
    pids = []
    for line in (csv or "").splitlines():
        first = line.split(",", 1)[0].strip()
        if first.isdigit():
            pids.append(int(first))
    return pids


def procs_of(pids: list) -> dict:
    """proc_info of each pid still there, keyed by the pid as text (the reply's `procs`)."""
    procs = {}
    for pid in pids:
        info = proc_info(pid)
        if info is not None:
            procs[str(pid)] = info
    return procs


def apps_reading() -> dict:
    """{"time", "apps_csv", "apps_error", "procs"}: the compute apps and what /proc says of each listed pid."""
    csv, err = compute_apps()
    return {"time": time.time(), "apps_csv": csv, "apps_error": err, "procs": procs_of(apps_pids(csv))}
