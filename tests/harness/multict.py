"""More than one container on the test's Proxmox host, and processes started in them whose host pid is known.

A second container is a second PveEnv on the same sshd (same `pct` state, its own CTID, workspace and conf): it
shares the first one's nvidia-smi scenario (one host, one driver), so script the GPUs after creating it.
`start_in(pve, argv, env)` starts a detached process inside a container and returns (pid in there, host pid):
the host pid is found the way the Proxmox host would, by NSpid and cgroup `/lxc/<CTID>`.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

from harness.envs import PveEnv
from harness.poll import wait_until


def second_container(pve: PveEnv, tmp: Path) -> PveEnv:
    """Another running container on pve's host (close() it at the end: it stops and forgets the container)."""
    tmp.mkdir(parents=True, exist_ok=True)
    other = PveEnv(pve.sshd, tmp)
    return other


def _status_fields(pid: str) -> tuple[list[str], str]:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        cgroup = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return [], ""
    nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
    return nspid, cgroup


def host_pid_of(cgroup_dir: str, ns_pid: int) -> int | None:
    """The host pid of the process that the container whose cgroup is cgroup_dir (pve.container_cgroup: `/lxc/<CTID>`
    or, with real LXC, Proxmox's `/lxc/<CTID>/ns`) sees as ns_pid (None: not found)."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        nspid, cgroup = _status_fields(name)
        paths = [line.split(":", 2)[-1] for line in cgroup.splitlines()]
        in_ct = any(p == cgroup_dir or p.startswith(cgroup_dir + "/") for p in paths)
        if len(nspid) > 1 and nspid[-1] == str(ns_pid) and in_ct:
            return int(name)
    return None


def start_in(pve: PveEnv, argv: list[str], env: dict[str, str] | None = None) -> tuple[int, int]:
    """Start argv detached inside pve's container (env added to the container's own) → (ns pid, host pid)."""
    assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
    cmd = f"{assigns} setsid {' '.join(map(shlex.quote, argv))} </dev/null >/dev/null 2>&1 & echo $!"
    res = pve.exec(["sh", "-c", cmd])
    assert res.returncode == 0, res.stderr
    ns_pid = int(res.stdout.split()[-1])
    cgroup_dir = pve.container_cgroup
    assert cgroup_dir is not None, "no container cgroup here: skip tests that map host pids to containers"
    host_pid = wait_until(lambda: host_pid_of(cgroup_dir, ns_pid), 20,
                          f"container {pve.ctid}'s pid {ns_pid} on the host")
    return ns_pid, int(host_pid)


def start_on_host(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    """A process of the Proxmox host itself (this machine, outside every container)."""
    return subprocess.Popen(argv, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
