"""deploy: ship a local directory into <workspace>/code, only when it changed.

Which directory (first that applies): `--source DIR`, the host's `code_source`, the `trainer`
package installed with dflashctl. A package directory named `trainer` lands as
`code/trainer/...` (what `python -m trainer` needs); any other directory's files land directly
under `code/`. Which files ship and how they are hashed is agent/codetree.py, run on both sides.
The hash decides: the tree is hashed here and, with the same code, there (the files really on
disk, not just the recorded hash, so an edit in place is noticed). Equal hashes: nothing is sent.
Size limits (per file, in all) refuse a tree before anything is read or sent.
"""

from __future__ import annotations

import contextlib
import importlib.util
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dflashctl
from dflashctl.agent import codetree
from dflashctl.config import host_key_error
from dflashctl.errors import ConfigError, DflashError, ExitCode
from dflashctl.model import Host
from dflashctl.remote import agentcall
from dflashctl.remote.target import Target

MiB = 1024 * 1024
SHOWN = 3  # offenders named in a size-limit message


@dataclass(frozen=True)
class Source:
    """The local tree to ship and where it lands below <workspace>/code."""

    path: Path
    prefix: str  # "trainer": lands as code/trainer/...; "": its files directly under code/

    @property
    def label(self) -> str:
        return self.prefix or self.path.name


@dataclass(frozen=True)
class Limits:
    max_file_mib: float = 50.0
    max_total_mib: float = 200.0

    @classmethod
    def of(cls, host: Host, max_file_mib: float | None = None, max_total_mib: float | None = None) -> Limits:
        """The host's limits (hosts.toml code_max_*_mib), overridden by the options given."""
        return cls(host.code_max_file_mib if max_file_mib is None else max_file_mib,
                   host.code_max_total_mib if max_total_mib is None else max_total_mib)


@dataclass(frozen=True)
class CodeState:
    local_hash: str
    remote_hash: str | None  # hash of the files deployed there (None: nothing deployed)
    recorded_hash: str | None  # what the last deploy recorded
    remote_path: str | None
    source: Source | None = None  # what local_hash is the hash of
    files: int = 0
    total_bytes: int = 0

    @property
    def current(self) -> bool:
        return self.remote_hash == self.local_hash and self.recorded_hash == self.local_hash

    def to_record(self, host: str) -> dict[str, Any]:
        """`deploy --check --json`."""
        return {"host": host, "current": self.current, "local_hash": self.local_hash,
                "remote_hash": self.remote_hash, "recorded_hash": self.recorded_hash, "path": self.remote_path,
                "source": str(self.source.path) if self.source else None, "files": self.files}


@dataclass(frozen=True)
class DeployResult:
    changed: bool
    hash: str
    files: int
    bytes_sent: int
    path: str | None
    seconds: float
    source: Source | None = None

    def to_record(self, host: str) -> dict[str, Any]:
        """`deploy --json`."""
        return {"host": host, "changed": self.changed, "hash": self.hash, "files": self.files,
                "bytes_sent": self.bytes_sent, "path": self.path, "seconds": round(self.seconds, 3),
                "source": str(self.source.path) if self.source else None}


def resolve_source(host: Host | None, source: Path | None = None) -> Source:
    """--source, else the host's code_source, else the trainer installed with us."""
    if source is not None:
        return _source(Path(source).expanduser(), lambda problem: ConfigError(
            f"--source {source}: {problem}", hint="pass the directory of the code to deploy"))
    if host is not None and host.code_source:
        return _source(Path(host.code_source), lambda problem: host_key_error(
            host, "code_source", f"{host.code_source}: {problem}",
            hint="fix code_source in hosts.toml, or pass --source DIR"))
    return Source(bundled_trainer(), "trainer")


def _source(path: Path, error: Callable[[str], ConfigError]) -> Source:
    if not path.exists():
        raise error("no such directory")
    if not path.is_dir():
        raise error("not a directory")
    path = path.resolve()
    package = path.name == "trainer" and any((path / f).is_file() for f in ("__init__.py", "__main__.py"))
    return Source(path, "trainer" if package else "")


def bundled_trainer() -> Path:
    # The checkout's trainer/ next to dflashctl/ first (an editable install, or running from the tree),
    # then the installed package; only a real one (with __main__.py), never a namespace look-alike
    # such as tests/trainer/ when tests/ is on sys.path.
    candidates = [Path(dflashctl.__file__).resolve().parent.parent / "trainer"]
    spec = importlib.util.find_spec("trainer")
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(p) for p in spec.submodule_search_locations]
    for path in candidates:
        if (path / "__main__.py").is_file():
            return path.resolve()
    raise ConfigError("no local `trainer` package to deploy", hint="run from a checkout or pass --source DIR")


