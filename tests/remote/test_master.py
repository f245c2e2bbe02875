"""The ssh connection master (remote/master.py) against a real sshd: its files and their permissions, reuse across
commands without paramiko, stale sockets, a master whose sshd went away, commands at once, idle exit, persist = 0,
`hosts disconnect`. Every test has its own masters dir (`fresh_masters`), ended after it."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from harness.envs import PveEnv
from harness.poll import wait_until
from harness.sshd import SshdServer

from dflashctl.config import parse_inventory
from dflashctl.errors import ConfigError, ConnectFailed
from dflashctl.model import Host
from dflashctl.remote import connect
from dflashctl.remote import masterwire as wire
from dflashctl.remote.masterclient import MasterTransport
from dflashctl.remote.ssh import SshTransport

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def server(sshd_server: SshdServer, fresh_masters: Path, monkeypatch: pytest.MonkeyPatch) -> SshdServer:
    monkeypatch.setenv("DFLASHCTL_KNOWN_HOSTS", str(sshd_server.known_hosts))
    monkeypatch.setenv("DFLASHCTL_SSH_CONFIG", os.devnull)
    return sshd_server


def ssh_host(server: SshdServer, **kw) -> Host:
    fields = dict(name="m", transport="ssh", address=server.address, port=server.port, user="root",
                  identity_file=str(server.client_key))
    fields.update(kw)
    return Host(**fields)


def logins(server: SshdServer) -> int:
    return server.log.read_text(errors="replace").count("Accepted publickey")


def master_pid(host: Host) -> int | None:
    info = wire.read_info(wire.place_for(host).info)
    return info["pid"] if info else None


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


def masters_of(directory: Path) -> list[int]:
    """pids of the running master processes whose socket is in `directory` (by their command line)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"dflashctl.remote.master" in argv and any(a.startswith(os.fsencode(str(directory))) for a in argv):
            found.append(int(proc.name))
    return found


def test_the_masters_socket_is_0600_in_a_0700_dir_and_later_commands_reuse_its_one_login(server: SshdServer,
                                                                                         fresh_masters: Path) -> None:
    host = ssh_host(server)
    before = logins(server)
    for i in range(5):
        with connect(host) as target:  # a new Target each time: what separate commands do
            assert isinstance(target.transport, MasterTransport)
            assert target.run(["echo", str(i)]).out == f"{i}\n"
    assert logins(server) - before == 1
    place = wire.place_for(host)
    assert stat.S_IMODE(fresh_masters.stat().st_mode) == 0o700
    assert stat.S_ISSOCK(place.sock.stat().st_mode) and stat.S_IMODE(place.sock.stat().st_mode) == 0o600
    for path in (place.info, place.lock, place.log):
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path
    assert masters_of(fresh_masters) == [master_pid(host)]


def test_a_later_command_through_the_master_imports_no_paramiko(server: SshdServer) -> None:
    host = ssh_host(server)
    with connect(host) as target:
        target.run(["true"]).check("starting the master")
    code = (
        "import sys, json\n"
        "from dflashctl.model import Host\n"
        "from dflashctl.remote import connect\n"
        f"host = Host(**json.loads({wire.host_to_json(host).decode()!r}))\n"
        "with connect(host) as t:\n"
        "    r = t.run(['sh', '-c', 'cat; echo out; echo err >&2; exit 5'], stdin=b'in:')\n"
        "print(json.dumps([type(t.transport).__name__, r.exit_code, r.out, r.err, 'paramiko' in sys.modules]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["MasterTransport", 5, "in:out\n", "err\n", False]


def test_a_stale_socket_is_replaced_with_at_most_one_line_on_stderr(server: SshdServer,
                                                                    capfd: pytest.CaptureFixture[str]) -> None:
    host = ssh_host(server)
    place = wire.place_for(host)
    wire.ensure_dir(place.dir)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(place.sock))  # a socket file nobody listens on: what a master killed outright leaves
    dead.close()
    with connect(host) as target:
        assert target.run(["echo", "fresh"]).out == "fresh\n"
    assert len(capfd.readouterr().err.splitlines()) <= 1
    assert alive(master_pid(host))


