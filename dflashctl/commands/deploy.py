"""deploy: ship the local trainer/ tree into <workspace>/code, only when it changed.

The hash decides: the tree is hashed here and, with the same code, there (the files really on
disk, not just the recorded hash, so an edit in place is noticed). Equal hashes: nothing is sent.
"""

from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass
from pathlib import Path

import dflashctl
from dflashctl.errors import ConfigError, DflashError, ExitCode
from dflashctl.remote import codetree, scripts
from dflashctl.remote.target import Target


@dataclass(frozen=True)
class CodeState:
    local_hash: str
    remote_hash: str | None  # hash of the files deployed there (None: nothing deployed)
    recorded_hash: str | None  # what the last deploy recorded
    remote_path: str | None

    @property
    def current(self) -> bool:
        return self.remote_hash == self.local_hash and self.recorded_hash == self.local_hash


@dataclass(frozen=True)
class DeployResult:
    changed: bool
    hash: str
    files: int
    bytes_sent: int
    path: str | None
    seconds: float
    previous_hash: str | None = None


def trainer_source(source: Path | None = None) -> Path:
    """The trainer package directory to ship: --source, else the `trainer` installed with us."""
    if source is not None:
        path = Path(source).expanduser()
        if path.is_dir() and path.name != "trainer" and (path / "trainer").is_dir():
            path = path / "trainer"
        if not path.is_dir() or not any(path.glob("*.py")):
            raise ConfigError(f"{path} is not a trainer package (no Python files)",
                              hint="point --source at the `trainer/` directory of a dflashctl checkout")
        return path.resolve()
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


def local_hash(source: Path) -> str:
    digest = codetree.tree_hash(str(source))
    assert digest is not None
    return digest


def check(target: Target, source: Path | None = None) -> CodeState:
    src = trainer_source(source)
    remote = scripts.call(target, "codetree", "state", {"workspace": target.host.workspace}, timeout=120)
    return CodeState(local_hash(src), remote.get("actual"), remote.get("recorded"), remote.get("path"))


def deploy(target: Target, source: Path | None = None, *, force: bool = False,
           state: CodeState | None = None) -> DeployResult:
    t0 = time.monotonic()
    src = trainer_source(source)
    state = state or check(target, src)
    files = codetree.iter_files(str(src))
    if state.current and not force:
        return DeployResult(False, state.local_hash, len(files), 0, state.remote_path, time.monotonic() - t0,
                            state.recorded_hash)
    data = codetree.pack(str(src))
    res = scripts.call(target, "codetree", "install", {"workspace": target.host.workspace, "hash": state.local_hash},
                       data=data, timeout=300)
    if "error" in res:
        raise DflashError(f"deploy to {target.host.name} failed: {res['error']}", exit_code=ExitCode.CRASHED)
    return DeployResult(True, res["hash"], len(files), len(data), res.get("path"), time.monotonic() - t0,
                        state.recorded_hash)
