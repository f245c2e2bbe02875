"""The command server (dflashctl/cmdserver.py, cmdclient.py): the same bytes and exit codes as a normal run, the
environment read per call, stale code noticed, one server per user started in the background, its socket and
permissions, signals forwarded, a dying client or a crashing child handled. Real processes throughout: the console
script or a small client wrapper, a real server in a state directory of each test's own, stopped at teardown.
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import json
import marshal
import os
import pty
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import termios
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from harness.foreground import FOREGROUND

from dflashctl import cmdclient

REPO = Path(__file__).resolve().parents[2]
DFLASHCTL = Path(sys.executable).parent / "dflashctl"
NOT_SERVED = 97  # the wrapper's code when cmdclient.run declined (no server, or a stale one): nothing ran
WRAPPER = ("import sys\nfrom dflashctl import cmdclient\ncode = cmdclient.run(sys.argv[1:])\n"
           f"sys.exit({NOT_SERVED} if code is None else code)\n")
# what a one-shot status reports about the clock: the only bytes allowed to differ between two calls
_AGE = re.compile(rb"\b\d+(?:s|m\d\ds|h\d\dm|d\d\dh)\b")  # cli.common.age: `last log 6s ago`, a runs table's age
_CLOCK = re.compile(rb'"(time|seconds_since_log|seconds_since_progress)": [-0-9.e+]+')


def wait_for(cond: Callable[[], object], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def alive(pid: int) -> bool:
    try:
        return b"dflashctl.cmdserver" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def servers(folder: Path) -> list[int]:
    """Pids of the command servers started for this folder (their argv names it)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if any(b"dflashctl.cmdserver" in a for a in argv) and os.fsencode(str(folder)) in argv:
                found.append(int(proc.name))
    return found


