"""Resident runners behind the ssh connection master (remote/runnerlink.py, agent/runner.py), against the real sshd
and `pct` stand-in: a one-shot `[pct exec CT --] PYTHON -c SRC ARGS...` gives byte for byte what a channel gives,
streams keep their channel, a runner that cannot start or dies sends requests to channels, timeouts and hang-ups
kill the child's group, two requests at once, and no runner outlives its master or shows as a zombie."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from harness.envs import PveEnv
from harness.poll import wait_until
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dflashctl.errors import ConnectFailed, RemoteTimeout
from dflashctl.remote import connect
from dflashctl.remote.runnerlink import route
from dflashctl.remote.target import Target

REPO = Path(__file__).resolve().parents[2]
MARK = "dflash-runner-test"


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def runner_pids(sshd_pid: int | None = None) -> list[int]:
    """The live runner interpreters (by the runner's -c source) below this test session's sshd (another
    pytest worker has its own sshd and its own runners)."""
    sshd_pid = sshd_pid or SSHD[0]
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rsplit(") ", 1)[1][0]
        except (OSError, IndexError):
            continue
        if state == "Z" or not argv[0].rsplit(b"/", 1)[-1].startswith(b"python") or \
                not any(b"A resident fork-server" in a for a in argv):
            continue
        pid = int(proc.name)
        while pid > 1 and pid != sshd_pid:
            pid = _ppid(pid)
        if pid == sshd_pid:
            found.append(int(proc.name))
    return found


SSHD: list[int] = [0]


@pytest.fixture(autouse=True)
def _sshd_pid(sshd_server) -> None:  # noqa: ANN001
    SSHD[0] = sshd_server.proc.pid


@pytest.fixture
def pair(pve: PveEnv, fresh_masters: Path) -> Iterator[tuple[Target, Target]]:
    """The same container through a master (runners) and in-process (channels only)."""
    with connect(replace(pve.host, persist_s=300.0)) as master, connect(pve.host) as plain:
        assert type(master.transport).__name__ == "MasterTransport"
        yield master, plain


def test_route_takes_only_python_dash_c_in_the_host_or_a_container() -> None:
    assert route(["python3", "-c", "S", "a"]) == (("python3",), "S", ["a"])
    assert route(["pct", "exec", "101", "--", "/usr/bin/python3.11", "-c", "S"]) == \
        (("pct", "exec", "101", "--", "/usr/bin/python3.11"), "S", [])
    for argv in (["python3", "-", "a"], ["bash", "-c", "S"], ["pct", "exec", "x", "--", "python3", "-c", "S"],
                 ["python3", "-u", "-c", "S"], ["pct", "status", "101"], ["python3", "-c"]):
        assert route(argv) is None, argv


PROGRAMS = [
    "import sys; print(sys.argv, sorted(globals())); sys.stdout.write(sys.stdin.read())",
    "import sys; sys.stderr.write('e' * 100000); print(len(sys.stdin.buffer.read())); sys.exit(3)",
    "1/0",
    "syntax error(",
    "import sys; sys.exit('bye')",
    "import os; os.kill(os.getpid(), 9)",
    "import os, sys; print(sorted(os.listdir('/proc/self/fd')), sys.stdin.read())",
    "import signal; print([signal.getsignal(s) for s in (signal.SIGCHLD, signal.SIGPIPE, signal.SIGTERM)])",
    "import atexit, threading, time; atexit.register(print, 'atexit'); "
    "threading.Thread(target=lambda: (time.sleep(0.2), print('thread'))).start()",
    # the runner's child skips the interpreter's teardown (agent/runner.py finish): what a teardown does still shows
    "f = open(1, 'w', closefd=False); print('first'); f.write('buffered, flushed when released at exit\\n')",
    "import os, sys; sys.stdout = open(os.dup(1), 'w', buffering=8192); print('lost'); os.close(sys.stdout.fileno())",
    # ^ stdout's flush at exit fails: the interpreter's message, and exit 120
    "import sys; sys.stdout.close(); sys.exit(256 + 7)",
]


@pytest.mark.parametrize("where", ["container", "host"])
def test_a_request_through_the_runner_gives_what_a_channel_gives(pair: tuple[Target, Target], where: str) -> None:
    master, plain = pair
    for src in PROGRAMS:
        for stdin in (None, b"", b"in\x00put\n" * 1000):
            if where == "container":
                a = master.run(["python3", "-c", src, "x y", "--z"], stdin=stdin, timeout=60)
                b = plain.run(["python3", "-c", src, "x y", "--z"], stdin=stdin, timeout=60)
            else:
                a = master.run_host(["python3", "-c", src, "x y", "--z"], stdin=stdin, timeout=60)
                b = plain.run_host(["python3", "-c", src, "x y", "--z"], stdin=stdin, timeout=60)
            assert (a.exit_code, a.stdout, a.stderr) == (b.exit_code, b.stdout, b.stderr), (src, stdin)
    assert runner_pids(), "no runner ran these"


DUMP = ("import sys; sys.stdout.buffer.write(b''.join(a.encode('utf-8', 'surrogateescape') + b'\\0' "
        "for a in sys.argv) + sys.stdin.buffer.read())")
SHELLY = st.sampled_from(list(" '\"$`\\\n\t;&|<>*?![]{}()~#=%-") + ["$(id)", "`id`", "${HOME}", "é", "日本", "\u202e"])
ARG = st.lists(st.one_of(SHELLY, st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")),
               max_size=24).map("".join)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(args=st.lists(ARG, max_size=8), stdin=st.one_of(st.none(), st.binary(max_size=2048)))
def test_any_argv_and_stdin_arrive_through_the_runner_as_through_a_channel(
        pair: tuple[Target, Target], args: list[str], stdin: bytes | None) -> None:
    master, plain = pair
    a = master.run(["python3", "-c", DUMP, *args], stdin=stdin, timeout=60)
    b = plain.run(["python3", "-c", DUMP, *args], stdin=stdin, timeout=60)
    assert (a.exit_code, a.stdout, a.stderr) == (b.exit_code, b.stdout, b.stderr)
    assert a.stdout == b"".join(x.encode() + b"\0" for x in ["-c", *args]) + (stdin or b"")


PARENT = ("import os\ntry:\n    print(b'A resident fork-server' in open(f'/proc/{os.getppid()}/cmdline', 'rb').read())"
          "\n"
          "except OSError:\n    print(False)  # a parent outside the container's pid namespace: pct's, not a runner")


def test_one_shot_requests_go_to_the_runner_and_streams_and_persist_0_keep_their_channel(
        pair: tuple[Target, Target]) -> None:
    master, plain = pair
    assert master.run(["python3", "-c", PARENT], timeout=60).stdout == b"True\n"
    assert master.run_host(["python3", "-c", PARENT], timeout=60).stdout == b"True\n"
    assert list(master.stream(["python3", "-c", PARENT])) == [b"False\n"]
    assert master.run(["python3", "-", "x"], stdin=PARENT.encode(), timeout=60).stdout == b"False\n"
    assert plain.run(["python3", "-c", PARENT], timeout=60).stdout == b"False\n"


def fake_python(tmp_path: Path, as_runner: str) -> Path:
    """A python3 that runs the shell line as_runner first when asked to be the runner, then (unless it exits) the
    real interpreter, as it does for everything else."""
    fake = tmp_path / "bin" / "python3"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/bash\ncase \"$*\" in *'A resident fork-server for'*) {as_runner};; esac\n"
                    f"exec {sys.executable} \"$@\"\n")
    fake.chmod(0o755)
    return fake


def test_a_place_whose_runner_cannot_start_runs_on_channels_and_is_not_retried_at_once(
        pair: tuple[Target, Target], pve: PveEnv, tmp_path: Path) -> None:
    """A python3 that refuses to be the runner (and logs each try) but runs everything else."""
    master, plain = pair
    log = tmp_path / "tries.log"
    fake = fake_python(tmp_path, f"echo try >> {log}; exit 1")
    for _ in range(3):
        a = master.run_host([str(fake), "-c", PARENT + "\nimport sys; sys.exit(4)"], timeout=60)
        b = plain.run_host([str(fake), "-c", PARENT + "\nimport sys; sys.exit(4)"], timeout=60)
        assert (a.exit_code, a.stdout, a.stderr) == (b.exit_code, b.stdout, b.stderr) == (4, b"False\n", b"")
    assert log.read_text() == "try\n"
    unknown = master.run_host(["pct", "status", "999999"], timeout=60)  # not routed at all: pct's own answer
    assert unknown.exit_code == 2 and b"does not exist" in unknown.stderr


def test_a_runner_slow_to_start_costs_no_request_its_time_and_serves_the_requests_after_it(
        pair: tuple[Target, Target], tmp_path: Path) -> None:
    """A python3 whose runner says hello only once a flag exists, and the first request is what makes the flag: it
    must run on a channel while the runner waits (it waited the runner's whole start before, then the place was
    refused), and the runner it started serves the next request."""
    master, _ = pair
    flag = tmp_path / "flag"
    fake = fake_python(tmp_path, f"while [ ! -e {flag} ]; do sleep 0.05; done")
    # timeout 24: it waits for the starting runner half of that (less than the runner's 20 s to say hello)
    first = master.run_host([str(fake), "-c", f"{PARENT}\nopen({str(flag)!r}, 'w')"], timeout=24)
    assert (first.exit_code, first.stdout) == (0, b"False\n")  # on a channel: no runner is its parent
    assert master.run_host([str(fake), "-c", PARENT], timeout=60).stdout == b"True\n"  # the runner, now ready


def test_a_stopped_container_gives_the_channels_error_through_the_master(pair: tuple[Target, Target],
                                                                        pve: PveEnv) -> None:
    master, plain = pair
    assert master.run(["python3", "-c", "pass"], timeout=60).ok
    pve.stop_container()
    a = master.transport.run(master.wrap(["python3", "-c", "print(1)"]), timeout=60)
    b = plain.transport.run(plain.wrap(["python3", "-c", "print(1)"]), timeout=60)
    assert (a.exit_code, a.stdout, a.stderr) == (b.exit_code, b.stdout, b.stderr) and a.exit_code != 0


def find(pattern: str) -> list[int]:
    """Live (not defunct) processes of this machine whose command line holds pattern."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes()
            state = (proc / "stat").read_text().rsplit(") ", 1)[1][0]
        except (OSError, IndexError):
            continue
        if state != "Z" and pattern.encode() in argv and b"A resident" not in argv and int(proc.name) != os.getpid():
            found.append(int(proc.name))
    return found


def sleeper(mark: str) -> str:
    """A program that starts a grandchild in its process group and sleeps. The grandchild carries mark in its
    command line (a runner's child, forked, not exec'd, shows the runner's)."""
    return (f"import subprocess, time; subprocess.Popen(['python3', '-c', 'import time; time.sleep(300)', '{mark}']); "
            "time.sleep(300)")


@pytest.mark.parametrize("where", ["container", "host"])
def test_a_timeout_kills_the_childs_whole_group_and_raises_remote_timeout(pair: tuple[Target, Target],
                                                                          where: str) -> None:
    master, _ = pair
    mark = f"{MARK}-timeout-{where}"
    run = master.run if where == "container" else master.run_host
    assert run(["python3", "-c", "pass"], timeout=60).ok  # the runner is up: the timeout below is the child's
    with pytest.raises(RemoteTimeout, match="timed out after 2s"):
        run(["python3", "-c", sleeper(mark), mark], timeout=2)
    wait_until(lambda: not find(mark), 30, "the timed-out child and its grandchild to be gone")
    assert run(["python3", "-c", "print(1)"], timeout=60).stdout == b"1\n"  # the runner serves on


def test_a_client_hang_up_kills_the_child(pair: tuple[Target, Target]) -> None:
    import socket

    from dflashctl.remote import masterwire as wire

    master, _ = pair
    mark = f"{MARK}-hangup"
    assert master.run(["python3", "-c", "pass"], timeout=60).ok
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(master.transport.place.sock))
    argv = master.wrap(["python3", "-c", sleeper(mark), mark])
    wire.send_json(sock, wire.REQUEST, {"op": "run", "argv": argv, "timeout": None, "stream": False, "stdin": False})
    wire.send(sock, wire.STDIN_END)
    wait_until(lambda: find(mark), 30, "the child's grandchild to run")
    sock.close()
    wait_until(lambda: not find(mark), 30, "the child of a client that hung up to be killed")


