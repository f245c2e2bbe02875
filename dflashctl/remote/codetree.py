"""The trainer tree: which files ship, its content hash, and installing it (stdlib only).

Imported here to pack and hash the local tree, and sent to the container (as source) to hash the
deployed tree and install a new one, so both sides hash with the very same code. Install layout:
`<workspace>/.code/<hash16>/trainer/...` plus `.dflash-code-hash`, with `<workspace>/code` a
symlink swapped atomically; a running trainer keeps the version it started in (its cwd), and old
versions are pruned only when no process works in them.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
import time

FRAME = "DFLASH-RESULT "
HASH_FILE = ".dflash-code-hash"
SKIP_DIRS = {"__pycache__", ".venv", "venv", ".git", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis",
             "build", "dist", ".ipynb_checkpoints"}
SKIP_SUFFIXES = (".pyc", ".pyo", ".egg-info", ".swp", "~")
KEEP_VERSIONS = 3


def iter_files(root: str) -> list[str]:
    """Relative posix paths of the files that ship, sorted (symlinks and caches never do)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info")
                             and not os.path.islink(os.path.join(dirpath, d)))
        for name in filenames:
            path = os.path.join(dirpath, name)
            if name.endswith(SKIP_SUFFIXES) or os.path.islink(path) or not os.path.isfile(path):
                continue
            out.append(os.path.relpath(path, root).replace(os.sep, "/"))
    return sorted(out)


def tree_hash(root: str) -> str | None:
    """sha256 over (path, executable bit, content sha256) of every shipped file; None if no tree."""
    if not os.path.isdir(root):
        return None
    h = hashlib.sha256()
    for rel in iter_files(root):
        path = os.path.join(root, rel)
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        mode = "x" if os.stat(path).st_mode & 0o111 else "-"
        h.update(f"{rel}\0{mode}\0{digest}\n".encode())
    return h.hexdigest()


def pack(root: str, arc_root: str = "trainer") -> bytes:
    """A gzip tar of the shipped files under `arc_root/` (deterministic: fixed owner and mtime)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
        for rel in iter_files(root):
            path = os.path.join(root, rel)
            info = tarfile.TarInfo(f"{arc_root}/{rel}")
            info.size = os.path.getsize(path)
            info.mode = 0o755 if os.stat(path).st_mode & 0o111 else 0o644
            info.mtime = 0
            with open(path, "rb") as f:
                tar.addfile(info, f)
    return buf.getvalue()


def _emit(doc: dict) -> int:
    sys.stdout.write(FRAME + json.dumps(doc) + "\n")
    sys.stdout.flush()
    return 0


def state(spec: dict) -> int:
    """Remote: what is deployed: the recorded hash and the hash of the files really there."""
    code = os.path.join(spec["workspace"], "code")
    recorded = None
    with contextlib.suppress(OSError), open(os.path.join(code, HASH_FILE)) as f:
        recorded = f.read().strip() or None
    return _emit({"recorded": recorded, "actual": tree_hash(os.path.join(code, "trainer")),
                  "path": os.path.realpath(code) if os.path.exists(code) else None})


def install(spec: dict) -> int:
    """Remote: unpack the tar on stdin into a fresh version dir, verify its hash, swap `code`."""
    ws = spec["workspace"]
    versions = os.path.join(ws, ".code")
    os.makedirs(versions, exist_ok=True)
    tmp = os.path.join(versions, f".tmp-{os.getpid()}-{int(time.time())}")
    os.mkdir(tmp)
    try:
        with tarfile.open(fileobj=io.BytesIO(sys.stdin.buffer.read()), mode="r:gz") as tar:
            for m in tar.getmembers():
                parts = m.name.split("/")
                if not m.isfile() or m.name.startswith("/") or ".." in parts or parts[0] != "trainer":
                    return _emit({"error": f"refusing tar member {m.name!r}"})
                dest = os.path.join(tmp, *parts)
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                src = tar.extractfile(m)
                with open(dest, "wb") as f:
                    shutil.copyfileobj(src, f)
                os.chmod(dest, m.mode & 0o755)
        got = tree_hash(os.path.join(tmp, "trainer"))
        if got != spec["hash"]:
            return _emit({"error": f"hash mismatch after unpacking: expected {spec['hash']}, got {got}"})
        with open(os.path.join(tmp, HASH_FILE), "w") as f:
            f.write(got + "\n")
        final = os.path.join(versions, got[:16])
        try:
            os.rename(tmp, final)
        except OSError:  # this version is already there (an earlier or a concurrent deploy): keep it
            if not os.path.isdir(final):
                raise
            shutil.rmtree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    link = os.path.join(ws, "code")
    moved = None
    if os.path.isdir(link) and not os.path.islink(link):  # a hand-copied tree from before dflashctl
        moved = os.path.join(versions, f"legacy-{int(time.time())}")
        os.rename(link, moved)
    tmp_link = os.path.join(ws, f".code-link-{os.getpid()}")
    os.symlink(os.path.join(".code", got[:16]), tmp_link)
    os.replace(tmp_link, link)
    return _emit({"hash": got, "path": final, "moved_legacy": moved, "pruned": _prune(versions, final)})


def _prune(versions: str, keep: str) -> list[str]:
    """Drop old versions beyond the newest few, but never one a live process runs in (its cwd)."""
    in_use = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                in_use.add(os.path.realpath(os.readlink(f"/proc/{name}/cwd")))
    dirs = [os.path.join(versions, d) for d in os.listdir(versions) if not d.startswith(".")]
    dirs.sort(key=lambda d: os.stat(d).st_mtime, reverse=True)
    pruned = []
    for d in dirs[KEEP_VERSIONS:]:
        real = os.path.realpath(d)
        if real == os.path.realpath(keep) or any(u == real or u.startswith(real + os.sep) for u in in_use):
            continue
        shutil.rmtree(d, ignore_errors=True)
        pruned.append(d)
    return pruned
