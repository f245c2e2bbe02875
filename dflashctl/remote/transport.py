"""The one contract every way of reaching a machine implements (invoke/fabric's Runner shape).

A Transport runs an argv (a list, never a shell string) with optional stdin bytes and a timeout,
and returns a Result; `stream` yields stdout lines of a long-running argv. Quoting for a remote
shell happens in exactly one place (`shell_join`), in the transport that needs a shell.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from dflashctl.errors import ConnectFailed, RemoteFailed, RemoteTimeout
from dflashctl.model import Host


@dataclass(frozen=True)
class Result:
    argv: tuple[str, ...]
    exit_code: int
    stdout: bytes
    stderr: bytes

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def out(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    @property
    def err(self) -> str:
        return self.stderr.decode("utf-8", "replace")

    def tail(self, lines: int = 5) -> str:
        """Last lines of stderr (else stdout): what goes into a one-line error."""
        text = (self.err or self.out).strip().splitlines()
        return " | ".join(text[-lines:])

    def check(self, what: str) -> Result:
        if not self.ok:
            raise RemoteFailed(f"{what} failed (exit {self.exit_code}): {self.tail() or 'no output'}")
        return self


def connection_lost(host: Host) -> ConnectFailed:
    """The one error for an ssh connection that broke mid-command (the paramiko and the master transport alike)."""
    return ConnectFailed(f"host {host.name}: ssh connection lost",
                         hint="the next command reconnects; check the network if it keeps happening")


def shell_join(argv: Sequence[str]) -> str:
    """The single place an argv becomes a shell command line: each word quoted exactly once."""
    return " ".join(shlex.quote(a) for a in argv)


class Transport(ABC):
    """How bytes reach a machine. Subclasses: LocalTransport (subprocess), SshTransport (paramiko),
    MasterTransport (through a connection master)."""

    name: str = "transport"

    def check_connection(self) -> None:  # noqa: B027 - not abstract: a local transport has nothing to connect
        """Connect now (raising the mapped error) instead of at the first command."""
        return None

    @abstractmethod
    def run(
        self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None
    ) -> Result:
        """Run argv to completion. Raises RemoteTimeout when `timeout` (seconds) passes."""

    @abstractmethod
    def stream(self, argv: Sequence[str], *, stdin: bytes | None = None) -> Iterator[bytes]:
        """Yield stdout lines (with their b"\\n") of argv as they come; closing the iterator ends
        the command. Raises DflashError subclasses if the connection breaks."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections. Safe to call twice."""

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalTransport(Transport):
    """subprocess on this machine: the embedded `local` host, and the fast path for tests."""

    name = "local"

    def __init__(self, env: dict[str, str] | None = None):
        self._env = env

    def run(
        self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None
    ) -> Result:
        argv = tuple(argv)
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=self._env,
                start_new_session=True,
            )
        except OSError as e:
            return Result(argv, 127, b"", f"{argv[0]}: {e.strerror}\n".encode())
        try:
            out, err = proc.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.communicate()
            raise RemoteTimeout(
                f"command timed out after {timeout:g}s: {shell_join(argv)[:120]}",
                hint="raise --timeout, or check the host is not overloaded",
            ) from None
        return Result(argv, proc.returncode, out, err)

    def stream(self, argv: Sequence[str], *, stdin: bytes | None = None) -> Iterator[bytes]:
        proc = subprocess.Popen(
            tuple(argv),
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=self._env,
            start_new_session=True,
        )
        if stdin is not None:
            assert proc.stdin is not None
            feeder = threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True)
            feeder.start()
        try:
            assert proc.stdout is not None
            yield from iter(proc.stdout.readline, b"")
        finally:
            if proc.poll() is None:
                _kill_group(proc)
            proc.wait()


def _feed(pipe, data: bytes) -> None:
    try:
        pipe.write(data)
        pipe.close()
    except OSError:
        pass


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, 9)
    except OSError:
        proc.kill()