@dataclass
class ServerEnv:
    folder: Path
    env: dict[str, str]
    cwd: Path

    def client(self, *argv: str, env: dict[str, str] | None = None, **kw: object) -> subprocess.CompletedProcess:
        """The real client (cmdclient.run) in a new process: the child's code, or NOT_SERVED."""
        return subprocess.run([sys.executable, "-c", WRAPPER, *argv], env=env or self.env, cwd=self.cwd,
                              capture_output=True, timeout=120, **kw)

    def normal(self, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """The console script with the server off."""
        return subprocess.run([str(DFLASHCTL), *argv], env={**(env or self.env), "DFLASHCTL_NO_SERVER": "1"},
                              cwd=self.cwd, capture_output=True, timeout=120)

    def file(self, ext: str) -> Path:
        """The server's NAME.ext (the tests' clients share one interpreter set-up: one NAME at a time)."""
        found = [p for p in self.folder.glob(f"*.{ext}") if not p.name.startswith(".")] if self.folder.is_dir() else []
        assert len(found) <= 1, found
        return found[0] if found else self.folder / f"none.{ext}"

    def info(self) -> dict:
        try:
            return json.loads(self.file("json").read_text())
        except (OSError, ValueError):
            return {}

    def up(self) -> int:
        """Wait until a server listens; its pid."""
        wait_for(lambda: alive(self.info().get("pid") or 0) and cmdclient.dial(self.file("sock")) is not None,
                 "the command server to listen")
        return int(self.info()["pid"])

    def served(self, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """Through a server: started by the first call if none runs (that call runs nothing and says so)."""
        p = self.client(*argv, env=env)
        if p.returncode == NOT_SERVED and not p.stdout and not p.stderr:
            self.up()
            p = self.client(*argv, env=env)
        assert p.returncode != NOT_SERVED, p
        return p


def finished_run(ws: Path, run_id: str = "20261201-120000-done") -> None:
    run = ws / "runs" / run_id
    run.mkdir(parents=True)
    (run / "meta.json").write_text(json.dumps({"id": run_id, "name": "done"}))
    (run / "train.log").write_text("step=1 loss=1.0 tok/s=10.0\ntraining finished\n")
    (run / "exit_code").write_text("0\n")
    (run.parent / "latest").symlink_to(run.name)


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[ServerEnv]:
    state = Path(tempfile.mkdtemp(prefix="dfc-", dir="/tmp"))  # short: a UNIX socket's path has ~107 bytes
    folder = state / "cmdserver"
    finished_run(tmp_path / "ws")
    (tmp_path / "hosts.toml").write_text('default = "here"\n[hosts.here]\ntransport = "local"\nworkspace = "ws"\n')
    env = {k: v for k, v in os.environ.items() if k not in ("DFLASHCTL_NO_SERVER", "DFLASHCTL_HOSTS")}
    env.update(DFLASHCTL_STATE_DIR=str(state), PYTHONPATH=str(REPO))
    try:
        yield ServerEnv(folder, env, tmp_path)
    finally:
        cmdclient.stop(folder)
        from dflashctl.remote.masterclient import end_master, list_masters

        for m in list_masters(state / "masters"):  # what an ssh test started through the server's children
            end_master(m)
        for pid in servers(folder):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(state, ignore_errors=True)


# -- nothing differs ------------------------------------------------------------------------------------------------
CASES = {
    "ok status": ("status", "--json"),
    "ok runs": ("runs", "--json"),
    "missing run": ("status", "nope", "--json"),
    "bad option": ("status", "--json", "--bogus"),
    "config error": ("status", "--json", "--hosts", "missing.toml"),
    "status table": ("status",),
    "runs table": ("runs",),
    "missing run, table": ("status", "nope"),
    "every host": ("status", "--all"),
}


def _timeless(out: bytes) -> bytes:
    """Output with what the clock decides masked: a second apart, `5s ago` is `6s ago` (and a column one wider)."""
    return re.sub(rb" +", b" ", _AGE.sub(b"AGE", _CLOCK.sub(b"CLOCK", out)))


def test_the_same_bytes_and_exit_codes_with_and_without_the_server(srv: ServerEnv) -> None:
    got = {}
    for name, argv in CASES.items():
        a, b = srv.served(*argv), srv.normal(*argv)
        got[name] = (a.returncode, b.returncode)
        assert _timeless(a.stdout) == _timeless(b.stdout), name
        assert a.stderr == b.stderr, name
        assert a.returncode == b.returncode, name
    assert got == {"ok status": (0, 0), "ok runs": (0, 0), "missing run": (102, 102), "bad option": (2, 2),
                   "config error": (2, 2), "status table": (0, 0), "runs table": (0, 0),
                   "missing run, table": (102, 102), "every host": (0, 0)}
    assert b"FINISHED" in srv.served("status").stdout
    assert srv.normal("status", "nope", "--json").stderr.startswith(b"ERROR: run 'nope'")


def test_a_terminal_gets_the_same_bytes_colour_and_width_included(srv: ServerEnv) -> None:
    """stdout and stderr on a terminal (80 columns): rich sees a tty, its size and colours as in a normal run."""
    def on_pty(run: Callable[..., subprocess.CompletedProcess], *argv: str) -> tuple[int, bytes]:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        try:
            p = run(*argv, stdout=slave, stderr=slave)
        finally:
            os.close(slave)
        out = b""
        with contextlib.suppress(OSError):  # EIO: the terminal's other side has closed
            while chunk := os.read(master, 65536):
                out += chunk
        os.close(master)
        return p.returncode, out

    def client(*argv: str, **kw: object) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", WRAPPER, *argv], env=srv.env, cwd=srv.cwd, timeout=120, **kw)

    def normal(*argv: str, **kw: object) -> subprocess.CompletedProcess:
        return subprocess.run([str(DFLASHCTL), *argv], env={**srv.env, "DFLASHCTL_NO_SERVER": "1"}, cwd=srv.cwd,
                              timeout=120, **kw)

    srv.served("runs", "--json")
    srv.up()
    for argv in (("status", "nope", "--json"), ("status", "--json", "--bogus"), ("status",), ("runs",)):
        served, plain = on_pty(client, *argv), on_pty(normal, *argv)
        assert (served[0], _timeless(served[1])) == (plain[0], _timeless(plain[1])) and served[0] != NOT_SERVED, argv
        assert b"\x1b[" in served[1], served  # coloured: the child's stdout and stderr are a terminal
    assert b"FINISHED" in on_pty(client, "status")[1]  # the table itself, served


def test_over_ssh_through_a_warm_master_and_known_hosts_read_per_call(srv: ServerEnv, pve, tmp_path: Path) -> None:  # noqa: ANN001
    """The real sshd, a connection master, the server's children: the same as a normal run; then a known_hosts
    without the host's key, through the same server: refused exactly as a normal run refuses."""
    hosts = tmp_path / "persist.toml"
    hosts.write_text(pve.hosts_file.read_text().replace("persist = 0\n", "persist = 120\n"))
    env = {**srv.env, **pve.env, "DFLASHCTL_HOSTS": str(hosts)}
    for argv in (("runs", "--json"), ("status", "nope", "--json")):
        a, b = srv.served(*argv, env=env), srv.normal(*argv, env=env)
        assert (a.returncode, _CLOCK.sub(b"", a.stdout), a.stderr) == (b.returncode, _CLOCK.sub(b"", b.stdout),
                                                                       b.stderr), argv
    assert b.returncode == 102 and b"nope" in b.stderr
    pid = srv.info()["pid"]
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    env = {**env, "DFLASHCTL_KNOWN_HOSTS": str(empty)}
    a, b = srv.served("runs", "--json", env=env), srv.normal("runs", "--json", env=env)
    assert (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr)
    assert a.returncode == 2 and str(empty).encode() in a.stderr, a
    assert srv.info()["pid"] == pid
    assert "Threads:\t1\n" in Path(f"/proc/{pid}/status").read_text()  # it forks: it never has a second thread


def test_the_console_script_goes_through_the_server_and_leaves_one_started(srv: ServerEnv) -> None:
    first = subprocess.run([str(DFLASHCTL), "status", "--json"], env=srv.env, cwd=srv.cwd, capture_output=True,
                           timeout=120)
    assert first.returncode == 0 and json.loads(first.stdout)["verdict"] == "finished"
    pid = srv.up()  # the first call ran normally and left a server starting
    again = subprocess.run([str(DFLASHCTL), "status", "--json"], env=srv.env, cwd=srv.cwd, capture_output=True,
                           timeout=120)
    assert again.returncode == 0 and _CLOCK.sub(b"", again.stdout) == _CLOCK.sub(b"", first.stdout)
    assert alive(pid) and srv.info()["pid"] == pid


def test_the_environment_is_the_clients_on_every_call_through_one_server(srv: ServerEnv, tmp_path: Path) -> None:
    """HOME (where the default hosts.toml is found), DFLASHCTL_HOSTS, TMPDIR, the cwd and the umask change between
    calls through one server, and each call sees its own."""
    homes = {}
    for name in ("alpha", "beta"):
        home = tmp_path / f"home-{name}"
        (home / ".config" / "dflashctl").mkdir(parents=True)
        (home / ".config" / "dflashctl" / "hosts.toml").write_text(
            f'default = "{name}"\n[hosts.{name}]\ntransport = "local"\nworkspace = "{tmp_path / "ws"}"\n')
        homes[name] = home
    away = tmp_path / "elsewhere"  # no hosts.toml in the cwd: the search goes on to ~/.config
    away.mkdir()
    srv.cwd = away
    base = {k: v for k, v in srv.env.items() if k not in ("XDG_CONFIG_HOME",)}
    pid = None
    for name in ("alpha", "beta", "alpha"):
        p = srv.served("status", "--json", env={**base, "HOME": str(homes[name])})
        assert p.returncode == 0 and json.loads(p.stdout)["host"] == name, p
        pid = pid or srv.info()["pid"]
        assert srv.info()["pid"] == pid  # one server answered all three
    explicit = tmp_path / "explicit.toml"
    explicit.write_text(f'default = "gamma"\n[hosts.gamma]\ntransport = "local"\nworkspace = "{tmp_path / "ws"}"\n')
    p = srv.served("status", "--json", env={**base, "HOME": str(homes["alpha"]), "DFLASHCTL_HOSTS": str(explicit)})
    assert json.loads(p.stdout)["host"] == "gamma"
    p = srv.served("status", "--json", env={**base, "HOME": str(homes["alpha"]),
                                            "DFLASHCTL_HOSTS": str(tmp_path / "gone.toml")})
    assert p.returncode == 2 and b"gone.toml (from $DFLASHCTL_HOSTS) does not exist" in p.stderr
    assert srv.info()["pid"] == pid


def test_a_server_of_other_code_says_stale_exits_and_the_command_runs_normally(srv: ServerEnv, tmp_path: Path) -> None:
    """An edited module (in a copy of the package, so that nobody else's tree changes): the next call finds the
    server's key is another, the server exits, the command runs in its own process and is right."""
    copy = tmp_path / "copy"
    shutil.copytree(REPO / "dflashctl", copy / "dflashctl", ignore=shutil.ignore_patterns("__pycache__"))
    env = {**srv.env, "PYTHONPATH": str(copy)}
    srv.served("status", "--json", env=env)
    pid = srv.up()
    with (copy / "dflashctl" / "config.py").open("a") as f:
        f.write("\n# edited\n")
    p = srv.client("status", "--json", env=env)
    assert (p.returncode, p.stdout, p.stderr) == (NOT_SERVED, b"", b"")  # declined, nothing ran
    wait_for(lambda: not alive(pid), "the stale server to exit")
    served = srv.served("status", "--json", env=env)  # a new server, of the edited code
    assert served.returncode == 0 and srv.info()["pid"] != pid


def test_two_interpreter_set_ups_get_a_server_each_instead_of_replacing_each_others(srv: ServerEnv) -> None:
    """The console script and `python -c` (another sys.path), or other flags: a server each, both kept."""
    srv.served("runs", "--json")
    first = srv.up()
    other = [sys.executable, "-X", "dev", "-c", WRAPPER, "runs", "--json"]  # the same client under other flags
    assert subprocess.run(other, env=srv.env, cwd=srv.cwd, capture_output=True, timeout=120).returncode == NOT_SERVED
    wait_for(lambda: len([p for p in srv.folder.glob("*.sock") if cmdclient.dial(p)]) == 2, "a second server")
    p = subprocess.run(other, env=srv.env, cwd=srv.cwd, capture_output=True, timeout=120)
    assert p.returncode == 0 and json.loads(p.stdout)["runs"]
    assert srv.client("runs", "--json").returncode == 0
    assert alive(first) and len(servers(srv.folder)) == 2


def test_a_request_with_another_key_is_refused_before_anything_runs(srv: ServerEnv) -> None:
    srv.served("runs", "--json")
    pid = srv.up()
    for junk in (marshal.dumps(["not", "a", "dict"]), b"\xff not marshal"):  # hung up on, and the server goes on
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(srv.file("sock")))
            s.sendall(struct.pack(">I", len(junk)) + junk)
            s.settimeout(30)
            assert s.recv(100) == b""
    assert srv.served("runs", "--json").returncode == 0 and alive(pid)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(srv.file("sock")))
        cmdclient.send_doc(s, {"op": "run", "key": "not-our-key", "argv": ["dflashctl", "runs", "--json"]})
        assert cmdclient.read_frames(s, bytearray()) == [{"stale": True}]
    wait_for(lambda: not alive(pid), "the server to exit")
    assert not srv.file("sock").exists()


