"""The ssh transport (paramiko): one connection per host, reused for the whole command.

Why it is built this way:
- lazy: nothing connects until the first command, so `dflashctl hosts` and --help stay offline;
- one client, many channels: every run/stream is a fresh `exec` channel on the same connection
  (status --watch and the property tests would otherwise pay a handshake per command);
- where each hop goes (~/.ssh/config merged with hosts.toml) and which host key it must present is
  sshconfig.py's business; paramiko itself comes from sshlib.py (imported without `invoke`);
- dead peers are found by the kernel: paramiko sends a keepalive every 5 s, and TCP_USER_TIMEOUT
  aborts the socket when those bytes go unacknowledged for 15 s (plus TCP keepalive probes), so
  a hung network turns into ConnectFailed instead of a command that waits forever.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from collections.abc import Iterator, Sequence

from dflashctl.errors import AuthFailed, ConnectFailed, HostKeyError, RemoteTimeout
from dflashctl.model import Host
from dflashctl.remote.sshconfig import AcceptNew, Endpoint, RejectUnknown, UnknownHostKey, chain_to, load_ssh_config
from dflashctl.remote.sshlib import paramiko
from dflashctl.remote.transport import Result, Transport, connection_lost, shell_join

CONNECT_TIMEOUT_S = 10.0
KEEPALIVE_S = 5
DEAD_PEER_S = 15  # TCP_USER_TIMEOUT: unacknowledged data (keepalives included) for this long = dead
OPEN_WAIT_S = 120.0  # the longest wait for a new channel of a command that has no timeout of its own
_POLL_S = 0.5


class NoChannelInTime(Exception):
    """sshd had not answered a channel open when the command's time ran out (the caller's RemoteTimeout)."""


class SshTransport(Transport):
    """Runs argv on a host over ssh. The command line is `shell_join(argv)` (quoted once); stdin
    bytes are written then the write side shut; stderr is kept apart; exit status is the remote's."""

    name = "ssh"

    def __init__(self, host: Host, *, connect_timeout: float = CONNECT_TIMEOUT_S):
        self.host = host
        self.connect_timeout = connect_timeout
        self._lock = threading.Lock()
        self._clients: list[paramiko.SSHClient] = []  # jump hosts first, the target last
        self.endpoint: Endpoint | None = None

    # -- connection -------------------------------------------------------------------------

    def _transport(self) -> paramiko.Transport:
        """The live connection, (re)connecting when there is none or the old one died."""
        with self._lock:
            if self._clients:
                t = self._clients[-1].get_transport()
                if t is not None and t.is_active():
                    return t
                self._close_clients()
            self._connect()
            t = self._clients[-1].get_transport()
            assert t is not None
            return t

    def is_connected(self) -> bool:
        """Whether the connection is up now (without connecting): the master exits once it is not."""
        t = self._clients[-1].get_transport() if self._clients else None
        return t is not None and t.is_active()

    def check_connection(self) -> None:
        """Connect now (raising the mapped error) instead of at the first command."""
        self._transport()

    def _connect(self) -> None:
        if not self.host.address:
            raise ConnectFailed(f"host {self.host.name}: no address for the ssh transport")
        if self.host.identity_file and not os.path.exists(os.path.expanduser(self.host.identity_file)):
            raise AuthFailed(f"host {self.host.name}: identity_file {self.host.identity_file} does not exist",
                             hint="fix `identity_file` in hosts.toml (or drop it to use ~/.ssh/config and the agent)")
        chain = chain_to(self.host, load_ssh_config())
        self.endpoint = chain[-1]
        try:
            sock: socket.socket | paramiko.Channel | paramiko.ProxyCommand = self._first_hop(chain[0])
            for i, ep in enumerate(chain):
                client = self._handshake(ep, sock, chain[i - 1] if i else None)
                self._clients.append(client)
                if i + 1 < len(chain):
                    sock = self._tunnel(client, chain[i + 1], ep)
        except BaseException:
            self._close_clients()
            raise

    def _first_hop(self, ep: Endpoint) -> socket.socket | paramiko.ProxyCommand:
        if not ep.proxy_command:
            return self._tcp(ep)
        from dflashctl.remote.proxycommand import ProxyCommand  # only hosts with a ProxyCommand pay its imports

        try:
            return ProxyCommand(ep.proxy_command)
        except OSError as e:
            raise ConnectFailed(f"host {self.host.name}: cannot start ProxyCommand `{ep.proxy_command}`: {e}",
                                hint="check ProxyCommand in your ssh config") from None

    def _tcp(self, ep: Endpoint) -> socket.socket:
        where = f"host {self.host.name}: {ep.hostname}:{ep.port}"
        try:
            sock = socket.create_connection((ep.hostname, ep.port), timeout=self.connect_timeout)
        except socket.gaierror as e:
            raise ConnectFailed(f"{where}: cannot resolve {ep.hostname!r} ({e.strerror})",
                                hint="check `address` in hosts.toml or HostName in ~/.ssh/config") from None
        except ConnectionRefusedError:
            raise ConnectFailed(f"{where}: connection refused",
                                hint="is sshd running there, and is `port` right?") from None
        except TimeoutError:
            raise ConnectFailed(f"{where}: no answer within {self.connect_timeout:g}s",
                                hint="is the host up and reachable (VPN, firewall)?") from None
        except OSError as e:
            raise ConnectFailed(f"{where}: {e.strerror or e}") from None
        _set_keepalive(sock)
        return sock

    def _tunnel(self, jump: paramiko.SSHClient, nxt: Endpoint, via: Endpoint) -> paramiko.Channel:
        t = jump.get_transport()
        assert t is not None
        try:
            return t.open_channel("direct-tcpip", (nxt.hostname, nxt.port), ("127.0.0.1", 0),
                                  timeout=self.connect_timeout)
        except (paramiko.SSHException, OSError) as e:
            raise ConnectFailed(f"host {self.host.name}: jump host {via} cannot reach {nxt.hostname}:{nxt.port} "
                                f"({e})", hint="check ProxyJump and the address as the jump host sees it") from None

    def _handshake(self, ep: Endpoint, sock, via: Endpoint | None) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        if ep.known_hosts.exists():
            client.load_host_keys(str(ep.known_hosts))
        accept_new = self.host.accept_new_host_key
        client.set_missing_host_key_policy(AcceptNew(ep.known_hosts) if accept_new else RejectUnknown())
        where = f"host {self.host.name}: {ep}" + (f" (via {via.hostname})" if via else "")
        keys = [k for k in ep.identity_files if os.path.exists(k)]  # ssh(1) skips missing config keys too
        try:
            client.connect(  # over `sock`: the name and port only say which known_hosts entry to check
                ep.host_key_alias or ep.hostname, port=22 if ep.host_key_alias else ep.port, username=ep.user,
                sock=sock,
                key_filename=keys or None,
                look_for_keys=not keys,
                allow_agent=bool(os.environ.get("SSH_AUTH_SOCK")),
                timeout=self.connect_timeout, banner_timeout=self.connect_timeout,
                auth_timeout=self.connect_timeout, channel_timeout=self.connect_timeout,
            )
        except paramiko.BadHostKeyException:
            client.close()
            raise HostKeyError(
                f"{where}: host key does not match {ep.known_hosts} (possible man-in-the-middle, or a reinstall)",
                hint=f"if the host was reinstalled, verify its new key, then: "
                     f"ssh-keygen -f {ep.known_hosts} -R '{ep.known_hosts_name}'") from None
        except UnknownHostKey:
            client.close()
            raise HostKeyError(
                f"{where}: host key is not in {ep.known_hosts}",
                hint=f"verify it by connecting once with `ssh -p {ep.port} {ep.user}@{ep.hostname}`, "
                     "or set accept_new_host_key = true for this host in hosts.toml") from None
        except paramiko.PasswordRequiredException:
            client.close()
            raise AuthFailed(f"{where}: the identity file is passphrase-protected",
                             hint="load it into ssh-agent (ssh-add) so SSH_AUTH_SOCK is set") from None
        except paramiko.AuthenticationException:
            client.close()
            tried = ", ".join(ep.identity_files) or "default keys and agent"
            raise AuthFailed(f"{where}: authentication failed (tried {tried})",
                             hint="check `user` / `identity_file` in hosts.toml (or ~/.ssh/config) and the "
                                  "host's authorized_keys") from None
        except (paramiko.SSHException, EOFError, OSError) as e:
            failure = getattr(sock, "failure", None)  # a ProxyCommand that exited says why
            proxy_failed = failure() if failure else None
            client.close()
            if proxy_failed:
                raise ConnectFailed(f"{where}: {proxy_failed}",
                                    hint="run the ProxyCommand by hand: it must connect its stdin/stdout to the "
                                         "host's sshd") from None
            raise ConnectFailed(f"{where}: ssh handshake failed ({e or type(e).__name__})") from None
        t = client.get_transport()
        assert t is not None
        t.set_keepalive(KEEPALIVE_S)
        return client

    def _close_clients(self) -> None:
        for client in reversed(self._clients):
            client.close()
        self._clients = []

    def close(self) -> None:
        with self._lock:
            self._close_clients()

    # -- commands ---------------------------------------------------------------------------

    def _session(self, deadline: float | None = None) -> paramiko.Channel:
        """A new channel on the live connection. The wait for sshd's answer is the command's own time (until
        `deadline`, a time.monotonic(); OPEN_WAIT_S for a command without one), not the connect timeout: an sshd
        that is merely slow to answer on a loaded host (seen: >10 s on a 2-CPU CI machine) is not a failed
        connection, and a dead one is noticed at once (paramiko ends the wait when its connection dies)."""
        for attempt in (1, 2):
            t = self._transport()
            wait = OPEN_WAIT_S if deadline is None else deadline - time.monotonic()
            try:
                return t.open_session(timeout=max(wait, 0.001))
            except (paramiko.SSHException, EOFError, OSError) as e:
                if not t.is_active() and attempt == 1:
                    continue  # the connection died before it answered: reconnect once
                if deadline is not None and time.monotonic() >= deadline:
                    raise NoChannelInTime from None
                raise ConnectFailed(f"host {self.host.name}: cannot open an ssh channel ({e})") from None
        raise AssertionError("unreachable")

    def run(
        self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None
    ) -> Result:
        argv = tuple(argv)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            chan = self._session(deadline)
        except NoChannelInTime:
            raise self._timed_out(argv, timeout or 0) from None
        out, err = bytearray(), bytearray()
        try:
            chan.exec_command(shell_join(argv))
            feeder = _feed(chan, stdin)
            while not _pump(chan, out, err):
                if deadline is not None and time.monotonic() >= deadline:
                    _signal(chan, "KILL")
                    raise self._timed_out(argv, timeout)
                wait = _POLL_S if deadline is None else max(0.0, min(_POLL_S, deadline - time.monotonic()))
                _wait(chan, wait)
            if feeder is not None:
                feeder.join(1)
            code = self._exit_status(chan)
        except (EOFError, OSError, paramiko.SSHException):
            raise connection_lost(self.host) from None
        finally:
            chan.close()
        return Result(argv, code, bytes(out), bytes(err))

    def _timed_out(self, argv: Sequence[str], timeout: float) -> RemoteTimeout:
        return RemoteTimeout(f"host {self.host.name}: command timed out after {timeout:g}s: {shell_join(argv)[:120]}",
                             hint="raise --timeout, or check the host is not overloaded")

    def _exit_status(self, chan: paramiko.Channel) -> int:
        """The remote exit status. A channel closed without one is a lost connection when the
        transport died, else a command killed by a signal (255, as OpenSSH's client reports it).
        paramiko closes the channels of a dying transport a moment before it marks itself
        inactive, so give it that moment (the reader's error is recorded first, though)."""
        if chan.exit_status >= 0:  # paramiko sets status_event on close too; -1 means no status came
            return chan.exit_status
        t = chan.get_transport()

        def dead() -> bool:
            return t is None or not t.is_active() or isinstance(t.saved_exception, (EOFError, OSError))

        settle = time.monotonic() + 0.5
        while not dead() and time.monotonic() < settle:
            time.sleep(0.01)
        if dead():
            raise connection_lost(self.host)
        return 255

    def stream(self, argv: Sequence[str], *, stdin: bytes | None = None) -> Iterator[bytes]:
        chan = self._session()
        try:
            chan.exec_command(shell_join(argv))
            _feed(chan, stdin)
            buf, err = bytearray(), bytearray()
            done = False
            while not done:
                before = len(buf)
                done = _pump(chan, buf, err)
                del err[:-4096]  # stderr is not streamed; keep the window open, remember the tail
                if len(buf) > before or done:
                    *lines, rest = bytes(buf).split(b"\n")
                    for line in lines:
                        yield line + b"\n"
                    buf[:] = rest
                if not done:
                    _wait(chan, _POLL_S)
            if buf:
                yield bytes(buf)
            self._exit_status(chan)
        except (EOFError, OSError, paramiko.SSHException):
            raise connection_lost(self.host) from None
        finally:
            chan.close()


