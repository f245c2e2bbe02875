"""The probe's laptop side: the probe is the `probe` verb of the agent archive (remote/agentcall.py), so it always
matches this CLI.

It is dflashctl/agent/probe/main.py, and it prints each report as ONE framed reply line (agent/lib/frame.py);
anything else on stdout (login banners, locale warnings) is ignored by the one parser, agentcall.parse_reply.

What it is asked: one ProbeRequest (agent/probe/request.py), sent as its to_argv() and read back by the probe with
from_argv(); probe_doc / probe_once / stream_docs build it from their keywords.
Fields (the contract with `status`): probe_version, time, hostname, run, log, gpus, procs; and,
added for the lifecycle verbs: run_requested (what --run asked for), disk {path, free_mib,
total_mib}, run.ended_at (mtime of exit_code), run.ending and run.supervisor_pid (run.alive stays
true after the trainer exits while its supervisor or a marked process of its group lives, until
exit_code exists; ending says the trainer itself is gone), procs[].starttime (clock ticks, for pid reuse),
run_ids (with --procs: this workspace's run directories), runs (with --runs: every run's state
plus log_size and log_tail_b64, its last bytes), events_b64 (with --events: the run's events.jsonl, its
last 64 KiB), run.restart (restart.json: the sentinel asked for another attempt), run.stopped_by (the
`stopped` marker), host_gpu_procs (with --host-gpu-procs, run on the Proxmox host:
{csv, procs: [{pid, ns_pid, used_memory_mib, gpu_uuid, in_container}], error}).
log.mtime is train.log's modification time (when it last grew). With --watch --gpus, gpus_series: every GPU
reading since the previous report (one per --gpu-interval, default the interval), oldest first, each a `gpus`
piece plus its `time`; the last is the report's own `gpus`.
The log: with --log-offset the bytes from there (at most --log-max); without, the last --log-max
bytes; a file that shrank below the offset or changed inode is read from 0 with "rotated": true.
The probe never reports itself or its ancestors (the caller) in procs. gpus.smi_csv is nvidia-smi's
`--format=csv,nounits` output, header included (analysis/gpus.py reads the columns by their names).

probe_once / probe_stream return typed reports (report.py, parsed once here); probe_doc / stream_docs give
the raw dicts, for tests of the probe program itself.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import threading
from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING

from dflashctl.agent.probe.request import DEFAULT_LOG_MAX, ProbeRequest
from dflashctl.agent.probe.version import PROBE_VERSION
from dflashctl.errors import DflashError, NotFound, RemoteFailed
from dflashctl.remote import agentcall, agentpack
from dflashctl.remote.agentcall import parse_replies, parse_reply
from dflashctl.remote.target import Target
from dflashctl.remote.transport import Result

if TYPE_CHECKING:
    from dflashctl.report import ProbeReport


def parse_report(doc: dict) -> ProbeReport:
    """report.parse_report, imported on first use: a one-shot status sends its request before the typed report's
    module (and the flight-recorder reader it imports) loads, so that import overlaps the round trip."""
    from dflashctl.report import parse_report as typed

    return typed(doc)

__all__ = ["PROBE_VERSION", "ProbeRequest", "decode_log", "parse_frames", "probe_args", "probe_doc",
           "probe_once", "probe_stream", "one_shot", "request_doc", "stream_docs",
           "StatusFetch"]


def parse_frames(text: str | bytes) -> list[dict]:
    """Every report's raw doc in `text`, in order, its version checked; unframed or torn lines are skipped."""
    return [_checked(doc) for doc in parse_replies(text)]


def _parse_line(line: str) -> dict | None:
    doc = parse_reply(line)
    return None if doc is None else _checked(doc)


def _checked(doc: dict) -> dict:
    from dflashctl.report import check_version

    check_version(doc)
    return doc


def decode_log(doc: dict) -> bytes:
    """The log bytes a raw report carries (empty when it carries none); typed reports have `log_data`."""
    log = doc.get("log") or {}
    return base64.b64decode(log.get("data_b64") or "")


def one_shot(workspace: str | None, run: str | None = None, log_offset: int | None = None, *,
             procs: bool = False, gpus: bool = True, runs: bool = False, log_max: int = DEFAULT_LOG_MAX,
             log_inode: int | None = None, pids: tuple[int, ...] = (), events: bool = False,
             xid: bool = False) -> ProbeRequest:
    """The one-shot ProbeRequest of probe_once's keywords."""
    return ProbeRequest(workspace=workspace or None, run=run, log_offset=log_offset, log_inode=log_inode,
                        log_max=log_max, procs=procs, pids=tuple(int(p) for p in pids), gpus=gpus, events=events,
                        runs=runs, xid=xid)


def probe_args(workspace: str | None, run: str | None = None, log_offset: int | None = None,
               **kw: object) -> list[str]:
    """one_shot(...)'s argv (for benchmarks that run the probe by hand)."""
    return one_shot(workspace, run, log_offset, **kw).to_argv()  # type: ignore[arg-type]


