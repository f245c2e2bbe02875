"""A 2-rank gloo job that hangs the way a real one does: rank 1 leaves out the last all_reduce; rank 0 enters it and
waits. Each rank then dumps its flight recorder (torch's own `_dump_fr_trace`, as the watchdog does on a timeout) to
`<dir>/fr_trace_rank_<rank>` (pickle) and `.json`, and exits without waiting (the hang is the point).

    python hang2.py RANK PORT DIR      (TORCH_FR_BUFFER_SIZE set by the caller)
"""

import os
import sys

import torch
import torch._C._distributed_c10d as c10d
import torch.distributed as dist

rank, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
dist.init_process_group("gloo", rank=rank, world_size=2)
t = torch.ones(4)
for _ in range(3):
    dist.all_reduce(t)
dist.broadcast(t, 0)
if rank == 0:
    dist.all_reduce(t, async_op=True)  # enqueued; rank 1 never joins it
with open(os.path.join(out, f"fr_trace_rank_{rank}"), "wb") as f:
    f.write(c10d._dump_fr_trace())
with open(os.path.join(out, f"fr_trace_rank_{rank}.json"), "wb") as f:
    j = c10d._dump_fr_trace_json()
    f.write(j if isinstance(j, bytes) else j.encode())
sys.stdout.flush()
os._exit(0)
