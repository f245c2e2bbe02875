"""status's host half (agent/hostpair.py): the kernel log's Xid lines and who holds the GPUs, read in ONE interpreter
on the Proxmox host beside the container probe; the GPU share places those processes on the probe's own GPUs."""

from __future__ import annotations

import os
import subprocess

from harness.agentpyz import archive_path
from harness.envs import PveEnv
from harness.poll import wait_until

from dflashctl.commands.status import status_once
from dflashctl.remote import probe
from dflashctl.remote.agentcall import parse_replies

XID_79 = ("[Tue Dec  1 16:20:11 2026] NVRM: Xid (PCI:0000:1e:00): 79, pid=4242, name=python3, "
          "GPU has fallen off the bus.")


def _host_half(pve: PveEnv, *args: str) -> subprocess.CompletedProcess:
    """agent/hostpair.py run as the laptop sends it, here on the Proxmox host (this machine)."""
    return subprocess.run(["python3", archive_path(), "hostpair", *args], capture_output=True,
                          env={**os.environ, **pve.sshd.env}, timeout=60, check=False)


def test_the_host_half_brings_the_xid_lines_and_the_gpu_processes_in_one_frame(pve: PveEnv) -> None:
    pve.set_kernel_log([XID_79])
    me = os.getpid()  # a real process of this host, as the driver lists one
    pve.set_gpus([{"memory.used": 70000, "utilization.gpu": 97}], processes=[{"pid": me, "used_memory": 70000,
                                                                             "gpu": 0}])
    res = _host_half(pve, "--apps")
    assert res.returncode == 0, res.stderr.decode()
    [doc] = parse_replies(res.stdout)
    assert doc["half"] == "host" and "fallen off the bus" in doc["xid"]["lines"][0]
    apps = doc["gpu_apps"]
    assert apps["apps_error"] is None and f"{me}, " in apps["apps_csv"]
    assert apps["procs"][str(me)]["nspid"][-1:] == [me]
    assert "gpus" not in apps  # the GPUs are the container probe's reading, not read a second time here
    [plain] = parse_replies(_host_half(pve).stdout)  # without --apps: the kernel-log half only
    assert set(plain) == {"probe_version", "half", "xid"}
    bad = _host_half(pve, "--bogus")
    assert bad.returncode == 2 and b"usage" in bad.stderr


def test_a_gpu_share_is_the_hosts_processes_placed_on_the_probes_gpus_and_no_holder_scan(pve: PveEnv) -> None:
    pve.set_gpus([{"memory.used": 70000, "utilization.gpu": 97}, {"memory.used": 512}])
    with pve.connect() as target:
        fetch = probe.StatusFetch(target, None)
        doc, view = fetch.result()
        assert view is not None and view["gpus"]["source"] == "nvidia-smi"  # the container probe's own reading
        assert doc.gpus is not None and view["gpus"]["smi_csv"] == doc.gpus.smi_csv
        # memory held, no process listed (the stand-in's host lists none here): nothing to split, and the host half
        # did not scan every process for /dev/nvidia* holders (status never used them)
        assert view["apps_csv"].strip() and len(view["apps_csv"].splitlines()) == 1
        assert view["holders"] is None and view["procs"] == {}


def test_a_wedged_driver_leaves_the_gpu_processes_out_and_the_xid_lines_still_come(pve: PveEnv) -> None:
    pve.set_kernel_log([XID_79])
    pve.set_gpus([{"memory.used": 70000}])
    pve.gpus.extra(sleep=8)  # nvidia-smi hangs past the host half's wait for it (GPU_WAIT_S, 5 s)
    res = _host_half(pve, "--apps")
    [doc] = parse_replies(res.stdout)
    assert "fallen off the bus" in doc["xid"]["lines"][0]
    assert "still being read after 5 s" in doc["gpu_apps"]["error"]
    # the abandoned nvidia-smi ends on its own (the host half does not wait for it): none left behind
    wait_until(lambda: not _stand_ins_running(pve), timeout=60, what="the hung nvidia-smi stand-in's end")


def test_status_share_is_none_when_the_host_half_could_not_read_the_gpu_processes(pve: PveEnv) -> None:
    pve.set_gpus([{"memory.used": 70000}])
    pve.gpus.fail("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
    with pve.connect() as target:
        _, view = probe.StatusFetch(target, None).result()
    assert view is not None and view["apps_csv"] is None and "exit 9" in view["apps_error"]


def _stand_ins_running(pve: PveEnv) -> bool:
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if str(pve.sshd.gpu_scenario).encode() in f.read():
                    with open(f"/proc/{pid}/cmdline", "rb") as c:
                        if b"nvidia-smi" in c.read():
                            return True
        except OSError:
            continue
    return False


def test_status_once_of_a_container_host_says_the_share_from_the_hosts_processes(pve: PveEnv) -> None:
    from status.runprog import start_in_container

    run_dir = start_in_container(pve, "20261203-1400-share", step_s=0.05)
    ns_pid = int((run_dir / "pid").read_text())
    host_pid = next(int(p) for p in os.listdir("/proc") if p.isdigit() and _nspid(int(p))[-1:] == [ns_pid]
                    and len(_nspid(int(p))) > 1)
    pve.set_gpus([{"memory.used": 71000, "utilization.gpu": 97}, {"memory.used": 512}],
                 processes=[{"pid": host_pid, "used_memory": 70000, "gpu": 0}, {"pid": os.getpid(),
                                                                                "used_memory": 1000, "gpu": 0}])
    with pve.connect() as target:
        view = status_once(target)
    assert view.gpu_share is not None and view.gpu_share[0] == (70000.0, 1000.0)


def _nspid(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(([int(x) for x in ln.split()[1:]] for ln in f if ln.startswith("NSpid:")), [])
    except OSError:
        return []
