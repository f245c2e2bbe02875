"""What the ssh connection master and its clients share: where a master's socket lives, and the frames they speak.

Kept free of paramiko (and of everything else heavy) because every command that reaches a host through a master
imports it: that is the point of the master, no paramiko import and no handshake per command.

Where: one directory per user (`$DFLASHCTL_STATE_DIR/masters`, else `$XDG_RUNTIME_DIR/dflashctl/masters`, else
`~/.cache/dflashctl/masters`), which must be a real directory (no symlink), ours, 0700, in a parent that is ours or
root's and not writable by others (unless sticky): anything else is refused (UnsafeStateDir), never repaired or
followed, since whoever controls the folder receives a launch's `--env` secrets. In it `<key>.sock` (0600),
`<key>.json` (who holds it: pid, host, endpoint, socket; the `master` field marks it as one of ours), `<key>.lock`
(taken while a master is started, so two commands at once start one) and `<key>.log`. A client also checks that
whoever listens on the socket runs as our uid (SO_PEERCRED), and the master checks each client the same way.
The key hashes everything that decides which connection a host gets (user, address, port, jump chain, key,
known_hosts, ssh config, agent) and the fingerprint of the code a master runs (fingerprint.py), so a changed
hosts.toml (`persist` included), ~/.ssh/config or an upgraded dflashctl gets a new master instead of the old one.

Frames: one type byte, a 4-byte big-endian length, the payload. Client to master: REQUEST (JSON: op, argv, timeout,
stream), then STDIN chunks and STDIN_END; after that the client only ever closes (a hang-up ends the command).
Master to client: OUT / ERR chunks, then one EXIT (JSON: code, or error + message + hint + exit_code), or GONE
(the master's connection died before the command started: nothing ran, start a new master and send it again).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflashctl.model import Host
from dflashctl.remote.fingerprint import code_fingerprint

PROTOCOL = 2  # part of the key: a client never talks to a master of another protocol
REQUEST, STDIN, STDIN_END, OUT, ERR, EXIT, GONE = b"R", b"I", b"i", b"O", b"E", b"X", b"G"
CHUNK = 256 * 1024
_HEAD = struct.Struct(">cI")
MAX_SUN_PATH = 107  # sockaddr_un.sun_path holds 108 bytes with the NUL


class WireError(Exception):
    """The peer hung up mid-frame or sent something that is not a frame."""


class UnsafeStateDir(Exception):
    """The masters' folder (or what it points at) is not private to us: refuse it rather than fix or follow it."""


class ForeignPeer(Exception):
    """The process at the other end of a master's socket runs as another user."""


def ensure_dir(path: Path) -> None:
    """Make the masters' folder and any missing parent (0700 each) if it is missing, then check it (checked_dir)."""
    for folder in [*reversed(path.parents), path]:
        with contextlib.suppress(FileExistsError):  # a symlink or a file of that name: checked_dir says which
            folder.mkdir(mode=0o700)
    checked_dir(path)


def checked_dir(path: Path) -> None:
    """A real directory (lstat: not a symlink to one), owned by us, 0700, whose parent is ours or root's and not
    writable by others (world-writable only when sticky, as /tmp; group-writable only for our own group, as a
    user-private group under umask 002 makes it): else they could swap our folder. Raises UnsafeStateDir saying
    which."""
    uid = os.getuid()
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeStateDir(f"{path} is a symlink, not a directory")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeStateDir(f"{path} is not a directory")
    if st.st_uid != uid:
        raise UnsafeStateDir(f"{path} is owned by uid {st.st_uid}, not by you (uid {uid})")
    if st.st_mode & 0o077:
        raise UnsafeStateDir(f"{path} has mode {stat.S_IMODE(st.st_mode):04o}; it must be 0700")
    parent = os.stat(path.parent)
    if parent.st_uid not in (uid, 0):
        raise UnsafeStateDir(f"{path.parent} is owned by uid {parent.st_uid}, not by you or root")
    shared = parent.st_mode & 0o002 or (parent.st_mode & 0o020 and parent.st_gid != os.getgid())
    if shared and not parent.st_mode & stat.S_ISVTX:
        raise UnsafeStateDir(f"{path.parent} is writable by others")


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a connected UNIX socket (SO_PEERCRED: pid, uid, gid)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def check_peer(sock: socket.socket) -> None:
    uid = peer_uid(sock)
    if uid != os.getuid():
        raise ForeignPeer(f"the process behind the socket runs as uid {uid}, not as you (uid {os.getuid()})")