def test_a_master_whose_sshd_went_away_is_replaced_by_the_next_command(
    fresh_masters: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    first = SshdServer(tmp_path / "sshd").start()  # our own sshd: this test stops it
    try:
        monkeypatch.setenv("DFLASHCTL_KNOWN_HOSTS", str(first.known_hosts))
        monkeypatch.setenv("DFLASHCTL_SSH_CONFIG", os.devnull)
        host = ssh_host(first)
        with connect(host) as target:
            assert target.run(["echo", "one"]).out == "one\n"
        old = master_pid(host)
        first.stop()
        wait_until(lambda: not alive(old), what="the master to notice its connection died and exit")
        assert not wire.place_for(host).sock.exists()
    finally:
        first.stop()
    second = SshdServer(tmp_path / "sshd", port=first.port).start()  # same keys, same port: "the host is back"
    try:
        capfd.readouterr()
        with connect(host) as target:
            assert target.run(["echo", "two"]).out == "two\n"
        assert len(capfd.readouterr().err.splitlines()) <= 1
        assert master_pid(host) not in (None, old)
    finally:
        second.stop()


def test_a_command_sent_to_a_master_whose_connection_just_died_runs_on_a_new_one(server: SshdServer) -> None:
    host = ssh_host(server)
    t = MasterTransport(host)
    lines = t.stream(["sh", "-c", "echo ready; exec sleep 30"])
    assert next(lines) == b"ready\n"
    server.drop_connections()
    with pytest.raises(ConnectFailed, match="ssh connection lost"):
        next(lines)  # what runs when the connection breaks is lost, as without a master (never re-sent)
    assert t.run(["echo", "back"]).out == "back\n"  # what comes next finds a new master


def test_two_commands_at_once_share_one_master_and_each_gets_its_own_output(server: SshdServer,
                                                                           tmp_path: Path) -> None:
    host = ssh_host(server)
    with connect(host) as target:
        target.run(["true"]).check("starting the master")
    before = logins(server)
    a, b = tmp_path / "a", tmp_path / "b"
    # each command waits for the other's file: they finish only if both run at the same time
    scripts = {"A": f"touch {a}; while [ ! -e {b} ]; do sleep 0.02; done; echo from-A; echo errA >&2",
               "B": f"touch {b}; while [ ! -e {a} ]; do sleep 0.02; done; echo from-B; echo errB >&2; exit 3"}
    results = {}

    def one(name: str) -> None:
        with connect(host) as t:
            results[name] = t.run(["sh", "-c", scripts[name]], timeout=60)

    threads = [threading.Thread(target=one, args=(n,)) for n in scripts]
    for th in threads:
        th.start()
    for th in threads:
        th.join(90)
    assert (results["A"].exit_code, results["A"].out, results["A"].err) == (0, "from-A\n", "errA\n")
    assert (results["B"].exit_code, results["B"].out, results["B"].err) == (3, "from-B\n", "errB\n")
    assert logins(server) == before  # both rode the master's connection


def test_commands_that_start_at_once_with_no_master_start_one(server: SshdServer, fresh_masters: Path) -> None:
    host = ssh_host(server)
    before = logins(server)
    outs: list[str] = []

    def one(i: int) -> None:
        with connect(host) as t:
            outs.append(t.run(["echo", str(i)], timeout=60).out)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(90)
    assert sorted(outs) == ["0\n", "1\n", "2\n", "3\n"]
    assert logins(server) - before == 1  # the lock file: the others waited for the first one's master
    assert masters_of(fresh_masters) == [master_pid(host)]


def test_a_relative_state_dir_names_the_same_socket_from_any_directory(
    server: SshdServer, fresh_masters: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(fresh_masters.parent)  # a short path: a UNIX socket's name has ~107 bytes
    monkeypatch.setenv("DFLASHCTL_STATE_DIR", ".")
    host = ssh_host(server)
    with connect(host) as target:
        assert isinstance(target.transport, MasterTransport)
        assert target.run(["echo", "rel"]).out == "rel\n"
    place = wire.place_for(host)
    assert place.dir == fresh_masters and place.sock.is_socket()
    assert masters_of(fresh_masters) == [master_pid(host)]


def test_a_state_dir_too_deep_for_a_socket_name_connects_without_a_master(
    server: SshdServer, fresh_masters: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DFLASHCTL_STATE_DIR", str(fresh_masters.parent / ("d" * 100)))
    with connect(ssh_host(server)) as target:
        assert isinstance(target.transport, SshTransport)
        assert target.run(["echo", "deep"]).out == "deep\n"


def test_closing_a_stream_ends_the_remote_command(server: SshdServer) -> None:
    with connect(ssh_host(server)) as target:
        lines = target.stream(["sh", "-c", "echo $$; while :; do echo tick; sleep 0.05; done"])
        pid = int(next(lines))  # the sshd runs here: its command is a process of this machine
        assert next(lines) == b"tick\n"
        lines.close()
    wait_until(lambda: not alive(pid), what="the streamed command to end once the stream is closed")


def test_a_master_exits_after_its_idle_time(server: SshdServer) -> None:
    host = ssh_host(server, persist_s=0.5)
    with connect(host) as target:
        assert target.run(["true"]).ok
    pid = master_pid(host)
    wait_until(lambda: not alive(pid), what="the idle master to exit")
    place = wire.place_for(host)
    assert not place.sock.exists() and not place.info.exists()


def test_persist_0_connects_in_this_process_and_leaves_no_master(server: SshdServer, fresh_masters: Path) -> None:
    host = ssh_host(server, persist_s=0)
    with connect(host) as target:
        assert isinstance(target.transport, SshTransport)
        assert target.run(["echo", "direct"]).out == "direct\n"
    assert masters_of(fresh_masters) == []
    assert not fresh_masters.exists() or list(fresh_masters.iterdir()) == []


def test_a_connection_error_through_the_master_is_todays_error_and_leaves_no_master(server: SshdServer,
                                                                                    fresh_masters: Path,
                                                                                    tmp_path: Path) -> None:
    missing = ssh_host(server, identity_file=str(tmp_path / "no_such_key"))
    with pytest.raises(Exception) as via_master, connect(missing) as target:
        target.run(["true"])
    with pytest.raises(Exception) as direct, SshTransport(missing) as t:
        t.run(["true"])
    assert type(via_master.value) is type(direct.value)
    assert (via_master.value.message, via_master.value.hint) == (direct.value.message, direct.value.hint)
    wait_until(lambda: masters_of(fresh_masters) == [], what="the master that could not connect to exit")
    assert not wire.place_for(missing).sock.exists()


@pytest.mark.parametrize(("value", "expected"), [("0", 0.0), ("30", 30.0), ("2.5", 2.5)])
def test_persist_in_hosts_toml_sets_the_idle_time(tmp_path: Path, value: str, expected: float) -> None:
    inv = parse_inventory(f'[hosts.pve]\naddress = "pve.example.invalid"\npersist = {value}\n', tmp_path / "h.toml")
    assert inv.get("pve").persist_s == expected
    assert parse_inventory('[hosts.pve]\naddress = "pve.example.invalid"\n', tmp_path / "h.toml") \
        .get("pve").persist_s == Host.persist_s


@pytest.mark.parametrize("value", ["-1", '"5m"', "true", "1e9", "nan"])
def test_a_bad_persist_is_one_config_error_naming_file_line_and_key(tmp_path: Path, value: str) -> None:
    text = f'[hosts.pve]\naddress = "pve.example.invalid"\npersist = {value}\n'
    with pytest.raises(ConfigError) as exc:
        parse_inventory(text, tmp_path / "h.toml")
    assert exc.value.message.startswith(f"{tmp_path / 'h.toml'}:3: [hosts.pve] persist: must be")


def test_persist_on_a_local_host_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"persist: only applies to transport = \"ssh\""):
        parse_inventory('[hosts.l]\ntransport = "local"\npersist = 5\n', tmp_path / "h.toml")


def test_hosts_disconnect_ends_the_hosts_master_and_says_so(pve: PveEnv, fresh_masters: Path) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "dflashctl", *args], capture_output=True, text=True,
                              cwd=REPO, timeout=120, env={**os.environ, "COLUMNS": "200"})

    mine = replace(pve.host, persist_s=300.0)  # the harness's own entry keeps connections in-process (persist = 0)
    with connect(mine) as target:
        assert target.run(["true"]).ok
    pid = master_pid(mine)
    other = replace(pve.host, name="other", persist_s=300.0, port=pve.sshd.port, user="root", accept_new_host_key=True)
    with connect(other) as target:  # a second master (another connection: accept_new differs)
        assert target.run(["true"]).ok
    other_pid = master_pid(other)
    assert other_pid not in (None, pid)
    ended = cli("hosts", "disconnect", "pve")
    assert ended.returncode == 0, ended.stderr
    assert f"ended the ssh master for pve ({pve.host.endpoint}, pid {pid})" in ended.stdout
    assert not alive(pid) and alive(other_pid)
    again = cli("hosts", "disconnect", "pve")
    assert again.returncode == 0 and "no ssh master was running for pve" in again.stdout
    every = cli("hosts", "disconnect")
    assert every.returncode == 0 and "ended the ssh master for other" in every.stdout
    assert masters_of(fresh_masters) == []
    unknown = cli("hosts", "disconnect", "nosuch")
    assert unknown.returncode == 2 and "unknown host 'nosuch'" in unknown.stderr and "Traceback" not in unknown.stderr
