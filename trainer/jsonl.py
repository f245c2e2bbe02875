"""JSONL files of records (prompt files, benchmark sets), read with one-line errors that name `file:line`. No torch."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def jsonl_objects(path: str | Path, error: type[Exception]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(`file:line`, record) for every non-blank line; an unreadable file, bad JSON or a non-object is one `error`."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise error(f"{path}: cannot read ({getattr(e, 'strerror', None) or e})") from None
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{no}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise error(f"{where}: invalid JSON ({e.msg})") from None
        if not isinstance(rec, dict):
            raise error(f"{where}: expected a JSON object")
        yield where, rec
