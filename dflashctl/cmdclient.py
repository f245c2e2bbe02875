"""The command server's client (cmdserver.py): an eligible command line runs in a child forked by a per-user server
that has the CLI imported already, instead of paying ~0.3 s of imports and first-call set-up in this process.

stdlib only and small: entry.py imports it on every call. For an eligible command line (`eligible`, a textual check)
it dials the server's socket, checks that the server is ours (SO_PEERCRED), passes its stdin/stdout/stderr (SCM_RIGHTS)
with argv, cwd, environment, umask, sys.path, the streams' encodings and the key (`server_key`: our code's
fingerprint, the one helpcache.py keys help on, plus the interpreter and the environment read at import), then waits
for the child's exit code. Ctrl-C, SIGTERM and SIGHUP are forwarded to the child; a child killed by a signal this
client forwarded kills this client with it (as a normal run would die), a child killed by another signal (a crash)
gives one line on stderr and exit 128 + the signal number. When there is no server, or its key is another, `run`
returns None and the command runs in this process as always, leaving a server starting in the background.

Where: `$DFLASHCTL_STATE_DIR/cmdserver`, else `$XDG_RUNTIME_DIR/dflashctl/cmdserver`, else
`~/.cache/dflashctl/cmdserver` (0700, ours); in it, per interpreter set-up (NAME: the part of the key that is not our
code, so that two interpreters or flag sets in use side by side get a server each instead of replacing each other's),
`NAME.sock` (0600), `NAME.json` (pid, started_at, key), `NAME.lock` (held by the live server for its whole life: two
starts make one server) and `NAME.log`.
`DFLASHCTL_NO_SERVER=1` turns it off; `DFLASHCTL_SERVER_IDLE_S` (read when a server starts; default 300) is how long
it waits for the next command before it exits; `dflashctl hosts disconnect` ends it.
"""

from __future__ import annotations

import _signal  # signal's C half: `signal` itself imports enum (~3 ms), and so does `socket`
import _socket
import marshal
import os
import struct
import sys

from dflashctl.helpcache import code_fingerprint, code_roots, sha256

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:  # typing costs ~2.5 ms at import, and this module is on every served command's way
    from typing import Any

# 2: frames are a 4-byte length and a marshal'd dict, both ways (1 was JSON, and `json` imports `re`). The number is
# part of server_key, so a server of another protocol has another socket and never reads these frames.
PROTOCOL = 2
IDLE_S_DEFAULT = 300.0
MAX_SUN_PATH = 107
FORWARDED = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP)
# Signals whose disposition the child takes from the client: ignored stays ignored (`nohup`, a shell's `&`), as
# a CLI started by the same parent would have it.
DISPOSITIONS = (_signal.SIGINT, _signal.SIGQUIT, _signal.SIGTERM, _signal.SIGHUP)
# Environment read when modules are imported (so a server started under other values would answer with those):
# the interpreter's own start-up (PYTHON*, locale) and typer's module-level reads (core.py, rich_utils.py).
_IMPORT_ENV = ("LANG", "LANGUAGE", "TYPER_USE_RICH", "TERMINAL_WIDTH", "_TYPER_FORCE_DISABLE_TERMINAL",
               "GITHUB_ACTIONS", "FORCE_COLOR", "PY_COLORS")
_IMPORT_ENV_PREFIXES = ("PYTHON", "LC_")
_SHORT_WATCH = "w"  # `status -w`, also inside a bundle of short flags such as `-jw`


def eligible(argv: list[str]) -> bool:
    """One-shot commands that neither draw live nor read the terminal: `status` without --watch/-w, and `runs`, as
    JSON or as the table (the child renders it onto the client's own terminal: rich sees the same tty, size and
    colours). Textual and conservative (no second parser): anything unusual runs the normal way."""
    if not argv or argv[0] not in ("status", "runs"):
        return False
    for arg in argv[1:]:
        if arg in ("--", "--help", "-h", "--watch") or arg.startswith("--watch="):
            return False
        if arg.startswith("-") and not arg.startswith("--") and (_SHORT_WATCH in arg or "h" in arg):
            return False
    return True


def server_dir(env: dict[str, str] | os._Environ[str] = os.environ) -> str | None:
    """Absolute, so the server (started in /) and every client name the same files whatever their cwd; None when
    only a relative home would say where (never a folder under the cwd, as for the help cache)."""
    if env.get("DFLASHCTL_STATE_DIR"):
        return os.path.join(os.path.abspath(os.path.expanduser(env["DFLASHCTL_STATE_DIR"])), "cmdserver")
    if env.get("XDG_RUNTIME_DIR") and os.path.isabs(env["XDG_RUNTIME_DIR"]):
        return os.path.join(env["XDG_RUNTIME_DIR"], "dflashctl", "cmdserver")
    home = env["HOME"] if "HOME" in env else os.path.expanduser("~")  # unset: the password database's
    return os.path.join(home, ".cache", "dflashctl", "cmdserver") if os.path.isabs(home) else None


