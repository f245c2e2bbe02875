"""The sentinel travels as one zip of the installed package's container-side parts: the very modules `status`
judges with, importable with the standard library alone."""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import zipfile
from pathlib import Path

from dflashctl.remote.bundle import PACKAGE_DIR, sentinel_sha256, sentinel_zip

LAPTOP_ONLY = ("cli", "commands", "remote", "config.py")


def test_the_zip_holds_the_engine_byte_for_byte_and_nothing_of_the_laptop_side() -> None:
    z = zipfile.ZipFile(io.BytesIO(sentinel_zip()))
    names = z.namelist()
    assert "__main__.py" in names
    for part in LAPTOP_ONLY:
        assert not any(n.startswith(f"dflashctl/{part}") for n in names), part
    for name in ("dflashctl/analysis/health.py", "dflashctl/analysis/watcher.py", "dflashctl/report.py",
                 "dflashctl/sentinel/main.py", "dflashctl/agent/probe/main.py", "dflashctl/model.py"):
        assert z.read(name) == (PACKAGE_DIR.parent / name).read_bytes(), name  # the same source, not a copy


def test_the_zip_is_the_same_bytes_when_built_again_in_another_interpreter() -> None:
    code = "from dflashctl.remote.bundle import sentinel_sha256; print(sentinel_sha256())"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert other == sentinel_sha256() == hashlib.sha256(sentinel_zip()).hexdigest()


def test_the_sentinel_imports_with_the_standard_library_alone(tmp_path: Path) -> None:
    """-I -S: no site-packages (no typer, rich, paramiko, torch), no PYTHONPATH, cwd without dflashctl."""
    pyz = tmp_path / "sentinel.pyz"
    pyz.write_bytes(sentinel_zip())
    code = (f"import sys; sys.path.insert(0, {str(pyz)!r}); import dflashctl.sentinel.main as m; "
            "print(m.__file__); print(sorted({n.split('.')[0] for n in sys.modules} & "
            "{'typer', 'rich', 'paramiko', 'torch', 'cryptography'}))")
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    where, third_party = done.stdout.splitlines()
    assert where.startswith(str(pyz)) and third_party == "[]"
    usage = subprocess.run([sys.executable, "-I", "-S", str(pyz)], capture_output=True, text=True, cwd=tmp_path)
    assert usage.returncode == 2 and "usage: python3 sentinel.pyz RUN_DIR" in usage.stderr
