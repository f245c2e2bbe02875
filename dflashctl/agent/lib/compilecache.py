"""Where a run's compile cache lives, and what a killed compile leaves half-written in it (stdlib only).

Runs dflashctl launches get TORCHINDUCTOR_CACHE_DIR=<workspace>/cache/inductor and TRITON_CACHE_DIR=
<workspace>/cache/triton unless the user set either (launcher.py `_run_env`). `stop` and `kill-zombies` then remove
exactly what a process they killed can have left half-written there (issue 24), read from torch 2.13's inductor:

* codecache.write_atomic writes `<dir>/.<pid>.<thread id>.tmp` and renames it over the artefact: a kill before the
  rename leaves that temp file, named after the killed pid;
* a C++ kernel's `.so` (and its `.o`) is written in place by the compiler/linker (cpp_builder.CppBuilder.build,
  `-o <dir>/<key>.so`), and codecache's `_worker_compile_cpp` skips any path that exists: a kill mid-link leaves a
  0-byte or truncated ELF that every later run loads ("file too short");
* triton's FileCacheManager.put writes into `tmp.pid_<pid>_<uuid>/` beside the artefact and renames out of it.

Only files inside the cache directory are ever removed, never through a symlink, and only those a killed process
can have written: temp names carrying its pid, or a `.so`/`.o` modified after it started that is not a whole ELF.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil

from dflashctl.agent.lib.fsutil import read_bytes
from dflashctl.agent.lib.procfs import proc_env_var

INDUCTOR_VAR = "TORCHINDUCTOR_CACHE_DIR"
TRITON_VAR = "TRITON_CACHE_DIR"
_INDUCTOR_TMP = re.compile(r"^\.(\d+)\.\d+\.tmp$")
_TRITON_TMP = re.compile(r"^tmp\.pid_(\d+)_")
_BINARY = (".so", ".o")


def run_cache_env(workspace: str, env: dict) -> dict:
    """The cache variables a launched run gets: ours under the workspace, unless the user set them."""
    out = {}
    if not env.get(INDUCTOR_VAR):
        out[INDUCTOR_VAR] = os.path.join(workspace, "cache", "inductor")
    if not env.get(TRITON_VAR):
        out[TRITON_VAR] = os.path.join(workspace, "cache", "triton")
    return out


def cache_dirs_of(pid: int) -> list[str]:
    """The compile cache directories process pid uses: its TORCHINDUCTOR_CACHE_DIR (else inductor's default,
    <TMPDIR or /tmp>/torchinductor_<user>) and its TRITON_CACHE_DIR. Read before it is signalled."""
    dirs = []
    inductor = proc_env_var(pid, INDUCTOR_VAR)
    if not inductor:
        user = _user_of(pid)
        if user:
            inductor = os.path.join(proc_env_var(pid, "TMPDIR") or "/tmp", f"torchinductor_{user}")
    for d in (inductor, proc_env_var(pid, TRITON_VAR)):
        if d and os.path.isabs(d) and d not in dirs:
            dirs.append(d)
    return dirs


def _user_of(pid: int) -> str | None:
    for line in (read_bytes(f"/proc/{pid}/status", 8192) or b"").decode("utf-8", "replace").splitlines():
        if line.startswith("Uid:"):
            try:
                return re.sub(r'[\\/:*?"<>|]', "_", pwd.getpwuid(int(line.split()[1])).pw_name)
            except (KeyError, ValueError, IndexError):
                return None
    return None


def elf_whole(path: str) -> bool:
    """The file holds a whole ELF object: header present and the section and program header tables it names lie
    inside the file (the linker writes the section headers last: a truncated file ends before them)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            size = os.fstat(f.fileno()).st_size
    except OSError:
        return True  # unreadable: not ours to judge
    if len(head) < 52 or head[:4] != b"\x7fELF":
        return False
    little = head[5] == 1
    order = "little" if little else "big"

    def num(off: int, n: int) -> int:
        return int.from_bytes(head[off:off + n], order)

    if head[4] == 2:  # 64-bit
        if len(head) < 64:
            return False
        phoff, shoff, phent, phnum, shent, shnum = num(32, 8), num(40, 8), num(54, 2), num(56, 2), num(58, 2), \
            num(60, 2)
    else:
        phoff, shoff, phent, phnum, shent, shnum = num(28, 4), num(32, 4), num(42, 2), num(44, 2), num(46, 2), \
            num(48, 2)
    return phoff + phent * phnum <= size and shoff + shent * shnum <= size


def half_written(cache_dir: str, killed: dict) -> list[str]:
    """Paths under cache_dir a killed process can have left half-written. killed: pid -> its start, seconds since
    the epoch (a `.so` older than every killed process was not theirs)."""
    if not killed or not os.path.isdir(cache_dir) or os.path.islink(cache_dir):
        return []
    since = min(killed.values())
    found = []
    for top, dirs, files in os.walk(cache_dir):  # os.walk follows no directory symlink
        for d in list(dirs):
            m = _TRITON_TMP.match(d)
            if m and int(m.group(1)) in killed and not os.path.islink(os.path.join(top, d)):
                found.append(os.path.join(top, d))
                dirs.remove(d)
        for name in files:
            path = os.path.join(top, name)
            m = _INDUCTOR_TMP.match(name)
            if m and int(m.group(1)) in killed:
                found.append(path)
            elif name.endswith(_BINARY) and not os.path.islink(path):
                try:
                    mtime = os.lstat(path).st_mtime
                except OSError:
                    continue
                if mtime >= since - 1.0 and not elf_whole(path):
                    found.append(path)
    return found


def remove_half_written(cache_dirs, killed: dict) -> tuple[list[str], list[str]]:
    """Remove half_written() of each directory: (removed, could not remove with why)."""
    removed, failed = [], []
    for d in cache_dirs:
        root = os.path.realpath(d)
        for path in half_written(d, killed):
            if not os.path.realpath(path).startswith(root + os.sep):
                continue
            try:
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                else:
                    os.unlink(path)
                removed.append(path)
            except OSError as e:
                failed.append(f"{path}: {e.strerror or e}")
    return removed, failed
