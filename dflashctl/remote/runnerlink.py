"""The master's side of the resident runners (agent/runner.py): one long-lived ssh channel per place a request's
Python runs, so a one-shot `[pct exec CT --] PYTHON -c SRC ARGS...` costs a fork there instead of a channel, a
`pct exec` and an interpreter start.

- Only non-stream requests of that exact shape are routed (route()); everything else keeps its channel.
- A runner starts on the first such request for its place, which waits for its hello for at most half the time
  it has left (START_TIMEOUT_S at most) and otherwise goes to a channel while the runner goes on starting for the
  requests after it: a slow start never costs a request its timeout. One that cannot start (no such Python, `pct
  exec` refused, no hello within START_TIMEOUT_S) sends its requests to channels, and its place is not tried again
  for RETRY_S.
- A request is committed once its frames are all sent: one whose send failed never reached the runner (it forks
  only on a whole STDIN frame) and runs on a channel; one in flight when the runner dies gets `ssh connection
  lost`, as a dying channel gives, and the next request starts a new runner.
- The request's timeout and a client hang-up kill the child's process group (KILL frame).
- DFLASHCTL_RUNNERS=0 in the environment of the command that starts a master turns them off for that master
  (benchmarks/status_breakdown.py compares the two).
"""

from __future__ import annotations

import json
import posixpath
import queue
import re
import select
import socket
import threading
import time
from collections.abc import Sequence
from functools import lru_cache

from dflashctl.agent import runner as proto
from dflashctl.remote import masterwire as wire
from dflashctl.remote.scripts import module_source
from dflashctl.remote.ssh import NoChannelInTime, SshTransport
from dflashctl.remote.sshlib import paramiko
from dflashctl.remote.transport import shell_join

START_TIMEOUT_S = 20.0
RETRY_S = 60.0
POLL_S = 0.1  # how often a waiting request looks at its deadline and its client's hang-up
_PYTHON = re.compile(r"python[0-9.]*\Z")
SIGNALLED = 255  # what a channel gives for a command a signal ended: sshd sends exit-signal, no exit-status
_LOST = b"L"  # queued to the requests in flight when the runner's channel ends

Place = tuple[str, ...]  # the argv prefix that starts a Python there: ("python3",) or ("pct", "exec", CT, "--", PY)


class NotRouted(Exception):
    """This request runs on a channel of its own, as without runners."""


class NotYet(NotRouted):
    """The place's runner is still starting: this request runs on a channel, later ones may find it ready."""


def route(argv: Sequence[str]) -> tuple[Place, str, list[str]] | None:
    """(place, SRC, ARGS) when argv is `[pct exec CT --] PYTHON -c SRC ARGS...`, else None."""
    argv = list(argv)
    prefix: list[str] = []
    if argv[:2] == ["pct", "exec"] and len(argv) > 4 and argv[2].isdigit() and argv[3] == "--":
        prefix, argv = argv[:4], argv[4:]
    if len(argv) >= 3 and argv[1] == "-c" and _PYTHON.match(posixpath.basename(argv[0])):
        return (*prefix, argv[0]), argv[2], argv[3:]
    return None


@lru_cache(maxsize=1)
def runner_source() -> str:
    return module_source("runner")


class Runner:
    """One runner's channel: requests are sent under send_lock; a reader thread hands each reply frame to the
    queue of its request."""

    def __init__(self, t: SshTransport, place: Place, deadline: float | None = None):
        """Starts it (its hello is awaited by Runners.get): NotYet when the request's deadline came before sshd
        gave the channel, NotRouted when it could not be started."""
        self.place = place
        self.send_lock = threading.Lock()
        self.calls_lock = threading.Lock()
        self.calls: dict[int, queue.SimpleQueue] = {}
        self.next_id = 1
        self.alive = True
        self.greeted = False  # it said hello: it ran, so its end is a runner gone, not a place that refuses one
        self.ready = threading.Event()  # set by its hello, or by its end
        self.give_up_at = time.monotonic() + START_TIMEOUT_S  # no hello by then: it never will
        try:
            self.chan = t._session(self.give_up_at if deadline is None else min(deadline, self.give_up_at))
            self.chan.exec_command(shell_join([*place, "-c", runner_source()]))
        except NoChannelInTime:
            if deadline is not None and deadline < self.give_up_at:
                raise NotYet("no channel yet") from None
            raise NotRouted("no channel for a runner") from None
        except Exception as e:  # noqa: BLE001 - any failure to start: the request goes to a channel
            raise NotRouted(str(e)) from None
        threading.Thread(target=self._read, name="runner-reader", daemon=True).start()

    def _read(self) -> None:
        buf = bytearray()
        chan = self.chan
        try:
            while True:
                select.select([chan], [], [], 1.0)  # paramiko wakes it for stdout and stderr alike
                while chan.recv_stderr_ready():
                    chan.recv_stderr(65536)  # the runner's own complaints: not anyone's output
                if chan.recv_ready():
                    data = chan.recv(65536)
                    if not data:
                        break
                    buf += data
                    for kind, rid, payload in proto.split_frames(buf):
                        self._dispatch(kind, rid, payload)
                elif chan.closed or chan.eof_received:
                    break
        except (OSError, EOFError, paramiko.SSHException):
            pass
        finally:
            with self.calls_lock:
                self.alive = False
                calls, self.calls = self.calls, {}
            for q in calls.values():
                q.put((_LOST, b""))
            self.ready.set()
            chan.close()

    def _dispatch(self, kind: bytes, rid: int, payload: bytes) -> None:
        if kind == proto.HELLO:
            self.greeted = True
            self.ready.set()
            return
        with self.calls_lock:
            q = self.calls.pop(rid, None) if kind == proto.EXIT else self.calls.get(rid)
        if q is not None:
            q.put((kind, payload))

    def submit(self, src: str, args: list[str], stdin: bytes | None) -> tuple[int, queue.SimpleQueue]:
        """Send one request; NotRouted when it did not reach the runner (dead, or the send failed)."""
        with self.calls_lock:
            if not self.alive:
                raise NotRouted("runner gone")
            rid, self.next_id = self.next_id, self.next_id + 1
            q: queue.SimpleQueue = queue.SimpleQueue()
            self.calls[rid] = q
        frames = proto.encode(proto.START, rid, json.dumps({"src": src, "args": args}).encode())
        try:
            with self.send_lock:
                self.chan.sendall(frames + proto.encode(proto.STDIN, rid, stdin or b""))
        except (OSError, EOFError, paramiko.SSHException):
            self.forget(rid)
            raise NotRouted("runner gone") from None
        return rid, q

    def forget(self, rid: int) -> None:
        with self.calls_lock:
            self.calls.pop(rid, None)

    def kill(self, rid: int) -> None:
        """End the request's child and everything in its process group (no reply is awaited)."""
        self.forget(rid)
        try:
            with self.send_lock:
                self.chan.sendall(proto.encode(proto.KILL, rid))
        except (OSError, EOFError, paramiko.SSHException):
            pass  # the runner is gone, and its children with it

    def close(self) -> None:
        """EOF to the runner: it kills its children and exits."""
        self.chan.close()