def _pump(chan: paramiko.Channel, out: bytearray, err: bytearray) -> bool:
    """Move whatever arrived into out/err; True once the command is over and fully read."""
    while chan.recv_ready():
        out += chan.recv(65536)
    while chan.recv_stderr_ready():
        err += chan.recv_stderr(65536)
    if chan.closed or (chan.eof_received and chan.status_event.is_set()):
        while chan.recv_ready():
            out += chan.recv(65536)
        while chan.recv_stderr_ready():
            err += chan.recv_stderr(65536)
        return not chan.recv_ready() and not chan.recv_stderr_ready()
    return False


def _signal(chan: paramiko.Channel, name: str) -> None:
    """Best effort: ask sshd to signal the command (RFC 4254 "signal" request), so a timed-out
    command does not linger. OpenSSH honours it only for privilege-separated sessions, i.e. not
    for root logins (sshd logs "session signalling requires privilege separation")."""
    try:
        m = paramiko.Message()
        m.add_byte(paramiko.common.cMSG_CHANNEL_REQUEST)
        m.add_int(chan.remote_chanid)
        m.add_string("signal")
        m.add_boolean(False)
        m.add_string(name)
        chan.transport._send_user_message(m)
    except (OSError, EOFError, paramiko.SSHException, AttributeError):
        pass