def ensure_dir(path: str | os.PathLike[str]) -> None:
    """Made 0700 and checked to be ours: our terminal's file descriptors go to whoever listens in it."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    checked_dir(path)


def checked_dir(path: str | os.PathLike[str]) -> None:
    """A real directory (not a link to one) owned by us, made 0700 if it was more open; else PermissionError."""
    st = os.lstat(path)
    if (st.st_mode & 0o170000) != 0o040000 or st.st_uid != os.getuid():  # S_ISDIR of lstat: no symlink either
        raise PermissionError(f"{os.fspath(path)} is not a directory owned by you")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)


def code_key() -> str:
    """Our code, typer's and rich's (the help cache's fingerprint), and the folders they are installed in (one stat
    each: installing or upgrading any package there, paramiko say, changes its folder)."""
    roots = code_roots()
    stamps = [(d, os.stat(d).st_mtime_ns) for d in sorted({os.path.dirname(r) for r in roots})]
    return sha256(f"{code_fingerprint(roots)}{stamps}".encode()).hexdigest()[:24]


def server_key(code: str | None = None) -> str:
    """What a server must share with this process to answer for it: code_key, then the interpreter, its flags and
    sys.path, and the environment read at import (`CODE-NAME`)."""
    env = sorted((k, v) for k, v in os.environ.items() if k in _IMPORT_ENV or k.startswith(_IMPORT_ENV_PREFIXES))
    rest = repr([PROTOCOL, sys.executable, repr(sys.flags), sys.warnoptions, sorted(sys._xoptions.items()),
                 sys.path, sys.getfilesystemencoding(), env])
    return f"{code or code_key()}-{sha256(rest.encode()).hexdigest()[:16]}"


def place(folder: str | os.PathLike[str], key: str, ext: str) -> str:
    """A file of the server for `key` (see the module docstring)."""
    return os.path.join(folder, f"{key.rpartition('-')[2]}.{ext}")


def peer_uid(sock: _socket.socket) -> int:
    creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def stream_info(stream: Any) -> dict[str, Any]:
    """How the interpreter made this standard stream (the server's child makes its own the same way)."""
    return {"fd": stream.fileno(), "encoding": stream.encoding, "errors": stream.errors,
            "line_buffering": stream.line_buffering, "write_through": getattr(stream, "write_through", False)}


def request(argv: list[str], key: str) -> tuple[dict[str, Any], list[int]]:
    streams = [stream_info(s) for s in (sys.stdin, sys.stdout, sys.stderr)]
    fds = [s.pop("fd") for s in streams]
    mask = os.umask(0)
    os.umask(mask)
    doc = {"op": "run", "key": key, "argv": [sys.argv[0], *argv], "cwd": os.getcwd(), "env": dict(os.environ),
           "umask": mask, "path": list(sys.path), "streams": streams, "cpus": sorted(os.sched_getaffinity(0)),
           "nice": os.getpriority(os.PRIO_PROCESS, 0),
           "ignored": [int(s) for s in DISPOSITIONS if _signal.getsignal(s) == _signal.SIG_IGN]}
    return doc, fds


def send_doc(sock: _socket.socket, doc: dict[str, Any], fds: list[int] = ()) -> None:  # type: ignore[assignment]
    """One frame: a 4-byte length, then the marshal'd doc (the descriptors ride with the length). marshal, not
    JSON: both ends are this code on this interpreter (the key says so), and only our own uid is ever answered."""
    data = marshal.dumps(doc)
    head = struct.pack(">I", len(data))
    if fds:
        sock.sendmsg([head], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))])
        sock.sendall(data)
    else:
        sock.sendall(head + data)  # one write: a reader's first recv mostly has the whole frame


def take_frames(buf: bytearray) -> list[dict[str, Any]]:
    """The whole frames in buf, taken out of it (a torn one stays)."""
    out = []
    while len(buf) >= 4:
        (n,) = struct.unpack(">I", buf[:4])
        if len(buf) < 4 + n:
            break
        out.append(marshal.loads(bytes(buf[4:4 + n])))
        del buf[:4 + n]
    return out


def read_frames(sock: _socket.socket, buf: bytearray) -> list[dict[str, Any]] | None:
    """The next whole frames (at least one; buf keeps a torn one); None when the peer hung up first."""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buf += chunk
        if docs := take_frames(buf):
            return docs


def dial(path: str | os.PathLike[str]) -> _socket.socket | None:
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.connect(os.fspath(path))
    except OSError:
        sock.close()
        return None
    return sock


def run(argv: list[str]) -> int | None:
    """The command's exit code from the server's child, or None: run it here (a server is started for next time)."""
    if os.environ.get("DFLASHCTL_NO_SERVER") == "1" or not eligible(argv):
        return None
    folder = server_dir()
    if folder is None:
        return None
    key = server_key()
    sock_path = place(folder, key, "sock")
    if len(os.fsencode(sock_path)) > MAX_SUN_PATH:
        return None
    try:
        checked_dir(folder)
        sock = dial(sock_path)
    except OSError:
        sock = None
    if sock is None:
        start(folder, key)
        return None
    try:
        if peer_uid(sock) != os.getuid():
            return None
        doc, fds = request(argv, key)
        send_doc(sock, doc, fds)
        return _wait(sock, folder, key)
    except (OSError, ValueError, EOFError, TypeError, AttributeError):
        return None  # nothing started (a started child always answers before anything else can fail)
    finally:
        sock.close()


