"""Global token-weighted loss normalisation (SpecForge's): a step's gradient is that of sum(w * CE) over every real
label of every replica / the global weight sum — whatever each replica holds — not the mean of per-replica means.
In-process here (the threads layout's combination, `mean_of`); the DDP path under a real gloo group of two processes
(tests/trainer/global_loss_worker.py)."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from global_loss_case import REPLICAS, forward, global_batch, models, weights
from harness.sshd import free_port
from trainer_harness import REPO, TINY

from trainer.allreduce import mean_of
from trainer.compile import drafter_forward
from trainer.config import load_config
from trainer.loss import block_inputs, global_denominator, label_mask, weight_total
from trainer.masks import dense_mask
from trainer.pipeline import Trainer
from trainer.supervise import Fault

WORKER = Path(__file__).with_name("global_loss_worker.py")
# fp32 throughout: the concatenated batch and the replicas' average sum the same products in another order, so they
# agree to a few ulps of the largest gradient; the per-replica mean is off by ~45 % of the gradient here (one
# replica holds ~3x the other's label weight), far outside
RTOL, ATOL = 1e-5, 1e-7


def _grads(drafter) -> torch.Tensor:  # noqa: ANN001
    return torch.cat([p.grad.reshape(-1) for p in drafter.parameters() if p.requires_grad])


def reference(loss_chunk: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, flat gradient) of one process computing the loss over the concatenated global batch."""
    target, drafter = models()
    ids, anchors, ends = global_batch()
    loss, _, _ = forward(target, drafter, ids, anchors, ends, loss_chunk=loss_chunk)
    loss.backward()
    return loss.detach(), _grads(drafter)


def replica_grads(denom_of, loss_chunk: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor]]:  # noqa: ANN001
    target, base = models()
    ids, anchors, ends = global_batch()
    losses, grads = [], []
    for r in range(REPLICAS):
        drafter = copy.deepcopy(base)
        sl = slice(2 * r, 2 * r + 2)
        loss, _, _ = forward(target, drafter, ids[sl], anchors[sl], ends[sl], denom_of(sl), loss_chunk)
        loss.backward()
        losses.append(loss.detach())
        grads.append(_grads(drafter))
    return losses, grads


def test_the_replicas_hold_very_different_label_weights():
    _, anchors, ends = global_batch()
    w = weights()
    mine = [float(weight_total(anchors[s], ends[s], w)) for s in (slice(0, 2), slice(2, 4))]
    assert mine[0] > 3 * mine[1] > 0
    assert float(weight_total(anchors, ends, w)) == pytest.approx(sum(mine))


@pytest.mark.parametrize("loss_chunk", [0, 5], ids=["full-logits", "chunked"])
def test_replicas_averaged_give_the_gradient_of_the_concatenated_global_batch(loss_chunk):
    want_loss, want = reference(loss_chunk)
    _, anchors, ends = global_batch()
    denom = global_denominator(anchors, ends, weights(), REPLICAS)
    losses, grads = replica_grads(lambda sl: denom, loss_chunk)
    torch.testing.assert_close(mean_of(grads), want, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(torch.stack(losses).mean(), want_loss, rtol=RTOL, atol=ATOL)

    # the per-replica mean (each replica divided by its own weight sum): not the global batch's gradient
    _, local = replica_grads(lambda sl: None, loss_chunk)
    off = (mean_of(local) - want).abs().max()
    assert off > 1000 * (RTOL * want.abs().max() + ATOL), float(off)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the injected crash
def test_a_replica_dead_under_continue_takes_its_labels_out_of_the_divisor(tmp_path):
    """on_worker_failure = "continue", drafter-1 of three dies before its first step: the survivors' step is the
    gradient (and the logged loss) of the token-weighted loss over their own rows alone — not scaled by their
    share of a divisor that still counts the dead replica's labels."""
    sets = {"runtime.compile_strategy": "off", "runtime.on_worker_failure": "continue", "train.steps": "1",
            "train.batch_size": "2", "train.seq_len": "32", "train.grad_clip": "1e9", "train.log_interval": "1",
            "train.checkpoint_interval": "0"}
    trainer = Trainer(load_config(REPO / TINY, [f"{k}={v}" for k, v in sets.items()]), tmp_path,
                      fault=Fault("drafter-1@0"))
    start = copy.deepcopy(trainer.replicas[0])
    assert trainer.n == 3 and trainer.run() == 0
    assert (tmp_path / "errors" / "drafter-1.json").exists()

    batch, w, bs = trainer.data.batch(0, 6), trainer.cpu_weights, trainer.cfg.drafter.block_size
    shares = [float(weight_total(batch.anchors[r:r + 2], batch.ends[r:r + 2], w)) for r in (0, 2, 4)]
    live = (shares[0] + shares[2]) / 2
    assert abs(live / (sum(shares) / 3) - 1) > 0.01, shares  # the old divisor: 1000x the tolerance off
    rows = torch.tensor([0, 1, 4, 5])  # drafter-0's and drafter-2's
    ids, anchors, ends = batch.ids[rows], batch.anchors[rows], batch.ends[rows]
    hidden = trainer.target.hidden_states(ids, trainer.layer_ids)
    block_ids, block_pos, labels = block_inputs(ids, anchors, bs, trainer.target.mask_token_id)
    loss, _, _ = drafter_forward(start, block_ids, block_pos, hidden, dense_mask(anchors, ids.shape[1], bs), labels,
                                 w, False, label_mask(block_pos, ends))
    loss.backward()
    for survivor in (0, 2):
        torch.testing.assert_close(_grads(trainer.replicas[survivor]), _grads(start), rtol=RTOL, atol=ATOL)
    assert trainer.progress.loss == pytest.approx(loss.item(), rel=RTOL)


def test_ddp_of_two_processes_gives_the_gradient_of_the_concatenated_global_batch(tmp_path):
    """Each rank holds one replica's rows; DDP averages over the world (fp32 and bf16 buckets); every rank's
    gradient equals one process's over the whole global batch (bf16: each bucket rounded to 8 mantissa bits,
    relative 2^-9, before the mean)."""
    port = free_port()
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(r), str(REPLICAS), str(port), str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(REPLICAS)]
    try:
        logs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), logs
    want_loss, want = reference()
    ranks = [torch.load(tmp_path / f"rank-{r}.pt", weights_only=True) for r in range(REPLICAS)]
    for res in ranks:
        torch.testing.assert_close(res["fp32"], want, rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(res["bf16"], want, rtol=2 ** -8, atol=2 ** -8 * float(want.abs().max()))
        off = (res["local-mean"] - want).abs().max()
        assert off > 1000 * (RTOL * want.abs().max() + ATOL), float(off)
    # the loss a rank logs (its own, summed over ranks / world size, as trainer/ddp.py reduce_stats_async) is the
    # global batch's
    torch.testing.assert_close(sum(r["loss"] for r in ranks) / REPLICAS, want_loss, rtol=RTOL, atol=ATOL)
