"""Where one ssh hop goes and which host key it must present: ~/.ssh/config merged with hosts.toml.

`~/.ssh/config` is honoured the way OpenSSH does for the options we support (HostName, User, Port, IdentityFile,
ProxyJump, ProxyCommand, HostKeyAlias, UserKnownHostsFile); hosts.toml values win over it, like command-line
options win in ssh(1). known_hosts is checked (unknown keys rejected) unless the host opts in with
`accept_new_host_key = true` (OpenSSH's accept-new: learn unknown keys, never replace one).

Tests point this at their own files with $DFLASHCTL_SSH_CONFIG (an ssh_config path, or /dev/null for none) and
$DFLASHCTL_KNOWN_HOSTS (the known_hosts file to check and extend).
"""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass
from pathlib import Path

from dflashctl.errors import ConnectFailed
from dflashctl.model import Host
from dflashctl.remote.sshlib import paramiko


@dataclass(frozen=True)
class Endpoint:
    """Where one ssh hop goes, after ~/.ssh/config and hosts.toml are merged."""

    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    proxy_jump: str | None
    known_hosts: Path
    proxy_command: str | None = None  # only when there is no ProxyJump (ProxyJump wins, as hosts.toml's does)
    host_key_alias: str | None = None

    @property
    def known_hosts_name(self) -> str:
        """The name its key is filed under in known_hosts: HostKeyAlias as is (ssh(1) adds no port to it)."""
        if self.host_key_alias:
            return self.host_key_alias
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"

    def __str__(self) -> str:
        return f"{self.user}@{self.hostname}:{self.port}"


def ssh_config_path() -> Path | None:
    env = os.environ.get("DFLASHCTL_SSH_CONFIG")
    if env is not None:
        return Path(env) if env and env != os.devnull else None
    default = Path("~/.ssh/config").expanduser()
    return default if default.exists() else None


def _enable_match_exec(path: Path) -> None:
    """Give paramiko the `invoke` it was imported without (sshlib.py), for a config that has `Match … exec`."""
    text = path.read_text(errors="replace")
    if paramiko.config.invoke is None and any(
            ln.split()[:1] == ["match"] and "exec" in ln.split() for ln in text.lower().splitlines()):
        import invoke

        paramiko.config.invoke = invoke


def load_ssh_config() -> paramiko.SSHConfig:
    path = ssh_config_path()
    if path is None or not path.exists():
        return paramiko.SSHConfig()
    try:
        _enable_match_exec(path)
        return paramiko.SSHConfig.from_path(str(path))
    except Exception as e:  # paramiko raises assorted types for bad files
        raise ConnectFailed(f"cannot read ssh config {path}: {e}") from None


def resolve(
    alias: str,
    cfg: paramiko.SSHConfig,
    *,
    port: int | None = None,
    user: str | None = None,
    identity_file: str | None = None,
    proxy_jump: str | None = None,
) -> Endpoint:
    """Merge explicit settings (hosts.toml / a ProxyJump element) over ~/.ssh/config for alias."""
    opts = cfg.lookup(alias)
    identities = [identity_file] if identity_file else []
    identities += [i for i in opts.get("identityfile", []) if i not in identities]
    jump = _unless_none(proxy_jump or opts.get("proxyjump"))
    env_kh = os.environ.get("DFLASHCTL_KNOWN_HOSTS")
    cfg_kh = (opts.get("userknownhostsfile") or "").split()
    known_hosts = env_kh or (cfg_kh[0] if cfg_kh else "~/.ssh/known_hosts")
    return Endpoint(
        hostname=opts.get("hostname", alias),
        port=int(port or opts.get("port", 22)),
        user=user or opts.get("user") or getpass.getuser(),
        identity_files=tuple(os.path.expanduser(i) for i in identities),
        proxy_jump=jump,
        known_hosts=Path(os.path.expanduser(known_hosts)),
        proxy_command=None if jump else _unless_none(opts.get("proxycommand")),
        host_key_alias=opts.get("hostkeyalias"),
    )


def chain_to(host: Host, cfg: paramiko.SSHConfig) -> list[Endpoint]:
    """Every hop to host: its ProxyJump hosts in order, then host itself (hosts.toml settings over cfg's)."""
    target = resolve(host.address, cfg, port=host.port, user=host.user, identity_file=host.identity_file,
                     proxy_jump=host.proxy_jump)
    jumps = parse_jump(target.proxy_jump) if target.proxy_jump else []
    return [*(resolve(h, cfg, port=p, user=u) for h, u, p in jumps), target]


def _unless_none(value: str | None) -> str | None:
    """ssh_config's `none` turns an inherited ProxyJump / ProxyCommand off."""
    return None if value is None or value.strip().lower() == "none" else value


def parse_jump(spec: str) -> list[tuple[str, str | None, int | None]]:
    """ProxyJump `[user@]host[:port][,…]` (or ssh://[user@]host[:port]) -> [(host, user, port)]."""
    hops = []
    for raw in spec.split(","):
        item = raw.strip().removeprefix("ssh://")
        user = None
        if "@" in item:
            user, _, item = item.rpartition("@")
        port = None
        if item.startswith("["):  # [v6addr]:port
            host, _, rest = item[1:].partition("]")
            if rest.startswith(":"):
                port = int(rest[1:])
        elif item.count(":") == 1:
            host, _, p = item.partition(":")
            port = int(p)
        else:
            host = item
        hops.append((host, user, port))
    return hops


class UnknownHostKey(paramiko.SSHException):
    """Raised by `RejectUnknown`: the host's key is not in known_hosts."""


class RejectUnknown(paramiko.MissingHostKeyPolicy):
    def missing_host_key(self, client, hostname, key):
        raise UnknownHostKey(hostname, key)


class AcceptNew(paramiko.MissingHostKeyPolicy):
    """OpenSSH's StrictHostKeyChecking=accept-new: remember an unknown key (appending a line),
    still refuse a changed one (paramiko raises BadHostKeyException before asking a policy)."""

    def __init__(self, path: Path):
        self.path = path

    def missing_host_key(self, client, hostname, key):
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(self.path, "a") as f:
            f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")

