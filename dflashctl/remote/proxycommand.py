"""`ProxyCommand` from ~/.ssh/config, run the way OpenSSH runs it.

paramiko's own `ProxyCommand` differs from ssh(1) in three ways that matter here: it splits the line itself
instead of handing it to a shell (so `nc %h %p 2>/dev/null` or `$HOME/bin/proxy` break), it keeps the
command's stderr in a pipe nobody reads (a chatty proxy fills it and stalls the connection), and when the
command exits it spins on the closed pipe until the banner timeout instead of reporting EOF. This one runs
`sh -c 'exec COMMAND'`, sends stderr to a file that the error message quotes, and reads EOF as EOF.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import tempfile

from dflashctl.remote.sshlib import paramiko  # without `invoke`, like every ssh module


class ProxyCommand(paramiko.ProxyCommand):
    def __init__(self, command: str) -> None:  # noqa: D107 - replaces the parent's, which would spawn
        self.cmd = ["/bin/sh", "-c", f"exec {command}"]
        self.command = command
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the connection
        self.process = subprocess.Popen(self.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self._stderr, bufsize=0, start_new_session=True)
        self.timeout: float | None = None
        self._said = ""

    def recv(self, size: int) -> bytes:
        """Up to `size` bytes as they come; b"" at EOF (paramiko turns that into EOFError at once)."""
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], self.timeout)
        if not ready:
            raise TimeoutError()
        try:
            return os.read(self.process.stdout.fileno(), size)
        except OSError as e:
            raise paramiko.ProxyCommandFailure(self.command, e.strerror) from None

    def failure(self) -> str | None:
        """Why the command is no longer a connection: its exit status and the last line it wrote to stderr
        (None while it still runs)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(0.5)  # the EOF that brought us here comes just before its exit
        code = self.process.poll()
        if code is None:
            return None
        lines = [ln.strip() for ln in self._stderr_tail().splitlines() if ln.strip()]
        said = f": {lines[-1]}" if lines else ""
        return f"ProxyCommand `{self.command}` exited with status {code}{said}"

    def _stderr_tail(self) -> str:
        """What it wrote to stderr (the end of it); kept after close(), which paramiko may call first."""
        if not self._stderr.closed:
            self._stderr.seek(0)
            self._said = self._stderr.read()[-4096:].decode(errors="replace")
        return self._said

    def close(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(2)
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()
        self._stderr_tail()
        self._stderr.close()

    def settimeout(self, timeout: float | None) -> None:
        self.timeout = timeout