def _size(n: int) -> str:
    return f"{n / MiB / 1024:.1f} GiB" if n >= 1024 * MiB else f"{n / MiB:.1f} MiB"


@contextlib.contextmanager
def _reading(src: Source) -> Iterator[None]:
    """A file of the tree that cannot be read (not ours, a dangling mount, …) is one line naming it, not a
    traceback, whether it fails while the tree is listed, hashed or packed."""
    try:
        yield
    except OSError as e:
        raise ConfigError(f"cannot read {e.filename or src.path}: {e.strerror or e}",
                          hint="fix its permissions, or exclude it in .dflashignore") from None


def files_of(src: Source, limits: Limits) -> list[tuple[str, str, int]]:
    """The files that ship from src (codetree.scan), refused in one line when over a size limit."""
    with _reading(src):
        entries = codetree.scan(str(src.path), src.prefix)
    if not entries:
        raise ConfigError(f"nothing to deploy in {src.path}: no file ships from it",
                          hint="see docs/usage.md for what is left out (caches, virtualenvs, ignored files)")
    where = src.path / ".dflashignore"
    biggest = sorted(entries, key=lambda e: (-e[2], e[0]))

    def named(items: list[tuple[str, str, int]], more: bool = True) -> str:
        shown = ", ".join(f"{rel[len(src.prefix) + 1:] if src.prefix else rel} ({_size(size)})"
                          for rel, _p, size in items[:SHOWN])
        return shown + (f" and {len(items) - SHOWN} more" if more and len(items) > SHOWN else "")

    def example(rel: str, directory: bool) -> str:  # an anchored .dflashignore line: the file, or its directory
        rel = rel[len(src.prefix) + 1:] if src.prefix else rel
        return f"/{rel.rsplit('/', 1)[0]}/" if directory and "/" in rel else f"/{rel}"

    too_big = [e for e in biggest if e[2] > limits.max_file_mib * MiB]
    if too_big:
        n = len(too_big)
        raise ConfigError(
            f"refusing to deploy {src.path}: {n} file{'s' if n > 1 else ''} over the {limits.max_file_mib:g} MiB "
            f"per-file limit: {named(too_big)}",
            hint=f"exclude {'them' if n > 1 else 'it'} in {where} (a line like `{example(too_big[0][0], False)}`), "
                 f"or raise the limit (--max-file-mib, or code_max_file_mib in hosts.toml)")
    total = sum(e[2] for e in entries)
    if total > limits.max_total_mib * MiB:
        raise ConfigError(
            f"refusing to deploy {src.path}: {_size(total)} in {len(entries)} files is over the "
            f"{limits.max_total_mib:g} MiB total limit; biggest: {named(biggest, more=False)}",
            hint=f"exclude what need not ship in {where} (a line like `{example(biggest[0][0], True)}`), "
                 f"or raise the limit (--max-total-mib, or code_max_total_mib in hosts.toml)")
    return entries


def check(target: Target, source: Path | None = None, *, limits: Limits | None = None) -> CodeState:
    src = resolve_source(target.host, source)
    entries = files_of(src, limits or Limits.of(target.host))
    remote = agentcall.call(target, "code-state", {"workspace": target.host.workspace}, timeout=120)
    with _reading(src):
        local_hash = codetree.digest(entries)
    return CodeState(local_hash, remote.get("actual"), remote.get("recorded"), remote.get("path"),
                     src, len(entries), sum(e[2] for e in entries))


def deploy(target: Target, source: Path | None = None, *, force: bool = False,
           state: CodeState | None = None, limits: Limits | None = None) -> DeployResult:
    t0 = time.monotonic()
    state = state or check(target, source, limits=limits)
    src = state.source or resolve_source(target.host, source)
    if state.current and not force:
        return DeployResult(False, state.local_hash, state.files, 0, state.remote_path, time.monotonic() - t0, src)
    entries = files_of(src, limits or Limits.of(target.host))
    with _reading(src):
        data = codetree.pack(str(src.path), src.prefix, entries)
    res = agentcall.call(target, "code-install", {"workspace": target.host.workspace, "hash": state.local_hash},
                         data=data, timeout=300)
    if "error" in res:
        raise DflashError(f"deploy to {target.host.name} failed: {res['error']}", exit_code=ExitCode.CRASHED,
                          hint="a file changed while it was sent? run deploy again" if "mismatch" in res["error"]
                          else None)
    return DeployResult(True, res["hash"], len(entries), len(data), res.get("path"), time.monotonic() - t0, src)
