"""Real flight recorder dumps: tests/analysis/data/flightrec/hang2.py run as a 2-rank gloo job on the CPU (rank 1
leaves out the last all_reduce; each rank dumps torch's own `_dump_fr_trace`), written as torch names them under a
run's flightrec/ (`nccl_trace_rank_<rank>`)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

HANG = Path(__file__).resolve().parents[1] / "analysis" / "data" / "flightrec" / "hang2.py"


def gloo_hang_dumps(out: Path) -> Path:
    """Run the hang; `out` holds fr_trace_rank_{0,1} (pickle) and .json."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "100", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, str(HANG), str(r), port, str(out)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT) for r in (0, 1)]
    for p in procs:
        output, _ = p.communicate(timeout=300)
        assert p.returncode == 0, output.decode(errors="replace")[-2000:]
    return out


def put_dumps(run_dir: Path, dumps: Path) -> None:
    """The dumps where the launcher's TORCH_FR_DUMP_TEMP_FILE sends them: <run>/flightrec/nccl_trace_rank_<r>."""
    where = run_dir / "flightrec"
    where.mkdir(exist_ok=True)
    for r in (0, 1):
        tmp = where / f".nccl_trace_rank_{r}.tmp"
        tmp.write_bytes((dumps / f"fr_trace_rank_{r}").read_bytes())
        tmp.rename(where / f"nccl_trace_rank_{r}")