# -- start, idle, socket --------------------------------------------------------------------------------------------
def test_permissions_and_two_starts_at_once_make_one_server(srv: ServerEnv) -> None:
    procs = [subprocess.Popen([sys.executable, "-c", WRAPPER, "runs", "--json"], env=srv.env, cwd=srv.cwd,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(4)]
    codes = [p.wait(timeout=120) for p in procs]  # those that found no server would run normally (one may be late)
    assert set(codes) <= {NOT_SERVED, 0} and NOT_SERVED in codes, codes
    pid = srv.up()
    wait_for(lambda: servers(srv.folder) == [pid], "the losers of the start to exit")
    assert srv.folder.stat().st_mode & 0o777 == 0o700
    for ext in ("sock", "json", "lock", "log"):
        assert srv.file(ext).stat().st_mode & 0o777 == 0o600, ext
    ppid = int(re.search(r"PPid:\s+(\d+)", Path(f"/proc/{pid}/status").read_text()).group(1))
    assert ppid != os.getpid() and os.getsid(pid) != os.getsid(0)  # detached: nobody's child here, its own session


def test_the_server_exits_when_idle_and_when_its_socket_is_removed(srv: ServerEnv) -> None:
    assert srv.client("runs", "--json", env={**srv.env, "DFLASHCTL_SERVER_IDLE_S": "0.5"}).returncode == NOT_SERVED
    log = srv.file("log")  # made by the start, before the server runs
    wait_for(lambda: "exits (idle)" in log.read_text(), "the idle server to say it exits")
    wait_for(lambda: servers(srv.folder) == [], "the idle server to be gone")
    assert not srv.file("sock").exists()
    srv.served("runs", "--json")
    pid = srv.up()
    srv.file("sock").unlink()
    wait_for(lambda: not alive(pid), "the server whose socket went to exit")


def test_a_socket_with_no_listener_is_replaced(srv: ServerEnv) -> None:
    srv.served("runs", "--json")
    pid = srv.up()
    sock = srv.file("sock")
    os.kill(pid, signal.SIGKILL)  # killed outright: its socket file stays, nobody listening
    wait_for(lambda: not alive(pid), "the server to die")
    sock.unlink()
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(sock))
    dead.close()  # a socket file, nobody listening
    p = srv.client("runs", "--json")
    assert p.returncode == NOT_SERVED and not p.stderr
    assert srv.up() != pid and srv.file("sock") == sock
    assert srv.served("runs", "--json").returncode == 0


