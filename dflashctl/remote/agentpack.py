"""The agent archive: every container program in one content-hashed zip application, built here in memory.

`python3 <archive> VERB [ARGS]` runs one program (agent/verbs.py says which). Its contents are computed, not listed:
the modules agent/verbs.py's table names, the sentinel (sentinel/main.py, which judges a run with the very engine
`status` runs), and everything they import from dflashctl, followed through every import statement (lazy ones too)
with the packages' `__init__.py` above them. The zip is byte-identical for identical sources (fixed timestamps, sorted
names), so its sha256 names it: the path it is installed at, what meta.json records of a run's engine, and what
tells a container that already holds it from one that does not (remote/agentcall.py).
"""

from __future__ import annotations

import ast
import hashlib
import io
import zipfile
from functools import lru_cache
from pathlib import Path

import dflashctl
from dflashctl.agent.verbs import VERBS

PACKAGE_DIR = Path(dflashctl.__file__).parent
ROOTS = ("dflashctl.sentinel.main", "dflashctl.agent.verbs",
         *sorted({f"dflashctl.agent.{module}" for module, _, _ in VERBS.values()}))
MAIN = """import sys

if sys.argv[1:2] == ["sentinel"]:
    from dflashctl.sentinel.main import main
    sys.exit(main(sys.argv[2:]))
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
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in sorted([("__main__.py", MAIN.encode()), *entries]):
            info = zipfile.ZipInfo(name, _EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            z.writestr(info, data)
    return buf.getvalue()


@lru_cache(maxsize=1)
def archive() -> bytes:
    """The archive's bytes, from this installation's sources."""
    return pack(files(closure()))


@lru_cache(maxsize=1)
def sha256() -> str:
    return hashlib.sha256(archive()).hexdigest()
