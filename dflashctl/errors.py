"""Exit codes and the one exception type the CLI turns into a one-line error.

The codes are a contract (DESIGN §5, SkyPilot's convention): scripts and CI branch on them. Where a command fails
decides the code, never the exception's default: a usage or config error is 2; a host that cannot be reached 102; a
remote command past its timeout 101; a remote command that ran and failed (a write refused, a reply we cannot read,
another version's reply) 106. Raise the subclass that says which (tests/test_errors.py checks every raise names one).
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    USAGE = 2  # usage or config error (also: auth failure, host key mismatch)
    CRASHED = 100  # run crashed / lost, or launch could not confirm the run started
    NOT_FINISHED = 101  # launch --wait timed out, remote command timed out
    NOT_FOUND = 102  # run or host not found, host unreachable, container not running
    STOPPED = 103  # stopped by user
    STALLED = 104  # stalled run / idle-allocated GPUs
    DEGRADED = 105  # a worker thread crashed, process alive
    REMOTE_FAILED = 106  # a command on the host or in the container ran and failed, or replied unreadably


class DflashError(Exception):
    """An expected failure: printed as one line (plus an optional hint), never a traceback."""

    exit_code: ExitCode = ExitCode.USAGE

    def __init__(self, message: str, *, hint: str | None = None, exit_code: ExitCode | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        if exit_code is not None:
            self.exit_code = exit_code


class ConfigError(DflashError):
    exit_code = ExitCode.USAGE


def toml_type(v: object) -> str:
    """What a hosts.toml value is, as a ConfigError names it (`must be a string, not an integer`)."""
    return {bool: "a boolean", int: "an integer", float: "a float", str: "a string", list: "an array",
            dict: "a table"}.get(type(v), type(v).__name__)


class NotFound(DflashError):
    exit_code = ExitCode.NOT_FOUND


class ConnectFailed(DflashError):
    """Host unreachable: refused, timed out, name not resolved."""

    exit_code = ExitCode.NOT_FOUND


class AuthFailed(DflashError):
    exit_code = ExitCode.USAGE


class HostKeyError(DflashError):
    exit_code = ExitCode.USAGE


class ContainerNotRunning(DflashError):
    exit_code = ExitCode.NOT_FOUND


class RemoteTimeout(DflashError):
    exit_code = ExitCode.NOT_FINISHED


class RemoteFailed(DflashError):
    """The host answered, but what we asked of it failed: a write refused, a program that gave no reply, a reply of
    another version. Not the user's input (2), not an unreachable host (102)."""

    exit_code = ExitCode.REMOTE_FAILED