def test_two_requests_at_once_through_one_runner_both_finish(pair: tuple[Target, Target], pve: PveEnv) -> None:
    """The first waits for a file only the second creates: serialized requests would never both finish."""
    master, _ = pair
    flag = "/workspace/dflash/flag"
    waiter = (f"import os, time\nfor _ in range(1200):\n    if os.path.exists('{flag}'): break\n    time.sleep(0.05)\n"
              f"print(os.path.exists('{flag}'))")
    assert master.run(["python3", "-c", "pass"], timeout=60).ok
    got: list = []
    first = threading.Thread(target=lambda: got.append(master.run(["python3", "-c", waiter], timeout=120)))
    first.start()
    made = master.run(["python3", "-c", f"import os; os.makedirs('/workspace/dflash', exist_ok=True); "
                                        f"open('{flag}', 'w').close(); print('made')"], timeout=60)
    first.join(120)
    assert made.stdout == b"made\n" and got and got[0].stdout == b"True\n"


def runner_of(target: Target, host_side: bool) -> int:
    """The pid on this machine of the runner that serves target's host (or its container: another pid namespace)."""
    run = target.run_host if host_side else target.run
    assert run(["python3", "-c", "pass"], timeout=60).ok
    ours = os.readlink("/proc/self/ns/pid")
    for pid in runner_pids():
        with contextlib.suppress(OSError):
            if (os.readlink(f"/proc/{pid}/ns/pid") == ours) == host_side:
                return pid
    raise AssertionError("no runner found")