@dataclass(frozen=True)
class Place:
    """The files of one master (see the module docstring)."""

    dir: Path
    key: str

    @property
    def sock(self) -> Path:
        return self.dir / f"{self.key}.sock"

    @property
    def info(self) -> Path:
        return self.dir / f"{self.key}.json"

    @property
    def lock(self) -> Path:
        return self.dir / f"{self.key}.lock"

    @property
    def log(self) -> Path:
        return self.dir / f"{self.key}.log"


def masters_dir() -> Path:
    """Absolute, so the master (started in /) and every command name the same files whatever their cwd."""
    state = os.environ.get("DFLASHCTL_STATE_DIR")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if state:
        where = Path(state).expanduser() / "masters"
    elif runtime:
        where = Path(runtime) / "dflashctl" / "masters"
    else:
        where = Path("~/.cache/dflashctl/masters").expanduser()
    return Path(os.path.abspath(where))


def connection_key(host: Host) -> str:
    """A hash of everything that decides which ssh connection `host` gets (not its container or workspace)."""
    cfg_env = os.environ.get("DFLASHCTL_SSH_CONFIG")
    cfg = Path(cfg_env) if cfg_env else Path("~/.ssh/config").expanduser()
    try:
        st = cfg.stat()
        cfg_state: tuple[Any, ...] = (str(cfg), st.st_mtime_ns, st.st_size)
    except OSError:
        cfg_state = (str(cfg),)
    parts = (PROTOCOL, code_fingerprint(), os.getuid(), host.address, host.user, host.port, host.identity_file,
             host.proxy_jump, host.accept_new_host_key, host.persist_s, os.environ.get("DFLASHCTL_KNOWN_HOSTS"),
             cfg_state, os.environ.get("SSH_AUTH_SOCK"), os.environ.get("HOME"))
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:20]


def place_for(host: Host) -> Place:
    return Place(masters_dir(), connection_key(host))


def fits(place: Place) -> bool:
    """Whether the socket path fits a sockaddr_un (a very deep state dir does not: then no master)."""
    return len(os.fsencode(str(place.sock))) <= MAX_SUN_PATH


# -- host records: how the master learns which host to connect to ------------------------------------------------
_HOST_FIELDS = ("name", "transport", "address", "user", "port", "identity_file", "proxy_jump", "accept_new_host_key",
                "persist_s")


def host_to_json(host: Host) -> bytes:
    return json.dumps({f: getattr(host, f) for f in _HOST_FIELDS}).encode()


def host_from_json(data: bytes) -> Host:
    return Host(**json.loads(data))


# -- frames -------------------------------------------------------------------------------------------------------
def send(sock: socket.socket, kind: bytes, payload: bytes = b"") -> None:
    head = _HEAD.pack(kind, len(payload))
    if len(payload) < 65536:
        sock.sendall(head + payload)  # one write: small request/reply frames go out in one segment
    else:
        sock.sendall(head)
        sock.sendall(payload)


def send_json(sock: socket.socket, kind: bytes, doc: dict[str, Any]) -> None:
    send(sock, kind, json.dumps(doc).encode())


def recv(sock: socket.socket) -> tuple[bytes, bytes] | None:
    """The next frame, or None when the peer closed cleanly between frames."""
    head = _read(sock, _HEAD.size, eof_ok=True)
    if head is None:
        return None
    kind, size = _HEAD.unpack(head)
    return kind, (_read(sock, size, eof_ok=False) or b"") if size else b""


def _read(sock: socket.socket, n: int, *, eof_ok: bool) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            if eof_ok and not buf:
                return None
            raise WireError("peer hung up mid-frame")
        buf += chunk
    return bytes(buf)


def read_info(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None