def test_off_with_no_server_and_for_commands_that_are_not_eligible(srv: ServerEnv) -> None:
    p = srv.client("status", "--json", env={**srv.env, "DFLASHCTL_NO_SERVER": "1"})
    assert p.returncode == NOT_SERVED and not srv.folder.exists()
    for argv in (["status", "--watch"], ["status", "--json", "--watch"], ["status", "--json", "-w"],
                 ["status", "-jw", "--json"], ["status", "-w"], ["logs", "--json"], ["logs"],
                 ["status", "--json", "--help"], ["status", "-h"], ["status", "--json", "--", "x"], ["--json"], []):
        assert not cmdclient.eligible(argv), argv
    for argv in (["status", "--json"], ["status", "RUN", "--json", "-H", "pve", "-i", "2"], ["runs", "--json"],
                 ["status"], ["status", "RUN", "-H", "pve"], ["runs"], ["status", "--all"]):
        assert cmdclient.eligible(argv), argv
    assert srv.client("logs").returncode == NOT_SERVED and not srv.folder.exists()
    bare = {k: v for k, v in srv.env.items() if k not in ("DFLASHCTL_STATE_DIR", "XDG_RUNTIME_DIR")}
    p = srv.client("runs", "--json", env={**bare, "HOME": "rel"})  # only a relative home: no server, nothing made
    assert p.returncode == NOT_SERVED and not (srv.cwd / "rel").exists()
    assert cmdclient.server_dir({"HOME": "/h"}) == "/h/.cache/dflashctl/cmdserver"
    assert cmdclient.server_dir({"XDG_RUNTIME_DIR": "/run/user/7"}) == "/run/user/7/dflashctl/cmdserver"


