"""hosts.toml -> Host objects, with errors that name the file, the table, the key and the line.

Search order (first found wins): `--hosts FILE`, `$DFLASHCTL_HOSTS`, `./hosts.toml`,
`~/.config/dflashctl/hosts.toml` (`$XDG_CONFIG_HOME` honoured). With none of them, the embedded
default has one host, `local`, with its workspace under the user's data dir. A file named
explicitly (option or variable) must exist; a typo there is an error, not a silent fallback.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflashctl import bounds
from dflashctl.errors import ConfigError, toml_type
from dflashctl.model import Cluster, Host, JudgeSettings

HOST_KEYS = (
    "transport", "address", "user", "port", "identity_file", "proxy_jump", "container", "workspace",
    "python", "gpus", "config", "accept_new_host_key", "persist",
    "code_source", "code_max_file_mib", "code_max_total_mib",
    "command", "progress_regex",
    "sentinel", "sentinel_interval", "notify", "on_worker_failure", "idle_limit", "stall_limit", "restart_on",
    "max_restarts", "restart_backoff", "stall_window", "node_address",
)
CLUSTER_KEYS = ("hosts", "rendezvous_port", "nproc_per_node")
GPU_KEYS = ("target", "drafters")
SSH_ONLY = ("address", "user", "port", "identity_file", "proxy_jump", "accept_new_host_key", "persist")
CONTAINER_WORKSPACE = "/workspace/dflash"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def host_record(host: Host, *, default: bool) -> dict[str, Any]:
    """One host as `hosts --json` shows it."""
    return {
        "name": host.name, "default": default, "transport": host.transport,
        "address": host.address, "user": host.user, "port": host.port, "identity_file": host.identity_file,
        "proxy_jump": host.proxy_jump, "container": host.container, "workspace": host.workspace,
        "python": host.python, "gpus": {"target": list(host.gpus_target), "drafters": list(host.gpus_drafters)},
        "config": host.config, "accept_new_host_key": host.accept_new_host_key, "persist": host.persist_s,
        "code_source": host.code_source, "command": list(host.command) if host.command is not None else None,
        "progress_regex": host.judge.progress_regex, "stall_window_s": host.judge.stall_window_s,
        "sentinel": host.sentinel, "notify": list(host.notify),
        "notify_on": None if host.notify_on is None else list(host.notify_on),
        "on_worker_failure": host.on_worker_failure, "idle_limit": host.idle_limit, "stall_limit": host.stall_limit,
        "restart_on": None if host.restart_on is None else list(host.restart_on), "max_restarts": host.max_restarts,
        "restart_backoff": host.restart_backoff,
    }


@dataclass(frozen=True)
class Inventory:
    """The hosts of one hosts.toml (or the embedded default when `path` is None)."""

    hosts: dict[str, Host]
    default: str | None = None
    path: Path | None = None
    _order: tuple[str, ...] = field(default=(), repr=False)
    clusters: dict[str, Cluster] = field(default_factory=dict)  # [clusters.NAME], each naming hosts defined here

    @property
    def source(self) -> str:
        return str(self.path) if self.path else "the embedded default inventory"

    def names(self) -> list[str]:
        return list(self._order or self.hosts)

    def to_record(self) -> dict[str, Any]:
        """`hosts --json`: every host with every key hosts.toml can set, in the inventory's order."""
        return {"source": str(self.path) if self.path else None, "default": self.default,
                "hosts": [host_record(self.hosts[n], default=n == self.default) for n in self.names()]}

    def get(self, name: str | None = None) -> Host:
        """The host called name; None means the inventory's `default`."""
        if name is None:
            if self.default is None:
                raise ConfigError(f"{self.source}: no `default` host and more than one host is defined",
                                  hint='set default = "NAME" at the top of hosts.toml, or pass --host NAME')
            name = self.default
        host = self.hosts.get(name)
        if host is None:
            known = ", ".join(self.names()) or "none"
            close = difflib.get_close_matches(name, self.names(), n=1)
            raise ConfigError(f"unknown host {name!r} in {self.source} (known: {known})",
                              hint=f"did you mean {close[0]!r}?" if close else "add it as [hosts.NAME] in hosts.toml")
        return host


def data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share")
    return Path(base) / "dflashctl"


def config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return Path(base) / "dflashctl"


def default_inventory() -> Inventory:
    """Used when no hosts.toml is found: this machine, CPU, a workspace in the user's data dir."""
    host = Host(name="local", transport="local", workspace=str(data_dir() / "workspace"), python=sys.executable)
    return Inventory({"local": host}, default="local", path=None, _order=("local",))


