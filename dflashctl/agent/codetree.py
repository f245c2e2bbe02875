"""The deployed code tree: which files ship, its content hash, and installing it (stdlib only).

The one module of agent/ that also runs on the laptop: imported there to pack and hash the local tree, and
sent to the container (as source) to hash the deployed tree and install a new one, so both sides pick the
files and hash them with the very same code. A tree is a directory plus a prefix: our trainer package
ships with prefix `trainer` (it lands as `<workspace>/code/trainer/...`, so `python -m trainer` works from
`code/`), any other directory with none (its files land directly under `<workspace>/code/`). The hash is over the
paths as they land, so it is also the hash of `code/` itself. Install layout:
`<workspace>/.code/<hash16>/...` plus `.dflash-code-hash`, with `<workspace>/code` a symlink
swapped atomically; a running program keeps the version it started in (its cwd), and old
versions are pruned only when no process works in them.

Which files ship: regular files (never symlinks), minus ALWAYS_DIRS / ALWAYS_SUFFIXES / any
virtualenv (a directory holding `pyvenv.cfg`), minus what the tree's own `.gitignore` and
`.dflashignore` files exclude (root and nested, gitignore syntax; DEFAULT_IGNORE comes first, so
`!build/` can bring a default back). Ignore files above the tree are not read: the container
sees only the tree, and both sides must choose alike.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import shutil
import sys
import tarfile
import time

from dflashctl.agent.lib.frame import reply
from dflashctl.agent.lib.interrupts import raising_on_signals, remove_dead_leftovers
from dflashctl.agent.lib.rundir import HASH_FILE

IGNORE_FILES = (".gitignore", ".dflashignore")  # read in this order per directory: .dflashignore's rules win
# Never ship, whatever an ignore file says: version control, caches, virtualenvs, bytecode.
ALWAYS_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", ".venv", "venv", ".pytest_cache", ".mypy_cache",
                         ".ruff_cache", ".hypothesis", ".ipynb_checkpoints", ".tox", ".nox"})
ALWAYS_SUFFIXES = (".pyc", ".pyo")
# Not shipped unless an ignore file re-includes them (`!checkpoints/`): build output, editor leftovers,
# and what training tools write into their working directory (W&B, MLflow, Lightning, checkpoints).
DEFAULT_IGNORE = ("node_modules/", "build/", "dist/", "*.egg-info", ".cache/", "wandb/", "mlruns/",
                  "lightning_logs/", "checkpoints/", "*.swp", "*~", ".DS_Store")
KEEP_VERSIONS = 3
# install()'s unpacking folder in <workspace>/.code: .tmp-PID-T. Pruning skips dot-folders; a SIGKILLed install's is
# removed by the next install once its PID is gone.
TMP_PART = re.compile(r"\.tmp-(?P<pid>[0-9]{1,10})-[0-9]+")

Rule = tuple[bool, bool, "re.Pattern[str]"]  # (negated, directories only, regex over the path below the rule's dir)


# ------------------------------------------------------------------------------------- gitignore rules


def compile_rule(line: str) -> Rule | None:
    """One line of a .gitignore (git's rules: `#`, `!`, trailing `/`, `*`, `?`, `[...]`, `**`, a `/` anchors)."""
    line = line.rstrip("\r\n")
    end = len(line)
    while end and line[end - 1] == " " and not (end > 1 and line[end - 2] == "\\"):
        end -= 1  # trailing spaces are dropped unless escaped
    line = line[:end]
    if not line or line.startswith("#"):
        return None
    negated = line.startswith("!")
    if negated:
        line = line[1:]
    dir_only = line.endswith("/") and not line.endswith("\\/")
    line = line.rstrip("/") if dir_only else line
    if not line:
        return None
    anchored = "/" in line  # a slash at the start or in the middle: relative to the ignore file's directory
    body = _translate(line.lstrip("/"))
    return negated, dir_only, re.compile(body if anchored else "(?:.*/)?" + body, re.DOTALL)


def _translate(pattern: str) -> str:
    parts = pattern.split("/")
    out = []
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part == "**":
            out.append(".*" if last else "(?:.*/)?")  # `a/**`: all inside a; `**/b`, `a/**/b`: zero or more dirs
        else:
            out.append(_segment(part) + ("" if last else "/"))
    return "".join(out)


def _segment(s: str) -> str:
    """One path component: `*` and `?` never match `/`, brackets as in fnmatch, backslash escapes."""
    out, i, n = [], 0, len(s)
    while i < n:
        c = s[i]
        i += 1
        if c == "*":
            while i < n and s[i] == "*":
                i += 1
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "\\" and i < n:
            out.append(re.escape(s[i]))
            i += 1
        elif c == "[":
            j = i + (1 if i < n and s[i] in "!^" else 0)
            j += 1 if j < n and s[j] == "]" else 0
            while j < n and s[j] != "]":
                j += 2 if s[j] == "\\" else 1
            if j >= n:
                out.append(re.escape(c))
                continue
            body, i = s[i:j], j + 1
            negated = body[:1] in ("!", "^")
            body = body[1:] if negated else body
            cls, k = [], 0
            while k < len(body):
                ch = body[k]
                if ch == "\\" and k + 1 < len(body):
                    k += 1
                    ch = body[k]
                    cls.append("\\" + ch if ch in "\\^[]-" else ch)
                else:
                    cls.append("\\" + ch if ch in "\\^[]&~|" else ch)
                k += 1
            out.append(f"[^/{''.join(cls)}]" if negated else f"(?!/)[{''.join(cls)}]")
        else:
            out.append(re.escape(c))
    return "".join(out)


DEFAULT_RULES = [r for r in map(compile_rule, DEFAULT_IGNORE) if r is not None]


def _read_rules(dirpath: str) -> list[Rule]:
    rules: list[Rule] = []
    for name in IGNORE_FILES:
        path = os.path.join(dirpath, name)
        if os.path.isfile(path) and not os.path.islink(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                rules += [r for r in map(compile_rule, f) if r is not None]
    return rules


def _ignored(stack: list[tuple[str, list[Rule]]], rel: str, is_dir: bool) -> bool:
    """Last matching rule wins; a deeper directory's rules come later, so they win over a parent's."""
    verdict = False
    for base, rules in stack:
        sub = rel[len(base) + 1:] if base else rel
        for negated, dir_only, rx in rules:
            if (is_dir or not dir_only) and rx.fullmatch(sub):
                verdict = not negated
    return verdict


# ----------------------------------------------------------------------------------------- the tree


def scan(root: str, prefix: str = "") -> list[tuple[str, str, int]]:
    """(path as it lands, path on disk, size in bytes) of every file that ships from root, sorted.
    prefix: the directory the tree lands in below `code/` ("" = directly in it, "trainer" = ours)."""
    out: list[tuple[str, str, int]] = []
    _scan(root, prefix, [("", DEFAULT_RULES)], out)
    return sorted(out)


def _scan(dirpath: str, rel_dir: str, stack: list[tuple[str, list[Rule]]], out: list[tuple[str, str, int]]) -> None:
    rules = _read_rules(dirpath)
    if rules:
        stack = [*stack, (rel_dir, rules)]
    with os.scandir(dirpath) as it:
        entries = sorted(it, key=lambda e: e.name)
    for e in entries:
        rel = f"{rel_dir}/{e.name}" if rel_dir else e.name
        if e.is_symlink():
            continue
        if e.is_dir(follow_symlinks=False):
            venv = os.path.isfile(os.path.join(e.path, "pyvenv.cfg"))
            if e.name in ALWAYS_DIRS or venv or _ignored(stack, rel, True):
                continue
            _scan(e.path, rel, stack, out)
        elif e.is_file(follow_symlinks=False):
            if e.name.endswith(ALWAYS_SUFFIXES) or rel == HASH_FILE:
                continue
            if e.name not in IGNORE_FILES and _ignored(stack, rel, False):  # the rules read always ship with them
                continue
            out.append((rel, e.path, e.stat(follow_symlinks=False).st_size))


def iter_files(root: str, prefix: str = "") -> list[str]:
    """Relative posix paths (as they land) of the files that ship, sorted."""
    return [rel for rel, _path, _size in scan(root, prefix)]


def digest(entries: list[tuple[str, str, int]]) -> str:
    """sha256 over (path, executable bit, content sha256) of every file, in order."""
    h = hashlib.sha256()
    for rel, path, _size in entries:
        fh = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                fh.update(chunk)
        mode = "x" if os.stat(path).st_mode & 0o111 else "-"
        h.update(f"{rel}\0{mode}\0{fh.hexdigest()}\n".encode())
    return h.hexdigest()


def tree_hash(root: str, prefix: str = "") -> str | None:
    """The tree's hash (see digest); None if there is no directory."""
    if not os.path.isdir(root):
        return None
    return digest(scan(root, prefix))


def pack(root: str, prefix: str = "", entries: list[tuple[str, str, int]] | None = None) -> bytes:
    """A gzip tar of the shipped files, named as they land (deterministic: fixed owner and mtime)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
        for rel, path, _size in (scan(root, prefix) if entries is None else entries):
            info = tarfile.TarInfo(rel)
            info.size = os.path.getsize(path)
            info.mode = 0o755 if os.stat(path).st_mode & 0o111 else 0o644
            info.mtime = 0
            with open(path, "rb") as f:
                tar.addfile(info, f)
    return buf.getvalue()


# ------------------------------------------------------------------------------------ container side


def state(spec: dict) -> int:
    """Remote: what is deployed: the recorded hash and the hash of the files really there."""
    code = os.path.join(spec["workspace"], "code")
    recorded = None
    with contextlib.suppress(OSError), open(os.path.join(code, HASH_FILE)) as f:
        recorded = f.read().strip() or None
    return reply({"recorded": recorded, "actual": tree_hash(code),
                  "path": os.path.realpath(code) if os.path.exists(code) else None})


def install(spec: dict) -> int:
    """Remote: unpack the tar on stdin into a fresh version dir, verify its hash, swap `code`. A signal it can catch
    (the ssh session gone: SIGHUP; SIGTERM; SIGINT) removes the unpacking folder like any other failure."""
    with raising_on_signals():
        return _install(spec)


def _install(spec: dict) -> int:
    ws = spec["workspace"]
    versions = os.path.join(ws, ".code")
    os.makedirs(versions, exist_ok=True)
    remove_dead_leftovers(versions, TMP_PART)
    tmp = os.path.join(versions, f".tmp-{os.getpid()}-{int(time.time())}")
    os.mkdir(tmp)
    set_aside = None
    try:
        with tarfile.open(fileobj=sys.stdin.buffer, mode="r|gz") as tar:  # streamed: never all in memory
            for m in tar:
                parts = m.name.split("/")
                if not m.isfile() or m.name.startswith("/") or m.name == HASH_FILE \
                        or any(p in ("", ".", "..") for p in parts):
                    for _ in iter(lambda: sys.stdin.buffer.read(1 << 20), b""):
                        pass  # drain: the sender is still writing
                    return reply({"error": f"refusing tar member {m.name!r}"})
                dest = os.path.join(tmp, *parts)
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                src = tar.extractfile(m)
                with open(dest, "wb") as f:
                    shutil.copyfileobj(src, f)
                os.chmod(dest, m.mode & 0o755)
        got = tree_hash(tmp)
        if got != spec["hash"]:
            return reply({"error": f"hash mismatch after unpacking: expected {spec['hash']}, got {got}"})
        with open(os.path.join(tmp, HASH_FILE), "w") as f:
            f.write(got + "\n")
        final = os.path.join(versions, got[:16])
        if os.path.isdir(final) and tree_hash(final) != got:  # this version, edited in place since: set it aside
            set_aside = f"{final}-edited-{int(time.time())}-{os.getpid()}"
            os.rename(final, set_aside)  # a program running in it keeps running there
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
    return reply({"hash": got, "path": final, "moved_legacy": moved, "set_aside": set_aside,
                  "pruned": _prune(versions, final)})


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