def test_hosts_disconnect_ends_the_server(srv: ServerEnv) -> None:
    srv.served("runs", "--json")
    pid = srv.up()
    p = srv.normal("hosts", "disconnect")
    assert p.returncode == 0 and f"ended the command server (pid {pid})".encode() in p.stdout, p
    assert not alive(pid) and not srv.file("sock").exists()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to connect as another user")
def test_another_users_connection_gets_nothing(srv: ServerEnv) -> None:
    srv.served("runs", "--json")
    pid = srv.up()
    for path in (srv.folder.parent, srv.folder):
        os.chmod(path, 0o755)
    os.chmod(srv.file("sock"), 0o666)  # as if the permissions had been opened: the uid check still holds
    code = ("import os, socket, sys\nsys.path.insert(0, sys.argv[2])\nfrom dflashctl import cmdclient\n"
            "os.setgid(65534); os.setuid(65534)  # imports done: now as nobody\n"
            "s = socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\ns.settimeout(30)\n"
            "try:\n    cmdclient.send_doc(s, {'op': 'quit'})\n    got = s.recv(100)\n"
            "except (BrokenPipeError, ConnectionResetError):\n    got = b''  # hung up on before a byte was read\n"
            "sys.exit(0 if got == b'' else 1)\n")
    done = subprocess.run([sys.executable, "-c", code, str(srv.file("sock")), str(REPO)], timeout=60,
                          capture_output=True)
    assert done.returncode == 0, done.stderr
    for path in (srv.folder.parent, srv.folder):
        os.chmod(path, 0o700)
    assert alive(pid) and srv.served("runs", "--json").returncode == 0


