"""stacks: the Python stack of every thread of every process of a run, live or stalled.

The container program (agent/stacks.py) finds the run's marked processes and dumps each with py-spy, else with the
trainer's dump signal (SIGUSR1 → faulthandler, trainer/threaddump.py); analysis/stacks.py parses the dumps. The
capture is also saved in the run directory (<run>/stacks/capture-<UTC stamp>.json) unless asked not to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dflashctl.analysis.safe_names import safe_name
from dflashctl.analysis.stacks import ProcessStacks, processes_from_capture
from dflashctl.commands.runs import get_run
from dflashctl.errors import DflashError, ExitCode
from dflashctl.remote import agentcall
from dflashctl.remote.target import Target

CALL_TIMEOUT_S = 180.0  # py-spy is bounded at 10 s a process (8 at once), the dump signal at 5 s
INSTALL_HINT = ("install py-spy in the container (`pip install py-spy`; `dflashctl hosts check` shows it); it needs "
                "ptrace: root in the container, and on the Proxmox host kernel.yama.ptrace_scope 0 or 1 "
                "(docs/usage.md, stacks)")


class NoStacks(DflashError):
    """Nothing could be dumped: no py-spy and no dump signal, py-spy refused everywhere, or no live process."""

    exit_code = ExitCode.USAGE


@dataclass
class StacksResult:
    run_id: str
    host: str
    run_dir: str
    py_spy: str | None  # py-spy's path in the container (None: not installed)
    py_spy_version: str | None
    processes: list[ProcessStacks]
    skipped: list[dict[str, Any]]  # the supervisor and sentinel, left out without --all
    saved: str | None  # <run>/stacks/capture-….json
    save_error: str | None = None

    @property
    def dumped(self) -> list[ProcessStacks]:
        return [p for p in self.processes if p.threads]

    def to_record(self) -> dict[str, Any]:
        """`stacks --json`."""
        return {"run": self.run_id, "host": self.host, "run_dir": self.run_dir, "py_spy": self.py_spy,
                "py_spy_version": self.py_spy_version, "saved": self.saved, "save_error": self.save_error,
                "processes": [p.to_record() for p in self.processes], "skipped": self.skipped}


def stacks(target: Target, run: str | None, *, include_all: bool = False, save: bool = True) -> StacksResult:
    """Dump the run's stacks; NotFound (102) for an unknown run, NoStacks (2) when no process could be dumped."""
    info, _ = get_run(target, run)
    safe_name(info.id, "run id", target.host.name)  # it names the capture's folder and is shown
    spec = {"run_dir": info.dir, "run_id": info.id, "reason": "dflashctl stacks", "all": include_all, "save": save}
    doc = agentcall.call(target, "stacks", spec, timeout=CALL_TIMEOUT_S)
    res = StacksResult(info.id, target.host.name, info.dir, doc.get("py_spy"), doc.get("py_spy_version"),
                       processes_from_capture(doc), list(doc.get("skipped") or []), doc.get("saved"),
                       doc.get("save_error"))
    if not res.processes:
        left_out = f" (left out: {', '.join(s['role'] for s in res.skipped)}; --all includes them)" if res.skipped \
            else ""
        raise NoStacks(f"run {info.id} has no live process to dump{left_out}",
                       hint="see `dflashctl runs` for what is running")
    if not res.dumped:
        raise NoStacks(explain(res), hint=INSTALL_HINT if res.py_spy is None or _ptrace(res) else None)
    return res


def _ptrace(res: StacksResult) -> bool:
    return any(w in (p.error or "").lower() for p in res.processes for w in ("permission", "not permitted", "ptrace"))


def explain(res: StacksResult) -> str:
    """Why no process has stacks, in one line."""
    who = ", ".join(f"pid {p.pid} ({_command(p.argv)})" for p in res.processes[:3])
    more = f" and {len(res.processes) - 3} more" if len(res.processes) > 3 else ""
    if res.py_spy is None:
        return (f"no stacks for run {res.run_id}: py-spy is not installed in the container and {who}{more} "
                "registered no dump signal (only dflashctl's trainer does)")
    return f"no stacks for run {res.run_id}: py-spy failed for {who}{more}: {res.processes[0].error}"


def _command(argv: list[str], width: int = 60) -> str:
    text = " ".join([argv[0].rsplit("/", 1)[-1], *argv[1:]]) if argv else "?"
    return text if len(text) <= width else text[: width - 1] + "…"
