"""status: probe reports → the same judgement diagnose makes, once or as a live stream.

The state between reports is analysis/watcher.py's `Watcher` (the container's sentinel runs the same one);
`status_once`, `watch` and `status_all` only move reports into it. The CLI renders the `StatusView` it returns —
the table and `--json` come from that one record.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from dflashctl.analysis import judging
from dflashctl.analysis.events import read_events
from dflashctl.analysis.watcher import CONTAINER_GONE, HOST_REPLACED, StatusView, Watcher, gone_text
from dflashctl.commands import gpushare
from dflashctl.commands.fanout import HOST_DEADLINE_S, fan_out
from dflashctl.errors import (
    ConnectFailed,
    ContainerNotRunning,
    DflashError,
    ExitCode,
    HostKeyError,
    NotFound,
    RemoteTimeout,
)
from dflashctl.model import Host, JudgeSettings
from dflashctl.remote import probe
from dflashctl.remote.target import Target
from dflashctl.report import ProbeReport

__all__ = ["HostLine", "StatusView", "Watcher", "all_exit_code", "all_record", "is_failure", "status_all",
           "status_once", "watch"]

RECONNECT_BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 8.0)


def _no_run(host: Host, run: str | None) -> NotFound:
    what = f"run {run!r}" if run and run != "latest" else "no run (runs/latest is missing)"
    return NotFound(f"{what} on {host.name} ({host.workspace}/runs)" if run and run != "latest" else
                    f"{what} on {host.name}", hint="list runs with `dflashctl runs`; start one with `dflashctl launch`")


def status_once(target: Target, run: str | None = None, *, judge: JudgeSettings | None = None,
                log_max: int = probe.DEFAULT_LOG_MAX, fetch: probe.StatusFetch | None = None) -> StatusView:
    """One round trip: the log's tail, GPUs, process state, and from the GPU host (for a container host, the Proxmox
    host) the kernel log's Xid lines and the host view's GPU share (issue 29) → a judged view. judge: the host's
    (hosts.toml) unless given. fetch: the readings already asked for (cli/statusonce.py asks before importing
    this module, so the two overlap); else asked now."""
    doc, host_gpus = (fetch or probe.StatusFetch(target, run, log_max=log_max)).result()
    if doc.run is None:
        raise _no_run(target.host, run)
    w = judging.watcher(target.host.name, judge or target.host.judge)
    view = with_events(w.update(doc), doc)
    view.gpu_share = gpushare.share_of(target, host_gpus, doc.run.id if doc.run.alive else None)
    return view


def with_events(view: StatusView, doc: ProbeReport) -> StatusView:
    """The view with the sentinel's timeline from the same report (events.jsonl, read with analysis/events.py)."""
    if doc.events_data is not None:
        view.events = [e.to_record() for e in read_events(doc.events_data)]
    cap = doc.stacks_capture
    if cap and isinstance(cap.get("doc"), dict):
        from dflashctl.analysis.stacks import processes_from_capture  # only a run whose sentinel saved a capture

        view.stacks = {"path": cap.get("path"), "time": cap["doc"].get("time"), "reason": cap["doc"].get("reason"),
                       "processes": [p.to_record() for p in processes_from_capture(cap["doc"])]}
    return view


