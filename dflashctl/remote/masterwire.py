"""What the ssh connection master and its clients share: where a master's socket lives, and the frames they speak.

Kept free of paramiko (and of everything else heavy) because every command that reaches a host through a master
imports it: that is the point of the master, no paramiko import and no handshake per command.

Where: one directory per user, 0700 (`$DFLASHCTL_STATE_DIR/masters`, else `$XDG_RUNTIME_DIR/dflashctl/masters`,
else `~/.cache/dflashctl/masters`); in it `<key>.sock` (0600), `<key>.json` (who holds it: pid, host, endpoint) and
`<key>.lock` (taken while a master is started, so two commands at once start one). The key hashes everything that
decides which connection a host gets (user, address, port, jump chain, key, known_hosts, ssh config, agent), so a
changed hosts.toml (`persist` included) or ~/.ssh/config gets a new master instead of the old connection.

Frames: one type byte, a 4-byte big-endian length, the payload. Client to master: REQUEST (JSON: op, argv, timeout,
stream), then STDIN chunks and STDIN_END; after that the client only ever closes (a hang-up ends the command).
Master to client: OUT / ERR chunks, then one EXIT (JSON: code, or error + message + hint + exit_code), or GONE
(the master's connection died before the command started: nothing ran, start a new master and send it again).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflashctl.cmdclient import ensure_dir as ensure_dir  # the masters' folder: 0700, ours (one check for both)
from dflashctl.model import Host

PROTOCOL = 1  # part of the key: a client never talks to a master of another protocol
REQUEST, STDIN, STDIN_END, OUT, ERR, EXIT, GONE = b"R", b"I", b"i", b"O", b"E", b"X", b"G"
CHUNK = 256 * 1024
_HEAD = struct.Struct(">cI")
MAX_SUN_PATH = 107  # sockaddr_un.sun_path holds 108 bytes with the NUL


class WireError(Exception):
    """The peer hung up mid-frame or sent something that is not a frame."""


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
    parts = (PROTOCOL, os.getuid(), host.address, host.user, host.port, host.identity_file, host.proxy_jump,
             host.accept_new_host_key, host.persist_s, os.environ.get("DFLASHCTL_KNOWN_HOSTS"), cfg_state,
             os.environ.get("SSH_AUTH_SOCK"), os.environ.get("HOME"))
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
