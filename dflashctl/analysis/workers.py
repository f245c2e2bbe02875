"""What launchers say about the worker processes they ran: which rank failed, how, and which failed first.

A multi-process run's workers are ranks. Besides their own tracebacks (logscan), the launcher reports each death:

- torchrun / torch.distributed.elastic: `failed (exitcode: -9) local_rank: 0 (pid: 1322) of binary: …`, and the
  ChildFailedError summary — `Failures:` and `Root Cause (first observed failure):` blocks of `rank : 3
  (local_rank: 3)`, `exitcode : -9 (pid: …)`, `traceback : Signal 9 (SIGKILL) received by PID …`;
- DeepSpeed's launcher: `['python', '-u', 'train.py', '--local_rank=1', …] exits with return code = -11`, and
  `subprocess.CalledProcessError: Command '[…--local_rank=0…]' returned non-zero exit status -9`;
- mpirun: `The first process to do so was: … Process name: [[50371,1],0]` (the root cause, rank 0);
- torch.multiprocessing.spawn: `-- Process 1 terminated with the following error:` and ProcessExitedException's
  `process 1 terminated with signal SIGKILL`; SLURM's `srun: error: node7: task 3: Exited with exit code 1`;
- the NCCL watchdog, about its own rank: `[Rank 3] Watchdog caught collective operation timeout …`.

A worker ended by signal 9 was most often killed by the kernel's OOM killer (host-oom); by signal 11, a native
crash (segfault). A rank the launcher only sent SIGTERM after another failed (`exitcode: -15`, `Sending process …
closing signal SIGTERM`) did not fail itself. Pure: lines in, records out.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

from dflashctl.analysis.lineprefix import rank_tag

_AGENT_FAILED_RE = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+)")
# tolerant of a summary whose layout was lost in a paste: `rank2 (local rank: 2)exitcode: -9 (pid: 36071)`
_SUMMARY_RANK_RE = re.compile(r"^\s*rank\s*:?\s*(\d+)\s*\(local[_ ]rank:\s*(\d+)\)")
_SUMMARY_EXIT_RE = re.compile(r"(?:^|(?<=\)))\s*exitcode\s*:\s*(-?\d+)")
_SUMMARY_SIGNAL_RE = re.compile(r"(?i:signal) (\d+) \((SIG\w+)\) received by PID")
_ROOT_CAUSE = "Root Cause (first observed failure)"
_DS_EXIT_RE = re.compile(r"(?:exits with return code = |returned non-zero exit status )(-?\d+)")
_LOCAL_RANK_RE = re.compile(r"--local[_-]rank[= ](\d+)")
_SPAWN_ERROR_RE = re.compile(r"^-- Process (\d+) terminated with the following error:")  # torch.multiprocessing
_SPAWN_EXIT_RE = re.compile(r"process (\d+) terminated with (?:signal (SIG\w+)|exit code (-?\d+))")
_SRUN_RE = re.compile(r"srun: error: \S+: tasks? (\d+)(?:-\d+)?: (?:Exited with exit code (\d+)|(Killed)|(Segmentation "
                      r"fault))")
_MPI_FIRST = "The first process to do so was"  # mpirun: `Process name: [[50371,1],0]` follows
_MPI_NAME_RE = re.compile(r"Process name: \[\[\d+,\d+\],(\d+)\]")
_WATCHDOG_RE = re.compile(r"Watchdog caught collective\b|Exception \(either an error or timeout\) "
                          r"detected by watchdog")
SIGKILL_CODES = (-9, 137)
SIGSEGV_CODES = (-11, 139)
SIGTERM_CODES = (-15, 143)

# literal pieces of every line this module reads (the scanner's fast path must stop at them)
# (few start lower-case: the scanner finds those with bytes.find, one pass each; the others come with a
# companion anchor — ProcessExitedException's "Exception", CalledProcessError's "Error", "detected by watchdog"
# lines' "Exception")
ANCHORS = ("exitcode", "local_rank", "Root Cause", "return code", "Watchdog", "(SIG", "-- Process ", "Exited",
           "Killed", "Process name", "The first process", "Exception", "Error")


@dataclass(frozen=True)
class WorkerFailure:
    """One worker (rank) that failed, as a launcher or the worker itself reported it."""

    name: str  # rank3
    line: int
    exit_code: int | None = None
    signal: str | None = None  # SIGKILL, SIGSEGV …
    text: str = ""

    @property
    def how(self) -> str:
        if self.exit_code is None:
            return self.text[:200]
        sig = self.signal or _signal_name(self.exit_code)
        return f"exit code {self.exit_code}" + (f" ({sig})" if sig else "")


def _signal_name(code: int) -> str | None:
    n = -code if code < 0 else code - 128 if code > 128 else None
    if n is None:
        return None
    try:
        return signal.Signals(n).name
    except ValueError:
        return None


def signal_kind(code: int | None, sig: str | None = None) -> str | None:
    """'kill' (SIGKILL: likely the OOM killer), 'segv', or None."""
    if sig == "SIGKILL" or code in SIGKILL_CODES:
        return "kill"
    if sig == "SIGSEGV" or code in SIGSEGV_CODES:
        return "segv"
    return None


class WorkerTracker:
    """Fed every line the scanner reads closely (special lines, lines inside tracebacks), in order."""

    def __init__(self) -> None:
        self.failures: dict[str, WorkerFailure] = {}  # first report of each worker
        self.root_cause: str | None = None
        self.deaths: list[tuple[int, int | None, str | None, str]] = []  # (line, code, signal, text): any process
        self._summary_rank: int | None = None
        self._summary_root = False
        self._pending_root = False
        self._mpi_first = False

    def feed(self, n: int, text: str, rank: int | None) -> None:
        if not any(a in text for a in ANCHORS):  # most lines: none of the patterns below can match
            return
        if _ROOT_CAUSE in text:
            self._pending_root = True
            return
        if _MPI_FIRST in text:
            self._mpi_first = True
            return
        m = _MPI_NAME_RE.search(text)
        if m and self._mpi_first:
            self._mpi_first = False
            self._fail(f"rank{m.group(1)}", n, None, None, text, root=True)
            return
        m = _SUMMARY_RANK_RE.match(text)
        if m:
            self._summary_rank = int(m.group(1))
            self._summary_root, self._pending_root = self._pending_root, False
            if not _SUMMARY_EXIT_RE.search(text, m.end()):
                return
        m = _SUMMARY_EXIT_RE.search(text)
        if m and self._summary_rank is not None:
            code = int(m.group(1))
            self._fail(f"rank{self._summary_rank}", n, code, None, text, root=self._summary_root)
            return
        m = _SUMMARY_SIGNAL_RE.search(text)
        if m:
            self.deaths.append((n, None, m.group(2), text))
            if self._summary_rank is not None:
                name = f"rank{self._summary_rank}"
                old = self.failures.get(name)
                if old is not None and old.signal is None:
                    self.failures[name] = WorkerFailure(name, old.line, old.exit_code, m.group(2), old.text)
            return
        m = _AGENT_FAILED_RE.search(text)
        if m:
            self._fail(f"rank{m.group(2)}", n, int(m.group(1)), None, text)
            return
        m = _DS_EXIT_RE.search(text)
        if m:
            code = int(m.group(1))
            lr = _LOCAL_RANK_RE.search(text)
            if lr:
                self._fail(f"rank{lr.group(1)}", n, code, None, text)
            else:
                self.deaths.append((n, code, None, text))
            return
        m = _SPAWN_ERROR_RE.match(text)
        if m:
            self._fail(f"rank{m.group(1)}", n, None, None, text)
            return
        m = _SPAWN_EXIT_RE.search(text)
        if m:
            code = int(m.group(3)) if m.group(3) is not None else None
            self._fail(f"rank{m.group(1)}", n, code, m.group(2), text)
            if code is None:
                self.deaths.append((n, None, m.group(2), text))
            return
        m = _SRUN_RE.search(text)
        if m:
            sig = "SIGKILL" if m.group(3) else "SIGSEGV" if m.group(4) else None
            self._fail(f"rank{m.group(1)}", n, int(m.group(2)) if m.group(2) else None, sig, text)
            if sig:
                self.deaths.append((n, None, sig, text))
            return
        if _WATCHDOG_RE.search(text):
            who = rank_tag(text)
            who = rank if who is None else who
            if who is not None:
                self._fail(f"rank{who}", n, None, None, text.strip())

    def failed_by_message(self, name: str, n: int, text: str) -> None:
        """A worker printed a known failure about itself (`[rank0]: … CUDA error: an illegal memory access …`)."""
        self._fail(name, n, None, None, text)

    def _fail(self, name: str, n: int, code: int | None, sig: str | None, text: str, *, root: bool = False) -> None:
        if code is not None:
            self.deaths.append((n, code, sig, text))
        if code in SIGTERM_CODES or code == 0:  # ended by the launcher after another rank failed; or not failed
            return
        if root:
            self.root_cause = name
        if name not in self.failures:
            self.failures[name] = WorkerFailure(name, n, code, sig, text.strip()[:500])
