"""The harness's FOREGROUND prefix: a command it starts gets Ctrl-C as a KeyboardInterrupt even when the test process
has SIGINT ignored (a suite started in the background by a shell: tests/harness/foreground.py)."""

from __future__ import annotations

import signal
import subprocess
import sys

from harness.foreground import FOREGROUND

CHILD = ("import signal, sys\n"
         "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler, flush=True)\n"
         "try:\n    sys.stdin.read()\nexcept KeyboardInterrupt:\n    print('interrupted', flush=True)\n")


def start(prefix: list[str]) -> subprocess.Popen:
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a shell's asynchronous command has it
    try:
        return subprocess.Popen([*prefix, sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
    finally:
        signal.signal(signal.SIGINT, old)


def test_a_command_started_through_foreground_takes_ctrl_c_though_the_starter_ignored_it() -> None:
    p = start(FOREGROUND)
    assert p.stdout.readline() == "True\n"
    p.send_signal(signal.SIGINT)
    assert p.communicate(timeout=60)[0] == "interrupted\n"


def test_without_it_the_ignored_sigint_is_inherited_and_ctrl_c_is_lost() -> None:
    p = start([])
    assert p.stdout.readline() == "False\n"  # Python keeps an inherited SIG_IGN: no KeyboardInterrupt
    p.send_signal(signal.SIGINT)  # ignored: the child goes on until its stdin closes
    assert p.communicate("", timeout=60)[0] == ""
