"""`hosts check`: is each host ready to run training? Plain functions; they print nothing.

A check is: connect, the container is running, python is new enough, nvidia-smi is present and how
many GPUs it lists, the workspace is writable, free disk, py-spy is there (for `stacks`; a warning when it is not).
Everything after "connect" and "container" is gathered by one stdlib program sent on stdin
(dflashctl/agent/check.py: one round trip per host). Hosts are checked concurrently: a dead host costs its connect
timeout once, not once per host.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from dflashctl.commands.fanout import fan_out
from dflashctl.errors import DflashError, ExitCode, RemoteTimeout
from dflashctl.model import Host
from dflashctl.remote import connect
from dflashctl.remote.masterclient import MasterInfo, end_master, list_masters
from dflashctl.remote.masterwire import connection_key
from dflashctl.remote.scripts import module_source, parse_replies

Status = Literal["ok", "warn", "fail", "skip"]
CHECKS = ("connect", "container", "python", "gpus", "workspace", "disk", "py-spy")
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

    def to_json(self) -> dict[str, Any]:
        return {"name": self.host.name, "ok": self.ok, "exit_code": self.exit_code,
                "checks": [{"name": c.name, "status": c.status, "detail": c.detail} for c in self.checks]}


def check_exit_code(reports: Sequence[HostReport]) -> int:
    """`hosts check`'s exit code: the highest non-zero code of any host (0 when every host passed)."""
    return max((r.exit_code for r in reports), default=0, key=lambda c: (c != 0, c))


def check_record(reports: Sequence[HostReport]) -> dict[str, Any]:
    """`hosts check --json`."""
    return {"ok": all(r.ok for r in reports), "hosts": [r.to_json() for r in reports]}


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
            res = target.python(module_source("check"), host.workspace, timeout=timeout)
            info = _parse(res.out)
        except DflashError as e:
            return _stop(report, "python", e)
        if info is None:
            why = res.tail() or f"exit {res.exit_code}"
            e = DflashError(f"host {host.name}: `{host.python}` could not run the check script: {why}",
                            hint="set `python` for this host in hosts.toml to a Python >= 3.10")
            return _stop(report, "python", e)
        report.checks.extend(_judge(host, info))
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


def _judge(host: Host, info: dict[str, Any]) -> list[Check]:
    checks = []
    version = tuple(int(p) for p in str(info.get("python", "0")).split(".")[:3])
    vtext = f"{info.get('python')} ({info.get('executable')})"
    if version[:2] < MIN_PYTHON:
        checks.append(Check("python", "fail", f"{vtext}: need >= {'.'.join(map(str, MIN_PYTHON))}"))
    else:
        checks.append(Check("python", "ok", vtext))
    checks.append(_judge_gpus(host, info.get("nvidia_smi")))
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
    return Check("py-spy", "ok", f"{spy.get('version') or 'py-spy'} ({spy.get('path')})")


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
