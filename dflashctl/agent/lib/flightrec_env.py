"""The NCCL flight recorder, on by default for runs under torchrun (issue 28 part 5; stdlib only: runs in the
container).

A hang under torchrun is a collective some rank never entered; the flight recorder (a ring of each rank's latest
collectives, dumped on a collective timeout) says which rank and which collective (agent/lib/flightrec.py reads the
dumps). It costs a few MB per rank and nothing per step, so dflashctl turns it on for programs it starts under
torchrun, with the dumps under the run's directory, unless the user set any of its variables (theirs always win,
the current names and the deprecated ones alike).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

BUFFER = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")  # current name, deprecated name
DUMP_ON_TIMEOUT = "TORCH_NCCL_DUMP_ON_TIMEOUT"
DUMP_FILE = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
DUMP_DIR = "flightrec"  # under the run directory
DUMP_PREFIX = "nccl_trace_rank_"  # torch appends the rank
BUFFER_SIZE = "2000"  # entries per rank (PyTorch's tutorial's recommendation)
_TORCHRUN = re.compile(r"(?:^|[\s/])(?:torchrun|torch\.distributed\.(?:run|launch))(?:\s|$)")


def under_torchrun(argv: Sequence[str]) -> bool:
    """Is the program torchrun (or `python -m torch.distributed.run|launch`), directly or inside a `bash -c` line?"""
    return any(_TORCHRUN.search(a) for a in argv)


def recorder_env(argv: Sequence[str], env: Mapping[str, str], run_dir: str) -> dict[str, str]:
    """The variables to add for a program started as argv with environment env: none unless it runs under torchrun;
    none that the user set (either spelling). Creates the dump directory when dumps go there."""
    if not under_torchrun(argv):
        return {}
    out: dict[str, str] = {}
    if not any(env.get(k) for k in BUFFER):
        out[BUFFER[0]] = BUFFER_SIZE
    if not env.get(DUMP_ON_TIMEOUT):
        out[DUMP_ON_TIMEOUT] = "1"
    if not any(env.get(k) for k in DUMP_FILE):
        directory = os.path.join(run_dir, DUMP_DIR)
        os.makedirs(directory, exist_ok=True)
        out[DUMP_FILE[0]] = os.path.join(directory, DUMP_PREFIX)
    return out
