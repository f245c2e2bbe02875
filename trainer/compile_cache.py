"""A half-written inductor cache (issue 24): a run killed while torch.compile wrote a kernel leaves a truncated
artefact (a 0-byte `…main.so`, an empty generated `.py`) that every later compile loads and dies on
(`torch._inductor.exc.InductorError: ImportError: …main.so: file too short`). The trainer recognises that load
failure, removes the artefact (and any other empty compiled artefact, never anything outside the cache directory),
and compiles again once.

The cache directory is TORCHINDUCTOR_CACHE_DIR when set (dflashctl's launcher sets one per workspace unless the
user did), else inductor's default (/tmp/torchinductor_<user>). Recognising is pure; removing is the one I/O here.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

ARTEFACT_SUFFIXES = (".so", ".py", ".cpp", ".h", ".cubin", ".hsaco", ".json")
"""What inductor writes as compiled output; an empty one of these is never valid."""
_SO_LOAD = re.compile(r"(/\S+?\.so)\S*?: (?:file too short|invalid ELF header|file truncated|"
                      r"cannot open shared object file|unexpected EOF|ELF load command)")
_EMPTY_MODULE = re.compile(r"module '(?:torch\._inductor\.runtime\.compile_tasks\.|)(c[a-z0-9]{20,})' has no attribute")


@dataclass(frozen=True)
class CacheFailure:
    """A compile failure caused by a corrupt cache artefact: `artefact` is its path, or its generated-module key
    (the file stem) when the error names only the module."""

    artefact: str
    error: str
    """The first line of the innermost error, `Type: message`."""


def cache_dir() -> Path:
    """Inductor's cache directory for this process (what it reads and writes)."""
    env = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if env:
        return Path(env)
    from torch._inductor.runtime.cache_dir_utils import cache_dir as inductor_cache_dir

    return Path(inductor_cache_dir())


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    while exc is not None and exc not in out:
        out.append(exc)
        exc = exc.__cause__ or exc.__context__
    return out


def recognise(exc: BaseException) -> CacheFailure | None:
    """The corrupt artefact behind `exc` (anywhere in its cause chain or message), or None for any other failure."""
    for e in _chain(exc):
        for line in str(e).splitlines():
            m = _SO_LOAD.search(line) or _EMPTY_MODULE.search(line)
            if m:
                said = line.strip() if re.match(r"\w+(Error|Exception): ", line.strip()) else \
                    f"{type(e).__name__}: {line.strip()}"
                return CacheFailure(m.group(1), said[:300])
    return None


def empty_artefacts(root: Path) -> list[Path]:
    """Compiled artefacts of 0 bytes under `root`: what a kill mid-write leaves (never a valid file). One of them
    can break a compile without being named: a 0-byte ISA-probe `.so` makes inductor judge the CPU unvectorised,
    and the kernels it then builds fail to compile."""
    out = []
    for p in root.rglob("*"):
        try:
            if p.suffix in ARTEFACT_SUFFIXES and p.is_file() and not p.is_symlink() and p.stat().st_size == 0:
                out.append(p)
        except OSError:
            continue
    return sorted(out)


def diagnose(exc: BaseException, root: Path) -> CacheFailure | None:
    """`recognise`, or else, when `root` holds empty compiled artefacts, the first of them as the culprit (the
    error then names something else: a kernel that failed to build because of it). None: not the cache's doing."""
    found = recognise(exc)
    if found is not None and not Path(found.artefact).is_absolute() and root.is_dir():
        files = sorted(p for p in root.rglob(f"{found.artefact}*") if p.suffix in ARTEFACT_SUFFIXES)
        return CacheFailure(str(files[0]), found.error) if files else found
    if found is not None or not root.is_dir():
        return found
    empty = empty_artefacts(root)
    if not empty:
        return None
    inner = _chain(exc)[-1]
    first = next((ln for ln in str(inner).strip().splitlines() if ln.strip()), "")
    return CacheFailure(str(empty[0]), f"{type(inner).__name__}: {first}"[:300])


def reset_inprocess() -> None:
    """Forget what this process cached about the old artefacts, so the compile again starts clean: dynamo's
    compiled frames and inductor's per-process ISA verdicts (a failed probe is remembered for the process)."""
    import torch

    torch._dynamo.reset()
    try:
        from torch._inductor import cpu_vec_isa

        for obj in vars(cpu_vec_isa).values():
            for name in dir(obj) if isinstance(obj, type) else ():
                fn = getattr(obj, name, None)
                if callable(getattr(fn, "cache_clear", None)):
                    fn.cache_clear()
            if callable(getattr(obj, "cache_clear", None)):
                obj.cache_clear()
    except Exception:  # private API: a torch without it has nothing to clear
        pass


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
        return True
    except (ValueError, OSError):
        return False


def remove_corrupt(failure: CacheFailure, root: Path) -> list[Path]:
    """Delete the failing artefact (with its same-stem siblings: a .so with its .cpp) and every other empty
    compiled artefact under `root`; only files inside `root`. Returns what was removed."""
    doomed: set[Path] = set()
    named = Path(failure.artefact)
    if named.is_absolute():
        if _inside(named, root):
            stem = named.name.split(".")[0]
            doomed |= {p for p in named.parent.glob(f"{stem}*") if p.is_file() and p.suffix in ARTEFACT_SUFFIXES}
            doomed.add(named)
    else:  # a generated module's key: its files wherever they are in the cache
        doomed |= {p for p in root.rglob(f"{failure.artefact}*") if p.is_file() and p.suffix in ARTEFACT_SUFFIXES}
    doomed |= set(empty_artefacts(root))
    removed = []
    for p in sorted(doomed):
        if not _inside(p, root):
            continue
        try:
            p.unlink()
            removed.append(p)
        except FileNotFoundError:
            continue
    return removed


def recovered_line(failure: CacheFailure, removed: list[Path], root: Path) -> str:
    """The log line of a recovery (diagnose matches `compile cache: corrupt artefact`)."""
    return (f"compile cache: corrupt artefact {failure.artefact} ({failure.error}); removed {len(removed)} file(s) "
            f"from {root}; compiling again once")


def failed_again_line(exc: BaseException, root: Path) -> str:
    """The log line when the compile fails again after the recovery."""
    inner = _chain(exc)[-1]
    first = next((ln for ln in str(inner).strip().splitlines() if ln.strip()), "")
    return (f"compile cache: the compile failed again after removing corrupt artefacts from {root}: "
            f"{type(inner).__name__}: {first}"[:400])
