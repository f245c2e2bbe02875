"""A resident fork-server for `PYTHON -c SRC ARGS...` requests (stdlib only), kept by the ssh connection master.

Every one-shot probe used to pay an interpreter start (and for a container a `pct exec`) per call. The master
(remote/runnerlink.py) instead starts this once per place — `python3 -c <this>` on the Proxmox host, `pct exec CT --
PYTHON -c <this>` in a container — on one long-lived ssh channel, and frames each request down it. For each one
this process forks; the child runs SRC exactly as `PYTHON -c SRC ARGS...` would: sys.argv ['-c', *ARGS], a fresh
`__main__`, stdin the given bytes then EOF, stdout/stderr on pipes of their own, the signal dispositions a fresh
interpreter has, no other fd of ours, its own process group (so a kill reaches what it started); its exit status
goes back as the shell reports it (128+N for signal N, with N). One thread, one select loop: several children run
at once.

Frames on stdin/stdout: HEAD (kind byte, request id, payload length) then the payload. In: START (JSON {src,
args}), STDIN (all of the request's stdin: the child is forked when it comes), KILL. Out: HELLO once (JSON {pid}),
OUT / ERR chunks, EXIT (JSON {code, and signal when one ended it}). EOF on stdin (the channel closed: `hosts
disconnect`, the master's idle exit, a dead connection) kills every child's group and ends this process: a runner
never outlives its channel.
"""

import builtins
import errno
import gc
import json
import os
import select
import signal
import struct
import sys

HEAD = struct.Struct(">cII")
START, STDIN, KILL = b"S", b"I", b"K"
HELLO, OUT, ERR, EXIT = b"H", b"O", b"E", b"X"
READ = 65536
# Modules our agent programs import, loaded once here so a child does not import them again (a module found in
# sys.modules is the one it would have imported; none of these does anything at import but define): stdlib, and
# the NVML bindings where installed (the probe's GPU reading imports them first; 7-28 ms here; the library itself is
# loaded by nvmlInit, in the child).
PRELOAD = ("argparse", "base64", "contextlib", "ctypes", "ctypes.util", "hashlib", "marshal", "re", "socket", "stat",
           "subprocess", "threading", "time", "pynvml")


def encode(kind: bytes, rid: int, payload: bytes = b"") -> bytes:
    return HEAD.pack(kind, rid, len(payload)) + payload


def split_frames(buf: bytearray) -> list:
    """Take every whole frame off the front of buf: [(kind, id, payload)]."""
    frames = []
    while len(buf) >= HEAD.size:
        kind, rid, size = HEAD.unpack_from(buf)
        if len(buf) < HEAD.size + size:
            break
        frames.append((kind, rid, bytes(buf[HEAD.size:HEAD.size + size])))
        del buf[:HEAD.size + size]
    return frames


def exit_doc(status: int) -> dict:
    """A wait status as the shell reports it: the exit code, or 128+N and the signal N."""
    code = os.waitstatus_to_exitcode(status)
    return {"code": 128 - code, "signal": -code} if code < 0 else {"code": code}


class Child:
    """One forked request: its pid (= its process group), pipes and what is left to write to its stdin."""

    def __init__(self, rid: int, pid: int, stdin: int, out: int, err: int):
        self.rid, self.pid = rid, pid
        self.stdin: int | None = stdin
        self.pending = bytearray()  # to write to its stdin, which is closed after it
        self.open = {out: OUT, err: ERR}
        self.status: int | None = None


class Server:
    def __init__(self) -> None:
        self.inbuf = bytearray()
        self.children: dict = {}  # rid -> Child
        self.starting: dict = {}  # rid -> START payload, until fork
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)

    def send(self, kind: bytes, rid: int, payload: bytes = b"") -> None:
        data = memoryview(encode(kind, rid, payload))
        while data:
            data = data[os.write(1, data):]

    def serve(self):  # noqa: ANN201 - returns the job a forked child must run, or None when done
        self.send(HELLO, 0, json.dumps({"pid": os.getpid()}).encode())
        while True:
            rfds = [0, self.wake_r] + [fd for c in self.children.values() for fd in c.open]
            wfds = [c.stdin for c in self.children.values() if c.stdin is not None and c.pending]
            try:
                readable, writable, _ = select.select(rfds, wfds, [])
            except InterruptedError:
                continue
            if self.wake_r in readable:
                while True:
                    try:
                        if not os.read(self.wake_r, 512):
                            break
                    except BlockingIOError:
                        break
            for child in list(self.children.values()):
                for fd in [fd for fd in child.open if fd in readable]:
                    self.pump(child, fd)
                if child.stdin is not None and child.stdin in writable:
                    self.feed(child)
            self.reap()
            if 0 in readable:
                data = os.read(0, READ)
                if not data:
                    self.shutdown()
                    return None
                self.inbuf += data
                for kind, rid, payload in split_frames(self.inbuf):
                    job = self.handle(kind, rid, payload)
                    if job is not None:
                        return job  # in the forked child

    def handle(self, kind: bytes, rid: int, payload: bytes):  # noqa: ANN201
        if kind == START:
            self.starting[rid] = payload
            return None
        if kind == STDIN and rid in self.starting:
            return self.fork(rid, json.loads(self.starting.pop(rid)), payload)
        if kind == KILL:
            self.starting.pop(rid, None)
            if rid in self.children:
                _killpg(self.children[rid].pid)
        return None

    def fork(self, rid: int, req: dict, stdin: bytes):  # noqa: ANN201
        """The whole stdin travels in one STDIN frame (the master has all of it before it asks)."""
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            for fd in (in_w, out_r, err_r):
                os.close(fd)
            return (req, in_r, out_w, err_w)
        with _quiet():
            os.setpgid(pid, pid)  # also done in the child: whichever runs first, a kill finds the group
        for fd in (in_r, out_w, err_w):
            os.close(fd)
        for fd in (in_w, out_r, err_r):
            os.set_blocking(fd, False)
        child = Child(rid, pid, in_w, out_r, err_r)
        child.pending += stdin
        self.children[rid] = child
        self.feed(child)
        return None

    def feed(self, child: Child) -> None:
        try:
            while child.pending:
                del child.pending[:os.write(child.stdin, child.pending[:READ])]
        except BlockingIOError:
            return
        except OSError:
            child.pending.clear()  # it closed its stdin: the rest is dropped, as a pipe drops it
        if not child.pending:
            os.close(child.stdin)
            child.stdin = None

    def pump(self, child: Child, fd: int) -> None:
        try:
            data = os.read(fd, READ)
        except BlockingIOError:
            return
        if data:
            self.send(child.open[fd], child.rid, data)
        else:
            os.close(fd)
            del child.open[fd]

    def reap(self) -> None:
        for child in list(self.children.values()):
            if child.status is None:
                try:
                    pid, status = os.waitpid(child.pid, os.WNOHANG)
                except ChildProcessError:
                    pid, status = child.pid, 255 << 8
                if pid:
                    child.status = status
            if child.status is not None and not child.open:
                if child.stdin is not None:
                    os.close(child.stdin)
                del self.children[child.rid]
                self.send(EXIT, child.rid, json.dumps(exit_doc(child.status)).encode())

    def shutdown(self) -> None:
        for child in self.children.values():
            _killpg(child.pid)
        for child in self.children.values():
            with _quiet():
                os.waitpid(child.pid, 0)


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, value, tb) -> bool:  # noqa: ANN001
        return kind is not None and issubclass(kind, OSError)


