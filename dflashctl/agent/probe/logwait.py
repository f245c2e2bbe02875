"""The probe's wait between two --watch reports, cut short when the run's log shows something that matters.

Between reports the probe watches the run directory at a fine grain: inotify where the kernel offers it (select()
on its descriptor, and on a pidfd of the trainer so its death wakes it too), else a stat of the log every
POLL_S. New log bytes are read from where this waiter last looked and fed to UrgentLines (urgent.py); the wait
ends early when they hold a crash, a signature or the run's end, when exit_code appears, or when the trainer's
process is gone. Ordinary growth never ends it: the redraw interval paces those reports. An early report never
follows an early one by less than MIN_GAP_S, so a crash storm is a report every 0.1 s, not a flood (a timed report
does not hold the next early one back: a crash that lands while one is being built goes out right after it).
"""

from __future__ import annotations

import contextlib
import os
import select
import time

from dflashctl.agent.probe.inotify import DirWatch, open_dir
from dflashctl.agent.probe.urgent import UrgentLines

POLL_S = 0.05  # the stat fallback's grain (and the pid check's where there is no pidfd)
MIN_GAP_S = 0.1  # the shortest time from one early report to the next
READ_MAX = 4 << 20  # bytes read per look: a log growing faster is looked at in pieces
SETTLE_S = 0.005  # after an event: let a burst of writes land before reading (one read per burst, not per write)
LOOK_GAP_S = 0.05  # a log written all the time is looked at 20 times a second, not once per write


class LogWaiter:
    """What the watch loop waits on. follow() after each report; wait(until) until the next one is due."""

    def __init__(self, use_inotify: bool = True):
        self.use_inotify = use_inotify
        self.scanner = UrgentLines()
        self.run_dir: str | None = None
        self.log_path: str | None = None
        self.pos: int | None = None  # how far this waiter has looked into the log
        self.inode: int | None = None
        self.sent_to = 0  # the last report carried the log up to here
        self.urgent_at = -1  # the end offset of the last urgent bytes seen (a report must carry them)
        self.ended = False  # exit_code appeared or the trainer went away since the last report
        self.exit_code_seen = False
        self.pid: int | None = None
        self.gone: set[int] = set()  # pids seen gone: never followed again (a zombie's pidfd stays readable)
        self.pidfd: int | None = None
        self.watch: DirWatch | None = None
        self.not_before = 0.0
        self.woke = False  # the last wait ended early: the report that follows it is an early one
        self.looks = 0  # times the log was looked at: for tests
        self.last_look = 0.0

    def follow(self, doc: dict) -> None:
        """A report went out: watch what it described, from where its log bytes ended."""
        self.not_before, self.woke = (time.time() + MIN_GAP_S if self.woke else 0.0), False
        run, log = doc.get("run"), doc.get("log")
        run_dir = run.get("dir") if run else None
        if run_dir != self.run_dir:
            self._unwatch()
            self.run_dir, self.pos, self.inode = run_dir, None, None
            self.scanner.reset()
            if run_dir and self.use_inotify:
                self.watch = open_dir(run_dir)
        self.log_path = os.path.join(run_dir, "train.log") if run_dir else None
        self.sent_to = log["next_offset"] if log else 0
        if log and (self.pos is None or log["inode"] != self.inode or log["rotated"] or self.pos < log["offset"]):
            self.scanner.reset()  # a new log, or bytes this waiter never saw: start where the report ended
            self.pos, self.inode, self.urgent_at = log["next_offset"], log["inode"], -1
        elif log and self.pos < self.sent_to:
            self._scan(self.sent_to, wake=False)  # bytes the report carried: for the traceback state only
        self.ended = False
        self.exit_code_seen = bool(run and run.get("exit_code") is not None)
        pid = run.get("pid") if run and run.get("alive") else None
        self._follow_pid(pid if pid not in self.gone else None)

    def pending(self) -> bool:
        """Something the last report did not carry asks for a report now."""
        return self.ended or self.urgent_at > self.sent_to

    def wait(self, until: float) -> bool:
        """Look, then block until `until` (False) or until something matters (True, no earlier than MIN_GAP_S
        after the last report). wait(0) is one look."""
        if self.run_dir is None:
            time.sleep(max(0.0, until - time.time()))
            return False
        while True:
            self._look()
            now = time.time()
            if self.pending() and now >= self.not_before:
                self.woke = True
                return True
            if now >= until:
                return False
            self._block((min(until, self.not_before) if self.pending() else until) - now)

    def close(self) -> None:
        self._unwatch()
        self._follow_pid(None)

    def _block(self, timeout: float) -> None:
        fds = [f for f in (self.watch.fd if self.watch else -1, self.pidfd if self.pidfd is not None else -1)
               if f >= 0]
        if self.watch is None or (self.pid is not None and self.pidfd is None):
            timeout = min(timeout, POLL_S)  # no event to wait on: look again soon
        if not fds:
            time.sleep(max(0.0, timeout))
            return
        ready, _, _ = select.select(fds, [], [], max(0.0, timeout))
        if self.watch is not None and self.watch.fd in ready:
            time.sleep(max(SETTLE_S, self.last_look + LOOK_GAP_S - time.time()))
            self.watch.drain()

    def _look(self) -> None:
        """Read what the log grew by and check the run's end markers."""
        self.looks += 1
        self.last_look = time.time()
        self._scan(None, wake=True)
        if not self.exit_code_seen and os.path.exists(os.path.join(self.run_dir, "exit_code")):
            self.exit_code_seen = self.ended = True
        if self.pid is not None and self._pid_gone():
            self.ended = True
            self.gone.add(self.pid)
            self._follow_pid(None)

    def _scan(self, upto: int | None, wake: bool) -> None:
        if self.log_path is None:
            return
        try:
            f = open(self.log_path, "rb")  # noqa: SIM115 - closed by the `with f` below
        except OSError:
            return
        with f:
            st = os.fstat(f.fileno())
            if self.pos is None or st.st_ino != self.inode or st.st_size < self.pos:
                self.scanner.reset()  # rotated or truncated: the report will say so and read it from 0
                self.pos, self.inode, self.sent_to, self.urgent_at = 0, st.st_ino, 0, -1  # the next report: from 0
            end = st.st_size if upto is None else min(upto, st.st_size)
            while self.pos < end:
                f.seek(self.pos)
                data = f.read(min(READ_MAX, end - self.pos))
                if not data:
                    break
                self.pos += len(data)
                if self.scanner.feed(data) and wake:
                    self.urgent_at = self.pos

    def _follow_pid(self, pid: int | None) -> None:
        if pid == self.pid:
            return
        if self.pidfd is not None:
            os.close(self.pidfd)
        self.pid, self.pidfd = pid, None
        if pid is not None and self.use_inotify and hasattr(os, "pidfd_open"):
            with contextlib.suppress(OSError):
                self.pidfd = os.pidfd_open(pid)

    def _pid_gone(self) -> bool:
        if self.pidfd is not None:
            return bool(select.select([self.pidfd], [], [], 0)[0])
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False
        return _zombie(self.pid)

    def _unwatch(self) -> None:
        if self.watch is not None:
            self.watch.close()
            self.watch = None


def _zombie(pid: int) -> bool:
    """A process that exited but was never reaped (LXC without a reaping init) is gone all the same."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False
