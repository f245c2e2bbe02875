"""The ssh connection master: one background process per user and connection, holding the authenticated paramiko
connection so that later commands skip the paramiko import and the handshake (OpenSSH's ControlMaster/ControlPersist).

Started by masterclient.py as `python -m dflashctl.remote.master SOCKET` in its own session, with the Host as JSON
on stdin. It forks once more (so the command that started it reaps its child at once and the master is nobody's
child), connects with the very SshTransport an in-process command uses (host-key and auth checks as always), then
writes one JSON line on stdout, `{"ok": true}` or the connection error, which the starting command raises as its own.

Then it serves clients of our own uid (SO_PEERCRED) on a 0600 UNIX socket, each command on its own thread and ssh
channel, and exits
- after `persist` seconds with no client (never while a command runs through it),
- when its ssh connection dies (its socket goes with it; a command that comes in meanwhile is answered GONE),
- on `hosts disconnect` (a quit request) or SIGTERM, or when its socket file is removed or replaced.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from dflashctl.errors import DflashError
from dflashctl.remote import masterwire as wire
from dflashctl.remote.ssh import NoChannelInTime, SshTransport, _feed, _pump, _signal, _wait
from dflashctl.remote.sshlib import paramiko
from dflashctl.remote.transport import shell_join

POLL_S = 0.5  # how often the serve loop looks at the idle time, the connection and its socket file


class Master:
    def __init__(self, transport: SshTransport, place: wire.Place, persist_s: float):
        self.transport = transport
        self.place = place
        self.persist_s = persist_s
        self.lock = threading.Lock()
        self.active = 0
        self.last = time.monotonic()
        self.stopping = threading.Event()
        self.why = "idle"
        self.inode: int | None = None

    # -- the socket and the serve loop ----------------------------------------------------------------------------
    def listen(self) -> socket.socket:
        """Bind under a temporary name (0600 from the start), then rename over the real one: a client never sees a
        socket with wider permissions, nor a half-made one."""
        tmp = self.place.dir / f".{self.place.key}.{os.getpid()}.sock"
        tmp.unlink(missing_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            listener.bind(str(tmp))
        finally:
            os.umask(old)
        listener.listen(64)
        os.replace(tmp, self.place.sock)
        self.inode = self.place.sock.stat().st_ino
        info = {"master": wire.PROTOCOL, "pid": os.getpid(), "host": self.transport.host.name,
                "endpoint": self.transport.host.endpoint, "persist_s": self.persist_s, "started_at": time.time(),
                "socket": str(self.place.sock)}
        tmp_info = self.place.info.with_suffix(f".{os.getpid()}.tmp")
        tmp_info.write_text(json.dumps(info))
        os.replace(tmp_info, self.place.info)
        return listener

    def ours(self) -> bool:
        try:
            return self.place.sock.stat().st_ino == self.inode
        except OSError:
            return False

    def serve(self, listener: socket.socket) -> str:
        while not self.stopping.is_set():
            ready, _, _ = select.select([listener], [], [], POLL_S)
            if ready:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    continue
                with self.lock:
                    self.active += 1
                threading.Thread(target=self.handle, args=(conn,), name="master-client", daemon=True).start()
                continue
            with self.lock:
                idle = self.active == 0 and time.monotonic() - self.last >= self.persist_s
            if idle:
                self.stop("idle")
            elif not self.transport.is_connected():
                self.stop("connection lost")
            elif not self.ours():
                self.stop("socket removed")
        return self.why

    def stop(self, why: str) -> None:
        if not self.stopping.is_set():
            self.why = why
            self.stopping.set()

    def retire(self) -> None:
        """Remove our socket and info file (not a successor's): no new client reaches this master."""
        with self.lock:
            if self.ours():
                self.place.sock.unlink(missing_ok=True)
                info = wire.read_info(self.place.info)
                if info is not None and info.get("pid") == os.getpid():
                    self.place.info.unlink(missing_ok=True)

    def shut(self, listener: socket.socket) -> None:
        """Leave no client without an answer: the socket goes first (new commands start a new master), clients
        already queued on it are answered GONE (nothing ran), then commands in flight get to send their result."""
        self.retire()
        listener.setblocking(False)
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                break
            conn.settimeout(5)
            with self.lock:
                self.active += 1
            self.handle(conn)  # stopping is set: it reads the request and answers GONE
        listener.close()
        if self.why in ("disconnected", "terminated"):
            self.transport.close()  # commands in flight end now, as `ssh -O exit` ends them
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with self.lock:
                if self.active == 0:
                    break
            time.sleep(0.02)
        self.transport.close()

    # -- one client ----------------------------------------------------------------------------------------------
    def handle(self, conn: socket.socket) -> None:
        try:
            self._handle(conn)
        except (OSError, wire.WireError, wire.ForeignPeer, ValueError, KeyError, TypeError):
            pass  # a client of another user, one that hung up or spoke nonsense: nothing to answer
        finally:
            conn.close()
            with self.lock:
                self.active -= 1
                self.last = time.monotonic()

    def _handle(self, conn: socket.socket) -> None:
        wire.check_peer(conn)  # our connection carries our secrets: only our uid may use it
        frame = wire.recv(conn)
        if frame is None or frame[0] != wire.REQUEST:
            return
        req = json.loads(frame[1])
        if req.get("op") == "quit":
            wire.send_json(conn, wire.EXIT, {"code": 0, "pid": os.getpid()})
            self.stop("disconnected")
            return
        stdin = bytearray()
        while True:
            frame = wire.recv(conn)
            if frame is None:
                return
            if frame[0] == wire.STDIN_END:
                break
            stdin += frame[1]
        if self.stopping.is_set() or not self.transport.is_connected():
            self.stop("connection lost")
            self.retire()  # before answering: the client's next try must find no socket and start a new master
            wire.send(conn, wire.GONE)  # nothing ran: the client sends it to the new master
            return
        hung_up = threading.Event()
        threading.Thread(target=_watch_hangup, args=(conn, hung_up), name="master-hangup", daemon=True).start()
        argv = [str(a) for a in req["argv"]]
        data, stream = bytes(stdin) if req.get("stdin") else None, bool(req.get("stream"))
        timeout = req.get("timeout")
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        try:
            code = run_channel(self.transport, argv, data, timeout, conn, stream=stream, hung_up=hung_up,
                               deadline=deadline)
        except DflashError as e:
            wire.send_json(conn, wire.EXIT, {"error": type(e).__name__, "message": e.message, "hint": e.hint,
                                             "exit_code": int(e.exit_code)})
            return
        if code is not None:
            wire.send_json(conn, wire.EXIT, {"code": code})


def _watch_hangup(conn: socket.socket, hung_up: threading.Event) -> None:
    """After its stdin a client sends nothing more: whatever comes back now (EOF, an error) is it hanging up."""
    try:
        while conn.recv(4096):
            pass
    except OSError:
        pass
    hung_up.set()


def run_channel(t: SshTransport, argv: Sequence[str], stdin: bytes | None, timeout: float | None,
                conn: socket.socket, *, stream: bool, hung_up: threading.Event,
                deadline: float | None = None) -> int | None:
    """SshTransport.run's loop, forwarding output as it comes instead of collecting it: same channel, same timeout
    error, same exit status rules. None when the client hung up (the channel is closed, as a closed stream does)."""
    if deadline is None and timeout is not None:
        deadline = time.monotonic() + float(timeout)
    try:
        chan = t._session(deadline)
    except NoChannelInTime:
        raise t._timed_out(argv, float(timeout or 0)) from None
    try:
        chan.exec_command(shell_join(argv))
        feeder = _feed(chan, stdin)
        while True:
            out, err = bytearray(), bytearray()
            done = _pump(chan, out, err)
            try:
                if out:
                    wire.send(conn, wire.OUT, bytes(out))
                if err and not stream:  # a stream's stderr is not kept, as SshTransport.stream does not
                    wire.send(conn, wire.ERR, bytes(err))
            except OSError:
                hung_up.set()
            if done:
                break
            if hung_up.is_set():
                return None
            if deadline is not None and time.monotonic() >= deadline:
                _signal(chan, "KILL")
                raise t._timed_out(argv, float(timeout or 0))
            wait = POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - time.monotonic()))
            _wait(chan, wait)
        if feeder is not None:
            feeder.join(1)
        return t._exit_status(chan)
    except (EOFError, OSError, paramiko.SSHException):
        raise t._lost() from None
    finally:
        chan.close()