class _quiet_any(_quiet):
    def __exit__(self, kind, value, tb) -> bool:  # noqa: ANN001
        return kind is not None and issubclass(kind, Exception)


class _quiet_import(_quiet):
    def __exit__(self, kind, value, tb) -> bool:  # noqa: ANN001
        return kind is not None and issubclass(kind, ImportError)


def _killpg(pid: int) -> None:
    with _quiet():
        os.killpg(pid, signal.SIGKILL)


def become(job, runner_globals: dict) -> None:  # noqa: ANN001
    """In the forked child: turn into `PYTHON -c SRC ARGS...` and run it. Returns normally (exit 0) or raises
    SystemExit; finish() then ends the child as the interpreter would have ended `-c`."""
    req, in_r, out_w, err_w = job
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    with _quiet():
        os.setpgid(0, 0)
    for fd, to in ((in_r, 0), (out_w, 1), (err_w, 2)):
        os.dup2(fd, to)
    os.closerange(3, os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 65536)
    src, args = req["src"], [str(a) for a in req["args"]]
    sys.argv = ["-c", *args]
    sys.orig_argv = [sys.executable, "-c", src, *args]
    main = type(sys)("__main__")
    main.__dict__.update({"__doc__": None, "__package__": None, "__loader__": runner_globals.get("__loader__"),
                          "__spec__": None, "__annotations__": {}, "__builtins__": builtins})
    sys.modules["__main__"] = main
    try:
        code = compile(src, "<string>", "exec", dont_inherit=True)
        exec(code, main.__dict__)  # noqa: S102 - the program the master was asked to run
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 - printed as the interpreter prints an uncaught one
        tb = e.__traceback__.tb_next if e.__traceback__ is not None else None  # without this function's frame
        sys.excepthook(type(e), e.with_traceback(tb), tb)
        if isinstance(e, KeyboardInterrupt):
            sys.stdout.flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        raise SystemExit(1) from None


def main() -> None:
    for name in PRELOAD:
        with _quiet_import():
            __import__(name)
    gc.freeze()  # what is loaded now: a child's collections leave those shared pages alone
    try:
        job = Server().serve()
    except OSError as e:
        if e.errno != errno.EPIPE:
            os.write(2, f"runner: {e}\n".encode())
        job = None
    if job is None:
        os._exit(0)
    try:
        become(job, globals())
        code = 0
    except SystemExit as e:
        code = exit_code(e)
    finish(code)


def exit_code(e: SystemExit) -> int:
    """What the interpreter makes of an uncaught SystemExit: None is 0, an int itself, anything else printed to
    stderr and 1."""
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    with _quiet_any():
        sys.stderr.write(f"{e.code}\n")
    return 1


def finish(code: int) -> None:
    """End the child the way the interpreter ends `-c`, less the teardown that costs a forked child most of its
    time (measured: 32 ms a request against 12 ms, the collector and every refcount touching pages the runner
    shares with it): non-daemon threads joined, atexit run, stdout and stderr flushed, then what `__main__` alone
    holds released (an unclosed file of the program's flushes), stdout/stderr once more, and os._exit. A flush that
    fails falls back to the interpreter's own ending, so it reports it (exit 120) as it always has."""
    threading = sys.modules.get("threading")
    if threading is not None:
        threading._shutdown()
    import atexit

    atexit._run_exitfuncs()  # it clears them: the fallback below does not run them twice
    if _flushed():
        main = sys.modules.get("__main__")
        if main is not None:
            main.__dict__.clear()
        gc.collect()
        if _flushed():
            os._exit(code & 0xFF)
    raise SystemExit(code)


def _flushed() -> bool:
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None and not getattr(stream, "closed", False):
                stream.flush()
    except Exception:  # noqa: BLE001 - any failure: the interpreter's ending says what it was
        return False
    return True


if __name__ == "__main__":
    main()
