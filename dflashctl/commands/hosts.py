"""`hosts check`: is each host ready to run training? Plain functions; they print nothing.

A check is: connect, the container is running, python is new enough, nvidia-smi is present and how
many GPUs it lists, the workspace is writable, free disk, py-spy is there and can attach (for `stacks`; a warning
when it cannot), and on a container host the two things LXC adds: the container's /dev/nvidia* nodes against the
host's device majors and the device cgroup rules of /etc/pve/lxc/<CTID>.conf (`devices`), and the container's
user-space driver against the host's kernel module (`driver`).
Everything after "connect" and "container" is gathered by one verb of the agent archive (`check`,
dflashctl/agent/check.py: one call per host once the archive is installed; where the workspace refuses the install it
runs from a private temporary one, so the workspace row names the problem), plus, on a container host, one on the
Proxmox host itself (`hostcheck`, dflashctl/agent/hostcheck.py). Hosts are checked concurrently: a dead host costs
its connect timeout once, not once per host.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from dflashctl.commands.fanout import fan_out
from dflashctl.errors import DflashError, ExitCode, RemoteFailed, RemoteTimeout
from dflashctl.model import Host
from dflashctl.remote import agentcall, connect
from dflashctl.remote.agentcall import parse_replies
from dflashctl.remote.masterclient import MasterInfo, end_master, list_masters
from dflashctl.remote.masterwire import connection_key

Status = Literal["ok", "warn", "fail", "skip"]
CHECKS = ("connect", "container", "python", "gpus", "devices", "driver", "workspace", "disk", "py-spy")
MIN_PYTHON = (3, 10)  # torch 2.13 and the trainer need it
GiB = 1024**3
DISK_FAIL_BYTES = 1 * GiB
DISK_WARN_BYTES = 10 * GiB


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str


@dataclass
class HostReport:
    host: Host
    checks: list[Check] = field(default_factory=list)
    error: DflashError | None = None  # the failure that stopped the checks, if one did

    @property
    def ok(self) -> bool:
        return all(c.status != "fail" for c in self.checks)

    @property
    def exit_code(self) -> int:
        """0 when ready; else the stopping error's code (102 unreachable, 2 auth/host key,
        101 timeout), or 2 when the host answers but does not match what hosts.toml asks for."""
        if self.ok:
            return int(ExitCode.OK)
        return int(self.error.exit_code) if self.error is not None else int(ExitCode.USAGE)

    def problems(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    def to_record(self) -> dict[str, Any]:
        return {"name": self.host.name, "ok": self.ok, "exit_code": self.exit_code,
                "checks": [{"name": c.name, "status": c.status, "detail": c.detail} for c in self.checks]}


def check_exit_code(reports: Sequence[HostReport]) -> int:
    """`hosts check`'s exit code: the highest non-zero code of any host (0 when every host passed)."""
    return max((r.exit_code for r in reports), default=0, key=lambda c: (c != 0, c))


def check_record(reports: Sequence[HostReport]) -> dict[str, Any]:
    """`hosts check --json`."""
    return {"ok": all(r.ok for r in reports), "hosts": [r.to_record() for r in reports]}


def check_hosts(hosts: Sequence[Host], *, timeout: float = 60.0, workers: int = 16) -> list[HostReport]:
    """Check every host concurrently; reports come back in the order given. A host still not done 30 s after
    the check's own timeout is reported as not answering, and the others do not wait for it."""
    def late(host: Host, seconds: float) -> HostReport:
        return _stop(HostReport(host), "connect", RemoteTimeout(f"host {host.name}: no answer within {seconds:g} s"))

    return fan_out(hosts, lambda h: check_host(h, timeout=timeout), late, workers=workers, deadline_s=timeout + 30)


def check_host(host: Host, *, timeout: float = 60.0) -> HostReport:
    report = HostReport(host)
    add = report.checks.append
    target = connect(host)
    try:
        try:
            connect_now = getattr(target.transport, "check_connection", None)
            if connect_now is not None:
                connect_now()
            add(Check("connect", "ok", ("ssh " if host.transport == "ssh" else "") + host.endpoint))
        except DflashError as e:
            return _stop(report, "connect", e)
        if host.container is None:
            add(Check("container", "skip", "none (commands run on the host)"))
        else:
            try:
                target.ensure_running()
                add(Check("container", "ok", f"CT {host.container} running"))
            except DflashError as e:
                return _stop(report, "container", e)
        try:
            # private_fallback: a workspace the archive cannot be installed in is this check's finding, not its end
            res = agentcall.run(target, "check", host.workspace, timeout=timeout, private_fallback=True)
            info = _parse(res.out)
        except DflashError as e:
            return _stop(report, "python", e)
        if info is None:
            why = res.tail() or f"exit {res.exit_code}"
            e = RemoteFailed(f"host {host.name}: `{host.python}` could not run the check script: {why}",
                            hint="set `python` for this host in hosts.toml to a Python >= 3.10")
            return _stop(report, "python", e)
        hostside = _host_side(target, timeout) if host.container is not None else None
        report.checks.extend(_judge(host, info, hostside))
        return report
    finally:
        target.close()