# -- signals, a dying client, a crashing child ----------------------------------------------------------------------
@pytest.fixture
def hanging(srv: ServerEnv, tmp_path: Path) -> Iterator[Path]:
    """hosts.toml whose local host's python hangs (writes its pid and parent's pid, then sleeps): the status waits."""
    py = tmp_path / "hang-python"
    py.write_text(f'#!/bin/sh\ncd "{tmp_path}"\necho "$$ $PPID" > ".tmp.$$"\nmv ".tmp.$$" "started.$$"\n'
                  'exec sleep 600\n')  # renamed into place: a marker seen is a marker written
    py.chmod(0o755)
    hosts = tmp_path / "hang.toml"
    hosts.write_text(f'default = "here"\n[hosts.here]\ntransport = "local"\nworkspace = "ws"\npython = "{py}"\n')
    yield hosts
    for marker in tmp_path.glob("started.*"):
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(marker.read_text().split()[0]), signal.SIGKILL)


def _start_hanging(srv: ServerEnv, tmp_path: Path, hosts: Path, served: bool, start: list[str] = FOREGROUND,
                   **popen: object) -> tuple[subprocess.Popen, int]:
    """The status command, waiting on its probe; (the client process, the pid of the process running the CLI).
    start: the argv prefix that sets the client's signal dispositions (a terminal's foreground job's by default)."""
    for m in tmp_path.glob("started.*"):
        m.unlink()
    argv = [sys.executable, "-c", WRAPPER] if served else [str(DFLASHCTL)]
    env = srv.env if served else {**srv.env, "DFLASHCTL_NO_SERVER": "1"}
    p = subprocess.Popen([*start, *argv, "status", "--json", "--hosts", str(hosts)], env=env, cwd=srv.cwd,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)
    wait_for(lambda: list(tmp_path.glob("started.*")), "the probe to start")
    cli_pid = int(next(tmp_path.glob("started.*")).read_text().split()[1])
    assert (cli_pid != p.pid) is served  # through the server, the CLI runs in the server's child
    return p, cli_pid


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_client_reaches_the_child_and_ends_as_a_normal_run(srv: ServerEnv, tmp_path: Path,
                                                                           hanging: Path, signum: int) -> None:
    srv.served("runs", "--json")
    srv.up()
    ends = []
    for served in (True, False):
        p, _ = _start_hanging(srv, tmp_path, hanging, served)
        p.send_signal(signum)
        out, err = p.communicate(timeout=60)
        ends.append((p.returncode, out, err))
    assert ends[0] == ends[1]
    assert ends[0][0] == (130 if signum == signal.SIGINT else -signal.SIGTERM), ends


TERMINAL_SIGNALS = sum(1 << (s - 1) for s in (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGHUP))


def _dispositions(pid: int) -> tuple[int, int]:
    """(ignored, caught) among the terminal's signals, from /proc/PID/status (SigIgn, SigCgt)."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
    return int(fields["SigIgn"], 16) & TERMINAL_SIGNALS, int(fields["SigCgt"], 16) & TERMINAL_SIGNALS


@pytest.mark.parametrize("start", [FOREGROUND, ["env", "--ignore-signal=INT,HUP"]], ids=["foreground", "nohup-like"])
def test_the_child_ignores_the_signals_its_client_ignores_and_no_others(srv: ServerEnv, tmp_path: Path,
                                                                        hanging: Path, start: list[str]) -> None:
    """A client started under nohup or by a shell's `&` ignores some signals: the CLI it runs must too, as the CLI
    run in the client's own process does (the child used to reset them all)."""
    srv.served("runs", "--json")
    srv.up()
    seen = []
    for served in (True, False):
        p, cli = _start_hanging(srv, tmp_path, hanging, served, start)
        seen.append(_dispositions(cli))
        p.send_signal(signal.SIGTERM)  # forwarded to a served child, as a terminal's would reach the CLI
        p.communicate(timeout=60)
    assert seen[0] == seen[1], [tuple(f"{m:#x}" for m in d) for d in seen]
    assert bool(seen[0][0] & (1 << (signal.SIGINT - 1))) is (start != FOREGROUND)