def _wait(chan: paramiko.Channel, seconds: float) -> None:
    """Sleep until data arrives on the channel (stdout or stderr), the exit status comes, or
    `seconds` pass. After EOF the channel stays readable, so wait for the status instead."""
    if seconds <= 0:
        return
    if chan.eof_received:
        chan.status_event.wait(seconds)
    else:
        select.select([chan], [], [], seconds)


def _feed(chan: paramiko.Channel, data: bytes | None) -> threading.Thread | None:
    """Send stdin from a thread (so a big input never deadlocks against unread output), then EOF."""
    if not data:
        chan.shutdown_write()
        return None

    def send() -> None:
        try:
            chan.sendall(data)
            chan.shutdown_write()
        except (OSError, EOFError, paramiko.SSHException):
            pass  # the reader notices the dead channel

    thread = threading.Thread(target=send, name="ssh-stdin", daemon=True)
    thread.start()
    return thread


def _set_keepalive(sock: socket.socket) -> None:
    """Dead-peer detection by the kernel, and no Nagle: small request/reply packets (channel open,
    exec, exit status) would otherwise wait ~40 ms for delayed ACKs on every command."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, value in (("TCP_KEEPIDLE", KEEPALIVE_S), ("TCP_KEEPINTVL", KEEPALIVE_S), ("TCP_KEEPCNT", 3),
                       ("TCP_USER_TIMEOUT", DEAD_PEER_S * 1000)):
        if hasattr(socket, opt):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)