def _report(doc: dict) -> None:
    """The one line the starting command waits for; then stdout goes to /dev/null so its pipe closes."""
    os.write(1, json.dumps(doc).encode() + b"\n")
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    os.dup2(devnull, 0)
    os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m dflashctl.remote.master SOCKET  (the Host as JSON on stdin)", file=sys.stderr)
        return 2
    sock = Path(args[0])
    host = wire.host_from_json(sys.stdin.buffer.read())
    place = wire.Place(sock.parent, sock.name.removesuffix(".sock"))
    if os.fork():
        os._exit(0)  # the starter reaps this one at once; the master goes on as nobody's child
    os.umask(0o077)  # its files (socket, info) are the user's alone
    transport = SshTransport(host)
    try:
        transport.check_connection()
    except DflashError as e:
        _report({"ok": False, "error": type(e).__name__, "message": e.message, "hint": e.hint,
                 "exit_code": int(e.exit_code)})
        return 0
    except Exception as e:  # noqa: BLE001 - the starter turns this into its one-line error
        _report({"ok": False, "error": "ConnectFailed", "message": f"host {host.name}: ssh master failed: {e}"})
        return 1
    master = Master(transport, place, float(host.persist_s))
    signal.signal(signal.SIGTERM, lambda *_: master.stop("terminated"))
    try:
        listener = master.listen()
    except OSError as e:
        _report({"ok": False, "error": "ConnectFailed", "message": f"host {host.name}: ssh master cannot listen "
                                                                   f"on {sock}: {e.strerror or e}"})
        transport.close()
        return 1
    _report({"ok": True, "pid": os.getpid()})
    try:
        why = master.serve(listener)
    finally:
        master.shut(listener)
    print(f"master for {host.name} exits: {why}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