def test_a_client_that_dies_takes_its_child_with_it(srv: ServerEnv, tmp_path: Path, hanging: Path) -> None:
    """...and the child ran with the client's niceness and CPUs, not the server's."""
    srv.served("runs", "--json")
    pid = srv.up()
    cpus = sorted(os.sched_getaffinity(0))[:1]
    p, child = _start_hanging(srv, tmp_path, hanging, served=True,
                              preexec_fn=lambda: (os.nice(7), os.sched_setaffinity(0, cpus)))
    assert os.getpriority(os.PRIO_PROCESS, child) == os.getpriority(os.PRIO_PROCESS, 0) + 7
    assert sorted(os.sched_getaffinity(child)) == cpus
    assert os.getpriority(os.PRIO_PROCESS, pid) == os.getpriority(os.PRIO_PROCESS, 0)
    p.kill()
    p.wait(timeout=60)
    wait_for(lambda: not Path(f"/proc/{child}").exists(), "the orphaned child to stop")
    assert alive(pid)  # the server goes on


def test_a_child_killed_by_a_signal_gives_one_line_and_128_plus_the_signal(srv: ServerEnv, tmp_path: Path,
                                                                           hanging: Path) -> None:
    srv.served("runs", "--json")
    pid = srv.up()
    p, child = _start_hanging(srv, tmp_path, hanging, served=True)
    os.kill(child, signal.SIGSEGV)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGSEGV and out == b""
    assert err.count(b"\n") == 1 and err.startswith(b"ERROR: the command was killed by SIGSEGV"), err
    assert alive(pid) and srv.served("runs", "--json").returncode == 0


def test_a_server_told_to_quit_takes_no_new_command_and_finishes_those_in_flight(srv: ServerEnv, tmp_path: Path,
                                                                                 hanging: Path) -> None:
    srv.served("runs", "--json")
    pid = srv.up()
    p, _ = _start_hanging(srv, tmp_path, hanging, served=True)
    assert cmdclient.stop(srv.folder, timeout=1) == [pid]  # asked to quit: it answers, then waits for its child
    wait_for(lambda: not srv.file("sock").exists(), "the quitting server's socket to go")
    assert alive(pid)  # the command in flight still has its server: its signals still reach it
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=60) == 130
    wait_for(lambda: not alive(pid), "the server to exit once its last command ended")


def test_a_served_command_costs_the_client_no_typer_no_rich_and_four_of_our_modules(srv: ServerEnv) -> None:
    """The client path is stdlib-only (entry, helpcache, cmdclient): typer and the rest stay in the server. And only
    modules the interpreter starts with or has built in: no re, json, pathlib, socket, enum or hashlib (each costs
    milliseconds at every start; the list is printed with repr, so that the check imports none of them itself)."""
    code = ("import sys\nsys.argv = ['dflashctl', *sys.argv[1:]]\nfrom dflashctl.entry import main\n"
            "rc = main()\nsys.stderr.write('\\nMODULES ' + repr(sorted(sys.modules)) + '\\n')\nsys.exit(rc)\n")

    def call() -> tuple[int, bytes, set[str]]:
        p = subprocess.run([sys.executable, "-c", code, "runs", "--json"], env=srv.env, cwd=srv.cwd,
                           capture_output=True, timeout=120)
        line = next(ln for ln in p.stderr.splitlines() if ln.startswith(b"MODULES "))
        return p.returncode, p.stdout, set(ast.literal_eval(line[8:].decode()))

    rc, out, mods = call()  # no server yet: the normal way (typer), and a server left starting
    assert rc == 0 and "typer" in mods
    srv.up()
    rc2, out2, mods = call()
    assert (rc2, out2) == (rc, out)
    assert sorted(m for m in mods if m.startswith("dflashctl")) == ["dflashctl", "dflashctl.cmdclient",
                                                                   "dflashctl.entry", "dflashctl.helpcache"]
    assert not {m for m in mods if m.split(".")[0] in ("typer", "rich", "paramiko", "subprocess", "click")}
    assert not {m for m in mods if m.split(".")[0] in ("re", "json", "pathlib", "socket", "enum", "hashlib", "typing",
                                                       "contextlib", "signal")}