def _stop(report: HostReport, check: str, error: DflashError) -> HostReport:
    """A failed step makes the later ones meaningless: mark them skipped, keep the error."""
    report.error = error
    report.checks.append(Check(check, "fail", error.message))
    done = {c.name for c in report.checks}
    report.checks.extend(Check(name, "skip", f"not checked ({check} failed)") for name in CHECKS if name not in done)
    return report


def _parse(out: str) -> dict[str, Any] | None:
    docs = parse_replies(out)
    return docs[-1] if docs else None


def _host_side(target: Any, timeout: float) -> dict[str, Any]:
    """The Proxmox host's half (agent/hostcheck.py): the CT's conf lines, the device majors, the kernel module."""
    try:
        res = agentcall.run(target, "hostcheck", str(target.host.container), timeout=timeout, on_host=True)
    except DflashError as e:
        return {"error": e.message}
    doc = _parse(res.out)
    return doc if doc is not None else {"error": f"the host-side check printed no report: {res.tail() or 'no output'}"}


def _judge(host: Host, info: dict[str, Any], hostside: dict[str, Any] | None = None) -> list[Check]:
    checks = []
    version = tuple(int(p) for p in str(info.get("python", "0")).split(".")[:3])
    vtext = f"{info.get('python')} ({info.get('executable')})"
    if version[:2] < MIN_PYTHON:
        checks.append(Check("python", "fail", f"{vtext}: need >= {'.'.join(map(str, MIN_PYTHON))}"))
    else:
        checks.append(Check("python", "ok", vtext))
    checks.append(_judge_gpus(host, info.get("nvidia_smi")))
    checks.append(judge_devices(host, info.get("nvidia_nodes") or [], hostside))
    checks.append(judge_driver(host, info.get("driver") or {}, hostside))
    ws = info.get("workspace") or {}
    if ws.get("writable"):
        checks.append(Check("workspace", "ok", f"{host.workspace} writable"))
    else:
        checks.append(Check("workspace", "fail", f"{host.workspace} not writable ({ws.get('error', 'unknown')})"))
    disk = info.get("disk") or {}
    if "free_bytes" in disk:
        free, total = disk["free_bytes"], disk["total_bytes"]
        text = f"{free / GiB:.1f} GiB free of {total / GiB:.1f} GiB"
        status: Status = "fail" if free < DISK_FAIL_BYTES else "warn" if free < DISK_WARN_BYTES else "ok"
        checks.append(Check("disk", status, text))
    else:
        checks.append(Check("disk", "fail", f"cannot measure free disk ({disk.get('error', 'unknown')})"))
    checks.append(_judge_py_spy(info.get("py_spy")))
    return checks


def _judge_py_spy(spy: dict[str, Any] | None) -> Check:
    """`dflashctl stacks` works without py-spy only for our trainer (its dump signal): a warning, never a failure."""
    if spy is None:
        return Check("py-spy", "warn", "not found: `dflashctl stacks` then reads only dflashctl's trainer (its dump "
                                       "signal); install it in the container with `pip install py-spy`")
    if spy.get("error"):
        return Check("py-spy", "warn", f"{spy.get('path')} does not run: {spy['error']}")
    text = f"{spy.get('version') or 'py-spy'} ({spy.get('path')})"
    attach = spy.get("attach")
    if attach is not None and not attach.get("ok"):
        return Check("py-spy", "warn", f"{text} cannot attach to a process here ({attach.get('error')}): ptrace is "
                                       "denied in this container (its seccomp profile, AppArmor or a dropped "
                                       "CAP_SYS_PTRACE); allow ptrace and process_vm_readv for the container, or "
                                       "`dflashctl stacks` reads only dflashctl's trainer (its dump signal)")
    return Check("py-spy", "ok", text + (", attaches" if attach is not None else ""))


# /dev node -> the /proc/devices name of its driver (nvidiactl, nvidia-modeset and nvidiaN share nvidia-frontend's
# major, 195; older drivers name it "nvidia"); NEEDED: the nodes CUDA opens.
NODE_DRIVER = (("/dev/nvidia-uvm", "nvidia-uvm"), ("/dev/nvidia-caps/", "nvidia-caps"),
               ("/dev/nvidia-nvswitch", "nvidia-nvswitch"), ("/dev/nvidia-nvlink", "nvidia-nvlink"),
               ("/dev/nvidia", "nvidia-frontend"))
