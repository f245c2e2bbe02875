"""The ssh transport against a real sshd: reuse, stdio, timeouts, dropped connections, ~/.ssh/config,
ProxyJump, host keys and authentication."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import paramiko
import pytest
from harness.envs import PveEnv
from harness.sshd import SshdServer, closed_port

from dflashctl.errors import (
    AuthFailed,
    ConnectFailed,
    ContainerNotRunning,
    ExitCode,
    HostKeyError,
    NotFound,
    RemoteTimeout,
)
from dflashctl.model import Host
from dflashctl.remote.masterclient import MasterTransport
from dflashctl.remote.proxycommand import ProxyCommand
from dflashctl.remote.ssh import SshTransport
from dflashctl.remote.sshconfig import parse_jump
from dflashctl.remote.transport import Transport

Make = Callable[..., Transport]


@pytest.fixture(params=["in-process", "master"])
def make(request: pytest.FixtureRequest) -> Make:
    """Each behaviour twice: SshTransport in this process, and through a connection master (fresh_masters: its own)."""
    if request.param == "master":
        request.getfixturevalue("fresh_masters")
    return MasterTransport if request.param == "master" else SshTransport


@pytest.fixture
def server(sshd_server: SshdServer, monkeypatch: pytest.MonkeyPatch) -> SshdServer:
    monkeypatch.setenv("DFLASHCTL_KNOWN_HOSTS", str(sshd_server.known_hosts))
    monkeypatch.setenv("DFLASHCTL_SSH_CONFIG", os.devnull)
    return sshd_server


def ssh_host(server: SshdServer, **kw) -> Host:
    fields = dict(name="t", transport="ssh", address=server.address, port=server.port, user="root",
                  identity_file=str(server.client_key))
    fields.update(kw)
    return Host(**fields)


def host_block(server: SshdServer, alias: str, *more: str) -> str:
    """An ssh_config `Host` block that reaches the test sshd under `alias`, plus `more` option lines."""
    lines = [f"HostName {server.address}", f"Port {server.port}", "User root", f"IdentityFile {server.client_key}",
             *more]
    return f"Host {alias}\n" + "".join(f"  {line}\n" for line in lines)


def logins(server: SshdServer) -> int:
    return server.log.read_text(errors="replace").count("Accepted publickey")


def new_key(tmp_path: Path, name: str = "other") -> Path:
    key = tmp_path / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key


def test_every_command_of_a_transport_shares_one_ssh_connection(make: Make, server: SshdServer) -> None:
    before = logins(server)
    with make(ssh_host(server)) as t:
        for i in range(20):
            assert t.run(["echo", str(i)]).out == f"{i}\n"
        assert list(t.stream(["printf", "a\\nb\\n"])) == [b"a\n", b"b\n"]
    assert logins(server) - before == 1


def test_nothing_connects_until_the_first_command(make: Make, server: SshdServer) -> None:
    before = logins(server)
    t = make(ssh_host(server, port=closed_port()))  # would fail if it connected here
    t.close()
    assert logins(server) == before


def test_exit_status_stdout_and_stderr_come_back_separately(make: Make, server: SshdServer) -> None:
    with make(ssh_host(server)) as t:
        res = t.run(["sh", "-c", "echo out; echo err >&2; exit 7"])
    assert (res.exit_code, res.stdout, res.stderr) == (7, b"out\n", b"err\n")


def test_a_command_killed_by_a_signal_exits_255_and_the_connection_is_not_called_lost(
    make: Make, server: SshdServer
) -> None:
    with make(ssh_host(server)) as t:
        assert t.run(["sh", "-c", "kill -9 $$"]).exit_code == 255
        assert t.run(["true"]).ok


def test_megabytes_of_binary_stdin_and_stdout_pass_without_deadlock(make: Make, server: SshdServer) -> None:
    data = os.urandom(4 * 1024 * 1024)
    with make(ssh_host(server)) as t:
        res = t.run(["sh", "-c", "cat; head -c 3000000 /dev/zero >&2"], stdin=data, timeout=120)
    assert res.ok and res.stdout == data and res.stderr == b"\0" * 3000000


def test_command_without_stdin_sees_end_of_file(make: Make, server: SshdServer) -> None:
    with make(ssh_host(server)) as t:
        assert t.run(["wc", "-c"], timeout=30).out.strip() == "0"


def test_a_command_past_its_timeout_raises_remote_timeout_and_the_connection_stays_usable(
    make: Make, server: SshdServer
) -> None:
    with make(ssh_host(server)) as t:
        with pytest.raises(RemoteTimeout) as exc:
            t.run(["sleep", "5"], timeout=0.5)
        assert exc.value.exit_code == ExitCode.NOT_FINISHED
        assert t.run(["echo", "still here"]).out == "still here\n"


def test_stream_yields_each_line_before_the_command_ends(make: Make, server: SshdServer, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    script = f"echo first; while [ ! -e {gate} ]; do sleep 0.05; done; echo second; printf tail"
    with make(ssh_host(server)) as t:
        lines = t.stream(["sh", "-c", script])
        assert next(lines) == b"first\n"  # the command is still blocked on the gate here
        gate.touch()
        assert list(lines) == [b"second\n", b"tail"]


def test_a_dropped_connection_raises_connect_failed_and_the_next_command_reconnects(
    make: Make, server: SshdServer
) -> None:
    with make(ssh_host(server)) as t:
        lines = t.stream(["sh", "-c", "echo ready; exec sleep 5"])
        assert next(lines) == b"ready\n"
        server.drop_connections()
        with pytest.raises(ConnectFailed) as exc:
            next(lines)
        assert "connection lost" in exc.value.message
        assert t.run(["echo", "back"]).out == "back\n"


@contextmanager
def frozen_session(server: SshdServer, t: SshTransport) -> Iterator[Callable[[], None]]:
    """t's own sshd session process SIGSTOPped (a host too loaded to answer): the kernel still ACKs, nothing is
    answered. Yields thaw() (SIGCONT); the process is continued on exit whatever happens."""
    before = set(server.session_pids())
    t.check_connection()
    ours = set(server.session_pids()) - before
    assert len(ours) == 1, f"expected one new sshd session process, got {ours}"
    pid = ours.pop()
    os.kill(pid, signal.SIGSTOP)
    try:
        yield lambda: os.kill(pid, signal.SIGCONT)
    finally:
        os.kill(pid, signal.SIGCONT)


def test_an_sshd_slow_to_open_a_channel_is_waited_for_within_the_commands_time(server: SshdServer) -> None:
    # CI (2 CPUs, 4 workers) once saw a channel open take >10 s; that is the command's time, not the connect timeout
    with SshTransport(ssh_host(server), connect_timeout=0.5) as t, frozen_session(server, t) as thaw:
        gate = threading.Event()
        done: list[object] = []

        def command() -> None:
            gate.set()
            try:
                done.append(t.run(["echo", "late"], timeout=120))
            except Exception as e:  # noqa: BLE001 - reported below
                done.append(e)

        runner = threading.Thread(target=command)
        runner.start()
        gate.wait()
        pending = t._clients[-1].get_transport().channel_events  # paramiko's opens awaiting sshd's answer
        deadline = time.monotonic() + 60
        while not pending and not done and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pending, f"the channel open was never sent: {done}"
        runner.join(2.0)  # sshd frozen for 4x the connect timeout after the open went out
        assert not done, f"gave up while sshd was only slow: {done}"
        thaw()
        runner.join(60)
    assert len(done) == 1 and not isinstance(done[0], Exception), done
    assert done[0].out == "late\n"


def test_a_channel_sshd_never_opens_within_the_commands_timeout_is_that_commands_timeout(
    server: SshdServer
) -> None:
    with SshTransport(ssh_host(server)) as t, frozen_session(server, t), pytest.raises(RemoteTimeout) as exc:
        t.run(["echo", "never"], timeout=1)
    assert "timed out after 1s" in exc.value.message and exc.value.exit_code == RemoteTimeout.exit_code


def test_keepalive_and_dead_peer_timeout_are_set_on_the_socket(server: SshdServer) -> None:
    with SshTransport(ssh_host(server)) as t:
        t.check_connection()
        sock = t._clients[-1].get_transport().sock
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 15000
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 5
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1


def test_ssh_config_alias_supplies_hostname_port_user_and_identity(
    server: SshdServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "ssh_config"
    cfg.write_text(host_block(server, "gpu-box"))
    monkeypatch.setenv("DFLASHCTL_SSH_CONFIG", str(cfg))
    with SshTransport(Host(name="t", transport="ssh", address="gpu-box")) as t:
        assert t.run(["id", "-un"]).out == "root\n"
        assert (t.endpoint.hostname, t.endpoint.port) == (server.address, server.port)


def test_ssh_config_user_known_hosts_file_is_used(
    make: Make, server: SshdServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host {server.address}\n  UserKnownHostsFile {tmp_path / 'nowhere'}\n")
    monkeypatch.setenv("DFLASHCTL_SSH_CONFIG", str(cfg))
    monkeypatch.delenv("DFLASHCTL_KNOWN_HOSTS")
    with pytest.raises(HostKeyError, match="nowhere"), make(ssh_host(server)) as t:
        t.run(["true"])


def test_proxy_jump_reaches_the_host_through_a_direct_tcpip_channel(
    server: SshdServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "ssh_config"
    cfg.write_text(host_block(server, "jumpbox"))
    monkeypatch.setenv("DFLASHCTL_SSH_CONFIG", str(cfg))
    before = logins(server)
    with SshTransport(ssh_host(server, proxy_jump="jumpbox")) as t:
        assert t.run(["echo", "via jump"]).out == "via jump\n"
        inner = t._clients[-1].get_transport()
        assert isinstance(inner.sock, paramiko.Channel)  # the target's connection rides the jump host's channel
    assert logins(server) - before == 2  # one login on the jump host, one on the target


def test_parse_jump_reads_openssh_proxyjump_forms() -> None:
    assert parse_jump("bastion") == [("bastion", None, None)]
    assert parse_jump("ops@bastion.example.invalid:2222,ssh://root@[fd00::1]:22") == [
        ("bastion.example.invalid", "ops", 2222), ("fd00::1", "root", 22)]


def test_unknown_host_key_is_rejected_by_default(make: Make, server: SshdServer, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    monkeypatch.setenv("DFLASHCTL_KNOWN_HOSTS", str(empty))
    with pytest.raises(HostKeyError) as exc, make(ssh_host(server)) as t:
        t.run(["true"])
    assert "not in" in exc.value.message and exc.value.exit_code == ExitCode.USAGE
    assert "accept_new_host_key" in exc.value.hint
    assert empty.read_text() == ""


def test_accept_new_host_key_learns_an_unknown_key_and_later_connections_check_it(
    make: Make, server: SshdServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kh = tmp_path / "sub" / "known_hosts"
    monkeypatch.setenv("DFLASHCTL_KNOWN_HOSTS", str(kh))
    with make(ssh_host(server, accept_new_host_key=True)) as t:
        assert t.run(["true"]).ok
    host_pub = server.host_key.with_suffix(".pub").read_text().split()[1]
    assert kh.read_text() == f"[{server.address}]:{server.port} ssh-ed25519 {host_pub}\n"
    with make(ssh_host(server)) as t:  # strict again: the learned key is now known
        assert t.run(["true"]).ok


@pytest.mark.parametrize("accept_new", [False, True])
def test_changed_host_key_is_refused_even_with_accept_new(
    make: Make, server: SshdServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, accept_new: bool
) -> None:
    other = new_key(tmp_path).with_suffix(".pub").read_text().split()
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[{server.address}]:{server.port} {other[0]} {other[1]}\n")
    monkeypatch.setenv("DFLASHCTL_KNOWN_HOSTS", str(kh))
    with pytest.raises(HostKeyError) as exc, make(ssh_host(server, accept_new_host_key=accept_new)) as t:
        t.run(["true"])
    assert "does not match" in exc.value.message
    assert "ssh-keygen" in exc.value.hint


def test_a_key_the_server_does_not_authorize_fails_authentication(
    make: Make, server: SshdServer, tmp_path: Path
) -> None:
    with pytest.raises(AuthFailed) as exc, make(ssh_host(server, identity_file=str(new_key(tmp_path)))) as t:
        t.run(["true"])
    assert "authentication failed" in exc.value.message and exc.value.exit_code == ExitCode.USAGE


def test_a_closed_port_is_connection_refused(make: Make, server: SshdServer) -> None:
    with pytest.raises(ConnectFailed) as exc, make(ssh_host(server, port=closed_port())) as t:
        t.run(["true"])
    assert "connection refused" in exc.value.message and exc.value.exit_code == ExitCode.NOT_FOUND


def test_an_unresolvable_name_is_a_connect_failure(make: Make, server: SshdServer) -> None:
    with pytest.raises(ConnectFailed, match="cannot resolve"), \
            make(ssh_host(server, address="nosuchhost.example.invalid")) as t:
        t.run(["true"])


def test_a_process_started_detached_through_pct_exec_survives_and_a_later_exec_sees_it(pve: PveEnv) -> None:
    with pve.connect() as target:
        started = target.run(["sh", "-c", "setsid -f sleep 300 </dev/null >/dev/null 2>&1; echo started"],
                             timeout=30)
        assert started.out == "started\n"  # returned while the detached child lives on
    with pve.connect() as later:  # a new connection, a new pct exec
        seen = later.run(["pgrep", "-f", "^sleep 300$"], timeout=30)
    assert seen.ok, seen.err
    assert pve.exec(["pgrep", "-f", "^sleep 300$"]).stdout == seen.stdout  # same process, inside the container
    pve.stop_container()  # and it was in the container: stopping it ends the process
    pve.start_container()
    assert pve.exec(["pgrep", "-f", "^sleep 300$"]).returncode == 1


def test_target_refuses_a_stopped_container_before_running_anything(pve: PveEnv) -> None:
    pve.stop_container()
    with pve.connect() as target, pytest.raises(ContainerNotRunning) as exc:
        target.run(["true"])
    assert "not running" in exc.value.message and f"pct start {pve.ctid}" in exc.value.hint


def test_target_reports_an_unknown_container_as_not_found(pve: PveEnv) -> None:
    from dataclasses import replace

    from dflashctl.remote import connect

    with connect(replace(pve.host, container=999)) as target, pytest.raises(NotFound) as exc:
        target.run(["true"])
    assert "Configuration file" in exc.value.message and "999.conf" in exc.value.message


def test_a_local_host_with_a_container_runs_pct_exec_on_this_machine(
    pve: PveEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dataclasses import replace

    from dflashctl.remote import connect

    for key, value in pve.sshd.env.items():  # this machine plays the Proxmox host: pct on PATH
        monkeypatch.setenv(key, value)
    local = replace(pve.host, transport="local", address=None, port=None, user=None, identity_file=None)
    with connect(local) as target:
        assert target.transport.name == "local"
        res = target.run(["sh", "-c", "cat /proc/1/cmdline; echo; cat"], stdin=b"via pct")
    init = b"init" if pve.sshd.pct_backend == "lxc" else b"ctinit.py"  # PID 1: init.lxc, or the stand-in's init
    assert res.ok and init in res.stdout.split(b"\n")[0] and res.stdout.endswith(b"\nvia pct")


def test_a_server_that_never_answers_fails_after_the_connect_timeout(server: SshdServer) -> None:
    with socket.socket() as silent:  # accepts TCP (the kernel does) but never speaks SSH
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        host = ssh_host(server, port=silent.getsockname()[1])
        with pytest.raises(ConnectFailed) as exc, SshTransport(host, connect_timeout=0.5) as t:
            t.run(["true"])
    assert "handshake failed" in exc.value.message and exc.value.exit_code == ExitCode.NOT_FOUND


def test_a_missing_identity_file_is_an_authentication_error_naming_it(
    make: Make, server: SshdServer, tmp_path: Path
) -> None:
    missing = tmp_path / "no_such_key"
    with pytest.raises(AuthFailed, match="no_such_key does not exist"), \
            make(ssh_host(server, identity_file=str(missing))) as t:
        t.run(["true"])


RELAY = Path(__file__).resolve().parents[1] / "harness" / "tcp_relay.py"


def proxied_config(server: SshdServer, tmp_path: Path, proxy: str, extra: str = "") -> Path:
    cfg = tmp_path / "ssh_config"
    cfg.write_text(host_block(server, "pve-proxied", f"ProxyCommand {proxy}") + extra)
    return cfg


def test_proxy_command_from_ssh_config_carries_the_connection_through_a_shell(
    server: SshdServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `2>/dev/null` only works when the line goes through a shell, as ssh(1) runs it
    cfg = proxied_config(server, tmp_path, f"{sys.executable} {RELAY} %h %p 2>/dev/null")
    monkeypatch.setenv("DFLASHCTL_SSH_CONFIG", str(cfg))
    before = logins(server)
    with SshTransport(ssh_host(server, address="pve-proxied", port=None, user=None, identity_file=None)) as t:
        for i in range(3):
            assert t.run(["echo", f"proxied {i}"]).out == f"proxied {i}\n"
        proxy = t._clients[-1].get_transport().sock
        assert isinstance(proxy, ProxyCommand)
        assert proxy.process.poll() is None
    assert proxy.process.poll() is not None  # closing the transport ends the proxy process
    assert logins(server) - before == 1


def test_a_proxy_command_that_exits_is_one_connect_error_quoting_its_stderr(
    make: Make, server: SshdServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = proxied_config(server, tmp_path, "sh -c 'echo \"bastion: no route to %h\" >&2; exit 3'")
    monkeypatch.setenv("DFLASHCTL_SSH_CONFIG", str(cfg))
    with pytest.raises(ConnectFailed) as exc, make(ssh_host(server, address="pve-proxied")) as t:
        t.run(["true"])
    assert f"exited with status 3: bastion: no route to {server.address}" in exc.value.message
    assert exc.value.exit_code == ExitCode.NOT_FOUND and "\n" not in exc.value.message
    assert "ProxyCommand" in exc.value.message and "by hand" in exc.value.hint


def test_proxy_jump_wins_over_a_proxy_command_of_the_same_host(
    server: SshdServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = proxied_config(server, tmp_path, "false", extra=host_block(server, "jumpbox"))
    monkeypatch.setenv("DFLASHCTL_SSH_CONFIG", str(cfg))
    with SshTransport(ssh_host(server, address="pve-proxied", proxy_jump="jumpbox")) as t:
        assert t.run(["echo", "jumped"]).out == "jumped\n"
        assert isinstance(t._clients[-1].get_transport().sock, paramiko.Channel)


def test_host_key_alias_names_the_known_hosts_entry_checked_and_learned(
    server: SshdServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host_pub = server.host_key.with_suffix(".pub").read_text().split()[1]
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host {server.address}\n  HostKeyAlias pve1-ct200\n")
    monkeypatch.setenv("DFLASHCTL_SSH_CONFIG", str(cfg))
    kh = tmp_path / "known_hosts"
    kh.write_text(f"pve1-ct200 ssh-ed25519 {host_pub}\n")  # filed under the alias only, no [addr]:port line
    monkeypatch.setenv("DFLASHCTL_KNOWN_HOSTS", str(kh))
    with SshTransport(ssh_host(server)) as t:
        assert t.run(["true"]).ok
    kh.write_text(f"[{server.address}]:{server.port} ssh-ed25519 {host_pub}\n")  # under the address: not the alias
    with pytest.raises(HostKeyError, match="not in"), SshTransport(ssh_host(server)) as t:
        t.run(["true"])
    kh.write_text("")
    with SshTransport(ssh_host(server, accept_new_host_key=True)) as t:
        assert t.run(["true"]).ok
    assert kh.read_text() == f"pve1-ct200 ssh-ed25519 {host_pub}\n"
