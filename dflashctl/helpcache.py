"""`--help` answered from a cache of what typer printed last time for the same command line, code and terminal.

Rendering help needs typer, click and rich (with markdown-it): ~0.25 s of imports before the first byte, five times
what the interpreter costs to start (issue 16). The text depends only on the command line, our own code, typer's
and rich's code, and the terminal (width, colour, a handful of environment variables), so it is kept under that key
and printed byte for byte on the next call; any change to a key part — an edited module, an upgraded typer, a
narrower window — is a miss, and a miss runs typer as before and stores what it printed (only when it exited 0).
stdlib only: this runs before anything else is imported. `DFLASHCTL_NO_HELP_CACHE=1` turns it off.

Every command line imports this module (and a served one cmdclient.py), so it imports only modules the interpreter
has built in or has loaded at start-up: no re, pathlib, json, hashlib or typing (~17 ms at every start, the
interpreter's own start being ~11 ms). Paths are str.
"""

from __future__ import annotations

import os
import sys

try:  # the C sha256 itself: hashlib's import loads OpenSSL first (~2 ms)
    from _sha256 import sha256
except ImportError:  # another Python's name for it (3.12: _sha2), else hashlib's
    try:
        from _sha2 import sha256  # type: ignore[no-redef]
    except ImportError:
        from hashlib import sha256  # type: ignore[no-redef]

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:  # annotations only: typing is not on the served client's way (cmdclient.py)
    from collections.abc import Callable
    from typing import IO, Any

HELP_FLAGS = ("--help", "-h")
_FIRST = frozenset("abcdefghijklmnopqrstuvwxyz")
_REST = _FIRST | frozenset("0123456789-")
# Environment that changes how typer/rich render (width, colour, terminal, typer's own switches).
_ENV_NAMES = ("COLUMNS", "LINES", "TERM", "COLORTERM", "NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE",
              "TTY_INTERACTIVE", "JUPYTER_COLUMNS", "JUPYTER_LINES", "JPY_PARENT_PID", "VSCODE_PID")
_ENV_PREFIXES = ("TYPER_", "_TYPER", "RICH_")
_LIBRARIES = ("typer", "rich")


def help_request(argv: list[str]) -> bool:
    """True for `[COMMAND...] --help`: plain command words, then a help flag last (nothing else is cached)."""
    return bool(argv) and argv[-1] in HELP_FLAGS and all(_is_word(w) for w in argv[:-1])


def _is_word(w: str) -> bool:
    """A command word: [a-z][a-z0-9-]* (no regex: `re` costs ~6 ms to import)."""
    return w[:1] in _FIRST and all(c in _REST for c in w)


def cache_dir(env: dict[str, str] | os._Environ[str] = os.environ) -> str | None:
    """~/.cache/dflashctl/help ($XDG_CACHE_HOME); None without an absolute home (never a folder under the cwd)."""
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "dflashctl", "help") if os.path.isabs(base) else None


def code_roots() -> list[str]:
    """Our package's folder, then typer's and rich's (the first on sys.path, as import would find them)."""
    roots = [os.path.dirname(os.path.realpath(__file__))]
    for name in _LIBRARIES:
        for entry in sys.path:
            candidate = os.path.join(entry or ".", name)
            if os.path.isfile(os.path.join(candidate, "__init__.py")):
                roots.append(candidate)
                break
    return roots


def code_fingerprint(roots: list[str | os.PathLike[str]] | None = None) -> str:
    """Every .py file under the code roots, by path, size and mtime (one stat each, ~1 ms for all three packages):
    an edit, an added module or an upgrade changes it."""
    h = sha256(sys.version.encode())
    for root in code_roots() if roots is None else roots:
        stack = [os.fspath(root)]
        while stack:
            with os.scandir(stack.pop()) as it:
                for e in sorted(it, key=lambda e: e.name):
                    if e.is_dir(follow_symlinks=False):
                        if e.name != "__pycache__":
                            stack.append(e.path)
                    elif e.name.endswith(".py"):
                        st = e.stat()
                        h.update(f"{e.path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:24]


def render_key(argv: list[str], stdout: IO[Any], env: dict[str, str] | os._Environ[str] = os.environ) -> str:
    """What the rendering depends on besides the code: the command line, the terminal's width and tty-ness, and
    the environment rich and typer read."""
    try:
        tty = stdout.isatty()
    except (AttributeError, ValueError, OSError):
        tty = False
    try:
        width = os.get_terminal_size(stdout.fileno()).columns if tty else 0
    except (AttributeError, ValueError, OSError):
        width = 0
    names = sorted(k for k in env if k in _ENV_NAMES or k.startswith(_ENV_PREFIXES))
    enc = getattr(stdout, "encoding", None)
    parts = ["\0".join(argv), f"tty={tty}", f"width={width}", f"encoding={enc}", *(f"{k}={env[k]}" for k in names)]
    return sha256("\n".join(parts).encode()).hexdigest()[:24]


class _Tee:
    """sys.stdout that also records what is written, as the bytes that reach the terminal (text encoded as the real
    stream encodes it; its `.buffer` recorded too, since click writes bytes there); everything else (isatty, fileno,
    encoding) is the real one's, so rich renders exactly as it would."""

    def __init__(self, real: IO[str]) -> None:
        self._real = real
        self.taken: list[bytes] = []
        self.buffer = _BufferTee(real.buffer, self.taken) if hasattr(real, "buffer") else None

    def write(self, s: str) -> int:
        if isinstance(s, bytes | bytearray):
            self.taken.append(bytes(s))
        else:
            self.taken.append(s.encode(self._real.encoding or "utf-8", errors=self._real.errors or "strict"))
        return self._real.write(s)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class _BufferTee:
    def __init__(self, real: Any, taken: list[bytes]) -> None:
        self._real = real
        self._taken = taken

    def write(self, b: bytes) -> int:
        self._taken.append(bytes(b))
        return self._real.write(b)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def answer(argv: list[str], run: Callable[[], int]) -> int:
    """Print the cached help for argv, or run `run` (the typer app), store what it printed and return its code."""
    folder = cache_dir()
    if os.environ.get("DFLASHCTL_NO_HELP_CACHE") == "1" or folder is None or not hasattr(sys.stdout, "buffer"):
        return run()
    try:
        fingerprint = code_fingerprint()
        path = os.path.join(folder, f"{fingerprint}-{render_key(argv, sys.stdout)}.txt")
    except OSError:
        return run()
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError:
        text = None
    if text is not None:
        sys.stdout.flush()
        sys.stdout.buffer.write(text)
        sys.stdout.flush()
        return 0
    tee = _Tee(sys.stdout)
    sys.stdout = tee  # type: ignore[assignment]
    try:
        rc = run()
    finally:
        sys.stdout = tee._real
    if rc == 0 and tee.taken:
        _store(folder, path, b"".join(tee.taken), fingerprint)
    return rc


def _store(folder: str, path: str, text: bytes, fingerprint: str) -> None:
    """Atomically, in a 0700 directory; entries of other code versions are removed (the cache stays small)."""
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            f.write(text)
        os.replace(tmp, path)
        for old in os.listdir(folder):
            if old.endswith(".txt") and not old.startswith(fingerprint):
                try:  # noqa: SIM105 - contextlib is not on this path (its import costs ~2.5 ms)
                    os.unlink(os.path.join(folder, old))
                except FileNotFoundError:
                    pass
    except OSError:
        pass  # a read-only or full home: the help was printed; it is just not cached
