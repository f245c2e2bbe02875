"""gpus: the whole GPU host's GPUs and who holds them. Two readings at once: the host probe where the driver's pids
are real (agent/probe/hostgpus.py: on the Proxmox host for a container host, else on the machine itself), and what
the container says of its runs (the probe: the live run, this workspace's run ids); analysis/hostgpus.py joins
them. It prints nothing.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from dflashctl.analysis.gpuwindow import Thresholds
from dflashctl.analysis.hostgpus import HostView, Runs, build_view
from dflashctl.errors import DflashError, ExitCode
from dflashctl.remote import agentcall, probe
from dflashctl.remote.target import Target

RUNS_REFRESH_S = 10.0  # a watch asks the container for its live run this often
WINDOW = 120  # a watch keeps this many host readings (the findings' window and the sparklines' history)


@dataclass
class Reading:
    """One host probe reply plus what the container said of its runs (None where it could not say)."""

    doc: dict[str, Any]
    runs: Runs | None
    runs_note: str | None = None


def host_reading(target: Target, timeout: float | None = 60) -> dict[str, Any]:
    """One host probe reply (DflashError when it printed none)."""
    on_host = agentcall.host_half_on_proxmox(target)
    res = agentcall.run(target, "hostgpus", timeout=timeout, on_host=on_host)
    docs = probe.parse_frames(res.stdout)
    if not docs:
        where = agentcall.where(target, on_host)
        raise DflashError(f"the GPU probe on {where} printed no report (exit {res.exit_code}): "
                          f"{res.tail() or 'no output'}", hint="is python3 installed there?",
                          exit_code=ExitCode.REMOTE_FAILED)
    return docs[-1]


def container_runs(target: Target, timeout: float | None = 60) -> tuple[Runs | None, str | None]:
    """The live run of the host's workspace and its run ids, or (None, why not)."""
    try:
        doc = probe.probe_once(target, target.host.workspace, "latest", procs=True, gpus=False, log_max=0,
                               require_run=False, timeout=timeout)
    except DflashError as e:
        return None, f"runs unknown ({e.message}): no process is called current or earlier"
    run = doc.run
    return Runs(run.id if run is not None and run.alive else None, frozenset(doc.run_ids)), None


def read(target: Target, timeout: float | None = 60) -> Reading:
    """One host reading and the container's runs, asked at the same moment (their waits overlap)."""
    target.transport.check_connection()
    found: list[tuple[Runs | None, str | None]] = []
    side = threading.Thread(target=lambda: found.append(container_runs(target, timeout)), name="gpus-runs",
                            daemon=True)
    side.start()
    doc = host_reading(target, timeout)
    side.join(timeout)
    runs, note = found[0] if found else (None, "runs unknown: the container did not answer in time")
    return Reading(doc, runs, note)


def view_of(target: Target, docs: list[dict[str, Any]], runs: Runs | None, runs_note: str | None = None,
            thresholds: Thresholds = Thresholds()) -> HostView:
    ct = target.host.container
    view = build_view(docs, host=target.host.name, ours=str(ct) if ct is not None else None,
                      runs=runs or Runs(None, frozenset()), seen_from="host" if ct is not None else "machine",
                      thresholds=thresholds)
    if runs_note:
        view.notes.append(runs_note)
    return view


def snapshot(target: Target, timeout: float | None = 60) -> HostView:
    """`dflashctl gpus`: one reading."""
    reading = read(target, timeout)
    return view_of(target, [reading.doc], reading.runs, reading.runs_note)


def watch(target: Target, interval: float = 2.0) -> Iterator[HostView]:
    """One view per host reading from one long-running host probe (`--watch`), the GPUs judged over the readings
    kept (WINDOW); the container's runs asked again every RUNS_REFRESH_S. Close the iterator to stop it."""
    stream = agentcall.stream(target, "hostgpus", "--watch", f"{interval:g}",
                              on_host=agentcall.host_half_on_proxmox(target))
    docs: list[dict[str, Any]] = []
    runs, note = container_runs(target)
    asked = time.monotonic()
    try:
        for line in stream:
            doc = agentcall.parse_reply(line.decode("utf-8", "replace"))
            if doc is None:
                continue
            docs = [*docs[-(WINDOW - 1):], doc]
            if time.monotonic() - asked >= RUNS_REFRESH_S:
                runs, note = container_runs(target)
                asked = time.monotonic()
            yield view_of(target, docs, runs, note)
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):
                close()