def _wait(sock: _socket.socket, folder: str, key: str) -> int | None:
    """Forward our signals until the child's end comes back. Before the server's "accepted" nothing has run (None:
    run it here); after it the command is the child's, and only the child's end decides the exit code."""
    buf = bytearray()
    sent: set[int] = set()
    pending: list[int] = []
    accepted = False

    def forward(signum: int, _frame: object) -> None:
        if not accepted:
            pending.append(signum)
            return
        sent.add(signum)
        try:  # noqa: SIM105 - contextlib is not on this path (its import costs ~2.5 ms)
            send_doc(sock, {"op": "signal", "signal": signum})
        except OSError:
            pass

    old = {s: _signal.getsignal(s) for s in FORWARDED}
    for s, h in old.items():
        if h != _signal.SIG_IGN:
            _signal.signal(s, forward)
    docs = read_frames(sock, buf)
    if not docs or not docs[0].get("accepted"):
        for s, h in old.items():
            _signal.signal(s, h if h is not None else _signal.SIG_DFL)
        for s in pending:
            _signal.raise_signal(s)  # as if it had come now, to a command running here
        if docs and docs[0].get("stale"):
            start(folder, key)  # the old server is on its way out; the next command finds the new one
        return None
    accepted = True
    for s in pending:
        forward(s, None)
    docs = docs[1:]
    while True:
        for d in docs:
            if "exit" in d:
                return int(d["exit"])
            if "signal" in d:
                return _killed(int(d["signal"]), sent)
        try:
            docs = read_frames(sock, buf)
        except (OSError, ValueError, EOFError, TypeError):
            docs = None
        if docs is None:  # never run again here: the command may have done its work
            sys.stderr.write("ERROR: the dflashctl command server went away while the command ran; run it again "
                             "(DFLASHCTL_NO_SERVER=1 runs it without the server)\n")
            return 1


def _killed(signum: int, sent: set[int]) -> int:
    """The child died of a signal: of one we forwarded, we die of it too (exactly what a normal run does); of any
    other, one line and 128 + the signal number."""
    sys.stdout.flush()
    if signum in sent:
        _signal.signal(signum, _signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    import signal  # for the name only (its enum import is not worth paying on the way in)

    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    sys.stderr.write(f"ERROR: the command was killed by {name} (in the dflashctl command server); run it again "
                     "with DFLASHCTL_NO_SERVER=1 to see it without the server\n")
    return 128 + signum


def start(folder: str, key: str) -> None:
    """Start a server in the background unless one is alive or starting (it holds NAME.lock for its whole life).
    The server is detached: its own session, nobody's child once the first fork has exited."""
    import fcntl
    import json
    import subprocess

    try:
        ensure_dir(folder)
        with open(place(folder, key, "lock"), "a") as lock:
            os.chmod(place(folder, key, "lock"), 0o600)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # a server holds it: alive, starting, or on its way out
            fcntl.flock(lock, fcntl.LOCK_UN)
        log = os.open(place(folder, key, "log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            root = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
            boot = "import sys; sys.path[:] = __import__('json').loads(sys.argv[1]); " \
                   "from dflashctl.cmdserver import main; sys.exit(main(sys.argv[2:]))"
            proc = subprocess.Popen(
                [sys.executable, *subprocess._args_from_interpreter_flags(), "-c", boot,  # type: ignore[attr-defined]
                 json.dumps([root, *sys.path]), folder, key],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, cwd="/", start_new_session=True,
                close_fds=True)
        finally:
            os.close(log)
        proc.wait()  # the first process forks the server and exits at once
    except OSError:
        pass  # no server this time: the command has run (or will) the normal way


def stop(folder: str | os.PathLike[str] | None = None, timeout: float = 10.0) -> list[int]:
    """End this user's command servers (`hosts disconnect`): the pids of those that ran, once they have gone. The
    commands in flight finish; the next eligible command starts a new server."""
    folder = folder or server_dir()
    try:
        names = sorted(os.listdir(folder)) if folder is not None else []
    except OSError:
        names = []
    socks = [os.path.join(folder, n) for n in names if n.endswith(".sock") and not n.startswith(".")]
    return [pid for sock in socks if (pid := _stop(sock, timeout)) is not None]


def _stop(path: str, timeout: float) -> int | None:
    sock = dial(path)
    if sock is None:
        return None
    try:
        sock.settimeout(timeout)
        if peer_uid(sock) != os.getuid():
            return None
        send_doc(sock, {"op": "quit"})
        docs = read_frames(sock, bytearray()) or [{}]
    except (OSError, ValueError, EOFError, TypeError):
        return None
    finally:
        sock.close()
    pid = docs[0].get("pid")
    if not isinstance(pid, int):
        return None
    _gone(pid, timeout)
    return pid


def _gone(pid: int, timeout: float) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"dflashctl.cmdserver" not in f.read():
                    return
        except OSError:
            return
        time.sleep(0.02)
