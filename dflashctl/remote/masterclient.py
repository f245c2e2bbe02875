"""The ssh transport through a connection master (master.py): each command is one UNIX-socket connection to the
master, which runs it on its own channel of the connection it already holds. This module never imports paramiko.

- The first command to a host starts the master (under a lock file, so two commands at once start one) and waits for
  its report: a connection error comes back as the very error type, message and hint an in-process SshTransport
  raises, so exit codes and one-line errors are the same with or without a master.
- A socket with no listener behind it (a master killed outright) is removed and replaced; a master whose connection
  died answers GONE before running anything, and the command goes to a new master, with one line on stderr.
- A connection that breaks while a command runs is `ssh connection lost`, as in-process: the command is not re-sent.
- Closing a stream hangs up on the master, which closes the channel, as SshTransport.stream's close does.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflashctl import errors
from dflashctl.errors import ConnectFailed, DflashError
from dflashctl.model import Host
from dflashctl.remote import masterwire as wire
from dflashctl.remote.transport import Result, Transport

START_TIMEOUT_S = 120.0  # the master's own connect timeouts (10 s a stage, per hop) end it well before this


class MasterTransport(Transport):
    """Runs argv on an ssh host through the host's connection master (started on first use)."""

    name = "ssh"

    def __init__(self, host: Host, place: wire.Place | None = None):
        self.host = host
        self.place = place or wire.place_for(host)

    # -- reaching the master ---------------------------------------------------------------------------------------
    def _connect(self) -> socket.socket:
        for _ in range(3):
            sock = _dial(self.place.sock)
            if sock is not None:
                return sock
            self._start()
        raise ConnectFailed(f"host {self.host.name}: the ssh master at {self.place.sock} does not answer",
                            hint="run `dflashctl hosts disconnect` and try again")

    def _start(self, *, replacing: bool = False) -> None:
        try:
            wire.ensure_dir(self.place.dir)
        except OSError as e:
            raise ConnectFailed(f"host {self.host.name}: cannot use {self.place.dir} for the ssh master "
                                f"({e.strerror or e})", hint="set DFLASHCTL_STATE_DIR to a directory of your own, "
                                                             "or persist = 0 for this host in hosts.toml") from None
        with open(self.place.lock, "a") as lock:
            os.chmod(self.place.lock, 0o600)
            fcntl.flock(lock, fcntl.LOCK_EX)
            sock = _dial(self.place.sock)
            if sock is not None:  # another command started one while we waited for the lock
                sock.close()
                return
            if self.place.sock.exists() or self.place.sock.is_symlink():
                replacing = True
                self.place.sock.unlink(missing_ok=True)  # a socket file with no listener: its master is gone
            if replacing:
                sys.stderr.write(f"dflashctl: the ssh connection to {self.host.name} had ended; reconnecting\n")
            self._spawn()

    def _spawn(self) -> None:
        with open(self.place.log, "wb") as log:
            os.chmod(self.place.log, 0o600)
            proc = subprocess.Popen(
                [sys.executable, "-m", "dflashctl.remote.master", str(self.place.sock)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, start_new_session=True, close_fds=True,
                cwd="/", env={**os.environ, "PYTHONPATH": _package_root()},
            )
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(wire.host_to_json(self.host))
        proc.stdin.close()
        proc.wait()  # the first fork exits at once; the master itself holds the pipe until it reports
        ready, _, _ = select.select([proc.stdout], [], [], START_TIMEOUT_S)
        line = proc.stdout.readline() if ready else b""
        proc.stdout.close()
        try:
            doc = json.loads(line) if line else None
        except ValueError:
            doc = None
        if doc is None:
            tail = " | ".join(self.place.log.read_text(errors="replace").strip().splitlines()[-3:])
            raise ConnectFailed(f"host {self.host.name}: the ssh master did not start ({tail or 'no report'})",
                                hint=f"see {self.place.log}; persist = 0 in hosts.toml connects without a master")
        if not doc.get("ok"):
            raise _error(doc)

    def check_connection(self) -> None:
        """Connect now (starting the master, raising its connection error) instead of at the first command."""
        self._connect().close()

    # -- commands --------------------------------------------------------------------------------------------------
    def _request(self, argv: Sequence[str], stdin: bytes | None, timeout: float | None, *,
                 stream: bool) -> tuple[socket.socket, Any]:
        """A socket on which the command runs (its first reply frame already read), re-sent once to a new master when
        the old one answered GONE."""
        for attempt in (1, 2):
            sock = self._connect()
            try:
                wire.send_json(sock, wire.REQUEST, {"op": "run", "argv": list(argv), "timeout": timeout,
                                                    "stream": stream, "stdin": stdin is not None})
                view = memoryview(stdin or b"")
                for i in range(0, len(view), wire.CHUNK):
                    wire.send(sock, wire.STDIN, bytes(view[i:i + wire.CHUNK]))
                wire.send(sock, wire.STDIN_END)
                frame = wire.recv(sock)
            except (OSError, wire.WireError):
                sock.close()
                raise self._lost() from None
            if frame is None or frame[0] != wire.GONE:
                return sock, frame
            sock.close()
            if attempt == 1:
                self._start(replacing=True)  # the GONE master has removed its socket: this starts a new one
        raise self._lost()

    def _lost(self) -> ConnectFailed:
        return ConnectFailed(f"host {self.host.name}: ssh connection lost",
                             hint="the next command reconnects; check the network if it keeps happening")

    def run(self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None) -> Result:
        argv = tuple(argv)
        sock, frame = self._request(argv, stdin, timeout, stream=False)
        out, err = bytearray(), bytearray()
        try:
            while True:
                if frame is None:
                    raise self._lost()
                kind, data = frame
                if kind == wire.OUT:
                    out += data
                elif kind == wire.ERR:
                    err += data
                elif kind == wire.EXIT:
                    return Result(argv, _exit_code(json.loads(data)), bytes(out), bytes(err))
                frame = wire.recv(sock)
        except (OSError, wire.WireError):
            raise self._lost() from None
        finally:
            sock.close()

    def stream(self, argv: Sequence[str], *, stdin: bytes | None = None) -> Iterator[bytes]:
        sock, frame = self._request(argv, stdin, None, stream=True)
        buf = b""
        try:
            while True:
                if frame is None:
                    raise self._lost()
                kind, data = frame
                if kind == wire.OUT:
                    *lines, buf = (buf + data).split(b"\n")
                    for line in lines:
                        yield line + b"\n"
                elif kind == wire.EXIT:
                    if buf:
                        yield buf
                    _exit_code(json.loads(data))
                    return
                frame = wire.recv(sock)
        except (OSError, wire.WireError):
            raise self._lost() from None
        finally:
            sock.close()  # the master sees the hang-up and closes the channel: the remote command ends


def _dial(path: Path) -> socket.socket | None:
    """A connected socket, or None when no master listens there (no file, or a stale one)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except OSError as e:
        sock.close()
        if e.errno in (errno.ENOENT, errno.ECONNREFUSED, errno.ENOTSOCK, errno.ENOTDIR):
            return None
        raise ConnectFailed(f"cannot reach the ssh master at {path}: {e.strerror or e}") from None
    return sock


def _exit_code(doc: dict[str, Any]) -> int:
    if "error" in doc:
        raise _error(doc)
    return int(doc["code"])


def _error(doc: dict[str, Any]) -> DflashError:
    """The master's error as the same exception type, message and hint the in-process transport raises."""
    cls = getattr(errors, str(doc.get("error")), None)
    if not (isinstance(cls, type) and issubclass(cls, DflashError)):
        cls = ConnectFailed
    e = cls(str(doc.get("message") or "ssh master failed"), hint=doc.get("hint"))
    if doc.get("exit_code") is not None and int(doc["exit_code"]) != int(e.exit_code):
        e.exit_code = errors.ExitCode(int(doc["exit_code"]))
    return e


def _package_root() -> str:
    """Where dflashctl is importable from, for the master (this checkout or the installed package)."""
    root = str(Path(__file__).resolve().parents[2])
    extra = os.environ.get("PYTHONPATH")
    return f"{root}{os.pathsep}{extra}" if extra else root


# -- the masters of this user: `hosts disconnect` ------------------------------------------------------------------
@dataclass(frozen=True)
class MasterInfo:
    place: wire.Place
    pid: int | None
    host: str
    endpoint: str


def list_masters(directory: Path | None = None) -> list[MasterInfo]:
    d = directory or wire.masters_dir()
    found = []
    for info_path in sorted(d.glob("*.json")) if d.is_dir() else ():
        doc = wire.read_info(info_path) or {}
        found.append(MasterInfo(wire.Place(d, info_path.stem), doc.get("pid"), str(doc.get("host", "?")),
                                str(doc.get("endpoint", "?"))))
    return found


def end_master(m: MasterInfo, timeout: float = 10.0) -> bool:
    """Ask the master to quit (it closes its connection and removes its socket); SIGTERM when it does not answer.
    True when a live master was ended, False when only stale files were left (they are removed)."""
    sock = _dial(m.place.sock) if m.place.sock.exists() else None
    ended = False
    if sock is not None:
        try:
            sock.settimeout(timeout)
            wire.send_json(sock, wire.REQUEST, {"op": "quit"})
            ended = wire.recv(sock) is not None
        except (OSError, wire.WireError):
            pass
        finally:
            sock.close()
    if not ended and m.pid and _is_master(m.pid, m.place):
        os.kill(m.pid, 15)
        ended = True
    if m.pid and ended:
        deadline = time.monotonic() + timeout
        while _is_master(m.pid, m.place) and time.monotonic() < deadline:
            time.sleep(0.02)
    if not ended:
        m.place.sock.unlink(missing_ok=True)
        m.place.info.unlink(missing_ok=True)
    return ended


def _is_master(pid: int, place: wire.Place) -> bool:
    """pid is alive and is the master of this socket (not a reused pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"dflashctl.remote.master" in cmdline and os.fsencode(str(place.sock)) in cmdline
