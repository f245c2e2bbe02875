"""The special lines of a big mapped log, found by GNU grep on the other CPU while Python handles each one.

Why: `grep -F` searches all the anchors in one pass (~500 MB/s on a shared 2-core machine), twice what the pivot
search (anchorfind.py) does in Python's C loops, and it runs in its own process: the scanner reads its answers
through a pipe while it decodes the lines they point at, so finding and handling overlap. grep is on every
container; where it is missing, fails to start, or fails mid-way (exit status 2), the rest of the buffer goes to
the pivot search, which finds the same lines. `grep -a -b -n -o -F` prints each anchor's line number and byte
offset: a position inside a special line (the answer AnchorFinder.at gives), and its line's number.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import subprocess
import threading
from typing import IO

from dflashctl.analysis.anchorfind import AnchorFinder

GREP_MIN = 16 << 20  # below this a scan is quick anyway: not worth a process (the live watch's feeds never are)
GREP = "grep"  # the program (tests point it elsewhere to take the fallback)


class GrepFinder:
    """Where the next anchor of buf[:end] is, at or after pos, read from a running grep over the same file.
    The file may have grown since it was mapped: answers at or past end are not this buffer's."""

    DRAIN = True  # False: read grep's pipe line by line as answers are needed (the way before; benchmarks compare)

    def __init__(self, proc: subprocess.Popen[bytes], buf: bytes, end: int, anchors: tuple[bytes, ...]) -> None:
        self.proc, self.buf, self.end, self.anchors = proc, buf, end, anchors
        self.out: IO[bytes] | None = proc.stdout
        self.drain = _Drain(proc.stdout) if proc.stdout is not None and self.DRAIN else None
        self.next = -1  # grep's last answer (-1: none read yet)
        self.fallback: AnchorFinder | None = None
        self.line = 0  # the 1-based line number of the line holding self.next (grep -n)

    def lines_before(self, at: int) -> int | None:
        """How many lines of the file come before the one holding the answer `at` (so the scanner need not count
        the newlines of the ordinary stretches: it never touches those pages); None after a fallback."""
        return self.line - 1 if self.fallback is None and at == self.next else None

    def at(self, pos: int) -> int:
        if self.fallback is not None:
            return self.fallback.at(pos)
        while self.next < pos:
            line = b"" if self.out is None else self.drain.readline() if self.drain is not None else self.out.readline()
            if not line:
                return self._finished(pos)
            answer = _parse(line)
            if answer is None or (answer[1] < self.end and self.buf[answer[1]:answer[1] + len(answer[2])] != answer[2]):
                return self._distrust(pos)  # not GNU grep's `N:OFFSET:MATCH`, or not what the map holds
            self.line, self.next = answer[0], answer[1]
        if self.next >= self.end:
            self.close()
            return -1
        return self.next

    def _finished(self, pos: int) -> int:
        """grep's output ended: all found (0: some, 1: none), or it failed: the pivot search takes the rest."""
        rc = self.close(stop=False)
        if rc in (0, 1):
            self.next = self.end
            return -1
        self.fallback = AnchorFinder.build(self.buf, self.end, self.anchors)
        return self.fallback.at(pos)

    def _distrust(self, pos: int) -> int:
        """An answer that does not read as GNU grep's or does not match the buffer: grep is stopped and the pivot
        search takes the rest from pos (answers before pos were checked one by one)."""
        self.close()
        self.fallback = AnchorFinder.build(self.buf, self.end, self.anchors)
        return self.fallback.at(pos)

    def close(self, stop: bool = True) -> int | None:
        """Reap grep and return its exit status; stop: kill it first if it still runs (the scan is over, or the
        buffer ended before the file did: its further answers are not needed)."""
        if self.out is None:
            return self.proc.returncode
        if stop and self.proc.poll() is None:
            self.proc.kill()
        rc = self.proc.wait()
        if self.drain is not None:  # grep is gone: its pipe ends, and so does the thread reading it
            self.drain.finish()
        self.out.close()
        self.out = None
        return rc


class _Drain(threading.Thread):
    """Reads grep's answers as fast as grep writes them, in big pieces, into a queue: grep never stops on a full pipe
    while the scanner handles a line, and the scanner waits only when it has handled every answer so far. Without it
    the two took turns (grep blocked on the pipe, Python on grep): on a busy machine each turn costs a wake-up, and
    the first full scan of a log with ~1 % special lines took 2-5x grep's time, not the larger of the two CPU times
    (issue 28; benchmarks/results/logscan.txt)."""

    PIECE = 1 << 20
    AHEAD = 64  # pieces read ahead at most (64 MB of answers: a log whose every line is special stays bounded)

    def __init__(self, out: IO[bytes]) -> None:
        super().__init__(name="grepfind-drain", daemon=True)
        self.fd = out.fileno()
        self.pieces: queue.Queue[bytes] = queue.Queue(self.AHEAD)
        self.lines: list[bytes] = []  # complete lines not handed out yet, in reverse (pop() is the next)
        self.rest = b""  # a line cut at the end of a piece
        self.done = False
        self.start()

    def run(self) -> None:
        try:
            while piece := os.read(self.fd, self.PIECE):
                self.pieces.put(piece)
        except OSError:
            pass
        self.pieces.put(b"")

    def finish(self) -> None:
        """Wait for the thread once grep is gone, taking what it still reads so that it never waits on a full queue."""
        while self.is_alive():
            with contextlib.suppress(queue.Empty):
                self.pieces.get(timeout=0.05)
        self.join()

    def readline(self) -> bytes:
        """The next line with its newline; b"" once grep's output has ended (a last line without one, as is)."""
        while not self.lines:
            if self.done:
                return b""
            piece = self.pieces.get()
            if not piece:
                self.done = True
                rest, self.rest = self.rest, b""
                return rest
            parts = (self.rest + piece).split(b"\n")
            self.rest = parts.pop()
            self.lines = [p + b"\n" for p in reversed(parts)]
        return self.lines.pop()


def start(fd: int, buf: bytes, end: int, anchors: tuple[bytes, ...]) -> GrepFinder | None:
    """A GrepFinder over the file open as fd (mapped as buf), or None where grep cannot be started. The file is
    opened again through /proc (its own offset: the caller's file position is left alone)."""
    exe = shutil.which(GREP)
    if exe is None:
        return None
    args: list[str | bytes] = [exe, "-a", "-b", "-n", "-o", "-F"]
    for a in anchors:
        args += [b"-e", a]
    try:
        src = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)
    except OSError:
        return None
    try:
        proc = subprocess.Popen(args, stdin=src, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                env={**os.environ, "LC_ALL": "C"})
    except OSError:
        return None
    finally:
        os.close(src)
    return GrepFinder(proc, buf, end, anchors)


def _parse(line: bytes) -> tuple[int, int, bytes] | None:
    """`N:OFFSET:MATCH` (grep -n -b -o) as (line number, byte offset, match); None for anything else."""
    parts = line.rstrip(b"\n").split(b":", 2)
    if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit() or not parts[2]:
        return None
    return int(parts[0]), int(parts[1]), parts[2]
