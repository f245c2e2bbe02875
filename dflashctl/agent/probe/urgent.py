"""Which new log lines are worth a report now rather than at the next redraw: the probe's cheap first look.

The laptop's LogScanner (analysis/) makes the judgement; this only decides *when* to send the bytes. It must see
every line the judgement would call a crash (a traceback's final exception line, a bare exception line, a known
signature's words, a launcher saying a worker died, the trainer's last line) and must stay quiet on ordinary
progress lines, which the redraw interval paces. A false wake costs one extra report; a missed one costs up to one
interval of latency, never a missed crash (the next regular report carries the bytes anyway).
"""

from __future__ import annotations

import re

TB_START = b"Traceback (most recent call last):"
CARRY_MAX = 64 << 10  # an unterminated line longer than this is looked at as it is (a torn write, not a line)
TB_LINES_MAX = 4000  # a traceback with no final line after this many lines is given up on

# A launcher's per-rank prefix (`[rank3]: `, `[default0]:`) before the Python text.
_PREFIX = rb"(?:\[[^\]\n]{1,60}\]:?[ \t]?)?"
# Inside a traceback: the first unindented line that is a dotted name, alone or before `: message`, ends it.
_EXC_LINE = re.compile(rb"^" + _PREFIX + rb"(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?::(?: .*)?)?\s*$")
_CHAIN = (b"The above exception was the direct cause", b"During handling of the above exception")
# Anywhere: an exception line with no traceback above it (the shapes analysis/tracebacks.py BARE_EXC_RE takes).
_BARE_EXC = re.compile(
    rb"(?:^|[\]:] ?)(?:[A-Za-z_]\w*\.)*(?:[A-Z]\w*(?:Error|Exception|Interrupt|Failed|Fault)|OutOfResources"
    rb"|Unsupported|KeyboardInterrupt)(?:: |:?\s*$)")
# Words that mean trouble on their own: signatures without a Python exception line, launchers reporting a dead
# worker, the trainer's own last line (the run is ending).
WORDS = (b"terminate called after throwing", b"Fatal Python error", b"Segmentation fault", b"SIGSEGV", b"SIGKILL",
         b"Watchdog caught", b"detected by watchdog", b"NCCL error", b"CUDA error", b"out of memory",
         b"No space left", b"NVRM: Xid", b"GPU has fallen off", b"ChildFailedError", b"exitcode", b"Root Cause",
         b"Killed", b"Tried to allocate", b"bus error", b"ld returned",
         b"Loss is NaN", b"training finished", b"training aborted", b"training stopped")
_NAN_LOSS = re.compile(rb"(?i)\b(?:loss|grad_norm)['\"]?\s*[=:]\s*['\"]?-?(?:nan|inf)\b")
# Bytes without any of these hold nothing this module looks for (outside a traceback): one substring test each.
_PREFILTER = (b"Traceback", b"Error", b"Exception", b"Interrupt", b"Failed", b"Fault", b"OutOfResources",
              b"Unsupported", b"nan", b"NaN", b"inf", *WORDS)


class UrgentLines:
    """Fed the log's new bytes in order; says whether a complete line among them matters now."""

    def __init__(self) -> None:
        self.carry = b""  # the unterminated last line, kept until its newline arrives
        self.tb_lines = 0  # >0: inside a traceback, this many lines into it

    def reset(self) -> None:
        """The log was rotated or another run's log followed: no line carries over."""
        self.carry, self.tb_lines = b"", 0

    def feed(self, data: bytes) -> bool:
        """True when the complete lines in carry+data hold a crash, a signature or the run's end."""
        data = self.carry + data
        cut = data.rfind(b"\n") + 1
        if cut == 0 and len(data) <= CARRY_MAX:
            self.carry = data
            return False
        if cut == 0:
            cut = len(data)
        self.carry = data[cut:]
        chunk = data[:cut]
        if not self.tb_lines and not any(w in chunk for w in _PREFILTER):
            return False  # most writes: progress lines only
        urgent = False
        for line in chunk.splitlines():
            urgent |= self._line(line.rstrip(b"\r"))
        return urgent

    def _line(self, line: bytes) -> bool:
        if TB_START in line:
            self.tb_lines = 1
            return False
        if self.tb_lines:
            self.tb_lines += 1
            body = re.sub(rb"^" + _PREFIX, b"", line)
            if not body.strip() or body[:1] in (b" ", b"\t") or any(c in body for c in _CHAIN):
                return self.tb_lines > TB_LINES_MAX and self._give_up()
            if _EXC_LINE.match(line):  # the final `Type: message` line
                self.tb_lines = 0
                return True
        return any(w in line for w in WORDS) or bool(_BARE_EXC.search(line)) or bool(_NAN_LOSS.search(line))

    def _give_up(self) -> bool:
        self.tb_lines = 0
        return False