def probe_once(target: Target, workspace: str, run: str | None = None, log_offset: int | None = None,
               procs: bool = False, gpus: bool = True, *, runs: bool = False, log_max: int = DEFAULT_LOG_MAX,
               log_inode: int | None = None, pids: tuple[int, ...] = (), require_run: bool = True,
               timeout: float | None = 60, events: bool = False, xid: bool = False) -> ProbeReport:
    """One report. Raises NotFound when `run` was asked for, does not exist and require_run is set.
    pids: processes to report with --procs even when nothing marks them as interesting."""
    return parse_report(probe_doc(target, workspace, run, log_offset, procs, gpus, runs=runs, log_max=log_max,
                                  log_inode=log_inode, pids=pids, require_run=require_run, timeout=timeout,
                                  events=events, xid=xid))


def probe_doc(target: Target, workspace: str, run: str | None = None, log_offset: int | None = None,
              procs: bool = False, gpus: bool = True, *, runs: bool = False, log_max: int = DEFAULT_LOG_MAX,
              log_inode: int | None = None, pids: tuple[int, ...] = (), require_run: bool = True,
              timeout: float | None = 60, events: bool = False, xid: bool = False) -> dict:
    """probe_once's reply as the raw dict the probe sent (its version checked): for tests of the probe itself.
    xid: the GPU host's kernel-log Xid lines too — beside the probe where it runs on the GPU host, and for a
    container host from the Proxmox host by a request sent at the same time as the container's (_halves_at_once)."""
    req = one_shot(workspace, run, log_offset, procs=procs, gpus=gpus, runs=runs, log_max=log_max,
                   log_inode=log_inode, pids=pids, events=events, xid=xid)
    return request_doc(target, req, require_run=require_run, timeout=timeout)


def request_doc(target: Target, req: ProbeRequest, *, require_run: bool = True,
                timeout: float | None = 60, gpu_apps: bool = False) -> dict:
    """The raw report for one typed request (its version checked); NotFound when req.run does not exist and
    require_run is set. gpu_apps (with req.xid): who holds the GPUs as the GPU host's driver knows them too
    (agent/probe/gpuapps.py, for status's GPU share), read with the Xid lines by the host half (_halves_at_once)
    and put under the report's "gpu_apps" ({"error": ...} when it could not be read; None when the host half
    printed nothing)."""
    paired = req.xid and (agentcall.host_half_on_proxmox(target) or gpu_apps)
    args = dataclasses.replace(req, xid=False).to_argv() if paired else req.to_argv()
    if paired:
        res = _halves_at_once(target, args, timeout, gpu_apps)
    else:
        res = agentcall.run(target, "probe", *args, timeout=timeout)
    docs = parse_frames(res.stdout)
    main = [d for d in docs if d.get("half") != "host"] if paired else docs
    if not main:
        raise _no_report(target, res.exit_code, res.tail())
    doc = main[-1]
    if paired:
        host = [d for d in docs if d.get("half") == "host"]
        found = host[-1] if host else {}
        where = agentcall.where(target, agentcall.host_half_on_proxmox(target))
        doc["xid"] = found["xid"] if isinstance(found.get("xid"), dict) else {
            "error": f"the kernel-log probe on {where} printed no report (is python3 installed there?)"}
        if gpu_apps:
            doc["gpu_apps"] = found.get("gpu_apps") if isinstance(found.get("gpu_apps"), dict) else None
    if req.run and require_run and doc.get("run") is None:
        raise NotFound(f"run {req.run!r} not found in {req.workspace}/runs on {target.host.name}",
                       hint="list runs with `dflashctl runs`")
    return doc


class StatusFetch:
    """A one-shot status's readings, asked the moment this is made, on a thread: the probe (the log's tail, events,
    GPUs, process state) and the GPU host's half (the kernel log's Xid lines and the GPUs' compute processes, for
    the GPU share) — one round trip. Why a thread: the caller imports the judging code (about half of the laptop's CPU
    of a status) while the remote side works, instead of before asking (cli/statusonce.py)."""

    def __init__(self, target: Target, run: str | None, *, log_max: int = DEFAULT_LOG_MAX,
                 timeout: float | None = 60):
        req = one_shot(target.host.workspace, run or "latest", log_max=log_max, events=True, xid=True)
        self._got: dict = {}
        self._thread = threading.Thread(target=self._fetch, args=(target, req, timeout), name="status-fetch",
                                        daemon=True)
        self._thread.start()

    def _fetch(self, target: Target, req: ProbeRequest, timeout: float | None) -> None:
        try:
            self._got["doc"] = request_doc(target, req, require_run=False, timeout=timeout, gpu_apps=True)
        except BaseException as e:  # noqa: BLE001 - raised again in result(), in the caller's thread
            self._got["error"] = e

    def result(self) -> tuple[ProbeReport, dict | None]:
        """(the typed report, the host view's reading for the GPU share or None); what the request raised, raised
        here. The reading is shaped as `gpus`' host probe reply (agent/probe/hostgpus.py) with the probe's own GPU
        reading as its GPUs: the host's compute apps are placed on them by uuid, so the share is keyed by the GPU
        indices the run's GPUs show in status."""
        self._thread.join()
        if "error" in self._got:
            raise self._got["error"]
        doc = self._got["doc"]
        apps = doc.pop("gpu_apps", None)
        view = None if apps is None or "error" in apps else \
            {**apps, "gpus": doc.get("gpus") or {}, "holders": None}
        return parse_report(doc), view


