"""What both generation paths share (Hugging Face `generate`, trainer/datagen.py; a server,
trainer/datagen_server.py): the progress bar and the check that a resumed data directory continues the same data."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from trainer.dataset import DataError


class ProgressBar:
    """`generate  12/34 prompts [######----]  2.1 prompts/s  eta 0:07` — redrawn in place on a terminal, one
    line per update otherwise (logs stay readable)."""

    def __init__(self, total: int, done: int = 0, stream: TextIO | None = None, label: str = "generate") -> None:
        self.total, self.done, self.start_done = total, done, done
        self.stream = stream or sys.stderr
        self.label, self.t0 = label, time.monotonic()
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def line(self) -> str:
        width = 24
        filled = int(width * self.done / max(1, self.total))
        rate = (self.done - self.start_done) / max(time.monotonic() - self.t0, 1e-9)
        left = (self.total - self.done) / rate if rate > 0 else math.inf
        eta = "?" if math.isinf(left) else f"{int(left // 60)}:{int(left % 60):02d}"
        return (f"{self.label} {self.done:>5}/{self.total} prompts [{'#' * filled}{'-' * (width - filled)}] "
                f"{rate:5.2f} prompts/s eta {eta}")

    def update(self, n: int) -> None:
        self.done += n
        self.stream.write(("\r" if self.tty else "") + self.line() + ("" if self.tty else "\n"))
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()



def check_resume(out: Path, meta: dict[str, Any]) -> None:
    old_file = out / "meta.json"
    if not old_file.exists():
        if out.exists() and any(out.glob("shard-*.pt")):
            raise DataError(f"{out}: has shards but no meta.json; use a new --out")
        return
    try:
        old = json.loads(old_file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise DataError(f"{old_file}: cannot read ({e})") from None
    for key in ("format", "target", "prompts", "num_prompts", "generation"):
        if old.get(key) != meta[key]:
            raise DataError(f"{out}: was generated with a different {key} ({old.get(key)!r} != {meta[key]!r}); "
                            "use a new --out to start over")
