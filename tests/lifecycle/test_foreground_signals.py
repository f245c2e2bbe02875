"""The harness's FOREGROUND prefix: a command it starts gets Ctrl-C as a KeyboardInterrupt even when the test process
has SIGINT ignored (a suite started in the background by a shell: tests/harness/foreground.py)."""

from __future__ import annotations

import signal
import subprocess
import sys

from harness.foreground import FOREGROUND

CHILD = ("import signal, sys\n"
         "h = signal.getsignal(signal.SIGINT)\n"
         "try:\n"  # the first line is printed inside the try: a SIGINT sent after it is read is caught below
         "    print('default' if h is signal.default_int_handler else 'ignored' if h == signal.SIG_IGN else h,\n"
         "          flush=True)\n"
         "    sys.stdin.read()\n"
         "except KeyboardInterrupt:\n"
         "    print('interrupted', flush=True)\n")


def start(prefix: list[str]) -> subprocess.Popen:
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a shell's asynchronous command has it
    try:
        return subprocess.Popen([*prefix, sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
    finally:
        signal.signal(signal.SIGINT, old)


def test_a_command_started_through_foreground_takes_ctrl_c_though_the_starter_ignored_it() -> None:
    p = start(FOREGROUND)
    assert p.stdout.readline() == "default\n"
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=60) == 0  # stdin stays open: only the signal can have ended the read
    assert p.stdout.read() == "interrupted\n"
    p.stdin.close()


def test_without_it_the_child_inherits_the_ignored_sigint() -> None:
    p = start([])
    assert p.stdout.readline() == "ignored\n"  # Python keeps an inherited SIG_IGN: Ctrl-C would be lost
    p.communicate("", timeout=60)
