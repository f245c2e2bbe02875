"""The sentinel as it travels: one zip of the installed package's container-side parts, run as `python3 FILE.pyz`.

The probe and the launcher are single files (scripts.py pastes agent/lib into them); the sentinel judges a run
with the whole analysis engine (analysis/, report.py, model.py) — too much to paste, and it must be the very same
code `status` runs, so it ships as those modules, unchanged, in a zip Python imports from (zipimport). The zip is
built in memory from this installation's sources, byte-identical for identical sources (fixed timestamps, sorted
names), so every run directory records exactly which engine watched it (`sentinel.pyz`, and its sha256 in
meta.json).
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from functools import lru_cache
from pathlib import Path

import dflashctl

PACKAGE_DIR = Path(dflashctl.__file__).parent
# what the sentinel imports: itself, the judging engine and what that stands on; never cli/, commands/, remote/
PARTS = ("__init__.py", "model.py", "errors.py", "bounds.py", "report.py", "analysis", "agent", "sentinel")
MAIN = "import sys\n\nfrom dflashctl.sentinel.main import main\n\nsys.exit(main(sys.argv[1:]))\n"
_EPOCH = (2020, 1, 1, 0, 0, 0)


def _files() -> list[tuple[str, bytes]]:
    out = []
    for part in PARTS:
        path = PACKAGE_DIR / part
        paths = [path] if path.is_file() else sorted(p for p in path.rglob("*.py") if "__pycache__" not in p.parts)
        out += [(f"dflashctl/{p.relative_to(PACKAGE_DIR).as_posix()}", p.read_bytes()) for p in paths]
    return sorted(out)


@lru_cache(maxsize=1)
def sentinel_zip() -> bytes:
    """The zip's bytes: `__main__.py` plus the PARTS of this installation."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in [("__main__.py", MAIN.encode()), *_files()]:
            info = zipfile.ZipInfo(name, _EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            z.writestr(info, data)
    return buf.getvalue()


def sentinel_sha256() -> str:
    return hashlib.sha256(sentinel_zip()).hexdigest()
