"""One rank of tests/trainer/test_global_loss.py: `python global_loss_worker.py RANK WORLD PORT OUT`.

Joins a gloo group on loopback, wraps its drafter in the trainer's DDP (trainer/ddp.py wrap: fp32, then bf16
buckets), trains its replica's rows of the fixed global batch with the global denominator, and saves the reduced
gradients (and, for contrast, those of each rank dividing by its own weight sum) to OUT/rank-RANK.pt."""

from __future__ import annotations

import copy
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from global_loss_case import global_batch, models, weights  # noqa: E402

from trainer import ddp  # noqa: E402
from trainer.compile import drafter_forward  # noqa: E402
from trainer.loss import block_inputs, global_denominator, label_mask  # noqa: E402
from trainer.masks import dense_mask  # noqa: E402


def step(target, drafter, reduce_dtype: str, rows: slice, denom) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
    """One DDP forward + backward of these rows; (loss, flat reduced gradient)."""
    ids, anchors, ends = (t[rows] for t in global_batch())
    model = ddp.wrap(drafter, drafter_forward, "cpu", 25.0, reduce_dtype)
    hidden = target.hidden_states(ids, [0, 2])
    block_ids, block_pos, labels = block_inputs(ids, anchors, 4, target.mask_token_id)
    loss, _, _ = model(block_ids, block_pos, hidden, dense_mask(anchors, ids.shape[1], 4), labels, weights(), False,
                       label_mask(block_pos, ends), denom)
    loss.backward()
    return loss.detach(), torch.cat([p.grad.reshape(-1) for p in drafter.parameters() if p.requires_grad])


def main(rank: int, world: int, port: int, out: Path) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    target, base = models()
    _, anchors, ends = global_batch()
    rows = slice(2 * rank, 2 * rank + 2)
    denom = global_denominator(anchors, ends, weights(), world)
    loss, fp32 = step(target, copy.deepcopy(base), "fp32", rows, denom)
    _, bf16 = step(target, copy.deepcopy(base), "bf16", rows, denom)
    _, local = step(target, copy.deepcopy(base), "fp32", rows, None)
    out.mkdir(parents=True, exist_ok=True)
    torch.save({"loss": loss, "fp32": fp32, "bf16": bf16, "local-mean": local}, out / f"rank-{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