def test_a_runner_that_dies_fails_the_request_in_flight_and_the_next_one_starts_a_new_runner(
        pair: tuple[Target, Target]) -> None:
    master, _ = pair
    mark = f"{MARK}-dies"
    old = runner_of(master, host_side=True)
    errors: list = []

    def in_flight() -> None:
        try:
            master.run_host(["python3", "-c", sleeper(mark)], timeout=120)
        except ConnectFailed as e:
            errors.append(e)

    t = threading.Thread(target=in_flight)
    t.start()
    wait_until(lambda: find(mark), 30, "the request to run")
    os.kill(old, signal.SIGKILL)
    t.join(60)
    assert errors and "ssh connection lost" in errors[0].message
    for pid in find(mark):  # a runner killed outright cannot end its child: this test does
        os.kill(pid, signal.SIGKILL)
    res = master.run_host(["python3", "-c", PARENT], timeout=60)  # runs once: on a channel or a new runner
    assert res.exit_code == 0 and res.stdout in (b"True\n", b"False\n")
    new = wait_until(lambda: [p for p in runner_pids() if p != old] and master.run_host(
        ["python3", "-c", PARENT], timeout=60).stdout == b"True\n", 30, "a new runner")
    assert new and old not in runner_pids()


def test_disconnect_and_idle_exit_leave_no_runner_and_no_child(pve: PveEnv, fresh_masters: Path) -> None:
    from dflashctl.remote.masterclient import end_master, list_masters

    mark = f"{MARK}-disconnect"
    before = set(runner_pids())  # another test's, still ending or a session master's: not this test's to count
    for persist in (300.0, 2.0):
        with connect(replace(pve.host, persist_s=persist)) as master:
            assert master.run(["python3", "-c", PARENT], timeout=60).stdout == b"True\n"
            assert master.run_host(["python3", "-c", PARENT], timeout=60).stdout == b"True\n"
            assert len(set(runner_pids()) - before) == 2
            if persist > 100:
                t = threading.Thread(target=lambda: pytest.raises(
                    ConnectFailed, master.run, ["python3", "-c", sleeper(mark)], timeout=120))
                t.start()
                wait_until(lambda: find(mark), 30, "the request to run")
                for m in list_masters():
                    end_master(m)
                t.join(60)
        wait_until(lambda: not set(runner_pids()) - before and not find(mark), 60,
                   "runners and their children to be gone")