NEEDED_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm")


def _node_driver(path: str) -> str:
    return next(name for prefix, name in NODE_DRIVER if path.startswith(prefix))


def _allowed(rules: Sequence[tuple[str, str]], major: int, minor: int) -> bool:
    """Does the conf's device cgroup list (allow/deny lines, in order, last match wins) give `c major:minor rw`?
    `devN:` passthrough entries are resolved by the caller."""
    ok = False
    for key, value in rules:
        parts = value.split()
        if value.strip() == "a":
            ok = key.endswith("allow")
            continue
        if len(parts) < 2 or parts[0] not in ("c", "a") or ":" not in parts[1]:
            continue
        maj, mnr = parts[1].split(":", 1)
        perms = parts[2] if len(parts) > 2 else "rwm"
        if maj in ("*", str(major)) and mnr in ("*", str(minor)):
            if key.endswith("allow") and "r" in perms and "w" in perms:
                ok = True
            elif key.endswith("deny") and ("r" in perms or "w" in perms):
                ok = False
    return ok


def judge_devices(host: Host, nodes: Sequence[dict[str, Any]], hostside: dict[str, Any] | None) -> Check:
    """The container's /dev/nvidia* against the host: each node's major is the host's for its driver (nvidia-uvm's is
    assigned at module load), its major:minor is allowed by the conf's device cgroup lines (or passed by `devN:`),
    and it opens; nvidiactl and nvidia-uvm exist. A failure when hosts.toml uses GPUs, else a warning."""
    if hostside is None:
        return Check("devices", "skip", "no container (the GPU nodes are the host's own)")
    if hostside.get("error"):
        return Check("devices", "warn", f"cannot read the Proxmox host's side: {hostside['error']}")
    majors: dict[str, int] = hostside.get("majors") or {}
    if "nvidia-frontend" not in majors and "nvidia" in majors:
        majors = {**majors, "nvidia-frontend": majors["nvidia"]}
    conf = hostside.get("conf") or {}
    ct, conf_path = host.container, conf.get("path", f"/etc/pve/lxc/{host.container}.conf")
    if not any(k.startswith("nvidia") for k in majors):
        if not nodes:
            return Check("devices", "skip", "no NVIDIA driver loaded on the host (/proc/devices)")
        return Check("devices", "warn", f"CT {ct} has {nodes[0]['path']} but the host has no NVIDIA driver loaded")
    bad = "fail" if (host.gpus_target or host.gpus_drafters) else "warn"
    rules = [(k, v) for k, v in conf.get("lines") or [] if k.startswith("lxc.cgroup")]
    passed = {v.split(",")[0].strip() for k, v in conf.get("lines") or [] if k.startswith("dev")}
    problems: list[str] = []
    for node in nodes:
        path, major, minor = node["path"], int(node["major"]), int(node["minor"])
        want = majors.get(_node_driver(path))
        if want is not None and major != want:
            problems.append(f"{path} is {major}:{minor} in CT {ct} but the host's {_node_driver(path)} major is {want} "
                            f"(assigned when the module loads): recreate it from the host's node — `devN: {path}` in "
                            f"{conf_path}, or bind-mount it with `lxc.mount.entry: {path} {path[1:]} none "
                            f"bind,optional,create=file`")
            continue
        if path not in passed and not _allowed(rules, major, minor):
            problems.append(f"{path} ({major}:{minor}) is not allowed by CT {ct}'s device cgroup: add "
                            f"`lxc.cgroup2.devices.allow: c {major}:* rwm` to {conf_path} (or pass it as "
                            f"`devN: {path}`) and restart the container")
            continue
        err = node.get("open_error")
        if err and err[0] in ("EPERM", "EACCES"):  # the cgroup denies what the conf allows: rules not applied yet
            problems.append(f"{path} ({major}:{minor}) is allowed in {conf_path} but opening it in CT {ct} fails with "
                            f"{err[0]} ({err[1]}): the container runs with older device rules; restart it "
                            f"(`pct stop {ct} && pct start {ct}`)")
        # ENXIO / ENODEV: no device behind the number; a wrong number is what the major comparison above reports
    present = {n["path"] for n in nodes}
    gpus = sorted(p for p in present if re.fullmatch(r"/dev/nvidia\d+", p))
    for path in [p for p in NEEDED_NODES if p not in present] + ([] if gpus else ["/dev/nvidia0"]):
        problems.append(f"{path} is missing in CT {ct}: pass it with `devN: {path}` in {conf_path} (PVE 8.1+), or "
                        f"`lxc.mount.entry: {path} {path[1:]} none bind,optional,create=file` plus "
                        f"`lxc.cgroup2.devices.allow: c <major>:* rwm`")
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        return Check("devices", bad, problems[0] + more)
    text = ", ".join(f"{n['path'][5:]} {n['major']}:{n['minor']}" for n in nodes)
    return Check("devices", "ok", f"{text}: the host's majors, allowed by the device cgroup")


