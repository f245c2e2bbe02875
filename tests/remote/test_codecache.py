"""The compiled-code cache the probe runs from (agent/codecache.py), in real interpreters: a hit runs the cached
code, a corrupt or foreign entry falls back to compiling the source, and an unsafe folder caches nothing."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from dflashctl.remote.probe import loader_source

PROGRAM = b"import sys\nprint(__name__, sys.argv[0], *sys.argv[1:])\nsys.exit(3)\n"


def run(src: bytes, cache: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    return subprocess.run([sys.executable, "-c", loader_source(), *args], input=src, capture_output=True, env=env,
                          timeout=60, check=False)


def entry(cache: Path, src: bytes) -> Path:
    return cache / "dflashctl" / "code" / f"{hashlib.sha256(src).hexdigest()}.{sys.implementation.cache_tag}"


def test_a_miss_compiles_and_writes_a_private_entry_a_hit_runs_it(tmp_path: Path) -> None:
    first = run(PROGRAM, tmp_path, "a", "--b")
    assert (first.returncode, first.stdout) == (3, b"__main__ - a --b\n"), first.stderr
    path = entry(tmp_path, PROGRAM)
    assert path.is_file()
    assert path.parent.stat().st_mode & 0o777 == 0o700
    written = path.read_bytes()
    second = run(PROGRAM, tmp_path, "c")
    assert (second.returncode, second.stdout) == (3, b"__main__ - c\n"), second.stderr
    assert path.read_bytes() == written  # a hit leaves the entry as it was


def test_a_hit_runs_the_cached_code_not_a_recompile(tmp_path: Path) -> None:
    """An entry under the source's key is what runs (proof the cache is read): plant another program's code."""
    run(PROGRAM, tmp_path)
    other = b"print('from the cache')\n"
    run(other, tmp_path)
    entry(tmp_path, PROGRAM).write_bytes(entry(tmp_path, other).read_bytes().replace(
        hashlib.sha256(other).hexdigest().encode(), hashlib.sha256(PROGRAM).hexdigest().encode(), 1))
    assert run(PROGRAM, tmp_path).stdout == b"from the cache\n"


def test_corrupt_or_foreign_entries_fall_back_to_compiling(tmp_path: Path) -> None:
    run(PROGRAM, tmp_path)
    path = entry(tmp_path, PROGRAM)
    good = path.read_bytes()
    header = good.split(b"\n", 2)
    bad_entries = [b"", b"garbage", good[: len(good) // 2],  # empty, junk, torn
                   header[0] + b"\n" + header[1] + b"\n" + b"\xff" * 40,  # a sound header on corrupt marshal data
                   header[0] + b"\n" + b"0" * 64 + b"\n" + header[2]]  # another source's entry under this name
    for bad in bad_entries:
        path.write_bytes(bad)
        res = run(PROGRAM, tmp_path, "x")
        assert (res.returncode, res.stdout) == (3, b"__main__ - x\n"), (bad[:40], res.stderr)
        assert path.read_bytes() == good  # rewritten whole


def test_a_folder_others_may_write_is_not_used(tmp_path: Path) -> None:
    folder = tmp_path / "dflashctl" / "code"
    folder.mkdir(parents=True)
    folder.chmod(0o777)
    res = run(PROGRAM, tmp_path, "y")
    assert (res.returncode, res.stdout) == (3, b"__main__ - y\n"), res.stderr
    assert list(folder.iterdir()) == []