def find_hosts_file(path: Path | None = None) -> Path | None:
    """The hosts.toml to use, per the search order; None means the embedded default."""
    for explicit, what in ((path, "--hosts"), (os.environ.get("DFLASHCTL_HOSTS") or None, "$DFLASHCTL_HOSTS")):
        if explicit is not None:
            p = Path(explicit).expanduser()
            if not p.is_file():
                raise ConfigError(f"hosts file {p} (from {what}) does not exist",
                                  hint="pass an existing hosts.toml, or drop the option to use the default search")
            return p
    for candidate in (Path("hosts.toml"), config_dir() / "hosts.toml"):
        if candidate.is_file():
            return candidate
    return None


def load_inventory(path: Path | None = None) -> Inventory:
    found = find_hosts_file(path)
    if found is None:
        return default_inventory()
    try:
        text = found.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{found}: cannot read ({getattr(e, 'strerror', None) or e})") from None
    return parse_inventory(text, found)


def parse_inventory(text: str, path: Path) -> Inventory:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}", hint="see docs/hosts.md for the format") from None
    where = _Where(path, text)
    for key in doc:
        if key not in ("default", "hosts", "clusters"):
            raise where.error(None, key, "unknown top-level key (expected default, [hosts.NAME], [clusters.NAME])")
    hosts_table = doc.get("hosts", {})
    if not isinstance(hosts_table, dict):
        raise where.error(None, "hosts", "must be tables: [hosts.NAME]")
    hosts: dict[str, Host] = {}
    for name, table in hosts_table.items():
        if not _NAME.match(name):
            raise where.error(name, None, "host names use letters, digits, '_', '.', '-'")
        if not isinstance(table, dict):
            raise where.error(name, None, "must be a table ([hosts.NAME])")
        hosts[name] = _host(name, table, where)
    default = doc.get("default")
    if default is not None:
        if not isinstance(default, str):
            raise where.error(None, "default", f"must be a host name string, not {toml_type(default)}")
        if default not in hosts:
            known = ", ".join(hosts) or "none"
            raise where.error(None, "default", f"names host {default!r}, which is not defined (known: {known})")
    elif "local" in hosts:
        default = "local"
    elif len(hosts) == 1:
        default = next(iter(hosts))
    return Inventory(hosts, default, path, tuple(hosts), _clusters(doc.get("clusters", {}), hosts, path))


def _clusters(table: Any, hosts: dict[str, Host], path: Path) -> dict[str, Cluster]:
    """[clusters.NAME] hosts = ["pve1", "pve2"] (+ rendezvous_port, nproc_per_node), naming hosts defined here."""
    out: dict[str, Cluster] = {}
    for name, t in (table if isinstance(table, dict) else {"": None}).items():
        if not _NAME.match(name) or not isinstance(t, dict):
            raise ConfigError(f"{path}: [clusters.{name}] must be a table [clusters.NAME] (letters, digits, _ . -)")
        members, port, nproc = t.get("hosts"), t.get("rendezvous_port", 29500), t.get("nproc_per_node", 1)
        problem = next((f"{k}: unknown key (known: {', '.join(CLUSTER_KEYS)})" for k in t if k not in CLUSTER_KEYS),
                       None)
        if problem is None and (not isinstance(members, list) or not members
                                or any(not isinstance(h, str) for h in members) or len(set(members)) < len(members)):
            problem = 'hosts: must be an array of distinct host names like ["pve1", "pve2"]'
        problem = problem or next((f"hosts: names host {h!r}, which is not defined (known: {', '.join(hosts)})"
                                   for h in members if h not in hosts), None)
        if problem is None and not (type(port) is int and 0 < port < 65536 and type(nproc) is int and nproc > 0):
            problem = f"rendezvous_port (1-65535) and nproc_per_node (1 or more) are integers, not {port!r}, {nproc!r}"
        if problem:
            raise ConfigError(f"{path}: [clusters.{name}] {problem}", hint="see docs/hosts.md \"Clusters\"")
        out[name] = Cluster(name, tuple(members), port, nproc)
    return out