def watch(connect: Callable[[], Target], run: str | None = None, *, interval: float = 1.0,
          judge: JudgeSettings | None = None, log_max: int = probe.DEFAULT_LOG_MAX,
          sleep: Callable[[float], None] = time.sleep, gpu_interval: float | None = None) -> Iterator[StatusView]:
    """Views from one streaming probe, forever (the caller stops). A dropped connection yields the
    last view marked "reconnecting", then reconnects with backoff and resumes at the last log offset.
    An attempt that ended with a restart pending (its sentinel asked for one) is followed by the next attempt:
    the watch moves to the run `latest` names once it is another. gpu_interval: the probe reads the GPUs this
    often and each view's GPU series reduces an interval's readings (default: one reading per report)."""
    target = connect()
    w: Watcher | None = None
    failures = 0
    try:
        while True:
            try:
                if w is None:  # first look: the log's tail, then follow from its end
                    doc = probe.probe_once(target, target.host.workspace, run or "latest", log_max=log_max,
                                           require_run=False, events=True, xid=True)
                    if doc.run is None:
                        raise _no_run(target.host, run)
                    w = judging.watcher(target.host.name, judge or target.host.judge, live=True)
                    yield with_events(w.update(doc), doc)
                for doc in probe.probe_stream(target, target.host.workspace, w.run_id, w.next_offset, interval,
                                              log_max=log_max, log_inode=w.inode, events=True,
                                              gpu_interval=gpu_interval):
                    failures = 0
                    ended = w.gone_from(doc, target.host.name)
                    if ended is not None:  # its directory deleted or replaced: nothing more to watch
                        yield w.gone(*ended)
                        return
                    view = with_events(w.update(doc), doc)
                    if view.restart_pending:
                        from dflashctl.commands.waiting import next_attempt

                        nxt = next_attempt(target, view.run)
                        if nxt is not None:
                            yield view
                            run, w = nxt, None
                            break
                        view.restart_pending = False  # it never came: this is the end
                    yield view
                else:
                    raise ConnectFailed(f"host {target.host.name}: the watch probe ended")
            except DflashError as e:
                ended = _watch_gone(connect, e) if w is not None and w.last is not None else None
                if w is not None and ended is not None:
                    kind = HOST_REPLACED if isinstance(ended, HostKeyError) else CONTAINER_GONE
                    yield w.gone(kind, gone_text(kind, target.host.name, w.run_id or "?", ended.message))
                    return  # the container stopped or destroyed, or another machine answers: the watch ends
                if w is None or not isinstance(e, ConnectFailed | RemoteTimeout):
                    raise  # nothing to resume, or not a connection problem (a missing run, bad auth)
                view = w.reconnecting(e.message) if w is not None else None
                if view is not None:
                    yield view
                sleep(RECONNECT_BACKOFF_S[min(failures, len(RECONNECT_BACKOFF_S) - 1)])
                failures += 1
                with contextlib.suppress(Exception):  # closing a dead connection may fail in any way
                    target.close()
                target = connect()
    finally:
        target.close()


def _watch_gone(connect: Callable[[], Target], e: DflashError) -> DflashError | None:
    """The error that ends a watch for good, or None: another machine answers (host key changed), or the container
    is stopped or destroyed — said by the error itself, or, for a probe that ended without a report, by asking the
    container's state afresh (a container being stopped can end a stream before `pct exec` refuses)."""
    if isinstance(e, HostKeyError | ContainerNotRunning):
        return e
    if isinstance(e, ConnectFailed | RemoteTimeout):
        return None  # the connection: reconnect
    try:
        with connect() as t:
            if t.host.container is not None:
                t.ensure_running()
    except (ContainerNotRunning, NotFound, HostKeyError) as state:
        return state
    except DflashError:
        return None
    return None


@dataclass
class HostLine:
    """`status --all`: one host, one line."""

    host: str
    view: StatusView | None = None
    error: str | None = None
    exit_code: int = 0

    def to_record(self) -> dict[str, Any]:
        if self.view is None:
            return {"host": self.host, "error": self.error, "exit_code": self.exit_code}
        return {"host": self.host, "error": None, **self.view.to_record()}


def status_all(hosts: list[Host], connect: Callable[[Host], Target], *, judge: JudgeSettings | None = None,
               workers: int = 16, deadline_s: float = HOST_DEADLINE_S) -> list[HostLine]:
    """Every host at once, one connection each, in the order given; a host that does not answer within
    deadline_s is a row saying so, and the others do not wait for it."""
    def one(host: Host) -> HostLine:
        try:
            with connect(host) as target:
                v = status_once(target, None, judge=judge, log_max=64 << 10)
            return HostLine(host.name, v, exit_code=v.exit_code)
        except DflashError as e:
            return HostLine(host.name, error=e.message, exit_code=int(e.exit_code))

    def late(host: Host, seconds: float) -> HostLine:
        return HostLine(host.name, error=f"host {host.name}: no answer within {seconds:g} s",
                        exit_code=int(ExitCode.NOT_FINISHED))

    return fan_out(hosts, one, late, workers=workers, deadline_s=deadline_s)


def is_failure(v: StatusView) -> bool:
    """What `--exit-on-failure` stops on: a crash, a dead thread, a stall, a lost run (once it is sure)."""
    if v.settling:
        return False
    return v.health.verdict.is_failure


def all_exit_code(lines: list[HostLine]) -> int:
    """`status --all`'s exit code: the worst host's (0 when there are none)."""
    return max((ln.exit_code for ln in lines), default=0)


def all_record(lines: list[HostLine]) -> dict[str, Any]:
    """`status --all --json`."""
    return {"hosts": [ln.to_record() for ln in lines], "exit_code": all_exit_code(lines)}