def _same_version(a: str, b: str) -> bool:
    """550.54 (NVML's library version) matches 550.54.14; 550.54.14 matches only itself."""
    pa, pb = a.split("."), b.split(".")
    n = min(len(pa), len(pb))
    return pa[:n] == pb[:n]


def judge_driver(host: Host, user: dict[str, Any], hostside: dict[str, Any] | None) -> Check:
    """The container's user-space driver (nvidia-smi's / NVML's version, libnvidia-ml.so.<v>) must be the host's
    kernel module's version exactly: a container ships only user space, the kernel module is the host's."""
    if hostside is None:
        return Check("driver", "skip", "no container (user space and kernel module are the host's own)")
    if hostside.get("error"):
        return Check("driver", "warn", f"cannot read the Proxmox host's side: {hostside['error']}")
    kernel = (hostside.get("kernel_driver") or {}).get("version")
    versions = [v for v in (user.get("smi"), user.get("nvml"), *(user.get("libs") or [])) if v]
    if kernel is None:  # nothing to hold user space against (and `gpus` says whether nvidia-smi works)
        have = f" (CT {host.container} has user space {versions[0]})" if versions else ""
        return Check("driver", "skip", f"no NVIDIA kernel module loaded on the host{have}")
    bad = "fail" if (host.gpus_target or host.gpus_drafters) else "warn"
    if not versions:
        return Check("driver", bad, f"no NVIDIA user-space driver in CT {host.container} (host kernel module "
                                    f"{kernel}): install {kernel}'s user space in the container (the .run "
                                    "installer with --no-kernel-module, or the distribution's packages of that "
                                    "exact version)")
    wrong = [v for v in versions if not _same_version(v, kernel)]
    if wrong or user.get("mismatch"):
        seen = wrong[0] if wrong else versions[0]
        return Check("driver", bad, f"CT {host.container}'s user-space driver is {seen} but the host's kernel module "
                                    f"is {kernel} (Driver/library version mismatch: NVML cannot start): install "
                                    f"exactly {kernel} in the container (the .run installer with --no-kernel-module)"
                                    ", or after a host driver update reboot the host so the loaded module matches")
    return Check("driver", "ok", f"{versions[0]} in CT {host.container} = the host's kernel module {kernel}")


def _judge_gpus(host: Host, smi: dict[str, Any] | None) -> Check:
    wanted = sorted(set(host.gpus_target) | set(host.gpus_drafters))
    cpu_host = not wanted
    if smi is None:
        if cpu_host:
            return Check("gpus", "warn", "nvidia-smi not found: CPU only (no GPUs listed in hosts.toml)")
        return Check("gpus", "fail", f"nvidia-smi not found, but hosts.toml uses GPUs {wanted}")
    gpus = smi.get("gpus") or []
    if smi.get("code") != 0 or not gpus:
        text = f"nvidia-smi exit {smi.get('code')}: {smi.get('message') or 'no output'}"
        return Check("gpus", "warn" if cpu_host else "fail", text)
    names = sorted({g.split(":", 1)[1].split("(UUID")[0].strip() for g in gpus if ":" in g})
    text = f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''} ({', '.join(names)})"
    missing = [i for i in wanted if i >= len(gpus)]
    if missing:
        return Check("gpus", "fail", f"{text}, but hosts.toml uses GPU {missing[0]}")
    off = sorted(int(i) for i, mode in (smi.get("persistence") or {}).items() if mode == "Disabled")
    if off:  # the driver unloads between processes: slow starts, and lost Xid / ECC state between them
        return Check("gpus", "warn", f"{text}; persistence mode off on GPU {','.join(map(str, off))} "
                                     "(on the host: nvidia-smi -pm 1, or enable nvidia-persistenced)")
    return Check("gpus", "ok", text)


def disconnect(hosts: Sequence[Host] | None = None) -> list[MasterInfo]:
    """`hosts disconnect`: end the ssh connection masters of `hosts` (all of this user's when None) and say which
    ones were running. A master is one host's when it holds that host's connection (or was started under its name)."""
    masters = list_masters()
    if hosts is not None:
        keys = {connection_key(h) for h in hosts if h.transport == "ssh"}
        names = {h.name for h in hosts}
        masters = [m for m in masters if m.place.key in keys or m.host in names]
    return [m for m in masters if end_master(m)]
