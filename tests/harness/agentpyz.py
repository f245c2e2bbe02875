"""The agent archive as a file, for tests that run a container program by hand (`python3 <pyz> VERB ARGS`, a spec
verb's spec as the first line of stdin): the very bytes the CLI sends, written once per test process."""

from __future__ import annotations

import json
import os
import tempfile
from functools import lru_cache

from dflashctl.remote import agentpack


@lru_cache(maxsize=1)
def archive_path() -> str:
    path = os.path.join(tempfile.mkdtemp(prefix="dflash-agent-"), f"{agentpack.sha256()}.pyz")
    with open(path, "wb") as f:
        f.write(agentpack.archive())
    return path


def spec_stdin(spec: dict, data: bytes = b"") -> bytes:
    """What a spec verb reads: its spec on the first line, the program's own input after it."""
    return json.dumps(spec).encode() + b"\n" + data