HOST_HALF_WAIT_S = 20.0  # how long the host half may lag the container's probe before it is left out


def _halves_at_once(target: Target, args: list[str], timeout: float | None, apps: bool = False) -> Result:
    """The probe and the GPU host's half (agent/hostpair.py: the kernel log's Xid lines, and with `apps` who holds
    the GPUs, in one interpreter) as two requests sent together. For a container host the half runs on
    the Proxmox host (an LXC container may not read the host's ring buffer; nvidia-smi lists processes only where
    the driver's pids are real); for another host on the machine itself, beside the probe. Their waits overlap, so
    it costs one round trip: each a channel of the one connection (through its master or in-process)
    (measured: 145 ms against 204-212 ms for one command running both from the host, two interpreter starts in a
    row). Merged as the laptop reads them: the host half's reply first, then the probe's output and exit
    status (a failed one asks `pct status` for the precise error, as Target.run does for every command); a
    host half that fails or outlasts HOST_HALF_WAIT_S is left out (the report's xid note says so)."""
    target.transport.check_connection()  # once, here: two threads would each try a refused or silent host in turn
    half: list[bytes] = []
    on_host = agentcall.host_half_on_proxmox(target)
    agentpack.sha256()  # cached before the threads: each would otherwise read (or build) the archive itself

    def host_half() -> None:
        with contextlib.suppress(DflashError):
            half.append(agentcall.run(target, "hostpair", *(["--apps"] if apps else []), timeout=timeout,
                                      on_host=on_host).stdout)

    side = threading.Thread(target=host_half, name="probe-host-half", daemon=True)
    side.start()
    res = agentcall.run(target, "probe", *args, timeout=timeout)
    side.join(HOST_HALF_WAIT_S)
    return Result(res.argv, res.exit_code, b"".join(half[:1]) + res.stdout, res.stderr)


def probe_stream(target: Target, workspace: str, run: str | None, log_offset: int | None, interval: float,
                 *, procs: bool = False, gpus: bool = True, log_max: int = DEFAULT_LOG_MAX,
                 log_inode: int | None = None, events: bool = False,
                 gpu_interval: float | None = None) -> Iterator[ProbeReport]:
    """stream_docs, each report typed. Close the iterator to stop the probe."""
    docs = stream_docs(target, workspace, run, log_offset, interval, procs=procs, gpus=gpus, log_max=log_max,
                       log_inode=log_inode, events=events, gpu_interval=gpu_interval)
    try:
        for doc in docs:
            yield parse_report(doc)
    finally:
        docs.close()


def stream_docs(target: Target, workspace: str, run: str | None, log_offset: int | None, interval: float,
                *, procs: bool = False, gpus: bool = True, log_max: int = DEFAULT_LOG_MAX,
                log_inode: int | None = None, events: bool = False,
                gpu_interval: float | None = None) -> Generator[dict, None, None]:
    """One report per interval from a single long-running probe (no per-poll `pct exec` cost), and one at once
    (at most every 0.1 s) when the log shows a crash or the run ends (agent/probe/logwait.py): the interval paces
    only the idle updates. Each carries only the log bytes new since the previous one. Close the iterator to stop
    the probe.
    log_inode: the inode the offset belongs to, so a log rotated between reconnects (a new file that
    may already be larger than the offset) is read again from 0 instead of from the old offset.
    gpu_interval: read the GPUs this often between reports (each report's gpus_series; default: once a report)."""
    req = ProbeRequest(workspace=workspace or None, run=run, log_offset=log_offset, log_inode=log_inode,
                       log_max=log_max, procs=procs, gpus=gpus, events=events, watch=True, interval=float(interval),
                       gpu_interval=None if gpu_interval is None else float(gpu_interval))
    lines = agentcall.stream(target, "probe", *req.to_argv())
    got = False
    try:
        for line in lines:
            doc = _parse_line(line.decode("utf-8", "replace"))
            if doc is not None:
                got = True
                yield doc
    finally:
        close = getattr(lines, "close", None)
        if close is not None:
            close()
    if not got:
        raise _no_report(target, None, "the watch probe ended without a report")


def _no_report(target: Target, code: int | None, tail: str) -> RemoteFailed:
    hint = None
    if code == 127:
        hint = f"is `{target.host.python}` installed there? set `python` for host {target.host.name} in hosts.toml"
    return RemoteFailed(f"probe on {target.host.name} printed no report"
                        f"{f' (exit {code})' if code is not None else ''}: {tail or 'no output'}", hint=hint)