class _Where:
    """Builds ConfigErrors that point at file:line, [hosts.NAME] and the key."""

    def __init__(self, path: Path, text: str):
        self.path = path
        self.lines = text.splitlines()

    def line_of(self, host: str | None, key: str | None) -> int | None:
        start = 0
        if host is not None:
            header = re.compile(rf"^\s*\[\s*hosts\s*\.\s*(\"{re.escape(host)}\"|{re.escape(host)})\s*[\].]")
            start = next((i for i, ln in enumerate(self.lines) if header.match(ln)), -1)
            if start < 0:
                return None
            if key is None:
                return start + 1
            start += 1
        if key is None:
            return None
        first, _, rest = key.partition(".")
        if host is not None and rest:  # `notify.events` written in its own table: [hosts.NAME.notify] events = …
            sub = re.compile(rf"^\s*\[\s*hosts\s*\.\s*(\"{re.escape(host)}\"|{re.escape(host)})\s*\.\s*"
                             rf"{re.escape(first)}\s*\]")
            at = next((i for i, ln in enumerate(self.lines) if sub.match(ln)), None)
            if at is not None:
                inner = re.compile(rf"^\s*{re.escape(rest.split('.')[0])}\s*[=.]")
                for i in range(at + 1, len(self.lines)):
                    if self.lines[i].lstrip().startswith("["):
                        break
                    if inner.match(self.lines[i]):
                        return i + 1
                return at + 1
        pat = re.compile(rf"^\s*{re.escape(first)}\s*[=.]")
        for i in range(start, len(self.lines)):
            if host is not None and i > start and self.lines[i].lstrip().startswith("[") \
                    and not self.lines[i].lstrip().startswith(f"[hosts.{host}."):
                break
            if pat.match(self.lines[i]):
                return i + 1
        return None

    def error(self, host: str | None, key: str | None, problem: str, hint: str | None = None) -> ConfigError:
        line = self.line_of(host, key)
        loc = f"{self.path}:{line}" if line else str(self.path)
        table = f"[hosts.{host}] " if host is not None else ""
        what = f"{key}: " if key else ""
        return ConfigError(f"{loc}: {table}{what}{problem}", hint=hint or "see docs/hosts.md for every key")


def _host(name: str, t: dict[str, Any], where: _Where) -> Host:
    for key in t:
        if key not in HOST_KEYS:
            close = difflib.get_close_matches(key, HOST_KEYS, n=1)
            raise where.error(name, key, "unknown key",
                              hint=f"did you mean `{close[0]}`?" if close else f"known keys: {', '.join(HOST_KEYS)}")

    def string(key: str) -> str | None:
        v = t.get(key)
        if v is not None and (not isinstance(v, str) or not v):
            raise where.error(name, key, f"must be a non-empty string, not {toml_type(v) if v != '' else 'empty'}")
        return v

    transport = string("transport") or ("ssh" if "address" in t else "local")
    if transport not in ("local", "ssh"):
        raise where.error(name, "transport", f'must be "local" or "ssh", not {transport!r}')
    if transport == "local":
        for key in SSH_ONLY:
            if key in t:
                raise where.error(name, key, 'only applies to transport = "ssh"')
    address = string("address")
    if transport == "ssh" and not address:
        raise where.error(name, "address" if "address" in t else None,
                          'transport = "ssh" needs an address (a hostname, IP or ~/.ssh/config alias)')
    port = t.get("port")
    if port is not None and (type(port) is not int or not 0 < port < 65536):
        raise where.error(name, "port", f"must be an integer 1-65535, not {port!r}")
    container = t.get("container")
    if container is not None and (type(container) is not int or container < 1):
        raise where.error(name, "container", f"must be a CTID (a positive integer like 200), not {container!r}")
    accept = t.get("accept_new_host_key", False)
    if type(accept) is not bool:
        raise where.error(name, "accept_new_host_key", f"must be true or false, not {toml_type(accept)}")
    persist = t.get("persist", Host.persist_s)
    if bounds.problem(persist, bounds.PERSIST_S):
        raise where.error(name, "persist", f"{bounds.problem(persist, bounds.PERSIST_S)} (0 = no connection master)")
    gpus = t.get("gpus", {})
    if not isinstance(gpus, dict):
        raise where.error(name, "gpus", "must be a table: gpus.target = [0, 1], gpus.drafters = [2]")
    for key in gpus:
        if key not in GPU_KEYS:
            raise where.error(name, f"gpus.{key}", "unknown key (expected gpus.target and gpus.drafters)")
    gpu_lists = {}
    for key in GPU_KEYS:
        v = gpus.get(key, [])
        if not isinstance(v, list) or any(type(i) is not int or i < 0 for i in v):
            raise where.error(name, f"gpus.{key}", f"must be an array of GPU indices like [0, 1], not {v!r}")
        gpu_lists[key] = tuple(v)

    on_this_machine = transport == "local" and container is None
    python = string("python") or (sys.executable if on_this_machine else "python3")
    workspace = string("workspace") or CONTAINER_WORKSPACE
    if on_this_machine:
        ws = Path(workspace).expanduser()
        workspace = str(ws if ws.is_absolute() else (where.path.parent / ws).resolve())
    elif not workspace.startswith("/"):
        raise where.error(name, "workspace", f"must be an absolute path on the remote side, not {workspace!r}")
    watch = _sentinel_keys(name, t, where)
    return Host(
        name=name,
        transport=transport,  # type: ignore[arg-type]  # checked above
        address=address,
        user=string("user"),
        port=port,
        identity_file=string("identity_file"),
        proxy_jump=string("proxy_jump"),
        container=container,
        workspace=workspace,
        python=python,
        gpus_target=gpu_lists["target"],
        gpus_drafters=gpu_lists["drafters"],
        config=string("config"),
        accept_new_host_key=accept,
        persist_s=float(persist),
        source=where.path,
        **_code_keys(name, t, where),
        command=_command(name, t, where),
        judge=JudgeSettings(watch.pop("stall_window_s", None), _progress_regex(name, t, where)),  # parsed once
        node_address=string("node_address"),
        **watch,
    )


