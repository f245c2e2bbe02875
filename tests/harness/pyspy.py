"""A real py-spy binary for the `stacks` tests, found without the network, or the reason there is none.

py-spy ships as a wheel holding one static binary (`py_spy-X.data/scripts/py-spy`). Where it is not installed, the
wheel is taken from pip's own local sources only (`--no-index`, every `file://` find-links / index of `pip config`)
and the binary unpacked from it, never installed into the venv: there the tests must also see a container WITHOUT
py-spy (the trainer's dump signal).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path


def _local_sources() -> list[str]:
    """find-links values usable with --no-index: pip's file:// find-links, and file:// indexes' py-spy pages."""
    try:
        listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                                timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    found = []
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        for url in value.strip().strip("'\"").split():
            local = url.startswith("file://") or url.startswith("/")
            if not local:
                continue
            if key.endswith("index-url"):
                found.append(url.rstrip("/") + "/py-spy/")
            elif key.endswith("find-links"):
                found.append(url)
    return found


def py_spy_binary(workdir: Path) -> tuple[Path | None, str]:
    """(path of an executable py-spy, "") or (None, why not). Put on PATH only by the tests that want it."""
    on_path = shutil.which("py-spy")
    if on_path:
        return Path(on_path), ""
    sources = _local_sources()
    if not sources:
        return None, "py-spy is not installed and pip names no local wheel source"
    wheels = workdir / "wheels"
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-index", "--only-binary=:all:", "-q",
            "-d", str(wheels), *[a for s in sources for a in ("--find-links", s)], "py-spy"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env={**os.environ,
                                                                                      "PIP_NO_INPUT": "1"})
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"pip download py-spy failed: {e}"
    found = sorted(wheels.glob("py_spy-*.whl"))
    if done.returncode != 0 or not found:
        return None, f"no py-spy wheel in pip's local sources ({(done.stderr or done.stdout).strip()[-200:]})"
    bin_dir = workdir / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(found[-1]) as z:
        name = next((n for n in z.namelist() if n.endswith(".data/scripts/py-spy")), None)
        if name is None:
            return None, f"{found[-1].name} holds no py-spy binary"
        target = bin_dir / "py-spy"
        target.write_bytes(z.read(name))
    target.chmod(target.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return target, ""


def without_py_spy(path: str) -> str:
    """PATH with every directory that holds a py-spy left out."""
    return os.pathsep.join(d for d in path.split(os.pathsep) if d and not (Path(d) / "py-spy").exists())
