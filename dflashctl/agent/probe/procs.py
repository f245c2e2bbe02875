"""The probe's processes that matter for zombies: ours (by marker), defunct ones and their
parents, and every process holding /dev/nvidia* open (the driver does not list them in LXC)."""

from __future__ import annotations

import os
import re
import subprocess
import time

from dflashctl.agent.lib.procfs import (
    RUN_DIR_VAR,
    boot_time,
    proc_age_s,
    proc_cmdline,
    proc_env_var,
    proc_marker,
    proc_stat,
)


def holds_gpu(pid: int) -> bool:
    fd_dir = f"/proc/{pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(os.path.join(fd_dir, fd)).startswith("/dev/nvidia"):
                return True
        except OSError:
            continue
    return False


def elsewhere(pid: int, marker: str, runs_dir: str | None) -> bool:
    """The process names, beside its run id, a run directory that is not runs_dir's run of that id: it belongs to
    another workspace (runs of one id can exist in two). Older runs, started before DFLASH_RUN_DIR, cannot say."""
    run_dir = proc_env_var(pid, RUN_DIR_VAR)
    if runs_dir is None or not run_dir:
        return False
    return os.path.realpath(run_dir) != os.path.realpath(os.path.join(runs_dir, marker))


def scan_procs(exclude: tuple = (), include: tuple = (), runs_dir: str | None = None) -> list:
    """The interesting processes. The probe itself and its ancestors (the shell, `pct exec`, the
    dflashctl that called it, which may run inside a run's environment) are never reported."""
    now, btime = time.time(), boot_time()
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        st = proc_stat(pid)
        if st is not None:
            table[pid] = st
    skip = set(exclude)
    pid = os.getpid()
    while pid > 1:
        skip.add(pid)
        parent = table[pid]["ppid"] if pid in table else (proc_stat(pid) or {"ppid": 0})["ppid"]
        if parent in skip:
            break
        pid = parent
    for pid in skip:
        table.pop(pid, None)
    defunct_parents = {st["ppid"] for st in table.values() if st["state"] == "Z"}
    out = []
    for pid, st in sorted(table.items()):
        marker = proc_marker(pid)
        gpu = st["state"] != "Z" and holds_gpu(pid)
        if not (marker or gpu or st["state"] == "Z" or pid in defunct_parents or pid in include):
            continue
        out.append({
            "pid": pid, "ppid": st["ppid"], "pgid": st["pgid"], "state": st["state"],
            "run_id": marker, "cmdline": proc_cmdline(pid), "starttime": st["starttime"],
            "age_s": round(proc_age_s(st["starttime"], now, btime), 1), "holds_gpu": gpu,
            "elsewhere": bool(marker) and elsewhere(pid, marker, runs_dir),
        })
    return out


def host_gpu_procs(ctid: str) -> dict:
    """Run on the Proxmox host: compute processes from nvidia-smi, mapped to container CTID through
    /proc/PID/cgroup (lxc/CTID) and to the pid the container sees through NSpid. CTID "-": no
    container, every process is the machine's own (ns_pid = pid)."""
    try:
        res = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory,gpu_uuid", "--format=csv,noheader,nounits"],
            stdin=subprocess.DEVNULL, capture_output=True, timeout=20,
        )
    except FileNotFoundError:  # no NVIDIA driver here: no GPU processes, and nothing wrong
        return {"csv": None, "procs": [], "error": None}
    except subprocess.TimeoutExpired:
        return {"csv": None, "procs": [], "error": "nvidia-smi on the host timed out after 20s"}
    if res.returncode == 6:  # "No devices were found"
        return {"csv": "", "procs": [], "error": None}
    if res.returncode != 0:
        return {"csv": None, "procs": [], "error": f"nvidia-smi on the host exit {res.returncode}"}
    csv = res.stdout.decode("utf-8", "replace")
    pat = re.compile(rf"(^|/)lxc(\.payload)?[./]{re.escape(str(ctid))}(/|$)")
    procs = []
    for line in csv.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3 or not parts[0].isdigit():
            continue
        pid = int(parts[0])
        try:
            mem = float(parts[1])
        except ValueError:
            mem = None
        cgroup = ""
        try:
            with open(f"/proc/{pid}/cgroup") as f:
                cgroup = f.read()
        except OSError:
            pass
        ns_pid = None
        try:
            with open(f"/proc/{pid}/status") as f:
                for sline in f:
                    if sline.startswith("NSpid:"):
                        ns_pid = int(sline.split()[-1])
        except (OSError, ValueError):
            pass
        if ctid == "-":
            procs.append({"pid": pid, "ns_pid": pid, "used_memory_mib": mem, "gpu_uuid": parts[2],
                          "in_container": True})
            continue
        in_ct = any(pat.search(cl.split(":", 2)[-1]) for cl in cgroup.splitlines())
        procs.append({"pid": pid, "ns_pid": ns_pid if in_ct else None, "used_memory_mib": mem,
                      "gpu_uuid": parts[2], "in_container": in_ct})
    return {"csv": csv, "procs": procs, "error": None}
