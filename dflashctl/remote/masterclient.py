"""The ssh transport through a connection master (master.py): each command is one UNIX-socket connection to the
master, which runs it on its own channel of the connection it already holds. This module never imports paramiko.

- The first command to a host starts the master (under a lock file, so two commands at once start one) and waits for
  its report: a connection error comes back as the very error type, message and hint an in-process SshTransport
  raises, so exit codes and one-line errors are the same with or without a master.
- A socket with no listener behind it (a master killed outright) is removed and replaced; a master whose connection
  died answers GONE before running anything, and the command goes to a new master, with one line on stderr.
- A connection that breaks while a command runs is `ssh connection lost`, as in-process: the command is not re-sent.
- Closing a stream hangs up on the master, which closes the channel, as SshTransport.stream's close does.
- Trust (masterwire.py): the folder must be a private directory of ours and the master must run as our uid, else the
  command stops with a one-line error (exit 2) instead of sending anything: never repaired, never followed.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import select
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflashctl import errors
from dflashctl.errors import ConfigError, ConnectFailed, DflashError
from dflashctl.model import Host
from dflashctl.remote import masterwire as wire
from dflashctl.remote.transport import Result, Transport, connection_lost

START_TIMEOUT_S = 120.0  # the master's own connect timeouts (10 s a stage, per hop) end it well before this
_KEY = re.compile(r"[0-9a-f]{20}")  # masterwire.connection_key's names: nothing else in the folder is a master's
_UNSAFE_HINT = ("make it a directory of your own with mode 0700 (or set DFLASHCTL_STATE_DIR to one), or persist = 0 "
                "for this host in hosts.toml")


def unsafe(e: wire.UnsafeStateDir | wire.ForeignPeer) -> ConfigError:
    """The one-line refusal for a masters' folder or socket that is not private to us."""
    what = "ssh master folder" if isinstance(e, wire.UnsafeStateDir) else "ssh master socket"
    return ConfigError(f"refusing the {what}: {e}", hint=_UNSAFE_HINT)


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
        except wire.UnsafeStateDir as e:
            raise unsafe(e) from None
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
                raise connection_lost(self.host) from None
            if frame is None or frame[0] != wire.GONE:
                return sock, frame
            sock.close()
            if attempt == 1:
                self._start(replacing=True)  # the GONE master has removed its socket: this starts a new one
        raise connection_lost(self.host)

    def run(self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None) -> Result:
        argv = tuple(argv)
        sock, frame = self._request(argv, stdin, timeout, stream=False)
        out, err = bytearray(), bytearray()
        try:
            while True:
                if frame is None:
                    raise connection_lost(self.host)
                kind, data = frame
                if kind == wire.OUT:
                    out += data
                elif kind == wire.ERR:
                    err += data
                elif kind == wire.EXIT:
                    return Result(argv, _exit_code(json.loads(data)), bytes(out), bytes(err))
                frame = wire.recv(sock)
        except (OSError, wire.WireError):
            raise connection_lost(self.host) from None
        finally:
            sock.close()

    def stream(self, argv: Sequence[str], *, stdin: bytes | None = None) -> Iterator[bytes]:
        sock, frame = self._request(argv, stdin, None, stream=True)
        buf = b""
        try:
            while True:
                if frame is None:
                    raise connection_lost(self.host)
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
            raise connection_lost(self.host) from None
        finally:
            sock.close()  # the master sees the hang-up and closes the channel: the remote command ends


def _dial(path: Path) -> socket.socket | None:
    """A connected socket to a master of ours, or None when no master listens there (no file, or a stale one).
    The folder is checked first and the listener's uid after: a socket someone else put there is refused."""
    try:
        wire.checked_dir(path.parent)
    except FileNotFoundError:
        return None
    except wire.UnsafeStateDir as e:
        raise unsafe(e) from None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
        wire.check_peer(sock)
    except wire.ForeignPeer as e:
        sock.close()
        raise unsafe(e) from None
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
    """The masters this user's folder holds, by the info files a master wrote (`<key>.json` with our `master`
    field and its own socket path): nothing else in the folder is looked at. A folder that is not private to us
    (a symlink, another owner, open permissions) is refused (ConfigError), never followed."""
    d = directory or wire.masters_dir()
    try:
        wire.checked_dir(d)
    except FileNotFoundError:
        return []
    except wire.UnsafeStateDir as e:
        raise unsafe(e) from None
    found = []
    for info_path in sorted(d.iterdir()):
        if info_path.suffix != ".json" or not _KEY.fullmatch(info_path.stem):
            continue
        place = wire.Place(d, info_path.stem)
        doc = _our_info(place)
        if doc is not None:
            pid = doc.get("pid")
            found.append(MasterInfo(place, pid if isinstance(pid, int) else None, str(doc.get("host", "?")),
                                    str(doc.get("endpoint", "?"))))
    return found


def _our_info(place: wire.Place) -> dict[str, Any] | None:
    """The info file of `place` when a master wrote it: a regular file of ours naming this very socket."""
    try:
        st = os.lstat(place.info)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
        return None
    doc = wire.read_info(place.info)
    if doc is None or "master" not in doc or doc.get("socket") != str(place.sock):
        return None
    return doc


def end_master(m: MasterInfo, timeout: float = 10.0) -> bool:
    """Ask the master to quit (it closes its connection and removes its socket); SIGTERM when it does not answer.
    True when a live master was ended, False when only stale files were left: those are removed, and only those
    (a socket of ours, the info file a master wrote)."""
    sock = _dial(m.place.sock) if wire.fits(m.place) else None  # a socket path too long was never a master's
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
        _remove_if(m.place.sock, stat.S_ISSOCK)
        if _our_info(m.place) is not None:
            m.place.info.unlink(missing_ok=True)
    return ended


def _remove_if(path: Path, kind: Any) -> None:
    """Unlink path when it is of `kind` (stat.S_ISSOCK …) and ours; anything else stays."""
    try:
        st = os.lstat(path)
    except OSError:
        return
    if kind(st.st_mode) and st.st_uid == os.getuid():
        path.unlink(missing_ok=True)


def _is_master(pid: int, place: wire.Place) -> bool:
    """pid is alive, ours, and is the master of this socket (not a reused pid)."""
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.getuid():
            return False
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"dflashctl.remote.master" in cmdline and os.fsencode(str(place.sock)) in cmdline