def test_kill_zombies_and_status_never_list_a_runner(pve: PveEnv, fresh_masters: Path, tmp_path: Path) -> None:
    hosts = tmp_path / "hosts-persist.toml"
    hosts.write_text(pve.hosts_file.read_text().replace("persist = 0", "persist = 300"))
    env = {**os.environ, "DFLASHCTL_HOSTS": str(hosts), "COLUMNS": "200"}
    pve.gpus.set([{"index": 0, "memory_used": 100}], processes=[])

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "dflashctl", *args], capture_output=True, text=True, cwd=REPO,
                              timeout=120, env=env)

    before = set(runner_pids())  # another test's, still ending or a session master's: not this test's to count
    first = cli("status", "--json")  # starts both runners
    assert len(set(runner_pids()) - before) == 2, first.stderr
    scan = cli("kill-zombies", "--dry-run", "--json")
    assert scan.returncode == 0, scan.stderr
    assert "fork-server" not in scan.stdout and "zombies" in scan.stdout
    for pid in runner_pids():
        assert f'"pid": {pid},' not in scan.stdout
    status = cli("status", "--json")
    assert "fork-server" not in status.stdout


def test_a_container_status_probe_through_the_runners_reports_what_one_hostpair_round_trip_reports(
        pair: tuple[Target, Target], pve: PveEnv) -> None:
    from dflashctl.remote.probe import decode_log, probe_doc

    master, plain = pair
    run = pve.workspace_dir / "dflash" / "runs" / "20261202-0100-runner"
    run.mkdir(parents=True)
    (run / "train.log").write_text("step=1 loss=2.0 tok/s=100\nTraceback (most recent call last):\n"
                                   "  File \"train.py\", line 1, in <module>\nRuntimeError: boom\n")
    (run / "exit_code").write_text("1\n")
    docs = [probe_doc(t, "/workspace/dflash", run.name, events=True, xid=True) for t in (master, plain)]
    assert runner_pids(), "the master's probe did not go through its runners"
    a, b = docs
    assert set(a) == set(b)
    for key in ("run", "log", "xid", "run_requested", "gpus"):
        assert a.get(key) == b.get(key), key
    assert a["run"] and b"RuntimeError: boom" in decode_log(a) and isinstance(a["xid"], dict)
