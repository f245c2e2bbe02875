"""The command server: a per-user background process that has imported the CLI, forking one child per command.

A one-shot `status` (`--json` or the table) spends ~0.3 s in this laptop's interpreter before and after its one round
trip (imports, regex tables, first-call set-up); a child forked from a process that has all of that done starts in a
millisecond.
The child runs the ordinary typer app (cli/__init__.py main) with the client's argv, cwd, environment, umask,
sys.path, CPU affinity, niceness, the terminal signals it ignores (nohup, a shell's `&`) and standard streams (the
client's own file descriptors, passed over the socket, rebuilt with its encodings and buffering), so its parsing,
errors, output and exit code are the CLI's own. What it
does not take from the client: resource limits (ulimit) and cgroup, which stay those the server started with.
cmdclient.py is the client and documents the files, the key and the knobs.

The server: started by cmdclient.start under NAME.lock (which it holds for its whole life), it forks once (the
starter reaps that at once: the server is nobody's child), imports the CLI and what a one-shot status or runs needs
(WARM; paramiko too, for `persist = 0` hosts), checks that its code did not change meanwhile, then binds
NAME.sock (0600, renamed over a stale one) and serves in one thread: a select loop over the listener, each
client's socket (a forwarded signal, or a hang-up: the child's process group gets SIGHUP) and each child's pidfd
(its end goes back as {"exit": code} or {"signal": n}). It answers only clients of its own uid (SO_PEERCRED) and
key (the same NAME with other code: {"stale": true}, and it exits), never forks while it has a thread, and exits
after DFLASHCTL_SERVER_IDLE_S (default 300) without a command, on a quit request (`hosts disconnect`), on SIGTERM,
or when its socket file is removed or replaced.

Module state from the server's start must not reach a child: our code reads no environment at import (audited; the
tests change HOME, DFLASHCTL_HOSTS and DFLASHCTL_KNOWN_HOSTS between calls through one server), the lru_caches hold
our own files or pure functions of their arguments, the consoles are made on first use (in the child); what typer
reads at import (TYPER_USE_RICH, TERMINAL_WIDTH, FORCE_COLOR, ...) and the interpreter's start-up environment are part
of the key; tempfile's cached directory and the locale are reset in the child.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import importlib
import io
import json
import marshal
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflashctl import cmdclient as client

POLL_S = 0.5
# Imported before the first fork: what one-shot `status` and `runs` import on their way (local or ssh, through
# a connection master or not), so that no child pays for it.
WARM = ("dflashctl.cli", "dflashctl.commands.status", "dflashctl.commands.runs", "dflashctl.remote",
        "dflashctl.remote.target", "dflashctl.remote.probe", "dflashctl.remote.masterclient", "dflashctl.remote.ssh",
        "dflashctl.analysis.health", "dflashctl.config", "dflashctl.model", "rich.console", "rich.text",
        "dflashctl.commands.cluster_meta", "dflashctl.sentinel.hostkeys", "typer._click.decorators", "rich.markup",
        "tomllib", "tempfile", "shlex", "queue", "concurrent.futures",
        # the table a terminal gets (status, runs without --json)
        "dflashctl.cli.statusview", "dflashctl.cli.timeline", "dflashctl.cli.gpuhealth", "rich.table",
        "rich._emoji_codes")


@dataclass
class Child:
    pid: int
    conn: socket.socket
    buf: bytearray = field(default_factory=bytearray)
    hung_up: bool = False


@dataclass
class Server:
    folder: Path
    key: str
    idle_s: float
    lock: Any = None  # the open NAME.lock: held for as long as this server may take commands
    listener: socket.socket | None = None
    inode: int | None = None
    children: dict[int, Child] = field(default_factory=dict)  # by pidfd
    last: float = field(default_factory=time.monotonic)
    why: str | None = None

    @property
    def sock_path(self) -> Path:
        return Path(client.place(self.folder, self.key, "sock"))

    @property
    def info_path(self) -> Path:
        return Path(client.place(self.folder, self.key, "json"))

    def listen(self) -> None:
        """Bound under a temporary name with umask 0177 (0600 from the start), then renamed over the real one."""
        tmp = self.folder / f".server.{os.getpid()}.sock"
        tmp.unlink(missing_ok=True)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            self.listener.bind(str(tmp))
        finally:
            os.umask(old)
        self.listener.listen(64)
        info = self.folder / f".server.{os.getpid()}.json"  # first: a socket that answers has its info in place
        fd = os.open(info, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with open(fd, "w") as f:
            json.dump({"pid": os.getpid(), "started_at": time.time(), "key": self.key, "idle_s": self.idle_s}, f)
        os.replace(info, self.info_path)
        os.replace(tmp, self.sock_path)
        self.inode = self.sock_path.stat().st_ino

    def ours(self) -> bool:
        try:
            return self.sock_path.stat().st_ino == self.inode
        except OSError:
            return False

    def serve(self) -> str:
        """Until a reason to stop; then retired (no new command reaches it) while the commands in flight finish,
        their signals still forwarded and their ends still answered."""
        while self.why is None or self.children:
            if self.why is not None and self.listener is not None:
                self.shut()
            watched: list[Any] = [*([self.listener] if self.listener else []), *self.children,
                                  *(c.conn for c in self.children.values() if not c.hung_up)]
            ready, _, _ = select.select(watched, [], [], POLL_S)
            for r in ready:
                try:
                    if r is self.listener:
                        self.accept()
                    elif isinstance(r, int):
                        self.reap(r)
                    else:
                        self.from_client(r)
                except Exception:  # noqa: BLE001 - a bug here must not take the other commands' answers with it
                    traceback.print_exc()  # into NAME.log
            if self.why is not None:
                continue
            if not self.children and time.monotonic() - self.last >= self.idle_s:
                self.why = "idle"
            elif not self.ours():
                self.why = "socket removed"
        self.shut()
        return self.why

    def accept(self) -> None:
        assert self.listener is not None
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        self.last = time.monotonic()
        try:
            conn.settimeout(10)
            if client.peer_uid(conn) != os.getuid():
                conn.close()  # another user's process: not a byte, no descriptor
                return
            doc, fds = recv_request(conn)
        except (OSError, ValueError, KeyError, EOFError, TypeError):
            conn.close()
            return
        try:
            if doc.get("op") == "quit":
                self.why = "quit"
                _say(conn, {"quit": True, "pid": os.getpid()})
            elif doc.get("key") != self.key:
                self.why = "stale"  # our code, typer or rich changed: out of the way first, so that the client's
                self.retire()  # start of a new server (on the new code) finds the lock free
                _say(conn, {"stale": True})
            elif threading.active_count() != 1 or len(fds) != 3:
                _say(conn, {"refused": "threads" if len(fds) == 3 else "descriptors"})
                self.why = "threads" if len(fds) == 3 else None
            else:
                self.fork(conn, doc, fds)
                return
            conn.close()
        except OSError:  # the client hung up meanwhile, or no fork now: it gets the hang-up (nothing ran here)
            conn.close()
        finally:
            for fd in fds:
                os.close(fd)  # the child has its own copies

    def fork(self, conn: socket.socket, doc: dict[str, Any], fds: list[int]) -> None:
        _say(conn, {"accepted": True})  # from here on the command is the child's: the client never runs it again
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                for other in (self.listener, *(c.conn for c in self.children.values())):
                    if other is not None:
                        other.close()
                for pidfd in self.children:
                    os.close(pidfd)
                if self.lock is not None:
                    self.lock.close()
                conn.close()
                code = run_child(doc, fds)
            except BaseException:  # noqa: BLE001 - whatever happens, the child ends here, never in the loop
                traceback.print_exc()
            finally:
                os._exit(code)
        conn.settimeout(None)
        self.children[os.pidfd_open(pid)] = Child(pid, conn)

    def from_client(self, conn: socket.socket) -> None:
        child = next((c for c in self.children.values() if c.conn is conn), None)
        if child is None:
            return  # its child was reaped in this same round (its socket closed with it)
        try:
            data = conn.recv(65536)
        except OSError:
            data = b""
        if not data:  # the client died or hung up: its command ends as a command whose terminal went away
            if not child.hung_up:
                child.hung_up = True
                _kill(child.pid, signal.SIGHUP, group=True)
            return
        child.buf += data
        for doc in client.take_frames(child.buf):  # forwarded signals, as cmdclient.send_doc frames them
            signum = int(doc.get("signal", 0))
            if doc.get("op") == "signal" and signum in client.FORWARDED:
                # Ctrl-C and a closed terminal reach a whole foreground process group; `kill PID` the process
                _kill(child.pid, signum, group=signum != signal.SIGTERM)

    def reap(self, pidfd: int) -> None:
        child = self.children.pop(pidfd)
        _, status = os.waitpid(child.pid, 0)
        os.close(pidfd)
        self.last = time.monotonic()
        end = {"signal": os.WTERMSIG(status)} if os.WIFSIGNALED(status) else {"exit": os.WEXITSTATUS(status)}
        with contextlib.suppress(OSError):
            _say(child.conn, end)
        child.conn.close()

    def retire(self) -> None:
        """Our socket and info file (not a successor's) go, then the lock: a new server may start meanwhile."""
        if self.ours():
            self.sock_path.unlink(missing_ok=True)
            try:
                if json.loads(self.info_path.read_text()).get("pid") == os.getpid():
                    self.info_path.unlink()
            except (OSError, ValueError):
                pass
        self.inode = None
        if self.lock is not None:
            self.lock.close()
            self.lock = None

    def shut(self) -> None:
        """Retired, and the listener closed: the next command starts a new server."""
        self.retire()
        if self.listener is not None:
            self.listener.close()
            self.listener = None


def _say(conn: socket.socket, doc: dict[str, Any]) -> None:
    client.send_doc(conn, doc)  # the client's own framing, both ways


def _kill(pid: int, signum: int, *, group: bool = False) -> None:
    with contextlib.suppress(ProcessLookupError):
        (os.killpg if group else os.kill)(pid, signum)


def recv_request(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """The client's request and the descriptors that came with its first bytes (close-on-exec here)."""
    head, fds, _, _ = socket.recv_fds(conn, 4, 3, socket.MSG_CMSG_CLOEXEC)
    while len(head) < 4:
        more = conn.recv(4 - len(head))
        if not more:
            raise ValueError("client hung up")
        head += more
    (n,) = struct.unpack(">I", head)
    data = bytearray()
    while len(data) < n:
        more = conn.recv(n - len(data))
        if not more:
            raise ValueError("client hung up")
        data += more
    doc = marshal.loads(bytes(data))
    if not isinstance(doc, dict):
        raise ValueError("a request is a dict")
    return doc, list(fds)


# -- the child ----------------------------------------------------------------------------------------------------
def run_child(doc: dict[str, Any], fds: list[int]) -> int:
    """Become the client's process as far as the CLI can tell, run the typer app, return its exit code."""
    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD):
        signal.signal(s, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for s in doc.get("ignored", ()):  # what the client ignores (nohup, `&`): so does a CLI its parent started
        signal.signal(signal.Signals(int(s)), signal.SIG_IGN)
    os.setsid()  # its own process group: a forwarded Ctrl-C reaches it and what it started, as a terminal's would
    os.chdir(doc["cwd"])
    os.umask(int(doc["umask"]))
    with contextlib.suppress(OSError, KeyError):  # the client's CPUs and niceness (a nicer one than ours: not ours)
        os.sched_setaffinity(0, doc["cpus"])
        os.setpriority(os.PRIO_PROCESS, 0, int(doc["nice"]))
    os.environ.clear()
    os.environ.update(doc["env"])
    sys.path[:] = doc["path"]
    sys.argv[:] = doc["argv"]
    import locale
    import tempfile

    tempfile.tempdir = None  # tempfile caches the directory TMPDIR named: the client's, not the first one's
    with contextlib.suppress(locale.Error):
        locale.setlocale(locale.LC_CTYPE, "")
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    _streams(doc["streams"])
    from dflashctl.cli import main

    code = main()
    import atexit

    # what the interpreter's exit does before it ends: wait for the threads the command left, run atexit
    getattr(threading, "_shutdown", lambda: None)()
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
    except OSError:
        code = 120  # what the interpreter exits with when the final flush of stdout fails
    with contextlib.suppress(OSError):
        sys.stderr.flush()
    return code


def _streams(info: list[dict[str, Any]]) -> None:
    """sys.stdin/stdout/stderr over fds 0-2 with the client's encoding, errors and buffering."""
    made = []
    for fd, s in enumerate(info):
        raw = open(fd, "rb" if fd == 0 else "wb", buffering=-1, closefd=False)  # noqa: SIM115 - sys.stdin & co.
        made.append(io.TextIOWrapper(raw, encoding=s["encoding"], errors=s["errors"],
                                     line_buffering=s["line_buffering"], write_through=s["write_through"]))
    sys.stdin, sys.stdout, sys.stderr = made
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = made


# -- start-up -----------------------------------------------------------------------------------------------------
def main(argv: list[str]) -> int:
    """`cmdserver FOLDER KEY` (cmdclient.start): fork into the background, take the lock, import, serve."""
    folder, key = Path(argv[0]), argv[1]
    if os.fork() != 0:
        return 0  # the starter reaps this one at once: the server is nobody's child
    lock = open(client.place(folder, key, "lock"), "a")  # noqa: SIM115 - held (by this open file) for the server's whole life
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os._exit(0)  # another one started first
    code = key.partition("-")[0]
    for name in WARM:
        importlib.import_module(name)
    importlib.import_module("dflashctl.remote.sshlib").paramiko  # noqa: B018 - persist = 0 hosts take paramiko
    with contextlib.suppress(ImportError, AttributeError, IndexError):  # rich's width table, as its load() names it
        # (imported, not loaded: load() reads UNICODE_VERSION from the child's environment, then finds it imported)
        from rich._unicode_data._versions import VERSIONS

        importlib.import_module(f"rich._unicode_data.unicode{VERSIONS[-1].replace('.', '-')}")
    from dflashctl.remote import probe

    probe.build_script(), probe.hostpair_source(), probe.loader_source()  # our own files, read once
    importlib.import_module("dflashctl.cli").built_command()  # typer's click command, built once for every child
    if client.code_key() != code:
        sys.stderr.write("dflashctl cmdserver: the code changed while it started; not serving\n")
        os._exit(0)
    gc.collect()
    gc.freeze()  # what is imported stays out of the children's collections: they copy fewer pages on write
    if threading.active_count() != 1:
        sys.stderr.write("dflashctl cmdserver: a thread runs after the imports; a server that forks must have none\n")
        os._exit(0)
    try:
        idle_s = float(os.environ.get("DFLASHCTL_SERVER_IDLE_S") or client.IDLE_S_DEFAULT)
    except ValueError:
        idle_s = client.IDLE_S_DEFAULT
    server = Server(folder, key, idle_s, lock)
    signal.signal(signal.SIGTERM, lambda *_: setattr(server, "why", "terminated"))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    server.listen()
    why = server.serve()
    sys.stderr.write(f"dflashctl cmdserver {os.getpid()}: exits ({why})\n")
    os._exit(0)
