"""The whole GPU host's GPUs and who holds them (stdlib only), read in one call where the driver's pids are real.

Run on the Proxmox host (or on whatever machine is reachable, a container included): the GPU readings the probe
takes everywhere (probe/gpus.py: NVML, else nvidia-smi with its health columns), nvidia-smi's compute apps
(`--query-compute-apps`, pids as the driver knows them: the host's), and for each of those pids what /proc says
about it: its cgroup lines (`lxc/<CTID>` or `lxc.payload.<CTID>` name its container), NSpid (its pid in there),
uid, command line and our marker (DFLASH_RUN_ID / DFLASH_RUN_DIR). Inside a container the driver lists no
processes (it knows no PID namespaces): when GPUs hold memory and nothing is listed, the processes here that hold
/dev/nvidia* open are read instead (`holders`), without per-GPU memory (nothing here can say it).

Reply: {"probe_version", "time", "hostname", "gpus": <probe/gpus.py report>, "apps_csv": str | None,
"apps_error": str | None, "procs": {"<pid>": {...}}, "holders": [pid, ...] | None}. Values cross as read; the
laptop (analysis/hostgpus.py) judges them. The compute apps and their /proc facts are probe/gpuapps.py's (status's
host half reads them too).
"""

from __future__ import annotations

import os
import sys
import threading
import time

from dflashctl.agent.lib.frame import frame
from dflashctl.agent.probe.gpuapps import apps_pids, compute_apps, procs_of
from dflashctl.agent.probe.gpus import gpu_report
from dflashctl.agent.probe.procs import holds_gpu
from dflashctl.agent.probe.version import PROBE_VERSION


def gpu_holders() -> list:
    """Every process here with /dev/nvidia* open (what a container can see of who holds its GPUs)."""
    me = os.getpid()
    return [int(n) for n in os.listdir("/proc") if n.isdigit() and int(n) != me and holds_gpu(int(n))]


def _memory_held(gpus: dict) -> bool:
    """Some GPU reports memory used (NVML records or the CSV's memory.used column)."""
    for rec in gpus.get("nvml") or ():
        if (rec.get("memory_used_mib") or 0) > 0:
            return True
    lines = (gpus.get("smi_csv") or "").splitlines()
    if not lines:
        return False
    names = [c.strip().split(" ")[0] for c in lines[0].split(",")]
    col = names.index("memory.used") if "memory.used" in names else None
    for line in lines[1:] if col is not None else ():
        cells = line.split(",")
        try:
            if col < len(cells) and float(cells[col].split()[0]) > 0:
                return True
        except (ValueError, IndexError):
            continue
    return False


def _into(got: dict, read) -> None:  # noqa: ANN001 - read: () -> its value
    """got["value"] = read(), or got["error"]: what it raised, raised again by the caller as if read in its thread."""
    try:
        got["value"] = read()
    except BaseException as e:  # noqa: BLE001
        got["error"] = e


def host_gpus() -> dict:
    # the two nvidia-smi starts overlap (each is mostly waiting for the driver: tens of ms), as the probe's GPU reading
    # overlaps its other reads; the holder scan below comes after both, so it never counts an nvidia-smi of ours
    apps: dict = {}
    side = threading.Thread(target=_into, args=(apps, compute_apps), name="apps", daemon=True)
    side.start()
    gpus = gpu_report()
    side.join()
    if "error" in apps:
        raise apps["error"]
    csv, err = apps["value"]
    pids = apps_pids(csv)
    holders = None
    if not pids and _memory_held(gpus):
        holders = gpu_holders()
        pids = holders
    return {"probe_version": PROBE_VERSION, "time": time.time(), "hostname": os.uname().nodename, "gpus": gpus,
            "apps_csv": csv, "apps_error": err, "procs": procs_of(pids), "holders": holders}


def main(argv: list) -> int:
    """One report; with `--watch SECONDS`, one every SECONDS until stdout closes."""
    interval = float(argv[1]) if len(argv) == 2 and argv[0] == "--watch" else None
    while True:
        try:
            sys.stdout.write(frame(host_gpus()) + "\n")
            sys.stdout.flush()
        except BrokenPipeError:
            return 0
        if interval is None:
            return 0
        time.sleep(interval)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