class Runners:
    """The runners of one master, by place; the places that refused one, until when."""

    def __init__(self, t: SshTransport, *, enabled: bool = True):
        self.t = t
        self.enabled = enabled  # DFLASHCTL_RUNNERS=0 in the environment that starts a master: channels only
        self.lock = threading.Lock()
        self.live: dict[Place, Runner] = {}
        self.refused: dict[Place, float] = {}
        self.starting: dict[Place, threading.Lock] = {}

    def get(self, place: Place, deadline: float | None = None) -> Runner:
        """The place's runner, ready. A request waits for a starting one for at most half the time it has left
        (NotYet: it takes a channel, the runner goes on starting); one that never says hello is given up."""
        with self.lock:
            if self.refused.get(place, 0.0) > time.monotonic():
                raise NotRouted("runner refused lately")
            start_lock = self.starting.setdefault(place, threading.Lock())
        until = None if deadline is None else time.monotonic() + (deadline - time.monotonic()) / 2
        if not start_lock.acquire(timeout=-1 if until is None else max(0.0, until - time.monotonic())):
            raise NotYet("another request is starting the runner")
        try:  # two first requests at once start one runner
            with self.lock:
                runner = self.live.get(place)
            if runner is None or not runner.alive:
                try:
                    runner = Runner(self.t, place, until)
                except NotYet:
                    raise
                except NotRouted:
                    self._refuse(place)
                    raise
                with self.lock:
                    self.live[place] = runner
        finally:
            start_lock.release()
        wait_until = runner.give_up_at if until is None else min(until, runner.give_up_at)
        if runner.ready.wait(max(0.0, wait_until - time.monotonic())):
            if runner.alive:
                return runner
            if runner.greeted:
                raise NotRouted("runner gone")  # it served, then ended: the next request starts a new one
        elif time.monotonic() < runner.give_up_at:
            raise NotYet("the runner is still starting")
        runner.close()  # it ended before its hello, or it never will say one
        self._refuse(place)
        raise NotRouted(f"no runner at {shell_join(place)}")

    def _refuse(self, place: Place) -> None:
        with self.lock:
            self.refused[place] = time.monotonic() + RETRY_S
            self.live.pop(place, None)

    def run(self, argv: Sequence[str], stdin: bytes | None, timeout: float | None, conn: socket.socket,
            hung_up: threading.Event, deadline: float | None = None) -> int | None:
        """run_channel's contract through a runner: output forwarded as it comes, the exit code returned, None when
        the client hung up; RemoteTimeout / ssh connection lost as a channel raises them. NotRouted: use a
        channel. deadline: the request's (time.monotonic()), from its timeout when not given."""
        routed = route(argv) if self.enabled else None
        if routed is None:
            raise NotRouted("not a PYTHON -c request")
        place, src, args = routed
        if deadline is None and timeout is not None:
            deadline = time.monotonic() + float(timeout)
        runner = self.get(place, deadline)
        rid, q = runner.submit(src, args, stdin)
        while True:
            try:
                kind, data = q.get(timeout=POLL_S)
            except queue.Empty:
                kind, data = None, b""
            if kind == proto.EXIT:
                doc = json.loads(data)
                return SIGNALLED if doc.get("signal") else int(doc["code"])
            if kind == _LOST:
                raise self.t._lost()
            if kind is not None:
                try:
                    wire.send(conn, wire.OUT if kind == proto.OUT else wire.ERR, data)
                except OSError:
                    hung_up.set()
            if hung_up.is_set():
                runner.kill(rid)
                return None
            if deadline is not None and time.monotonic() >= deadline:
                runner.kill(rid)
                raise self.t._timed_out(argv, float(timeout or 0))

    def close(self) -> None:
        with self.lock:
            runners = list(self.live.values())
        for runner in runners:
            runner.close()