def _progress_regex(name: str, t: dict[str, Any], where: _Where) -> str | None:
    """progress_regex = 'it (?P<step>\\d+)/(?P<total>\\d+) .* loss (?P<loss>[\\d.]+)': checked here, so a typo is an
    error that names the file and line, not progress silently never seen."""
    v = t.get("progress_regex")
    if v is None:
        return None  # (analysis/progress.py not loaded: a one-shot status asks before the judging code loads)
    from dflashctl.analysis.progress import ProgressRegexError, custom

    if not isinstance(v, str):
        raise where.error(name, "progress_regex", f"must be a string (a regex), not {toml_type(v)}")
    try:
        custom(v)
    except ProgressRegexError as e:
        raise where.error(name, "progress_regex", str(e),
                          hint="named groups: step, total, loss, grad_norm, lr, epoch, tok_s, it_s, eta_s; "
                               "in TOML write it as a 'literal string' so backslashes stay") from None
    return v


def _command(name: str, t: dict[str, Any], where: _Where) -> tuple[str, ...] | None:
    """command = ["python", "train.py"]: the argv `launch` starts (in <workspace>/code) instead of the
    bundled trainer; no shell ever sees it."""
    v = t.get("command")
    if v is None:
        return None
    if not isinstance(v, list) or not v or any(not isinstance(a, str) for a in v) or not v[0]:
        got = "an empty array" if v == [] else repr(v) if isinstance(v, list) else toml_type(v)
        raise where.error(name, "command", f'must be a non-empty array of strings like ["python", "train.py"], '
                                           f"not {got}",
                          hint='the argv as the program gets it, no shell: ["torchrun", "--nproc-per-node", "8", '
                               '"train.py"]')
    return tuple(v)


def _code_keys(name: str, t: dict[str, Any], where: _Where) -> dict[str, Any]:
    """code_source (a local directory; relative = next to hosts.toml) and the deploy size limits (MiB)."""
    out: dict[str, Any] = {}
    src = t.get("code_source")
    if src is not None:
        if not isinstance(src, str) or not src:
            what = toml_type(src) if src != "" else "empty"
            raise where.error(name, "code_source", f"must be a directory path string, not {what}")
        p = Path(src).expanduser()
        out["code_source"] = str(p if p.is_absolute() else (where.path.parent / p).resolve())
    for key in ("code_max_file_mib", "code_max_total_mib"):
        v = t.get(key)
        if v is None:
            continue
        if bounds.problem(v, bounds.SIZE_MIB):
            raise where.error(name, key, f"{bounds.problem(v, bounds.SIZE_MIB)} (e.g. 50)")
        out[key] = float(v)
    return out


def _sentinel_keys(name: str, t: dict[str, Any], where: _Where) -> dict[str, Any]:
    """The run sentinel's keys, each checked by the parser the launch flags go through (hostkeys.py)."""
    from dflashctl.hostkeys import KeyProblem, host_keys
    try:
        return host_keys(t)
    except KeyProblem as e:
        raise where.error(name, e.key, e.message, hint=e.hint) from None


def host_key_error(host: Host, key: str, problem: str, hint: str | None = None) -> ConfigError:
    """An error about a host's key that parsed but turned out wrong when used (a directory gone since)."""
    if host.source is None:
        return ConfigError(f"[hosts.{host.name}] {key}: {problem}", hint=hint)
    try:
        text = host.source.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        text = ""
    return _Where(host.source, text).error(host.name, key, problem, hint)
