"""The agent archive: every container program in one content-hashed zip application, built here in memory.

`python3 <archive> VERB [ARGS]` runs one program (agent/verbs.py says which). Its contents are computed, not listed: the
modules agent/verbs.py's table names (the sentinel among them: sentinel/main.py, which judges a run with the very engine
`status` runs), and everything they import from dflashctl, followed through every import statement (lazy ones too) with
the packages' `__init__.py` above them. The zip is byte-identical for identical sources (fixed timestamps, sorted
names), so its sha256 names it: the path it is installed at, what meta.json records of a run's engine, and what tells a
container that already holds it from one that does not (remote/agentcall.py). Built once per version of the sources on
this machine and kept (archive(): keyed by the sources' sizes and mtimes).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import time
from functools import lru_cache
from pathlib import Path

import dflashctl
from dflashctl.agent.verbs import VERBS

PACKAGE_DIR = Path(dflashctl.__file__).parent
ROOTS = ("dflashctl.agent.verbs", *sorted({f"dflashctl.{module}" for module, _, _ in VERBS.values()}))
MAIN = """import sys

from dflashctl.agent.verbs import main

sys.exit(main(sys.argv[1:], sys.argv[0]))
"""
_EPOCH = (2020, 1, 1, 0, 0, 0)


def module_path(name: str) -> Path | None:
    """The file of dotted module `name` in this installation (a package: its __init__.py); None if it is none."""
    base = PACKAGE_DIR.parent.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def imports_of(path: Path, name: str) -> set[str]:
    """The dflashctl modules one file imports anywhere in it (`from P import m` counts as P.m when m is a module)."""
    import ast  # here: only a build needs it (a command reads the cached archive)

    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([base] if base else [])])
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names if module_path(f"{base}.{a.name}"))
    return {n for n in found if n == "dflashctl" or n.startswith("dflashctl.")}


def closure(roots: tuple[str, ...] = ROOTS) -> list[str]:
    """Every dflashctl module the roots need, with each package above each of them, sorted."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = module_path(name)
        if path is None:
            raise ValueError(f"{name} is imported by the container's programs but is no module of dflashctl")
        seen.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        todo += sorted(imports_of(path, name) - seen)
    return sorted(seen)


def files(names: list[str]) -> list[tuple[str, bytes]]:
    out = []
    for name in names:
        path = module_path(name)
        assert path is not None
        out.append((path.relative_to(PACKAGE_DIR.parent).as_posix(), path.read_bytes()))
    return sorted(out)


def pack(entries: list[tuple[str, bytes]]) -> bytes:
    """A deterministic zip of (name, bytes) entries plus `__main__.py`."""
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in sorted([("__main__.py", MAIN.encode()), *entries]):
            info = zipfile.ZipInfo(name, _EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            z.writestr(info, data)
    return buf.getvalue()


def build() -> bytes:
    """The archive's bytes, built from this installation's sources (ast-parsing its closure: ~0.3 s of CPU)."""
    return pack(files(closure()))


def signature() -> str:
    """The identity of this installation's sources: every module's path, size and mtime (stat only, ~2 ms). Dot-names
    (an editor's `.#launcher.py` lock, a dangling symlink) are no modules; a file that cannot be read counts as such
    (the build then names what is missing), never a traceback in every command."""
    h = hashlib.sha256()
    for top, dirs, names in os.walk(PACKAGE_DIR):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
        for name in sorted(n for n in names if n.endswith(".py") and not n.startswith(".")):
            try:
                st = os.stat(os.path.join(top, name))
                h.update(f"{os.path.join(top, name)} {st.st_size} {st.st_mtime_ns}\n".encode())
            except OSError:
                h.update(f"{os.path.join(top, name)} unreadable\n".encode())
    return h.hexdigest()


def cache_dir() -> Path | None:
    """This user's private folder for built archives (made 0700 if missing); None when it is not safely ours."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    path = Path(base, "dflashctl", "agentpack")
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return path


@lru_cache(maxsize=1)
def archive() -> bytes:
    """The archive's bytes: built once per version of the sources and kept in cache_dir (every command needs its
    sha256 to name it; building it each time cost more than the rest of a one-shot status's laptop side). A cached
    entry starts with the sha256 of the rest, checked on every read; a damaged one is built again."""
    folder = cache_dir()
    entry = folder / f"{signature()}.pyz" if folder is not None else None
    if entry is not None:
        with contextlib.suppress(OSError):
            data = entry.read_bytes()
            if hashlib.sha256(data[64:]).hexdigest().encode() == data[:64]:
                return data[64:]
    data = build()
    if entry is not None:
        tmp = entry.with_name(f".{entry.name}.{os.getpid()}.tmp")
        try:
            tmp.write_bytes(hashlib.sha256(data).hexdigest().encode() + data)
            os.replace(tmp, entry)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()
        _prune(entry)
    return data


def _prune(keep: Path) -> None:
    """Entries of other versions of the sources untouched for a day go (each edit of a checkout makes one)."""
    for old in keep.parent.glob("*.pyz"):
        with contextlib.suppress(OSError):
            if old != keep and old.stat().st_mtime < time.time() - 86400:
                old.unlink()


@lru_cache(maxsize=1)
def sha256() -> str:
    return hashlib.sha256(archive()).hexdigest()
